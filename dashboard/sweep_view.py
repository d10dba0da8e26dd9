"""The Sweep page's parts: the sweep inputs, the live progress of a running sweep, its results (four views,
the per-point table and a two-point comparison) and the list of past sweeps.

A sweep runs on this machine, through the shared runner, or on a Ray cluster when the page is given its
address (sweep_cluster); a cluster sweep also shows each run's state and the node that has it.

Sweeps started in this server live in `state.get_sweeps()` (one registry per process, like the runner), so a
reload or a second tab finds a running sweep by the id in the URL; a sweep that ended before a restart,
or ran from the CLI, is read back from its saved plan and the history. While a sweep runs, a fragment
polls its progress once a second and triggers a full rerun whenever another run finishes, so the results
below grow run by run; nothing polls once it has ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from bench_core.config import SLO, EngineConfig, Setting, format_value, output_length, setting
from bench_core.config.settings import widget_label
from bench_core.engines import backend as backend_of
from bench_core.errors import BenchError
from bench_core.measure import metrics
from bench_core.measure.time_left import time_left_s
from bench_core.states import RunState
from bench_core.store.history import History
from bench_core.sweep import find_max
from bench_core.sweep import report as sweep_report
from bench_core.sweep import results as sweep_results
from bench_core.sweep.cluster import ClusterOptions, states_table
from bench_core.sweep.cluster import launch_for as launch_for_address
from bench_core.sweep.driver import Launch, SweepProgress, SweepRun, resume_sweep, start_sweep
from bench_core.sweep.estimate import describe_seconds, estimate, plan_estimate
from bench_core.sweep.plan import (
    CPU_SWEEP_OUTPUT_LEN,
    CPU_SWEEP_PROMPTS,
    DEFAULT_AXIS,
    DEFAULT_REPEATS,
    SWEEPABLE,
    SweepPlan,
    capacity_search,
    describe_point,
    plan_for,
    with_run_size,
)
from bench_core.sweep.precision import Precision, describe_target
from bench_core.sweep.server import DEFAULT_START_TIMEOUT_S, PORT, template_fields
from bench_core.sweep.store import (
    CREDENTIAL_SETTINGS,
    load_plan,
    past_sweeps,
    point_text,
    probes_of,
    remaining,
    sweep_counts,
)
from bench_core.views.tables import describe_column, describe_slo
from dashboard import active_runs, sidebar, start_estimate
from dashboard.state import get_history, get_runner, get_sweeps
from dashboard.table_view import show_table
from dashboard.text import plain

LIVE_REFRESH_S = 1.0
NO_SECOND = "(none)"
# Relative to this page's URL (app_pages/sweep.py -> /sweep) and to the Run page's.
SWEEP_PAGE_URL = "sweep"
# An ended sweep this server did not run: the history tells finished runs, not why the others are missing.
STOPPED = "stopped"
STARTED_SWEEPS = "started_sweep_ids"  # session key: the sweeps this session started
PENDING_SWEEP = "pending_sweep"  # session key: (plan, inputs) waiting for the user to confirm a second sweep
SWEEP_START_ERROR = "sweep_start_error"  # session key: why a confirmed start failed, shown once
SWEEP_SETTINGS, FIND_MAX = "Sweep settings", "Find the highest load within the SLO"
RUN_KINDS = (SWEEP_SETTINGS, FIND_MAX)


# ---- starting --------------------------------------------------------------------------------


def sweep_inputs(sidebar_values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings to sweep, their values and the repeats, or the capacity search, and the server started per run;
    the base settings come from the sidebar, whose credentials (a server URL's password) also resume a sweep whose
    saved plan masked them. The settings offered are those the sidebar's backend, load pattern and dataset use, and
    the fields of the server command. A search and a server per run are a server backend's (`sweep restful`)."""
    backend = sidebar_values["backend"]
    serves = not backend_of(backend).in_process
    searching = serves and (
        st.radio(
            "What to run",
            RUN_KINDS,
            horizontal=True,
            key="sweep_kind",
            help="A sweep runs every listed value; a capacity search (--find-max) probes a load setting, doubling "
            "it while enough requests meet the sidebar's SLO, then narrowing in on the highest load that does.",
        )
        == FIND_MAX
    )
    if not serves:
        st.caption(
            "A capacity search and a server started per run are for a server: choose the openai backend in the sidebar."
        )
    search = _search_inputs(sidebar.chosen_slo(sidebar_values)) if searching else None
    server = _server_inputs() if serves else {"server_cmd": ""}
    fields = _server_fields(server["server_cmd"])
    options = [
        *fields,
        *(
            name
            for name in SWEEPABLE
            if setting(name).applies(
                backend=backend,
                load_pattern=sidebar_values["load_pattern"],
                dataset_name=sidebar_values["dataset_name"],
            )
        ),
    ]
    first, second, repeats = st.columns([2, 2, 1])
    if searching:  # a search may run at each value of one or two settings, or once
        name = first.selectbox(
            "At each value of (optional)",
            [NO_SECOND, *options],
            key="sweep_name_at",
            format_func=lambda option: _axis_label(option, fields),
        )
    else:
        name = first.selectbox(
            "Sweep",
            options,
            index=options.index(DEFAULT_AXIS.name) if DEFAULT_AXIS.name in options else 0,
            key="sweep_name",
            format_func=lambda option: _axis_label(option, fields),
        )
    values = _values_field(first, name, "sweep_values_at" if searching else "sweep_values", backend, fields)
    second_name = second.selectbox(
        "Against (optional, a grid)",
        [NO_SECOND, *options],
        key="sweep_name_2",
        format_func=lambda option: _axis_label(option, fields),
    )
    second_values = _values_field(second, second_name, "sweep_values_2", backend, fields)
    count = (
        1  # a search probes each load once
        if searching
        else repeats.number_input(
            "Repeats",
            value=DEFAULT_REPEATS,
            step=1,
            key="sweep_repeats",
            help="Runs per point: two or more give a mean, a spread and a 95% interval. With a target margin of "
            "error, the fewest (3 at least).",
        )
    )
    precision = None if searching else precision_inputs("sweep")
    axes = [(axis, text) for axis, text in ((name, values), (second_name, second_values)) if axis != NO_SECOND]
    swept = {axis for axis, _ in axes}
    credentials = {name: sidebar_values.get(name) or "" for name in CREDENTIAL_SETTINGS}
    fixed = _fixed_server_settings([field for field in fields if field not in swept])
    return {
        "axes": axes,
        "repeats": 1 if searching else int(count),
        **_run_size_inputs(backend, sidebar_values["dataset_name"]),
        **server,
        "server_settings": fixed,
        "find_max": search,
        "precision": precision,
        **_cluster_inputs(),
        "credentials": credentials,
    }


