"""The quality guard: how a run's answers compare with a baseline run's (drift), and how many of a quality set's
references they meet (accuracy). Pure functions, no I/O.

Drift compares the token ids of request i with those of the baseline's request i: the same prompts, both greedy
(temperature 0 or no sampling), so any difference is the engine's (a lower dtype, a quantized cache, another
kernel). Per request it gives whether the ids are identical, the position of the first token that differs (the
answer's length where none does) and the token overlap (the ids both answers hold, counted with repeats, over the
longer answer's length). The run's metrics (measure/catalog.py) average those over the requests both runs served.

Accuracy scores each answer against its quality-set record's reference with the record's scorer:

- exact: the answer, trimmed, is the reference;
- contains: the reference is in the answer, ignoring case;
- regex: the reference, a regular expression, matches somewhere in the answer;
- number: the answer's first number equals the reference's (1,000 and 1000.0 are 1000).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..load.quality_set import QualityItem
from ..states import RequestStatus

# The request-table columns the guard writes (per request) and reads back (the metrics, a later drift).
OUTPUT_IDS = "output_ids"
OUTPUT_TEXT = "output_text"
DRIFT_IDENTICAL = "drift_identical"
DRIFT_DIVERGENCE = "drift_divergence"
DRIFT_OVERLAP = "drift_overlap"
QUALITY_CORRECT = "quality_correct"
ACCURACY_METRIC = "quality_accuracy"  # the mean of QUALITY_CORRECT
# The run's drift metrics (their catalog keys and history columns), each the mean of one per-request column.
DRIFT_METRICS = {
    DRIFT_IDENTICAL: "drift_exact_match_rate",
    DRIFT_DIVERGENCE: "drift_mean_divergence",
    DRIFT_OVERLAP: "drift_token_overlap",
}


@dataclass(frozen=True)
class Drift:
    identical: bool
    divergence: int  # the first position where the ids differ; the answer's length where none does
    overlap: float  # shared ids (with repeats) over the longer answer's length; 1.0 for two empty answers


def drift(baseline: Sequence[int], output: Sequence[int]) -> Drift:
    baseline, output = list(baseline), list(output)
    divergence = next((i for i, (a, b) in enumerate(zip(baseline, output)) if a != b), min(len(baseline), len(output)))
    longer = max(len(baseline), len(output))
    shared = sum((Counter(baseline) & Counter(output)).values())
    return Drift(baseline == output, divergence, shared / longer if longer else 1.0)


def drift_columns(baseline: Sequence[int] | None, output: Sequence[int] | None) -> dict[str, Any]:
    """A request's drift columns; NaN where either run has no answer for it (failed, or not in the baseline)."""
    if baseline is None or output is None:
        return {DRIFT_IDENTICAL: math.nan, DRIFT_DIVERGENCE: math.nan, DRIFT_OVERLAP: math.nan}
    found = drift(baseline, output)
    return {
        DRIFT_IDENTICAL: float(found.identical),
        DRIFT_DIVERGENCE: float(found.divergence),
        DRIFT_OVERLAP: found.overlap,
    }


@dataclass(frozen=True)
class DriftBaseline:
    """A drift baseline run's kept answers (ids per request, None where it has none) and its prompts' token counts:
    read from the history where a run is submitted, and carried with it to the process that runs it (the engine
    worker, a cluster's node), which has no history of its own."""

    run_id: str
    answers: tuple[Sequence[int] | None, ...]
    input_lens: tuple[int, ...]


