"""Faults of issue 10: credentials on disk or on screen, formulas in CSVs, sampling settings that cannot be right.

Real processes (`python -m bench_core`), a real server on 127.0.0.1 that records what reaches it, real files.
"""

import base64
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from aiohttp import web
from streamlit.testing.v1 import AppTest

from bench_core import csvstore
from bench_core.errors import HistoryError
from bench_core.load.playground import PlaygroundResult, results_to_csv_bytes
from bench_core.store.history import History
from tests.app_under_test import APP
from tests.cli_forks import CliForks
from tests.openai_server import _make_app, free_port, serving

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CANARY = "canary-5ec2e7-"  # every credential below contains it; no file or output may
PASSWORD = CANARY + "password"
BODY_KEY = CANARY + "body-key"
NESTED_TOKEN = CANARY + "nested-token"
EXTRA_BODY = json.dumps({"api_key": BODY_KEY, "auth": {"token": NESTED_TOKEN}, "temperature": 0})
SERVED_MODEL = "tiny"
FORMULAS = ('=HYPERLINK("http://evil.example","click")', "=cmd|' /C calc'!A0", "@SUM(1+1)", "+x", "-x", "\tx")


@pytest.fixture(scope="module")
def cli():
    """`python -m bench_core` for this module's commands: forks of one interpreter that imported the CLI's libraries
    once (tests/cli_forks.py), each its own process from `main_and_exit` on. The test of $OPENAI_API_KEY starts a
    real interpreter of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("OPENAI_API_KEY", None)  # the credentials under test are the URL's
    with CliForks(env) as forks:
        yield forks


def run_cli(cli: CliForks, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return cli.run(list(args), cwd=cwd)


def recording_app(seen: list[tuple[str, str]], quote_credentials: bool = False) -> web.Application:
    """The test server's app (answers as `openai_server` does, and lists one model), keeping each request's
    Authorization header and body in `seen`. With `quote_credentials` it refuses every completion with an
    error that repeats them, the URL with its user-info and the Authorization header included."""

    @web.middleware
    async def record(request: web.Request, handler):
        body = (await request.read()).decode()
        authorization = request.headers.get("Authorization", "")
        seen.append((authorization, body))
        if quote_credentials and request.path.endswith("completions"):
            user_info = base64.b64decode(authorization.removeprefix("Basic ")).decode()
            message = (
                f"user-info {user_info} for http://{user_info}@{request.host}{request.path} refused, "
                f"Authorization: {authorization}, password {PASSWORD}, request {body}"
            )
            return web.json_response({"error": {"message": message}}, status=401)
        return await handler(request)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": SERVED_MODEL}]})

    app = _make_app()
    app.middlewares.append(record)
    app.router.add_get("/v1/models", models)
    return app


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{CANARY}user:{PASSWORD}@")


def restful(cli: CliForks, url: str, work: Path, *flags: str) -> subprocess.CompletedProcess:
    return run_cli(
        cli,
        "restful",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--tokenizer",
        "builtin:tiny-llama",
        "--dataset-path",
        "builtin:sample",
        "--num-prompts",
        "4",
        "--sharegpt-output-len",
        "4",
        "--extra-request-body",
        EXTRA_BODY,
        "--results",
        "results",
        "--output-file",
        "out.csv",
        *flags,
        cwd=work,
    )


def everything_written(folder: Path) -> str:
    """The text of every file under `folder`; parquet tables as their cells (their pages are compressed)."""
    texts = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        texts.append(path.name)
        if path.suffix == ".parquet":
            texts.append(pd.read_parquet(path).to_csv())
        else:
            texts.append(path.read_bytes().decode("utf-8", errors="replace"))
    return "\n".join(texts)


def test_credentials_reach_the_server_but_no_file_and_no_output(tmp_path, cli):
    seen = []
    with serving(recording_app(seen)) as url:
        proc = restful(cli, with_credentials(url), tmp_path)  # no --model: the model is looked up with them too
    assert proc.returncode == 0, proc.stderr
    written = everything_written(tmp_path)
    assert "history.csv" in written and "config.json" in written and "requests.parquet" in written
    assert "out.csv" in written
    assert CANARY not in written + proc.stdout + proc.stderr
    expected = "Basic " + base64.b64encode(f"{CANARY}user:{PASSWORD}".encode()).decode()
    assert seen and {authorization for authorization, _ in seen} == {expected}
    completions = [json.loads(body) for _, body in seen if body]
    assert completions and all(
        body["api_key"] == BODY_KEY and body["auth"] == {"token": NESTED_TOKEN} for body in completions
    )
    (config_file,) = (tmp_path / "results" / "runs").glob("*/config.json")
    flat = json.loads(config_file.read_text())["flat"]
    assert flat["base_url"] == url.replace("http://", "http://***@")
    assert json.loads(flat["extra_request_body"]) == {"api_key": "***", "auth": "***", "temperature": 0}


def test_a_server_quoting_the_credentials_in_its_errors_gets_them_recorded_nowhere(tmp_path, cli):
    seen = []
    with serving(recording_app(seen, quote_credentials=True)) as url:
        proc = restful(cli, with_credentials(url), tmp_path, "--model", SERVED_MODEL, "--disable-warmup")
    assert proc.returncode == 1, proc.stderr  # no request succeeded
    assert "HTTP 401" in proc.stderr
    history = History(tmp_path / "results").load()
    assert "HTTP 401" in history["failure_reasons"][0]
    assert CANARY not in everything_written(tmp_path) + proc.stdout + proc.stderr


def test_the_dashboards_engine_process_masks_credentials_a_server_quotes_in_what_the_page_shows(tmp_path):
    from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
    from bench_core.run.engine_process import ProcessRunner

    seen = []
    with serving(recording_app(seen, quote_credentials=True)) as url:
        runner = ProcessRunner(History(tmp_path / "results"))
        try:
            run = runner.submit(
                RunConfig(
                    engine=EngineConfig(
                        backend="openai",
                        model=SERVED_MODEL,
                        base_url=with_credentials(url),
                        tokenizer="builtin:tiny-llama",
                        extra_request_body=EXTRA_BODY,
                    ),
                    dataset=DatasetConfig(dataset="builtin:sample", num_prompts=4, sharegpt_output_len=4),
                    load=LoadConfig(load_pattern="request_rate", stream_output=True),
                )
            )
            assert run.wait(120)
        finally:
            runner.shutdown()
    assert run.state == "failed" and "HTTP 401" in run.message
    shown = run.message + json.dumps(run.snapshot().__dict__, default=str) + json.dumps(run.measurement.warnings)
    assert CANARY not in shown + everything_written(tmp_path)


def test_an_unreachable_server_with_credentials_is_one_line_without_them(tmp_path, cli):
    proc = restful(cli, with_credentials(f"http://127.0.0.1:{free_port()}"), tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Cannot reach http://***@127.0.0.1:" in proc.stderr
    assert CANARY not in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


def test_a_server_password_stays_out_of_the_dashboard_link_and_its_description():
    from bench_core.config import EngineConfig, RunConfig
    from dashboard.run_view import describe_config

    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.selectbox(key="backend").select("openai").run()
    at.sidebar.text_input(key="knob_base_url").input(with_credentials("http://127.0.0.1:9")).run()
    at.sidebar.text_input(key="knob_extra_request_body").input(EXTRA_BODY).run()
    assert not at.exception
    assert at.query_params["knob_base_url"] == "http://***@127.0.0.1:9"
    assert CANARY not in json.dumps(dict(at.query_params.items()))
    engine = EngineConfig(backend="openai", model="m", base_url=with_credentials("http://127.0.0.1:9"))
    assert "http://***@127.0.0.1:9" in describe_config(RunConfig(engine=engine))


def read_cells(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))


@pytest.fixture(scope="module")
def labelled_run(tmp_path_factory, tiny_model_path, cli) -> Path:
    """A real run of the tiny model labelled with a formula; returns its working folder."""
    work = tmp_path_factory.mktemp("formula")
    proc = run_cli(
        cli,
        "pipeline",
        "builtin:sample",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "-n",
        "4",
        "-c",
        "4",
        "--sharegpt-output-len",
        "4",
        "--label",
        FORMULAS[0],
        "--results",
        "results",
        cwd=work,
    )
    assert proc.returncode == 0, proc.stderr
    return work


def test_history_and_downloads_hold_formulas_as_quoted_text_and_read_them_back_exactly(labelled_run):
    history = History(labelled_run / "results")
    header, *rows = read_cells(history.csv_path.read_bytes())
    assert rows[0][header.index("label")] == "'" + FORMULAS[0]  # safe to open in a spreadsheet as it is
    assert history.load()["label"].tolist() == [FORMULAS[0]]  # and the app reads what was typed
    header, *rows = read_cells(history.to_csv_bytes())
    assert rows[0][header.index("label")] == "'" + FORMULAS[0]


def test_imported_formulas_are_quoted_in_downloads_and_negative_numbers_stay_numbers(labelled_run, tmp_path):
    history = History(tmp_path / "results")
    header, row = read_cells(History(labelled_run / "results").to_csv_bytes())
    cells = dict(zip(header, row))
    cells.update(
        run_id="imported-1",
        label=FORMULAS[1],
        backend=FORMULAS[2],
        model=FORMULAS[3],
        dataset=FORMULAS[4],
        error=FORMULAS[5],
        load_seconds="-1.5",
        random_range_ratio="-0.0",
        mean_ttft_ms="-",
    )  # LMDeploy's mark for "not measured"
    history.import_csv(csvstore.table_bytes(header, [cells]), "shared.csv")
    header, row = read_cells(history.to_csv_bytes())
    got = dict(zip(header, row))
    assert [got[col] for col in ("label", "backend", "model", "dataset", "error")] == ["'" + f for f in FORMULAS[1:]]
    assert (got["load_seconds"], got["random_range_ratio"], got["mean_ttft_ms"]) == ("-1.5", "-0.0", "-")
    assert history.load()["label"].tolist() == [FORMULAS[1]]
    answer = PlaygroundResult(0, prompt=FORMULAS[2], text=FORMULAS[0], ttft_s=-0.25)
    header, row = read_cells(results_to_csv_bytes([answer]))
    assert dict(zip(header, row))["prompt"] == "'" + FORMULAS[2] and dict(zip(header, row))["text"] == "'" + FORMULAS[0]
    assert dict(zip(header, row))["ttft_s"] == "-0.25"
    header, row = read_cells(csvstore.frame_bytes(pd.DataFrame({"reason": [FORMULAS[1]], "ttft_s": [-1.5]})))
    assert row == ["'" + FORMULAS[1], "-1.5"]


@pytest.mark.parametrize("column", ["mean_ttft_ms", "p99_ttft_ms"])
def test_an_imported_text_cell_in_a_number_column_is_refused_naming_its_line_and_column(labelled_run, tmp_path, column):
    history = History(tmp_path / "results")
    history.import_csv(History(labelled_run / "results").csv_path)  # a good history first
    before = history.csv_path.read_bytes()
    header, row = read_cells(History(labelled_run / "results").to_csv_bytes())
    good, bad = dict(zip(header, row)), dict(zip(header, row))
    good["run_id"], bad["run_id"], bad[column] = "shared-1", "shared-2", FORMULAS[2]
    refused = rf"Line 3 of shared.csv: '{column}' holds '@SUM\(1\+1\)', which is not a number"
    with pytest.raises(HistoryError, match=refused):
        history.import_csv(csvstore.table_bytes(header, [good, bad]), "shared.csv")
    assert history.csv_path.read_bytes() == before
    assert pd.api.types.is_float_dtype(history.load()[column])


def test_a_stray_text_cell_in_a_number_column_reads_as_missing_not_as_a_text_column(labelled_run, tmp_path):
    """A row added by hand to a history.csv written before the index: read once, when the index is built."""
    root = tmp_path / "results"
    History(root).import_csv(History(labelled_run / "results").csv_path)
    header, rows = csvstore.read_table(root / "history.csv")
    rows.append({**rows[0], "run_id": "edited-by-hand", "mean_e2e_ms": "oops"})
    (root / "history.csv").write_bytes(csvstore.table_bytes(header, rows))
    for index_file in root.glob("history.sqlite*"):
        index_file.unlink()
    history = History(root)
    latency = history.load()["mean_e2e_ms"]
    assert pd.api.types.is_float_dtype(latency) and latency.isna().tolist() == [False, True]
    assert history.row("edited-by-hand")["mean_e2e_ms"] == "oops"  # kept as written


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--temperature", "-1"), "temperature must be a number from 0 to 2 (got -1.0)"),
        (("--temperature", "2.5"), "temperature must be a number from 0 to 2 (got 2.5)"),
        (("--top-p", "2"), "top_p must be a number from 0 to 1 (got 2.0)"),
        (("--top-k", "-1"), "top_k must be a whole number from 0 to 2,147,483,647 (got -1)"),
    ],
)
def test_sampling_settings_lmdeploy_refuses_are_one_line_and_exit_2(tmp_path, flags, named, cli):
    proc = run_cli(
        cli,
        "pipeline",
        "builtin:sample",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "-n",
        "4",
        "--results",
        "results",
        "--csv",
        "out.csv",
        *flags,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and named in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_request_body_with_an_impossible_penalty_or_token_budget_is_refused_before_anything_is_sent(tmp_path, cli):
    seen = []
    with serving(recording_app(seen)) as url:
        proc = run_cli(
            cli,
            "restful",
            "--base-url",
            url,
            "--model",
            SERVED_MODEL,
            "--tokenizer",
            "builtin:tiny-llama",
            "--num-prompts",
            "4",
            "--extra-request-body",
            '{"repetition_penalty": -1, "max_tokens": 0}',
            "--results",
            "results",
            "--output-file",
            "out.csv",
            cwd=tmp_path,
        )
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: In the extra request body, repetition_penalty must be a number above 0 (got -1). "
        "In the extra request body, max_tokens must be a whole number from 1 to 2,147,483,647 (got 0).\n"
    )
    assert seen == [] and list(tmp_path.iterdir()) == []


def test_the_sidebar_refuses_to_sample_at_temperature_0_with_one_message(fresh_dashboard, tmp_path, monkeypatch):
    from dashboard.state import get_runner

    monkeypatch.setenv("BENCH_STUDIO_RESULTS", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.checkbox(key="gen_do_sample").check()
    at.sidebar.number_input(key="gen_temperature").set_value(0.0)
    at.sidebar.button(key="start").click().run()
    assert not at.exception
    (error,) = at.error
    assert error.value == "Sampling needs a temperature above 0 (turn sampling off for greedy decoding)."
    assert get_runner().runs() == []


# ---- round 3: secret names, sweep plans, two credentials, DNS rebinding ------------------------------------------

MORE_SECRETS = {"sessionid": CANARY + "session", "auth_header": CANARY + "auth-header", "session_id": CANARY + "sid"}


def test_a_body_key_that_names_a_session_or_an_auth_header_is_masked_everywhere(tmp_path, cli):
    body = json.dumps({**MORE_SECRETS, "session_len": 4096, "max_tokens": 4, "temperature": 0})
    with serving(recording_app([])) as url:
        proc = run_cli(
            cli,
            "restful",
            "--backend",
            "vllm",
            "--base-url",
            url,
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            "2",
            "--sharegpt-output-len",
            "4",
            "--extra-request-body",
            body,
            "--results",
            "results",
            "--output-file",
            "out.csv",
            cwd=tmp_path,
        )
    assert proc.returncode == 0, proc.stderr
    assert CANARY not in everything_written(tmp_path) + proc.stdout + proc.stderr
    (config_file,) = (tmp_path / "results" / "runs").glob("*/config.json")
    recorded = json.loads(json.loads(config_file.read_text())["flat"]["extra_request_body"])
    assert recorded == {**dict.fromkeys(MORE_SECRETS, "***"), "session_len": 4096, "max_tokens": 4, "temperature": 0}


def test_a_sweep_plan_keeps_no_credential_and_a_resume_asks_for_them_again(tmp_path, cli):
    seen = []
    with serving(recording_app(seen)) as url:
        secret_url = with_credentials(url)
        started = run_cli(
            cli,
            "sweep",
            "restful",
            "--backend",
            "vllm",
            "--base-url",
            secret_url,
            "--model",
            SERVED_MODEL,
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            "2",
            "--sharegpt-output-len",
            "4",
            "--disable-warmup",
            "--extra-request-body",
            EXTRA_BODY,
            "--results",
            "results",
            "--output-file",
            "",
            "--sweep",
            "request_rate=10,20",
            cwd=tmp_path,
        )
        assert started.returncode == 0, started.stderr
        assert CANARY not in everything_written(tmp_path)
        (plan_file,) = (tmp_path / "results" / "sweeps").glob("*.json")
        assert plan_file.stat().st_mode & 0o777 == 0o666 & ~_umask()
        sweep_id = plan_file.stem
        # As if nothing had finished: no runs in the history.
        results = History(tmp_path / "results")
        results.delete(results.load()["run_id"])
        refused = run_cli(cli, "sweep", "--resume", sweep_id, "--results", "results", cwd=tmp_path)
        assert refused.returncode == 2
        assert refused.stderr.strip() == (
            f"error: Sweep {sweep_id} was started with credentials in --base-url and --extra-request-body, which its "
            "saved plan does not keep: resume it with --base-url and --extra-request-body given again."
        )
        seen.clear()
        resumed = run_cli(
            cli,
            "sweep",
            "--resume",
            sweep_id,
            "--results",
            "results",
            "--base-url",
            secret_url,
            "--extra-request-body",
            EXTRA_BODY,
            cwd=tmp_path,
        )
    assert resumed.returncode == 0, resumed.stderr
    expected = "Basic " + base64.b64encode(f"{CANARY}user:{PASSWORD}".encode()).decode()
    assert seen and {authorization for authorization, _ in seen} == {expected}  # the resumed runs sent them
    assert CANARY not in everything_written(tmp_path) + resumed.stdout + resumed.stderr


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_api_key_beside_a_url_with_user_info_is_refused_before_anything_is_sent(tmp_path):
    seen = []
    env_key = {**os.environ, "OPENAI_API_KEY": CANARY + "env-key"}
    with serving(recording_app(seen)) as url:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench_core",
                "restful",
                "--backend",
                "vllm",
                "--base-url",
                with_credentials(url),
                "--model",
                SERVED_MODEL,
                "--tokenizer",
                "builtin:tiny-llama",
                "--dataset-path",
                "builtin:sample",
                "--num-prompts",
                "2",
                "--results",
                "results",
                "--output-file",
                "",
            ],
            cwd=tmp_path,
            env={**env_key, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: The server URL carries a user name or password and an API key")
    assert seen == [] and not (tmp_path / "results" / "history.csv").exists()


def _websocket_handshake(port: int, host: str, origin: str) -> int:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(
        "GET",
        "/_stcore/stream",
        headers={
            "Host": host,
            "Origin": origin,
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Protocol": "streamlit",
        },
    )
    status = connection.getresponse().status
    connection.close()
    return status


def test_the_dashboard_refuses_a_websocket_whose_host_is_not_this_machine(tmp_path):
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 is the dashboard's own origin to
    the browser; only the Host header tells it apart, and the configuration's allowedHosts refuses it."""
    from tests.e2e.dashboard_server import free_port, serve

    port = free_port()
    env = {**os.environ, "BENCH_STUDIO_RESULTS": str(tmp_path / "results"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), f"--server.port={port}"]
    with serve(command, env, port, tmp_path):
        assert _websocket_handshake(port, f"127.0.0.1:{port}", f"http://127.0.0.1:{port}") == 101
        assert _websocket_handshake(port, f"localhost:{port}", f"http://localhost:{port}") == 101
        assert _websocket_handshake(port, f"evil.example:{port}", f"http://evil.example:{port}") != 101
        assert _websocket_handshake(port, f"127.0.0.1:{port}", "http://evil.example") != 101  # cross-origin


