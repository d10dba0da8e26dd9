"""How many times a function runs while a block runs, in this thread and in any thread started meanwhile (AppTest runs a
page's script in one of its own): counted by the interpreter's profile hook, so the function itself is left as it is,
neither wrapped nor replaced. The profile hook, not the trace hook, which coverage holds."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def counted_calls(function: Callable[..., Any]) -> Iterator[list[int]]:
    """A list that gets the calling thread's id on every call of `function` while the block runs."""
    code, calls, counting = function.__code__, [], threading.Event()

    def profile(frame, event, arg):
        if not counting.is_set():  # a thread started in the block that outlives it stops calling here
            sys.setprofile(None)
        elif event == "call" and frame.f_code is code:
            calls.append(threading.get_ident())

    counting.set()
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield calls
    finally:
        counting.clear()
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)