def precision_inputs(key: str) -> dict[str, Any] | None:
    """Repeats until the answer is clear (--target-moe, --max-repeats, --target-moe-metric), each input drawn from its
    declaration, their keys starting with `key`; None while no target is set (the repeats are then a fixed count)."""
    target_column, cap_column, metric_column = st.columns([1, 1, 2])
    target = _sweep_number(target_column, setting("target_moe"), f"{key}_target_moe")
    max_repeats = _sweep_number(cap_column, setting("max_repeats"), f"{key}_max_repeats")
    declared = setting("target_moe_metric")
    metric = metric_column.selectbox(
        widget_label(declared),
        sweep_results.SWEEP_METRICS,
        index=sweep_results.SWEEP_METRICS.index(declared.default),
        key=f"{key}_target_moe_metric",
        format_func=_title,
        disabled=target is None,
        help=f"{declared.cli_flag}: {declared.cli_help}",
    )
    return None if target is None else {"target": target, "metric": metric, "max_repeats": max_repeats}


def _server_inputs() -> dict[str, Any]:
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
        "server_start_timeout_s": _sweep_number(timeout, declared, "sweep_server_start_timeout"),
    }


def _server_fields(server_cmd: str) -> list[str]:
    """The server command's settings, {port} aside; none while it cannot be read (the plan then says why)."""
    try:
        return [name for name in template_fields(server_cmd) if name != PORT] if server_cmd else []
    except BenchError:
        return []


def _fixed_server_settings(fields: list[str]) -> list[str]:
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