# ---- 7. every value a page reads from the URL, hostile ----

HOSTILE_URL_VALUES = [
    "9007199254740992",
    "-1" + "0" * 30,
    "1e400",
    "nan",
    "A" * 10_000,
    "a" * 300,
    "../../../etc/passwd",
    "\x00",
    "☃" * 300,
    "{[(",
    "",
]


@pytest.mark.parametrize("page", [None, "app_pages/sweep.py", "app_pages/playground.py", "app_pages/history.py"])
def test_no_value_in_the_url_breaks_a_page(fresh_dashboard, tmp_path, monkeypatch, page):
    from dashboard import url_settings

    monkeypatch.setenv("BENCH_STUDIO_RESULTS", str(tmp_path / "results"))
    (tmp_path / "results" / "sweeps").mkdir(parents=True)  # so that a sweep id reaches the file system
    at = AppTest.from_file(APP, default_timeout=60).run()
    for backend in at.sidebar.selectbox(key="backend").options:  # each backend's widgets name their URL keys
        at.sidebar.selectbox(key="backend").select(backend).run()
    keys = [*url_settings._DEFAULTS, "run", "sweep", "job"]
    assert {"knob_base_url", "knob_tp", "num_prompts_cpu", "seed"} <= set(keys)
    for value in HOSTILE_URL_VALUES:
        at = AppTest.from_file(APP, default_timeout=60)
        for key in keys:
            at.query_params[key] = value
        at.run()
        if page is not None:
            at.switch_page(page).run()
        assert not at.exception, (page, value[:40], [str(e.value)[:200] for e in at.exception])


