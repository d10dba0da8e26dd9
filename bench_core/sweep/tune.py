"""A tune: which settings to run (`tune pipeline|restful ... --space NAME=V1,V2 ... --objective METRIC --slo ...`).

A tune is a sweep plan (its axes the search space, any number of them) with a `Tune`: the catalog metric to maximise
or minimise, the bounds other catalog metrics must keep (the SLO: TTFT/TPOT/E2E percentiles, goodput, failed
requests; the quality guard's exact-match rate and accuracy), the trial budget and the seed. Optuna's TPE sampler
proposes each trial's point, told of the bounds as the trial's constraints (optuna's `set_constraint`), so that it learns where the feasible
region is rather than being told a penalised objective. Each trial is a point run `repeats` times (or until the
sweep's `--target-moe`), every run in the history under the tune's id; the trial's values are the means over its runs.

What stays of a trial besides its runs is one journal row (`trials_of`): its point, its runs and why it stopped early;
its values are read back from the history, so a resume (`study_from`) rebuilds the study from the same records the
report reads, and nothing is kept twice. A trial stops early once a bound cannot be met whatever its remaining requests
do (`broken_for_sure`, a pure rule); it counts as breaking that bound.

Pure, but for `new_study` and `record_trial`, which hold optuna's state: space and bound parsing, the constraint
values, the trial table, the Pareto front against the tightest bound, and the deployment commands of the best point.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..config import SWEEPABLE, RunConfig
from ..errors import ConfigError
from ..measure.catalog import SWEPT_COLUMNS, column_direction, column_label, find_column, with_derived
from ..measure.stats import CONFIDENCE, describe, pareto_front

DEFAULT_TRIALS = 10
DEFAULT_SEED = 0
DEFAULT_OBJECTIVE = "output_throughput"
# How the points are picked: TPE, or at random (a same-size random sample of the space: the baseline TPE must beat).
SEARCHES = ("tpe", "random")
# TPE samples at random for its first trials, then from its model of the good and the bad ones: a quarter of a
# small budget (at least 2 trials) leaves it most of the budget to use what it learnt.
LEAST_STARTUP_TRIALS = 2
# When TPE proposes a point already measured, it is told the measured values again, without running: this many
# proposals in a row of measured points end the tune (the sampler sees nothing new it would try).
MOST_REPEATED_PROPOSALS = 200
LMDEPLOY_BACKENDS = ("turbomind", "pytorch")
LMDEPLOY_PORT = 23333  # `lmdeploy serve api_server`'s own default, which a deployed server's {port} gets
# The per-request latencies a bound on their statistic can be decided on before the run ends (broken_for_sure).
EARLY_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
_BOUND = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(<=|>=)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Bound:
    """A catalog metric's bound: `metric` (a history column, e.g. p99_ttft_ms) at most or at least `limit`."""

    metric: str
    at_most: bool
    limit: float

    def excess(self, value: float) -> float:
        """How far `value` is beyond the bound, in units of the limit's size (optuna's constraint value: <= 0 keeps
        it, > 0 breaks it); a missing value (NaN) breaks it by 1."""
        if math.isnan(value):
            return 1.0
        beyond = value - self.limit if self.at_most else self.limit - value
        return beyond / (abs(self.limit) or 1.0)

    def __str__(self) -> str:
        return f"{self.metric}{'<=' if self.at_most else '>='}{self.limit:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "at_most": self.at_most, "limit": self.limit}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Bound:
        return cls(str(data["metric"]), bool(data["at_most"]), float(data["limit"]))


