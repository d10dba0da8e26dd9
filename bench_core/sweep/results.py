"""A sweep's results from the history: its finished runs, each point's statistics over its repeats
(n, mean, std, range and 95% confidence interval per metric, the interval cut at the metric's physical
bounds and left out below `MIN_INTERVAL_RUNS` runs), and whether two points really differ; a tune's outcome
(`tune_result`).

Pure pandas on history rows (`History.load()`), with the plan for the swept settings; no I/O, no
streamlit. Only finished runs count: a cancelled or failed run measured too little to average.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..config import SLO
from ..hardware.client_bound import CLIENT_BOUND_RUNS
from ..hardware.contention import BUSY_RUNS
from ..hardware.run_flags import FLAGGED_RUNS
from ..measure.catalog import SWEPT_COLUMNS, acceptance_by_position, column_bounds, with_derived
from ..measure.draft_length import DraftAdvice, mean_rates
from ..measure.draft_length import draft_length_advice as measured_draft_advice
from ..measure.metrics import good_requests, rate
from ..measure.speculation_speedup import LoadSpeedup
from ..measure.stats import (
    GROUP_COLUMNS,
    MIN_INTERVAL_RUNS,
    TOO_FEW_FOR_INTERVAL,
    TOO_FEW_RUNS,
    compare,
    describe,
    group_values,
    paired_ratio,
)
from ..views.tables import PAIRED_METRICS, describe_column, paired_request_values, same_prompts
from .plan import SweepPlan, describe_point, server_settings_of
from .precision import CAPPED, REACHED, SHORT, describe_margin, describe_target
from .store import SWEEP_REPEAT, finished_runs, point_repeats
from .tune import Trial, Tune, best_trial, deploy_commands, front, space_size, tightest_bound, trials_with_values

POINT = "point"
METRIC = "metric"
# What a sweep is usually judged by (the catalog's swept metrics): throughput, latency as a user feels it,
# decode speed per user, goodput.
SWEEP_METRICS = SWEPT_COLUMNS
BEYOND_SPREAD = "beyond the run-to-run spread"
CACHE_START = "cache_start"  # the history column of the prefix cache's state at a run's start (Runner._start_cache)
NOT_RECORDED = "not recorded"
WITHIN_SPREAD = "within the run-to-run spread"


def sweep_runs(history_runs: pd.DataFrame, plan: SweepPlan) -> pd.DataFrame:
    """The sweep's finished runs with the catalog's derived metrics, the swept settings typed as the plan
    types them (the history reads 4 back as 4.0) and a `point` column naming each run's point."""
    names = _axis_names(plan)
    frame = with_derived(finished_runs(history_runs, plan))
    for axis in plan.axes:
        frame[axis.name] = pd.Series(
            [_plan_value(axis.values, cell) for cell in frame[axis.name]], index=frame.index, dtype=object
        )
    frame[POINT] = [describe_point({name: row[name] for name in names}) for _, row in frame.iterrows()]
    return frame


def with_slo(runs: pd.DataFrame, request_tables: Mapping[str, pd.DataFrame], slo: SLO) -> pd.DataFrame:
    """`sweep_runs` rows with goodput and SLO attainment recomputed for `slo` from each run's per-request
    table (by run id), so thresholds set after a sweep apply to it without running it again."""
    frame = runs.copy()
    good = []
    for run_id in frame["run_id"].astype(str):
        table = request_tables[run_id]
        good.append(int(good_requests(table["status"], table["ttft_s"], table["tpot_s"], table["e2e_s"], slo).sum()))
    frame["good_requests"] = good
    frame["goodput_rps"] = [rate(n, duration) for n, duration in zip(good, pd.to_numeric(frame["duration_s"]))]
    return with_derived(frame)


def point_statistics(runs: pd.DataFrame, plan: SweepPlan, metrics=SWEEP_METRICS) -> pd.DataFrame:
    """One row per point (in the plan's grid order) and metric with a value: the swept settings, `point`,
    `metric`, then n, mean, std, min, max, ci_low and ci_high (95%, within the metric's bounds; NaN below
    `MIN_INTERVAL_RUNS` runs) over the point's finished runs, and how many of them each flag marks
    (run_flags.FLAGGED_RUNS: on a busy machine, with a client that could not keep up)."""
    names = _axis_names(plan)
    rows = []
    for values in plan.grid():
        label = describe_point(values)
        part = runs[runs[POINT] == label] if POINT in runs else runs.iloc[0:0]
        flagged = [int(flags(part).sum()) for flags in FLAGGED_RUNS.values()]
        for metric in metrics:
            if metric not in part:
                continue
            summary = describe(pd.to_numeric(part[metric], errors="coerce"), bounds=column_bounds(metric))
            if summary.n:
                rows.append([*values.values(), label, metric, *group_values(summary), *flagged, cache_starts(part)])
    return pd.DataFrame(rows, columns=[*names, POINT, METRIC, *GROUP_COLUMNS, *FLAGGED_RUNS, CACHE_START])


