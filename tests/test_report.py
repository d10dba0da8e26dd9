"""The HTML report of a run, a comparison and a sweep (views.report, sweep.report): every chart a div drawn by the
one inlined copy of plotly's JavaScript, nothing fetched from a network, the tables, the settings and the environment,
and text from outside escaped. Built from real profilers recorded into a real history."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
import pytest
from profiled_runs import profiled_run
from streamlit.elements.lib.streamlit_plotly_theme import configure_streamlit_plotly_theme

from bench_core import csvstore
from bench_core.cli.common import ExportRequest, write_exports
from bench_core.config import SLO, EngineConfig, LoadConfig, RunConfig
from bench_core.errors import ConfigError
from bench_core.exports import ComparisonSubject, RunSubject, SweepSubject, export
from bench_core.hardware.contention import BUSY_SHARE_COLUMN, OTHER_CORES_COLUMN
from bench_core.store.history import History, RunRecord, lmdeploy_row_of
from bench_core.store.history_import import lmdeploy_hyperparams
from bench_core.store.run_parts import request_tables, run_parts
from bench_core.sweep import results as sweep_results
from bench_core.sweep.plan import SweepPlan, parse_sweep_arg
from bench_core.sweep.report import sweep_report
from bench_core.sweep.store import save_plan
from bench_core.views import report, tables
from bench_core.views.figures import PALETTE

HOSTILE_LABEL = '<script>alert("label")</script>'
HOSTILE_MODEL = "/models/</table><img src=x onerror=alert(1)>"
ENVIRONMENT = {"gpu_name": "none", "python": "3.12.1", "hostname": "<b>bench-host</b>", "app_version": "0.1.0"}
PLOTLY_JS = plotly.offline.get_plotlyjs()


def record(
    history: History,
    run_id: str,
    concurrency: int,
    ttfts: list[float],
    label: str = "",
    model: str = "",
    sweep_id: str = "",
    repeat: int | None = None,
) -> None:
    prof = profiled_run(ttfts)
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model=model or "builtin:tiny-llama"),
        load=LoadConfig(concurrency=concurrency, stream_output=True),
        label=label,
    )
    history.record(
        RunRecord(
            run_id=run_id,
            started_at="2026-11-30T08:00:00+00:00",
            status="finished",
            config=config,
            lmdeploy_columns=prof.lmdeploy_csv_row(lmdeploy_hyperparams(config)),
            metrics=prof.summary(),
            requests=prof.request_table(),
            environment=ENVIRONMENT,
            sweep_id=sweep_id,
            sweep_repeat=repeat,
        )
    )


@pytest.fixture
def history(tmp_path) -> History:
    history = History(tmp_path)
    record(history, "run-a", 2, [0.1, 0.2, 0.3], label=HOSTILE_LABEL, model=HOSTILE_MODEL)
    record(history, "run-b", 4, [0.2, 0.4])
    return history


def assert_self_contained(document: str, charts: int) -> None:
    """Plotly's script once, one div per chart, no script or stylesheet from elsewhere."""
    assert document.count(PLOTLY_JS[:500]) == 1
    assert [int(n) for n in re.findall(r'<div id="chart-(\d+)"', document)] == list(range(1, charts + 1))
    assert report.chart_count(document) == charts
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=", document, re.IGNORECASE)
    assert document.count("<script") == 1 + charts  # plotly's, then one newPlot per chart


def assert_escaped(document: str) -> None:
    assert HOSTILE_LABEL not in document and "alert(&quot;label&quot;)" in document
    assert "<img src=x" not in document and "&lt;img src=x onerror=alert(1)&gt;" in document
    assert "<b>bench-host</b>" not in document and "&lt;b&gt;bench-host&lt;/b&gt;" in document


