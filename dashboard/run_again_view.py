"""The Run page's ways to see what one knob does: "Run again with one thing changed" on an ended run, and the presets
that start two runs differing in one knob. Either way the runs open compared in History once the last has ended.

What the new runs are is decided in bench_core.run.run_again; this module draws the widgets and starts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from bench_core.config import RunConfig
from bench_core.errors import BenchError
from bench_core.run.run_again import (
    PRESETS,
    Preset,
    change_problems,
    changeable_settings,
    first_offered,
    preset_problem,
    preset_runs,
    with_change,
)
from bench_core.sweep.plan import SweepPlan, change_sweep
from bench_core.sweep.precision import Precision
from bench_core.views import run_diff
from dashboard import active_runs, compare_view, history_view, sweep_form, sweep_start, url_settings
from dashboard.active_runs import COMPARE_WHEN_ENDED, Starts
from dashboard.setting_widgets import setting_widget, to_widget
from dashboard.state import get_history, get_runner
from dashboard.text import plain

HISTORY_PAGE = "app_pages/history.py"
SWEEP_PAGE = "app_pages/sweep.py"


def comparison_due(groups: Sequence[Sequence[str]], run_id: str, ended: Callable[[str], bool]) -> list[str] | None:
    """The runs to open compared now that run `run_id` is on show: the group it ends (each group's last run is the last
    one started), once every run of it has `ended`; None otherwise."""
    return next(
        (list(group) for group in groups if group[-1] == run_id and all(ended(member) for member in group)), None
    )


def open_comparison_when_ended(run_id: str) -> None:
    """Run `run_id` on show has ended: if it is the last of runs this session started to compare, open them compared
    in History, the baseline first; a run of them that was never recorded leaves nothing to compare, said once."""
    groups = st.session_state.get(COMPARE_WHEN_ENDED, [])
    history, runner = get_history(), get_runner()

    def ended(member: str) -> bool:
        run = runner.get(member)
        return run is None or not run.active

    group = comparison_due(groups, run_id, ended)
    if group is None:
        return
    st.session_state[COMPARE_WHEN_ENDED] = [other for other in groups if other != group]
    unrecorded = [member for member in group if history.row(member) is None]
    if unrecorded:
        st.warning(f"Nothing to compare: run {plain(', '.join(unrecorded))} was not recorded.")
        return
    st.session_state[history_view.PICKED_RUNS] = group
    st.session_state[compare_view.PICKED_BASELINE] = group[0]
    st.switch_page(HISTORY_PAGE)


def render_run_again(run_id: str, config: RunConfig, measured: bool = True) -> None:
    """For ended run `run_id` of `config`: one setting picked among those that apply to it, its new value in the
    setting's own widget (starting at the run's, a switch turned over), and Start; with a target margin of error, Start
    starts a sweep of both values, each repeated until the target or its cap, and opens the Sweep page. A run that
    `measured` nothing (it failed or was refused before measuring) has no numbers to compare or repeat: Start then
    starts the changed run alone, a typo fixed, say."""
    settings = changeable_settings(config)
    if not settings:
        return
    backend = config.engine.backend
    with st.container(border=True, key="run_again"):
        st.markdown(
            "**Run again with one thing changed**, then compare the two runs"
            if measured
            else "**Run again with one thing changed**: this run measured nothing, so the new one is shown alone"
        )
        pick, value_column, go = st.columns([2, 2, 1], vertical_alignment="bottom")
        declared = pick.selectbox(
            "Setting to change",
            settings,
            index=first_offered(settings),
            key=f"run_again_setting_{run_id}",
            format_func=lambda declared: declared.title,
        )
        now = config.value(declared.name)
        start = to_widget(declared, not now if declared.kind is bool else now)
        with value_column:
            value = setting_widget(
                declared, f"run_again_{run_id}_{declared.name}", start, backend, draw=url_settings.drawn
            )
        pick.caption(plain(f"This run: {run_diff.show(now)} {declared.unit}".strip()))  # as History compares it
        if measured:
            st.caption(
                "Until the answer is clear (optional): with a target margin of error, the run's value and the new one "
                "each run again until the 95% interval of the metric's mean is within it, or the cap stops them; the "
                "Sweep page then compares the two."
            )
        precision = sweep_form.precision_inputs("run_again") if measured else None
        plan, problems = _sweep_of_change(config, declared.name, value, precision)
        if problems:
            why = problems[0]
        elif plan is not None:
            why = "A sweep of the two values, each repeated until the target."
        else:
            why = "A new run with this one change" + ("; the two open compared once it ends." if measured else ".")
        pressed = go.button(
            "Start",
            key="run_again_start",
            type="primary",
            icon=":material/compare_arrows:" if measured else ":material/replay:",
            disabled=bool(problems),
            help=why,
            width="stretch",
        )
    if pressed and plan is not None:
        _start_sweep(plan)
    elif pressed and measured:
        _start(lambda: Starts((with_change(config, declared.name, value),), baseline=run_id))
    elif pressed:
        _start(lambda: with_change(config, declared.name, value))


def _sweep_of_change(
    config: RunConfig, name: str, value: Any, precision: dict[str, Any] | None
) -> tuple[SweepPlan | None, list[str]]:
    """The sweep a run again with a target starts (None without a target), and why it cannot start (empty: it can)."""
    problems = change_problems(config, name, value)
    if precision is None or problems:
        return None, problems
    try:
        return change_sweep(config, name, value, Precision(**precision)), []
    except BenchError as exc:
        return None, [str(exc)]


def _start_sweep(plan: SweepPlan) -> None:
    """Start the sweep (or ask first, on the Sweep page, while other runs hold the engine) and open the Sweep page."""
    try:
        sweep = sweep_start.press_start(plan, sweep_start.HERE)
    except BenchError as exc:
        st.error(plain(exc))
        return
    if sweep is not None:
        st.session_state["sweep_id"] = sweep.sweep_id
    st.switch_page(SWEEP_PAGE)


def render_presets(base: RunConfig | None, expanded: bool) -> None:
    """The presets, one button each: two runs on `base`'s engine (the sidebar's; None while its settings make no run)
    that differ in one knob, compared once both have ended; a preset whose knob the backend lacks is disabled with
    the reason."""
    with st.expander("Show one knob's effect: two runs, compared", expanded=expanded, icon=":material/compare:"):
        st.caption(
            "Each preset runs a small workload twice on the sidebar's engine, with the knob at one value then the "
            "other, and opens the two runs compared in History."
        )
        pressed = [_preset_button(number, preset, base) for number, preset in enumerate(PRESETS)]
    if base is not None and True in pressed:
        chosen = PRESETS[pressed.index(True)]
        _start(lambda: Starts(preset_runs(chosen, base)))


def _preset_button(number: int, preset: Preset, base: RunConfig | None) -> bool:
    """The preset's button, beside what its comparison shows; whether it was pressed."""
    problem = "Correct the sidebar's settings first." if base is None else preset_problem(preset, base.engine.backend)
    left, right = st.columns([1, 3], vertical_alignment="center")
    right.caption(plain(preset.look_at))
    return left.button(
        preset.title, key=f"preset_{number}", disabled=problem is not None, help=problem, width="stretch"
    )


def _start(runs: Callable[[], RunConfig | Starts]) -> None:
    """Start the `runs` (or ask first while another holds the engine), then show the last of them; why not, if they
    cannot start."""
    try:
        run = active_runs.press_start(runs())
    except BenchError as exc:
        st.error(plain(exc))
        return
    if run is not None:
        st.query_params["run"] = st.session_state["run_id"] = run.run_id
    st.rerun()  # the run's live view, or the question before queueing it
