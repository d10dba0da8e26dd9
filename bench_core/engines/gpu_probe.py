"""What torch sees of the GPUs and whether LMDeploy imports, without importing either here when they are
not loaded yet: a short child process asks, once per process. The dashboard checks backends on every
page, and its process must never import torch or lmdeploy (the engine runs in a worker process)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass

_PROBE = r"""
import json
facts = {"cuda": False, "capabilities": [], "lmdeploy_error": None}
try:
    import torch
    if torch.cuda.is_available():
        facts["cuda"] = True
        facts["capabilities"] = [list(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]
except Exception:
    pass
if facts["cuda"]:
    try:
        import lmdeploy
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        facts["lmdeploy_error"] = f"{type(exc).__name__}: {lines[-1] if lines else type(exc).__name__}"
print(json.dumps(facts))
"""
PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class GpuFacts:
    cuda: bool
    capabilities: tuple[tuple[int, int], ...]  # (major, minor) per visible GPU
    lmdeploy_error: str | None  # why `import lmdeploy` failed, asked only where CUDA is available


@functools.cache
def gpu_facts() -> GpuFacts:
    """Asked of a child process (torch and lmdeploy stay out of this one); no CUDA when it cannot tell."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return GpuFacts(False, (), None)
    return GpuFacts(facts["cuda"], tuple(tuple(c) for c in facts["capabilities"]), facts["lmdeploy_error"])