def _search_inputs(slo: SLO) -> dict[str, Any]:
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
        format_func=_setting_label,
        help="The load setting the search probes: requests sent per second, or requests in flight at once.",
    )
    start, limit, probes, time_budget = st.columns(4)
    return {
        "load_setting": searched,
        "target": _sweep_number(target, setting("goodput_target"), "find_max_target"),
        "precision": _sweep_number(precision, setting("find_max_precision"), "find_max_precision"),
        "start": _sweep_number(
            start,
            setting("find_max_start"),
            "find_max_start",
            placeholder=f"empty: {find_max.DEFAULT_START[searched]:g}",
        ),
        "limit": _sweep_number(
            limit,
            setting("find_max_limit"),
            "find_max_limit",
            placeholder="empty: the prompts per run"
            if searched == "max_concurrency"
            else f"empty: {find_max.LIMIT_FACTOR:,} × the first",
        ),
        "max_probes": _sweep_number(probes, setting("find_max_probes"), "find_max_probes"),
        "max_time_s": _sweep_number(time_budget, setting("find_max_time_s"), "find_max_time"),
    }


def _sweep_number(where: Any, declared: Setting, key: str, placeholder: str | None = None) -> Any:
    """A number input for a sweep's own setting, starting at its default, labelled and explained by its declaration.
    It takes any number: the plan checks its bounds with the sweep's other settings and says what is wrong once."""
    shown = where.number_input(
        widget_label(declared),
        value=declared.default,
        step=declared.widget.step
        if declared.widget and declared.widget.step
        else (1 if declared.kind is int else None),
        key=key,
        placeholder=placeholder,
        format=declared.widget.format if declared.widget else None,
        help=f"{declared.cli_flag}: {declared.cli_help}",
    )
    return None if shown is None else declared.kind(shown)


def example_values(name: str, backend: str) -> str:
    """What the Values field of the swept setting `name` starts at: every choice it has on `backend` (false and true
    for a switch), the default sweep's values for its setting, else nothing (the field says what it takes)."""
    declared = setting(name)
    choices = (False, True) if declared.kind is bool else declared.choices_for(backend)
    if choices is not None:
        return ",".join(format_value(choice) for choice in choices)
    return ",".join(map(str, DEFAULT_AXIS.values)) if name == DEFAULT_AXIS.name else ""


def _values_field(where: Any, name: str, key: str, backend: str, server_fields: list[str]) -> str:
    """The Values text field of the swept setting `name` (NO_SECOND: disabled), set to the setting's examples
    whenever another setting is chosen: values typed for one (1,2,4) are rarely another's (true/false). A field of the
    server command (among `server_fields`) takes what the server does."""
    chosen_for = f"{key}_setting"
    server = name in server_fields
    if st.session_state.get(chosen_for) != name or key not in st.session_state:
        st.session_state[key] = "" if name == NO_SECOND or server else example_values(name, backend)
        st.session_state[chosen_for] = name
    if name == NO_SECOND:
        return where.text_input("Values", key=key, disabled=True, placeholder="e.g. 256,512")
    if server:
        return where.text_input(
            "Values",
            key=key,
            placeholder="comma-separated, as the server takes them",
            help=f"Comma-separated values of the server command's {{{name}}}: one server per value.",
        )
    return where.text_input(
        "Values",
        key=key,
        placeholder=f"comma-separated, each {setting(name).text_rule}",
        help=f"Comma-separated values of {name}, each {setting(name).text_rule}.",
    )


def _run_size_inputs(backend: str, dataset_name: str) -> dict[str, int | None]:
    """Prompts and output tokens per run: small on the embedded engine, where a CPU runs every point; empty
    keeps the sidebar's. The output length goes to the one the dataset takes; a dataset whose records say their
    own (a trace) has none to set."""
    cpu = backend == EngineConfig.backend
    output_setting = output_length(dataset_name)
    prompts, output = st.columns(2)
    num_prompts = _number_or_empty(
        prompts,
        "Prompts per run",
        "sweep_num_prompts",
        CPU_SWEEP_PROMPTS if cpu else None,
        placeholder="the sidebar's",
        help="Each run of the sweep sends this many prompts; empty: the sidebar's.",
    )
    if output_setting is None:
        output.text_input(
            "Output tokens per request",
            value="",
            disabled=True,
            key="sweep_no_output_len",
            placeholder=f"the {dataset_name} dataset's own",
            help=f"The {dataset_name} dataset's records say how many tokens each request generates.",
        )
        output_len = None
    else:
        output_len = _number_or_empty(
            output,
            "Output tokens per request",
            "sweep_output_len",
            CPU_SWEEP_OUTPUT_LEN if cpu else None,
            placeholder="the sidebar's",
            help=f"Sets {output_setting.cli_flag} ({output_setting.shown_label}) for every run of the sweep; empty: "
            "the sidebar's.",
        )
    return {
        "num_prompts": None if num_prompts is None else int(num_prompts),
        "output_len": None if output_len is None else int(output_len),
    }


