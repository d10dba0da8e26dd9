"""`restful --client-processes N`: one arrival schedule sent from N worker processes, merged into one run.

Real parts: the scripted server (tests/scripted_server.py) on 127.0.0.1, the CLI in this process, the Run page through
AppTest, the workers as the child processes they are, and a server here that asks the operating system which process
owns each connection.
"""

import json
import math
import threading

import psutil
import pytest
from aiohttp import web
from app_under_test import APP
from openai_server import serving
from scripted_server import TEXT_EVENTS, restful_argv, scripted_server  # noqa: F401 (fixture)
from streamlit.testing.v1 import AppTest

from bench_core.cli import main
from bench_core.config import EngineConfig, LoadConfig, RunConfig
from bench_core.engines import run_config_problems
from bench_core.engines.client_workers import ClientWorkers, split_sessions
from bench_core.engines.openai_client import ServerError
from bench_core.engines.openai_request import ServerSpec
from bench_core.hardware.client_bound import CLIENT_CORES_COLUMN, LAG_COLUMN
from bench_core.hardware.telemetry import CLIENT_WORKER, CPU_CORES
from bench_core.load.datasets import SampledRequest
from bench_core.load.schedule import SendSchedule
from bench_core.store.history import RESULTS_ENV, History
from dashboard.state import get_runner

pytestmark = pytest.mark.slow  # worker processes started, CLI runs and the Run page through AppTest

N_PROMPTS = 6
# A worker's send after its due time: a busy machine's lag is tenths of a second (a client loop woke 0.35 s late
# under 8 CPU hogs on 2 cores); seconds late is a schedule timed from the wrong start or in the wrong unit.
SEND_LAG_S = 2.0


def restful(url: str, folder, *flags: str) -> int:
    return main(restful_argv(url, folder, N_PROMPTS, "--request-rate", "20", *flags))


def worker_processes() -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process().children()
        if "bench_core.engines.client_workers" in " ".join(child.cmdline())
    ]


def last_run(folder):
    history = History(folder / "results")
    row = history.load().iloc[-1]
    return row, history.requests(row["run_id"])


def test_two_processes_send_the_one_process_schedule_and_merge_into_one_run(scripted_server, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert restful(scripted_server, one) == 0
    assert restful(scripted_server, two, "--client-processes", "2") == 0
    (row_1, table_1), (row_2, table_2) = last_run(one), last_run(two)
    assert (row_1["client_processes"], row_2["client_processes"]) == (1, 2)
    assert len(table_2) == N_PROMPTS and (table_2["status"] == "success").all()
    # The same seed draws the same schedule, whichever process sends a request.
    assert table_2["scheduled_s"].tolist() == table_1["scheduled_s"].tolist()
    assert table_2["scheduled_s"].nunique() > 1  # a real arrival process, not everything at 0
    assert ((table_2["sent_s"] - table_2["scheduled_s"]).between(0, SEND_LAG_S)).all()
    for column in ("input_len", "output_len", "usage_output_len"):
        assert table_2[column].tolist() == table_1[column].tolist()
    assert table_2["output_len"].tolist() == [TEXT_EVENTS] * N_PROMPTS
    assert [len(itl) for itl in table_2["itl_s"]] == [TEXT_EVENTS - 1] * N_PROMPTS  # every tick came back
    for key in ("completed", "total_output_tokens", "total_input_tokens"):
        assert row_2[key] == row_1[key]
    # The workers' loops' lateness comes back with their events, and their CPU is sampled: the client's CPU is
    # theirs and this process's together, more than this process's alone (client_bound.py).
    assert row_1[LAG_COLUMN] >= 0 and row_2[LAG_COLUMN] >= 0
    telemetry = History(two / "results").telemetry(row_2["run_id"])
    workers = telemetry.loc[(telemetry["metric"] == CPU_CORES) & telemetry["source"].str.startswith("client_worker")]
    assert set(workers["source"]) == {CLIENT_WORKER.format(0), CLIENT_WORKER.format(1)} and workers["value"].max() > 0
    assert row_1[CLIENT_CORES_COLUMN] > 0 and row_2[CLIENT_CORES_COLUMN] > 0


@pytest.fixture
def owners_server():
    """A server that streams the tokens asked for and records, per prompt, the process that owns the client's end of
    the connection (asked of the operating system, not of the client); it serves the model "m"."""
    owners: dict[str, int] = {}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        port = request.transport.get_extra_info("peername")[1]
        for child in psutil.Process().children(recursive=True):  # the dashboard's engine process has them
            if any(c.laddr and c.laddr.port == port for c in child.net_connections(kind="tcp")):
                owners[body["prompt"]] = child.pid
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(body["max_tokens"]):
            await response.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": " t"}]}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    with serving(app) as url:
        yield url, owners


def test_each_worker_process_sends_its_share_on_connections_of_its_own(owners_server):
    url, owners = owners_server
    requests = [SampledRequest(f"prompt {i}", 2, 3) for i in range(8)]
    workers = ClientWorkers(2)
    try:
        pids = {child.pid for child in worker_processes()}
        assert len(pids) == 2
        run = workers.run(
            ServerSpec(url, server_kind="vllm"),
            "m",
            requests,
            SendSchedule.at_rate(requests, math.inf),
            max_concurrency=4,
        )
        finished = {event.index: event.n_tokens for event in run.events() if event.kind == "finish"}
        assert not workers.broken  # ready for the engine's next run
    finally:
        workers.close()
    assert finished == dict.fromkeys(range(8), 3)
    assert [result.index for result in run.results] == list(range(8))
    assert all(result.text == " t" * 3 for result in run.results)
    senders = [owners[f"prompt {i}"] for i in range(8)]
    assert set(senders) == pids
    assert senders[0::2] == [senders[0]] * 4 and senders[1::2] == [senders[1]] * 4  # dealt round-robin


def test_a_session_stays_in_one_worker():
    requests = [
        SampledRequest("a", 1, 1),
        SampledRequest("b", 1, 1),
        SampledRequest("a2", 1, 1, follows=0),
        SampledRequest("c", 1, 1),
        SampledRequest("a3", 1, 1, follows=2),
    ]
    assert split_sessions(requests, 2) == [[0, 2, 3, 4], [1]]


def one_line_refusal(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--client-processes", "0"), "--client-processes must be a whole number from 1 to 1,024; got 0."),
        (("--client-processes", str(N_PROMPTS + 1)), f"more processes than the {N_PROMPTS} prompts"),
        (("--client-processes", "4", "--max-concurrency", "3"), "splits the 3 requests allowed in flight"),
    ],
)
def test_impossible_splits_are_refused_in_one_line(scripted_server, tmp_path, capsys, flags, words):
    assert words in one_line_refusal(capsys, restful(scripted_server, tmp_path, *flags))
    assert not (tmp_path / "results" / "history.csv").exists()


