"""A server a sweep starts for each of its runs (`sweep restful --server-cmd TEMPLATE`), waits for and stops.

The template is a command line (split as a POSIX shell would, but run without one) whose `{name}` fields are
filled per run: `{port}` with a port free on 127.0.0.1 at that moment, every other name with the run's server
setting of that name (`--sweep name=V1,V2` or `--server-setting name=VALUE`). Every point's command is filled when
the plan is checked, so a field that cannot be filled is one ConfigError before anything starts.

The server runs in a session of its own (so a Ctrl-C at the terminal reaches only us, and stopping it stops
whatever it forked), under a guard process (server_guard.py) that stops the whole group when we close its pipe, and
also when this process dies however it dies: SIGKILL and a hang-up run none of our handlers, but the kernel closes
the pipe. Each server running is also recorded in the history's sweeps/servers folder until it is stopped, so the
next sweep there names any server whose guard was killed with its sweep (`leftover_servers`).

A server counts as up once GET /v1/models answers 200 from it: from a process of its own session, when the
process holding the port can be seen, and otherwise from a server that lists the model the run expects. Another
process answering at its port (two sweeps on one machine given the same free port) fails the run at once.
Stopping sends SIGTERM to the group, then SIGKILL after STOP_GRACE_S.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, cast

import psutil

from ..config import format_value, setting
from ..errors import ConfigError
from ..redact import is_secret_key, redact_text, remember_secrets

PORT = "port"
WIDEST_PORT = 65535  # a template is checked with it: no port fills a field with more characters
SERVER_LOG = "server.log"
DEFAULT_START_TIMEOUT_S = setting("server_start_timeout_s").default
STOP_GRACE_S = 10.0
# How long a run that did not finish waits for its server's guard to say whether the server died (it says so at once).
EXIT_GRACE_S = 3.0
LOG_TAIL_LINES = 10
POLL_S = 0.25
GUARD = Path(__file__).with_name("server_guard.py")
# The longest single argument Linux passes to a program (MAX_ARG_STRLEN, 131072 bytes with its terminating NUL): a
# field asking for more cannot run.
LONGEST_ARGUMENT = 131071
# How far apart two readings of one process's start (or the machine's boot) may be: Linux derives both from its
# boot time, which it reports to the second and which drifts with the clock.
SAME_TIME_S = 2.0


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
    """The template's words with {port} and every server setting filled in; ConfigError naming the word when one
    cannot be filled (an unknown conversion such as {port!x}, a format the value does not take, a width no command
    line holds)."""
    values = {name: format_value(value) for name, value in settings.items()}
    words = []
    for word in shlex.split(template):
        try:
            filled = _CommandFormatter().vformat(word, (), {**values, PORT: port})
        except KeyError as exc:  # a field nested in another's format: no setting names it
            raise ConfigError(
                f"The server command's word {word!r} cannot be filled: {{{exc.args[0]}}} has no value."
            ) from None
        except Exception as exc:  # formatting raises many kinds: ValueError, IndexError, MemoryError...
            raise ConfigError(
                f"The server command's word {word!r} cannot be filled: {str(exc) or type(exc).__name__}."
            ) from None
        if len(filled) > LONGEST_ARGUMENT:
            raise ConfigError(
                f"The server command's word {word!r} is {len(filled)} characters long once filled; a program takes "
                f"at most {LONGEST_ARGUMENT}."
            )
        words.append(filled)
    return words


class _CommandFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        # A width or precision is allocated before anything could judge the result: {port:>99999999999} asks for
        # 100 GB. No field of a command line may ask for more than an argument holds.
        asked = max((int(digits) for digits in re.findall(r"\d+", format_spec)), default=0)
        if asked > LONGEST_ARGUMENT:
            raise ValueError(f"the format {format_spec!r} asks for {asked} characters")
        return super().format_field(value, format_spec)


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerFailed(Exception):
    """The server exited or never answered; the message ends with the last lines of its log."""


class ServerProcess:
    """One server, started by `start`, waited for by `wait_ready`, ended by `stop` (each safe to call again), at
    `port`; while it runs, a record of it in `records` (a folder) names it to a later sweep should it outlive us."""

    def __init__(self, command: list[str], log_path: Path, port: int, records: Path, sweep_id: str = ""):
        self.command, self.log_path, self.port = command, log_path, port
        self.records, self.sweep_id = records, sweep_id
        self.pid = 0  # the server's, which is also its process group's and session's id
        self._guard: subprocess.Popen | None = None
        self._exit_code: int | None = None

    @property
    def record_path(self) -> Path:
        return self.records / f"{self.pid}.json"

    def start(self) -> None:
        """Launch the command under its guard, in a new session, its output into the log; ServerFailed when it
        cannot be launched at all (no such program)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            try:
                # The guard's stderr is the log: the server writes there, and so would the guard if it failed.
                self._guard = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(GUARD), f"{STOP_GRACE_S:g}", *self.command],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerFailed(f"The server's guard could not be started ({exc.strerror or exc}).") from None
        said = cast(IO[bytes], self._guard.stdout).readline().decode(errors="replace").split(maxsplit=1)
        if said[:1] != ["pid"]:
            why = said[1].strip() if said[:1] == ["error"] else f"its guard ended{self.log_tail()}"
            self._guard.wait()
            self._guard = None
            raise ServerFailed(f"The server command could not be started ({why}).")
        self.pid = int(said[1])
        self._record()

    def _record(self) -> None:
        try:
            record = {
                "pid": self.pid,
                "started": psutil.Process(self.pid).create_time(),
                "sweep_id": self.sweep_id,
                "sweep_pid": os.getpid(),
                "sweep_started": psutil.Process().create_time(),
                "host": socket.gethostname(),
                "boot": psutil.boot_time(),
                "command": redact_text(shlex.join(self.command)),
                "log": str(self.log_path.resolve()),
            }
        except psutil.Error:  # gone already: nothing that could outlive us
            return
        try:
            self.records.mkdir(parents=True, exist_ok=True)
            self.record_path.write_text(json.dumps(record), encoding="utf-8")
        except OSError:  # the guard still stops it; only a later sweep's word on a leftover is lost
            pass

    def exit_code(self, wait_s: float = 0.0) -> int | None:
        """None while the server runs (after waiting up to `wait_s` for it to end)."""
        guard = self._guard
        if self._exit_code is None and guard is not None and wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                guard.wait(timeout=wait_s)
        if self._exit_code is None and guard is not None and guard.poll() is not None:
            said = cast(IO[bytes], guard.stdout).read().decode(errors="replace").split()
            # No word from a guard that was killed: its server may run on, unguarded, so it is ended here.
            self._exit_code = int(said[-1]) if said[-2:-1] == ["exit"] else _kill_group(self.pid, guard.returncode)
        return self._exit_code

    def wait_ready(
        self, base_url: str, api_key: str | None, timeout_s: float, cancel: threading.Event, model: str = ""
    ) -> bool:
        """Wait until GET {base_url}/v1/models answers 200 from this server (asked with the run's API key, as a
        server started with one requires): True; False when `cancel` was set first. ServerFailed when the server
        exits first, another process answers at its port, or `timeout_s` passes. `model`, when the run names one,
        tells this server from another where the port's holder cannot be seen."""
        deadline = time.monotonic() + timeout_s
        while not cancel.is_set():
            code = self.exit_code()
            if code is not None:
                raise ServerFailed(f"The server exited with code {code} before it answered.{self.log_tail()}")
            served = _served_models(base_url + "/v1/models", api_key)
            if served is not None:
                self._check_identity(served, model)
                if self.exit_code() is None:
                    return True
                continue
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"The server did not answer GET /v1/models within {timeout_s:g} s "
                    f"(--server-start-timeout).{self.log_tail()}"
                )
            cancel.wait(POLL_S)
        return False

    def _check_identity(self, served: list[str], model: str) -> None:
        """ServerFailed unless what answered at the port is this server: every process listening there that this
        user can see is of its session (or forked by it); where none can be seen (a container's proxy, another
        user's process), a server listing the model the run expects."""
        holders = _port_holders(self.port)
        foreign = [pid for pid in holders if pid is not None and not self._owns(pid)]
        if foreign:
            raise ServerFailed(
                f"Another process answers at port {self.port}: pid {foreign[0]} ({_command_of(foreign[0])}), not the "
                f"server this sweep started (pid {self.pid}), which cannot listen there; two sweeps or servers on "
                f"one machine took the same free port.{self.log_tail()}"
            )
        if not any(pid is not None for pid in holders) and model and served and model not in served:
            raise ServerFailed(
                f"The server at port {self.port} lists {', '.join(served[:3])}, not the model {model} the run "
                f"expects, and which process holds the port cannot be seen: it may be another server.{self.log_tail()}"
            )

    def _owns(self, pid: int) -> bool:
        """Whether `pid` is the server, of its session or forked by it."""
        try:
            return os.getsid(pid) == self.pid or self.pid in (parent.pid for parent in psutil.Process(pid).parents())
        except (OSError, psutil.Error):
            return False

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after STOP_GRACE_S (the guard does it once its pipe is
        closed); the group's leader reaped."""
        guard = self._guard
        if guard is None:
            return
        cast(IO[bytes], guard.stdin).close()
        guard.wait()
        self.exit_code()
        self._guard = None
        self.record_path.unlink(missing_ok=True)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """ " Its log ends: ..." with its last lines (credentials masked), or "" for an empty log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        last = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
        return f" Its log ({self.log_path}) ends: {' | '.join(redact_text(line) for line in last)}." if last else ""


def _served_models(url: str, api_key: str | None) -> list[str] | None:
    """The models GET `url` lists (none when its answer is no listing); None while it answers no 200."""
    from ..engines.openai_client import ServerError, http_get, listed_models  # imported only once a server starts

    try:
        body = http_get(url, api_key, timeout_s=2)
    except ServerError:
        return None
    try:
        return listed_models(body)
    except (ValueError, RecursionError):
        return []


def _port_holders(port: int) -> list[int | None]:
    """The pids of the processes listening on `port` of this machine (None: one this user may not see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # where only root may list them: nobody can be seen
        return [None]
    return [c.pid for c in connections if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]


def _command_of(pid: int) -> str:
    try:
        return redact_text(shlex.join(psutil.Process(pid).cmdline()))[:200]
    except psutil.Error:
        return "gone since"


def _kill_group(pid: int, code: int) -> int:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return code


def leftover_servers(records: Path) -> list[str]:
    """A sentence for each server an earlier sweep with its history here started on this machine and that still
    runs although that sweep has ended: its guard was killed with it (`kill -9` of every process of the sweep).
    Records of servers that are gone are removed."""
    found = []
    for path in sorted(records.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if record["host"] != socket.gethostname():
                continue  # a history shared between machines: another machine's pids
            same_boot = abs(record["boot"] - psutil.boot_time()) < SAME_TIME_S
            server = _process(record["pid"], record["started"]) if same_boot else None
            if server is None:
                path.unlink(missing_ok=True)
            elif _process(record["sweep_pid"], record["sweep_started"]) is None:
                found.append(
                    f"A server that sweep {record['sweep_id']} started still runs after that sweep ended: pid "
                    f"{record['pid']} ({record['command'][:200]}), its log in {record['log']}. Stop it with: "
                    f"kill -TERM -- -{record['pid']}"
                )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def _process(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is the one that started at `started` (a pid is reused once its process is gone) and
    has not exited (a zombie whose parent never reaps it has)."""
    try:
        process = psutil.Process(pid)
        same = abs(process.create_time() - started) < SAME_TIME_S
        return process if same and process.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None
