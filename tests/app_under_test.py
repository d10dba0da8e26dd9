"""Paths of the dashboard that the AppTest files open (not in conftest: tests/ and tests/e2e/ each have one,
and `from conftest import` would take whichever was imported first)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")


def shown(markdown: str) -> str:
    """What the browser shows for an element's Markdown source (AppTest gives the source): without the escapes and
    word joiners that dashboard.text.plain puts into text from outside the app."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u2060", "")
