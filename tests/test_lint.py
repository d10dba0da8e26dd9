"""The lint gate is real: scripts/test.sh (what CI runs) lints before pytest and stops when lint fails, and
scripts/lint.sh fails on a tree with a lint finding or a type error, naming where."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {
    ".git",
    ".venv",
    ".venv-user",
    "results",
    "artifacts",
    ".cache",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "__pycache__",
    "build",
}


def _commands(script: str) -> list[str]:
    lines = (ROOT / "scripts" / script).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_test_script_lints_before_pytest_and_stops_on_a_failure():
    commands = _commands("test.sh")
    (lint,) = [index for index, line in enumerate(commands) if line.startswith("scripts/lint.sh")]
    (pytest,) = [index for index, line in enumerate(commands) if "-m pytest" in line]
    (setup,) = [index for index, line in enumerate(commands) if line.startswith("scripts/setup.sh")]
    assert setup < lint < pytest  # the lint tools come with setup.sh --dev
    assert "exit 1" in commands[lint].split("||", 1)[1]
    assert "./scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")  # and CI runs that script


def _tree_copy(target: Path) -> Path:
    """What the lint tools read: the Python files, pyproject.toml and scripts/, and mypy's cache of this tree where
    scripts/lint.sh has left one (as .ci/run does before pytest): mypy then checks only what changed, not every
    library bench_core imports from cold."""

    def ignored(folder, names):
        return [
            name
            for name in names
            if name in SKIPPED_DIRS or ((Path(folder) / name).is_file() and not name.endswith((".py", ".toml", ".sh")))
        ]

    tree = Path(shutil.copytree(ROOT, target / "tree", ignore=ignored, symlinks=True))
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", tree / ".mypy_cache")
    return tree


# A module of its own, which nothing imports: with mypy's cache, only it is checked again. Its import is unused,
# out of the import block's order and its string quotes are not the formatter's, and it returns a str as an int.
BROKEN_MODULE = """from __future__ import annotations
import os


def _broken() -> int:
    return 'not an int'
"""


@pytest.mark.slow  # ruff and mypy as CI runs them, on a copy of the tree
def test_lint_fails_on_an_unused_import_and_a_type_error_and_says_where(tmp_path):
    tree = _tree_copy(tmp_path)
    (tree / "bench_core" / "lint_probe.py").write_text(BROKEN_MODULE, encoding="utf-8")

    env = {**os.environ, "BENCH_STUDIO_VENV": sys.prefix}
    done = subprocess.run(
        ["bash", str(tree / "scripts" / "lint.sh")], cwd=tree, env=env, capture_output=True, text=True, timeout=900
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "F401" in output and "--> bench_core/lint_probe.py:2:8" in output
    assert "bench_core/lint_probe.py:6: error: Incompatible return value type" in output
    # The import also breaks the layout (its block is no longer the formatter's), so all three say so.
    assert "lint failed: ruff check, ruff format --check, mypy" in output