def _number_or_empty(where: Any, label: str, key: str, start: int | None, **options: Any) -> int | None:
    """A whole-number input starting at `start` (again whenever `start` changes: another backend's run size) that
    can still be emptied: Streamlit lets a number input be emptied only when it has no default value of its own.
    It takes any number: its bounds are checked with the sweep's other settings."""
    started_at = f"{key}_start"
    if key not in st.session_state or st.session_state.get(started_at) != start:
        st.session_state[key] = start
        st.session_state[started_at] = start
    return where.number_input(label, value=None, step=1, key=key, **options)


def _cluster_inputs() -> dict[str, Any]:
    """Where the runs go: this machine (no address) or a Ray cluster, with the cores each point holds and
    the retries of a point whose worker died."""
    address, cores, retries = st.columns([2, 1, 1])
    ray_address = address.text_input(
        "Ray cluster address",
        key="sweep_ray_address",
        placeholder="empty: this machine",
        help="host:port, ray://host:port, auto (the cluster this machine belongs to) or local (a new Ray "
        "instance here). Each point then runs in its own worker with its own cores and GPUs; the "
        "history stays on this machine. Needs Ray: pip install -r requirements-cluster.txt",
    ).strip()
    # Their bounds are ClusterOptions', checked with the sweep (`startable_plan`); without a cluster they mean nothing.
    return {
        "ray_address": ray_address,
        "cpus_per_point": int(
            cores.number_input(
                "CPU cores per point",
                value=setting("cpus_per_point").default,
                step=1,
                key="sweep_cpus_per_point",
                disabled=not ray_address,
            )
        ),
        "retries": int(
            retries.number_input(
                "Retries",
                value=setting("retries").default,
                step=1,
                key="sweep_retries",
                disabled=not ray_address,
                help="Runs of a point again after its worker died.",
            )
        ),
    }


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


# ---- one sweep -------------------------------------------------------------------------------


def render_sweep(sweep_id: str, slo: SLO, live: bool, runs: pd.DataFrame | None, inputs: Mapping[str, Any]) -> None:
    """Progress (polled while `live`), then the results of the sweep's finished runs so far, with goodput
    for `slo` (the sidebar's) when it sets a threshold, else for the SLO the runs had.

    `live` is whether the sweep was active when this script run began: the page decides it once, so its
    Cancel button and this view never disagree about a sweep that ends in between. `runs` is the history as the
    page read it for this script run; `inputs` the page's sweep inputs, which a resume follows."""
    history = get_history()
    sweep = get_sweeps().get(sweep_id)
    if runs is None:  # the page said why
        return
    try:
        plan = sweep.plan if sweep is not None else load_plan(history, sweep_id)
    except BenchError as exc:
        st.error(plain(exc))
        return
    st.subheader(f"Sweep {plain(sweep_id)}")
    model = plan.base.engine.model or "the model each server serves"  # a sweep's servers name theirs when up
    st.caption(plain(f"{describe_plan(plan)} · {model} on {plan.base.engine.backend}"))
    if live:
        _live_progress(sweep_id, runs)
    else:
        _ended_status(sweep, plan, runs, inputs)
    results(history, plan, runs, slo)


def describe_plan(plan: SweepPlan) -> str:
    axes = " × ".join(f"{axis.name} = {', '.join(_tick(value) for value in axis.values)}" for axis in plan.axes)
    server = " · a server started per run" if plan.server_cmd else ""
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