@dataclass(frozen=True)
class Tune:
    """What a tune looks for: `objective` (a history column) at its best (`maximize`) within `bounds`, in at most
    `trials` points picked by `search` (SEARCHES) seeded with `seed`."""

    objective: str = DEFAULT_OBJECTIVE
    maximize: bool = True
    bounds: tuple[Bound, ...] = ()
    trials: int = DEFAULT_TRIALS
    seed: int = DEFAULT_SEED
    search: str = SEARCHES[0]

    def __post_init__(self):
        object.__setattr__(self, "bounds", tuple(self.bounds))
        catalog_column(self.objective, "--objective")
        if self.trials < 1:
            raise ConfigError(f"--trials must be at least 1; got {self.trials}.")
        if self.search not in SEARCHES:
            raise ConfigError(f"--search takes {' or '.join(SEARCHES)}; got '{self.search}'.")

    def constraints(self, values: Mapping[str, float]) -> list[float]:
        """Each bound's constraint value (Bound.excess) for a trial's metric `values`."""
        return [bound.excess(float(values.get(bound.metric, math.nan))) for bound in self.bounds]

    @property
    def metrics(self) -> tuple[str, ...]:
        """The columns a trial is judged on: the objective, then each bound's metric."""
        return tuple(dict.fromkeys([self.objective, *(bound.metric for bound in self.bounds)]))

    def describe(self) -> str:
        """ "maximise Output throughput within p99_ttft_ms<=500, failed<=0"."""
        within = f" within {', '.join(map(str, self.bounds))}" if self.bounds else ""
        return f"{'maximise' if self.maximize else 'minimise'} {column_title(self.objective)}{within}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "maximize": self.maximize,
            "bounds": [bound.to_dict() for bound in self.bounds],
            "trials": self.trials,
            "seed": self.seed,
            "search": self.search,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tune:
        return cls(
            str(data["objective"]),
            bool(data["maximize"]),
            tuple(Bound.from_dict(bound) for bound in data["bounds"]),
            int(data["trials"]),
            int(data["seed"]),
            str(data.get("search", SEARCHES[0])),
        )


def catalog_column(name: str, flag: str) -> tuple[Any, str]:
    """The catalog metric and statistic of the history column `name`; ConfigError naming a few that exist."""
    found = find_column(name)
    if found is None:
        raise ConfigError(
            f"{flag}: '{name}' is not a catalog metric's column (e.g. {', '.join(SWEPT_COLUMNS[:9])}, failed, "
            "drift_exact_match_rate, quality_accuracy)."
        )
    return found


def column_title(name: str) -> str:
    metric, statistic = catalog_column(name, "metric")
    unit = metric.shown_unit
    return column_label(metric, statistic) + (f" ({unit})" if unit else "")


def tune_for(
    objective: str = DEFAULT_OBJECTIVE,
    direction: str = "",
    bounds: Sequence[str] = (),
    trials: int = DEFAULT_TRIALS,
    seed: int = DEFAULT_SEED,
    min_exact_match: float | None = None,
    min_accuracy: float | None = None,
    search: str = SEARCHES[0],
) -> Tune:
    """The tune the CLI's flags describe: `direction` "max" or "min", by default the objective's better one; each
    bound as METRIC<=LIMIT or METRIC>=LIMIT; the quality floors as bounds on the quality guard's metrics."""
    metric, statistic = catalog_column(objective, "--objective")
    if direction:
        maximize = direction == "max"
    else:
        better = column_direction(metric, statistic)
        if better is None:
            raise ConfigError(f"--objective {objective} has no better direction: give --direction max or min.")
        maximize = better
    parsed = [parse_bound(text) for text in bounds]
    floors = {"drift_exact_match_rate": min_exact_match, "quality_accuracy": min_accuracy}
    parsed += [Bound(name, False, floor) for name, floor in floors.items() if floor is not None]
    twice = sorted({str(bound) for bound in parsed if parsed.count(bound) > 1})
    if twice:
        raise ConfigError(f"--slo {twice[0]} is given twice.")
    return Tune(objective, maximize, tuple(parsed), trials, seed, search)


def parse_bound(text: str) -> Bound:
    """ "p99_ttft_ms<=500" -> Bound("p99_ttft_ms", True, 500.0); ConfigError in one line for anything else."""
    match = _BOUND.match(text)
    if not match:
        raise ConfigError(
            f"--slo '{text}' is not a bound: write METRIC<=LIMIT or METRIC>=LIMIT (e.g. p99_ttft_ms<=500)."
        )
    name, operator, limit_text = match.groups()
    catalog_column(name, "--slo")
    try:
        limit = float(limit_text)
    except ValueError:
        raise ConfigError(f"--slo '{text}': '{limit_text}' is not a number.") from None
    if not math.isfinite(limit):
        raise ConfigError(f"--slo '{text}': the limit must be a finite number.")
    return Bound(name, operator == "<=", limit)


