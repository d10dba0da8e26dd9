"""The verdicts the pages colour: an ended run's and an ended sweep's green, amber or red, decided in bench_core."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench_core.config import RunConfig
from bench_core.states import RunState
from bench_core.store.history import History
from bench_core.sweep.driver import SweepProgress
from bench_core.sweep.plan import SweepPlan, parse_sweep_arg
from bench_core.sweep.status import STOPPED, saved_sweep_progress, sweep_verdict
from bench_core.sweep.store import SWEEP_REPEAT
from bench_core.views.verdict import Judged, Verdict, run_verdict, unrecorded_verdict


def summary(completed: int = 4, failed: int = 0, incomplete: int = 0, cancelled: int = 0, **more) -> dict:
    total = completed + failed + incomplete + cancelled
    return {
        "completed": completed,
        "total_requests": total,
        "duration_s": 2.5,
        "failed": failed,
        "incomplete": incomplete,
        "unfinished": 0,
        "cancelled": cancelled,
        **more,
    }


@pytest.mark.parametrize(
    ("status", "counts", "flags", "verdict"),
    [
        (RunState.FINISHED, {}, (), Verdict.GOOD),
        (RunState.FINISHED, {}, ("machine busy: other processes held the cores",), Verdict.CAUTION),
        (RunState.PARTIAL, {"completed": 3, "failed": 1}, (), Verdict.CAUTION),
        (RunState.CANCELLED, {"completed": 2, "cancelled": 2}, (), Verdict.CAUTION),
        (RunState.FAILED, {"completed": 0, "failed": 4}, (), Verdict.BAD),
        # recorded before partial and failed existed: every run "finished", judged by its counts
        (RunState.FINISHED, {"completed": 0, "failed": 4}, (), Verdict.BAD),
        (RunState.FINISHED, {"completed": 3, "incomplete": 1}, (), Verdict.CAUTION),
        (RunState.FINISHED, {"overrun": 1}, (), Verdict.CAUTION),
    ],
)
def test_a_runs_verdict_is_green_only_when_every_request_succeeded_on_a_machine_of_its_own(
    status, counts, flags, verdict
):
    assert run_verdict(status, "", summary(**counts), flags).verdict == verdict


def test_a_runs_line_says_its_counts_the_runners_message_and_each_flag_as_a_sentence():
    judged = run_verdict(RunState.PARTIAL, "1 request failed: timeout", summary(3, failed=1), ("client bound: ...",))
    assert judged.said == (
        "partial: 1 request failed: timeout. 3/4 requests succeeded in 2.5 s; 1 failed, 0 incomplete, 0 unfinished, "
        "0 cancelled. Client bound: ..."
    )


def test_a_run_that_recorded_nothing_is_red_when_it_failed_and_amber_when_cancelled():
    refused = unrecorded_verdict(RunState.FAILED, "the dataset has no prompt that fits")
    assert (refused.verdict, refused.said) == (Verdict.BAD, "failed: the dataset has no prompt that fits")
    assert unrecorded_verdict(RunState.CANCELLED, "") == Judged(Verdict.CAUTION, "cancelled")


def progress(state: str, finished: int, total: int = 4, failed: int = 0) -> SweepProgress:
    return SweepProgress(state, total, finished, failed, 0, "", "", ("engine died",) if failed else ())


def test_a_sweeps_verdict_is_green_when_all_ran_amber_when_stopped_or_cancelled_and_red_when_it_failed():
    finished = sweep_verdict(progress(RunState.FINISHED, 4), searched=False)
    assert (finished.verdict, finished.said) == (Verdict.GOOD, "finished: all 4 runs.")
    assert sweep_verdict(progress(RunState.FINISHED, 5, total=5), searched=True).said == "finished: all 5 probes."
    cancelled = sweep_verdict(progress(RunState.CANCELLED, 1), searched=False)
    assert cancelled.verdict == Verdict.CAUTION
    assert cancelled.said == "cancelled: 1 of 4 runs finished; resume the sweep to run the other 3."
    assert sweep_verdict(progress(STOPPED, 1), searched=False).verdict == Verdict.CAUTION
    failed = sweep_verdict(progress(RunState.FAILED, 3, failed=1), searched=False)
    assert failed.verdict == Verdict.BAD and failed.said.startswith("failed: 1 run(s) failed: engine died")


def test_a_sweep_this_process_did_not_run_is_judged_from_the_historys_rows(tmp_path):
    config = RunConfig()
    config.engine.model = "builtin:tiny-llama"
    plan = SweepPlan("s1", config, (parse_sweep_arg("concurrency=1,2"),), repeats=1)
    rows = pd.DataFrame(
        {
            "sweep_id": ["s1", "s1"],
            SWEEP_REPEAT: [0.0, np.nan],
            "status": ["finished", "finished"],
            "concurrency": [1.0, 2.0],  # the second has no repeat index: not this sweep's run
        }
    )
    stopped = saved_sweep_progress(History(tmp_path), plan, rows)
    assert (stopped.state, stopped.finished, stopped.total) == (STOPPED, 1, 2)
    assert sweep_verdict(stopped, searched=False).said == (
        "stopped: 1 of 2 runs finished; resume the sweep to run the other 1."
    )
    rows[SWEEP_REPEAT] = [0.0, 0.0]
    done = saved_sweep_progress(History(tmp_path), plan, rows)
    assert sweep_verdict(done, searched=False).verdict == Verdict.GOOD
