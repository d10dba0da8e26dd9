"""The search for the highest load that meets an SLO (`sweep restful --find-max request_rate|max_concurrency`).

A probe is one run at one load; it meets the target when at least `target` of its requests met every `--slo-*`
threshold (SLO attainment, the catalog's good_requests / total_requests). From `start` the load doubles while
probes meet the target (up to `limit`); once one fails, the search bisects between the highest load that met it and
the lowest that did not, until they are within `precision` of each other, relative to the lower
(high - low <= precision * low); a concurrency also stops at neighbouring whole numbers. When the first probe
fails, a rate halves (down to start / 8) to find a load that meets it; a concurrency of 1 that fails ends the search
with none. The search assumes more load never helps: the highest load that met the target below the lowest one
that failed is the answer.

A search also ends on its budget, whatever its limit and precision: `max_probes` probes run, or `max_time_s` seconds
since it began (the probe under way is stopped then). A resumed search replays the probes it ran before and spends
a budget of its own on the rest.

Pure: `next_load` says what to probe given the probes so far, so a resumed search replays its journal
(sweep_store.probe_journal) and goes on where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..config import check_values, setting
from ..errors import ConfigError

SEARCHABLE = ("request_rate", "max_concurrency")
DEFAULT_TARGET = setting("goodput_target").default
DEFAULT_PRECISION = setting("find_max_precision").default
DEFAULT_START = {"request_rate": 1.0, "max_concurrency": 1}
LIMIT_FACTOR = 1024  # the default highest load: start x this, at most HIGHEST_LOAD
HIGHEST_LOAD = setting("find_max_limit").limits.high
LOWEST_FRACTION = 1 / 8  # a failing start: rates down to start x this are tried
DEFAULT_MAX_PROBES = setting("find_max_probes").default
DEFAULT_MAX_TIME_S = setting("find_max_time_s").default


@dataclass(frozen=True)
class FindMax:
    """What the search looks for: the load setting, where it starts, how precisely, the goodput target."""

    setting: str
    start: float
    precision: float = DEFAULT_PRECISION
    target: float = DEFAULT_TARGET
    limit: float = HIGHEST_LOAD
    max_probes: int = DEFAULT_MAX_PROBES
    max_time_s: float = DEFAULT_MAX_TIME_S

    def __post_init__(self):
        if self.setting not in SEARCHABLE:
            raise ConfigError(f"--find-max searches {' or '.join(SEARCHABLE)}, not '{self.setting}'.")
        check_values(
            goodput_target=self.target,
            find_max_precision=self.precision,
            find_max_start=self.start,
            find_max_limit=self.limit,
            find_max_probes=self.max_probes,
            find_max_time_s=self.max_time_s,
        )
        if self.integer and (self.start < 1 or self.start != int(self.start)):
            raise ConfigError(
                f"--find-max-start must be a whole number from 1 for max_concurrency; got {self.start:g}."
            )
        if self.limit < self.start:
            raise ConfigError(
                f"--find-max-limit must be at least --find-max-start ({self.start:g}); got {self.limit:g}."
            )

    @property
    def integer(self) -> bool:
        return self.setting == "max_concurrency"

    def to_dict(self) -> dict:
        return {
            "setting": self.setting,
            "start": self.start,
            "precision": self.precision,
            "target": self.target,
            "limit": self.limit,
            "max_probes": self.max_probes,
            "max_time_s": self.max_time_s,
        }

    @classmethod
    def from_dict(cls, data: dict) -> FindMax:
        limit = data.get("limit")
        return cls(
            data["setting"],
            data["start"],
            data["precision"],
            data["target"],
            HIGHEST_LOAD if limit is None else limit,  # a plan saved when the limit could be left infinite
            data.get("max_probes", DEFAULT_MAX_PROBES),  # a plan saved before searches had a budget
            data.get("max_time_s", DEFAULT_MAX_TIME_S),
        )


class Probe(NamedTuple):
    load: float
    met: bool


def bounds(probes: Sequence[Probe]) -> tuple[float | None, float | None]:
    """(the highest load that met the target below the lowest that failed, that lowest failing load); None: none."""
    failed = [probe.load for probe in probes if not probe.met]
    high = min(failed, default=None)
    met = [probe.load for probe in probes if probe.met and (high is None or probe.load < high)]
    return max(met, default=None), high


def next_load(search: FindMax, probes: Sequence[Probe]) -> float | None:
    """The load to probe next, or None when the search is over."""
    if not probes:
        return _typed(search, search.start)
    low, high = bounds(probes)
    if high is None:  # every probe met the target: double, up to the limit
        return None if low >= search.limit else _typed(search, min(low * 2, search.limit))
    if low is None:
        if search.integer or high <= search.start * LOWEST_FRACTION:
            return None
        return _typed(search, high / 2)
    if high - low <= search.precision * low:
        return None
    middle = _typed(search, (low + high) / 2)
    return middle if low < middle < high else None


def found(probes: Sequence[Probe]) -> float | None:
    """The highest load that met the target (None: none did)."""
    return bounds(probes)[0]


def _typed(search: FindMax, load: float) -> float:
    return int(load) if search.integer else round(load, 6)
