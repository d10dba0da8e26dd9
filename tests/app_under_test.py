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



def download_data(button) -> bytes:
    """What a download button hands the browser when clicked: its bytes, or, for data written only on a click (a
    callable), what the server writes then, as a click asks for it."""
    from streamlit.runtime import Runtime

    proto = button.proto
    manager = Runtime.instance().media_file_mgr
    url = manager.execute_deferred(proto.deferred_file_id) if proto.deferred_file_id else proto.url
    return manager._storage.get_file(url.rsplit("/", 1)[-1]).content