def cache_starts(runs: pd.DataFrame) -> str:
    """The prefix cache's states the runs started with: "cold" where all did alike, "1 cold, 2 warm" otherwise,
    NOT_RECORDED for runs recorded before the state was."""
    states = runs[CACHE_START].dropna().astype(str) if CACHE_START in runs else pd.Series(dtype=str)
    counts = states[states != ""].value_counts(sort=False)
    if counts.empty:
        return NOT_RECORDED
    if len(counts) == 1:
        return str(counts.index[0])
    return ", ".join(f"{count} {state}" for state, count in counts.items())


def point_means(runs: pd.DataFrame, plan: SweepPlan, metrics: tuple[str, ...]) -> pd.DataFrame:
    """One row per point with a finished run: its swept settings, `point`, `n` (its runs), how many of them each
    flag marks and the mean of each of `metrics` over them, for charts that place a point once rather than each
    repeat."""
    names = _axis_names(plan)
    statistics = point_statistics(runs, plan, metrics)
    if statistics.empty:
        return pd.DataFrame(columns=[*names, POINT, "n", *FLAGGED_RUNS, *metrics])
    means = statistics.pivot_table(index=POINT, columns=METRIC, values="mean", sort=False)
    counts = statistics.groupby(POINT, sort=False)[["n", *FLAGGED_RUNS]].max()
    settings = statistics.drop_duplicates(POINT).set_index(POINT)[names]
    return settings.join(counts).join(means).reset_index()[[*names, POINT, "n", *FLAGGED_RUNS, *means.columns]]


def interval_note(statistics: pd.DataFrame) -> str:
    """What a reader must know of the intervals shown: always that they stop at the quantity's bounds, and
    which points ran too few times for one, so their band and table show the range of their runs."""
    note = "95% intervals stop at a quantity's physical bounds (a throughput or a latency is never below 0)."
    few = statistics[(statistics["n"] > 1) & (statistics["n"] < MIN_INTERVAL_RUNS)]
    if few.empty:
        return note
    points = ", ".join(dict.fromkeys(few[POINT]))
    return f"{note} {points}: {TOO_FEW_FOR_INTERVAL} is shown instead."


def precision_table(plan: SweepPlan, history_runs: pd.DataFrame) -> pd.DataFrame:
    """Per point of a sweep with a target (grid order): its settings, its finished runs, the margin of error of the
    target's metric over them and whether it reached the target, was stopped by the cap or is short of both."""
    names = _axis_names(plan)
    rows = [
        [*point.values.values(), point.standing.runs, describe_margin(point.standing), point.standing.outcome]
        for point in point_repeats(plan, history_runs)
    ]
    return pd.DataFrame(rows, columns=[*names, "runs", "margin of error", "outcome"])


def precision_summary(plan: SweepPlan, history_runs: pd.DataFrame) -> str:
    """Which points reached the target and which the cap stopped (with their runs and margins), and which are short
    of both because the sweep stopped before them; "" for a sweep without a target."""
    if plan.precision is None:
        return ""
    points = point_repeats(plan, history_runs)
    parts = []
    for outcome in (REACHED, CAPPED, SHORT):
        mine = [point for point in points if point.standing.outcome == outcome]
        if mine:
            listed = "; ".join(
                f"{describe_point(point.values)} ({point.standing.runs} runs, {describe_margin(point.standing)})"
                for point in mine
            )
            parts.append(f"{outcome.capitalize()} at {len(mine)} point{'s' if len(mine) > 1 else ''}: {listed}")
    if any(not point.standing.settled for point in points):
        parts[-1] += " (the sweep stopped before them: resume it)"
    return ". ".join([f"Target {describe_target(plan.precision, plan.repeats)}", *parts]) + "."