@dataclass(frozen=True)
class OutputJudge:
    """What a run's answers are checked against: the baseline's ids per request (None: no drift check), the
    quality set's items per request (None: no accuracy check)."""

    baseline: Sequence[Sequence[int] | None] | None = None
    items: Sequence[QualityItem] | None = None

    def columns(self, index: int, ids: Sequence[int] | None, text: str | None) -> dict[str, Any]:
        """Request `index`'s columns: its answer (ids and text), its drift and its score (NaN: no answer)."""
        found: dict[str, Any] = {OUTPUT_IDS: None if ids is None else list(ids), OUTPUT_TEXT: text}
        if self.baseline is not None:
            theirs = self.baseline[index] if index < len(self.baseline) else None
            found.update(drift_columns(theirs, ids))
        if self.items is not None and index < len(self.items):
            found[QUALITY_CORRECT] = math.nan if text is None else float(self.items[index].score(text))
        return found


def baseline_differences(
    baseline_id: str, baseline_lens: Sequence[int], lens: Sequence[int], samples: bool
) -> list[str]:
    """Why a drift from baseline `baseline_id` may not be the engine's: other prompts (their token counts differ),
    or a run that samples; each a warning for the run."""
    found = []
    if len(baseline_lens) != len(lens):
        found.append(f"Drift: baseline {baseline_id} has {len(baseline_lens)} requests, this run {len(lens)}.")
    if any(a != b for a, b in zip(baseline_lens, lens)):
        found.append(f"Drift: the prompts differ from baseline {baseline_id}'s (token counts); use the same dataset.")
    if samples:
        found.append("Drift: this run samples (do_sample), so its answers differ by chance; drift wants greedy runs.")
    return found


def stored_outputs(table: Any) -> list[Sequence[int] | None] | None:
    """A stored request table's answers, as ids per request (None where it has none); None: it kept no answers."""
    if OUTPUT_IDS not in table:
        return None
    return [None if ids is None else [int(i) for i in ids] for ids in table[OUTPUT_IDS]]


def run_drift(baseline: Sequence[Sequence[int] | None], table: pd.DataFrame) -> dict[str, float]:
    """A stored run's drift metrics against `baseline`'s answers, from the answers its request table kept (NaN where
    it kept none): what the History compare shows against the baseline it picked."""
    outputs = stored_outputs(table)
    if outputs is None:
        return dict.fromkeys(DRIFT_METRICS.values(), math.nan)
    served = (table["status"] == RequestStatus.SUCCESS).to_numpy()
    rows = pd.DataFrame(
        [
            drift_columns(baseline[i] if i < len(baseline) else None, ids if served[i] else None)
            for i, ids in enumerate(outputs)
        ]
    )
    return {
        key: float(np.nanmean(rows[column])) if rows[column].notna().any() else math.nan
        for column, key in DRIFT_METRICS.items()
    }


def with_drift(runs: pd.DataFrame, tables: Mapping[str, pd.DataFrame], baseline_id: str) -> pd.DataFrame:
    """`runs` (history rows) with their drift metrics against run `baseline_id`, where it and they kept their
    answers (`tables`: request tables by run id); unchanged where the baseline kept none."""
    baseline_table = tables.get(baseline_id)
    baseline = None if baseline_table is None else stored_outputs(baseline_table)
    if baseline is None:
        return runs
    runs = runs.copy()
    for position, run_id in enumerate(runs["run_id"].astype(str)):
        table = tables.get(run_id)
        if table is not None and OUTPUT_IDS in table:
            for key, value in run_drift(baseline, table).items():
                runs.loc[runs.index[position], key] = value
    return runs


# The settings by which a history row says its run kept its answers (any one of them set).
KEEPING_SETTINGS = ("keep_outputs", "drift_baseline", "quality_set")


def runs_with_answers(runs: pd.DataFrame) -> list[str]:
    """The ids of the history's runs (rows) that kept their answers, newest first: those a drift baseline can be."""
    kept = pd.Series(False, index=runs.index)
    for name in KEEPING_SETTINGS:
        if name in runs:
            column = runs[name]
            kept |= column.fillna(False).astype(bool) if name == "keep_outputs" else column.fillna("").astype(str) != ""
    return runs.loc[kept, "run_id"].astype(str).tolist()[::-1]
