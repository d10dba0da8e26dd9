"""The guard of one server a sweep starts: run as `python -I -S server_guard.py GRACE_S COMMAND...`, its stdin a pipe
from the sweep, its stderr the server's log.

It starts COMMAND in a session of its own (its output into the log) and says `pid N` on stdout, or `error WHY` when
it cannot start it. It then stops the server's whole process group (SIGTERM, SIGKILL after GRACE_S) as soon as either:

- its stdin ends: the sweep closed it to stop the server, or the sweep died. The kernel closes a dead process's
  pipes whatever killed it (SIGKILL, the OOM killer, a hang-up), which no handler or atexit hook of the sweep's own
  can promise;
- a signal asks the guard itself to stop (SIGTERM, SIGINT, SIGHUP);
- the server exits on its own: what it forked is stopped too.

Its last line is `exit CODE`, the server's exit code (negative: the signal that ended it), unless the sweep is gone.
The group's leader is reaped only once the group has been stopped, so its id cannot name another group meanwhile.

It runs in a session of its own too, so a terminal's Ctrl-C or hang-up reaches the sweep and not the guard, and
imports nothing but the standard library, so it starts in tens of milliseconds whatever the sweep has imported.
"""

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
stop_asked = False


def _stop_asked(signum, frame):
    # A flag, not an exception: one raised inside Popen could leave a server started whose pid nobody knows.
    global stop_asked
    stop_asked = True


def say(line: str) -> None:
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except OSError:  # the sweep is gone: nobody to tell
        pass


def exit_code(pid: int) -> int | None:
    """The leader's exit code once it has exited (left unreaped), else None."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def watch(pid: int) -> None:
    """Until the sweep closes the pipe or dies, a stop signal comes, or the server exits."""
    while not stop_asked and exit_code(pid) is None:
        readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            return


def stop_group(pid: int, grace_s: float) -> None:
    """SIGTERM to the group, SIGKILL once the leader has exited or `grace_s` has passed (what it forked, too)."""
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while exit_code(pid) is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # the group's id is the leader's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def main() -> int:
    grace_s, command = float(sys.argv[1]), sys.argv[2:]
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop_asked)
    try:
        server = subprocess.Popen(
            command, stdout=sys.stderr, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except (OSError, ValueError) as exc:
        say(f"error {getattr(exc, 'strerror', None) or exc}")
        return 1
    say(f"pid {server.pid}")
    watch(server.pid)
    stop_group(server.pid, grace_s)
    say(f"exit {server.wait()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
