"""The fallback path of the transformers engine: `model.generate`, one request at a time.

Used where the continuous-batching API is missing (older or newer transformers), when asked for, and for
speculative decoding by prompt lookup, which transformers does only in generate(), for one sequence at a time.
A streamer stamps each token with `perf_counter` as generate() produces it (the tokens a speculative step accepts
arrive together: one tick of several tokens, as a server streams them); a stopping criterion watches `cancel`, so a
cancelled request stops after its current step. Speculation's acceptance is what generate() itself decided: its candidate generator is wrapped
(DraftTally) to record, at each step, how many tokens it drafted and how many of them the model kept.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import threading
import time
from collections.abc import Iterator, Sequence

from ..config import GenerationSettings
from ..load.datasets import SampledRequest
from ..load.schedule import SendSchedule
from ..models.resolve import last_line
from .base import EngineEvent, finish_in_schedule
from .engine_api import ENGINE_POSITION_COLUMN, SPEC_COLUMNS
from .transformers_batching import POLL_S, sampling_kwargs


class DraftTally:
    """What generate()'s speculative steps drafted and kept for one request: per step, the candidates the candidate
    generator proposed and the number the model accepted (the `num_matches` generate() hands back to the generator,
    after its own cropping at EOS and the length limit). A step that drafted nothing is plain decoding, not a draft."""

    def __init__(self, draft_tokens: int) -> None:
        self.accepted_at = [0] * draft_tokens
        self.drafts = self.draft_tokens = self.accepted_tokens = 0

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        for position in range(min(accepted, len(self.accepted_at))):
            self.accepted_at[position] += 1

    def columns(self) -> dict[str, int | str]:
        counts = (self.drafts, self.draft_tokens, self.accepted_tokens)
        return {**dict(zip(SPEC_COLUMNS, counts)), ENGINE_POSITION_COLUMN: json.dumps(self.accepted_at)}


class _CountedCandidates:
    """transformers' candidate generator, passed through, with each step's draft and acceptance told to a tally."""

    def __init__(self, inner, tally: DraftTally) -> None:
        self._inner, self._tally, self._drafted = inner, tally, 0

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def get_candidates(self, input_ids, *args, **kwargs):
        candidates, logits = self._inner.get_candidates(input_ids, *args, **kwargs)
        self._drafted = int(candidates.shape[1] - input_ids.shape[1])
        return candidates, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        self._tally.record(self._drafted, int(num_matches))
        self._inner.update_candidate_strategy(input_ids, scores, num_matches)


class _TokenClock:
    """A generate() streamer: the first `put` is the prompt, each later one a step's new tokens, stamped on arrival."""

    def __init__(self, ticks: queue.Queue) -> None:
        self._ticks = ticks
        self._prompt_seen = False

    def put(self, value) -> None:
        if self._prompt_seen:
            self._ticks.put(("tokens", time.perf_counter(), [int(token) for token in value.reshape(-1).tolist()]))
        self._prompt_seen = True

    def end(self) -> None:
        pass


