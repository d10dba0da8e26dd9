"""`python -m bench_core ARGS` many times over for the price of one start: a fork server for CLI tests.

Each command in a test of the CLI used to be a fresh interpreter that imported pandas, torch and transformers
(1-3 s of CPU each, several times that on a busy machine) before saying one line. The server imports them once;
each command is then a fork of it: a process of its own, with its own working folder, its stdout and stderr
written to files (file descriptors 1 and 2, as a pipe would take them), stdin at /dev/null, and
`bench_core.cli.main_and_exit` ending it with the exit code `python -m bench_core` gives. Python's own handling of
an uncaught SystemExit or exception is mimicked (argparse's --help and usage errors leave through SystemExit).

What it is not: the interpreter's start. A test about what happens before the imports, about signals sent to the
CLI, or about an environment variable read at import time starts a real `python -m bench_core` instead; this
server's environment is the one it was started with, for every command. Among those variables are the ones
`bench_core.cli.main` sets to quiet the libraries, which read them when imported: here they were imported before,
so a fork that loads a model prints the weight-loading bars that a real start keeps off the terminal (fine for a
test of what a run records; tests/test_cli_transcripts.py starts real runs as a user would).

    with CliForks(env) as cli:
        proc = cli.run(["pipeline", "--help"], cwd=folder)  # a subprocess.CompletedProcess
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class CliForks:
    """The test side: starts the server (`python tests/cli_forks.py`) and runs commands in it, one at a time."""

    def __init__(self, env: dict[str, str]):
        self._env = env
        self._server: subprocess.Popen | None = None
        self._captures = tempfile.TemporaryDirectory(prefix="cli-forks-")  # not in the working folder: tests list it

    def __enter__(self) -> CliForks:
        self._server = subprocess.Popen(
            [sys.executable, __file__],
            env=self._env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        assert json.loads(self._server.stdout.readline() or "{}").get("ready"), "the fork server did not start"
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._server is not None
        self._server.stdin.close()
        try:
            self._server.wait(60)
        finally:
            self._server.kill()
            self._captures.cleanup()

    def run(self, argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        """`python -m bench_core *argv` in `cwd`, as subprocess.run(..., capture_output=True, text=True,
        timeout=timeout) returns it (TimeoutExpired past `timeout`, an outer limit for a hung command)."""
        assert self._server is not None and self._server.poll() is None, "the fork server is not running"
        out, err = Path(self._captures.name, "stdout"), Path(self._captures.name, "stderr")
        request = {"argv": list(argv), "cwd": str(cwd), "stdout": str(out), "stderr": str(err), "timeout": timeout}
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        answer = self._server.stdout.readline()
        assert answer, "the fork server ended"
        ended = json.loads(answer)
        command = ["python", "-m", "bench_core", *argv]
        try:  # as text=True reads a pipe: the locale's encoding, universal newlines
            stdout, stderr = out.read_text(), err.read_text()
        finally:
            out.unlink()
            err.unlink()
        if ended["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        return subprocess.CompletedProcess(command, ended["exit_code"], stdout, stderr)


def _prewarm() -> None:
    """What the commands import, imported once here, before any fork; no thread is started by it."""
    from bench_core.cli import commands

    commands()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import bench_core.engines.openai_engine
    import bench_core.engines.transformers_engine
    import bench_core.run.runner  # noqa: F401


def _child(request: dict) -> typing.NoReturn:
    """In the fork: become `python -m bench_core ARGV` run in CWD with stdout and stderr to the files named."""
    import traceback

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    code = 1
    try:
        os.chdir(request["cwd"])
        from bench_core.cli import main_and_exit

        sys.argv = [str(ROOT / "bench_core" / "__main__.py"), *request["argv"]]
        sys.path.insert(0, request["cwd"])  # as `python -m` puts the working folder first
        main_and_exit(request["argv"])  # leaves through os._exit
    except SystemExit as exc:  # as the interpreter treats an uncaught one
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The server: once imported, a line saying so on stdout; then a JSON request a line on stdin, answered with the
    exit code of the fork that ran it, a line on stdout."""
    _prewarm()
    print(json.dumps({"ready": True}), flush=True)  # imported: the test's clock and CPU hogs may start
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()  # nothing buffered for the fork to write again
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        ended = os.pidfd_open(pid)
        timed_out = not select.select([ended], [], [], request["timeout"])[0]
        if timed_out:  # as subprocess.run(timeout=...) does: killed, and the test told
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(ended)
        print(json.dumps({"exit_code": os.waitstatus_to_exitcode(status), "timed_out": timed_out}), flush=True)


if __name__ == "__main__":
    sys.path.pop(0)  # this folder: the commands see the paths `python -m bench_core` would
    serve()
