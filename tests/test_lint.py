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
    """What the lint tools read: the Python files, pyproject.toml and scripts/."""

    def ignored(folder, names):
        return [
            name
            for name in names
            if name in SKIPPED_DIRS or ((Path(folder) / name).is_file() and not name.endswith((".py", ".toml", ".sh")))
        ]

    return Path(shutil.copytree(ROOT, target / "tree", ignore=ignored, symlinks=True))


@pytest.mark.slow  # mypy from cold on a copy of the tree: a minute or more
def test_lint_fails_on_an_unused_import_and_a_type_error_and_says_where(tmp_path):
    tree = _tree_copy(tmp_path)
    module = tree / "bench_core" / "states.py"
    lines = module.read_text(encoding="utf-8").splitlines(keepends=True)
    unused_line = lines.index("from __future__ import annotations\n") + 2  # 1-based, just below it
    lines.insert(unused_line - 1, "import os\n")
    lines += ["\n", "\n", "def _broken() -> int:\n", "    return 'not an int'\n"]
    module.write_text("".join(lines), encoding="utf-8")
    broken_line = len(lines)

    env = {**os.environ, "BENCH_STUDIO_VENV": sys.prefix}
    done = subprocess.run(
        ["bash", str(tree / "scripts" / "lint.sh")], cwd=tree, env=env, capture_output=True, text=True, timeout=900
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "F401" in output and f"--> bench_core/states.py:{unused_line}:8" in output
    assert f"bench_core/states.py:{broken_line}: error: Incompatible return value type" in output
    # The import also breaks the layout (its block is no longer the formatter's), so all three say so.
    assert "lint failed: ruff check, ruff format --check, mypy" in output
