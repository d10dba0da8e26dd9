"""How an ended sweep stands, for the page that shows it: its progress, from the sweep itself while this process ran
it, else from its saved plan and the history's rows, and its verdict (the Run page's three levels,
`bench_core.views.verdict`).

A sweep this process did not run (it ended before a restart, or ran from the CLI) is "stopped" when runs are missing:
the history tells which runs finished, not why the others are not there.
"""

from __future__ import annotations

import pandas as pd

from ..states import RunState
from ..store.history import History
from ..views.verdict import Judged, Verdict
from .driver import SweepProgress
from .plan import SweepPlan
from .store import sweep_counts

STOPPED = "stopped"


def saved_sweep_progress(history: History, plan: SweepPlan, history_runs: pd.DataFrame) -> SweepProgress:
    """The progress of a sweep this process does not hold, from its plan and the history's rows (`history.load()`):
    finished when every run it plans has finished, else stopped."""
    finished, total = sweep_counts(history, plan, history_runs)
    state = RunState.FINISHED if finished == total else STOPPED
    return SweepProgress(state, total, finished, 0, 0, "", "", (), most=plan.precision is not None)


def sweep_verdict(progress: SweepProgress, searched: bool, tuned: bool = False) -> Judged:
    """An ended sweep's verdict and line: green when all its runs (a search's probes, when `searched`; a tune's
    trials, when `tuned`) finished, amber when it was cancelled or stopped (resuming runs the rest), red when it failed."""
    if progress.state == RunState.FINISHED:
        return Judged(
            Verdict.GOOD, f"finished: all {progress.total:,} {'probes' if searched else 'trials' if tuned else 'runs'}."
        )
    said = f"{progress.state}: {progress.message}"
    if progress.state in (RunState.CANCELLED, STOPPED):
        return Judged(Verdict.CAUTION, said)
    return Judged(Verdict.BAD, said)
