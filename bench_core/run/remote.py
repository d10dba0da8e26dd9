"""Following a job that runs in another process, the engine's worker process (engine_process) or a Ray actor
(sweep.cluster), with one protocol and one loop.

Where the job runs, a `Forwarder` observes it: each observer call (observer.JobObserver) becomes a `Message`
in an `Outbox`, with what the follower has not learned yet of the job (its sample, engine, environment,
warnings, load time and the profiler's clock), so the follower can record the run even if that process dies.
The transport drains the outbox: a pipe sends batches as they come (an empty one as a heartbeat), a Ray actor
answers polls with them.

Where the job was submitted, `follow` reads the batches from a `Link` (the transport's end), has a `Mirror`
replay each message on the local job, whose own observers hear them in turn, sends the cancel, and stops at
the job's last message, or when the link is lost (LinkLost: the process died), or when a hung process was
killed. A run whose remote side was lost fails with the reason, and `Mirror.lose` rebuilds its profiler from
the requests it had heard of: those unfinished fail with that reason, and its metrics are aggregated here,
where they were not.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Any, Protocol

from ..measure.live_snapshot import LiveSnapshot
from ..measure.profiler import Session, rebuilt_profiler
from ..states import RunState
from .lifecycle import Job, PlaygroundJob, Run
from .observer import JobObserver, StateChange

AnyJob = Run | PlaygroundJob  # what a Forwarder tells of and a Mirror copies

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often the follower checks for a cancel while it waits for messages
STARTING_S = 60.0  # the silence allowed before a job's first message: a fresh worker imports its libraries first


@dataclass(frozen=True)
class Message:
    """One observer call made where the job runs, as it crosses to the process that follows the job."""

    call: str  # the JobObserver method: on_state, on_snapshot, on_requests, on_record or on_answer
    args: tuple
    learned: dict[str, Any] = field(default_factory=dict)  # what the follower has not had yet (Forwarder)
    sent_at: float = field(default_factory=perf_counter)  # system-wide on Linux, so it compares with the ticks
    last: bool = False  # the job's last message: its record, or a playground job's end


class Outbox:
    """The messages a Forwarder wrote and the transport has not taken yet."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Message] = queue.Queue()

    def put(self, message: Message) -> None:
        self._queue.put(message)

    def drain(self, wait_s: float) -> list[Message]:
        """Every message there, waiting up to `wait_s` for the first; [] when none came."""
        try:
            batch = [self._queue.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                return batch


class Forwarder(JobObserver):
    """Writes a job's observer calls into an outbox as Messages, each with what of the job changed since."""

    def __init__(self, outbox: Outbox):
        self.outbox = outbox
        self._told: dict[str, Any] = {}

    def on_state(self, job: AnyJob, change: StateChange) -> None:
        ended_playground = isinstance(job, PlaygroundJob) and job.ended
        self._put(job, "on_state", (change,), last=ended_playground)

    def on_snapshot(self, run: Run, snapshot: LiveSnapshot) -> None:
        self._put(run, "on_snapshot", (snapshot,))

    def on_requests(self, run: Run, finished: dict[int, Session]) -> None:
        self._put(run, "on_requests", (finished,))

    def on_record(self, run: Run, record) -> None:
        self._put(run, "on_record", (record,), last=True)

    def on_answer(self, job: PlaygroundJob, answer) -> None:
        self._put(job, "on_answer", (answer,))

    def _put(self, job: AnyJob, call: str, args: tuple, last: bool = False) -> None:
        self.outbox.put(Message(call, args, self._learned(job), last=last))

    def _learned(self, job: AnyJob) -> dict[str, Any]:
        facts: dict[str, Any]
        if isinstance(job, PlaygroundJob):
            facts = {"engine_info": job.engine_info}
        else:
            measurement = job.measurement
            profiler = measurement.profiler
            facts = {
                "sample": measurement.sample,
                "engine_info": measurement.engine_info,
                "environment": measurement.environment,
                "warnings": tuple(measurement.warnings),
                "load_seconds": measurement.load_seconds,
                "warmup_seconds": measurement.warmup_seconds,
                "cache_start": measurement.cache_start,
                "clock": (profiler.t_start, profiler.t_finish) if profiler is not None else (None, None),
            }
        # Identity for what is kept as it was made; value for the tuples made here.
        changed = {
            name: value
            for name, value in facts.items()
            if name not in self._told
            or not (value is self._told[name] or (isinstance(value, tuple) and value == self._told[name]))
        }
        self._told.update(changed)
        if changed.get("sample") is not None:  # the prompts and images stay here: the follower needs only lengths
            sample = changed["sample"]
            changed["sample"] = replace(sample, requests=[r.lengths_only() for r in sample.requests])
        return changed


class LinkLost(Exception):
    """The process that runs the job is gone; `reason` says why, for the job's message."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Link(Protocol):
    """The follower's end of a transport to the process that runs one job."""

    def receive(self, wait_s: float) -> list[Message] | None:
        """The messages that came within `wait_s` ([] for a heartbeat), None when nothing did; LinkLost when the
        process is gone."""

    def cancel(self) -> None:
        """Ask for the job's cancel."""

    def kill(self) -> None:
        """End the process that runs the job."""

    def hung(self, silent_s: float) -> str:
        """Kill the process, which said nothing for `silent_s`; the reason for the job's message (only asked of a
        link that `follow` watches with hung_after_s)."""


def follow(
    job: Job,
    link: Link,
    mirror: Mirror,
    hung_after_s: float | None = None,
    cancel_grace_s: float | None = None,
    cancel: threading.Event | None = None,
) -> str | None:
    """Replay the job's messages from `link` through `mirror` until its last one: None then, else why the link
    was lost. The job's cancel (or `cancel`, where the follower is cancelled as a whole: a sweep) is passed on
    once; `cancel_grace_s` after it, the process is killed. `hung_after_s`: the silence after which the process
    is taken as hung (STARTING_S before its first message)."""
    cancel = job.cancel_event if cancel is None else cancel
    heard = time.monotonic()
    allowed_s = None if hung_after_s is None else max(hung_after_s, STARTING_S)
    cancel_sent_at = None
    while True:
        if cancel.is_set():
            if cancel_sent_at is None:
                cancel_sent_at = time.monotonic()
                link.cancel()
            elif cancel_grace_s is not None and time.monotonic() - cancel_sent_at > cancel_grace_s:
                link.kill()
        try:
            batch = link.receive(POLL_S)
        except LinkLost as lost:
            return lost.reason
        if batch is not None:
            heard, allowed_s = time.monotonic(), hung_after_s
            for message in batch:
                mirror.apply(message)
                if message.last:
                    return None
        elif allowed_s is not None and time.monotonic() - heard > allowed_s:
            return link.hung(allowed_s)


class Mirror:
    """The follower's copy of a job that runs elsewhere, kept up to date by its messages."""

    def __init__(self, job: AnyJob):
        self.job = job
        self.sessions: list[Session] = []  # a run's requests: as published once finished, else as sampled
        self.last_heard: float | None = None

    def apply(self, message: Message) -> None:
        job = self.job
        self._learn(message.learned)
        self.last_heard = message.sent_at
        if message.call == "on_state":
            (change,) = message.args
            if change.state == job.state:  # loading in both processes: what it does now
                job.describe(change.phase)
            else:
                job.move(
                    change.state,
                    change.message,
                    phase=change.phase,
                    user_error=change.user_error,
                    refused=change.refused,
                )
        elif message.call == "on_snapshot":
            assert isinstance(job, Run), "a run's message"
            (job.measurement.live,) = message.args
            job.tell("on_snapshot", *message.args)
        elif message.call == "on_requests":
            (finished,) = message.args
            for index, session in finished.items():
                self.sessions[index] = session
            job.tell("on_requests", finished)
        elif message.call == "on_record":  # the runner here keeps it, then closes the run
            assert isinstance(job, Run), "a run's message"
            (job.measurement.record,) = message.args
        elif message.call == "on_answer":
            assert isinstance(job, PlaygroundJob), "a playground job's message"
            job.answer(*message.args)

    def _learn(self, learned: dict[str, Any]) -> None:
        job = self.job
        if isinstance(job, PlaygroundJob):
            if "engine_info" in learned:
                job.engine_info = learned["engine_info"]
            return
        measurement = job.measurement
        for name in ("engine_info", "environment", "load_seconds", "warmup_seconds", "cache_start"):
            if name in learned:
                setattr(measurement, name, learned[name])
        if "warnings" in learned:
            measurement.warnings = list(learned["warnings"])
        if learned.get("sample") is not None:
            measurement.sample = learned["sample"]
            self.sessions = [Session(r.input_len, r.output_len) for r in measurement.sample.requests]
        if "clock" in learned:
            measurement.clock = learned["clock"]

    def lose(self, reason: str) -> None:
        """The remote side is gone: the job fails with `reason` (unless it had ended), and a run that started
        measuring gets a profiler of the requests heard of, those unfinished failing with `reason`."""
        job = self.job
        if job.ended:  # it ended there, but what it would have sent last was lost
            log.error("a job that ended %s lost its process before its last message: %s", job.state, reason)
        else:
            job.move(RunState.FAILED, reason)
        if isinstance(job, PlaygroundJob):
            return
        measurement = job.measurement
        if measurement.environment is None:
            measurement.environment = {}  # unknown: the process that would have said is gone
        t_start, t_finish = measurement.clock
        if t_start is None:
            return
        for session in self.sessions:
            if not session.finished:
                session.finish(Session.FAIL, reason, self.last_heard)
        ended = t_finish if t_finish is not None else self.last_heard
        assert ended is not None, "heard from: it told its clock"
        measurement.profiler = rebuilt_profiler(job.config, self.sessions, t_start, ended)
