"""The Sweep page's Tune mode: which settings to run. The inputs of a tune (the settings to search and their values,
the objective and its direction, the bounds a trial must keep, the quality floors, the trial budget), which the
page starts, shows running and resumes as it does a sweep (the plan is a sweep plan with a tune, sweep_start builds
it); and a tune's results, live or past: the best point with its interval, the commands that deploy it and run it
again, how much of the space was tried, the Pareto front against the tightest bound, every trial, the HTML report.
The search is bench_core.sweep.tune's, run as the `tune` command runs it (sweep.driver.TuneRun).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from bench_core.cli import commands
from bench_core.cli.tune import engine_of
from bench_core.cli.tune import rerun_command as cli_rerun
from bench_core.config import SLO, setting
from bench_core.exports import SweepSubject
from bench_core.store.history import History
from bench_core.sweep import report as sweep_report
from bench_core.sweep import results as sweep_results
from bench_core.sweep import tune as tuning
from bench_core.sweep.plan import DEFAULT_AXIS, SweepPlan, describe_point
from bench_core.sweep.store import CREDENTIAL_SETTINGS, trials_of
from dashboard import sidebar, sweep_form, sweep_progress
from dashboard import sweep_results as sweep_results_view
from dashboard.exports_view import export_buttons
from dashboard.sweep_start import HERE
from dashboard.sweep_widgets import setting_label, title
from dashboard.table_view import show_table
from dashboard.text import plain

SWEEP, TUNE = "Sweep", "Tune"
# The settings a tune starts with, where the sidebar's engine has them: values to try that fit any model.
FIRST_SETTINGS = (DEFAULT_AXIS.name, "enable_prefix_caching")
DIRECTIONS = {"its better way": "", "maximise": "max", "minimise": "min"}
# The sidebar's SLO as bounds: a trial keeps it when its P99 of each latency with a threshold does.
SLO_BOUNDS = {"ttft": "p99_ttft_ms", "tpot": "p99_tpot_ms", "e2e": "p99_e2e_ms"}


def run_inputs(sidebar_values: Mapping[str, Any]) -> dict[str, Any]:
    """Sweep or Tune, and the inputs of the one chosen (a tune's under "tune", which sweep_start's plan takes)."""
    mode = st.radio(
        "Mode",
        (SWEEP, TUNE),
        horizontal=True,
        key="sweep_mode",
        help="A sweep runs every value of one or two settings. A tune searches several settings for the best "
        "objective within bounds (Optuna's TPE), running only the points it picks, and says how to deploy the best.",
    )
    return tune_inputs(sidebar_values) if mode == TUNE else sweep_form.sweep_inputs(sidebar_values)


def tune_inputs(sidebar_values: Mapping[str, Any]) -> dict[str, Any]:
    """The tune's search space (two or more settings the sidebar's backend, load pattern and dataset use, each with
    its values), objective, bounds, quality floors, budget and repeats, over the sidebar's settings."""
    backend = sidebar_values["backend"]
    options = sweep_form.settings_to_vary(sidebar_values)
    offered = [name for name in options if sweep_form.example_values(name, backend)]  # whose values start filled
    first = [name for name in FIRST_SETTINGS if name in offered] or offered[:2]
    names = st.multiselect(
        "Settings to tune",
        options,
        default=first,
        key="tune_settings",
        format_func=setting_label,
        help="The search space: every combination of these settings' values (tune --space NAME=V1,V2).",
    )
    columns = st.columns(3)
    axes = [
        (name, sweep_form._values_field(columns[index % len(columns)], name, f"tune_values_{name}", backend, []))
        for index, name in enumerate(names)
    ]
    objective_column, direction_column = st.columns([3, 2])
    objective = objective_column.selectbox(
        "Objective",
        sweep_results.SWEEP_METRICS,
        index=sweep_results.SWEEP_METRICS.index(tuning.DEFAULT_OBJECTIVE),
        key="tune_objective",
        format_func=title,
        help="The catalog metric the tune makes best (--objective).",
    )
    direction = direction_column.radio("Make it", list(DIRECTIONS), horizontal=True, key="tune_direction")
    bounds = _slo_bounds(sidebar.chosen_slo(sidebar_values))
    more = st.text_input(
        "More bounds",
        key="tune_bounds",
        placeholder="e.g. failed<=0 slo_attainment>=0.9",
        help="Bounds every trial must keep, METRIC<=LIMIT or METRIC>=LIMIT on catalog metrics in their shown units, "
        "separated by spaces or commas (--slo). A trial that breaks one is rejected.",
    )
    exact, accuracy, trials, repeats = st.columns(4)
    search, seed = st.columns(2)
    return {
        "axes": axes,
        "repeats": int(
            repeats.number_input(
                "Repeats", value=setting("repeats").default, step=1, key="tune_repeats", help="Runs per trial."
            )
        ),
        **sweep_form._run_size_inputs(backend, sidebar_values["dataset_name"]),
        "server_cmd": "",
        "server_settings": [],
        "find_max": None,
        "precision": None,
        **HERE,
        "credentials": {name: sidebar_values.get(name) or "" for name in CREDENTIAL_SETTINGS},
        "tune": {
            "objective": objective,
            "direction": DIRECTIONS[direction],
            "bounds": [*bounds, *filter(None, re.split(r"[\s,]+", more))],
            "trials": int(
                trials.number_input(
                    "Trials", value=tuning.DEFAULT_TRIALS, step=1, key="tune_trials", help="Points to try, at most."
                )
            ),
            "min_exact_match": _floor(
                exact, "Least exact-match rate", "tune_min_exact_match", "drift_exact_match_rate"
            ),
            "min_accuracy": _floor(accuracy, "Least accuracy", "tune_min_accuracy", "quality_accuracy"),
            "search": search.selectbox(
                "Search",
                tuning.SEARCHES,
                key="tune_search",
                help="How trials pick their points: Optuna's TPE, or at random, the baseline TPE must beat (--search).",
            ),
            "seed": int(
                seed.number_input(
                    "Search seed",
                    value=tuning.DEFAULT_SEED,
                    step=1,
                    key="tune_seed",
                    help="The search's seed: the same seed and trials pick the same points (--tune-seed).",
                )
            ),
        },
    }


