"""`sweep restful --server-cmd` and `--find-max` through the command line, run in this process (the Ctrl-C tests
start it as a process of its own): a real server process per run
(tests/load_server.py, whose speed and latency under load are command-line settings, and `transformers serve`),
its log in the run's folder, its settings in the history, faults that fail only their point, resume, Ctrl-C that
leaves no server behind, and the search for the highest concurrency within an SLO against a known knee."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sweep_cli import (
    KNEE,
    KNEE_SERVER,
    SERVER,
    SLO_MS,
    SMALL_RUN,
    alive,
    bench,
    cli_env,
    rows_of,
    server_pid_once_measuring,
)

from bench_core.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from bench_core.store.history import History
from bench_core.sweep import find_max
from bench_core.sweep.find_max import FindMax, Probe
from bench_core.sweep.server import SERVER_LOG
from bench_core.sweep.store import probes_of

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def delay_sweep(tmp_path_factory, tiny_model_path):
    work = tmp_path_factory.mktemp("server-sweep")
    proc = bench(work, *SMALL_RUN, "--server-cmd", f"{SERVER} --token-delay-ms {{delay}}", "--sweep", "delay=5,60")
    assert proc.returncode == EXIT_OK, proc.stderr
    return work, proc


def test_each_run_starts_its_own_server_with_its_setting_and_the_setting_changes_the_speed(delay_sweep):
    tmp_path, proc = delay_sweep
    rows = rows_of(tmp_path)
    assert [json.loads(cell) for cell in rows["server_settings"]] == [{"delay": 5}, {"delay": 60}]
    assert set(rows["status"]) == {"finished"} and set(rows["model"]) == {"load-test"}
    # 5 ms and 60 ms between tokens, measured through a server of each setting: what a busy machine adds to a token it
    # adds to both, and each request of the slow one lasts at least its own sleeps, 60 ms after every token but the last.
    fast, slow = rows["mean_tpot_ms"]
    assert fast < slow / 2
    slow_requests = History(tmp_path / "results").requests(rows["run_id"].iloc[1])
    assert (slow_requests["e2e_s"] >= (slow_requests["output_len"] - 1) * 0.060).all()
    ports = {
        json.loads(cell)["delay"]: url.rsplit(":", 1)[1] for cell, url in zip(rows["server_settings"], rows["base_url"])
    }
    for run_id, delay in zip(rows["run_id"], (5, 60)):
        log = (tmp_path / "results" / "runs" / run_id / SERVER_LOG).read_text()
        assert f"mode ok port {ports[delay]}" in log  # the server at the run's own port wrote it
    assert "delay" in proc.stdout.splitlines()[1].split()  # the point table names the server setting


def test_the_sweep_page_shows_a_server_sweep_over_its_server_setting(delay_sweep, monkeypatch, fresh_dashboard):
    at = open_sweep_page(delay_sweep[0], monkeypatch)
    assert (
        "delay = 5, 60; 2 points × 1 repeats = 2 runs · a server started per run · the model each server serves on openai"
        in [caption.value for caption in at.caption]
    )
    band = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert band["layout"]["xaxis"]["title"]["text"] == "Delay" and _numbers(band["data"][1]["x"]) == [5, 60]


def open_sweep_page(work: Path, monkeypatch):
    from app_under_test import APP
    from streamlit.testing.v1 import AppTest

    from bench_core.store.history import RESULTS_ENV

    monkeypatch.setenv(RESULTS_ENV, str(work / "results"))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["sweep"] = rows_of(work)["sweep_id"].iloc[0]
    at.run()
    at = at.switch_page("app_pages/sweep.py").run()
    assert not at.error and not at.exception, [e.value for e in at.error]
    return at


@pytest.mark.slow  # two `transformers serve` starts: about 90 s on this machine's 2 busy cores
@pytest.mark.timeout(400)
def test_transformers_serve_started_per_run_batches_or_not_as_its_setting_says(tmp_path, tiny_model_path):
    # Without continuous batching the server answers one request at a time: of 4 sent at once, the last has its
    # first token only after another has ended. With it, all four are in the first steps, long before any ends.
    # (Speeds, on 2 cores other work shares, are too noisy to compare: the last's TTFT read 1.7-4.6x the batched
    # run's.) Each answer is 256 tokens, so "long before" is steps, not this machine's pace: at 16, a request
    # parsed late beside a CPU hog joined after the first had ended (a CI try).
    serve = (
        f"{sys.executable} -m transformers.cli.transformers serve {tiny_model_path} --host 127.0.0.1 --port {{port}} "
        "--device cpu {batching} --cb-num-blocks 64 --cb-block-size 64 --cb-max-batch-tokens 512"
    )
    proc = bench(
        tmp_path,
        *SMALL_RUN,
        "--backend",
        "transformers",
        "--model",
        tiny_model_path,
        "--random-input-len",
        "16",
        "--random-output-len",
        "256",
        "--max-concurrency",
        "4",
        "--server-cmd",
        serve,
        "--sweep",
        "batching=--continuous-batching,--no-continuous-batching",
        OMP_NUM_THREADS="1",
    )  # as the transformers_server fixture runs it
    assert proc.returncode == EXIT_OK, proc.stderr
    rows = rows_of(tmp_path)
    assert [json.loads(cell)["batching"] for cell in rows["server_settings"]] == [
        "--continuous-batching",
        "--no-continuous-batching",
    ]
    batched, one_at_a_time = (History(tmp_path / "results").requests(run_id) for run_id in rows["run_id"])

    def last_first_token_after_an_end(requests) -> bool:
        return bool((requests["start_s"] + requests["ttft_s"]).max() > requests["finish_s"].min())

    assert last_first_token_after_an_end(one_at_a_time) and not last_first_token_after_an_end(batched)


def test_a_server_that_never_answers_exits_or_dies_fails_only_its_point_and_resume_retries_those(
    tmp_path, tiny_model_path
):
    proc = bench(
        tmp_path,
        *SMALL_RUN,
        "--server-cmd",
        f"{SERVER} --mode {{mode}}",
        "--sweep",
        "mode=hang,exit,die,ok",
        "--server-start-timeout",
        "3",
    )
    assert proc.returncode == EXIT_FAILED, proc.stderr
    rows = rows_of(tmp_path).set_index(rows_of(tmp_path)["server_settings"].map(lambda cell: json.loads(cell)["mode"]))
    assert rows.loc["ok", "status"] == "finished" and rows.loc["ok", "completed"] == 4
    assert rows.loc["hang", "status"] == "failed"
    assert "did not answer GET /v1/models within 3 s" in rows.loc["hang", "error"]
    assert "loading the model forever" in rows.loc["hang", "error"]  # the end of its log
    assert rows.loc["exit", "status"] == "failed"
    assert "exited with code 3 before it answered" in rows.loc["exit", "error"]
    assert "boom: the model does not fit" in rows.loc["exit", "error"]
    assert rows.loc["die", "status"] in ("failed", "partial")
    assert "The server exited with code 1 during the run." in proc.stderr and "dying mid-run" in proc.stderr
    for run_id in rows["run_id"]:
        assert (tmp_path / "results" / "runs" / run_id / SERVER_LOG).is_file()
    assert "1/4 runs finished" in proc.stderr

    sweep_id = rows["sweep_id"].iloc[0]
    again = bench(tmp_path, "sweep", "--resume", sweep_id, "--results", "results")
    assert "4 runs (4 points x 1 repeats), 3 to run" in again.stderr  # the finished point is not run again
    rows = rows_of(tmp_path)
    assert len(rows) == 7
    assert rows["model"].iloc[-1] == "load-test"  # asked of the resumed run's server, as the first pass did


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_the_sweep_and_leaves_no_server_behind(stop, tmp_path, tiny_model_path):
    args = [
        "sweep",
        "restful",
        *SMALL_RUN[2:],
        "--server-cmd",
        f"{SERVER} --token-delay-ms 200",
        "--sweep",
        "random_output_len=64,128",
    ]
    cli = subprocess.Popen(
        [sys.executable, "-m", "bench_core", *args],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal's Ctrl-C finds it: a suite started in the background (`cmd &` in a script) hands its
        # children SIGINT ignored, and Python then leaves it ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        pid = server_pid_once_measuring(tmp_path)
        assert alive(pid)
        cli.send_signal(stop)
        _, err = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == EXIT_INTERRUPTED, err
    assert not alive(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nor anything else of its process group


@pytest.fixture(scope="module")
def knee_sweep(tmp_path_factory, tiny_model_path):
    work = tmp_path_factory.mktemp("find-max")
    proc = bench(
        work,
        *SMALL_RUN,
        "--num-prompts",
        "8",
        "--random-output-len",
        "4",
        "--server-cmd",
        KNEE_SERVER,
        "--sweep",
        f"knee={KNEE}",
        "--find-max",
        "max_concurrency",
        "--slo-ttft-ms",
        str(SLO_MS),
        "--goodput-target",
        "0.9",
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    return work, proc


def test_find_max_finds_the_known_knee_of_a_server_whose_latency_rises_with_load(knee_sweep):
    tmp_path, proc = knee_sweep
    rows = rows_of(tmp_path)
    sweep_id = rows["sweep_id"].iloc[0]
    probes = probes_of(History(tmp_path / "results"), sweep_id)
    assert probes["load"].tolist() == [1, 2, 4, 3]  # doubling until 4 misses, then the bisection between 2 and 4
    assert probes["met"].tolist() == [True, True, False, True]
    assert probes["stopped_early"].iloc[2]  # 4 at once: stopped once one request missed (the target allows none)
    at_knee = probes["run_id"].iloc[3]
    assert (
        f"Highest max_concurrency at knee={KNEE} meeting 90% of requests within the SLO: {KNEE}, shown by {at_knee}; "
        f"4 missed it ({probes['run_id'].iloc[2]})"
    ) in proc.stdout
    assert set(rows["sweep_id"]) == {sweep_id} and len(rows) == 4
    assert rows.set_index("run_id").loc[at_knee, "max_concurrency"] == KNEE

    # A resume replays the journal: nothing runs again, the answer is the same.
    again = bench(tmp_path, "sweep", "--resume", sweep_id, "--results", "results")
    assert again.returncode == EXIT_OK, again.stderr
    assert f"Highest max_concurrency at knee={KNEE} meeting 90% of requests within the SLO: {KNEE}" in again.stdout
    assert len(rows_of(tmp_path)) == 4


@pytest.mark.parametrize(
    ("probes", "expected"),
    [
        ([], 1.0),
        ([Probe(1.0, True)], 2.0),
        ([Probe(1.0, True), Probe(2.0, True), Probe(4.0, False)], 3.0),
        ([Probe(1.0, True), Probe(2.0, True), Probe(4.0, False), Probe(3.0, True), Probe(3.5, False)], 3.25),
        (
            [
                Probe(1.0, True),
                Probe(2.0, True),
                Probe(4.0, False),
                Probe(3.0, True),
                Probe(3.5, False),
                Probe(3.25, False),
            ],
            None,
        ),  # 3 and 3.25 are within 10% of 3
        ([Probe(1.0, False)], 0.5),  # a rate that misses at the start halves
        ([Probe(1.0, False), Probe(0.5, False), Probe(0.25, False), Probe(0.125, False)], None),  # down to start / 8
    ],
)
def test_a_rate_search_doubles_then_bisects_to_its_relative_precision(probes, expected):
    assert find_max.next_load(FindMax("request_rate", 1.0, precision=0.1), probes) == expected


def test_a_search_that_meets_the_target_up_to_its_limit_stops_there():
    search = FindMax("max_concurrency", 1, limit=6)
    probes = [Probe(1, True), Probe(2, True), Probe(4, True)]
    assert find_max.next_load(search, probes) == 6
    assert find_max.next_load(search, [*probes, Probe(6, True)]) is None
    assert find_max.found([*probes, Probe(6, True)]) == 6
    assert find_max.next_load(search, [Probe(1, False)]) is None and find_max.found([Probe(1, False)]) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--server-cmd", f"{SERVER} --token-delay-ms {{delay}}", "--sweep", "num_prompts=2,4"],
            "error: The server command's {delay} has no value: give --sweep delay=V1,V2 or --server-setting delay=VALUE.",
        ),
        (["--server-cmd", "python server.py", "--sweep", "num_prompts=2,4"], "error: The server command has no {port}"),
        (
            ["--server-cmd", SERVER, "--server-setting", "delay=5", "--sweep", "num_prompts=2,4"],
            "error: The server command has no {delay} field for the server setting delay.",
        ),
        (
            ["--server-cmd", SERVER, "--find-max", "request_rate"],
            "error: --find-max looks for the highest load within an SLO",
        ),
        (
            ["--server-cmd", SERVER, "--find-max", "request_rate", "--slo-ttft-ms", "100", "--goodput-target", "1.5"],
            "error: --goodput-target must be a number above 0 and at most 1; got 1.5.",
        ),
        (
            [
                "--server-cmd",
                SERVER,
                "--find-max",
                "max_concurrency",
                "--slo-ttft-ms",
                "100",
                "--find-max-limit",
                "0.5",
            ],
            "error: --find-max-limit must be at least --find-max-start (1); got 0.5.",
        ),
        (
            ["--server-cmd", SERVER, "--server-start-timeout", "0", "--sweep", "num_prompts=2,4"],
            "error: --server-start-timeout must be a number above 0 and at most 86,400; got 0.",
        ),
        (
            ["--server-cmd", "lmdeploy-serve-typo --port {port}", "--sweep", "num_prompts=2,4"],
            "error: The server command's program 'lmdeploy-serve-typo' is not on this machine",
        ),
    ],
)
def test_a_server_sweep_that_cannot_work_is_one_line_exit_2_and_nothing_written(args, message, tmp_path):
    proc = bench(tmp_path, *SMALL_RUN, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_the_sweep_page_charts_the_probes_and_the_highest_load_that_met_the_target(
    knee_sweep, monkeypatch, fresh_dashboard
):
    at = open_sweep_page(knee_sweep[0], monkeypatch)
    # The heading is the report's, in bold, its text escaped for Markdown as outside text is.
    assert any(
        f"**Highest max\\_concurrency at knee={KNEE} meeting the target: {KNEE}**" == m.value for m in at.markdown
    )
    (chart,) = [json.loads(element.proto.spec) for element in at.get("plotly_chart")]
    assert [trace["name"] for trace in chart["data"]] == [
        "Met the target",
        "Missed it",
        f"Highest load meeting it: {KNEE}",
    ]
    met, missed, star = chart["data"]
    assert _numbers(met["x"]) == [1, 2, 3] and met["text"] == ["1", "2", "4"]  # numbered in the order they ran
    assert _numbers(missed["x"]) == [4] and missed["marker"]["symbol"] == ["circle-open"]  # stopped early
    assert _numbers(star["x"]) == [KNEE]
    # The SLO a probe's requests met to count, the target, the search's bounds and budget, and its servers, under the
    # title, broken into lines that fit the chart.
    assert chart["layout"]["title"]["subtitle"]["text"].split("<br>") == [
        f"Good requests: TTFT ≤ {SLO_MS:,} ms; target attainment 0.9",
        "Search: max_concurrency from 1 up to 8, within 10%, at most 40 probes",
        "and 24 h 00 min a point",
        "A server started per run",
    ]


def _numbers(values) -> list:
    """A figure's values as plotly's JSON writes them: a list, or a typed array in base64."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return list(values)


