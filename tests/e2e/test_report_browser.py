"""A report opened in chromium with the network off draws every chart: plotly's JavaScript is in the file, nothing is
fetched (any request that is not the file itself is aborted and counted), and the page logs no error. Reports from
real profilers recorded into a real history; a screenshot of each lands in artifacts/e2e/ to look at."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench_core.config import EngineConfig, RunConfig
from bench_core.store.history import History
from bench_core.store.run_parts import request_tables, run_parts
from bench_core.sweep.plan import SweepPlan, parse_sweep_arg
from bench_core.sweep.report import sweep_report
from bench_core.sweep.store import save_plan
from bench_core.views import report, tables
from tests.test_report import HOSTILE_LABEL, HOSTILE_MODEL, record

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
TRACE = ".main-svg g.trace, .main-svg g.hm image"


def reports(folder: Path) -> dict[str, str]:
    history = History(folder / "results")
    record(history, "run-a", 2, [0.1, 0.2, 0.3], label=HOSTILE_LABEL, model=HOSTILE_MODEL)
    record(history, "run-b", 4, [0.2, 0.4])
    plan = SweepPlan(
        "sweep-e2e",
        RunConfig(engine=EngineConfig(backend="transformers")),
        (parse_sweep_arg("concurrency=1,2,4"),),
        repeats=2,
    )
    save_plan(history, plan)
    for index, point in enumerate(plan.points()):
        record(
            history,
            f"s{index}",
            point.values["concurrency"],
            [0.05 * (index + 1), 0.1],
            sweep_id=plan.sweep_id,
            repeat=point.repeat,
        )
    rows = history.load()
    compared = rows[rows["run_id"].isin(["run-a", "run-b"])]
    found, missing = request_tables(history, compared, tables.run_names(compared))
    return {
        "run": report.run_report(run_parts(history, "run-a")),
        "comparison": report.comparison_report(compared, found, missing),
        "sweep": sweep_report(history, plan, rows),
    }


@pytest.mark.parametrize("kind", ["run", "comparison", "sweep"])
def test_a_report_draws_every_chart_offline(browser, tmp_path, artifacts, kind):
    document = reports(tmp_path)[kind]
    path = tmp_path / f"report-{kind}.html"
    path.write_text(document, encoding="utf-8")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_offline(True)
    fetched, errors = [], []

    def refuse(route):
        if not route.request.url.startswith("file://"):
            fetched.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    context.route("**/*", refuse)
    page = context.new_page()
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    charts = report.chart_count(document)
    assert charts >= 3
    # Each chart drew its SVG and at least one trace in it (a heatmap draws its cells as an image).
    drawn = f"[...document.querySelectorAll('.js-plotly-plot')].filter(c => c.querySelector('{TRACE}')).length"
    page.wait_for_function(f"{drawn} >= {charts}", timeout=30_000)
    assert page.locator(".js-plotly-plot").count() == page.evaluate(drawn) == charts
    assert page.locator(".js-plotly-plot .main-svg").count() >= charts
    assert page.title().startswith(
        {"run": "Run run-a", "comparison": "Comparison run-a, run-b", "sweep": "Sweep sweep-e2e"}[kind]
    )
    assert page.locator("script[src], link[href], img").count() == 0  # the label's <img> stayed text
    if kind != "sweep":
        assert page.get_by_text(HOSTILE_LABEL).first.is_visible()
    page.screenshot(path=str(artifacts / f"report-{kind}.png"), full_page=True)
    context.close()
    assert fetched == [] and errors == []
