"""`bench-studio`: `bench-studio app [streamlit flags]` serves the dashboard; any other subcommand is the headless
CLI, `python -m bench_core` under another name (bench_core.cli.main_and_exit: same exit codes, SIGTERM as Ctrl-C).

The dashboard runs from where its files are, in the installed package or in a checkout, with the user's working
directory kept: the history goes to ./results as it does for `streamlit run app.py`. Streamlit reads
.streamlit/config.toml from the working directory (and ~/.streamlit), never beside the script, so the project's
config travels as flags; the user's own flags come after them and win.
"""

from __future__ import annotations

import os
import sys
import tomllib
import typing
from pathlib import Path

from bench_core.cli import main_and_exit

PROG = "bench-studio"
APP_HELP = "serve the dashboard (streamlit flags after it)"
USAGE = f"{PROG} app [streamlit flags]: serve the dashboard on http://127.0.0.1:8501 (--server.port=N for another port)"
HERE = Path(__file__).resolve().parent
# Installed: the root files pyproject.toml copies into the package. In a checkout: the repository root.
APP_DIR = HERE / "root" if (HERE / "root" / "app.py").is_file() else HERE.parent


def config_flags(config: Path, overridden: set[str]) -> list[str]:
    """The options of the Streamlit config file `config` as `streamlit run` flags, leaving out those in
    `overridden` (`section.option` names). A list option is one flag per item, as Streamlit's CLI takes it."""
    flags = []
    for section, options in tomllib.loads(config.read_text(encoding="utf-8")).items():
        for option, value in options.items():
            if f"{section}.{option}" in overridden:
                continue
            for item in value if isinstance(value, list) else [value]:
                text = str(item).lower() if isinstance(item, bool) else str(item)
                flags.append(f"--{section}.{option}={text}")
    return flags


def option_names(args: list[str]) -> set[str]:
    """The `section.option` names that the flags `args` set (`--server.port=8502` or `--server.port 8502`)."""
    return {arg[2:].partition("=")[0] for arg in args if arg.startswith("--") and "." in arg.partition("=")[0]}


def app_command(args: list[str]) -> list[str]:
    """The `streamlit run` command line that serves the dashboard with the project's config and then `args`."""
    flags = config_flags(APP_DIR / ".streamlit" / "config.toml", option_names(args))
    return [sys.executable, "-m", "streamlit", "run", str(APP_DIR / "app.py"), *flags, *args]


def main() -> typing.NoReturn:
    args = sys.argv[1:]
    if args[:1] == ["app"]:
        command = app_command(args[1:])
        # Streamlit in this process's place: Ctrl-C and SIGTERM reach it as they would `streamlit run`.
        os.execv(command[0], command)
    main_and_exit(args, PROG, USAGE, run_before={"app": APP_HELP})
