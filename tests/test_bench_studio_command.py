"""The installed `bench-studio` command from the checkout (bench_studio/command.py), in a child process as a user
runs it: its `app` subcommand, run before any parsing, is still one of the choices a mistyped subcommand is told
and a line of --help."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench_studio(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from bench_studio.command import main; main()", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_unknown_subcommand_is_one_line_whose_choices_include_app():
    answer = bench_studio("bogus")
    assert answer.returncode == 2 and answer.stdout == ""
    (line,) = answer.stderr.splitlines()
    assert line.startswith("bench-studio: error: argument command: invalid choice: 'bogus' (choose from 'app', ")
    assert "'restful'" in line and line.endswith("(see --help)")


def test_help_lists_app_with_what_it_does():
    answer = bench_studio("--help")
    assert answer.returncode == 0
    assert any(line.split()[:1] == ["app"] and "serve the dashboard" in line for line in answer.stdout.splitlines())
