"""The history rows of a run, of the runs compared or of a sweep: history.csv's columns, LMDeploy's first."""

from . import Export, Scope


def history_rows_csv(subject) -> bytes:
    return subject.history.to_csv_bytes(subject.run_ids)


def recorded(subject) -> bool:
    # A run the history failed to save has no row: no button for an empty file. Runs compared or swept are rows.
    return subject.scope != Scope.RUN or subject.history.row(subject.run_id) is not None


HISTORY_ROWS = Export(
    "history-rows",
    "History rows of this {scope} (CSV)",
    "text/csv",
    "{stem}-history.csv",
    {Scope.RUN: history_rows_csv, Scope.COMPARISON: history_rows_csv, Scope.SWEEP: history_rows_csv},
    help="The runs' rows of history.csv, every cell as recorded.",
    order=10,
    offered=recorded,
)
