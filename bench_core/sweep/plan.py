"""A sweep's plan: which settings vary over which values, the runs that cover them, and parsing them.

A sweep varies one setting, or two as a grid, over listed values and repeats every point K times;
everything else comes from a base `RunConfig` (the Run sidebar or the CLI flags). Its runs go
through the runner one at a time (sweep_driver), ordered so that runs sharing engine settings follow
each other and the engine is loaded once per distinct engine setting. The run's label repeats the point
for a reader ("concurrency=4 · repeat 2/3") but is never parsed back: sweep_store says how a history
row ties back to its sweep.
"""

from __future__ import annotations

import copy
import itertools
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from ..config import (
    SWEEPABLE,
    RunConfig,
    applies_under,
    check_values,
    format_value,
    pattern_label,
    setting,
)
from ..engines import availability, engine_settings_key
from ..errors import ConfigError
from ..load import output_length
from ..measure.catalog import SERVED_SPECULATIVE_COLUMNS, SPECULATIVE_COLUMNS, find_column
from ..measure.metrics import slo_is_set
from ..measure.stats import MIN_INTERVAL_RUNS
from ..redact import MASK
from ..run.preflight import run_problems
from ..run.run_again import change_problems, speculation_pair, without_speculation
from . import find_max
from .find_max import FindMax
from .precision import Precision
from .server import (
    DEFAULT_START_TIMEOUT_S,
    PORT,
    WIDEST_PORT,
    command_line,
    missing_program,
    remember_command_secrets,
    template_fields,
)
from .tune import Tune, check_space

MAX_AXES = 2
# The axis --against-no-speculation adds to a sweep of servers: each point runs on --baseline-server-cmd ("off") and
# on --server-cmd ("on"), recorded in the run's server settings as any field is.
SPECULATION = "speculation"
SPECULATION_OFF, SPECULATION_ON = "off", "on"
STARTED_SERVER_URL = "http://127.0.0.1"  # a server the sweep starts listens here, at the port its run is given


@dataclass(frozen=True)
class SweepAxis:
    """One swept setting (a flat config key, e.g. "cache_max_entry_count") and its values, in order; a server
    setting (`server`) is instead a field of the plan's server command, recorded in the run's server_settings."""

    name: str
    values: tuple[Any, ...]
    server: bool = False

    def __post_init__(self):
        object.__setattr__(self, "values", tuple(self.values))
        if not self.server and self.name not in SWEEPABLE:
            raise ConfigError(f"Cannot sweep '{self.name}'. Sweepable settings: {', '.join(SWEEPABLE)}.")
        if not self.values:
            raise ConfigError(f"The sweep over {self.name} lists no values.")
        repeated = sorted({_format(v) for v in self.values if self.values.count(v) > 1})
        if repeated:
            raise ConfigError(f"The sweep over {self.name} lists {', '.join(repeated)} more than once.")


# The sweep the Sweep page offers first, and the size of its runs on the embedded engine. On 2 CPU cores busy
# with other work (load average 6-7), SmolLM2-135M cached, through the CLI: 3 points x 2 repeats of 4 ShareGPT
# prompts x 32 tokens, streamed, took 122 s with the engine's load; with the Run page's first-run size (8 x 64)
# the first of the two repeats alone took 155 s. Other backends' runs keep the sidebar's size.
DEFAULT_AXIS = SweepAxis("concurrency", (1, 2, 4))
DEFAULT_REPEATS = 2
CPU_SWEEP_PROMPTS = 4
CPU_SWEEP_OUTPUT_LEN = 32


def with_run_size(config: RunConfig, num_prompts: int | None, output_len: int | None) -> RunConfig:
    """`config` with this many prompts and output tokens per request, set on the output length its dataset takes
    (ShareGPT's fixed length, the random one, the shared prefixes'...: the catalog's `output_length`); a dataset
    whose records say their own (a trace) keeps them. None keeps the config's own."""
    sized = copy.deepcopy(config)
    if num_prompts is not None:
        sized.dataset.num_prompts = num_prompts
    declared = output_length(sized.dataset.dataset_name)
    if output_len is not None and declared is not None:
        setattr(sized.dataset, declared.name, output_len)
    return sized


