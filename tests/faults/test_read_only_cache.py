"""A model cache this user cannot write (reliability round 4, n13): a read-only HOME without BENCH_STUDIO_CACHE, or
BENCH_STUDIO_CACHE on a read-only mount, as in a locked-down container or a service account. A run that would build
a model there is refused in one line that names the cache, says it cannot be written and how to choose another,
exit 2 and no history row, in the CLI and on the Run page; a model already in a read-only cache runs from it, and
nothing else of the run (a lock, the CPU bandwidth the roofline reads) needs to write there.

Read-only file systems are real tmpfs mounts (root only; skipped where mounting is refused), as a full disk is in
test_storage.py: root writes through a folder's permissions. Real servers on 127.0.0.1 (raw_http_server), the CLI
in this process, the dashboard through AppTest."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from app_under_test import APP, shown
from llama_server import NEVER, llama_handler
from raw_http_server import RawServer
from restful_cli import restful
from streamlit.testing.v1 import AppTest

from bench_core.cli import main
from bench_core.store.history import RESULTS_ENV, History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

TINY = "builtin:tiny-llama"


@pytest.fixture
def read_only_mount(tmp_path) -> Iterator[Callable[..., Path]]:
    """`read_only_mount(name, *folders)`: a tmpfs mounted read-only at tmp_path/name, holding copies of `folders`
    (written while it was still writable)."""
    mounted: list[Path] = []

    def mount(name: str, *folders: Path) -> Path:
        point = tmp_path / name
        point.mkdir()
        if (
            os.geteuid() != 0
            or subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(point)], capture_output=True
            ).returncode
            != 0
        ):
            pytest.skip("mounting a tmpfs needs root")
        mounted.append(point)
        for folder in folders:
            shutil.copytree(folder, point / folder.name)
        subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def unwritable_cache(case: str, mount: Callable[..., Path], monkeypatch) -> Path:
    """Make the model cache unwritable as `case` says; the folder named as the cache."""
    if case == "read-only HOME":
        monkeypatch.delenv("BENCH_STUDIO_CACHE", raising=False)
        monkeypatch.setenv("HOME", str(mount("home")))
        return Path(os.environ["HOME"]) / ".cache" / "llm-bench-studio"
    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(mount("cache")))
    return Path(os.environ["BENCH_STUDIO_CACHE"])


def refusal(cache: Path) -> str:
    return (
        f"The model cache {cache} cannot be written (Read-only file system), so tiny-llama-v2 cannot be built "
        "there on first use: set BENCH_STUDIO_CACHE to a folder this user can write."
    )


CASES = ["read-only HOME", "read-only BENCH_STUDIO_CACHE"]


@pytest.mark.parametrize("case", CASES)
def test_a_model_to_build_in_a_cache_that_cannot_be_written_is_one_line_exit_2_and_no_run(
    tmp_path, capsys, monkeypatch, read_only_mount, case
):
    cache = unwritable_cache(case, read_only_mount, monkeypatch)
    with RawServer(llama_handler(NEVER)) as server:
        run = restful(server.url, tmp_path, capsys, "--backend", "vllm", "--no-server-metrics", prompts=4)
        assert not [request for request in server.log if request.method == "POST"]
    assert run.code == 2
    assert run.err == f"error: {refusal(cache)}\n"
    assert run.summary is None and not list((tmp_path / "results").glob("runs/*"))


def test_a_model_already_in_a_read_only_cache_runs_from_it(
    tmp_path, capsys, monkeypatch, read_only_mount, tiny_model_path
):
    cache = read_only_mount("cache", Path(tiny_model_path))
    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(read_only_mount("home")))
    with RawServer(llama_handler(NEVER)) as server:  # the tokenizer from the cache
        served = restful(server.url, tmp_path, capsys, "--backend", "vllm", "--no-server-metrics", prompts=4)
    assert served.code == 0 and "Traceback" not in served.lines, served.err
    assert served.summary["completed"] == 4

    # The model itself on the embedded engine, and the roofline's CPU bandwidth: measured, not kept.
    capsys.readouterr()
    args = ["pipeline", "builtin:sample", TINY, "--backend", "transformers", "-n", "4", "--sharegpt-output-len", "4"]
    code = main([*args, "--csv", "", "--results", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in out + err, err
    assert f"measured now ({cache / 'memory-bandwidth.json'} cannot be written)" in out
    assert History(tmp_path / "results").load()["status"].tolist() == ["finished", "finished"]
    assert sorted(path.name for path in cache.iterdir()) == [Path(tiny_model_path).name]


@pytest.mark.parametrize("case", CASES)
def test_the_run_page_says_the_same_line_and_records_nothing(
    tmp_path, monkeypatch, read_only_mount, fresh_dashboard, case
):
    from dashboard.state import get_runner

    cache = unwritable_cache(case, read_only_mount, monkeypatch)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.selectbox(key="model_choice").select(TINY)
    at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
    at.sidebar.number_input(key="num_prompts_cpu").set_value(4)
    at.sidebar.number_input(key="sharegpt_output_len_cpu").set_value(4)
    at.sidebar.button(key="start").click().run()
    run = get_runner().get(at.query_params["run"])
    assert run.wait(60) and run.state == "failed"
    at.run()
    assert not at.exception
    assert [shown(error.value) for error in at.error] == [f"failed: {refusal(cache)}"]
    assert History(tmp_path / "results").load().empty
