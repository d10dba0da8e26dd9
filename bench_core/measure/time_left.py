"""How long a run has left: from what its live snapshot shows once output flows, and before that from past runs.

A run's time is not spread evenly over its tokens. A batched prefill produces nothing for a long while and then
every request decodes at once, so the pace "tokens done over time elapsed" reads far too slow until the end (35 min
told with a minute left). What is known instead:
- before the first output token, nothing about this run's pace: only past runs of the same model and backend
  (`PastPace`, from the history) can give a figure, their output throughput over this run's tokens; else
  "estimating". So too while, before any request has ended, one in flight still waits for its first token: a
  batched prefill is under way, and the rate between its chunks is no decode rate;
- once every request left has its first token, only decoding is left: its rate since the latest first token, or
  the requests decoding over the median step where that is faster (a prefill that ended less than two whole bins
  ago is still in the bins' rate: a batch of long prompts read 2.2x at 80 % of its run on that rate alone);
- before that, with requests still to prefill between decode steps, the rate since the first token (the prefill
  before it left out);
- the tail: the longest request still decoding needs that many more steps, however few tokens the others have
  left. A step's time is part fixed (the weights read once a step, the loop's overhead: a GPU's decode) and part
  per sequence (a CPU's, or a long context's, compute), so the batch shrinking as its requests end makes steps
  faster by a share nobody knows until it has shrunk. With step = a + b * batch, what is left takes
  a * steps + b * tokens: at a fixed share a/step of 1 the longest request's steps at today's step time, at 0 the
  tokens left at today's rate. Taken as half of each (FIXED_STEP_SHARE): never under half what all-fixed steps
  take, and over what all-per-sequence steps take by half the longest request's excess only (a batch of long
  prompts on a CPU read 2.6x at 80 % of its run when its steps were taken as all fixed).
Pure: snapshot and history rows in, seconds out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config import Part, RunConfig, of_part
from ..load import takes
from ..states import RunState
from .live_snapshot import LiveSnapshot

# Output must have flowed this long before its rate counts: a few steps' rate is noise.
MIN_OUTPUT_S = 0.5
# The decode-only rate, read from the whole bins since the latest first token, needs this many of them.
MIN_RECENT_BINS = 2
# The share of a decode step's time that does not shrink with the batch, unknown until it shrinks: the middle.
FIXED_STEP_SHARE = 0.5
# Dataset settings that draw more or other requests but not longer ones, or only keep or judge the answers: past runs
# that differ in them still count.
LENGTH_NEUTRAL = ("num_prompts", "seed", "keep_outputs", "drift_baseline")


@dataclass(frozen=True)
class PastPace:
    """What the history says of runs like one: the output tok/s of the past runs most like it (median), the output
    tokens a request of its dataset produced there (mean; None: no run of the same dataset), the engine's load time
    (median; None: not recorded), and how many finished runs of the model on the backend there are."""

    tokens_per_s: float
    output_tokens_per_request: float | None
    load_seconds: float | None
    runs: int


def past_pace_columns(config: RunConfig) -> tuple[str, ...]:
    """The history columns `past_pace` reads for runs like `config`'s: a CLI run reads only these before it starts."""
    return (
        "model",
        "backend",
        "status",
        "output_throughput",
        "concurrency",
        "load_pattern",
        "load_seconds",
        "total_output_tokens",
        "completed",
        *_dataset_facts(config),
    )


def past_pace(history_runs: pd.DataFrame, config: RunConfig) -> PastPace | None:
    """The pace of the finished runs of `config`'s model on its backend with an output throughput, those most like
    it first: the same dataset and lengths (they set the tokens a step makes: a batch of long prompts made a third of
    the output tok/s of short ones), then the same load pattern, then the nearest concurrency. None: none."""
    pool = _finished_runs(history_runs, config.engine.model, config.engine.backend)
    if pool.empty:
        return None
    same_dataset = pool
    for column, value in _dataset_facts(config).items():
        same_dataset = _matching(same_dataset, column, value)
    similar = _preferring(
        same_dataset if not same_dataset.empty else pool, "load_pattern", str(config.load.load_pattern)
    )
    rate = float(_nearest(similar, "concurrency", config.load.concurrency)["output_throughput"].median())
    per_request = None
    if not same_dataset.empty and {"total_output_tokens", "completed"} <= set(same_dataset.columns):
        served = same_dataset[same_dataset["completed"] > 0]
        if not served.empty:
            per_request = float((served["total_output_tokens"] / served["completed"]).mean())
    loads = pool["load_seconds"].dropna() if "load_seconds" in pool else pd.Series(dtype=float)
    return PastPace(rate, per_request, float(loads.median()) if not loads.empty else None, len(pool))