def _slo_bounds(slo: SLO) -> list[str]:
    """The sidebar's SLO as the tune's bounds (P99 of each latency it sets), where the user keeps them."""
    bounds = [f"{column}<={getattr(slo, name) * 1000:g}" for name, column in SLO_BOUNDS.items() if getattr(slo, name)]
    if not bounds:
        st.caption("No SLO in the sidebar: set TTFT, TPOT or E2E under Goodput SLO to keep every trial within it.")
        return []
    keep = st.checkbox(
        plain(f"Keep every trial within the sidebar's SLO: {', '.join(bounds)}"),
        value=True,
        key="tune_within_slo",
        help="The sidebar's Goodput SLO thresholds, as bounds on each trial's P99 latencies.",
    )
    return bounds if keep else []


def _floor(where: Any, label: str, key: str, guard: str) -> float | None:
    shown = where.number_input(
        label,
        value=None,
        min_value=0.0,
        max_value=1.0,
        step=0.05,
        key=key,
        placeholder="none",
        help=f"The quality guard's floor on {guard} (a fraction): a trial below it is rejected like an SLO breach. "
        "Its runs need the sidebar's drift baseline or quality set.",
    )
    return None if shown is None else float(shown)


def render_sweep(sweep_id: str, slo: SLO, live: bool, runs: pd.DataFrame | None, inputs: Mapping[str, Any]) -> None:
    """The sweep or tune on show, as sweep_progress shows a sweep, with a tune's own results."""
    sweep_progress.render_sweep(sweep_id, slo, live, runs, inputs, results_view=results)


def results(history: History, plan: SweepPlan, runs: pd.DataFrame, slo: SLO) -> None:
    """A tune's outcome so far (a sweep's results are sweep_results'): best point, deployment, space tried, front,
    trials and downloads."""
    if plan.tune is None:
        sweep_results_view.results(history, plan, runs, slo)
        return
    outcome = sweep_results.tune_result(plan, trials_of(history, plan.sweep_id), runs)
    tune = plan.tune
    share = outcome.tried / outcome.space if outcome.space else math.nan
    st.markdown(f"**Tune**: {plain(tune.describe())}")
    st.caption(plain(f"Tried {outcome.tried} of the space's {outcome.space} points ({share:.0%})."))
    if not outcome.trials:
        st.info("No trial of this tune has ended yet.")
        return
    rerun = ""
    if outcome.best is None:
        st.warning("No trial kept every bound: no best point.")
    else:
        st.success(plain(f"Best: {tuning.describe_best(outcome.best, tune, describe_point(outcome.best.point))}"))
        rerun = rerun_command(outcome, plan)
        st.markdown("**Deploy it**")
        if not outcome.deploy:
            st.caption(
                plain(f"The {plan.base.engine.backend} backend has no server or engine config of its own to deploy.")
            )
        for what, text in [*outcome.deploy, ("run it again with this project's CLI", rerun)]:
            st.caption(plain(what))
            st.code(text, language="bash")
    front = sweep_report.tune_front_figure(outcome, plan)
    if front is not None:
        st.plotly_chart(front, key="tune_chart_front")
    st.markdown("**Every trial**, in the order it ran")
    show_table(tuning.trial_table(outcome.trials, tune), key="tune_trials_table")
    tune_runs = sweep_results.sweep_runs(runs, plan)
    export_buttons(SweepSubject(history, plan, runs, tune_runs, slo=slo, rerun=rerun))


def rerun_command(outcome: sweep_results.TuneResult, plan: SweepPlan) -> str:
    """The CLI command that runs the best point again, as the `tune` command prints it."""
    engine = next(command for command in commands() if command.name == engine_of(plan.base))
    return cli_rerun(outcome, plan, engine)
