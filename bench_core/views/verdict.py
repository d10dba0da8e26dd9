"""How an ended run is judged on the page that shows it: green, amber or red, with the one line that says why.

The rule is the reader's, not the chart's: green means every request succeeded on a machine the engine had to itself,
red that nothing worth reading was measured, amber everything in between. A page only colours the sentence; the
Sweep's own verdict (`bench_core.sweep.status`) uses the same three levels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..states import RunState
from .report import describe_outcome, sentence


class Verdict(StrEnum):
    """Green, amber, red: what the reader may take from the numbers."""

    GOOD = "good"  # the numbers stand as they are
    CAUTION = "caution"  # they stand with what the line says (partial, cancelled, a busy machine)
    BAD = "bad"  # nothing to read: no request succeeded, or the run broke


@dataclass(frozen=True)
class Judged:
    verdict: Verdict
    said: str


def run_verdict(status: str, message: str, summary: Mapping[str, Any], flags: Iterable[str] = ()) -> Judged:
    """An ended run's verdict and line: red when no request succeeded or the run broke, green when every request
    succeeded and nothing flags the machine (busy, client bound), amber otherwise. Runs recorded before the partial
    and failed outcomes existed (every one "finished") are judged by their counts the same way; the runner's
    `message` quotes the first failure reasons."""
    flags = tuple(flags)
    said = describe_outcome(status, message, summary)
    for flag in flags:  # the timings are not the engine's alone: never plain green
        said += f" {sentence(flag)}"
    served_all = summary["failed"] + summary["incomplete"] + summary.get("overrun", 0) == 0
    if status == RunState.FAILED or (status == RunState.FINISHED and summary["completed"] == 0):
        return Judged(Verdict.BAD, said)
    if status == RunState.FINISHED and served_all and not flags:
        return Judged(Verdict.GOOD, said)
    return Judged(Verdict.CAUTION, said)


def unrecorded_verdict(state: str, message: str) -> Judged:
    """A run that ended with nothing recorded (cancelled before it measured, refused for its input): red when it
    failed, amber when it was cancelled."""
    return Judged(
        Verdict.BAD if state == RunState.FAILED else Verdict.CAUTION, f"{state}: {message}" if message else state
    )