def test_a_server_that_asks_for_the_api_key_is_asked_with_it_until_it_answers(tmp_path, tiny_model_path):
    # The server reads its key where the run's key comes from, $OPENAI_API_KEY: unasked, it answers 401 only.
    proc = bench(
        tmp_path,
        *SMALL_RUN,
        "--server-cmd",
        f"{SERVER} --api-key-from-env OPENAI_API_KEY",
        "--sweep",
        "num_prompts=2",
        "--server-start-timeout",
        "60",
        OPENAI_API_KEY="sk-sweep-key",
    )
    assert proc.returncode == 0, proc.stderr
    assert rows_of(tmp_path)["status"].tolist() == ["finished"]


def test_a_credential_on_the_server_command_is_not_saved_and_its_sweep_cannot_restart_its_server(
    tmp_path, tiny_model_path
):
    # --api-keys and --hf-token stand for the server's own credentials; load_server.py takes neither, so it exits.
    proc = bench(
        tmp_path,
        *SMALL_RUN,
        "--server-cmd",
        f"{SERVER} --api-keys sk-not-saved-1 --hf-token=hf_not_saved",
        "--sweep",
        "num_prompts=2",
    )
    assert proc.returncode == EXIT_FAILED, proc.stderr
    (plan_file,) = (tmp_path / "results" / "sweeps").glob("*.json")
    saved = plan_file.read_text()
    assert "--api-keys *** --hf-token=***" in saved and "not-saved" not in saved
    assert "not-saved" not in (tmp_path / "results" / "history.csv").read_text() + proc.stderr
    again = bench(tmp_path, "sweep", "--resume", plan_file.stem, "--results", "results")
    assert again.returncode == 2 and "error: The sweep's saved server command masks a credential" in again.stderr
