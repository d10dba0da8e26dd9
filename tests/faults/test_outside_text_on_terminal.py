"""Outside text on the terminal (reliability round 4, n20): what the CLI writes gets the page's treatment. A
server's error text, a model id it lists, the log of a server a sweep started and a run's label reach stdout and
stderr with their control characters written as escapes (OSC 52 would set the clipboard, CSI 2J clear the screen,
CR write over the line, C1's CSI act as ESC [), and the API key masked wherever a server quotes it. An API key
holding a line break is refused before anything is sent, in one line that does not quote it.

A real server on 127.0.0.1 (raw_http_server), the CLI in this process (`bench_core.cli.main`), a real child
process as the sweep's server.
"""

from __future__ import annotations

import io
import sys

import pytest
from app_under_test import APP, shown
from raw_http_server import RawServer, respond_json
from restful_cli import restful
from streamlit.testing.v1 import AppTest

from bench_core.cli import main
from bench_core.cli.common import wait_with_progress
from bench_core.store.history import RESULTS_ENV
from dashboard.state import get_runner

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

KEY = "sk-terminal-5ec2e7-key"
# A clipboard write (OSC 52, ended by BEL), a clear-screen, a carriage return, C1's CSI, DEL, a right-to-left override.
HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\rdone\x9b31m\x7f\u202e"
ESCAPED = "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\rdone\\x9b31m\\x7f\\u202e"
CONTROLS = ("\x1b", "\x07", "\r", "\x9b", "\x7f", "\u202e")


def hostile_server(model: str):
    """Lists `model`; refuses every completion with an error quoting HOSTILE and the Authorization header it got."""

    async def handle(request, writer) -> bool:
        if request.method == "GET":
            await respond_json(writer, {"object": "list", "data": [{"id": model, "object": "model"}]})
        else:
            said = f"{HOSTILE} bad request; you sent authorization {request.headers.get('authorization')} ({KEY})"
            await respond_json(writer, {"error": {"message": said, "type": "server_error"}}, status=500)
        return True

    return handle


def assert_shown(text: str) -> None:
    assert not [char for char in CONTROLS if char in text], text
    assert KEY not in text


def test_a_servers_text_reaches_the_terminal_escaped_and_its_key_masked(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with RawServer(hostile_server(f"tiny{HOSTILE}")) as server:
        run = restful(server.url, tmp_path, capsys, "--backend", "vllm", "--label", f"mine{HOSTILE}", prompts=2)
    assert run.code == 1 and "No request succeeded" in run.err
    assert server.requests("POST")[0].headers["authorization"] == f"Bearer {KEY}"  # sent as it is
    assert_shown(run.out + run.err)
    assert ESCAPED in run.err  # shown, to be read
    assert run.summary is not None and HOSTILE in run.summary["label"]  # recorded as given

    listed = main(["history", "list", "--results", str(tmp_path / "results"), "--columns", "run_id,label"])
    out = capsys.readouterr().out
    assert listed == 0 and f"mine{ESCAPED}" in out
    assert_shown(out)


def test_a_sweep_servers_log_lines_reach_its_last_line_escaped(tmp_path, capsys):
    printed = "\\033]52;c;cHduZWQ=\\007\\033[2J\\302\\233starting\\r\\n"  # printf's octal: C1's CSI in UTF-8
    code = main(
        [
            "sweep",
            "restful",
            "--backend",
            "vllm",
            "--model",
            "tiny",
            "--server-cmd",
            f"sh -c 'printf \"{printed}\"; exit 1' {{port}}",
            "--sweep",
            "request_rate=inf",
            "--tokenizer",
            "builtin:tiny-llama",
            "--dataset-path",
            "builtin:sample",
            "--num-prompts",
            "2",
            "--sharegpt-output-len",
            "8",
            "--disable-warmup",
            "--no-server-metrics",
            "--results",
            str(tmp_path / "results"),
            "--output-file",
            "",
        ]
    )
    said = capsys.readouterr()
    assert code == 1 and "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x9bstarting" in said.err
    assert_shown(said.out + said.err)


@pytest.mark.parametrize("pasted", ["\r\n", "\n", "\x1b[2J", "\u2028"])
def test_an_api_key_no_header_can_carry_is_refused_in_one_line_that_does_not_quote_it(
    tmp_path, capsys, monkeypatch, pasted
):
    monkeypatch.setenv("OPENAI_API_KEY", f"{KEY}{pasted}X-Injected: 1")
    with RawServer(hostile_server("tiny")) as server:
        run = restful(server.url, tmp_path, capsys, "--backend", "vllm", "--model", "tiny", prompts=2)
    assert run.code == 2 and run.out == "" and server.log == []
    (line,) = run.err.splitlines()
    assert line.startswith("error: The API key ($OPENAI_API_KEY) holds ") and f"character {len(KEY) + 1}" in line
    assert "5ec2e7" not in line and "Injected" not in line
    assert run.summary is None  # refused: no run, no row


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class EndsOnSecondWait:
    def __init__(self) -> None:
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return self.waits > 1


def test_the_progress_line_shows_outside_text_escaped_and_keeps_its_own_carriage_returns(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert wait_with_progress(EndsOnSecondWait(), lambda: f"running: {HOSTILE}")
    drawn = terminal.getvalue()
    assert drawn.startswith(f"\rrunning: {ESCAPED}") and drawn.count("\r") == 3  # the line's, and its clearing's
    assert_shown(drawn.replace("\r", ""))


def test_the_dashboard_refuses_an_api_key_no_header_can_carry_before_anything_is_sent(
    tmp_path, monkeypatch, fresh_dashboard
):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with RawServer(hostile_server("tiny")) as server:
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.sidebar.selectbox(key="backend").select("openai").run()
        at.sidebar.text_input(key="knob_base_url").input(server.url)
        at.sidebar.text_input(key="server_model").input("tiny")
        at.sidebar.text_input(key="knob_tokenizer").input("builtin:tiny-llama")
        at.sidebar.text_input(key="api_key").input(f"{KEY}\r\nX-Injected: 1")
        at.sidebar.button(key="start").click().run()
        page = " ".join(element.value for kind in ("error", "warning", "caption") for element in getattr(at, kind))
        assert not at.exception and server.log == [] and get_runner().runs() == []
    assert f"The API key (the API key field) holds a line break at character {len(KEY) + 1}" in shown(page)
    assert "5ec2e7" not in page and "Injected" not in page
