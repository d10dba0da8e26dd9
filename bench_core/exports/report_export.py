"""One self-contained HTML file with the charts, tables, settings and environment of a run, a comparison or a
sweep. The report modules import plotly, so they are imported when a report is built, not when the CLI starts."""

from . import ComparisonSubject, Export, RunSubject, Scope, SweepSubject


def run_report(subject: RunSubject) -> bytes:
    from ..views import report

    return report.run_report(subject.parts()).encode()


def comparison_report(subject: ComparisonSubject) -> bytes:
    from ..views import report

    return report.comparison_report(
        subject.rows, subject.request_tables, subject.missing, baseline=subject.baseline
    ).encode()


def sweep_report(subject: SweepSubject) -> bytes:
    from ..sweep import report

    return report.sweep_report(
        subject.history,
        subject.plan,
        subject.history_runs,
        subject.runs,
        status=subject.status,
        slo=subject.slo,
        targets=subject.targets,
        rerun=subject.rerun,
    ).encode()


REPORT = Export(
    "report",
    "Report of this {scope} (HTML)",
    "text/html",
    "{stem}.html",
    {Scope.RUN: run_report, Scope.COMPARISON: comparison_report, Scope.SWEEP: sweep_report},
    help="One file with the charts, tables, settings and environment; it opens offline.",
    order=40,
)