def check_space(names: Sequence[str]) -> None:
    """A tune's space needs at least one setting; each is sweepable (SweepAxis says so for a wrong one)."""
    if not names:
        raise ConfigError(f"Give --space NAME=V1,V2 (one or more). Sweepable settings: {', '.join(SWEEPABLE)}.")


def broken_for_sure(bound: Bound, seen: np.ndarray, total: int) -> bool:
    """Whether `bound` on a per-request latency's statistic (a percentile, the mean, the maximum) is broken whatever
    the run's other requests do, from the latencies `seen` (seconds) of the requests served so far, of `total`: the
    statistic is beyond the limit even with every other request at 0 s, the fastest it could be (each statistic only
    falls as one value does, and a request that fails leaves the statistic as a 0 s one would at best). A lower bound,
    or a metric known only at the end, is never broken early."""
    found = find_column(bound.metric)
    if not bound.at_most or found is None or found[0].key not in EARLY_METRICS or total <= 0:
        return False
    metric, statistic = found
    seen = np.asarray(seen, dtype=float)
    seen = seen[np.isfinite(seen)]
    if not seen.size or not (statistic in ("mean", "max") or statistic.startswith("p")):
        return False
    fastest = np.concatenate([seen, np.zeros(max(total - seen.size, 0))])
    if statistic == "mean":
        value = float(fastest.mean())
    elif statistic == "max":
        value = float(fastest.max())
    else:
        value = float(np.percentile(fastest, float(statistic[1:])))
    return value * metric.display_scale > bound.limit


# A trial's record: its number, its point (JSON), its runs (ids, space-separated) and why it stopped early ("" where
# its runs ran to their end). Its metric values are the history's.
TRIAL_COLUMNS = ("number", "point", "runs", "stopped_early")


@dataclass(frozen=True)
class Trial:
    """One trial: its point, its runs' ids, why it stopped early, and the means of the tune's metrics over its runs
    (`values`), with the objective's 95% interval over them (`low`, `high`; NaN with fewer than three runs)."""

    number: int
    point: dict[str, Any]
    runs: tuple[str, ...]
    stopped_early: str
    values: dict[str, float] = field(default_factory=dict)
    low: float = math.nan
    high: float = math.nan

    def constraints(self, tune: Tune) -> list[float]:
        """Its constraint values; one stopped early breaks the bound that stopped it, whatever its partial run says."""
        values = tune.constraints(self.values)
        if self.stopped_early:
            values = [
                value if str(bound) not in self.stopped_early else max(value, 1.0)
                for bound, value in zip(tune.bounds, values)
            ]
        return values

    def feasible(self, tune: Tune) -> bool:
        return all(value <= 0 for value in self.constraints(tune)) and not math.isnan(self.objective(tune))

    def objective(self, tune: Tune) -> float:
        return float(self.values.get(tune.objective, math.nan))


def trials_with_values(journal: pd.DataFrame, history_runs: pd.DataFrame, tune: Tune) -> list[Trial]:
    """The journal's trials (trials_of's rows) with their metric values read from the history (`History.load()`):
    the means over each trial's runs that are there (a run stopped early keeps what it measured)."""
    rows = with_derived(history_runs) if not history_runs.empty else history_runs
    by_id = rows.set_index(rows["run_id"].astype(str)) if "run_id" in rows else rows
    trials = []
    for record in journal.to_dict("records"):
        run_ids = tuple(str(record["runs"]).split())
        mine = by_id.loc[[run_id for run_id in run_ids if run_id in by_id.index]]
        values: dict[str, float] = {}
        low = high = math.nan
        for metric in tune.metrics:
            column = pd.to_numeric(mine[metric], errors="coerce") if metric in mine else pd.Series(dtype=float)
            found = find_column(metric)
            summary = describe(column, CONFIDENCE, found[0].bounds if found else (-math.inf, math.inf))
            values[metric] = summary.mean
            if metric == tune.objective:
                low, high = summary.ci_low, summary.ci_high
        trials.append(
            Trial(
                int(record["number"]),
                json.loads(record["point"]),
                run_ids,
                str(record["stopped_early"] or ""),
                values,
                low,
                high,
            )
        )
    return trials


