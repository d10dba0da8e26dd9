"""The dashboard stopped (SIGTERM, as a service manager or a terminal's kill sends it) while a run measures: the
run is recorded as cancelled, with the requests it had measured, in the history the next start reads."""

from __future__ import annotations

import os
import re
import signal

import pytest
from dashboard_server import free_port, serve, streamlit_command
from playwright.sync_api import Page, expect

from bench_core.store.history import History

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = (
    "/?model_choice=builtin:tiny-llama&dataset_builtin=builtin:sample&num_prompts_cpu=48"
    "&sharegpt_output_len_cpu=512&concurrency_cpu=2&label=stopped"
)


def test_a_dashboard_stopped_mid_run_records_the_run_cancelled_with_what_it_measured(
    page: Page, tiny_model_path, tmp_path
):
    port = free_port()
    env = {
        **os.environ,
        "BENCH_STUDIO_RESULTS": str(tmp_path / "results"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with serve(streamlit_command(port), env, port, tmp_path) as server:
        page.goto(server.url + RUN)
        page.get_by_test_id("stSidebar").get_by_role("button", name="Start").click()
        main = page.get_by_test_id("stMain")
        expect(main.get_by_text(re.compile(r"running: ([2-9]|\d\d)/48 requests"))).to_be_visible(timeout=180_000)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) is not None
    (row,) = History(tmp_path / "results").load().to_dict("records")
    assert (row["label"], row["status"]) == ("stopped", "cancelled"), server.log()
    requests = History(tmp_path / "results").requests(row["run_id"])
    assert 2 <= (requests["status"] == "success").sum() < 48
