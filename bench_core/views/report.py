"""One self-contained HTML file for a run, a comparison or a sweep: what its page shows, to hand on.

Plotly's own JavaScript is inlined once and every chart draws with it, so the file opens offline, years later: a
report that loads its script from a CDN stops drawing when the CDN moves. Everything from outside (run names and
labels, model paths, prompts, error messages) is escaped, since the file is HTML a browser runs: tables go through
pandas' escaping, texts through html.escape, and plotly writes its figures' JSON with "<" escaped.

`build_report` is pure: it takes the figures, tables and texts a page builds and returns the HTML. The kinds'
sections (`run_sections`, `comparison_sections`, bench_core.sweep.report) use the pages' own chart and table builders.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io
import plotly.offline

from .. import __version__
from ..config import Part, RunConfig, format_value, of_part
from ..config.catalog import AUTO_SERVER_KIND
from ..engines import backend
from ..hardware.roofline import describe_roofline
from ..hardware.run_flags import run_flags
from ..load import find_dataset
from ..load.lengths import RANDOM_LENGTHS, describe_random_lengths
from ..measure.catalog import COMPARED_COLUMNS, lower_first
from ..redact import redact_text
from ..states import LoadPattern
from ..store.history import ENVIRONMENT_PREFIX
from ..store.run_parts import RunParts
from . import (
    acceptance_charts,
    compare_charts,
    quality_charts,
    run_charts,
    run_diff,
    server_charts,
    tables,
    timeline,
    workload_charts,
)

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       color: #1f2328; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; } h2 { font-size: 1.25rem; margin-top: 2rem;
     border-bottom: 1px solid #d0d7de; padding-bottom: 0.2rem; } h3 { font-size: 1rem; }
.meta { color: #59636e; } .caveat { background: #fff8c5; border-left: 4px solid #d4a72c; padding: 0.4rem 0.8rem;
        margin: 0.4rem 0; } .note { color: #59636e; font-size: 0.9rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #d0d7de; padding: 0.2rem 0.5rem; text-align: right; }
th:first-child, td:first-child { text-align: left; } thead th { background: #f6f8fa; }
.chart { margin: 0.5rem 0 1.5rem; }
"""


@dataclass(frozen=True)
class Table:
    """A table with its heading; its cells are written as the pages write them (tables.formatted), and coloured as
    they colour them where `marks` (tables.style_comparison's, the frame's shape) says."""

    title: str
    frame: pd.DataFrame
    marks: pd.DataFrame | None = None


@dataclass(frozen=True)
class Note:
    """A line of text; a caveat stands out, as a page's warning does."""

    text: str
    caveat: bool = False


Block = go.Figure | Table | Note


@dataclass(frozen=True)
class Section:
    title: str
    blocks: Sequence[Block] = field(default_factory=tuple)


@dataclass(frozen=True)
class Report:
    """What a report holds: its kind ("Run", "Comparison", "Sweep"), the runs (or sweep) it is about, the caveats a
    reader must see first, the sections, then the settings and the environment the numbers were measured with."""

    kind: str
    subjects: Sequence[str]
    caveats: Sequence[str]
    sections: Sequence[Section]
    settings: pd.DataFrame
    environment: pd.DataFrame
    summary: str = ""