class PlannedRun(NamedTuple):
    """One run of a sweep: the swept values at its point, its repeat index (from 0) and its full config."""

    values: dict[str, Any]
    repeat: int
    config: RunConfig


@dataclass(frozen=True)
class SweepPlan:
    """A sweep: its id, the settings it starts from, one or two axes and the repeats per point. With `server_cmd`
    each run starts its own server from that template (sweep.server; the fixed server settings are in the base's
    server_settings); with `find_max` each point (of the server settings' axes, or the one point without) searches
    for the highest load that meets the SLO instead of running once per listed value (sweep.find_max); with
    `precision` each point runs `repeats` times (at least the fewest that give an interval), then more until its
    margin of error is within the target or the cap stops it (sweep.precision; the driver adds the runs beyond
    `points()`); with `tune`, its axes are a tune's search space, of any number of settings, whose points a search
    picks (sweep.tune) rather than running every one. With `baseline_server_cmd`, its SPECULATION axis runs each
    point's "off" runs on that server (the same one without speculation) and its "on" runs on `server_cmd`.

    Construction checks the shape only; `check()` validates every point's settings before any run.
    """

    sweep_id: str
    base: RunConfig
    axes: tuple[SweepAxis, ...]
    repeats: int = 1
    server_cmd: str = ""
    server_start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    find_max: FindMax | None = None
    precision: Precision | None = None
    tune: Tune | None = None
    baseline_server_cmd: str = ""

    def __post_init__(self):
        object.__setattr__(self, "axes", tuple(self.axes))
        if self.precision is not None:
            object.__setattr__(self, "repeats", max(self.repeats, MIN_INTERVAL_RUNS))
        names = [axis.name for axis in self.axes]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ConfigError(f"A sweep varies {twice[0]} twice; give each setting once with all its values.")
        if self.tune is not None:
            check_space(names)
            if self.find_max:
                raise ConfigError("A tune picks its points itself: drop --find-max.")
        elif not (0 if self.find_max else 1) <= len(names) <= MAX_AXES:
            raise ConfigError(f"A sweep varies one setting or two (a grid); got {len(names)}.")
        check_values(repeats=self.repeats, server_start_timeout_s=self.server_start_timeout_s)
        if self.find_max and (self.repeats != 1 or self.precision):
            raise ConfigError("--find-max probes each load once: drop --repeats and --target-moe.")
        if self.precision and self.repeats > self.precision.max_repeats:
            raise ConfigError(
                f"--repeats {self.repeats} is more than --max-repeats {self.precision.max_repeats}: a point runs at "
                "least --repeats times, at most --max-repeats."
            )
        if self.find_max and any(axis.name == self.find_max.setting for axis in self.axes):
            raise ConfigError(f"--find-max {self.find_max.setting} searches that setting: do not --sweep it too.")
        if any(axis.server for axis in self.axes) and not self.server_cmd:
            raise ConfigError("Server settings are swept only with --server-cmd.")
        if self.baseline_server_cmd and not self._is_server_setting(SPECULATION):
            raise ConfigError("--baseline-server-cmd is the server without speculation of --against-no-speculation.")
        if self.server_cmd:
            self._check_server_fields()

    @property
    def _templates(self) -> tuple[str, ...]:
        return tuple(filter(None, (self.server_cmd, self.baseline_server_cmd)))

    def _check_server_fields(self) -> None:
        """Every field of the server commands has a value, and every server setting given is a field of one."""
        fields: list[str] = []
        for template in self._templates:
            remember_command_secrets(template)
            fields += [name for name in template_fields(template) if name not in (PORT, *fields)]
        given = [
            *self.fixed_server_settings(),
            *(axis.name for axis in self.axes if axis.server and not self._pairs_servers(axis.name)),
        ]
        missing = [name for name in fields if name not in given]
        if missing:
            raise ConfigError(
                f"The server command's {', '.join('{' + name + '}' for name in missing)} has no value: "
                f"give --sweep {missing[0]}=V1,V2 or --server-setting {missing[0]}=VALUE."
            )
        unused = [name for name in given if name not in fields]
        if unused:
            raise ConfigError(f"The server command has no {{{unused[0]}}} field for the server setting {unused[0]}.")
        twice = [name for name in given if given.count(name) > 1]
        if twice:
            raise ConfigError(f"The server setting {twice[0]} is both swept and fixed: give it once.")

    def fixed_server_settings(self) -> dict[str, Any]:
        return server_settings_of(self.base)

    def _pairs_servers(self, name: str) -> bool:
        return bool(self.baseline_server_cmd) and name == SPECULATION

    def server_command(self, config: RunConfig, port: int) -> list[str]:
        """The command line that starts `config`'s server at `port`: the baseline's for a run without speculation."""
        settings = server_settings_of(config)
        paired = settings.pop(SPECULATION, None) if self.baseline_server_cmd else None
        return command_line(self.baseline_server_cmd if paired == SPECULATION_OFF else self.server_cmd, port, settings)

    @property
    def speculation_pairing(self) -> tuple[str, Any, Any] | None:
        """The axis that sets each point without speculation against it with, and its "off" and "on" values: the
        baseline server's, or speculative_algorithm's none against one algorithm; None for a sweep that has no such
        axis."""
        for axis in self.axes:
            if self._pairs_servers(axis.name):
                return SPECULATION, SPECULATION_OFF, SPECULATION_ON
            if (
                not axis.server
                and axis.name == "speculative_algorithm"
                and len(axis.values) == 2
                and None in axis.values
            ):
                return axis.name, None, next(value for value in axis.values if value is not None)
        return None

    def grid(self) -> list[dict[str, Any]]:
        """Every point, the first axis varying slowest."""
        names = [axis.name for axis in self.axes]
        return [dict(zip(names, combo)) for combo in itertools.product(*(axis.values for axis in self.axes))]

    def points(self, repeats: int | None = None) -> list[PlannedRun]:
        """Every run in execution order: points grouped by engine settings (one engine load per group,
        in the order the groups first appear), and within a group the repeats as rounds over its
        points, so a slow drift of the machine spreads over all points instead of biasing one. `repeats`: that many
        per point instead of the plan's (a target's cap: the most a sweep may run)."""
        return [
            PlannedRun(values, repeat, self.config_at(values, repeat))
            for group in self.engine_groups()
            for repeat in range(self.repeats if repeats is None else repeats)
            for values in group
        ]

    def engine_groups(self) -> list[list[dict[str, Any]]]:
        """The points grouped by the engine settings they load, in the order the groups first appear."""
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for values in self.grid():
            config = self.config_at(values)
            groups.setdefault(engine_settings_key(config.engine, config.load), []).append(values)
        return list(groups.values())

    def config_at(self, values: dict[str, Any], repeat: int | None = None) -> RunConfig:
        """The base config with `values` set; with a repeat index, labelled with the point and repeat."""
        config = copy.deepcopy(self.base)  # runs share no part objects: changing one changes no other
        server = self.fixed_server_settings()
        for name, value in values.items():
            if self._is_server_setting(name):
                server[name] = value
            else:
                setattr(config.part(setting(name).part), name, value)
        if "speculative_algorithm" in values and values["speculative_algorithm"] is None:  # no draft loaded either
            without_speculation(config)
        if server:
            config.engine.server_settings = json.dumps(server)
        if repeat is not None:
            tag = describe_point(values) + self.repeat_text(repeat)
            config.label = f"{self.base.label} · {tag}" if self.base.label else tag
        return config

    def repeat_text(self, repeat: int) -> str:
        """ " · repeat 2/3" ("" when the plan runs each point once); with a target, " · repeat 4 (at most 10)"."""
        if self.precision is not None:
            return f" · repeat {repeat + 1} (at most {self.precision.max_repeats})"
        return f" · repeat {repeat + 1}/{self.repeats}" if self.repeats > 1 else ""

    def values_of(self, config: RunConfig) -> dict[str, Any]:
        """The values `config` has for the swept settings: the point it is at."""
        server = server_settings_of(config)
        return {axis.name: server.get(axis.name) if axis.server else config.value(axis.name) for axis in self.axes}

    def _is_server_setting(self, name: str) -> bool:
        return any(axis.server and axis.name == name for axis in self.axes)

    @property
    def speculative(self) -> bool:
        """Whether some point decodes speculatively (or a server's, against none): its acceptance is shown ("not
        reported" where not reported)."""
        return self.speculation_pairing is not None or any(
            self.config_at(values).engine.speculative_algorithm for values in self.grid()
        )

    @property
    def speculative_columns(self) -> tuple[str, ...]:
        """The acceptance figures a speculative sweep shows: its servers' (from /metrics) where its runs reach servers,
        else the engine's; none for a sweep that does not speculate."""
        if not self.speculative:
            return ()
        return SERVED_SPECULATIVE_COLUMNS if self.base.engine.base_url else SPECULATIVE_COLUMNS

    def check(self, runs_here: bool = True) -> None:
        """Raise one ConfigError naming every impossible point and why, or the missing backend. Whether this
        machine can run the backend matters only when the runs are here (`runs_here`): a driver without a GPU
        may send a turbomind sweep to a cluster's GPU nodes, whose workers then say what they lack."""
        if any(MASK in template for template in self._templates):
            raise ConfigError(
                "The sweep's saved server command masks a credential, so its server cannot be started "
                "again from it: start a new sweep, with the credential in an environment variable the "
                "server reads."
            )
        for template in self._templates if runs_here else ():
            if missing := missing_program(template):
                raise ConfigError(
                    f"The server command's program '{missing}' is not on this machine (not on PATH, nor a "
                    "file that can be run): check its spelling, or give its full path."
                )
        for values in self.grid() if self.server_cmd else ():  # a field that cannot be filled is refused now
            self.server_command(self.config_at(values), WIDEST_PORT)
        backend = self.base.engine.backend
        unused = [
            setting(axis.name)
            for axis in self.axes
            if not axis.server and setting(axis.name).is_knob and not setting(axis.name).applies(backend=backend)
        ]
        if unused:
            raise ConfigError(" ".join(f"Cannot sweep {knob.name}: {knob.not_applicable(backend)}" for knob in unused))
        idle = [
            setting(axis.name)
            for axis in self.axes
            if not axis.server and not setting(axis.name).applies(load_pattern=self.base.load.load_pattern)
        ]
        searched = setting(self.find_max.setting) if self.find_max else None
        if searched is not None and not searched.applies(load_pattern=self.base.load.load_pattern):
            raise ConfigError(  # every probe would run alike
                f"Cannot search {searched.name} under the {pattern_label(self.base.load.load_pattern)} load pattern: "
                f"{applies_under(searched)}"
            )
        if idle:  # every point would run alike
            raise ConfigError(
                " ".join(
                    f"Cannot sweep {declared.name} under the {pattern_label(self.base.load.load_pattern)} load "
                    f"pattern: {applies_under(declared)}"
                    for declared in idle
                )
            )
        self._check_target_metric()
        grid = self.grid()
        points_by_problem: dict[str, list[dict[str, Any]]] = {}
        for values in grid:
            config = self.config_at(values)
            problems = run_problems(config)
            for problem in problems:
                points_by_problem.setdefault(problem, []).append(values)
        messages = [f"{self._where(points)}: {problem}" for problem, points in points_by_problem.items()]
        if not messages and runs_here:
            reason = availability(self.base.engine.backend)
            messages = [reason] if reason else []
        if messages:
            raise ConfigError(" ".join(messages))

    def _check_target_metric(self) -> None:
        """A target on a metric some points do not measure (a TTFT unstreamed) would run those points to the cap."""
        if self.precision is None:
            return
        found = find_column(self.precision.metric)
        if found is None or not found[0].needs_streaming:
            return
        unstreamed = [values for values in self.grid() if not self.config_at(values).load.stream_output]
        if unstreamed:
            raise ConfigError(
                f"{self._where(unstreamed)} would never reach the target: --target-moe-metric "
                f"{self.precision.metric} is measured on streamed runs only. Add --stream-output, or choose "
                "another metric."
            )

    def _where(self, points: list[dict[str, Any]]) -> str:
        """The bad points, as briefly as they allow: every point, the points with some values of one
        axis (a grid's whole row or column), or the points one by one."""
        grid = self.grid()
        if len(points) == len(grid):
            return "Every sweep point"
        for axis in self.axes:
            bad_values = [value for value in axis.values if any(point[axis.name] == value for point in points)]
            if len(points) == sum(point[axis.name] in bad_values for point in grid):
                return f"Sweep points with {axis.name}={' or '.join(_format(value) for value in bad_values)}"
        return "Sweep points " + "; ".join(describe_point(point) for point in points)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, so a half-done sweep can be rebuilt and resumed later (`from_dict`)."""
        return {
            "sweep_id": self.sweep_id,
            "base": self.base.to_flat_dict(),
            "axes": [
                {"name": axis.name, "values": list(axis.values), **({"server": True} if axis.server else {})}
                for axis in self.axes
            ],
            "repeats": self.repeats,
            **(
                {"server_cmd": self.server_cmd, "server_start_timeout_s": self.server_start_timeout_s}
                if self.server_cmd
                else {}
            ),
            **({"find_max": self.find_max.to_dict()} if self.find_max else {}),
            **({"precision": self.precision.to_dict()} if self.precision else {}),
            **({"tune": self.tune.to_dict()} if self.tune else {}),
            **({"baseline_server_cmd": self.baseline_server_cmd} if self.baseline_server_cmd else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepPlan:
        axes = tuple(SweepAxis(axis["name"], tuple(axis["values"]), bool(axis.get("server"))) for axis in data["axes"])
        find_max = FindMax.from_dict(data["find_max"]) if data.get("find_max") else None
        precision = Precision.from_dict(data["precision"]) if data.get("precision") else None
        tune = Tune.from_dict(data["tune"]) if data.get("tune") else None
        base = RunConfig.from_flat_dict(data["base"])
        if data.get("server_cmd") and not data["base"].get("model"):
            base.engine.model = ""  # each run asks its server (an empty cell would read back as the default model)
        return cls(
            data["sweep_id"],
            base,
            axes,
            int(data["repeats"]),
            data.get("server_cmd", ""),
            float(data.get("server_start_timeout_s", DEFAULT_START_TIMEOUT_S)),
            find_max,
            precision,
            tune,
            data.get("baseline_server_cmd", ""),
        )


def plan_for(
    base: RunConfig,
    sweeps: Sequence[str],
    repeats: int = 1,
    server_cmd: str = "",
    server_settings: Sequence[str] = (),
    server_start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    search: FindMax | None = None,
    precision: Precision | None = None,
    tune: Tune | None = None,
    against_no_speculation: bool = False,
    baseline_server_cmd: str = "",
) -> SweepPlan:
    """The sweep that `sweep restful|pipeline` and the Sweep page describe: its axes as NAME=V1,V2 texts (a field of
    `server_cmd` is a server setting), the server command's fixed settings as NAME=VALUE texts, over `base`, its
    repeats fixed or up to a target (`precision`); ConfigError for a server or search setting that cannot work. Built
    the same way from flags and from widgets. With `tune`, the axes are its search space (`tune ... --space`). With
    `against_no_speculation`, every point also runs without speculation on the same prompts (`paired_axis`)."""
    fields = tuple(template_fields(server_cmd)) if server_cmd else ()
    if baseline_server_cmd:
        fields += tuple(template_fields(baseline_server_cmd))
    if server_settings and not server_cmd:
        raise ConfigError("--server-setting fills a field of --server-cmd: give --server-cmd too.")
    axes = tuple(parse_sweep_arg(text, fields) for text in sweeps)
    if search is None and tune is None and not axes:
        raise ConfigError("Give --sweep NAME=V1,V2 (or, for a server, --find-max).")
    base = copy.deepcopy(base)
    if against_no_speculation:
        base, paired = paired_axis(base, axes, server_cmd, baseline_server_cmd, search)
        axes = (*axes, paired)
    elif baseline_server_cmd:
        raise ConfigError("--baseline-server-cmd is the server without speculation: add --against-no-speculation.")
    fixed = dict(parse_server_setting(text) for text in server_settings)
    if fixed:
        base.engine.server_settings = json.dumps(fixed)
    if server_cmd:
        base.engine.base_url = STARTED_SERVER_URL  # each run's port is chosen when its server starts (sweep.driver)
    return SweepPlan(
        new_sweep_id("tune" if tune else "sweep"),
        base,
        axes,
        repeats,
        server_cmd,
        server_start_timeout_s,
        search,
        precision,
        tune,
        baseline_server_cmd if against_no_speculation else "",
    )


def paired_axis(
    base: RunConfig, axes: tuple[SweepAxis, ...], server_cmd: str, baseline_server_cmd: str, search: FindMax | None
) -> tuple[RunConfig, SweepAxis]:
    """The axis that runs every point of a sweep without speculation and with it, last so that a point's two runs
    follow each other, and the base it needs: the same decode path for both (run_again.speculation_pair); ConfigError
    where the sweep cannot pair them."""
    if search is not None:
        raise ConfigError("--find-max probes one load at a time: drop --against-no-speculation.")
    if len(axes) >= MAX_AXES:
        raise ConfigError(
            "--against-no-speculation adds the axis speculation off/on to the sweep: sweep one setting with it."
        )
    if server_cmd:
        if not baseline_server_cmd:
            raise ConfigError(
                "Speculation is set in the server's command: give --baseline-server-cmd, the same server without it, "
                "for the runs against no speculation."
            )
        return base, SweepAxis(SPECULATION, (SPECULATION_OFF, SPECULATION_ON), server=True)
    if base.engine.base_url:
        raise ConfigError(
            "A running server's speculation cannot be turned off from here: start one per run with --server-cmd "
            "and --baseline-server-cmd (the same server without speculation)."
        )
    off, on = speculation_pair(base)
    on.label = base.label
    return on, SweepAxis("speculative_algorithm", (off.engine.speculative_algorithm, on.engine.speculative_algorithm))


def change_sweep(config: RunConfig, name: str, value: Any, precision: Precision) -> SweepPlan:
    """ "Run again with one thing changed" until the answer is clear: a sweep of the ended run's `config` over setting
    `name` at the run's value and at `value`, each point repeated until `precision`'s target or its cap, so that the
    two are compared over their repeats (the ended run, measured once, is not one of them). ConfigError where the
    change cannot be (run_again.change_problems) or a sweep does not vary the setting."""
    if problems := change_problems(config, name, value):
        raise ConfigError(" ".join(problems))
    if name not in SWEEPABLE:
        raise ConfigError(
            f"{setting(name).title} is run again once, not until a target: a sweep does not vary it. Leave the "
            "target empty."
        )
    return SweepPlan(
        new_sweep_id(), copy.deepcopy(config), (SweepAxis(name, (config.value(name), value)),), precision=precision
    )


def capacity_search(
    load_setting: str,
    base: RunConfig,
    start: float | None = None,
    precision: float = find_max.DEFAULT_PRECISION,
    target: float = find_max.DEFAULT_TARGET,
    limit: float | None = None,
    max_probes: int = find_max.DEFAULT_MAX_PROBES,
    max_time_s: float = find_max.DEFAULT_MAX_TIME_S,
) -> FindMax:
    """The search for the highest `load_setting` within `base`'s SLO (`--find-max`), from `start` (default
    find_max.DEFAULT_START) up to `limit` (default: the number of prompts for a concurrency, LIMIT_FACTOR times the
    start for a rate); ConfigError without an SLO or for a setting out of its bounds."""
    if not slo_is_set(base.slo):
        raise ConfigError(
            "--find-max looks for the highest load within an SLO: give --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-ms."
        )
    if load_setting not in find_max.SEARCHABLE:
        raise ConfigError(f"--find-max searches {' or '.join(find_max.SEARCHABLE)}, not '{load_setting}'.")
    start = find_max.DEFAULT_START[load_setting] if start is None else start
    if limit is None:
        limit = (
            base.dataset.num_prompts
            if load_setting == "max_concurrency"
            else min(start * find_max.LIMIT_FACTOR, find_max.HIGHEST_LOAD)
        )
    whole = load_setting == "max_concurrency" and float(start).is_integer()
    return FindMax(load_setting, int(start) if whole else start, precision, target, limit, max_probes, max_time_s)


def parse_server_setting(text: str) -> tuple[str, int | float | str]:
    """ "max_batch_size=128" -> ("max_batch_size", 128): a fixed value of a field of the server command."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise ConfigError(f"'{text}' is not a server setting: write NAME=VALUE (e.g. max_batch_size=128).")
    return name.strip(), parse_server_value(value)


