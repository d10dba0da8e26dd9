"""A run's row in the format of LMDeploy's profile scripts' --csv: their names, order and number formats."""

from . import Export, RunSubject, Scope


def lmdeploy_csv(subject: RunSubject) -> bytes:
    from .. import csvstore  # pandas: imported when a file is built, not when the CLI lists the kinds

    row = subject.lmdeploy_row
    return csvstore.table_bytes(list(row), [row])


LMDEPLOY_CSV = Export(
    "lmdeploy-csv",
    "LMDeploy CSV",
    "text/csv",
    "{stem}-lmdeploy.csv",
    {Scope.RUN: lmdeploy_csv},
    help="One row in the format of LMDeploy's profile_pipeline_api.py --csv.",
    order=30,
)
