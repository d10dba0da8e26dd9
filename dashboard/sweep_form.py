"""The Sweep page's inputs: what to run (a sweep of one setting or two, or a capacity search), the values, the repeats
or a target margin of error, the run size, a server per run, and where the runs go (this machine or a Ray cluster).
`sweep_inputs` returns them as one dict; the base settings are the sidebar's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from bench_core.config import EngineConfig, format_value, setting
from bench_core.config.settings import widget_label
from bench_core.engines import backend as backend_of
from bench_core.load import output_length, takes
from bench_core.sweep import results as sweep_results
from bench_core.sweep.plan import CPU_SWEEP_OUTPUT_LEN, CPU_SWEEP_PROMPTS, DEFAULT_AXIS, DEFAULT_REPEATS, SWEEPABLE
from bench_core.sweep.store import CREDENTIAL_SETTINGS
from dashboard import sidebar
from dashboard.sweep_servers import fixed_server_settings, search_inputs, server_fields, server_inputs
from dashboard.sweep_widgets import NO_SECOND, axis_label, number_or_empty, sweep_number, title

SWEEP_SETTINGS, FIND_MAX = "Sweep settings", "Find the highest load within the SLO"
RUN_KINDS = (SWEEP_SETTINGS, FIND_MAX)


def settings_to_vary(sidebar_values: Mapping[str, Any]) -> list[str]:
    """The sweepable settings a run of the sidebar's backend, load pattern and dataset takes: what a sweep or a tune
    may vary."""
    return [
        name
        for name in SWEEPABLE
        if setting(name).applies(backend=sidebar_values["backend"], load_pattern=sidebar_values["load_pattern"])
        and takes(sidebar_values["dataset_name"], setting(name))
    ]


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
    search = search_inputs(sidebar.chosen_slo(sidebar_values)) if searching else None
    server = server_inputs() if serves else {"server_cmd": ""}
    fields = server_fields(server["server_cmd"])
    options = [*fields, *settings_to_vary(sidebar_values)]
    first, second, repeats = st.columns([2, 2, 1])
    if searching:  # a search may run at each value of one or two settings, or once
        name = first.selectbox(
            "At each value of (optional)",
            [NO_SECOND, *options],
            key="sweep_name_at",
            format_func=lambda option: axis_label(option, fields),
        )
    else:
        name = first.selectbox(
            "Sweep",
            options,
            index=options.index(DEFAULT_AXIS.name) if DEFAULT_AXIS.name in options else 0,
            key="sweep_name",
            format_func=lambda option: axis_label(option, fields),
        )
    values = _values_field(first, name, "sweep_values_at" if searching else "sweep_values", backend, fields)
    second_name = second.selectbox(
        "Against (optional, a grid)",
        [NO_SECOND, *options],
        key="sweep_name_2",
        format_func=lambda option: axis_label(option, fields),
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
    paired = {} if searching else speculation_inputs(sidebar_values, server["server_cmd"])
    axes = [(axis, text) for axis, text in ((name, values), (second_name, second_values)) if axis != NO_SECOND]
    swept = {axis for axis, _ in axes}
    credentials = {name: sidebar_values.get(name) or "" for name in CREDENTIAL_SETTINGS}
    fixed = fixed_server_settings([field for field in fields if field not in swept])
    return {
        "axes": axes,
        "repeats": 1 if searching else int(count),
        **_run_size_inputs(backend, sidebar_values["dataset_name"]),
        **server,
        "server_settings": fixed,
        "find_max": search,
        "precision": precision,
        **paired,
        **_cluster_inputs(),
        "credentials": credentials,
    }


def speculation_inputs(sidebar_values: Mapping[str, Any], server_cmd: str) -> dict[str, Any]:
    """Speculation against none at every point (--against-no-speculation): offered where the sidebar speculates, or
    for a server per run, whose command without speculation (--baseline-server-cmd) is asked for then."""
    if not (server_cmd or sidebar_values.get("speculative_algorithm")):
        return {}
    against = st.checkbox(
        "Against no speculation",
        key="sweep_against_no_speculation",
        help="Run every point also without speculation, on the same prompts (the embedded engine: both through "
        "generate()), and show per load TPOT with speculation over without, with its 95% paired interval, and the load "
        "at which speculation stops paying. It adds the axis speculation off/on: sweep one setting with it.",
    )
    if not against:
        return {}
    baseline = (
        st.text_input(
            "Server command without speculation",
            key="sweep_baseline_server_cmd",
            placeholder="lmdeploy serve api_server MODEL --server-port {port}",
            help="The same server as the command above, without its speculative decoding flags: the runs against "
            "no speculation start it (--baseline-server-cmd).",
        ).strip()
        if server_cmd
        else ""
    )
    return {"against_no_speculation": True, "baseline_server_cmd": baseline}


def precision_inputs(key: str) -> dict[str, Any] | None:
    """Repeats until the answer is clear (--target-moe, --max-repeats, --target-moe-metric), each input drawn from its
    declaration, their keys starting with `key`; None while no target is set (the repeats are then a fixed count)."""
    target_column, cap_column, metric_column = st.columns([1, 1, 2])
    target = sweep_number(target_column, setting("target_moe"), f"{key}_target_moe")
    max_repeats = sweep_number(cap_column, setting("max_repeats"), f"{key}_max_repeats")
    declared = setting("target_moe_metric")
    metric = metric_column.selectbox(
        widget_label(declared),
        sweep_results.SWEEP_METRICS,
        index=sweep_results.SWEEP_METRICS.index(declared.default),
        key=f"{key}_target_moe_metric",
        format_func=title,
        disabled=target is None,
        help=f"{declared.cli_flag}: {declared.cli_help}",
    )
    return None if target is None else {"target": target, "metric": metric, "max_repeats": max_repeats}


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
    num_prompts = number_or_empty(
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
        output_len = number_or_empty(
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