def new_sweep_id(kind: str = "sweep") -> str:
    """Sortable by start time and readable, e.g. sweep-20261130-081530-ab12 (a tune's: tune-...)."""
    return f"{kind}-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def parse_sweep_arg(text: str, server_fields: tuple[str, ...] = ()) -> SweepAxis:
    """ "concurrency=1,2,4" -> SweepAxis("concurrency", (1, 2, 4)), values typed as the setting's field.

    Names are flat config keys with '-' or '_' (cache-max-entry-count, async); "none" or an empty
    value unsets an optional setting; quant_policy takes LMDeploy's names (int8) too. A name among
    `server_fields` (the server command's fields) is a server setting, whatever else it names: its values are
    numbers where they read as numbers, else text (`parse_server_value`).
    """
    name_text, equals, values_text = text.partition("=")
    if not equals:
        raise ConfigError(f"'{text}' is not a sweep: write NAME=V1,V2 (e.g. concurrency=1,2,4).")
    if name_text.strip() in server_fields:
        return SweepAxis(
            name_text.strip(), tuple(parse_server_value(value) for value in values_text.split(",")), server=True
        )
    name = canonical_name(name_text)
    return SweepAxis(name, tuple(_parse_value(name, value) for value in values_text.split(",")))


def parse_server_value(text: str) -> int | float | str:
    """A server setting's value: an int or a float where the text reads as one (so it charts as a number), else the
    text itself; it goes back into the command as written (format_value: 4, not 4.0)."""
    text = text.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def server_settings_of(config: RunConfig) -> dict[str, Any]:
    """The server settings a run's config records (empty: not a server the sweep started)."""
    return parse_server_settings(config.engine.server_settings)


