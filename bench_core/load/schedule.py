"""When each request of a run may be sent, and what is sent: the bookkeeping every engine's driver shares.

Most requests may go at once (or at the arrival process's offsets, which the caller passes). Two workloads say
otherwise (requests.py):
- under the trace load pattern, a request is due at its trace timestamp divided by the speed-up;
- a multi-turn request is due `think_s` after the request it follows has finished, and where it builds on that
  request's answer, its messages are the ones that request was sent, the answer the engine gave, and its own user
  message: `take` renders them when it is sent. A turn whose predecessor failed is never sent (`finish` names it):
  its session broke there.
Requests due are handed out in the order they became due (earlier turns' sessions first), then by index.

Pure bookkeeping on one clock (perf_counter seconds), no threads, no sleeping: a driver asks which request is due
next (`next_due`) and how long it may wait (`wait_s`), `take`s what it sends and reports each `finish`; the due
times wait in a heap, so each of these costs a logarithm of the run's size, not its size. A driver on several
threads holds its own lock around it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import LoadConfig
from ..states import LoadPattern
from .arrivals import send_offsets
from .requests import Message, SampledRequest, render_transcript


@dataclass(frozen=True)
class Outgoing:
    """What is sent for one request: its text prompt, its chat messages (None: the prompt as one user message),
    and whether the prompt was built here, at sending time (its length is then measured anew)."""

    prompt: str
    messages: tuple[Message, ...] | None
    built: bool


class SendSchedule:
    """The send times of a run's requests and the prompts of the turns that build on the model's answers."""

    def __init__(
        self,
        requests: Sequence[SampledRequest],
        load: LoadConfig | None = None,
        offsets: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        """`offsets`: seconds after the start at which each request that follows none is due (an arrival
        process's, in order), default at once; under the trace pattern each request's trace time instead."""
        self.requests = requests
        traced = load if load is not None and load.load_pattern == LoadPattern.TRACE else None
        starters = iter(offsets) if offsets is not None else None
        self._offset: list[float | None] = []
        for request in requests:
            if request.follows is not None:
                self._offset.append(None)  # known when the request it follows ends
            elif traced is not None:
                self._offset.append((request.send_at_s or 0.0) / traced.trace_speedup)
            else:
                self._offset.append(float(next(starters)) if starters is not None else 0.0)
        self._followers: dict[int, list[int]] = {}
        for index, request in enumerate(requests):
            if request.follows is not None:
                self._followers.setdefault(request.follows, []).append(index)
        self._heap: list[tuple[float, int]] = [
            (offset, index) for index, offset in enumerate(self._offset) if offset is not None
        ]
        heapq.heapify(self._heap)
        self._sent: dict[int, tuple[Message, ...]] = {}  # the messages a followed request was sent
        self._answers: dict[int, str] = {}
        self._taken: set[int] = set()
        self._dropped: set[int] = set()
        self._t0 = 0.0
        # An arrival process's schedule keeps when each request went, so its sends can be compared with it.
        self._sent_at: dict[int, float] | None = {} if offsets is not None else None

    @classmethod
    def at_rate(
        cls,
        requests: Sequence[SampledRequest],
        request_rate: float,
        burstiness: float = 1.0,
        seed: int | np.random.RandomState = 0,
        exact_rate: bool = False,
    ) -> SendSchedule:
        """The schedule of an arrival process (`arrivals.send_offsets`) for the requests that follow none: every
        one but a session's later turns, which go once the turn before them has ended."""
        starters = sum(request.follows is None for request in requests)
        return cls(requests, offsets=send_offsets(starters, request_rate, burstiness, seed, exact_rate))

    @property
    def plain(self) -> bool:
        """Every request due at once, none waiting for another: an engine may send them its own way."""
        return not self._followers and all(offset == 0.0 for offset in self._offset)

    def start(self, t0: float) -> None:
        """Offsets count from `t0` on."""
        self._t0 = t0

    def offset(self, index: int) -> float | None:
        """Seconds after the start at which the request is due; None while it waits for the request it follows."""
        return self._offset[index]

    def pending(self) -> int:
        """How many requests are neither taken nor dropped."""
        return len(self.requests) - len(self._taken) - len(self._dropped)

    def untaken(self) -> list[int]:
        """The requests neither taken nor dropped, in order."""
        return [i for i in range(len(self.requests)) if i not in self._taken and i not in self._dropped]

    def next_due(self, now: float) -> int | None:
        """The request due longest by `now` and not taken yet; None when none is due."""
        first = self._first()
        return first[1] if first is not None and self._t0 + first[0] <= now else None

    def wait_s(self, now: float) -> float:
        """How long until the next request is due (0: one is due now); inf when the rest wait for answers or
        nothing is left."""
        first = self._first()
        return math.inf if first is None else max(0.0, self._t0 + first[0] - now)

    def _first(self) -> tuple[float, int] | None:
        while self._heap and self._heap[0][1] in self._taken:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def followers(self, index: int) -> tuple[int, ...]:
        """The requests that wait for this one (a session's next turn)."""
        return tuple(self._followers.get(index, ()))

    def wants_answer(self, index: int) -> bool:
        """Whether a later turn repeats this request's answer (so the engine must hand it to `finish`)."""
        return any(self.requests[f].builds_on_answer for f in self._followers.get(index, ()))

    def take(self, index: int, now: float | None = None) -> Outgoing:
        """Mark the request sent (at `now`, where the driver knows it); what to send."""
        self._taken.add(index)
        if self._sent_at is not None and now is not None:
            self._sent_at[index] = now
        request = self.requests[index]
        messages, built, prompt = request.messages, False, request.prompt
        if request.builds_on_answer and request.follows in self._answers:
            before, user = self._sent[request.follows], request.user_message
            assert user is not None, "a later turn has its messages"
            messages = (*before, {"role": "assistant", "content": self._answers.pop(request.follows)}, user)
            prompt, built = render_transcript(messages), True
        if messages is not None and index in self._followers:
            self._sent[index] = messages
        return Outgoing(prompt, messages, built)

    def send_columns(self, index: int, ended: float) -> dict[str, float]:
        """The request's due, sent and end times as request-table columns (send_columns), where this schedule is
        an arrival process's and the driver said when the request was sent; else none."""
        if self._sent_at is None or index not in self._sent_at:
            return {}
        due = self._offset[index]
        assert due is not None, "it was taken, so due"
        return send_columns(due, self._sent_at[index], ended, self._t0)

    def finish(self, index: int, now: float, served: bool, answer: str | None = None) -> list[int]:
        """The request ended at `now`: its followers are due `think_s` later, with `answer` where they build on
        it. When it was not served they are never sent; they (and theirs) are returned, dropped."""
        followers = self._followers.get(index, ())
        if served:
            if answer is not None:
                self._answers[index] = answer
            for follower in followers:
                due = self._offset[follower] = now - self._t0 + self.requests[follower].think_s
                heapq.heappush(self._heap, (due, follower))
            return []
        dropped = []
        for follower in followers:
            if follower not in self._dropped and follower not in self._taken:
                self._dropped.add(follower)
                dropped.append(follower)
                dropped.extend(self.finish(follower, now, served=False))
        return dropped


def send_columns(scheduled_s: float, sent: float, ended: float | None, t0: float) -> dict[str, float]:
    """When a request was due (`scheduled_s` after the start), sent and ended (perf_counter times; None: it never
    ended) as seconds from the start `t0`: the request-table columns that the achieved rate, send lag and peak in
    flight are measured from (measure/catalog.py), whichever engine sent the request."""
    return {"scheduled_s": scheduled_s, "sent_s": sent - t0, "ended_s": math.nan if ended is None else ended - t0}
