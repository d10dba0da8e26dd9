"""The machine and software a run used, recorded next to its numbers so runs can be compared fairly.

Everything except the engine's own versions is fixed for the life of the process, so it is
collected once and cached. LMDeploy is never imported here (importing it is slow and, without a
GPU, noisy): its version comes from the installed package metadata.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path

from .. import __version__
from ..engines.base import EngineInfo

NOT_INSTALLED = "not installed"
UNKNOWN = "unknown"
_PACKAGES = ("torch", "transformers", "lmdeploy")


def collect_environment(engine_info: EngineInfo | None = None) -> dict[str, str]:
    """GPU, library and app versions as strings; the engine's reported versions win where they overlap,
    since they say what actually ran (for example a library the engine loaded from elsewhere)."""
    environment = dict(_static_environment())
    if engine_info is not None:
        environment.update({name: str(version) for name, version in engine_info.versions.items()})
    return environment


@functools.cache
def _static_environment() -> dict[str, str]:
    environment = {**_gpu_facts(), "cuda": _cuda_version()}
    environment.update({name: _package_version(name) for name in _PACKAGES})
    environment.update(
        python=platform.python_version(),
        platform=platform.platform(),
        cpu_count=str(os.cpu_count() or UNKNOWN),
        hostname=socket.gethostname(),
        app_version=__version__,
        app_commit=_app_commit(),
    )
    return environment


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _gpu_facts() -> dict[str, str]:
    """Name, count and driver of the NVIDIA GPUs, from nvidia-smi (which knows the driver, unlike torch)."""
    none = {"gpu_name": "none", "gpu_count": "0", "gpu_driver": "none"}
    if shutil.which("nvidia-smi") is None:
        return none
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        output = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"gpu_name": UNKNOWN, "gpu_count": UNKNOWN, "gpu_driver": UNKNOWN}
    gpus = [[part.strip() for part in line.split(",", 1)] for line in output.splitlines() if "," in line]
    if not gpus:
        return none
    names = sorted({name for name, _ in gpus})
    return {"gpu_name": " + ".join(names), "gpu_count": str(len(gpus)), "gpu_driver": gpus[0][1]}


def _cuda_version() -> str:
    """The CUDA version torch was built with ("none" for a CPU build); the engines import torch anyway."""
    if importlib.util.find_spec("torch") is None:
        return NOT_INSTALLED
    try:
        import torch
    except ImportError:
        return UNKNOWN
    return torch.version.cuda or "none"


def _app_commit() -> str:
    """The commit of the git checkout holding bench_core, "unknown" outside one (an installed copy)."""
    package_dir = Path(__file__).resolve().parent
    command = ["git", "-C", str(package_dir), "rev-parse", "--short=12", "HEAD"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else UNKNOWN
