"""The vocabularies every layer shares, each defined once: run states, request statuses, load patterns, and the
rules that join them (which engine finish reasons count as served, which request counts make which run outcome).

They are `StrEnum`s whose values are the strings the history has always held, so a member compares equal to
its string, and files written before and after read alike, byte for byte. The `Session` integers of
`measure.profiler` (SUCCESS, FAIL, ...) stay integers: they are LMDeploy's API.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """Where a benchmark run, a playground job or a sweep stands.

    A run goes queued -> loading -> running -> finished | partial | failed | cancelled (run.lifecycle holds the
    legal moves); a playground job takes the same path without partial, and a sweep reports running, then
    finished, failed or cancelled.
    """

    QUEUED = "queued"
    LOADING = "loading"
    RUNNING = "running"
    FINISHED = "finished"
    PARTIAL = "partial"  # ran to the end, but some requests failed
    FAILED = "failed"  # no request succeeded, or the run broke
    CANCELLED = "cancelled"


MEASURED = (RunState.FINISHED, RunState.PARTIAL)  # ran to the end with requests that succeeded: its numbers stand
IMPORTED = "imported"  # the status of a history row read from a CSV (LMDeploy's or another history), not run here


class RequestStatus(StrEnum):
    """The status of one request in the per-request table; only SUCCESS requests count in LMDeploy's metrics."""

    SUCCESS = "success"  # finished successfully with at least the requested number of tokens
    FAILED = "failed"
    INCOMPLETE = "incomplete"  # finished successfully but with fewer tokens than requested
    OVERRUN = "overrun"  # served with more tokens than requested: a server that ignored the token limit
    UNFINISHED = "unfinished"  # never finished: still running, or never sent (a duration ended)
    CANCELLED = "cancelled"  # stopped by the user's cancel, running or waiting: not an engine failure


class LoadPattern(StrEnum):
    """How requests are sent (DESIGN.md, "Timing semantics")."""

    BATCH = "batch"  # profile_pipeline_api.py: every request at t0
    CONCURRENCY = "concurrency"  # profile_throughput.py's N workers, through the pipeline API
    ENGINE_API = "engine_api"  # profile_throughput.py itself: N workers on the engine instance API, ids in and out
    REQUEST_RATE = "request_rate"  # profile_restful_api.py / vLLM: arrivals at a rate, to a server
    TRACE = "trace"  # Mooncake-style replay: each request at its trace timestamp (the trace dataset)


# A request counts as served when the engine stopped it for length or for EOS; the profiler then tells complete
# from incomplete by comparing the tokens produced with the tokens asked for.
SERVED_REASONS = ("length", "stop")


def measured_state(completed: int, failed: int, incomplete: int, overrun: int = 0) -> RunState:
    """The state of a run that ran to its end, from its request counts: failed when no request succeeded,
    partial when some failed, came back short or ran past their token limit, else finished."""
    if not completed:
        return RunState.FAILED
    return RunState.PARTIAL if failed or incomplete or overrun else RunState.FINISHED