@st.fragment(run_every=LIVE_REFRESH_S)
def _live_progress(sweep_id: str, runs: pd.DataFrame) -> None:
    sweep = get_sweeps().get(sweep_id)
    if sweep is None or not sweep.active:
        st.rerun()  # one full rerun: the page then shows the ended sweep and this fragment is gone
    progress = sweep.progress()
    seen_key = f"sweep_runs_ended_{sweep_id}"
    if st.session_state.setdefault(seen_key, progress.ended) != progress.ended:
        st.session_state[seen_key] = progress.ended
        st.rerun()  # a full rerun, once per ended run: the results below take it in
    if sweep.plan.find_max:  # the search decides how many probes it runs: neither a fraction nor a time left
        st.progress(
            progress.ended / progress.total,
            text=f"searching: {progress.ended:,} probes done"
            + (f", now {plain(progress.current)}" if progress.current else ""),
        )
    else:
        st.progress(
            progress.ended / progress.total,
            text=f"running: {progress.ended:,}/{progress.total:,} runs done"
            + (f", now {plain(progress.current)}" if progress.current else "")
            + plain(_time_left(sweep, progress, runs)),
        )
    if progress.current_run_id:
        st.page_link(
            "app_pages/run.py",
            label=f"Watch run {plain(progress.current_run_id)} live",
            icon=":material/monitoring:",
            query_params={"run": progress.current_run_id},
        )
    if progress.errors:
        st.warning(plain(" ".join(progress.errors)))
    _where_runs_are(sweep)


def _where_runs_are(sweep: SweepRun | None) -> None:
    """A cluster sweep's runs: state, progress and node of each."""
    states = sweep.point_states() if sweep is not None else []
    if states:
        show_table(states_table(states), key="sweep_cluster_table")


def _time_left(sweep: SweepRun, progress: SweepProgress, runs: pd.DataFrame) -> str:
    """', about 1 min 20 s left': the running run's time left at its pace so far (the history's estimate until
    it has one), plus the history's estimate for the runs not started yet; "" when there is none."""
    # The history changes only when a run ends, and each end reruns the page, which reads it again into `runs`.
    key = f"sweep_eta_{sweep.sweep_id}_{progress.ended}"
    if key not in st.session_state:
        st.session_state[key] = _estimate_left(sweep.plan, progress.total - progress.ended, runs)
    current_guess, rest = st.session_state[key]
    run = get_runner().get(progress.current_run_id) if progress.current_run_id else None
    snapshot = run.snapshot() if run is not None else None
    current = time_left_s(snapshot, run.measurement.pace) if snapshot is not None else None
    current = current_guess if current is None else current
    if current is None or rest is None:
        return ""
    return f", {describe_seconds(current + rest)} left"


def _estimate_left(plan: SweepPlan, count: int, history_runs: pd.DataFrame) -> tuple[float | None, float | None]:
    """Seconds for the running run and for the others of the `count` runs not ended (the last in plan order)."""
    left = remaining(plan, history_runs)[-count:] if count else []
    return (
        estimate(left[:1], history_runs, loaded=True).seconds,
        estimate(left[1:], history_runs, loaded=True).seconds,
    )


def _ended_status(sweep: SweepRun | None, plan: SweepPlan, runs: pd.DataFrame, inputs: Mapping[str, Any]) -> None:
    """The final state: from the sweep object while this server has it, else from the history."""
    if sweep is not None:
        progress = sweep.progress()
        state, finished, total, message = progress.state, progress.finished, progress.total, progress.message
    elif plan.find_max:  # how many probes are left is the search's to say: a resume replays those that ended
        st.info(f"{len(probes_of(get_history(), plan.sweep_id))} probes ended.")
        if st.button("Resume the search (what ended is not run again)", key="sweep_resume"):
            _resume_and_rerun(plan, inputs)
        return
    else:
        finished, total = sweep_counts(get_history(), plan, runs)
        state = RunState.FINISHED if finished == total else STOPPED
        message = SweepProgress(state, total, finished, 0, 0, "", "", (), most=plan.precision is not None).message
    if state == RunState.FINISHED:
        st.success(f"finished: all {total:,} {'probes' if plan.find_max else 'runs'}.")
    elif state == RunState.CANCELLED or state == STOPPED:
        st.warning(plain(f"{state}: {message}"))
    else:
        st.error(plain(f"{state}: {message}"))
    _where_runs_are(sweep)
    left = f"up to {total - finished} more" if plan.precision else f"the other {total - finished}"
    if finished < total and st.button(f"Resume: run {left}", key="sweep_resume", type="primary"):
        _resume_and_rerun(plan, inputs)


