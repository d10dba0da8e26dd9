"""Which optional packages are installed right now, and the one command that installs missing ones.

Used where a package is needed only by one path (SmolLM2's GGUF conversion needs accelerate and gguf),
so that its absence is one message naming the package and the exact command, pinned as the
requirement files pin it, for the Python that is running.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The requirement files are at the root of a checkout; an installed package carries them in bench_studio/root
# (pyproject.toml), so that its messages name the same pins and the same --no-deps.
PINS_DIR = ROOT if (ROOT / "requirements.txt").is_file() else ROOT / "bench_studio" / "root"
REQUIREMENTS = PINS_DIR / "requirements.txt"
# Packages whose declared dependencies are not needed and not wanted: installed with --no-deps.
NO_DEPS_REQUIREMENTS = PINS_DIR / "requirements-nodeps.txt"
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s#;]+)")


def missing(import_names: Sequence[str]) -> list[str]:
    """The modules of `import_names` that cannot be imported now. Import caches are refreshed first, so a
    package installed since this process started counts as installed."""
    importlib.invalidate_caches()
    return [name for name in import_names if importlib.util.find_spec(name) is None]


def install_command(distributions: Sequence[str]) -> str:
    """The shell command that installs `distributions` into this Python's environment, each pinned as the
    requirement files pin it; those of requirements-nodeps.txt are installed without their dependencies."""
    plain, no_deps = _pins(REQUIREMENTS), _pins(NO_DEPS_REQUIREMENTS)
    pip = f"{sys.executable} -m pip install"
    commands = []
    for flag, pins, wanted in (
        ("", plain, [name for name in distributions if _normal(name) not in no_deps]),
        (" --no-deps", no_deps, [name for name in distributions if _normal(name) in no_deps]),
    ):
        if wanted:
            commands.append(f"{pip}{flag} " + " ".join(pins.get(_normal(name), name) for name in wanted))
    return " && ".join(commands)


def _pins(path: Path) -> dict[str, str]:
    """Normalised name -> `name==version` for every pinned line of a requirement file (none if it is absent)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    pins = {}
    for line in lines:
        if match := _PIN.match(line):
            pins[_normal(match[1])] = f"{match[1]}=={match[2]}"
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
