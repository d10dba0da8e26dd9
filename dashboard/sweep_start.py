"""Starting a sweep from the page's inputs: the plan they make over the sidebar's settings, checked and estimated as
Start checks it, the question asked before a second sweep starts beside what is running, and a resume.

Sweeps started in this server live in `state.get_sweeps()` (one registry per process, like the runner), so a reload
or a second tab finds a running sweep by the id in the URL."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from bench_core.config import setting
from bench_core.errors import BenchError
from bench_core.sweep.cluster import ClusterOptions
from bench_core.sweep.cluster import launch_for as launch_for_address
from bench_core.sweep.driver import Launch, SweepRun, resume_sweep, start_sweep
from bench_core.sweep.estimate import plan_estimate
from bench_core.sweep.plan import SweepPlan, capacity_search, plan_for, with_run_size
from bench_core.sweep.precision import Precision, describe_target
from bench_core.sweep.server import DEFAULT_START_TIMEOUT_S
from bench_core.sweep.tune import describe_search, tune_for
from bench_core.views.tables import describe_slo
from dashboard import active_runs, sidebar, start_estimate
from dashboard.state import get_runner, get_sweeps
from dashboard.sweep_widgets import tick
from dashboard.text import plain

STARTED_SWEEPS = "started_sweep_ids"  # session key: the sweeps this session started
PENDING_SWEEP = "pending_sweep"  # session key: (plan, inputs) waiting for the user to confirm a second sweep
SWEEP_START_ERROR = "sweep_start_error"  # session key: why a confirmed start failed, shown once
# Where a sweep started from another page runs: here, as Start sweep runs one without a cluster's address.
HERE = {
    "ray_address": "",
    "cpus_per_point": setting("cpus_per_point").default,
    "retries": setting("retries").default,
    "credentials": {},
}


def launch_for(inputs: Mapping[str, Any]) -> Launch:
    """How the sweep's runs are run: here, or on the Ray cluster the inputs name (ConfigError without Ray)."""
    return launch_for_address(inputs.get("ray_address", ""), inputs["cpus_per_point"], inputs["retries"])


def plan_from_inputs(inputs: Mapping[str, Any], values: Mapping[str, Any], uploads_dir: Path) -> SweepPlan:
    """The plan for the page's sweep inputs over the sidebar's settings, built as `sweep restful|pipeline` builds
    it from its flags (plan_for, capacity_search); ConfigError says what is wrong."""
    base = with_run_size(
        sidebar.config_from_choice(values, uploads_dir), inputs.get("num_prompts"), inputs.get("output_len")
    )
    search, precision = inputs.get("find_max"), inputs.get("precision")
    return plan_for(
        base,
        [f"{name}={text}" for name, text in inputs["axes"]],
        inputs["repeats"],
        inputs.get("server_cmd", ""),
        inputs.get("server_settings", ()),
        inputs.get("server_start_timeout_s", DEFAULT_START_TIMEOUT_S),
        capacity_search(base=base, **search) if search else None,
        Precision(**precision) if precision else None,
        tune_for(**inputs["tune"]) if inputs.get("tune") else None,
        inputs.get("against_no_speculation", False),
        inputs.get("baseline_server_cmd", ""),
    )


def startable_plan(
    inputs: Mapping[str, Any], values: Mapping[str, Any], uploads_dir: Path, runs: pd.DataFrame | None
) -> SweepPlan | None:
    """The sweep the page's inputs make over the sidebar's settings, checked as Start checks it, with what it would
    send and how long that takes (from the history's `runs`; None: the page said why there is none). None, with the
    reason said here beside the inputs, while Start cannot run it, or until a sweep out of proportion is confirmed."""
    try:
        if inputs["ray_address"]:
            ClusterOptions(inputs["ray_address"], inputs["cpus_per_point"], inputs["retries"])
        plan = plan_from_inputs(inputs, values, uploads_dir)
        plan.check(runs_here=not inputs["ray_address"])
    except BenchError as exc:
        st.error(plain(exc))
        return None
    if runs is None:
        return plan
    guess = plan_estimate(plan, runs)
    st.caption(plain(f"{describe_plan(plan)}; {start_estimate.describe(guess)}."))
    return plan if start_estimate.confirmed(guess, "confirm_sweep") else None