def _resume_and_rerun(plan: SweepPlan, inputs: Mapping[str, Any]) -> None:
    try:
        resume(plan.sweep_id, inputs)
    except BenchError as exc:
        st.error(plain(exc))
    else:
        st.rerun()


# ---- results ---------------------------------------------------------------------------------


def results(history: History, plan: SweepPlan, runs: pd.DataFrame, slo: SLO) -> None:
    history_runs, runs = runs, sweep_results.sweep_runs(runs, plan)
    if plan.find_max:
        _find_max_view(history, plan)
        _downloads(history, plan, history_runs, runs, slo)
        return
    if runs.empty:
        st.info("No run of this sweep has finished yet.")
        return
    if metrics.slo_is_set(slo):
        try:
            tables = {run_id: _request_table(str(history.root), run_id) for run_id in runs["run_id"].astype(str)}
        except BenchError as exc:
            st.warning(plain(f"Goodput for the sidebar's SLO needs every run's stored requests: {exc}"))
        else:
            runs = sweep_results.with_slo(runs, tables, slo)
    statistics = sweep_results.point_statistics(runs, plan)
    measured = sweep_report.measured_metrics(statistics)
    st.markdown(f"**Results** of {len(runs)} finished runs: {sweep_report.RESULTS_HEADING}")
    if unreported := sweep_report.unreported_note(plan, measured):
        st.caption(plain(unreported))
    metric = st.selectbox(
        "Metric",
        measured,
        key="sweep_metric",
        format_func=_title,
        index=measured.index(sweep_report.DEFAULT_METRIC) if sweep_report.DEFAULT_METRIC in measured else 0,
    )
    figures = sweep_report.metric_figures(statistics, plan, metric)
    for column, figure, key in zip(
        st.columns(len(figures)) if len(figures) > 1 else [st], figures, ("sweep_chart_band", "sweep_chart_heatmap")
    ):
        column.plotly_chart(figure, key=key)
    st.caption(plain(sweep_results.interval_note(statistics)))
    if plan.precision:
        st.markdown(f"**{sweep_report.PRECISION_TABLE_TITLE}**")
        st.caption(plain(sweep_results.precision_summary(plan, runs)))
        show_table(sweep_results.precision_table(plan, runs), key="sweep_precision_table")
    _pareto_view(runs, plan)
    _goodput_view(runs, plan, slo)
    st.markdown(f"**Per point**: {sweep_report.POINT_TABLE_COLUMNS}")
    show_table(sweep_results.statistics_for_display(statistics), key="sweep_points_table")
    _comparison(runs, plan)
    _downloads(history, plan, history_runs, runs, slo)


def _downloads(history: History, plan: SweepPlan, history_runs: pd.DataFrame, runs: pd.DataFrame, slo: SLO) -> None:
    """The sweep's history rows, and its report (written when clicked: it inlines plotly's JavaScript), for the SLO
    and the goodput targets the page shows."""
    targets = {goodput: st.session_state.get(_target_key(goodput)) for goodput in sweep_report.GOODPUT_METRICS}
    left, right = st.columns(2)
    left.download_button(
        "This sweep's history rows (CSV)",
        history.to_csv_bytes(runs["run_id"].astype(str)),
        file_name=f"{plan.sweep_id}.csv",
        mime="text/csv",
        key="sweep_download",
        on_click="ignore",
    )
    right.download_button(
        "Report of this sweep (HTML)",
        lambda: sweep_report.sweep_report(history, plan, history_runs, runs, slo=slo, targets=targets).encode(),
        file_name=f"sweep-{plan.sweep_id}.html",
        mime="text/html",
        key="sweep_report_download",
        on_click="ignore",
        help="One file with every view of this sweep, its tables, settings and environment; it opens offline.",
    )


def _pareto_view(runs: pd.DataFrame, plan: SweepPlan) -> None:
    view = st.selectbox("Throughput against latency", list(sweep_report.PARETO_VIEWS), key="sweep_pareto")
    st.plotly_chart(sweep_report.pareto_figure(runs, plan, view), key="sweep_chart_pareto")