def test_client_processes_belong_to_server_runs_only():
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"), load=LoadConfig(client_processes=2)
    )
    assert "--client-processes applies to the openai backend only, not to transformers." in run_config_problems(config)


def test_a_cancel_ends_every_workers_requests_and_leaves_the_workers_ready(scripted_server):
    requests = [SampledRequest(f"p{i}", 2, TEXT_EVENTS) for i in range(6)]
    schedule = SendSchedule.at_rate(requests, 2.0, seed=1)  # one request every 0.5 s: most not sent by the cancel
    workers = ClientWorkers(2)
    try:
        cancel = threading.Event()
        run = workers.run(
            ServerSpec(scripted_server, server_kind="transformers"), "m", requests, schedule, cancel=cancel
        )
        finishes = {}
        for event in run.events():
            if event.kind == "tokens":
                cancel.set()  # the first token of the first request
            if event.kind == "finish":
                finishes[event.index] = event.finish_reason
        assert sorted(finishes) == list(range(6)) and set(finishes.values()) == {"abort"}
        assert any(r.sent_ts is not None for r in run.results) and any(r.sent_ts is None for r in run.results)
        assert not workers.broken
    finally:
        workers.close()


def test_a_worker_that_dies_is_one_line_and_the_pool_says_it_is_broken(scripted_server):
    requests = [SampledRequest(f"p{i}", 2, TEXT_EVENTS) for i in range(4)]
    workers = ClientWorkers(2)
    try:
        run = workers.run(
            ServerSpec(scripted_server, server_kind="transformers"),
            "m",
            requests,
            SendSchedule.at_rate(requests, math.inf),
        )
        victim = worker_processes()[0]
        with pytest.raises(
            ServerError,
            match=r"^A client worker process died \(signal 9\), so its requests have no "
            r"results\.$",
        ):
            for event in run.events():
                if event.kind == "admit" and victim.is_running():
                    victim.kill()
        assert workers.broken
    finally:
        workers.close()


def test_the_run_page_sends_from_the_client_processes_it_is_given(
    owners_server, tmp_path, monkeypatch, fresh_dashboard
):
    url, owners = owners_server
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.sidebar.text_input(key="knob_base_url").input(url)
    at.sidebar.selectbox(key="knob_server_kind").select("transformers")
    at.sidebar.text_input(key="knob_tokenizer").input("builtin:tiny-llama")
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(4)
    at.sidebar.number_input(key="num_prompts_cpu").set_value(N_PROMPTS)
    at.sidebar.number_input(key="client_processes").set_value(2)
    at.sidebar.button(key="start").click().run()
    assert not at.exception and not at.error
    run = get_runner().get(at.query_params["run"])
    assert run.wait(120) and run.state == "finished", run.message
    assert run.config.load.client_processes == 2
    assert (run.record.requests["status"] == "success").all() and len(run.record.requests) == N_PROMPTS
    assert len(set(owners.values())) == 2 and len(owners) == N_PROMPTS  # from two processes
