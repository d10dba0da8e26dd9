"""A run's per-request table as the Run page shows it: one row per request, times in ms."""

from ..errors import HistoryError
from . import Export, RunSubject, Scope


def requests_csv(subject: RunSubject) -> bytes:
    # Imported when a file is built, not when the CLI lists the kinds: pandas, and every engine's declarations.
    from .. import csvstore
    from ..views.tables import requests_for_display

    if subject.requests is None:
        raise HistoryError(f"run {subject.run_id} failed before measuring: it has no per-request table")
    return csvstore.frame_bytes(requests_for_display(subject.requests))


REQUESTS = Export(
    "requests",
    "Per-request table (CSV)",
    "text/csv",
    "{stem}-requests.csv",
    {Scope.RUN: requests_csv},
    help="One row per request: its lengths, status and latencies.",
    order=20,
)