def best_trial(trials: Sequence[Trial], tune: Tune) -> Trial | None:
    """The feasible trial with the best objective (the first such, on a tie); None when none is feasible."""
    feasible = [trial for trial in trials if trial.feasible(tune)]
    if not feasible:
        return None
    sign = 1 if tune.maximize else -1
    return max(feasible, key=lambda trial: (sign * trial.objective(tune), -trial.number))


def tightest_bound(trials: Sequence[Trial], tune: Tune) -> Bound | None:
    """The bound the best trial is closest to (the least slack), or the first bound without a best one; None without
    bounds. The Pareto front sets the objective against it: what more of the objective would cost."""
    if not tune.bounds:
        return None
    best = best_trial(trials, tune)
    if best is None:
        return tune.bounds[0]
    slack = best.constraints(tune)
    return tune.bounds[int(np.argmax(slack))]


def trial_table(trials: Sequence[Trial], tune: Tune) -> pd.DataFrame:
    """One row per trial: its number, its point's settings, its runs, the tune's metrics, whether it kept every bound
    (and which it broke), and why it stopped early."""
    rows = []
    for trial in trials:
        broken = [str(bound) for bound, value in zip(tune.bounds, trial.constraints(tune)) if value > 0]
        rows.append(
            {
                "trial": trial.number,
                **trial.point,
                "runs": len(trial.runs),
                **{metric: trial.values.get(metric, math.nan) for metric in tune.metrics},
                "within bounds": "yes" if trial.feasible(tune) else "no: " + (", ".join(broken) or "no value"),
                "stopped early": trial.stopped_early or "-",
            }
        )
    return pd.DataFrame(rows)


def front(trials: Sequence[Trial], tune: Tune) -> pd.DataFrame:
    """The trials no other beats on both the objective and the tightest bound's metric (its better direction): the
    trade-off the bound imposes, each row with the trial's point and the two values. A trial stopped early is left
    out (its partial run's figures are not the point's). Empty without a bound."""
    bound = tightest_bound(trials, tune)
    table = trial_table([trial for trial in trials if not trial.stopped_early], tune)
    if bound is None or table.empty or bound.metric == tune.objective:
        return table.iloc[0:0]
    measured = table.dropna(subset=[tune.objective, bound.metric])
    if measured.empty:
        return measured
    metric, statistic = catalog_column(bound.metric, "--slo")
    better = column_direction(metric, statistic)
    bound_larger_better = (not bound.at_most) if better is None else better
    on_front = pareto_front(measured[bound.metric], measured[tune.objective], bound_larger_better, tune.maximize)
    return measured[on_front].sort_values(bound.metric, kind="stable").reset_index(drop=True)


def describe_best(trial: Trial, tune: Tune, point: str) -> str:
    """ "concurrency=8, max_batch_tokens=256: Output throughput (tok/s) 41.2 [95% CI 39.0, 43.1] over 3 runs", `point`
    the trial's point as plan.describe_point writes it."""
    value = trial.objective(tune)
    interval = (
        f" [95% CI {trial.low:.4g}, {trial.high:.4g}]"
        if not math.isnan(trial.low)
        else " (too few runs for a 95% interval)"
        if len(trial.runs) > 1
        else ""
    )
    return (
        f"{point}: {column_title(tune.objective)} {value:.4g}{interval} over "
        f"{len(trial.runs)} run{'s' if len(trial.runs) != 1 else ''}"
    )


def space_size(axes: Sequence[Any]) -> int:
    """How many points the space holds (every combination of the axes' values)."""
    return int(np.prod([len(axis.values) for axis in axes])) if axes else 0


