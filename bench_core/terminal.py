"""Text on a terminal is shown, never acted on. Text from outside (a server's model id, its error text and the log
lines of a server a sweep started, an imported history's labels) can hold escape sequences a terminal executes:
OSC 52 sets the clipboard, CSI 2J clears the screen, a carriage return writes over the line it is on. It can hold
a credential too. `shown` masks credentials (redact.redact_text) and writes every control character as its Python
escape (`\\x1b`, `\\r`, `\\x9b`), keeping the text's own line breaks and tabs.

The CLI writes everything through `shown_streams`: while it runs, stdout and stderr pass what they are given
through `shown`, so a message cannot forget to. Only the progress line's own carriage returns (`redraw`) and the
bytes of a data format written to stdout's buffer (`history export` as CSV or JSON, exact as data must be) go
around it.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable, Iterator
from typing import TextIO

from .redact import redact_text

# C0 controls but tab and line feed, DEL, C1 controls, and the bidirectional overrides and isolates that make a
# terminal show text in another order than it is written.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def escaped(text: str) -> str:
    """`text` with each control character written as its escape, to be read, not executed."""
    return _CONTROLS.sub(lambda match: match.group(0).encode("unicode_escape").decode("ascii"), text)


def shown(text: str) -> str:
    """`text` as a terminal may show it: credentials masked, control characters escaped."""
    return escaped(redact_text(text))


class ShownStream:
    """A text stream (stdout, stderr) that writes what it is given as `shown` makes it; all else is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(shown(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def shown_streams() -> Iterator[None]:
    """stdout and stderr pass through `shown` while the block runs."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (stream if isinstance(stream, ShownStream) else ShownStream(stream) for stream in streams)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


def redraw(line: str, width: int) -> None:
    """Write `line` (shown, cut to `width` characters, padded to it) over stderr's current line; an empty one clears
    it. The carriage returns are the redraw's own: the only ones that reach the terminal."""
    stream = sys.stderr.stream if isinstance(sys.stderr, ShownStream) else sys.stderr
    stream.write(f"\r{shown(line)[:width]:<{width}}" + ("" if line else "\r"))
    stream.flush()