def time_left_s(snap: LiveSnapshot, pace: PastPace | None = None) -> float | None:
    """Seconds until the run's requested tokens are produced (see the module docstring); None while neither the
    run's output nor `pace` can tell, or when nothing is asked for."""
    if snap.tokens_requested <= 0:
        return None
    rate = output_rate(snap)
    ended = snap.completed + snap.failed + snap.cancelled
    # Before any request ends, one in flight without its first token is a batched prefill under way: the rate
    # between its chunks is no decode rate.
    if rate is not None and (ended or snap.decoding == snap.in_flight):
        tokens_left = max(snap.tokens_requested - snap.tokens_done, 0)
        step = step_s(snap)
        if step > 0 and _only_decoding_left(snap):
            # Every request left takes a token a step: `decoding` tokens a step. The bins' rate can be far below
            # that when too few whole bins have passed since the last prefill and it still counts the prefill's
            # time; the median step far above it when admissions stalled the steps earlier. The faster of the two.
            rate = max(rate, snap.decoding / step)
        at_rate = tokens_left / rate
        tail = snap.longest_left * step
        return max(at_rate, FIXED_STEP_SHARE * tail + (1 - FIXED_STEP_SHARE) * at_rate)
    if pace is None:
        return None
    # A run slower than the past ones so far has proved the history wrong for it: nothing to go on until output.
    left = snap.tokens_requested / pace.tokens_per_s - snap.elapsed_s
    return left if left > 0 else None


def _only_decoding_left(snap: LiveSnapshot) -> bool:
    """Whether every request not yet ended has its first token: none waits to be sent or to be prefilled."""
    ended = snap.completed + snap.failed + snap.cancelled
    return snap.decoding > 0 and snap.total_requests - ended == snap.decoding


def output_rate(snap: LiveSnapshot) -> float | None:
    """Output tok/s over the time that tells the pace of what is left: once every request has its first token
    (only decoding is left), since the latest came; before, or with too few whole bins since then, since the first
    came. None until output has flowed MIN_OUTPUT_S."""
    if snap.first_output_s is None or snap.output_tokens <= 0:
        return None
    latest = snap.latest_first_token_s  # known once the first is
    if latest is not None and _only_decoding_left(snap) and snap.elapsed_s - latest >= MIN_OUTPUT_S:
        decode_only = _mean_rate(snap, latest)
        if decode_only:
            return decode_only
    since = snap.elapsed_s - snap.first_output_s
    if since < MIN_OUTPUT_S:
        return None
    return snap.output_tokens / since


def step_s(snap: LiveSnapshot) -> float:
    """The time a decode step takes: the median inter-token latency so far (0 without one: unstreamed). A batch
    that shrinks at its end steps faster than that, so the tail's time reads somewhat long rather than short."""
    return snap.itl.distribution((50,)).percentiles[0] if snap.itl.count else 0.0


def _mean_rate(snap: LiveSnapshot, from_s: float) -> float | None:
    """Mean output tok/s of the whole bins from `from_s` on; None: fewer than MIN_RECENT_BINS."""
    recent = snap.time_s >= from_s
    return float(np.mean(snap.output_tokens_per_s[recent])) if recent.sum() >= MIN_RECENT_BINS else None


def describe_time_left(snap: LiveSnapshot, pace: PastPace | None = None) -> str:
    """'about 1 min 05 s left', 'under 1 s left', or 'estimating…' while `time_left_s` cannot tell yet."""
    left = time_left_s(snap, pace)
    if left is None:
        return "estimating…"
    if left < 1:
        return "under 1 s left"
    seconds = round(left)
    if seconds >= 60:
        return f"about {seconds // 60} min {seconds % 60:02d} s left"
    return f"about {seconds} s left"


def _finished_runs(history_runs: pd.DataFrame, model: str, backend: str) -> pd.DataFrame:
    """Finished runs of this model on this backend with a measured output throughput, numbers as numbers."""
    needed = ("model", "backend", "status", "output_throughput")
    if history_runs.empty or any(column not in history_runs for column in needed):
        return pd.DataFrame(columns=[*needed, "concurrency", "load_seconds"])
    rows = history_runs[
        (history_runs["model"].astype(str) == model)
        & (history_runs["backend"].astype(str) == backend)
        & (history_runs["status"].astype(str) == RunState.FINISHED)
    ].copy()
    for column in ("output_throughput", "concurrency", "load_seconds", "total_output_tokens", "completed"):
        rows[column] = pd.to_numeric(rows[column], errors="coerce") if column in rows else math.nan
    return rows[rows["output_throughput"] > 0]


def _dataset_facts(config: RunConfig) -> dict[str, object]:
    """The history columns that decide the lengths of a run's requests, with this run's values: its dataset's
    settings but how many prompts are drawn and with which seed."""
    data = config.dataset
    return {
        s.key: getattr(data, s.name)
        for s in of_part(Part.DATASET)
        if s.name not in LENGTH_NEUTRAL and takes(data.dataset_name, s)
    }


def _matching(rows: pd.DataFrame, column: str, value) -> pd.DataFrame:
    """The rows whose `column` holds `value` (None or "": empty); a history without the column held none in it."""
    if column not in rows:
        return rows if value is None or value == "" else rows.iloc[0:0]
    cells = rows[column]
    if value is None:
        return rows[cells.isna() | (cells.astype(str) == "")]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return rows[pd.to_numeric(cells, errors="coerce") == value]
    return rows[cells.astype(str) == str(value)]


def _preferring(rows: pd.DataFrame, column: str, value) -> pd.DataFrame:
    """The rows with `column` == `value` where there are any, else all of them."""
    same = _matching(rows, column, value)
    return same if not same.empty else rows


def _nearest(rows: pd.DataFrame, column: str, value: float) -> pd.DataFrame:
    """The rows whose `column` is nearest `value`, all of them where none has one."""
    known = rows.dropna(subset=[column]) if column in rows else rows.iloc[0:0]
    if known.empty:
        return rows
    distance = np.abs(known[column].to_numpy(dtype=float) - value)
    return known[distance == distance.min()]