def parse_server_settings(text: str) -> dict[str, Any]:
    """A server_settings value (a JSON object, or "") as the settings it records."""
    return dict(json.loads(text)) if text else {}


def canonical_name(text: str) -> str:
    """A setting's flat config key from how a user may write it; ConfigError listing the valid ones."""
    name = text.strip().lstrip("-").replace("-", "_").lower()
    for candidate in (name, name + "_"):  # async -> async_
        if candidate in SWEEPABLE:
            return candidate
    raise ConfigError(f"Cannot sweep '{text.strip()}'. Sweepable settings: {', '.join(SWEEPABLE)}.")


def describe_point(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}={_format(value)}" for name, value in values.items())


def _parse_value(name: str, text: str) -> Any:
    """One value typed as the setting `name` is; ConfigError naming the setting and what it takes."""
    declared = setting(name)
    try:
        value = declared.parse_text(text)
    except ValueError:
        raise ConfigError(f"Sweep value '{text.strip()}' for {name} is not {declared.text_rule}.") from None
    if declared.choices and value not in declared.choices:
        choices = ", ".join(_format(choice) for choice in declared.choices)
        raise ConfigError(f"Sweep value '{text.strip()}' for {name} is not one of its choices: {choices}.")
    return value


def _format(value: Any) -> str:
    return format_value(value) if value is None else str(value)