def generate_one_by_one(
    model,
    tokenizer,
    eos_ids: set[int],
    requests: Sequence[SampledRequest],
    prompts: Sequence[list[int] | None],
    generation: GenerationSettings,
    stream_output: bool,
    cancel: threading.Event,
    schedule: SendSchedule | None = None,
    draft_tokens: int | None = None,
) -> Iterator[EngineEvent]:
    """Each request in turn once it is due; `prompts` as ContinuousBatchRun takes them. `draft_tokens`: speculative
    decoding by prompt lookup, that many tokens drafted per step, each finish carrying its acceptance (DraftTally)."""
    schedule = schedule or SendSchedule(requests)
    schedule.start(time.perf_counter())
    while schedule.pending() and not cancel.is_set():
        index = schedule.next_due(time.perf_counter())
        if index is None:
            wait = schedule.wait_s(time.perf_counter())
            if wait == math.inf:
                return
            cancel.wait(min(POLL_S, wait))
            continue
        outgoing = schedule.take(index, time.perf_counter())
        built = tokenizer.encode(outgoing.prompt) if outgoing.built else None
        ids = prompts[index] if built is None else built
        yield EngineEvent(index, "admit", time.perf_counter(), input_len=0 if built is None else len(built))
        if not ids:
            failed = EngineEvent(index, "finish", time.perf_counter(), 0, "error", "The prompt encodes to no tokens.")
            yield from finish_in_schedule(schedule, failed)
            continue
        config = _generate_config(tokenizer, eos_ids, generation, requests[index].output_len, draft_tokens)
        tally = None if draft_tokens is None else DraftTally(draft_tokens)
        for event in _generate_one(model, index, ids, config, requests[index].output_len, stream_output, cancel, tally):
            if event.kind != "finish":
                yield event
                continue
            answer = (
                tokenizer.decode(event.token_ids, skip_special_tokens=True) if schedule.wants_answer(index) else None
            )
            yield from finish_in_schedule(schedule, event, answer)


def _generate_one(model, index, ids, config, output_len, stream_output, cancel, tally) -> Iterator[EngineEvent]:
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopOnCancel(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

    ticks: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            with torch.inference_mode(), _counting_drafts(model, tally):
                model.generate(
                    torch.tensor([ids], device=model.device),
                    attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=model.device),
                    generation_config=config,
                    streamer=_TokenClock(ticks),
                    stopping_criteria=StoppingCriteriaList([StopOnCancel()]),
                )
            ticks.put(("done", time.perf_counter(), None))
        except Exception as exc:  # this request's error, never raised into the runner
            ticks.put(("error", time.perf_counter(), last_line(exc)))

    threading.Thread(target=work, name=f"generate-request-{index}", daemon=True).start()
    n_tokens, last_ts, token_ids = 0, 0.0, []
    while True:
        try:
            kind, ts, payload = ticks.get(timeout=POLL_S)
        except queue.Empty:
            if cancel.is_set():
                yield EngineEvent(index, "finish", time.perf_counter(), n_tokens, "abort")
                return
            continue
        if kind == "tokens":
            n_tokens, last_ts = n_tokens + len(payload), ts
            token_ids.extend(payload)
            if stream_output:
                yield EngineEvent(index, "tokens", ts, n_tokens)
        elif kind == "error":
            yield EngineEvent(index, "finish", ts, n_tokens, "error", payload)
            return
        elif cancel.is_set() and n_tokens < output_len:
            yield EngineEvent(index, "finish", ts, n_tokens, "abort")
            return
        else:
            if not stream_output and n_tokens:
                yield EngineEvent(index, "tokens", last_ts, n_tokens)
            reason = "length" if n_tokens >= output_len else "stop"
            extra = None if tally is None else tally.columns()
            yield EngineEvent(index, "finish", ts, n_tokens, reason, token_ids=token_ids, extra=extra)
            return


@contextlib.contextmanager
def _counting_drafts(model, tally: DraftTally | None):
    """While generate() runs, its candidate generator (made by the model's private `_get_candidate_generator`,
    transformers 4.x and 5.x) reports each step to `tally`; nothing changes without one."""
    if tally is None:
        yield
        return
    make = type(model)._get_candidate_generator
    model._get_candidate_generator = lambda *args, **kwargs: _CountedCandidates(make(model, *args, **kwargs), tally)
    try:
        yield
    finally:
        del model._get_candidate_generator


def _generate_config(
    tokenizer, eos_ids: set[int], generation: GenerationSettings, output_len: int, draft_tokens: int | None
):
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=output_len,
        # generate() has no "ignore EOS": suppressing EOS until the requested length is how it gets there.
        min_new_tokens=output_len if generation.ignore_eos else None,
        eos_token_id=sorted(eos_ids) or None,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids, default=0),
        prompt_lookup_num_tokens=draft_tokens,
        **sampling_kwargs(generation),
    )
