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


def ended_status(at, record) -> str:
    """The Run page's status line of an ended run: green, or amber with the flags' sentences where its record was
    flagged (hardware/run_flags.py: "machine busy", as a run on a shared machine may be, or "client bound"); never
    either at random."""
    from bench_core.hardware.run_flags import run_flags

    flags = run_flags(record.metrics, record.environment.get("cpu_count"))
    if not flags:
        assert not [w.value for w in at.warning if "Machine busy" in shown(w.value) or "Client bound" in shown(w.value)]
        return at.success[0].value
    assert not at.success
    status = next(w.value for w in at.warning if shown(w.value).startswith(f"{record.status}:"))
    assert shown(status).endswith(" ".join(flag[:1].upper() + flag[1:] for flag in flags))
    return status