def build_report(report: Report, created: datetime | None = None) -> str:
    """The report as one HTML document, with plotly's JavaScript in its one <script> and every chart drawn with it."""
    created = created or datetime.now().astimezone()
    title = f"{report.kind} {', '.join(report.subjects)}"
    body, charts = [], 0
    for section in report.sections:
        body.append(f"<h2>{_text(section.title)}</h2>")
        for block in section.blocks:
            if isinstance(block, go.Figure):
                charts += 1
                # Plotly's own template, whatever the process's default: in the dashboard's process Streamlit
                # makes its own the default, whose colours are placeholders its page swaps for the theme's
                # (#000001, #000002 ...), so a report saved there drew every series black.
                figure = go.Figure(block)
                figure.layout.template = plotly.io.templates["plotly"]
                body.append(
                    '<div class="chart">'
                    + figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{charts}")
                    + "</div>"
                )
            elif isinstance(block, Table):
                body.append(_table(block))
            else:
                body.append(f'<p class="{"caveat" if block.caveat else "note"}">{_text(block.text)}</p>')
    closing = [_table(Table("Settings", report.settings)), _table(Table("Environment", report.environment))]
    caveats = "".join(f'<p class="caveat">{_text(caveat)}</p>' for caveat in report.caveats)
    summary = f"<p>{_text(report.summary)}</p>" if report.summary else ""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_text(title)} · LLM Bench Studio</title>",
            f"<style>{_STYLE}</style>",
            f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>',
            "</head><body>",
            f"<h1>{_text(title)}</h1>",
            f'<p class="meta">LLM Bench Studio {_text(__version__)} · report written {_text(created.isoformat("T", "seconds"))}'
            f" · {charts} chart{'s' if charts != 1 else ''}</p>",
            summary,
            caveats,
            *body,
            "<h2>Settings and environment</h2>",
            *closing,
            "</body></html>",
        ]
    )


def _text(text: object) -> str:
    return html.escape(str(text), quote=True)


def _table(table: Table) -> str:
    if table.frame.empty:
        return f'<h3>{_text(table.title)}</h3><p class="note">none recorded</p>'
    frame = tables.formatted(table.frame)
    if table.marks is None:
        shown = frame.to_html(index=False, escape=True, border=0, na_rep=tables.MISSING)
    else:  # the row titles, a column of their own in `frame`, take no colour
        marks = tables.formatted(table.marks.rename_axis(table.frame.index.name)).set_axis(frame.columns, axis=1)
        marks.iloc[:, 0] = ""
        styled = tables.style_comparison(frame, marks).hide(axis="index")
        shown = styled.format(escape="html").format_index(escape="html", axis=1).to_html()
    return f"<h3>{_text(table.title)}</h3>{shown}"


# ---- settings and environment ---------------------------------------------------------------


def settings_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The compared settings that apply to at least one of the history rows `runs`, one column per run
    (tables.run_names), as the History page's "what differs" writes them; credentials in URLs masked."""
    runs = run_diff.with_output_length(runs)
    cells = run_diff.setting_cells(runs)
    applying = [name for name in run_diff.SETTING_NAMES if any(cell != run_diff.NOT_APPLICABLE for cell in cells[name])]
    table = run_diff.differences(runs, applying)
    return table.map(lambda cell: redact_text(cell) if isinstance(cell, str) else cell)


