"""Faults: Ctrl-C at every phase of a real `python -m bench_core` process, servers that send keep-alives
but no tokens, the model hub looked up behind the user's back, and flags that raised tracebacks.

The CLI runs as a subprocess with its stderr on a pseudo-terminal, so it draws its progress line as a
user sees it: the tests wait for a phase's words there, then send SIGINT. "At once" is shown by what the process did,
never by how fast this machine is: it left without the interpreter's teardown (a probe's atexit hook never ran), the
run stopped in the phase Ctrl-C came in, and what was left to do (a load, a server that never answers or sends
tokens for seconds) was not waited for.
"""

import asyncio
import http.server
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from aiohttp import web
from cli_output import without_run_flags
from metrics_server import slow_metrics_server  # noqa: F401 (fixture)
from openai_server import add_openai_routes, misbehaving_server, serving  # noqa: F401 (fixture)

from bench_core import csvstore
from bench_core.cli import build_parser, main
from bench_core.cli.restful import base_url
from bench_core.config import RunConfig
from bench_core.engines.openai_client import run_requests
from bench_core.engines.openai_request import ServerSpec
from bench_core.load.datasets import SampledRequest
from bench_core.store.history import History, RunRecord, history_row

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 60  # a run that should end in seconds and has not by then hangs
# Imported by every Python process started with the probe's folder on its path: a process that goes through the
# interpreter's teardown (atexit) leaves a file named after its pid. The CLI leaves with os._exit, without it.
TEARDOWN_PROBE = """import atexit, os, pathlib
atexit.register(pathlib.Path(os.environ["TEARDOWN_PROBE_DIR"], f"teardown-{os.getpid()}").touch)
"""
PIPELINE = [
    "pipeline",
    "builtin:sample",
    "builtin:tiny-llama",
    "--backend",
    "transformers",
    "--stream-output",
    "--results",
    "results",
    "--csv",
    "",
]


def _as_from_a_terminal() -> None:
    # A shell without job control starts background jobs (a suite run with `&`) with SIGINT ignored, and children
    # inherit that; the CLI must get Ctrl-C as a user's terminal sends it. An interactive shell runs it in a process
    # group of its own, the one a terminal's Ctrl-C signals whole (`Cli.interrupt(whole_group=True)`).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setpgid(0, 0)


class Cli:
    """`python -m bench_core ARGS` run in `folder`, its stderr on a terminal, its stdout in a file."""

    def __init__(self, folder: Path, args: list[str], env: dict[str, str] | None = None):
        self.folder = folder
        self.probe = folder / "teardown-probe"
        self.probe.mkdir(exist_ok=True)
        (self.probe / "sitecustomize.py").write_text(TEARDOWN_PROBE)
        controller, terminal = pty.openpty()
        with open(folder / "stdout.txt", "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench_core", *args],
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=terminal,
                env={
                    **os.environ,
                    "PYTHONPATH": f"{self.probe}{os.pathsep}{ROOT}",
                    "TEARDOWN_PROBE_DIR": str(self.probe),
                    **(env or {}),
                },
                preexec_fn=_as_from_a_terminal,
            )
        os.close(terminal)
        self._controller, self._stderr, self._closed = controller, b"", False
        self._grew = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._controller, 4096)
            except OSError:  # the process and its terminal are gone
                data = b""
            with self._grew:
                self._stderr += data
                self._closed = not data
                self._grew.notify_all()
            if not data:
                return

    def wait_for(self, words: str, timeout: float = HANG_S) -> None:
        """Until stderr shows `words` (a phase in the progress line, say)."""
        with self._grew:
            self._grew.wait_for(lambda: words.encode() in self._stderr or self._closed, timeout)
            assert words.encode() in self._stderr, f"never saw {words!r}; stderr: {self.lines()}"

    def interrupt(self, signum: int = signal.SIGINT, whole_group: bool = False) -> None:
        """Send SIGINT (or `signum`), to the process or to its whole process group as a terminal's Ctrl-C does, and
        wait for the process to end (HANG_S bounds a hung test, not a speed)."""
        if whole_group:
            os.killpg(self.process.pid, signum)
        else:
            self.process.send_signal(signum)
        self.process.wait(timeout=HANG_S)

    def tore_down(self) -> bool:
        """Whether the process went through the interpreter's teardown (TEARDOWN_PROBE), once it has ended."""
        return (self.probe / f"teardown-{self.process.pid}").exists()

    def finish(self, timeout: float = HANG_S) -> int:
        return self.process.wait(timeout=timeout)

    def lines(self) -> list[str]:
        """The lines printed on stderr, without the progress line's redraws (they never end a line)."""
        self._reader.join(timeout=5 if self.process.poll() is not None else 0)
        text = self._stderr.decode(errors="replace").replace("\r\n", "\n")  # the terminal's own line ends
        return [last for line in text.split("\n") if (last := line.rsplit("\r", 1)[-1]).strip()]

    def stdout(self) -> str:
        return (self.folder / "stdout.txt").read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self._controller)


