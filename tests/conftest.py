"""Shared fixtures: real models and tokenizers that need no download."""

import os
import sys
from pathlib import Path

import pytest
from toy_plugins import TOY_EXPORT

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A browser drives a served dashboard through a real run, and the user install builds a venv: every such test takes
# tens of seconds at least, so the fast suite (-m "not slow") leaves them out without each saying so.
SLOW_BY_KIND = ("e2e", "user_install")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_BY_KIND):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """The built-in tiny Llama (random weights, BPE tokenizer, ChatML), built once per machine."""
    from bench_core.models.resolve import resolve_model

    return resolve_model("builtin:tiny-llama")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from bench_core.models.resolve import load_tokenizer

    return load_tokenizer("builtin:tiny-llama")


@pytest.fixture(scope="module")
def engine_workers():
    """The engine worker process a module's AppTest tests share (engine_process.WorkerPool): each test's new runner
    takes the one the last test's runner left idle instead of starting a process that imports torch, and ending it
    after. A test with a worker entry point of its own, or an environment the worker reads, gets a worker of its own;
    a worker that died, hung or was killed is never kept."""
    from bench_core.run.engine_process import WorkerPool

    pool = WorkerPool(unread_env=("PYTEST_CURRENT_TEST",))  # set anew for each test
    yield pool
    pool.close()


@pytest.fixture
def fresh_dashboard(engine_workers, monkeypatch):
    """New process-wide runner, history and sweep registry around an AppTest test, as after a server
    restart; releasing them cancels whatever the test started. The runner's engine worker is the module's
    (engine_workers), idle and with no run of another test in it."""
    import logging

    from dashboard import state
    from dashboard.state import get_history, get_runner, get_sweeps

    # AppTest's script and the test share a process; calling a cached resource from the test logs noise.
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)
    monkeypatch.setattr(state, "WORKERS", engine_workers)
    caches = (get_sweeps, get_runner, get_history)
    for cached in caches:
        cached.clear()
    yield
    for cached in caches:
        cached.clear()


@pytest.fixture
def download_data(monkeypatch):
    """What a download button whose file is written on click (a callable) hands the browser then. AppTest's media
    manager lives for one script run, so the callables the page registers are kept here to be called after it."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    kept = {}
    register = MediaFileManager.add_deferred

    def add_deferred(self, data_callable, *args, **kwargs):
        file_id = register(self, data_callable, *args, **kwargs)
        kept[file_id] = data_callable
        return file_id

    monkeypatch.setattr(MediaFileManager, "add_deferred", add_deferred)

    def read(button) -> bytes:
        data = kept[button.proto.deferred_file_id]()
        return data.encode() if isinstance(data, str) else data

    return read


@pytest.fixture
def toy_export(tmp_path, monkeypatch) -> Path:
    """$BENCH_STUDIO_PLUGINS names a folder in tmp_path holding the toy export `run-ids`; the folder."""
    from bench_core.plugins import PLUGINS_ENV

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "run_ids_export.py").write_text(TOY_EXPORT)
    monkeypatch.setenv(PLUGINS_ENV, str(folder))
    return folder
