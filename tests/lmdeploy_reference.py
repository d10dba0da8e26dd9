"""Find and load LMDeploy's own `lmdeploy/profiler.py`, the reference our Profiler must match.

Loaded by file path under a private module name, so `lmdeploy/__init__` (which needs a GPU stack)
is never imported. Order: the LMDEPLOY_PROFILER_PATH environment variable, then the installed
lmdeploy distribution. Used by tests/test_profiler.py and bench/bench_profiler.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path
from types import ModuleType

ENV_VAR = "LMDEPLOY_PROFILER_PATH"


def locate_lmdeploy_profiler() -> Path | None:
    """Path of LMDeploy's profiler.py, or None when it cannot be found."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        path = Path(explicit)
        return path if path.is_file() else None
    try:
        path = Path(importlib.metadata.distribution("lmdeploy").locate_file("lmdeploy/profiler.py"))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def load_lmdeploy_profiler(module_name: str = "lmdeploy_reference_profiler") -> ModuleType | None:
    """A fresh copy of LMDeploy's profiler module, or None when it cannot be located."""
    path = locate_lmdeploy_profiler()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def why_missing() -> str:
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return f"{ENV_VAR}={explicit} is not a file"
    return f"lmdeploy is not installed and {ENV_VAR} is not set, so LMDeploy's profiler.py cannot be located"
