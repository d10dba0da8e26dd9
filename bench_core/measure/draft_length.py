"""Which draft length pays: speculative decoding's per-position acceptance against what drafting costs.

The model, kept simple and stated where it is shown (MODEL_NOTE):
- a step with k drafted tokens yields 1 + a_1 + ... + a_k tokens on average, where a_i is the acceptance rate of
  draft position i (accepted at i / drafts; the positions are nested, so this is the expected accepted length), and
  a_i is taken not to depend on k (true of prompt lookup, whose i-th token is the same whatever k is; roughly so of
  a draft model);
- a step costs s0 * (1 + r * k): a plain decoding step s0, and r of it for each drafted token (drafting it and
  verifying it in the target's forward pass);
- so time per output token is TPOT(k) = s0 * (1 + r * k) / (1 + a_1 + ... + a_k), and plain decoding's is s0
  (k = 0). The advised k is the one with the lowest.
r and s0 come from a sweep over the draft length at one load: each point's step time (its TPOT times its measured
acceptance length) on a straight line in k. The check is the sweep's own lowest TPOT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MODEL_NOTE = (
    "Model: a step drafting k tokens yields 1 + a1 + ... + ak tokens (a_i: the acceptance at draft position i, taken "
    "as the same whatever k) and costs 1 + r·k plain steps (r: the cost of one drafted token, from the sweep's step "
    "times, each point's TPOT × its acceptance length, on a line in k); the advised k has the lowest predicted TPOT, "
    "k = 0 being no speculation."
)


def expected_tokens_per_step(rates: Sequence[float], draft_tokens: int) -> float:
    """1 + the acceptance rates of positions 1..draft_tokens: the tokens a step yields on average."""
    return 1.0 + float(sum(rates[:draft_tokens]))


def predicted_speedup(rates: Sequence[float], draft_tokens: int, cost_per_draft_token: float) -> float:
    """Plain decoding's TPOT over speculation's at `draft_tokens` (1 at k = 0): above 1 drafting pays."""
    return expected_tokens_per_step(rates, draft_tokens) / (1.0 + cost_per_draft_token * draft_tokens)


def advised_draft_tokens(rates: Sequence[float], cost_per_draft_token: float) -> int:
    """The draft length 0..len(rates) with the highest predicted speed-up; 0: speculation does not pay. A tie goes
    to the shorter draft (the same speed for less work)."""
    speedups = [predicted_speedup(rates, k, cost_per_draft_token) for k in range(len(rates) + 1)]
    return int(np.argmax(np.round(speedups, 12)))


@dataclass(frozen=True)
class StepCost:
    """A plain decoding step's time (s) and the cost of one drafted token as a fraction of it."""

    step_s: float
    per_draft_token: float


def step_cost(
    draft_tokens: Sequence[int], tpot_s: Sequence[float], acceptance_length: Sequence[float]
) -> StepCost | None:
    """The line through the sweep's step times (TPOT × acceptance length: the time of one step) against the draft
    length, by least squares; None with fewer than two draft lengths, or a line that does not start from a positive
    plain step (the model does not describe those runs). A falling line is noise around a drafted token that costs
    nothing measurable: 0."""
    k = np.asarray(draft_tokens, dtype=np.float64)
    step = np.asarray(tpot_s, dtype=np.float64) * np.asarray(acceptance_length, dtype=np.float64)
    known = np.isfinite(k) & np.isfinite(step)
    k, step = k[known], step[known]
    if np.unique(k).size < 2:
        return None
    slope, intercept = np.polyfit(k, step, 1)
    if intercept <= 0:
        return None
    return StepCost(float(intercept), max(0.0, float(slope / intercept)))


@dataclass(frozen=True)
class DraftAdvice:
    """The draft length advised at one load, the model's TPOT at each draft length, and the sweep's own best."""

    advised: int
    predicted_tpot_s: dict[int, float]  # k -> s0 (1 + r k) / (1 + a_1 + ... + a_k), k = 0 included
    cost: StepCost
    rates: tuple[float, ...]
    measured_tpot_s: dict[int, float]  # the sweep's own mean TPOT at each draft length it ran

    @property
    def measured_best(self) -> int:
        """The swept draft length with the lowest measured TPOT."""
        return min(self.measured_tpot_s, key=self.measured_tpot_s.__getitem__)

    @property
    def confirmed(self) -> bool:
        return self.advised == self.measured_best

    def sentence(self, load: str = "") -> str:
        at = f" at {load}" if load else ""
        speedup = predicted_speedup(self.rates, self.advised, self.cost.per_draft_token)
        advice = (
            "speculation does not pay: no draft length is predicted to beat plain decoding"
            if self.advised == 0
            else f"draft {self.advised} token{'s' if self.advised != 1 else ''} per step (predicted {speedup:.2f}x plain decoding's speed)"
        )
        check = (
            "the sweep's lowest TPOT agrees"
            if self.confirmed
            else f"the sweep measured its lowest TPOT at {self.measured_best} draft tokens"
        )
        return f"Advised{at}: {advice}; a drafted token costs {self.cost.per_draft_token:.2f} of a plain step; {check}."


def draft_length_advice(
    draft_tokens: Sequence[int],
    tpot_s: Sequence[float],
    acceptance_length: Sequence[float],
    rates: Sequence[float],
) -> DraftAdvice | None:
    """The advice at one load from its sweep points over the draft length (each point's k, mean TPOT and mean
    acceptance length) and the acceptance by position of its longest draft (positions 1..K); None where the step
    cost cannot be fitted or no rates were reported."""
    cost = step_cost(draft_tokens, tpot_s, acceptance_length)
    usable = [float(rate) for rate in rates if math.isfinite(rate)]
    if cost is None or not usable:
        return None
    predicted = {
        k: cost.step_s * (1 + cost.per_draft_token * k) / expected_tokens_per_step(usable, k)
        for k in range(len(usable) + 1)
    }
    measured = {int(k): float(t) for k, t in zip(draft_tokens, tpot_s) if math.isfinite(t)}
    return DraftAdvice(advised_draft_tokens(usable, cost.per_draft_token), predicted, cost, tuple(usable), measured)


def mean_rates(rate_lists: Sequence[Sequence[float] | None]) -> list[float] | None:
    """The mean acceptance of each position over runs (repeats of a point), over the runs that reported it."""
    found = [list(rates) for rates in rate_lists if rates]
    if not found:
        return None
    longest = max(len(rates) for rates in found)
    table = np.full((len(found), longest), np.nan)
    for row, rates in enumerate(found):
        table[row, : len(rates)] = rates
    return [float(value) for value in np.nanmean(table, axis=0)]