def _goodput_view(runs: pd.DataFrame, plan: SweepPlan, slo: SLO) -> None:
    load = sweep_report.load_axis(plan)
    if load is None:
        st.caption("Sweep the concurrency to see goodput against load, with the highest load meeting the SLO.")
        return
    if not sweep_report.has_goodput(runs):
        st.caption(
            "Set TTFT, TPOT or E2E thresholds under *Goodput SLO* in the sidebar to see goodput against "
            "load: it is computed from the runs' stored requests, without running them again."
        )
        return
    goodput_col, target_col = st.columns(2)
    goodput = goodput_col.selectbox("Goodput as", sweep_report.GOODPUT_METRICS, key="sweep_goodput", format_func=_title)
    target = target_col.number_input(
        f"Target ({describe_column(goodput).unit})",
        value=None,
        min_value=0.0,
        step=0.05,
        key=_target_key(goodput),
        placeholder="none: no target line",
        help="The goodput a load must reach: the chart then marks the highest load that meets it.",
    )
    shown = runs
    for axis in plan.axes:  # with a grid, one line of the other setting at a time
        if axis.name != load:
            value = st.selectbox(f"At {axis.name}", axis.values, key="sweep_goodput_at", format_func=_tick)
            shown = runs[runs[axis.name] == value]
    figure = sweep_report.goodput_figure(shown, plan, load, goodput, target, sweep_report.goodput_slo(plan, slo))
    st.plotly_chart(figure, key="sweep_chart_goodput")


def _target_key(goodput: str) -> str:
    return f"sweep_target_{goodput}"


def _find_max_view(history: History, plan: SweepPlan) -> None:
    """Per point: the probes charted in the order they ran, the highest load that met the target, the probe table."""
    for point, shown in zip(plan.grid(), sweep_report.probed_points(history, plan)):
        st.markdown(f"**{plain(shown.heading)}**")
        st.plotly_chart(shown.figure, key=f"sweep_chart_find_max_{point_text(point)}")
        show_table(shown.probes, key=f"sweep_probes_{point_text(point)}")


def _comparison(runs: pd.DataFrame, plan: SweepPlan) -> None:
    st.markdown("**Compare two points**: is the difference beyond the run-to-run spread? (Welch's t-test, 95%)")
    labels = [describe_point(values) for values in plan.grid() if describe_point(values) in set(runs["point"])]
    if len(labels) < 2:
        st.caption("Two points with finished runs are needed.")
        return
    left, right = st.columns(2)
    point_a = left.selectbox("Point A", labels, key="sweep_point_a")
    point_b = right.selectbox("Point B", labels, index=len(labels) - 1, key="sweep_point_b")
    table = sweep_results.compare_points(runs, point_a, point_b)
    show_table(table, key="sweep_compare_table")
    st.caption(
        "B - A and its 95% interval; beyond the spread when Welch's p-value is under 0.05. A point that "
        "ran once has no spread to judge against."
    )


@st.cache_data(max_entries=1024, show_spinner=False)
def _request_table(root: str, run_id: str) -> pd.DataFrame:
    """A run's per-request table; a run's folder never changes once written, so it is read once."""
    return History(root).requests(run_id)


# ---- past sweeps -----------------------------------------------------------------------------


def past_sweeps_section(history: History, runs: pd.DataFrame | None) -> None:
    if runs is None:  # the page said why
        return
    try:
        table = past_sweeps(history, runs)
    except BenchError as exc:
        st.error(plain(exc))
        return
    if table.empty:
        st.caption("No sweep yet.")
        return
    table.insert(1, "open", SWEEP_PAGE_URL + "?sweep=" + table["sweep_id"])
    show_table(
        table, key="sweep_past_table", column_config={"open": st.column_config.LinkColumn("Sweep", display_text="open")}
    )


def _axis_label(name: str, server_fields: list[str]) -> str:
    """A setting to sweep as the selectbox names it: a field of the server command as the command writes it."""
    if name == NO_SECOND:
        return name
    return f"{{{name}}} (server command)" if name in server_fields else _setting_label(name)


def _setting_label(name: str) -> str:
    label = describe_column(name).label
    return name if label.lower().replace(" ", "_") == name else f"{name} ({label})"


def _title(name: str) -> str:
    return describe_column(name).title


def _tick(value: Any) -> str:
    return "none" if value is None else str(value)