def describe_search(axes: Sequence[Any], tune: Tune, repeats: int) -> str:
    """ "at most 6 of the space's 12 points, picked by TPE (seed 0), each run 2 times, to maximise Output throughput
    (tok/s) within ..."."""
    space = space_size(axes)
    runs = f", each run {repeats} times" if repeats > 1 else ""
    picked = "at random" if tune.search == "random" else "by TPE"
    return (
        f"at most {min(tune.trials, space)} of the space's {space} points, picked {picked} (seed {tune.seed}){runs}, "
        f"to {tune.describe()}"
    )


def deploy_commands(
    config: RunConfig, server_cmd: str = "", server_settings: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """How to deploy the settings of `config` (the best trial's), as (what, text) pairs: for LMDeploy's backends the
    `lmdeploy serve api_server` line and the engine config the pipeline takes; for a server the tune started, its
    command template filled in with `server_settings` (at LMDeploy's default port). The embedded engine has no server
    of its own: none."""
    from .server import command_line

    commands = []
    if server_cmd:
        words = command_line(server_cmd, LMDEPLOY_PORT, server_settings or {})
        commands.append(("server command", shlex.join(words)))
    if config.engine.backend in LMDEPLOY_BACKENDS:
        from ..engines.lmdeploy_configs import FIXED_FIELDS, engine_config_kwargs

        kwargs = engine_config_kwargs(config.engine, config.load)
        served = {name: value for name, value in kwargs.items() if name not in FIXED_FIELDS[config.engine.backend]}
        commands.append(("lmdeploy serve", api_server_line(config.engine.model, config.engine.backend, served)))
        config_class = "TurbomindEngineConfig" if config.engine.backend == "turbomind" else "PytorchEngineConfig"
        arguments = ", ".join(f"{name}={value!r}" for name, value in kwargs.items())
        commands.append(
            ("lmdeploy pipeline", f"pipeline({config.engine.model!r}, backend_config={config_class}({arguments}))")
        )
    return commands


def api_server_line(model: str, backend: str, fields: Mapping[str, Any]) -> str:
    """`lmdeploy serve api_server MODEL --backend B --max-batch-size N ...`: each engine config field as the flag of
    its name (lmdeploy's CLI spells them so), a true switch as the bare flag, a false or unset one left out."""
    words = ["lmdeploy", "serve", "api_server", model, "--backend", backend]
    for name, value in fields.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words += [flag] if value else []
        elif value is not None:
            words += [flag, str(value)]
    return shlex.join(words)


def new_study(tune: Tune):
    """An optuna study with the tune's sampler, seeded: TPE, which reads the constraints record_trial sets on each
    trial, or the random one."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say what each trial did
    startup = max(LEAST_STARTUP_TRIALS, tune.trials // 4)
    sampler = (
        optuna.samplers.RandomSampler(seed=tune.seed)
        if tune.search == "random"
        else optuna.samplers.TPESampler(seed=tune.seed, n_startup_trials=startup)
    )
    return optuna.create_study(direction="maximize" if tune.maximize else "minimize", sampler=sampler)


def distributions(axes: Sequence[Any]) -> dict[str, Any]:
    """Each axis as a categorical choice among its values (optuna keys them by the setting's name)."""
    from optuna.distributions import CategoricalDistribution

    return {axis.name: CategoricalDistribution(list(axis.values)) for axis in axes}


def record_trial(study, trial, tune: Tune, measured: Trial | None) -> None:
    """Tell the study how `trial` (asked of it) went: the objective with its constraints, or a failure (no run of it
    measured the objective)."""
    import optuna

    if measured is None or math.isnan(measured.objective(tune)):
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    for bound, value in zip(tune.bounds, measured.constraints(tune)):
        trial.set_constraint(str(bound), value)
    study.tell(trial, measured.objective(tune))


def replay(study, axes: Sequence[Any], tune: Tune, trials: Sequence[Trial]) -> None:
    """Put the recorded `trials` into a new study, as if it had asked for them: a resume goes on from them."""
    space = distributions(axes)
    for recorded in trials:
        study.enqueue_trial(recorded.point, skip_if_exists=False)
        record_trial(study, study.ask(space), tune, recorded)