def test_the_builder_inlines_plotly_once_and_escapes_every_text():
    figures = [
        go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name=HOSTILE_LABEL)).update_layout(title_text=HOSTILE_LABEL),
        go.Figure(go.Bar(x=["a"], y=[1])),
    ]
    frame = pd.DataFrame({"run": [HOSTILE_LABEL], "tok/s": [1234.5678]})
    document = report.build_report(
        report.Report(
            "Run",
            [HOSTILE_LABEL],
            [f"caveat {HOSTILE_LABEL}"],
            [report.Section(HOSTILE_LABEL, [*figures, report.Table(HOSTILE_LABEL, frame), report.Note(HOSTILE_LABEL)])],
            pd.DataFrame({"setting": ["Model"], "run": [HOSTILE_MODEL]}),
            pd.DataFrame({"environment": ["hostname"], "run": ["<b>bench-host</b>"]}),
        ),
        created=datetime(2026, 12, 1, 22, 0, tzinfo=UTC),
    )
    assert_self_contained(document, 2)
    assert_escaped(document)
    assert "1,234.568" in document  # numbers written as every table writes them
    assert "LLM Bench Studio 0.1.0 · report written 2026-12-01T22:00:00+00:00 · 2 charts" in document
    assert "\\u003cscript\\u003e" in document  # the figure's JSON carries the label with "<" escaped


def test_a_run_report_holds_its_charts_tables_settings_environment_and_caveats(history):
    parts = run_parts(history, "run-a")
    document = report.run_report(parts)
    assert_self_contained(document, 4)  # TTFT and ITL histograms, the request timeline, the token lengths
    assert_escaped(document)
    assert "<h1>Run run-a</h1>" in document
    row = history.row("run-a")
    for column in ("output_throughput", "mean_ttft_ms", "p99_ttft_ms"):
        assert f"<td>{tables.format_number(float(row[column]))}</td>" in document
    for heading in (
        "Latency (ms), successful requests, as LMDeploy reports it",
        "Throughput",
        "Per request",
        "Settings",
        "Environment",
    ):
        assert f"<h3>{heading}</h3>" in document
    assert "<td>Concurrency (requests)</td>\n      <td>2</td>" in document
    assert "<td>python</td>\n      <td>3.12.1</td>" in document
    # The prompts average 10 tokens, and a batch sends them all at once: both of the page's caveats about TTFT per
    # 1,000 input tokens come first.
    assert document.index("means little here") < document.index("<h2>Results</h2>")
    assert document.index("is not prefill speed here: every request arrived at once") < document.index("<h2>Results")


def test_a_run_that_failed_before_measuring_reports_what_it_left(tmp_path):
    history = History(tmp_path)
    history.record(
        RunRecord(
            run_id="broken",
            started_at="2026-11-30T08:00:00+00:00",
            status="failed",
            config=RunConfig(),
            error=f"Could not load {HOSTILE_MODEL}",
        )
    )
    document = report.run_report(run_parts(history, "broken"))
    assert_self_contained(document, 0)
    assert "failed: Could not load /models/&lt;/table&gt;&lt;img src=x" in document
    assert "<h3>Settings</h3>" in document


@pytest.mark.slow
def test_a_comparison_report_holds_the_charts_the_table_and_each_runs_settings(history):
    rows = history.load()
    found, missing = request_tables(history, rows, tables.run_names(rows))
    document = report.comparison_report(rows, found, missing)
    assert_self_contained(document, 4)  # across the differing setting, latency vs throughput, two CDFs
    assert_escaped(document)
    assert "<h3>What differs between these runs</h3>" in document and "<h3>Against the baseline</h3>" in document
    assert report.UNJUDGED_NOTE in document  # each setup ran once
    # The oldest run (the first recorded, on a tie) is the baseline, unless another is named.
    escaped_label = "&lt;/script&gt;"  # the end of run-a's name, its label
    side_by_side = document[document.index("<h3>Against the baseline</h3>") :]
    assert side_by_side.index(f"{escaped_label} (baseline)") < side_by_side.index("run-b")
    other = report.comparison_report(rows, found, missing, baseline="run-b")
    side_by_side = other[other.index("<h3>Against the baseline</h3>") :]
    assert side_by_side.index("run-b (baseline)") < side_by_side.index(escaped_label)