@pytest.fixture
def cli(tmp_path):
    started = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Cli:
        started.append(Cli(tmp_path, args, env))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def restful_args(url: str, model: str, *flags: str) -> list[str]:
    return [
        "restful",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--model",
        model,
        "--tokenizer",
        "builtin:tiny-llama",
        "--dataset-path",
        "builtin:sample",
        "--output-file",
        "",
        "--results",
        "results",
        *flags,
    ]


def history(folder: Path) -> History:
    return History(folder / "results")


def requests_of_last_run(folder: Path) -> pd.DataFrame:
    stored = history(folder).load()
    return history(folder).requests(stored["run_id"].iloc[-1])


def assert_interrupted_at_once(process: Cli, signum: int = signal.SIGINT, whole_group: bool = False) -> list[str]:
    process.interrupt(signum, whole_group)
    lines = without_run_flags(process.lines())
    assert process.process.returncode == 130, lines
    # It left once its line was said, without the interpreter's teardown (the probe's atexit hook never ran): that
    # takes seconds once torch is imported, and would wait on a load that Ctrl-C left behind.
    assert not process.tore_down(), lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines


# --- Ctrl-C at every phase: exit 130 at once, one line --------------------------------------------


@pytest.mark.parametrize("phase", ["loading the tokenizer", "on the transformers engine"])
def test_ctrl_c_while_loading_exits_130_at_once_with_one_line(cli, tmp_path, phase):
    process = cli([*PIPELINE, "-n", "4", "--sharegpt-output-len", "8"])
    process.wait_for(phase)
    (line,) = assert_interrupted_at_once(process)
    # The run stopped in the phase Ctrl-C came in: one that waited for its load would have gone on to a later phase.
    assert line.startswith("interrupted while ") and phase in line and "nothing was measured" in line
    assert not history(tmp_path).csv_path.exists()  # nothing measured, nothing recorded


