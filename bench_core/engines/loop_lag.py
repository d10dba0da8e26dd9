"""How late the HTTP client's event loop gets to what is due on it: how good its per-event timestamps are.

A chunk is timestamped when the loop reads it. While the loop is busy elsewhere (parsing other streams, a callback
that blocks), a chunk that has arrived waits, and its ITL is off by that wait; so is a send due then. `LoopLag` is a
task on the loop that sleeps INTERVAL_S again and again and records how much later than asked it woke: what anything
due at that instant waited too. Its samples are (perf_counter time of waking, seconds late), the telemetry's clock
(hardware/telemetry.py CLIENT_LOOP), so a run's measured window selects them directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

INTERVAL_S = 0.01  # often enough to see a 10 ms stall; a timer at 100 Hz costs the loop next to nothing

T = TypeVar("T")


class LoopLag:
    """The lateness samples of one event loop, taken while `around` awaits the work it wraps."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # appended on the loop's thread; read once the work is done

    async def around(self, work: Awaitable[T]) -> T:
        """Await `work` with the lateness sampled on the running loop meanwhile."""
        watch = asyncio.create_task(self._watch())
        try:
            return await work
        finally:
            watch.cancel()

    async def _watch(self) -> None:
        while True:
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            woke = time.perf_counter()
            self.samples.append((woke, max(0.0, woke - due)))