def test_the_comparison_table_marks_and_colours_only_the_changes_beyond_the_noise_of_repeats(tmp_path):
    history = History(tmp_path)
    for run_id, concurrency, ttfts in (
        ("c2-1", 2, [0.1, 0.2]),
        ("c2-2", 2, [0.1, 0.2]),
        ("c4-1", 4, [0.3, 0.4]),
        ("c4-2", 4, [0.3, 0.4]),
        ("c8", 8, [0.5, 0.6]),
    ):
        record(history, run_id, concurrency, ttfts)
    chosen, varied = report.compared_runs(history.load())
    table, marks, judged = report.comparison_table(chosen, varied)
    assert judged and list(table.columns) == ["c2-1 (baseline)", "c2-2", "c4-1", "c4-2", "c8"]
    # The settings that differ first, then how many runs each setup has, then the metrics, the key ones first.
    assert list(table.index[:3]) == ["Concurrency (requests)", report.REPEATS, "Output throughput (tok/s)"]
    assert table.loc[report.REPEATS].tolist() == ["2", "2", "2", "2", "1"]
    ttft = table.loc["Mean time to first token (ms)"].tolist()
    assert ttft[0] == "150.000" and ttft[2] == ttft[3] == f"350 (+133 %) {tables.BEYOND_NOISE_MARK}"
    assert ttft[1] == "150.000 (+0.0 %)" and ttft[4] == "550 (+267 %)"  # a repeat of the baseline; a setup run once
    assert marks.loc["Mean time to first token (ms)"].tolist() == ["", "", tables.WORSE, tables.WORSE, ""]
    assert "Goodput (req/s)" not in table.index  # no run measured it
    document = report.build_report(
        report.Report(
            "Comparison",
            ["x"],
            [],
            [report.Section("Side by side", [report.Table("t", table, marks)])],
            pd.DataFrame(),
            pd.DataFrame(),
        )
    )
    assert "rgba(218, 54, 51" in document and "350 (+133 %) *" in document


@pytest.mark.slow
def test_a_sweep_report_holds_every_view_and_the_interval_caveat(tmp_path):
    history = History(tmp_path)
    plan = SweepPlan(
        "sweep-r",
        RunConfig(engine=EngineConfig(backend="transformers", model=HOSTILE_MODEL)),
        (parse_sweep_arg("concurrency=1,2"),),
        repeats=2,
    )
    save_plan(history, plan)
    for index, point in enumerate(plan.points()):
        record(
            history,
            f"s{index}",
            point.values["concurrency"],
            [0.1 * (index + 1), 0.2],
            model=HOSTILE_MODEL,
            sweep_id=plan.sweep_id,
            repeat=point.repeat,
        )
    document = sweep_report(history, plan, history.load(), status="finished")
    assert_self_contained(document, 4)  # the band, the three Pareto views; goodput needs an SLO
    assert "<h1>Sweep sweep-r</h1>" in document and "too few runs for a 95% interval" in document
    assert "&lt;img src=x" in document and "<img src=x" not in document
    assert "<h3>Per point: n runs, mean" in document


