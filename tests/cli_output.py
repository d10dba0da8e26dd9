"""What the CLI printed, less the run's own flags: a run on a loaded machine is flagged busy (or its client bound),
as it should be, in a warning line of its own that tests of other lines leave aside."""

from __future__ import annotations

from bench_core.hardware.client_bound import CLIENT_PREFIX
from bench_core.hardware.contention import BUSY_PREFIX

FLAG_LINES = tuple(f"warning: {prefix}" for prefix in (BUSY_PREFIX, CLIENT_PREFIX))


def without_run_flags(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith(FLAG_LINES)]
