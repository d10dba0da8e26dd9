"""How a job's progress reaches whoever watches it: one observer interface, after GuideLLM's benchmark progress
(on start, on update, on complete).

A run's observers hear, in order: `on_state` at each move of its lifecycle and each phase change, `on_snapshot`
and `on_requests` at a bounded rate while it measures (and once more when the measurement ends), `on_record` once
when it has ended and what it measured is kept. A playground job's hear `on_state` and `on_answer`. The worker
process's pipe and the Ray actor (remote.Forwarder), the CLI's progress line (cli.common.ProgressLine) and the
dashboard (through the caller's run, which remote.Mirror keeps up to date) are all observers: the core never
knows who is watching. This module imports nothing heavy, so the CLI can define one before it needs a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..states import RunState

if TYPE_CHECKING:
    from ..load.playground import PlaygroundResult
    from ..measure.live_snapshot import LiveSnapshot
    from ..measure.profiler import Session
    from ..store.history import RunRecord


@dataclass(frozen=True)
class StateChange:
    """Where a job stands after a move or a phase change, as its observers hear it."""

    state: RunState
    phase: str = ""  # what it is doing now, for the user ("loading the tokenizer", "warming up")
    message: str = ""  # why it ended as it did
    user_error: bool = False  # it failed because of the user's input
    refused: bool = False  # its input was refused before any work on it: not a run, no history row


class JobObserver:
    """Hears a job's progress (see the module's docstring). Every callback does nothing here, so an observer
    overrides those it needs. They are called in order on the job's threads: each must return at once. The first
    argument is the lifecycle.Job that tells (a Run, or a PlaygroundJob for on_state and on_answer); it is not
    annotated because lifecycle imports this module."""

    def on_state(self, job, change: StateChange) -> None:
        """The job moved to `change.state`, or its phase changed."""

    def on_snapshot(self, run, snapshot: LiveSnapshot) -> None:
        """The run's live snapshot, while it measures and once when the measurement ends."""

    def on_requests(self, run, finished: dict[int, Session]) -> None:
        """The requests (by index) that finished since the last call, their ticks included."""

    def on_record(self, run, record: RunRecord | None) -> None:
        """The run has ended and its record is kept (None: nothing to record); the last call."""

    def on_answer(self, job, answer: PlaygroundResult) -> None:
        """A playground prompt was answered."""
