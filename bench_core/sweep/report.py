"""A sweep's results as the Sweep page draws them, and as one self-contained HTML file (views.report): the metric
against the swept settings inside its confidence band, the Pareto views, goodput against load, the per-point table,
or for a find-max search each point's probes, or for a tune its best point, deployment, Pareto front and trials. The page picks one view at a time; the report holds every view at
the page's first choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import pandas as pd
import plotly.graph_objects as go

from ..config import SLO, Part, of_part
from ..measure.catalog import NOT_REPORTED, SPECULATIVE_COLUMNS
from ..measure.draft_length import MODEL_NOTE
from ..measure.metrics import slo_is_set
from ..measure.speculation_speedup import describe_speedups
from ..store.history import ENVIRONMENT_PREFIX, History
from ..views import acceptance_charts, report, sweep_charts, tune_charts
from ..views.figures import notes_under_title
from ..views.run_diff import SETTING_NAMES
from ..views.tables import describe_column, describe_slo
from . import find_max
from . import results as sweep_results
from .estimate import describe_seconds
from .plan import SweepPlan, describe_point
from .precision import describe_target
from .store import point_text, probes_of, trials_of
from .tune import describe_best, trial_table

LOAD_SETTINGS = ("concurrency", "request_rate", "max_concurrency")
# (title, x, y) of the throughput-against-latency views; both columns have a better direction.
PARETO_VIEWS = {
    "Output tok/s against P99 TTFT": ("p99_ttft_ms", "output_throughput"),
    "Tok/s per user against tok/s in total": ("output_throughput", "output_throughput_per_user"),
    "Output tok/s against mean E2E latency": ("mean_e2e_ms", "output_throughput"),
}
GOODPUT_METRICS = ("slo_attainment", "goodput_rps")
DEFAULT_METRIC = "output_throughput"
RESULTS_HEADING = "means over each point's repeats, with 95% intervals"
POINT_TABLE_COLUMNS = "n runs, mean, sample std, the range of the runs and the 95% confidence interval of the mean"
PRECISION_TABLE_TITLE = "Repeats until the target: each point's runs, its margin of error and whether it reached it"


def describe_repeats(plan: SweepPlan) -> str:
    """How often each point runs: "3 repeat(s) per point", "repeated until ±5% (95% interval) on ...", or "" for a
    search (each load once)."""
    if plan.find_max:
        return ""
    if plan.precision:
        return f"repeated until {describe_target(plan.precision, plan.repeats)}"
    return f"{plan.repeats} repeat(s) per point"


def goodput_slo(plan: SweepPlan, slo: SLO | None) -> SLO:
    """The SLO a sweep's goodput is for: a find-max search's own (its probes met it or not); else `slo` (the
    page's) where it sets a threshold, else the one its runs had."""
    return slo if slo_is_set(slo) and not plan.find_max else plan.base.slo


def measured_metrics(statistics: pd.DataFrame) -> list[str]:
    """The sweep metrics the point statistics hold, in the catalog's order."""
    return [name for name in sweep_results.SWEEP_METRICS if name in set(statistics[sweep_results.METRIC])]


def unreported_note(plan: SweepPlan, measured: list[str]) -> str:
    """Which speculative decoding figures the engine did not report for a speculative sweep, or "" (a server's
    figures: the per-point table says which it reported)."""
    unreported = [
        describe_column(name).title
        for name in plan.speculative_columns
        if name in SPECULATIVE_COLUMNS and name not in measured
    ]
    if not unreported:
        return ""
    return (
        f"{' and '.join(unreported)}: {NOT_REPORTED} by the engine for these runs (LMDeploy's PyTorch engine "
        "reports them on the engine API load pattern)."
    )


def plan_notes(plan: SweepPlan) -> list[str]:
    """What every chart of the sweep says under its title beside its own axes: a search's bounds and budget, and the
    settings of the servers the sweep started that no axis shows."""
    notes = []
    if plan.find_max:
        notes.append(describe_search(plan.find_max))
    if plan.server_cmd:
        fixed = plan.fixed_server_settings()
        notes.append("A server started per run" + (f", with {describe_point(fixed)}" if fixed else ""))
    return notes


def describe_search(search: find_max.FindMax) -> str:
    """ "Search: max_concurrency from 1 up to 64, within 10%, at most 40 probes and 24 h 00 min a point"."""
    return (
        f"Search: {search.setting} from {search.start:g} up to {search.limit:g}, within {search.precision:.0%}, at most "
        f"{search.max_probes:,} probes and {describe_seconds(search.max_time_s).removeprefix('about ')} a point"
    )


def noted(fig: go.Figure, plan: SweepPlan) -> go.Figure:
    """`fig` with the plan's notes (`plan_notes`) under its title."""
    notes_under_title(fig, plan_notes(plan))
    return fig


def metric_figures(statistics: pd.DataFrame, plan: SweepPlan, metric: str) -> list[go.Figure]:
    """`metric` against the first swept setting in its band, one line per value of the second; with a grid of two, the
    heatmap over both too."""
    axes = [axis.name for axis in plan.axes]
    points = sweep_results.metric_points(statistics, metric)
    band = sweep_charts.metric_vs_knob_band(points, axes[0], metric, axes[1] if len(axes) > 1 else None)
    if len(axes) != 2:  # a tune's space may have more: a heatmap holds two
        return [noted(band, plan)]
    return [noted(band, plan), noted(sweep_charts.knob_heatmap(points, axes[0], axes[1], metric), plan)]


def pareto_figure(runs: pd.DataFrame, plan: SweepPlan, view: str) -> go.Figure:
    x, y = PARETO_VIEWS[view]
    points = sweep_results.point_means(runs, plan, (x, y))  # a point's repeats: one
    return noted(sweep_charts.pareto_chart(points, x, y), plan)


def goodput_figure(
    runs: pd.DataFrame, plan: SweepPlan, load: str, goodput: str, target: float | None, slo: SLO
) -> go.Figure:
    """Goodput against the swept load for `slo` (goodput_slo), the plan's notes under the SLO."""
    return noted(sweep_charts.goodput_vs_load(runs, load, goodput, target, describe_slo(slo)), plan)


def load_axis(plan: SweepPlan) -> str | None:
    """The swept load setting goodput is charted against, or None."""
    return next((axis.name for axis in plan.axes if axis.name in LOAD_SETTINGS), None)


def has_goodput(runs: pd.DataFrame) -> bool:
    return "good_requests" in runs and not runs["good_requests"].isna().all()


@dataclass(frozen=True)
class ProbedPoint:
    """A find-max point: its heading (the highest load that met the target), its probes' chart and table."""

    heading: str
    figure: go.Figure
    probes: pd.DataFrame


def probed_points(history: History, plan: SweepPlan) -> list[ProbedPoint]:
    probes = probes_of(history, plan.sweep_id)
    search = plan.find_max
    shown = []
    for point in plan.grid():
        mine = probes[probes["point"] == point_text(point)].reset_index(drop=True)
        best = find_max.found([find_max.Probe(load, met) for load, met in zip(mine["load"], mine["met"])])
        where = f" at {describe_point(point)}" if point else ""
        found = f"{best:g}" if best is not None else "none"
        shown.append(
            ProbedPoint(
                f"Highest {search.setting}{where} meeting the target: {found}",
                sweep_charts.find_max_probes(
                    mine, search.setting, search.target, best, describe_slo(plan.base.slo), plan_notes(plan)
                ),
                mine.drop(columns="point"),
            )
        )
    return shown


def draft_length_blocks(runs: pd.DataFrame, plan: SweepPlan) -> list[report.Block]:
    """For a sweep over the draft length: at each load, the advisor's sentence and its chart (predicted and measured
    TPOT by draft length, the advised one marked), then the model it assumes; none for another sweep."""
    advised = sweep_results.draft_length_advice(runs, plan)
    blocks: list[report.Block] = []
    for load, advice in advised:
        blocks.append(report.Note(sweep_results.describe_draft_advice(load, advice)))
        if advice is not None:
            blocks.append(acceptance_charts.draft_length_figure(advice, load))
    if any(advice for _, advice in advised):
        blocks.append(report.Note(MODEL_NOTE))
    return blocks


def request_tables(history: History, runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The stored requests of each of `runs` that measured any."""
    return {run_id: history.requests(run_id) for run_id in runs["run_id"].astype(str) if history.measured(run_id)}


SPEEDUP_TITLE = "Speculation against none, by load: with over without, request by request, mean ratio (95% interval)"


def speedup_blocks(
    runs: pd.DataFrame, plan: SweepPlan, request_tables: Mapping[str, pd.DataFrame]
) -> list[report.Block]:
    """For a sweep with --against-no-speculation: where speculation paid and stopped paying (a sentence), TPOT with
    over without by load (a chart) and every paired metric's ratio by load (a table); none for another sweep."""
    pairing = plan.speculation_pairing
    if pairing is None:
        return []
    speedups = sweep_results.speedup_by_load(runs, request_tables, plan)
    load = ", ".join(axis.name for axis in plan.axes if axis.name != pairing[0]) or "point"
    return [
        report.Note(describe_speedups(speedups)),
        acceptance_charts.speedup_by_load_figure(speedups, load),
        report.Table(SPEEDUP_TITLE, acceptance_charts.speedup_table(speedups, load)),
    ]


def sweep_sections(
    history: History,
    plan: SweepPlan,
    runs: pd.DataFrame,
    slo: SLO,
    targets: Mapping[str, float | None],
    rerun: str = "",
) -> tuple[list[report.Section], list[str]]:
    """The report's sections and caveats for the sweep's finished `runs` (sweep_results.sweep_runs, with the goodput
    of `slo` where one is set); a goodput chart draws the target of `targets` the user set for it, if any; a tune's
    best point shows `rerun`, the command that runs it again, where given."""
    if plan.find_max:
        return [
            report.Section(point.heading, (point.figure, report.Table("Probes", point.probes)))
            for point in probed_points(history, plan)
        ], []
    if plan.tune:
        return tune_sections(history, plan, runs, rerun), []
    if runs.empty:
        return [report.Section("Results", (report.Note("No run of this sweep has finished yet."),))], []
    statistics = sweep_results.point_statistics(runs, plan)
    measured = measured_metrics(statistics)
    caveats = [
        sweep_results.interval_note(statistics),
        *filter(None, [unreported_note(plan, measured), sweep_results.precision_summary(plan, runs)]),
    ]
    metric = DEFAULT_METRIC if DEFAULT_METRIC in measured else measured[0]
    charts: list[report.Block] = [
        *metric_figures(statistics, plan, metric),
        *(pareto_figure(runs, plan, view) for view in PARETO_VIEWS),
    ]
    load = load_axis(plan)
    if load is not None and has_goodput(runs):
        others = [axis for axis in plan.axes if axis.name != load]
        groups = (
            [(f"{others[0].name} {value}", runs[runs[others[0].name] == value]) for value in others[0].values]
            if others
            else [("", runs)]
        )
        for goodput in GOODPUT_METRICS:
            for where, shown in groups:
                figure = goodput_figure(shown, plan, load, goodput, targets.get(goodput), slo)
                if where:
                    figure.update_layout(title_text=f"{figure.layout.title.text}, at {where}")
                charts.append(figure)
    charts += draft_length_blocks(runs, plan)
    if plan.speculation_pairing is not None:
        charts += speedup_blocks(runs, plan, request_tables(history, runs))
    table = report.Table(f"Per point: {POINT_TABLE_COLUMNS}", sweep_results.statistics_for_display(statistics))
    precision = (
        [report.Table(PRECISION_TABLE_TITLE, sweep_results.precision_table(plan, runs))] if plan.precision else []
    )
    return [
        report.Section(f"Results of {len(runs)} finished runs: {RESULTS_HEADING}", charts),
        report.Section("Per point", (*precision, table)),
    ], caveats


def tune_sections(history: History, plan: SweepPlan, runs: pd.DataFrame, rerun: str = "") -> list[report.Section]:
    """A tune's report: the best point with its interval and how to deploy it (and `rerun`, the command that runs it
    again, where given), how much of the space it tried, the Pareto front of the objective against the tightest
    bound, every trial, and each point's statistics."""
    assert plan.tune is not None
    outcome = sweep_results.tune_result(plan, trials_of(history, plan.sweep_id), history.load())
    tune = plan.tune
    best = (
        [report.Note(f"Best: {describe_best(outcome.best, tune, describe_point(outcome.best.point))}")]
        + [report.Note(f"{what}: {text}") for what, text in outcome.deploy]
        + ([report.Note(f"run it again: {rerun}")] if rerun else [])
        if outcome.best is not None
        else [report.Note("No trial kept every bound: no best point.", caveat=True)]
    )
    tried = report.Note(f"Tried {outcome.tried} of the space's {outcome.space} points; {tune.describe()}.")
    trials = trial_table(outcome.trials, tune)
    front = tune_front_figure(outcome, plan)
    charts: list[report.Block] = [front] if front is not None else []
    sections = [
        report.Section("Best point", (*best, tried)),
        report.Section("Trials", (*charts, report.Table("Every trial, in the order it ran", trials))),
    ]
    if not runs.empty:
        statistics = sweep_results.point_statistics(runs, plan)
        sections.append(
            report.Section(
                "Per point",
                (report.Table(f"Per point: {POINT_TABLE_COLUMNS}", sweep_results.statistics_for_display(statistics)),),
            )
        )
    return sections


def tune_front_figure(outcome: sweep_results.TuneResult, plan: SweepPlan) -> go.Figure | None:
    """The tune's trials that ran to their end, its objective against its tightest bound's metric (the bound drawn,
    the best trial marked); None without a bound other than the objective, or before a trial ended."""
    tune = outcome.tune
    bound = next((bound for bound in tune.bounds if bound.metric == outcome.tightest), None)
    trials = trial_table([trial for trial in outcome.trials if not trial.stopped_early], tune)
    if bound is None or bound.metric == tune.objective or trials.empty:
        return None
    best = outcome.best.number if outcome.best is not None else None
    return noted(tune_charts.tune_front_chart(trials, bound.metric, tune.objective, bound.limit, best), plan)


def sweep_report(
    history: History,
    plan: SweepPlan,
    history_runs: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    status: str = "",
    created: datetime | None = None,
    slo: SLO | None = None,
    targets: Mapping[str, float | None] | None = None,
    rerun: str = "",
) -> str:
    """The report of a sweep: its finished `runs` as the page shows them (sweep_results.sweep_runs of the history's
    rows `history_runs`, by default; with_slo where the page's SLO, `slo`, recomputed goodput), with the goodput
    targets the page set (`targets`, by goodput metric; none by default); a tune's with `rerun` (sweep_sections)."""
    runs = sweep_results.sweep_runs(history_runs, plan) if runs is None else runs
    used = goodput_slo(plan, slo)
    sections, caveats = sweep_sections(history, plan, runs, used, targets or {}, rerun)
    model = plan.base.engine.model or "the model each server serves"
    summary = " · ".join(
        filter(
            None,
            [
                status,
                f"{model} on {plan.base.engine.backend}",
                ", ".join(f"{axis.name} = {', '.join(str(value) for value in axis.values)}" for axis in plan.axes),
                describe_repeats(plan),
                *plan_notes(plan),
                _goodput_summary(plan, runs, used, targets or {}),
            ],
        )
    )
    recorded = (
        history_runs[history_runs["run_id"].astype(str).isin(set(runs["run_id"].astype(str)))]
        if not runs.empty
        else history_runs.iloc[0:0]
    )
    if recorded.empty:
        settings = environment = pd.DataFrame()
    else:  # each point once, each machine once: repeats share their settings and, mostly, their environment
        # The SLO the report's goodput is for, which the page may have set after the runs.
        recorded = recorded.assign(**{setting.key: getattr(used, setting.name) for setting in of_part(Part.SLO)})
        settings = report.settings_table(_distinct(recorded, [name for name in SETTING_NAMES if name in recorded]))
        environment = report.environment_table(
            _distinct(recorded, [name for name in recorded.columns if name.startswith(ENVIRONMENT_PREFIX)])
        )
    return report.build_report(
        report.Report(
            "Tune" if plan.tune else "Sweep", [plan.sweep_id], caveats, sections, settings, environment, summary
        ),
        created,
    )


def _distinct(rows: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return rows.drop_duplicates(subset=columns) if columns else rows.iloc[:1]


def _goodput_summary(plan: SweepPlan, runs: pd.DataFrame, slo: SLO, targets: Mapping[str, float | None]) -> str:
    """The SLO and target the report's goodput views use, or "" where it has none."""
    if plan.find_max:
        return f"good requests: {describe_slo(slo)}; target attainment {plan.find_max.target:g}"
    if load_axis(plan) is None or not has_goodput(runs):
        return ""
    set_targets = [
        f"{describe_column(goodput).title} ≥ {target:g}" for goodput, target in targets.items() if target is not None
    ]
    return f"good requests: {describe_slo(slo)}; target: {', '.join(set_targets) or 'none set'}"
