"""Repeats until the answer is clear (`sweep ... --target-moe P --max-repeats N`).

A fixed count of repeats is a guess: too few on a noisy point, wasted on a steady one. With a target, every point runs
at least the plan's repeats (3 or more: the fewest that give a 95% interval), then again, round after round over the
points still short of it, until the 95% Student-t interval of the mean of `metric` over the point's finished runs is
within `target` of that mean (the relative margin of error, as GuideLLM's target_moe), or the point has run
`max_repeats` times. Each point ends one of two ways, and the sweep's output says which: it reached the target, or the
cap stopped it (its margin then says how far it got).

Pure: `judge` says where a point stands from its runs' values, so a resumed sweep decides from the history alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import check_values, setting
from ..errors import ConfigError
from ..measure.catalog import SWEPT_COLUMNS
from ..measure.stats import CONFIDENCE, MIN_INTERVAL_RUNS, relative_margin_of_error
from ..views.tables import describe_column

DEFAULT_METRIC = setting("target_moe_metric").default
DEFAULT_MAX_REPEATS = setting("max_repeats").default
REACHED = "reached the target"
CAPPED = "stopped by the cap"
SHORT = "short of the target"  # neither yet: the sweep stopped (cancelled, failed) before the point was settled


@dataclass(frozen=True)
class Precision:
    """The target: the margin of error of `metric` (a fraction of its mean) each point repeats until, and the most
    runs a point gets."""

    target: float
    metric: str = DEFAULT_METRIC
    max_repeats: int = DEFAULT_MAX_REPEATS

    def __post_init__(self):
        check_values(target_moe=self.target, max_repeats=self.max_repeats)
        if self.metric not in SWEPT_COLUMNS:
            raise ConfigError(
                f"--target-moe-metric takes a sweep metric ({', '.join(SWEPT_COLUMNS)}); got '{self.metric}'."
            )
        if self.max_repeats < MIN_INTERVAL_RUNS:
            raise ConfigError(
                f"--max-repeats must be at least {MIN_INTERVAL_RUNS} with --target-moe: a 95% interval needs "
                f"{MIN_INTERVAL_RUNS} runs; got {self.max_repeats}."
            )

    def to_dict(self) -> dict:
        return {"target": self.target, "metric": self.metric, "max_repeats": self.max_repeats}

    @classmethod
    def from_dict(cls, data: dict) -> Precision:
        return cls(float(data["target"]), str(data["metric"]), int(data["max_repeats"]))


@dataclass(frozen=True)
class PointPrecision:
    """Where one point stands: its finished runs, the relative margin of error of the metric over them (NaN: too few
    runs, or a metric they lack), and whether it reached the target, was stopped by the cap, or is short of both."""

    runs: int
    margin: float
    outcome: str

    @property
    def settled(self) -> bool:
        """No more runs are due: the target is reached or the cap spent."""
        return self.outcome != SHORT


def judge(values: Sequence[float], runs: int, precision: Precision, least_runs: int) -> PointPrecision:
    """Where a point with `runs` finished runs stands, from their values of the metric (a run without one, such as a
    figure the engine did not report, counts as run but gives no value); it reaches the target once it has run at
    least `least_runs` times (the plan's repeats)."""
    margin = relative_margin_of_error(values, CONFIDENCE)
    if runs >= least_runs and not math.isnan(margin) and margin <= precision.target:
        return PointPrecision(runs, margin, REACHED)
    return PointPrecision(runs, margin, CAPPED if runs >= precision.max_repeats else SHORT)


def describe_target(precision: Precision, least_runs: int) -> str:
    """ "±5% (95% interval) on Output throughput (tok/s), 3 to 10 runs a point"."""
    return (
        f"±{precision.target * 100:g}% (95% interval) on {describe_column(precision.metric).title}, "
        f"{least_runs} to {precision.max_repeats} runs a point"
    )


def describe_margin(point: PointPrecision) -> str:
    """ "±3.2%", or "-" where there is no interval."""
    return "-" if math.isnan(point.margin) else f"±{point.margin * 100:.1f}%"
