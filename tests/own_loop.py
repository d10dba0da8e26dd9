"""Run a coroutine to its end on an event loop of its own, on a thread of its own: a test before may leave a loop
running on the main thread (playwright's sync API does), and asyncio.run refuses to start a second one there."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_on_own_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """The coroutine's result, or the exception it raised."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="own-loop") as thread:
        return thread.submit(asyncio.run, coroutine).result()
