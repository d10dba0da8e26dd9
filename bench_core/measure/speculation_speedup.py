"""Whether speculative decoding pays at each load of a sweep, and the load at which it stops.

At every point of a sweep's other axis (its load: a concurrency, a request rate), the runs with speculation are set
against the runs without it on the same prompts, request by request (stats.paired_ratio: mean with over mean without,
with its 95% paired-bootstrap interval). TPOT judges, as speculation speeds decoding: it pays where the whole interval
of TPOT with over without is below 1, costs where it is above 1, and says nothing either way where the interval holds
1. It stops paying at the first load from which it never pays again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .stats import Ratio

JUDGED_BY = "tpot"  # the paired metric whose ratio decides (PAIRED_METRICS' key)
PAYS = "pays"
COSTS = "costs"
UNDECIDED = "within the interval of 1"


@dataclass(frozen=True)
class LoadSpeedup:
    """One load: its label ("max_concurrency=8"; "" for a sweep with no other axis), the value to chart it at, the
    run pairs set against each other and each paired metric's ratio, with speculation over without."""

    load: str
    at: object
    pairs: int
    ratios: Mapping[str, Ratio]

    @property
    def judged(self) -> Ratio | None:
        ratio = self.ratios.get(JUDGED_BY)
        return ratio if ratio is not None and math.isfinite(ratio.value) else None

    @property
    def verdict(self) -> str | None:
        """PAYS, COSTS or UNDECIDED from TPOT's interval; None without TPOT (a run not streamed)."""
        ratio = self.judged
        if ratio is None:
            return None
        return PAYS if ratio.high < 1 else COSTS if ratio.low > 1 else UNDECIDED


NO_SPEEDUP = (
    "No speed-up by load: it needs TPOT (--stream-output) from runs of the same prompts with and without speculation."
)


def describe_ratio(ratio: Ratio) -> str:
    return f"{ratio.value:.3g} ({ratio.low:.3g} to {ratio.high:.3g})"


def stops_paying(speedups: Sequence[LoadSpeedup]) -> LoadSpeedup | None:
    """The first load from which speculation never pays again, where it paid at some load before; None where it paid
    everywhere, nowhere, or paid again after not paying."""
    judged = [speedup for speedup in speedups if speedup.verdict]
    first = next((number for number, speedup in enumerate(judged) if speedup.verdict != PAYS), None)
    if not first or any(speedup.verdict == PAYS for speedup in judged[first:]):
        return None
    return judged[first]


def describe_speedups(speedups: Sequence[LoadSpeedup]) -> str:
    """One sentence: where speculation paid, where it stopped, each load's TPOT ratio with its interval."""
    judged = [speedup for speedup in speedups if speedup.verdict]
    if not judged:
        return NO_SPEEDUP
    cells = "; ".join(
        f"{speedup.load or 'the one point'} {describe_ratio(speedup.ratios[JUDGED_BY])}"
        + ("" if speedup.verdict == PAYS else f", {speedup.verdict}")
        for speedup in judged
    )
    ratio_note = f"TPOT with speculation over without, on the same prompts (95% paired interval): {cells}."
    paid = [speedup for speedup in judged if speedup.verdict == PAYS]
    stop = stops_paying(judged)
    if stop is not None:
        last_paid = judged[judged.index(stop) - 1]
        return f"Speculation paid up to {last_paid.load} and stopped paying at {stop.load}. {ratio_note}"
    if len(paid) == len(judged):
        return f"Speculation paid at every load swept. {ratio_note}"
    if not paid:
        return f"Speculation paid at no load swept. {ratio_note}"
    return f"Speculation paid at {', '.join(speedup.load for speedup in paid)} only. {ratio_note}"
