"""Paths of the dashboard that the AppTest files open (not in conftest: tests/ and tests/e2e/ each have one,
and `from conftest import` would take whichever was imported first)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