def metric_points(statistics: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The rows of one metric, shaped as `stats.group_repeats` returns them (for the sweep charts)."""
    return statistics[statistics[METRIC] == metric].drop(columns=[METRIC]).reset_index(drop=True)


def statistics_for_display(statistics: pd.DataFrame) -> pd.DataFrame:
    """The point table as a reader wants it: metric titles with units, the runs' range and the interval
    as two columns each."""
    table = statistics.drop(columns=[POINT]).copy()
    table[METRIC] = [describe_column(name).title for name in table[METRIC]]
    return table.rename(
        columns={
            "min": "lowest run",
            "max": "highest run",
            "ci_low": "95% CI low",
            "ci_high": "95% CI high",
            BUSY_RUNS: "runs on a busy machine",
            CLIENT_BOUND_RUNS: "runs whose client could not keep up",
            CACHE_START: describe_column(CACHE_START).label.lower(),
        }
    )


def compare_points(runs: pd.DataFrame, point_a: str, point_b: str, metrics=SWEEP_METRICS) -> pd.DataFrame:
    """Point B against point A on every metric both have: means, difference, its 95% interval, Welch's
    p-value and the verdict: whether the difference is beyond the run-to-run spread of the repeats."""
    rows = []
    a_runs, b_runs = runs[runs[POINT] == point_a], runs[runs[POINT] == point_b]
    for metric in metrics:
        if metric not in runs:
            continue
        result = compare(pd.to_numeric(a_runs[metric], errors="coerce"), pd.to_numeric(b_runs[metric], errors="coerce"))
        if not (result.a.n and result.b.n):
            continue
        verdict = (
            TOO_FEW_RUNS if result.significant is None else (BEYOND_SPREAD if result.significant else WITHIN_SPREAD)
        )
        rows.append(
            {
                METRIC: describe_column(metric).title,
                "A mean": result.a.mean,
                "B mean": result.b.mean,
                "B - A": result.difference,
                "B - A (%)": result.relative * 100,
                "95% CI low": result.ci_low,
                "95% CI high": result.ci_high,
                "p-value": result.p_value,
                "runs (A, B)": f"{result.a.n}, {result.b.n}",
                "verdict": verdict,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            METRIC,
            "A mean",
            "B mean",
            "B - A",
            "B - A (%)",
            "95% CI low",
            "95% CI high",
            "p-value",
            "runs (A, B)",
            "verdict",
        ],
    )


def mean_with_interval(summary_row: pd.Series) -> str:
    """ "123.40 [118.00, 128.80]" (the 95% interval, within the metric's bounds), "123.40 (range 118.00..128.80)"
    for a point with too few runs for an interval, or just the mean for a point that ran once."""
    mean = f"{summary_row['mean']:.2f}"
    if not math.isnan(summary_row["ci_low"]):
        return f"{mean} [{summary_row['ci_low']:.2f}, {summary_row['ci_high']:.2f}]"
    if summary_row["n"] > 1:
        return f"{mean} (range {summary_row['min']:.2f}..{summary_row['max']:.2f})"
    return mean


def _axis_names(plan: SweepPlan) -> list[str]:
    return [axis.name for axis in plan.axes]


def _plan_value(values: tuple[Any, ...], cell: Any) -> Any:
    """The plan's own value equal to a history cell (None for an empty cell when the plan has None: the history reads
    an unset text setting back as "")."""
    missing = cell is None or cell == "" or (isinstance(cell, float) and math.isnan(cell)) or cell is pd.NA
    for value in values:
        if (value is None and missing) or (value is not None and not missing and value == cell):
            return value
    return cell


@dataclass(frozen=True)
class TuneResult:
    """What a tune found: its trials (with their values), the best feasible one (None: none kept every bound), the
    Pareto front of the objective against the tightest bound's metric, how much of the space it tried, and how to
    deploy the best point (tune.deploy_commands; the CLI adds our own command that reproduces it)."""

    tune: Tune
    trials: list[Trial]
    best: Trial | None
    front: pd.DataFrame
    tightest: str  # the tightest bound's metric, "" without bounds
    space: int
    deploy: list[tuple[str, str]]
    best_config: Any = None  # the best point's RunConfig

    @property
    def tried(self) -> int:
        return len({describe_point(trial.point) for trial in self.trials})


def tune_result(plan: SweepPlan, journal: pd.DataFrame, history_runs: pd.DataFrame) -> TuneResult:
    """A tune's outcome from its journal (store.trials_of) and the history's rows (`History.load()`)."""
    assert plan.tune is not None, "only a tune has a tune's outcome"
    tune = plan.tune
    trials = trials_with_values(journal, history_runs, tune)
    best = best_trial(trials, tune)
    config = plan.config_at(best.point) if best is not None else None
    deploy = deploy_commands(config, plan.server_cmd, server_settings_of(config)) if config is not None else []
    tightest = tightest_bound(trials, tune)
    return TuneResult(
        tune,
        trials,
        best,
        front(trials, tune),
        tightest.metric if tightest else "",
        space_size(plan.axes),
        deploy,
        config,
    )


DRAFT_AXIS = "speculative_num_draft_tokens"
# The acceptance length a run reports: the engine's own count, else the server's.
_ACCEPTANCE_LENGTH = ("spec_acceptance_length", "mean_spec_accept_length")


def draft_length_advice(runs: pd.DataFrame, plan: SweepPlan) -> list[tuple[str, DraftAdvice | None]]:
    """For a sweep over the draft length: at each load (each point of the other axes, "" where there are none), the
    draft length advised from the runs' acceptance by position and step times (measure.draft_length), None where the
    runs cannot say (one draft length, no per-position rates); empty for any other sweep."""
    names = _axis_names(plan)
    if DRAFT_AXIS not in names or runs.empty:
        return []
    others = [name for name in names if name != DRAFT_AXIS]
    advice = []
    loads = list(dict.fromkeys(describe_point({name: values[name] for name in others}) for values in plan.grid()))
    for load in loads:
        part = runs[[describe_point({name: row[name] for name in others}) == load for _, row in runs.iterrows()]]
        points = part.groupby(DRAFT_AXIS, sort=True)
        draft = [int(k) for k in points.groups]
        tpot = [float(pd.to_numeric(group["mean_tpot_ms"], errors="coerce").mean()) / 1e3 for _, group in points]
        length = [_acceptance_length(group) for _, group in points]
        rates = mean_rates([acceptance_by_position(row) for row in part.to_dict("records")])
        found = None if rates is None else measured_draft_advice(draft, tpot, length, rates)
        advice.append((load, found))
    return advice


def _acceptance_length(runs: pd.DataFrame) -> float:
    for column in _ACCEPTANCE_LENGTH:
        if column in runs and (values := pd.to_numeric(runs[column], errors="coerce").dropna()).size:
            return float(values.mean())
    return math.nan


def describe_draft_advice(load: str, advice: DraftAdvice | None) -> str:
    """The advisor's sentence at one load, or why it has none."""
    if advice is None:
        at = f" at {load}" if load else ""
        return (
            f"No draft length advised{at}: that needs two draft lengths or more with TPOT (--stream-output) and the "
            "acceptance by draft position, whose step times (TPOT × acceptance length) extend to a positive plain step."
        )
    return advice.sentence(load)


def speedup_by_load(
    runs: pd.DataFrame, request_tables: Mapping[str, pd.DataFrame], plan: SweepPlan
) -> list[LoadSpeedup]:
    """For a sweep that sets each point with speculation against it without (plan.speculation_pairing): at each load
    (each point of the other axis, in the plan's order), the paired metrics' ratios with over without, over the
    requests of every repeat whose two runs served the same prompts (`request_tables`: run id -> its requests); empty
    for any other sweep."""
    pairing = plan.speculation_pairing
    if pairing is None or runs.empty:
        return []
    paired, off, on = pairing
    others = [axis.name for axis in plan.axes if axis.name != paired]
    speedups = []
    for values in plan.grid():
        if values[paired] != off:
            continue
        load = {name: values[name] for name in others}
        at_load = runs[[all(row[name] == value for name, value in load.items()) for _, row in runs.iterrows()]]
        without, with_ = (_run_by_repeat(at_load, paired, wanted) for wanted in (off, on))
        pairs = [
            (request_tables[without[repeat]], request_tables[with_[repeat]])
            for repeat in sorted(without.keys() & with_.keys())
            if without[repeat] in request_tables and with_[repeat] in request_tables
        ]
        pairs = [(a, b) for a, b in pairs if same_prompts(a, b)]
        ratios = {}
        for key in PAIRED_METRICS:
            found = [paired_request_values(key, a, b) for a, b in pairs]
            if found and all(side is not None for side in found):
                without_values, with_values = zip(*found)
                ratios[key] = paired_ratio(np.concatenate(without_values), np.concatenate(with_values))
        speedups.append(LoadSpeedup(describe_point(load), next(iter(load.values()), None), len(pairs), ratios))
    return speedups


def _run_by_repeat(runs: pd.DataFrame, axis: str, value: Any) -> dict[int, str]:
    """The run id of each repeat of the runs at `value` of `axis`."""
    chosen = runs[[cell == value for cell in runs[axis]]]
    return {int(repeat): str(run_id) for repeat, run_id in zip(chosen[SWEEP_REPEAT], chosen["run_id"])}