def test_a_sweep_report_states_the_slo_its_goodput_is_for_and_no_target_nobody_set(tmp_path):
    # TTFT <= 5000 ms set on the page after the sweep: the report's goodput views did not say which SLO they used,
    # its settings table said "SLO on TTFT (s) default", and a 1 req/s target nobody chose was drawn and judged.
    history = History(tmp_path)
    plan = SweepPlan("sweep-g", RunConfig(), (parse_sweep_arg("concurrency=1,2"),), repeats=1)
    save_plan(history, plan)
    for index, point in enumerate(plan.points()):
        record(
            history, f"g{index}", point.values["concurrency"], [0.1, 0.2], sweep_id=plan.sweep_id, repeat=point.repeat
        )
    history_runs = history.load()
    runs = sweep_results.sweep_runs(history_runs, plan)
    found, _ = request_tables(history, runs, list(runs["run_id"].astype(str)))
    page_slo = SLO(ttft=5.0)
    runs = sweep_results.with_slo(runs, found, page_slo)
    document = sweep_report(history, plan, history_runs, runs, slo=page_slo)
    assert_self_contained(document, 6)  # and goodput and SLO attainment against the concurrency
    body = document[document.index("</head>") :]
    assert "good requests: TTFT ≤ 5,000 ms; target: none set" in body
    assert body.count("Good requests: TTFT ≤ 5,000 ms; no target set") == 2  # each goodput chart says it
    assert "meets the target" not in body and "Target 1" not in body
    assert re.search(r"<td>SLO on TTFT \(s\)</td>\s*<td>5</td>", body)
    assert re.search(r"<td>SLO on TPOT \(s\)</td>\s*<td>not set</td>", body)
    chosen = sweep_report(history, plan, history_runs, runs, slo=page_slo, targets={"goodput_rps": 2.5})
    assert "good requests: TTFT ≤ 5,000 ms; target: Goodput (req/s) ≥ 2.5" in chosen


def test_a_report_that_cannot_be_written_says_why_in_one_line_and_keeps_the_history(history, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "report.html"  # its "folder" is a file
    assert not write_exports([ExportRequest("report", str(target))], lambda: run_subject(history, "run-a"))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: the report was not written to {target}")
    assert history.row("run-a") is not None and not target.exists()


def test_a_run_that_other_processes_kept_busy_says_so_before_its_numbers(tmp_path):
    history = History(tmp_path)
    prof = profiled_run([0.1, 0.2])
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        load=LoadConfig(concurrency=2, stream_output=True),
    )
    history.record(
        RunRecord(
            run_id="busy",
            started_at="2026-11-30T08:00:00+00:00",
            status="finished",
            config=config,
            lmdeploy_columns=prof.lmdeploy_csv_row(lmdeploy_hyperparams(config)),
            metrics={**prof.summary(), OTHER_CORES_COLUMN: 1.8, BUSY_SHARE_COLUMN: 0.9},
            requests=prof.request_table(),
            environment={**ENVIRONMENT, "cpu_count": 2},
        )
    )
    document = report.run_report(run_parts(history, "busy"))
    said = "other processes used 1.8 of 2 CPU cores during this run and saturated the machine 90% of the time"
    assert said in document
    assert document.index(said) < document.index("<h2>Results</h2>")


def test_a_report_saved_from_the_dashboard_keeps_the_pages_colours(history, monkeypatch):
    # The dashboard's process runs with Streamlit's plotly template as the default: its colours are placeholders
    # (#000001, #000002 ...) that only Streamlit's page replaces, so a report saved there drew every series black.
    configure_streamlit_plotly_theme()
    monkeypatch.setattr(pio.templates, "default", "streamlit")
    parts = run_parts(history, "run-a")
    document = report.run_report(parts)
    charts = document[document.index("</head>") :]
    assert "#000001" not in charts and "#000002" not in charts
    # Every chart names its series colours itself, so the page (Streamlit's theme) and the report draw them alike.
    figures = [
        block for section in report.run_sections(parts) for block in section.blocks if isinstance(block, go.Figure)
    ]
    assert figures and all(list(fig.layout.colorway) == list(PALETTE) for fig in figures)


