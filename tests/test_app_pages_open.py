"""Every page of the dashboard opens on an empty history and draws its first screen, in the fast tier: the other
AppTest files run real benchmarks and are slow, and a page that raises on first paint should not wait for them.
No run starts here, so no engine process is spawned."""

from __future__ import annotations

import pytest
from app_under_test import APP
from streamlit.testing.v1 import AppTest

from bench_core.store.history import RESULTS_ENV
from dashboard.state import get_runner

TITLES = {
    "app_pages/run.py": "Run a benchmark",
    "app_pages/history.py": "History",
    "app_pages/sweep.py": "Knob sweep",
    "app_pages/playground.py": "Playground",
}


@pytest.fixture(autouse=True)
def empty_results(tmp_path, monkeypatch, fresh_dashboard):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))


@pytest.mark.parametrize("page", TITLES)
def test_each_page_opens_on_an_empty_history_with_no_error_and_starts_nothing(page):
    at = AppTest.from_file(APP, default_timeout=60).run()
    at = at.switch_page(page).run()
    assert not at.exception and not at.error, [element.value for element in [*at.exception, *at.error]]
    assert [title.value for title in at.title] == [TITLES[page]]
    assert get_runner().runs() == [] and get_runner().worker_pid() is None
