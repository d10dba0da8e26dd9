"""Faults of sweeps that start a server per run and of the search for the highest load (reliability round 4: n05, n06,
n07, n14 b, n16). A sweep killed by SIGKILL or a hang-up leaves no server behind, and the next sweep names a server
that outlived its sweep anyway; a search ends on its budget of probes and of time, and at once, with the server's
words and exit 1, when its requests fail for the server's reasons; a sweep never measures another process that took
its server's port; a server command whose fields cannot be filled is one line and exit 2 before anything starts.
Real sweep processes, real servers (tests/load_server.py, the OpenAI-compatible test server) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from openai_server import answering_in_turn, misbehaving_server, serving  # noqa: F401 (fixture)
from sweep_cli import (
    ROOT,
    SERVER,
    SMALL_RUN,
    alive,
    bench,
    cli_env,
    group_members,
    rows_of,
    server_pid_once_measuring,
)

from bench_core.cli.common import EXIT_BAD_INPUT, EXIT_FAILED
from bench_core.store.history import History
from bench_core.sweep.server import leftover_servers
from bench_core.sweep.store import probes_of

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

HANG_S = 60  # what should happen in seconds and has not by then never will
LOAD_SERVER = ROOT / "tests" / "load_server.py"
# Each request's 64 tokens at 200 ms a token: the run is still measuring when the sweep is killed.
SLOW_SWEEP = (*SMALL_RUN, "--server-cmd", f"{SERVER} --token-delay-ms 200", "--sweep", "random_output_len=64")
# A search against a server given with --base-url: 2 requests of 4 tokens per probe.
SEARCH = (
    "sweep",
    "restful",
    "--backend",
    "vllm",
    "--model",
    "m",
    "--tokenizer",
    "builtin:tiny-llama",
    "--dataset-path",
    "builtin:sample",
    "--num-prompts",
    "2",
    "--sharegpt-output-len",
    "4",
    "--disable-warmup",
    "--output-file",
    "",
    "--results",
    "results",
    "--no-server-metrics",
    "--find-max",
    "request_rate",
)


def start_sweep(work: Path, *args: str) -> subprocess.Popen:
    """The sweep as a process of its own, in a session of its own (as `setsid` or a batch scheduler starts it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench_core", *args],
        cwd=work,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def gone_in_time(pid: int) -> bool:
    """Whether process `pid` has ended, waiting at most HANG_S for it."""
    deadline = time.monotonic() + HANG_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# ---- class 1: no server outlives its sweep ----------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=["sigkill", "sighup"])
def test_a_sweep_killed_outright_or_hung_up_on_leaves_no_server_behind(signum, tmp_path, tiny_model_path):
    sweep = start_sweep(tmp_path, *SLOW_SWEEP)
    server = 0
    try:
        server = server_pid_once_measuring(tmp_path)
        # Neither signal runs any handler of the sweep's: only the kernel, closing what the dead process held, is left.
        sweep.send_signal(signum)
        sweep.wait(timeout=HANG_S)
        assert gone_in_time(server), f"the server (pid {server}) outlived its sweep, killed by {signum!r}"
        deadline = time.monotonic() + HANG_S
        while group_members(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_members(server), "a process of the server's group outlived the sweep"
    finally:
        sweep.kill()
        sweep.wait()
        kill_group(server)


def test_the_next_sweep_names_a_server_that_outlived_its_sweep(tmp_path, tiny_model_path):
    sweep = start_sweep(tmp_path, *SLOW_SWEEP)
    server = 0
    try:
        server = server_pid_once_measuring(tmp_path)
        # `kill -9` of every process of the sweep, its server's guard too: the server itself is all that is left.
        guard = psutil.Process(server).ppid()
        os.kill(guard, signal.SIGKILL)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(timeout=HANG_S)
        assert alive(server)
        (plan,) = (tmp_path / "results" / "sweeps").glob("*.json")

        # The next sweep in this history (its own server exits at once: only its first lines matter here).
        after = bench(tmp_path, *SMALL_RUN, "--server-cmd", f"{SERVER} --mode exit", "--sweep", "num_prompts=2")
        named = [line for line in after.stderr.splitlines() if line.startswith("warning:") and "still runs" in line]
        assert len(named) == 1, after.stderr
        assert f"sweep {plan.stem} started" in named[0] and f"pid {server} " in named[0]
        assert named[0].endswith(f"kill -TERM -- -{server}")
    finally:
        sweep.kill()
        sweep.wait()
        kill_group(server)
    assert gone_in_time(server)
    records = tmp_path / "results" / "sweeps" / "servers"
    assert leftover_servers(records) == [] and list(records.iterdir()) == []  # a server gone is forgotten


# ---- class 2: a search ends, on its budget or on the server's failure --------------------------------------------


def test_a_search_whose_requests_fail_for_the_servers_reasons_ends_with_them_and_exit_1(tmp_path, tiny_model_path):
    with serving(answering_in_turn(["status500"] * 100)) as url:
        proc = bench(tmp_path, *SEARCH, "--base-url", url, "--slo-ttft-ms", "500")
    assert proc.returncode == EXIT_FAILED, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "for the server's reasons rather than the SLO's" in errors[0]
    assert "HTTP 500" in errors[0] and "the engine crashed" in errors[0]  # the server's own words
    assert "Traceback" not in proc.stderr
    # Nothing is known of the load the server bears: no probe is noted, and a resume tries it again.
    sweep_id = rows_of(tmp_path)["sweep_id"].iloc[0]
    assert probes_of(History(tmp_path / "results"), sweep_id).empty
    assert f"resume with: python -m bench_core sweep --resume {sweep_id}" in proc.stderr


def test_a_search_stops_on_its_budget_of_probes_and_a_resume_goes_on_with_as_many(
    tmp_path, misbehaving_server, tiny_model_path
):
    # Every load meets the SLO: the search alone would double up to 1,024 req/s.
    proc = bench(tmp_path, *SEARCH, "--base-url", misbehaving_server, "--slo-e2e-ms", "60000", "--find-max-probes", "3")
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert "spent its budget of 3 probes (--find-max-probes)" in proc.stderr
    sweep_id = rows_of(tmp_path)["sweep_id"].iloc[0]
    history = History(tmp_path / "results")
    assert probes_of(history, sweep_id)["load"].tolist() == [1, 2, 4]
    assert "Highest request_rate meeting 90% of requests within the SLO: 4 (so far" in proc.stdout

    again = bench(tmp_path, "sweep", "--resume", sweep_id, "--results", "results")
    assert again.returncode == EXIT_FAILED, again.stderr
    assert probes_of(history, sweep_id)["load"].tolist() == [1, 2, 4, 8, 16, 32]


def test_a_search_stops_on_its_time_budget_and_stops_the_probe_under_way(tmp_path, tiny_model_path):
    # Each request is answered after 30 s: the first probe would outlast the budget many times.
    with serving(answering_in_turn(["slow"] * 100)) as url:
        proc = bench(tmp_path, *SEARCH, "--base-url", url, "--slo-e2e-ms", "600000", "--find-max-time", "2")
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert "spent its budget of 2 s (--find-max-time)" in proc.stderr, proc.stderr
    # The probe under way was stopped, loading or measuring (as this machine's speed has it), and noted as no probe.
    (plan,) = (tmp_path / "results" / "sweeps").glob("*.json")
    assert probes_of(History(tmp_path / "results"), plan.stem).empty
    assert set(rows_of(tmp_path)["status"]) <= {"cancelled"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--find-max-probes", "0"], "--find-max-probes must be a whole number from 1 to 1,000; got 0."),
        (["--find-max-time", "nan"], "--find-max-time must be a number above 0 and at most 604,800; got nan."),
        (["--find-max-time", "inf"], "--find-max-time must be a number above 0 and at most 604,800; got inf."),
    ],
)
def test_a_search_budget_out_of_its_range_is_one_line_and_exit_2(flags, message, tmp_path, misbehaving_server):
    proc = bench(tmp_path, *SEARCH, "--base-url", misbehaving_server, "--slo-e2e-ms", "100", *flags)
    assert proc.returncode == EXIT_BAD_INPUT and proc.stderr == f"error: {message}\n"
    assert list(tmp_path.iterdir()) == []


# ---- class 6: a sweep measures its own server only -------------------------------------------------------------


def test_a_sweep_whose_port_another_server_took_fails_that_point_instead_of_measuring_it(tmp_path, tiny_model_path):
    # The sweep's server loads "for ever" and never listens; another server, serving the very model the run names,
    # takes its port meanwhile (two sweeps on one machine, each given a port that was free when it asked).
    marker = f"loading-{os.getpid()}"
    template = f"sh -c 'sleep {HANG_S}; : {marker}' {{port}}"
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench_core",
            *SMALL_RUN,
            "--model",
            "load-test",
            "--server-cmd",
            template,
            "--sweep",
            "num_prompts=4",
        ],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    squatter = None
    try:
        port = _port_of_server_with(marker)
        squatter = subprocess.Popen(
            [sys.executable, str(LOAD_SERVER), "--port", port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _, err = sweep.communicate(timeout=HANG_S)
    finally:
        sweep.kill()
        if squatter is not None:
            squatter.kill()
            squatter.wait()
    assert sweep.returncode == EXIT_FAILED, err
    (row,) = rows_of(tmp_path).to_dict("records")
    assert row["status"] == "failed"
    assert f"Another process answers at port {port}: pid {squatter.pid}" in row["error"]
    assert "took the same free port" in err and "Traceback" not in err


def _port_of_server_with(marker: str) -> str:
    """The port of the sweep's server whose command holds `marker` (its last word), once it runs."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            words = process.info["cmdline"] or []
            if any(marker in word for word in words) and words[-1].isdigit():
                return words[-1]
        time.sleep(0.1)
    pytest.fail("the sweep's server never started")


# ---- class 10 b: a server command whose fields cannot be filled -------------------------------------------------


@pytest.mark.parametrize(
    ("template", "settings", "why"),
    [
        ("--port {port!x}", [], "Unknown conversion specifier x"),
        ("--port {port:>99999999999}", [], "the format '>99999999999' asks for 99999999999 characters"),
        ("--port {port:s}", [], "Unknown format code 's'"),
        ("--port {port} --tp {tp:=5}", ["tp=2"], "'=' alignment not allowed in string format specifier"),
        ("--port {port:{width}}", [], "{width} has no value"),
    ],
)
def test_a_server_command_whose_fields_cannot_be_filled_is_one_line_and_exit_2(template, settings, why, tmp_path):
    given = [flag for setting in settings for flag in ("--server-setting", setting)]
    command = f"{sys.executable} {LOAD_SERVER} {template}"
    proc = bench(tmp_path, *SMALL_RUN, "--server-cmd", command, *given, "--sweep", "num_prompts=2")
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: The server command's word"), proc.stderr
    assert why in proc.stderr and "cannot be filled" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
