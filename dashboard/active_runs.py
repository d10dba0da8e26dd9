"""The runs that hold or wait for the engine, as every page and tab sees them, and how a new run joins them.

All sessions share one runner (`dashboard.state.get_runner`), so a run started in one tab is the active run of
every tab. Every page shows it in a banner (state, progress, a link to it) that polls only while something is
active. Start is one press, one run: pressing it again with the same settings while this session's run is
active queues nothing, and starting while another run is active first asks, naming the run it would wait behind.
One press may start runs to compare (`Starts`: a run again with one thing changed, a preset's two runs); the session
keeps which (COMPARE_WHEN_ENDED) until the last of them has ended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from bench_core.config import RunConfig
from bench_core.errors import BenchError
from bench_core.run.preflight import Preflighted, check_run
from bench_core.run.runner import Run, Runner
from bench_core.states import RunState
from dashboard.state import get_runner
from dashboard.text import plain

# A cancelled run stops within a second; the Cancel click waits that long so that its own rerun draws the ended run.
CANCEL_SETTLE_S = 2.0
BANNER_REFRESH_S = 2.0  # a few counters only; the Run page's own live view refreshes faster
RUN_PAGE = "app_pages/run.py"  # relative to app.py, as st.page_link takes it
STARTED = "started_run_ids"  # session key: the runs this session started
PENDING = "pending_start"  # session key: the start waiting for the user to confirm it, and its checked configs
START_ERROR = "start_error"  # session key: why a confirmed start failed, shown once
# Session key: the runs to open compared once the last of each group has ended, each group its baseline first.
COMPARE_WHEN_ENDED = "compare_when_ended"


def active_runs(runner: Runner) -> list[Run]:
    """Benchmark runs queued, loading or running, in queue order (the first one holds the engine)."""
    return [run for run in runner.runs() if run.active]


def describe(run: Run, runner: Runner) -> str:
    """One line: the run, its label, its state and how far it got."""
    label = f" ({run.config.label})" if run.config.label else ""
    snapshot = run.snapshot()
    if run.state == RunState.QUEUED:
        progress = f", {runner.queue_position(run)} ahead of it"
    elif snapshot is not None:
        progress = (
            f": {snapshot.completed + snapshot.failed}/{snapshot.total_requests} requests, {snapshot.elapsed_s:.0f} s"
        )
    else:
        progress = ""
    return f"run {run.run_id}{label} is {run.state}{progress}"


def render_banner(shown_run_id: str | None) -> None:
    """The active runs other than the one this page shows in full; nothing, and no polling, when there is none."""
    if any(run.run_id != shown_run_id for run in active_runs(get_runner())):
        st.fragment(_banner, run_every=BANNER_REFRESH_S)(shown_run_id)


def _banner(shown_run_id: str | None) -> None:
    runner = get_runner()
    others = [run for run in active_runs(runner) if run.run_id != shown_run_id]
    if not others:
        st.rerun()  # they ended: one full rerun draws the page without the banner, and polling stops
    with st.container(border=True, key="active_runs_banner"):
        for run in others:
            left, right = st.columns([4, 1], vertical_alignment="center")
            left.markdown(f":material/pending: {plain(describe(run, runner))}")
            right.page_link(RUN_PAGE, label="Open it", query_params={"run": run.run_id})


def cancel_and_settle(run: Run) -> None:
    """Cancel `run` and wait until it has ended (at most CANCEL_SETTLE_S).

    Left to the live fragment, the switch to the ended view sometimes never came in chromium: the fragment's
    own rerun request raced the rerun of this click, and the browser stopped sending its run_every reruns,
    so the page stayed on a live view of an ended run (seen 2 times in 7).
    """
    run.cancel()
    run.wait(CANCEL_SETTLE_S)


@dataclass(frozen=True)
class Starts:
    """Runs one press starts, one after the other, to be opened compared once the last has ended: against
    `baseline` (a run that has ended), else against the first of them."""

    configs: tuple[RunConfig, ...]
    baseline: str | None = None


def press_start(start: RunConfig | Starts) -> Run | None:
    """Start pressed with a run's config, or with runs to compare: the run on show afterwards (the last one
    started), or None while the user is asked to confirm.

    Raises BenchError when a config cannot run (before anything is queued or asked)."""
    configs = start.configs if isinstance(start, Starts) else (start,)
    runner = get_runner()
    started = set(st.session_state.get(STARTED, ()))
    active = active_runs(runner)
    same = next((run for run in active if run.run_id in started and run.config in configs), None)
    if same is not None:
        st.info(f"Already started: {plain(describe(same, runner))}. Pressing Start again queues nothing.")
        return same
    checked = tuple(map(check_run, configs))  # once per press: the runner queues them without checking again
    if active:
        st.session_state[PENDING] = (start, checked)
        return None
    return _submit(runner, start, checked)


@dataclass(frozen=True)
class StartQuestion:
    """What a Start button asks before it starts something beside what is already running (the Run page's Start,
    the Sweep page's), and the session keys that hold what waits for the answer."""

    pending: str  # session key: what waits for the answer
    error: str  # session key: why a confirmed start failed, shown once
    keys: tuple[str, str]  # the confirm and discard buttons'
    busy: str  # the question, naming what is {running}
    free: str  # said instead when that has ended meanwhile
    labels: tuple[str, str]  # the confirm button's: while something runs, once nothing does

    def render(self, running_now: Callable[[], Sequence[str]], on_confirm: Callable[[], None]) -> None:
        """The question while something waits: what is running named (`running_now`, asked only then: every
        rerun of the page comes here), then start it or not; a failed start, once."""
        if self.error in st.session_state:
            st.error(plain(st.session_state.pop(self.error)))
        if st.session_state.get(self.pending) is None:
            return
        running = running_now()
        if running:
            st.warning(plain(self.busy.format(running="; ".join(running))))
        else:
            st.info(plain(self.free))
        left, right = st.columns(2)
        left.button(
            self.labels[0] if running else self.labels[1],
            key=self.keys[0],
            type="primary",
            width="stretch",
            on_click=on_confirm,
        )
        right.button(
            "Do not start", key=self.keys[1], width="stretch", on_click=st.session_state.pop, args=(self.pending, None)
        )

    def answer(self, start: Callable[[Any], Any], show: Callable[[Any], None]) -> None:
        """Confirmed: `start` what waits and `show` it, or keep why it could not start."""
        waiting = st.session_state.pop(self.pending, None)
        if waiting is None:  # a second click on the same button: already started
            return
        try:
            started = start(waiting)
        except BenchError as exc:
            st.session_state[self.error] = str(exc)
        else:
            show(started)


RUN_QUESTION = StartQuestion(
    PENDING,
    START_ERROR,
    ("confirm_start", "discard_start"),
    "Another run holds the engine: {running}. A new run waits in the queue behind it.",
    "The run that held the engine has ended: a new run starts at once.",
    ("Queue my run", "Start my run"),
)


def render_confirmation() -> None:
    """Ask before queueing the pending start behind the active runs; confirming queues it and shows it."""
    RUN_QUESTION.render(_running_now, _confirm)


def _running_now() -> list[str]:
    runner = get_runner()
    return [describe(run, runner) for run in active_runs(runner)]


def _confirm() -> None:
    RUN_QUESTION.answer(lambda pending: _submit(get_runner(), *pending), _show_run)


def _show_run(run: Run) -> None:
    st.query_params["run"] = st.session_state["run_id"] = run.run_id


def _submit(runner: Runner, start: RunConfig | Starts, checked: tuple[Preflighted, ...]) -> Run:
    """Queue the run, or the runs to compare (kept in COMPARE_WHEN_ENDED), as `press_start` checked them (`checked`,
    in the order of `start`'s); the last one queued."""
    runs = [runner.submit(config) for config in checked]
    run_ids = [run.run_id for run in runs]
    st.session_state[STARTED] = [*st.session_state.get(STARTED, ()), *run_ids]
    if isinstance(start, Starts):
        compared = [start.baseline, *run_ids] if start.baseline else run_ids
        st.session_state[COMPARE_WHEN_ENDED] = [*st.session_state.get(COMPARE_WHEN_ENDED, ()), compared]
    return runs[-1]