def describe_plan(plan: SweepPlan) -> str:
    axes = " × ".join(f"{axis.name} = {', '.join(tick(value) for value in axis.values)}" for axis in plan.axes)
    server = " · a server started per run" if plan.server_cmd else ""
    if plan.tune:
        return f"{axes}; {describe_search(plan.axes, plan.tune, plan.repeats)}{server}"
    if plan.find_max:
        search = plan.find_max
        return (
            f"{axes + '; ' if axes else ''}highest {search.setting} at which {search.target:.0%} of requests "
            f"meet the SLO ({describe_slo(plan.base.slo)}), within {search.precision:.0%}{server}"
        )
    if plan.precision:
        most = len(plan.points(plan.precision.max_repeats))
        target = describe_target(plan.precision, plan.repeats)
        return f"{axes}; {len(plan.grid())} points, each repeated until {target}: at most {most} runs{server}"
    return f"{axes}; {len(plan.grid())} points × {plan.repeats} repeats = {len(plan.points())} runs{server}"


def press_start(plan: SweepPlan, inputs: Mapping[str, Any]) -> SweepRun | None:
    """Start sweep pressed, as Start on the Run page: the sweep on show afterwards, or None while the user is asked
    to confirm. The same plan as a sweep this session started that is still running starts nothing; a sweep or
    run already running is named first, since a second sweep's runs would take turns with its own."""
    started = set(st.session_state.get(STARTED_SWEEPS, ()))
    same = next(
        (
            sweep
            for sweep in _active_sweeps()
            if sweep.sweep_id in started and dataclasses.replace(sweep.plan, sweep_id=plan.sweep_id) == plan
        ),
        None,
    )
    if same is not None:
        st.info(plain(f"Already started: {_describe_sweep(same)}. Pressing Start sweep again starts nothing."))
        return same
    if _running_now():
        st.session_state[PENDING_SWEEP] = (plan, inputs)
        return None
    return _start(plan, inputs)


SWEEP_QUESTION = active_runs.StartQuestion(
    PENDING_SWEEP,
    SWEEP_START_ERROR,
    ("sweep_confirm_start", "sweep_discard_start"),
    "Already running: {running}. A second sweep's runs would take turns with these, one at a time.",
    "What was running has ended: a new sweep starts at once.",
    ("Start my sweep too", "Start my sweep"),
)


def render_confirmation() -> None:
    """Ask before starting the pending sweep beside what is running; confirming starts it and shows it."""
    SWEEP_QUESTION.render(_running_now, _confirm_start)


def _confirm_start() -> None:
    SWEEP_QUESTION.answer(lambda pending: _start(*pending), _show_sweep)


def _show_sweep(sweep: SweepRun) -> None:
    st.query_params["sweep"] = st.session_state["sweep_id"] = sweep.sweep_id


def _active_sweeps() -> list[SweepRun]:
    return [sweep for sweep in get_sweeps().values() if sweep.active]


def _describe_sweep(sweep: SweepRun) -> str:
    progress = sweep.progress()
    return f"sweep {sweep.sweep_id} is running, {progress.ended}/{progress.total} runs done"


def _running_now() -> list[str]:
    """A line for each sweep running in this server, then each active run that is none of theirs."""
    sweeps = _active_sweeps()
    ids = {sweep.sweep_id for sweep in sweeps}
    runner = get_runner()
    return [
        *map(_describe_sweep, sweeps),
        *(active_runs.describe(run, runner) for run in active_runs.active_runs(runner) if run.sweep_id not in ids),
    ]


def _start(plan: SweepPlan, inputs: Mapping[str, Any]) -> SweepRun:
    sweep = start_sweep(get_runner(), plan, launch_for(inputs))
    get_sweeps()[sweep.sweep_id] = sweep
    st.session_state[STARTED_SWEEPS] = [*st.session_state.get(STARTED_SWEEPS, ()), sweep.sweep_id]
    return sweep


def resume(sweep_id: str, inputs: Mapping[str, Any]) -> SweepRun:
    """Resume where the page's inputs say (this machine or their cluster), as they are set now."""
    sweep = resume_sweep(get_runner(), sweep_id, launch_for(inputs), inputs["credentials"])
    get_sweeps()[sweep.sweep_id] = sweep
    return sweep