def test_ctrl_c_before_the_run_starts_exits_130_with_one_line(cli):
    with socket.create_server(("127.0.0.1", 0)) as server:  # connections wait in its backlog, never answered
        server.settimeout(HANG_S)
        process = cli(["restful", "--port", str(server.getsockname()[1]), "--output-file", "", "--results", "results"])
        connection, _ = server.accept()  # the CLI is asking which model the server serves
        with connection:
            assert assert_interrupted_at_once(process) == ["interrupted"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_while_measuring_keeps_what_was_measured(signum, cli, tmp_path):
    process = cli([*PIPELINE, "-n", "8", "--sharegpt-output-len", "2000"])
    process.wait_for("running:")
    (line,) = assert_interrupted_at_once(process, signum)
    assert line.endswith("cancelled in results/history.csv")
    assert history(tmp_path).load()["status"].tolist() == ["cancelled"]


def test_ctrl_c_while_saving_lets_the_save_finish(cli, tmp_path):
    # A long history makes the save take a while (its row brings the env_* columns: history.csv is written again
    # whole), long enough to interrupt it. Its index is built before the run, as its first start would.
    earlier = history_row(
        RunRecord(run_id="x", started_at="2026-01-01T00:00:00+00:00", status="failed", config=RunConfig())
    )
    csvstore.append_rows(history(tmp_path).csv_path, [{**earlier, "run_id": f"earlier-{i}"} for i in range(4000)])
    history(tmp_path).reindex()
    process = cli([*PIPELINE, "-n", "2", "--sharegpt-output-len", "8"])
    deadline = time.monotonic() + HANG_S
    while not list(history(tmp_path).runs_dir.glob("*/requests.parquet")) and time.monotonic() < deadline:
        time.sleep(0.01)  # the run folder is written first, then the history row
    (line,) = assert_interrupted_at_once(process)
    assert line.endswith("finished in results/history.csv")
    stored = history(tmp_path).load()
    assert len(stored) == 4001 and stored["status"].iloc[-1] == "finished"


def test_ctrl_c_during_a_restful_warm_up_exits_130_with_one_line(cli, misbehaving_server, tmp_path):
    process = cli(restful_args(misbehaving_server, "keepalive", "--num-prompts", "2", "--sharegpt-output-len", "8"))
    process.wait_for("warming up")
    (line,) = assert_interrupted_at_once(process)
    assert line == "interrupted while warming up: nothing was measured or recorded"


def test_ctrl_c_while_a_restful_run_measures_counts_requests_in_flight_as_cancelled(cli, misbehaving_server, tmp_path):
    # --no-server-metrics: that server serves no /metrics, whose warning line would come before the one asserted.
    process = cli(
        restful_args(
            misbehaving_server,
            "m",
            "--num-prompts",
            "3",
            "--sharegpt-output-len",
            "2000",
            "--disable-warmup",
            "--no-server-metrics",
        )
    )
    process.wait_for("running:")
    (line,) = assert_interrupted_at_once(process)
    assert line.endswith("cancelled in results/history.csv")
    table = requests_of_last_run(tmp_path)
    assert table["status"].tolist() == ["cancelled"] * 3
    assert f"{'Cancelled requests:':<40} 3" in process.stdout()
    assert f"{'Failed requests:':<40} 0" in process.stdout()


def test_ctrl_c_while_the_servers_metrics_page_dribbles_ends_the_run_at_once(cli, slow_metrics_server, tmp_path):
    # A read may take 5 s (the interval's): the page's first byte has come when Ctrl-C does, its last would in 20 s.
    flags = (
        "--num-prompts",
        "3",
        "--sharegpt-output-len",
        "2000",
        "--disable-warmup",
        "--server-metrics-interval",
        "5",
    )
    process = cli(restful_args(f"{slow_metrics_server.url}/dribble", "tiny", *flags))
    process.wait_for("running:")
    assert slow_metrics_server.dribbling.wait(HANG_S)
    (line,) = assert_interrupted_at_once(process, whole_group=True)  # the reader gets it too, and says nothing
    assert line.endswith("cancelled in results/history.csv")
    assert not slow_metrics_server.dribbled_whole.is_set()  # the command left while the page was still coming
    assert requests_of_last_run(tmp_path)["status"].tolist() == ["cancelled"] * 3


# --- servers that send keep-alives but no tokens ------------------------------------------------


def test_a_request_without_tokens_fails_after_the_timeout_whatever_else_the_server_sends(
    cli, misbehaving_server, tmp_path
):
    process = cli(
        restful_args(
            misbehaving_server,
            "keepalive",
            "--num-prompts",
            "2",
            "--sharegpt-output-len",
            "8",
            "--timeout",
            "2",
            "--disable-warmup",
        )
    )
    assert process.finish() == 1  # no request succeeded
    table = requests_of_last_run(tmp_path)
    assert table["status"].tolist() == ["failed"] * 2
    assert table["reason"].eq("error: the server sent no token for 2 s (read timeout) after 0 tokens").all()


def test_a_duration_ends_the_run_and_cancels_the_requests_in_flight(cli, misbehaving_server, tmp_path):
    process = cli(
        restful_args(
            misbehaving_server,
            "keepalive",
            "--num-prompts",
            "2",
            "--sharegpt-output-len",
            "8",
            "--duration",
            "2",
            "--disable-warmup",
        )
    )
    assert process.finish() == 1  # no request succeeded: nothing to measure
    assert process.lines()[-1] == "error: No request succeeded (2 cancelled in flight when the duration ended)"
    stored = history(tmp_path).load()
    assert (stored["failed"].iloc[-1], stored["cancelled"].iloc[-1]) == (0, 2)
    table = requests_of_last_run(tmp_path)
    assert table["reason"].eq("cancelled when the run's duration ended, after 0 tokens").all()


def test_a_warm_up_without_tokens_fails_within_the_duration(cli, misbehaving_server):
    process = cli(
        restful_args(
            misbehaving_server, "keepalive", "--num-prompts", "2", "--sharegpt-output-len", "8", "--duration", "2"
        )
    )
    assert process.finish() == 2
    (line,) = process.lines()
    assert line.startswith("error: The warm-up request failed") and "no token for 2 s" in line


STREAM_S = 60.0  # how long the endless server streams a request: far past the deadline asked


def endless_stream_app(log: list[str]) -> web.Application:
    """A server that streams a token every 10 ms for STREAM_S (never silent); `log` gets "closed" when the client
    goes away before that (handler_cancellation), else "finished"."""

    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for _ in range(int(STREAM_S / 0.01)):
                await response.write(b'data: {"choices": [{"index": 0, "text": " tok", "finish_reason": null}]}\n\n')
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            log.append("closed")
            raise
        log.append("finished")
        return response

    return add_openai_routes(web.Application(), answer)


def test_a_request_past_its_deadline_fails_with_the_reason():
    log: list[str] = []
    with serving(endless_stream_app(log)) as url:
        run = run_requests(ServerSpec(url, total_timeout_s=0.5), "m", [SampledRequest("p", 4, 10**6)])
        list(run.events())
        (result,) = run.results
        ended = list(log)  # what the server had seen when the run ended
        hung_at = time.monotonic() + HANG_S
        while not log and time.monotonic() < hung_at:
            time.sleep(0.01)
    assert result.finish_reason == "error" and result.message.startswith(
        "the request ran past its 0.5 s deadline after "
    )
    # The client gave up at its deadline, not before it, and not because the stream ended: the server was still
    # streaming when the run ended, and then saw the connection closed; the request lasted less than a tenth of the
    # stream it cut.
    assert 0.5 <= result.end_ts - result.sent_ts < STREAM_S / 10
    assert ended in ([], ["closed"]) and log == ["closed"], (ended, log)


# --- the server's address, the model hub, flags --------------------------------------------------


def test_restful_targets_this_machine_by_default():
    assert base_url(build_parser().parse_args(["restful"])) == "http://127.0.0.1:23333"


class _CountingHub(http.server.BaseHTTPRequestHandler):
    asked: list[str] = []

    def do_GET(self):
        _CountingHub.asked.append(self.path)
        self.send_error(404)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_restful_without_a_tokenizer_stays_off_the_model_hub_and_says_how_to_allow_it(
    cli, misbehaving_server, tmp_path, monkeypatch
):
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingHub)  # the hub, as far as the CLI knows
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the user's shell: nothing set
    args = restful_args(misbehaving_server, "some-org/served-model")
    del args[args.index("--tokenizer") : args.index("--tokenizer") + 2]
    try:
        process = cli(args, env={"HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}", "HF_HOME": str(tmp_path / "hf")})
        assert process.finish() == 2
    finally:
        hub.shutdown()
    assert _CountingHub.asked == []
    (line,) = process.lines()
    assert "HF_HUB_OFFLINE=0 allows downloads" in line and "--tokenizer" in line


def test_a_port_out_of_range_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["restful", "--port", "99999"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the port must be a whole number from 1 to 65535, not '99999'" in err


@pytest.mark.parametrize(
    "dataset", [["--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "8"], []]
)
def test_a_negative_seed_is_refused_with_one_line_for_every_dataset(tmp_path, capsys, dataset):
    results = tmp_path / "results"
    code = main(
        [
            "pipeline",
            "builtin:sample",
            "builtin:tiny-llama",
            "--backend",
            "transformers",
            "-n",
            "2",
            "--seed",
            "-1",
            "--results",
            str(results),
            "--csv",
            "",
            *dataset,
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err == "error: --seed must be a whole number from 0 to 4,294,967,295; got -1.\n"
    assert not results.exists()