def test_a_run_of_the_baseline_prompts_is_set_against_it_request_by_request(tmp_path):
    history = History(tmp_path)
    record(history, "run-off", 1, [0.2, 0.4, 0.6])
    record(history, "run-on", 2, [0.1, 0.2, 0.3])
    rows = history.load()
    chosen, _ = report.compared_runs(rows)
    found, missing = request_tables(history, rows, list(chosen[report.RUN]))
    paired = report.paired_against_baseline(chosen, found, "run-off")
    assert paired.loc["Time to first token"].tolist() == ["0.5 (0.5 to 0.5)"]
    document = report.comparison_report(rows, found, missing, baseline="run-off")
    assert f"<h3>{report.PAIRED_TITLE}</h3>" in document and "0.5 (0.5 to 0.5)" in document


def run_subject(history: History, run_id: str) -> RunSubject:
    """A recorded run as the Run page hands it to the exports."""
    row = lmdeploy_row_of(history.row(run_id))
    return RunSubject(history, run_id, history.requests(run_id), row, lambda: run_parts(history, run_id))


def unstamped(document: bytes | str) -> str:
    """A report without the parts two builds of it differ in: the minute it was written in, and the ids pandas'
    Styler draws at random for its tables."""
    text = document.decode() if isinstance(document, bytes) else document
    return re.sub(r"T_[0-9a-f]{5}(?=[_\"])", "T_", re.sub(r"report written [0-9T:+-]+", "report written", text))


def test_the_run_exports_are_the_files_the_run_page_wrote_before_the_registry(history):
    subject = run_subject(history, "run-a")
    row = subject.lmdeploy_row
    assert export("history-rows").build(subject) == history.to_csv_bytes(["run-a"])
    requests = export("requests").build(subject)
    assert requests == csvstore.frame_bytes(tables.requests_for_display(history.requests("run-a")))
    assert requests.startswith(b"request,status,")
    assert export("lmdeploy-csv").build(subject) == csvstore.table_bytes(list(row), [row])
    built = unstamped(export("report").build(subject))
    assert built == unstamped(report.run_report(run_parts(history, "run-a"))) and "<h1>Run run-a</h1>" in built
    assert [export(kind).name_for(subject) for kind in ("history-rows", "requests", "report")] == [
        "run-run-a-history.csv",
        "run-run-a-requests.csv",
        "run-run-a.html",
    ]


def test_the_comparison_exports_are_the_files_the_history_page_wrote_before_the_registry(history):
    rows = history.load(run_ids=["run-a", "run-b"])
    found, missing = request_tables(history, rows, tables.run_names(rows))
    subject = ComparisonSubject(history, rows, found, missing, baseline=None)
    assert export("history-rows").build(subject) == history.to_csv_bytes(["run-a", "run-b"])
    built = unstamped(export("report").build(subject))
    assert built == unstamped(report.comparison_report(rows, found, missing, baseline=None))
    assert export("report").name_for(subject) == "compare-run-a-run-b.html"
    with pytest.raises(ConfigError, match="The requests export is of a run, not of a comparison"):
        export("requests").build(subject)


def test_the_sweep_exports_are_the_files_the_sweep_page_wrote_before_the_registry(tmp_path):
    history = History(tmp_path)
    plan = SweepPlan("sweep-x", RunConfig(), (parse_sweep_arg("concurrency=1,2"),), repeats=1)
    save_plan(history, plan)
    for index, point in enumerate(plan.points()):
        record(history, f"x{index}", point.values["concurrency"], [0.1, 0.2], sweep_id=plan.sweep_id, repeat=0)
    history_runs = history.load()
    runs = sweep_results.sweep_runs(history_runs, plan)
    slo, targets = SLO(ttft=5.0), {"goodput_rps": 2.5}
    subject = SweepSubject(history, plan, history_runs, runs, slo=slo, targets=targets)
    assert export("history-rows").build(subject) == history.to_csv_bytes(runs["run_id"].astype(str))
    built = unstamped(export("report").build(subject))
    assert built == unstamped(sweep_report(history, plan, history_runs, runs, slo=slo, targets=targets))
    assert "<h1>Sweep sweep-x</h1>" in built
    assert export("report").name_for(subject) == "sweep-sweep-x.html"
