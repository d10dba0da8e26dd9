"""The user install, walked as a new user walks it: the environment `./scripts/app.sh` builds
(requirements.txt and requirements-nodeps.txt, no test tools) in .venv-user, an empty home with no model
cache, the default model converted there, a benchmark through the CLI, and Start pressed in chromium on
the app that `./scripts/app.sh` serves, with only the prompt count and the output length lowered.

The dev venv holds more packages than the user's; these tests are what catches a package that only the
dev requirements bring. Building .venv-user takes a few minutes the first time; scripts/setup.sh's
stamp makes later runs instant.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from dashboard_server import ROOT, VIEWPORT, AppServer, free_port, serve
from playwright.sync_api import Browser, expect
from scripted_server import restful_argv, scripted_server  # noqa: F401 (fixture)
from test_browser import FIRST_CHART_TIMEOUT_MS, fill_number, open_run_page, sidebar

from bench_core.store.history import History

pytestmark = [pytest.mark.e2e, pytest.mark.user_install]

USER_VENV = ".venv-user"
SETUP_TIMEOUT_S = 1200  # a first install downloads about 2 GB
MODEL = "builtin:smollm2-135m"
CONVERTED = Path(".cache", "llm-bench-studio", "smollm2-135m-instruct-bf16-v2", "model.safetensors")
PROMPTS, OUTPUT_LEN = 4, 16
# The line that says how a run ended, whichever way it did.
RUN_ENDED = re.compile(r"^(finished|partial|failed|cancelled): ")
RUN_TIMEOUT_S = 300  # the conversion and the run on a busy 2-core machine, with a wide margin
# Our settings that a new user does not have; HF_HUB_OFFLINE included, so a hub access would show.
DEVELOPER_ONLY = (
    "BENCH_STUDIO_CACHE",
    "BENCH_STUDIO_RESULTS",
    "BENCH_STUDIO_TORCH_THREADS",
    "HF_HUB_OFFLINE",
    "VIRTUAL_ENV",
    "PYTHONPATH",
)


@pytest.fixture(scope="module")
def user_python() -> Path:
    """.venv-user set up by scripts/setup.sh as ./scripts/app.sh runs it; it has none of the test tools."""
    subprocess.run(
        [ROOT / "scripts" / "setup.sh"],
        cwd=ROOT,
        env={**os.environ, "BENCH_STUDIO_VENV": USER_VENV},
        check=True,
        timeout=SETUP_TIMEOUT_S,
    )
    python = ROOT / USER_VENV / "bin" / "python"
    # The test tools, and aiohttp: only the test servers use it, not the app's OpenAI client.
    probe = "import importlib.util as u; print([u.find_spec(name) for name in ('pytest', 'playwright', 'aiohttp')])"
    assert subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout == "[None, None, None]\n"
    # torch's CPU build: PyPI's is a CUDA one that adds 3.4 GB of CUDA libraries (scripts/setup.sh asks PyTorch's
    # CPU index first). On a machine whose pip config lists a local CPU wheel, that wheel gives it either way.
    cuda = subprocess.run([python, "-c", "import torch; print(torch.version.cuda)"], capture_output=True, text=True)
    assert cuda.stdout == "None\n", cuda.stdout + cuda.stderr[-2000:]
    return python


def new_user(home: Path, **settings: str) -> dict[str, str]:
    """The environment of a user with an empty home (so no model cache) who runs the user install."""
    home.mkdir()
    env = {name: value for name, value in os.environ.items() if name not in DEVELOPER_ONLY}
    return {
        **env,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "BENCH_STUDIO_VENV": USER_VENV,
        **settings,
    }


@pytest.mark.timeout(SETUP_TIMEOUT_S + RUN_TIMEOUT_S)
def test_the_cli_converts_the_default_model_and_benchmarks_it(user_python, tmp_path):
    home, results = tmp_path / "home", tmp_path / "results"
    command = [
        user_python,
        "-m",
        "bench_core",
        "pipeline",
        "builtin:sharegpt",
        MODEL,
        "--backend",
        "transformers",
        "-n",
        str(PROMPTS),
        "--sharegpt-output-len",
        str(OUTPUT_LEN),
        "-c",
        str(PROMPTS),
        "--stream-output",
        "--csv",
        "",
        "--results",
        str(results),
    ]
    cli = subprocess.run(command, cwd=ROOT, env=new_user(home), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert (home / CONVERTED).is_file()
    (row,) = History(results).load().to_dict("records")
    assert (row["status"], row["model"]) == ("finished", MODEL)
    assert row["completed"] == PROMPTS
    assert row["total_output_tokens"] == PROMPTS * OUTPUT_LEN


def test_the_cli_benchmarks_a_server_with_the_user_install(user_python, scripted_server, tmp_path):
    command = [user_python, "-m", "bench_core", *restful_argv(scripted_server, tmp_path, 4)]
    cli = subprocess.run(
        command, cwd=ROOT, env=new_user(tmp_path / "home"), capture_output=True, text=True, timeout=120
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    (row,) = History(tmp_path / "results").load().to_dict("records")
    assert (row["status"], row["backend"], row["completed"]) == ("finished", "openai", 4)


@pytest.fixture
def user_app(user_python, chromium, tmp_path) -> AppServer:
    """`./scripts/app.sh` on a free port, for a new user with an empty home."""
    port = free_port()
    env = new_user(tmp_path / "home", BENCH_STUDIO_RESULTS=str(tmp_path / "results"), PYTHONUNBUFFERED="1")
    with serve([ROOT / "scripts" / "app.sh", f"--server.port={port}"], env, port, tmp_path) as server:
        yield server


def start_with_the_defaults(browser: Browser, url: str, screenshot: Path) -> None:
    """On the dashboard at `url`: the default model chosen, only the prompt count and the output length lowered,
    Start pressed; the run must finish with every request, as the page tells (screenshot of its end kept)."""
    context = browser.new_context(base_url=url, viewport=VIEWPORT)
    try:
        page = context.new_page()
        open_run_page(page)
        # A fresh server's first view waits on the backend checks' child process: on a loaded machine, seconds.
        expect(sidebar(page).get_by_role("combobox", name="Model")).to_have_value(MODEL, timeout=FIRST_CHART_TIMEOUT_MS)
        fill_number(page, "Number of prompts", PROMPTS)
        fill_number(page, "Fixed output length (tokens)", OUTPUT_LEN)
        sidebar(page).get_by_role("button", name="Start").click()
        ended = page.locator("p", has_text=RUN_ENDED)  # the status line: the request timeline's legend says "failed: "
        expect(ended).to_be_visible(timeout=RUN_TIMEOUT_S * 1000)
        page.screenshot(path=screenshot)
        expect(ended).to_have_text(re.compile(rf"^finished: {PROMPTS}/{PROMPTS} requests succeeded"))
    finally:
        context.close()


@pytest.mark.timeout(SETUP_TIMEOUT_S + RUN_TIMEOUT_S)
def test_start_with_the_defaults_on_the_app_that_scripts_app_sh_serves(user_app, browser: Browser, artifacts, tmp_path):
    start_with_the_defaults(browser, user_app.url, artifacts / "user-install-run.png")
    assert (tmp_path / "home" / CONVERTED).is_file()
