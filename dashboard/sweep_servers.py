"""The Sweep page's parts for a server backend: a server started for every run (its command, its fixed settings) and
the capacity search (--find-max): what it looks for, and its probes once they ran."""

from __future__ import annotations

from typing import Any

import streamlit as st

from bench_core.config import SLO, setting
from bench_core.errors import BenchError
from bench_core.measure import metrics
from bench_core.store.history import History
from bench_core.sweep import find_max
from bench_core.sweep import report as sweep_report
from bench_core.sweep.plan import SweepPlan
from bench_core.sweep.server import PORT, template_fields
from bench_core.sweep.store import point_text
from bench_core.views.tables import describe_slo
from dashboard.sweep_widgets import setting_label, sweep_number
from dashboard.table_view import show_table
from dashboard.text import plain


def server_inputs() -> dict[str, Any]:
    """A server started for every run (--server-cmd): its command template and how long it has to answer."""
    if not st.checkbox(
        "Start a server for every run",
        key="sweep_server_per_run",
        help="Each run starts the server command on a free port and stops it after, as sweep restful --server-cmd "
        "does; its output goes to the run's server.log. Otherwise the runs go to the sidebar's server URL.",
    ):
        return {"server_cmd": ""}
    command, timeout = st.columns([4, 1])
    server_cmd = command.text_input(
        "Server command",
        key="sweep_server_cmd",
        placeholder="lmdeploy serve api_server MODEL --server-port {port} --max-batch-size {max_batch_size}",
        help="As you would type it in a shell. {port} is a free port (the runs reach the server there); every other "
        "{name} is a server setting: sweep it above, or give it one value below.",
    ).strip()
    declared = setting("server_start_timeout_s")
    return {
        "server_cmd": server_cmd,
        "server_start_timeout_s": sweep_number(timeout, declared, "sweep_server_start_timeout"),
    }


def server_fields(server_cmd: str) -> list[str]:
    """The server command's settings, {port} aside; none while it cannot be read (the plan then says why)."""
    try:
        return [name for name in template_fields(server_cmd) if name != PORT] if server_cmd else []
    except BenchError:
        return []


def fixed_server_settings(fields: list[str]) -> list[str]:
    """A value for each field of the server command no axis sweeps (--server-setting NAME=VALUE); an empty one is
    left out, and the plan names it."""
    if not fields:
        return []
    columns = st.columns(4)
    given = [
        (
            field,
            columns[index % len(columns)].text_input(
                f"{{{field}}} (fixed)",
                key=f"sweep_server_setting_{field}",
                help=f"The value of the server command's {{{field}}} for every run (--server-setting {field}=VALUE).",
            ),
        )
        for index, field in enumerate(fields)
    ]
    return [f"{field}={value.strip()}" for field, value in given if value.strip()]


def search_inputs(slo: SLO) -> dict[str, Any]:
    """What the capacity search looks for (--find-max and its bounds), each input drawn from its declaration, under
    the SLO (the sidebar's) a request meets to count as good."""
    st.caption(
        plain(f"Good requests: {describe_slo(slo)}, as set under Goodput SLO in the sidebar.")
        if metrics.slo_is_set(slo)
        else "Good requests: no threshold set yet. Set TTFT, TPOT or E2E thresholds under Goodput SLO in the "
        "sidebar: the search looks for the highest load within them."
    )
    load, target, precision = st.columns(3)
    searched = load.selectbox(
        "Search for the highest",
        find_max.SEARCHABLE,
        key="find_max_setting",
        format_func=setting_label,
        help="The load setting the search probes: requests sent per second, or requests in flight at once.",
    )
    start, limit, probes, time_budget = st.columns(4)
    return {
        "load_setting": searched,
        "target": sweep_number(target, setting("goodput_target"), "find_max_target"),
        "precision": sweep_number(precision, setting("find_max_precision"), "find_max_precision"),
        "start": sweep_number(
            start,
            setting("find_max_start"),
            "find_max_start",
            placeholder=f"empty: {find_max.DEFAULT_START[searched]:g}",
        ),
        "limit": sweep_number(
            limit,
            setting("find_max_limit"),
            "find_max_limit",
            placeholder="empty: the prompts per run"
            if searched == "max_concurrency"
            else f"empty: {find_max.LIMIT_FACTOR:,} × the first",
        ),
        "max_probes": sweep_number(probes, setting("find_max_probes"), "find_max_probes"),
        "max_time_s": sweep_number(time_budget, setting("find_max_time_s"), "find_max_time"),
    }


def find_max_view(history: History, plan: SweepPlan) -> None:
    """Per point: the probes charted in the order they ran, the highest load that met the target, the probe table."""
    for point, shown in zip(plan.grid(), sweep_report.probed_points(history, plan)):
        st.markdown(f"**{plain(shown.heading)}**")
        st.plotly_chart(shown.figure, key=f"sweep_chart_find_max_{point_text(point)}")
        show_table(shown.probes, key=f"sweep_probes_{point_text(point)}")
