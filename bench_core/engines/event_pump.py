"""Events from an engine's helper threads to the thread that reads `Engine.stream()`.

The LMDeploy drives (the pipeline's feeding threads, the engine API's event loop) stamp what happens to each
request in threads of their own and put the events on a queue, each thread putting None when it is done. The
reader takes them from there, and on a cancel asks the engine to stop, again and again until it does: a
request admitted but not finished `CANCEL_GRACE_S` after the cancel ends "abort" without waiting longer.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

from .base import EngineEvent

ABORT_EVERY_S = 0.25  # how often a cancel is asked again while requests are still arriving
CANCEL_GRACE_S = 10.0  # how long the engine may take to honour a cancel
POLL_S = 0.05
_NOTHING = object()  # what the queue gives when nothing arrived within POLL_S


def pump_events(
    events: queue.Queue, producers: int, cancel: threading.Event, stop: Callable[[], None], engine_name: str
) -> Iterator[EngineEvent]:
    """Yield what `producers` threads put on `events` until each has put its None. While `cancel` is set, call
    `stop()` every ABORT_EVERY_S; past CANCEL_GRACE_S, end every admitted request still open with "abort", naming
    `engine_name` as the one that did not stop it. A reader that stops early (or an engine that hung) calls `stop()`
    once more on its way out."""
    admitted: list[int] = []
    ended: set[int] = set()
    live, cancelled_at, next_abort = producers, None, 0.0
    try:
        while live:
            try:
                event = events.get(timeout=POLL_S)
            except queue.Empty:
                event = _NOTHING
            if event is None:
                live -= 1
            elif event is not _NOTHING:
                if event.kind == "admit":
                    admitted.append(event.index)
                elif event.kind == "finish":
                    ended.add(event.index)
                yield event
            if cancel.is_set():
                now = time.perf_counter()
                cancelled_at = cancelled_at or now
                if now >= next_abort:
                    stop()
                    next_abort = now + ABORT_EVERY_S
                if now - cancelled_at > CANCEL_GRACE_S:
                    break
        now = time.perf_counter()
        for index in admitted:  # only after a cancel the engine did not honour in time
            if index not in ended:
                yield EngineEvent(
                    index,
                    "finish",
                    now,
                    finish_reason="abort",
                    message=f"{engine_name} did not stop it within {CANCEL_GRACE_S:.0f} s of the cancel",
                )
    finally:
        if live:
            stop()