def environment_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The machine and software of each run (its history row's env_ columns), one column per run."""
    columns = [name for name in runs.columns if name.startswith(ENVIRONMENT_PREFIX)]
    table = pd.DataFrame(
        [[_cell(value) for value in runs[name]] for name in columns],
        index=[name.removeprefix(ENVIRONMENT_PREFIX) for name in columns],
        columns=tables.run_names(runs),
        dtype=object,
    )
    table.index.name = "environment"
    return table.map(lambda cell: redact_text(cell) if isinstance(cell, str) else cell)


def _cell(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


# ---- one run ---------------------------------------------------------------------------------


def describe_outcome(status: str, message: str, summary: Mapping[str, Any]) -> str:
    """One line: how the run ended and what its requests did (the Run page's status line)."""
    counts = (
        f"{summary['completed']}/{summary['total_requests']} requests succeeded in "
        f"{summary['duration_s']:.1f} s; {summary['failed']} failed, {summary['incomplete']} incomplete, "
        f"{summary['unfinished']} unfinished, {summary['cancelled']} cancelled"
    )
    if summary.get("overrun"):
        counts += f", {summary['overrun']} past their token limit"
    if summary.get("failure_reasons") and not message:
        counts += f" ({summary['failure_reasons']})"
    return f"{status}: {message}. {counts}." if message else f"{status}: {counts}."


def sentence(text: str) -> str:
    """`text` as a sentence's start: its first letter capital (a flag is written to follow a colon)."""
    return text[:1].upper() + text[1:]


def ended_latency_histograms(requests: pd.DataFrame, stream_output: bool) -> tuple[go.Figure, go.Figure]:
    """The two histograms of an ended run: TTFT and ITL when it streamed, else E2E latency and TPOT."""
    first, second = ("ttft", "itl") if stream_output else ("e2e", "tpot")
    return tuple(
        run_charts.latency_histogram(run_charts.successful_values(requests, metric), metric)
        for metric in (first, second)
    )


def run_caveats(parts: RunParts) -> list[str]:
    """What a reader must know before the numbers: its flags (a machine other processes kept busy, a client that
    could not keep up), the run's warnings and dataset notes, short prompts or requests all sent at once that make
    TTFT per 1,000 tokens meaningless, random weights."""
    flags = run_flags(parts.values, parts.row.get(f"{ENVIRONMENT_PREFIX}cpu_count"))
    caveats = [
        *(sentence(flag) for flag in flags),
        *parts.warnings,
        *(f"Dataset: {note}" for note in parts.notes),
    ]
    caveats.extend(tables.per_1k_input_caveats(parts.summary, parts.config.load))
    if parts.random_weights:
        caveats.append(
            "Random-weight run: the model's weights are random, so the timings are real and the text is not."
        )
    return caveats


def run_sections(parts: RunParts) -> list[Section]:
    """What the Run page shows of an ended run, in its order: latency and throughput tables, charts, the server's
    and the hardware's figures, the workload sent and the per-request table."""
    if parts.requests is None:
        return [Section("Outcome", (Note(f"{parts.status}: {parts.message}", caveat=True),))]
    config, summary = parts.config, parts.summary
    stream = config.load.stream_output
    results = [
        Note(describe_outcome(parts.status, parts.message, summary)),
        Table(
            "Latency (ms), successful requests, as LMDeploy reports it",
            tables.percentile_table(summary, config.percentiles, stream),
        ),
        Table("Throughput", tables.throughput_table(summary)),
    ]
    if config.engine.speculative_algorithm:
        results.append(Table("Speculative decoding", tables.speculative_table(summary)))
    if not (judged := tables.quality_table(summary)).empty:
        results.append(Table("Quality guard", judged))
    charts: list[Block] = []
    if "engine_acceptance_by_position" in summary:
        charts.append(acceptance_charts.acceptance_by_position_figure(summary))
    if "mean_request_acceptance_rate" in summary:
        charts.append(acceptance_charts.request_acceptance_histogram(parts.requests))
    charts += [
        *ended_latency_histograms(parts.requests, stream),
        timeline.request_timeline(parts.requests, end_s=parts.duration_s),
    ]
    if (divergence := quality_charts.divergence_histogram(parts.requests)) is not None:
        charts.append(divergence)
    if parts.throughput is not None:
        charts.append(run_charts.throughput_over_time(*parts.throughput, run_charts.steady_span(parts.summary)))
    sections = [Section("Results", results), Section("Charts", charts)]
    if parts.server_metrics is not None:
        sections.append(
            Section(
                "Server, from its own metrics",
                (
                    Table("Served", tables.quantity_table(parts.values, "served")),
                    server_charts.ended_server_metrics(parts.server_metrics, parts.requests, parts.duration_s),
                    *(
                        [acceptance_charts.acceptance_by_position_figure(parts.values)]
                        if acceptance_charts.describe_acceptance_by_position(parts.values) is not None
                        else []
                    ),
                ),
            )
        )
    workload: list[Block] = list(workload_charts.workload_figures(parts.requests))
    if (turns := workload_charts.ttft_by_turn(parts.requests)) is not None:
        workload.append(turns)
    if not (cache := tables.workload_metrics_table(summary)).empty:
        workload.append(Table("Prefix cache and turns", cache))
    sections.append(Section("Workload sent", workload))
    hardware: list[Block] = [Table("Sampled", tables.quantity_table(parts.values, "sampled"))]
    if parts.telemetry is not None:
        hardware.append(run_charts.telemetry_over_time(parts.telemetry))
    if parts.roofline is not None:
        hardware += [Note(line) for line in describe_roofline(parts.roofline)]
    sections.append(Section("Hardware", hardware))
    sections.append(Section("Requests", (Table("Per request", tables.requests_for_display(parts.requests)),)))
    return sections


def run_report(parts: RunParts, created: datetime | None = None) -> str:
    """The report of one ended run (or what a run that failed before measuring left)."""
    row = pd.DataFrame([parts.row])
    return build_report(
        Report(
            "Run",
            [parts.run_id],
            run_caveats(parts),
            run_sections(parts),
            settings_table(row),
            environment_table(row),
            f"{describe_config(parts.config)} · started {parts.started_at}",
        ),
        created,
    )


def describe_config(config: RunConfig) -> str:
    """One line: label, model and backend, dataset and load, so a screenshot says what was measured."""
    data, load = config.dataset, config.load
    ran = find_dataset(data.dataset_name)
    chosen = [
        declared
        for declared in of_part(Part.DATASET)
        if declared.per_dataset and ran is not None and ran.takes(declared) and config.value(declared.name) is not None
    ]
    # The span drawn, not the ratio to decode.
    random = (
        [describe_random_lengths(data.random_input_len, data.random_output_len, data.random_range_ratio)]
        if {declared.name for declared in chosen} >= set(RANDOM_LENGTHS)
        else []
    )
    lengths = (
        ", ".join(
            random
            + [
                f"{lower_first(declared.shown_label)} {format_value(config.value(declared.name))}"
                + (f" {declared.unit}" if declared.unit else "")
                for declared in chosen
                if not random or declared.name not in RANDOM_LENGTHS
            ]
        )
        or "conversation lengths"
    )
    engine = config.engine
    server = redact_text(engine.base_url)
    kind = "auto-detected" if engine.server_kind == AUTO_SERVER_KIND else engine.server_kind
    served = (
        f"{engine.model or 'the served model'} on the {kind} server at {server}"
        if not backend(engine.backend).in_process
        else f"{engine.model} on {engine.backend}"
    )
    if load.load_pattern == LoadPattern.REQUEST_RATE:
        cap = "no concurrency limit" if load.max_concurrency is None else f"max concurrency {load.max_concurrency}"
        limit = f", for at most {load.duration_s:g} s" if load.duration_s else ""
        shape = f"{load.request_rate:g} req/s, burstiness {load.burstiness:g}, {cap}{limit}"
    elif load.load_pattern == LoadPattern.TRACE:
        shape = f"the trace's times at {load.trace_speedup:g}x, concurrency {load.concurrency}"
    else:
        shape = f"concurrency {load.concurrency}"
    parts = [
        config.label,
        served,
        f"{data.num_prompts} {'sessions' if ran is not None and ran.counts_sessions else 'prompts'} from {data.dataset} "
        f"({data.dataset_name}, {lengths})",
        f"{load.load_pattern} load, {shape}, {'streamed' if load.stream_output else 'not streamed'}",
    ]
    return " · ".join(part for part in parts if part)


# ---- several runs ----------------------------------------------------------------------------

RUN = compare_charts.RUN  # the compared runs' names (run_diff.compared_names), a column to colour by
BASELINE = "baseline"
REPEATS = "Runs of its setup"
COMPARE_NOTE = (
    "Each run's value, and beside it its change against the baseline's in %. Coloured and marked "
    f"{tables.BEYOND_NOISE_MARK}: a change beyond the run-to-run noise of the two setups (runs with the same "
    "settings are repeats of one; Welch's t-test, p < 0.05): green better, red worse, blue neither."
)
UNJUDGED_NOTE = (
    "No change here is judged against noise: that needs two setups each run twice or more, and a setup run once has "
    "no spread to judge by. Repeat the runs to have their changes judged."
)

PAIRED_TITLE = "Against the baseline, request by request"
PAIRED_NOTE = (
    "For runs of the baseline's prompts (a preset's pair, a run again): each metric's mean over the baseline's on the "
    "same requests, with its 95% interval from resampling the requests (a paired bootstrap). Below 1 a latency "
    "improved; above 1 a rate did."
)

POSITIONS_TITLE = "Acceptance by draft position (accepted / drafts at each position)"


def paired_against_baseline(
    chosen: pd.DataFrame, request_tables: Mapping[str, pd.DataFrame], baseline: str | None = None
) -> pd.DataFrame:
    """tables.paired_ratios against the run `baseline` (its run id; by default the oldest run) of `chosen`, the rows
    `compared_runs` gives, whose request tables are keyed by run name."""
    position = chosen["run_id"].astype(str).tolist().index(baseline or oldest_run(chosen))
    baseline_name = str(chosen[RUN].iloc[position])
    return tables.paired_ratios(request_tables, baseline_name, compare_charts.not_streamed(chosen))


def compared_runs(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """History rows as the comparison reads them (with the output length and a `RUN` name column), and the settings
    that differ between them."""
    chosen = run_diff.with_output_length(runs)
    varied = run_diff.differing_settings(chosen)
    # One name per run on every part of the comparison: what tells it apart, then who it is.
    return chosen.assign(**{RUN: run_diff.compared_names(chosen, varied)}), varied


def oldest_run(runs: pd.DataFrame) -> str:
    """The run id of the run that started first (the comparison's default baseline); the first row's where no start
    time was recorded."""
    started = pd.to_datetime(runs.get("started_at", pd.Series(index=runs.index)), errors="coerce", utc=True)
    return str(runs["run_id"].loc[started.idxmin()] if started.notna().any() else runs["run_id"].iloc[0])


def comparison_table(
    chosen: pd.DataFrame,
    varied: list[str],
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    groups: Sequence[int] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """The runs against the baseline (its run id; by default the oldest run), one column each (`tables.run_names`),
    the baseline's first: the settings that differ between them and how many runs each setup has where some has more
    than one, then the metrics (by default `measured_metrics`), with each run's change against the baseline
    (`tables.against_baseline`). `groups` numbers the runs' setups (by default run_diff.repeat_groups: runs sharing
    every setting). Returns the table, its marks and whether any change could be judged against noise (two setups
    each run twice or more)."""
    baseline = baseline or oldest_run(chosen)
    position = chosen["run_id"].astype(str).tolist().index(baseline)
    groups = run_diff.repeat_groups(chosen, varied) if groups is None else list(groups)
    names = tables.run_names(chosen)
    names[position] = f"{names[position]} ({BASELINE})"
    measured = measured_metrics(chosen) if metrics is None else list(metrics)
    metrics, marks = tables.against_baseline(chosen, measured, names, groups, position)
    settings = run_diff.differences(chosen, varied).set_axis(names, axis=1)
    runs_per_setup = pd.Series(groups).map(pd.Series(groups).value_counts())
    if runs_per_setup.max() > 1:
        settings.loc[REPEATS] = [str(count) for count in runs_per_setup]
    settings = settings[metrics.columns]
    table = pd.concat([settings, metrics])
    table.index.name = "run"
    marks = pd.concat([pd.DataFrame("", index=settings.index, columns=marks.columns, dtype=object), marks])
    marks.index.name = "run"
    judged = (pd.Series(groups).value_counts() > 1).sum() >= 2
    return table, marks, bool(judged)


def measured_metrics(chosen: pd.DataFrame) -> list[str]:
    """The compared metrics that any of the runs measured, the key ones first."""
    return [name for name in COMPARED_COLUMNS if name in chosen and _has_numbers(chosen[name])]


def _has_numbers(column: pd.Series) -> bool:
    return bool(pd.to_numeric(column, errors="coerce").notna().any())


def missing_distributions(missing: Sequence[str]) -> str:
    """Why some runs are not in the distributions, or ""."""
    if not missing:
        return ""
    return (
        f"No per-request data for {', '.join(missing)} (imported LMDeploy rows keep only their summary; a run "
        "that failed before measuring has none), so they are not in the distributions."
    )


def comparison_sections(
    chosen: pd.DataFrame,
    varied: list[str],
    request_tables: Mapping[str, pd.DataFrame],
    missing: Sequence[str],
    baseline: str | None = None,
) -> list[Section]:
    """What the History page's comparison shows, with its charts at their default choices and its table against
    `baseline` (a run id; by default the oldest run)."""
    differs: list[Block] = (
        [Table("What differs between these runs", run_diff.differences(chosen, varied))]
        if varied
        else [Note("These runs share every recorded setting: they are repeats of one configuration.")]
    )
    charts: list[Block] = []
    metrics = compare_charts.chartable_metrics(chosen)
    if metrics:
        metric = compare_charts.default_of(metrics, compare_charts.DEFAULT_METRIC)
        if varied:
            knob = run_diff.default_setting(chosen, varied)
            charts.append(compare_charts.metric_vs_knob(chosen, knob, metric, color=RUN))
        latencies = [name for name in metrics if name.endswith("_ms")]
        if latencies:
            latency = compare_charts.default_of(latencies, compare_charts.DEFAULT_LATENCY)
            charts.append(compare_charts.latency_vs_throughput(chosen, latency=latency, color=RUN))
    else:
        charts.append(Note("These runs have no metric in common to chart."))
    if note := missing_distributions(missing):
        charts.append(Note(note))
    if request_tables:
        unstreamed = compare_charts.not_streamed(chosen)
        charts += [compare_charts.cdf_overlay(request_tables, metric, unstreamed) for metric in ("ttft", "itl")]
    table, marks, judged = comparison_table(chosen, varied, baseline)
    side_by_side = [Table("Against the baseline", table, marks), Note(COMPARE_NOTE)]
    if not (paired := paired_against_baseline(chosen, request_tables, baseline)).empty:
        side_by_side += [Table(PAIRED_TITLE, paired), Note(PAIRED_NOTE)]
    if not (positions := acceptance_charts.position_table(chosen, chosen[RUN])).empty:
        side_by_side += [Table(POSITIONS_TITLE, positions), acceptance_charts.positions_by_run_figure(positions)]
    if not judged:
        side_by_side.append(Note(UNJUDGED_NOTE))
    return [Section("What differs", differs), Section("Charts", charts), Section("Side by side", side_by_side)]


def comparison_report(
    runs: pd.DataFrame,
    request_tables: Mapping[str, pd.DataFrame],
    missing: Sequence[str],
    created: datetime | None = None,
    baseline: str | None = None,
) -> str:
    """The report comparing the history rows `runs` (request tables by run name, tables.run_names), against the run
    `baseline` (by default the oldest)."""
    chosen, varied = compared_runs(runs)
    started = pd.to_datetime(runs.get("started_at", pd.Series(dtype=object)), errors="coerce", utc=True).dropna()
    span = f"started {started.min():%Y-%m-%d %H:%M} to {started.max():%Y-%m-%d %H:%M} UTC" if len(started) else ""
    summary = f"{len(runs)} runs: {', '.join(chosen[RUN])}" + (f" · {span}" if span else "")
    return build_report(
        Report(
            "Comparison",
            list(runs["run_id"].astype(str)),
            [],
            comparison_sections(chosen, varied, request_tables, missing, baseline),
            settings_table(runs),
            environment_table(runs),
            summary,
        ),
        created,
    )


def chart_count(document: str) -> int:
    """How many charts a report holds (the meta line says it): for tests and the CLI's last line."""
    return document.count('<div class="chart">')