DEEP = 100_000  # far past any recursion limit


@pytest.mark.parametrize(
    "name, text",
    [
        ("deep.json", '[{"conversations": ' + "[" * DEEP + "]" * DEEP + "}]"),
        ("deep.jsonl", '{"conversations": []}\n' + "[" * DEEP + "]" * DEEP + "\n"),
    ],
)
def test_a_dataset_nested_too_deeply_is_one_line_and_exit_2(tmp_path, name, text, cli):
    (tmp_path / name).write_text(text)
    proc = run_cli(
        cli,
        "pipeline",
        name,
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "-n",
        "2",
        "--results",
        "results",
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "nested deeper than the reader follows" in line


@pytest.mark.parametrize("name", ["deep.json", "deep.jsonl"])
def test_prompts_nested_too_deeply_are_refused_with_one_message(name):
    from bench_core.errors import DatasetError
    from bench_core.load.playground import parse_prompt_file

    data = ("[" * DEEP + "]" * DEEP).encode()
    with pytest.raises(DatasetError, match=f"{name} is JSON nested deeper than the reader follows"):
        parse_prompt_file(name, data if name.endswith(".json") else b'"hi"\n' + data)


# ---- 16. a refused run is no run; a run that fails once under way is recorded ----


def test_a_run_refused_for_its_input_writes_no_row_and_no_folder(tmp_path, cli):
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "broken-model").mkdir()
    (tmp_path / "broken-model" / "config.json").write_text("{}")
    refused = [
        ("missing.json", "builtin:tiny-llama"),
        ("empty.json", "builtin:tiny-llama"),
        ("builtin:sample", "./no-such-model"),
        ("builtin:sample", "synthetic:no-such-shape"),
    ]
    for dataset, model in refused:
        proc = run_cli(
            cli,
            "pipeline",
            dataset,
            model,
            "--backend",
            "transformers",
            "-n",
            "2",
            "--csv",
            "",
            "--results",
            "results",
            cwd=tmp_path,
        )
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert History(tmp_path / "results").load().empty
    assert not list((tmp_path / "results").glob("runs/*"))
    proc = run_cli(
        cli,
        "pipeline",
        "builtin:sample",
        "./broken-model",
        "--backend",
        "transformers",
        "-n",
        "2",
        "--csv",
        "",
        "--results",
        "results",
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    (row,) = History(tmp_path / "results").load().to_dict("records")
    assert row["status"] == "failed" and "Could not load the tokenizer of './broken-model'" in row["error"]


def test_a_resumed_tune_takes_its_masked_credentials_again_and_records_them_nowhere(tmp_path, cli):
    """A tune's saved plan masks its server URL's password; `tune --resume ID --base-url URL` gives it back, so the
    trials the resume adds reach the server with it, and nothing written or printed holds it."""
    seen = []
    with serving(recording_app(seen)) as url:
        tune = (
            "tune",
            "restful",
            *("--backend", "vllm", "--base-url", with_credentials(url), "--model", SERVED_MODEL),
            *("--tokenizer", "builtin:tiny-llama", "--dataset-path", "builtin:sample", "--num-prompts", "2"),
            *("--sharegpt-output-len", "4", "--disable-warmup", "--results", "results", "--output-file", ""),
            *("--space", "max_concurrency=1,2", "--trials", "1"),
        )
        first = run_cli(cli, *tune, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        (tune_id,) = History(tmp_path / "results").load()["sweep_id"].unique()
        before = len(seen)
        resumed = run_cli(
            cli,
            *("tune", "--resume", tune_id, "--more-trials", "1", "--results", "results"),
            *("--base-url", with_credentials(url)),
            cwd=tmp_path,
        )
    assert resumed.returncode == 0, resumed.stderr
    expected = "Basic " + base64.b64encode(f"{CANARY}user:{PASSWORD}".encode()).decode()
    added = seen[before:]
    assert added and {authorization for authorization, _ in added} == {expected}
    assert len(History(tmp_path / "results").load()) == 2  # the resume's trial ran
    written = everything_written(tmp_path)
    assert CANARY not in written + first.stdout + first.stderr + resumed.stdout + resumed.stderr
