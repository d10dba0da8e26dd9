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


def test_the_app_is_served_with_the_projects_config_as_flags_and_the_users_own_flags_win():
    from bench_studio.command import APP_DIR, app_command

    command = app_command(["--server.port=8502", "--theme.base", "dark"])
    assert command[:5] == [sys.executable, "-m", "streamlit", "run", str(APP_DIR / "app.py")]
    assert "--server.address=127.0.0.1" in command  # the project's config: served on this machine only
    assert "--theme.base=light" not in command  # the file's theme gives way to the user's
    assert command[-3:] == ["--server.port=8502", "--theme.base", "dark"]
