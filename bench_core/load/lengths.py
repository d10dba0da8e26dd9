"""Random request lengths as LMDeploy's sample_random_requests draws them (config.catalog.RANGE_RATIO_RULE):
the bounds, the seeded draws the random and image datasets share, and the span a caption states.

A range ratio of 0 means lengths from 1 to the length asked, not fixed lengths as vLLM's users read it; the
pages say the span so that nobody has to know the rule. Pure functions on numbers.
"""

from __future__ import annotations

import numpy as np

# The settings the span is drawn from.
RANDOM_LENGTHS = ("random_input_len", "random_output_len", "random_range_ratio")


def random_length_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """The lowest and highest random length LMDeploy draws for `length` (RANGE_RATIO_RULE), both included; the
    lowest is at least 1 (LMDeploy's offline scripts can draw an output of 0, which its engine then rejects)."""
    return max(int(length * range_ratio), 1), length


def random_lengths(generator: np.random.RandomState, length: int, range_ratio: float, count: int) -> np.ndarray:
    """`count` lengths drawn as LMDeploy draws them: uniform integers within `random_length_bounds`."""
    low, high = random_length_bounds(length, range_ratio)
    return generator.randint(low, high + 1, size=count)


def describe_random_lengths(input_len: int, output_len: int, range_ratio: float) -> str:
    """ "input 1..64 tokens, output 1..16 tokens (range ratio 0)": the lengths a random run actually draws."""
    spans = []
    for name, length in (("input", input_len), ("output", output_len)):
        low, high = random_length_bounds(length, range_ratio)
        spans.append(f"{name} {low:,} tokens" if low == high else f"{name} {low:,}..{high:,} tokens")
    return f"{', '.join(spans)} (range ratio {range_ratio:g}: uniform in [max(1, int(len x ratio)), len])"


def missing_lengths(dataset_name: str, input_len: int | None, output_len: int | None) -> str:
    """Why a dataset of random lengths cannot draw them ("" where both are given)."""
    if input_len is None or output_len is None:
        return f"The {dataset_name} dataset needs both --random-input-len and --random-output-len."
    return ""
