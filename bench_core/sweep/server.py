"""A server a sweep starts for each of its runs (`sweep restful --server-cmd TEMPLATE`), waits for and stops.

The template is a command line (split as a POSIX shell would, but run without one) whose `{name}` fields are
filled per run: `{port}` with a port free on 127.0.0.1 at that moment, every other name with the run's server
setting of that name (`--sweep name=V1,V2` or `--server-setting name=VALUE`). The server runs in a process group of
its own (so a Ctrl-C at the terminal reaches only us, and stopping it stops whatever it forked), writes its output
into the run's folder, and counts as up once GET /v1/models answers 200. Stopping sends SIGTERM to the group, then
SIGKILL after STOP_GRACE_S. Every server still running when this process exits is stopped then too (atexit), so an
interrupted sweep leaves none behind.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import socket
import string
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import format_value
from ..errors import ConfigError
from ..redact import is_secret_key, redact_text, remember_secrets

PORT = "port"
SERVER_LOG = "server.log"
DEFAULT_START_TIMEOUT_S = 600.0  # a large model's first load (weights from disk, kernels compiled) takes minutes
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 10
POLL_S = 0.25

_running: set[ServerProcess] = set()
_running_lock = threading.Lock()


def template_fields(template: str) -> list[str]:
    """The `{name}` fields of a server command template, in order, each once; ConfigError for a broken template or one
    without {port} (the base URL follows the port)."""
    try:
        words = shlex.split(template)
        names = [name for word in words for _, name, _, _ in string.Formatter().parse(word) if name is not None]
    except ValueError as exc:
        raise ConfigError(
            f"The server command cannot be read ({exc}): write it as you would in a shell, with "
            "{name} fields such as {port}."
        ) from None
    if not words:
        raise ConfigError("The server command is empty.")
    bad = [name for name in names if not name.isidentifier()]
    if bad:
        raise ConfigError(
            f"The server command's field {{{bad[0]}}} is not a name: write fields as {{port}} or "
            "{max_batch_size}, and a literal brace as {{ or }}."
        )
    if PORT not in names:
        raise ConfigError(
            "The server command has no {port} field: the sweep chooses a free port for each run and "
            "reaches the server there."
        )
    return list(dict.fromkeys(names))


def missing_program(template: str) -> str | None:
    """The template's program when this machine has no such program to run (a field in its name is not judged)."""
    program = shlex.split(template)[0]
    return None if "{" in program or shutil.which(program) is not None else program


def remember_command_secrets(template: str) -> None:
    """Note the values of the template's secret-looking flags (`--api-keys K`, `--hf-token=T`): they are masked in
    the saved plan and every message, as the run's own credentials are. Better, pass them in the environment, which
    the server inherits: a plan that masked one cannot start its server again."""
    words = shlex.split(template)
    for word, following in zip(words, [*words[1:], ""]):
        flag, equals, value = word.partition("=")
        name = flag.lstrip("-").rstrip("s")
        if flag.startswith("-") and is_secret_key(name):
            remember_secrets(api_key=value if equals else following)


def command_line(template: str, port: int, settings: Mapping[str, Any]) -> list[str]:
    """The template's words with {port} and every server setting filled in."""
    values = {name: format_value(value) for name, value in settings.items()}
    return [word.format(**values, port=port) for word in shlex.split(template)]


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerFailed(Exception):
    """The server exited or never answered; the message ends with the last lines of its log."""


class ServerProcess:
    """One server, started by `start`, waited for by `wait_ready`, ended by `stop` (each safe to call again)."""

    def __init__(self, command: list[str], log_path: Path):
        self.command, self.log_path = command, log_path
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        """Launch the command in a new session (its own process group), its output into the log; ServerFailed
        when it cannot be launched at all (no such program)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            try:
                self._process = subprocess.Popen(
                    self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
                )
            except OSError as exc:
                raise ServerFailed(f"The server command could not be started ({exc.strerror or exc}).") from None
        with _running_lock:
            _running.add(self)

    def exit_code(self) -> int | None:
        """None while the server runs."""
        return None if self._process is None else self._process.poll()

    def wait_ready(self, base_url: str, api_key: str | None, timeout_s: float, cancel: threading.Event) -> bool:
        """Wait until GET {base_url}/v1/models answers 200 (asked with the run's API key, as a server started with
        one requires): True; False when `cancel` was set first. ServerFailed when the server exits first or
        `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while not cancel.is_set():
            code = self.exit_code()
            if code is not None:
                raise ServerFailed(f"The server exited with code {code} before it answered.{self.log_tail()}")
            if _answers(base_url + "/v1/models", api_key):
                return True
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"The server did not answer GET /v1/models within {timeout_s:g} s "
                    f"(--server-start-timeout).{self.log_tail()}"
                )
            cancel.wait(POLL_S)
        return False

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after STOP_GRACE_S; the group's last process reaped."""
        process = self._process
        if process is None:
            return
        with _running_lock:
            _running.discard(self)
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(process.pid, signal.SIGKILL)  # what it forked, too, even when the leader has gone
        process.wait()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """ " Its log ends: ..." with its last lines (credentials masked), or "" for an empty log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        last = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
        return f" Its log ({self.log_path}) ends: {' | '.join(redact_text(line) for line in last)}." if last else ""


def _answers(url: str, api_key: str | None) -> bool:
    from ..engines.openai_client import ServerError, http_get  # the client is imported only once a server starts

    try:
        http_get(url, api_key, timeout_s=2)
    except ServerError:
        return False
    return True


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # the group's id is the leader's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _stop_all() -> None:
    with _running_lock:
        left = list(_running)
    for server in left:
        server.stop()
