"""`python -m bench_core restful` run in this process (its environment is the test's, monkeypatch included), and
what it left: exit code, stdout, stderr, and the run's history row and request table where one was recorded."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench_core.cli import main
from bench_core.store.history import History


@dataclass
class RestfulRun:
    code: int
    out: str
    err: str
    summary: pd.Series | None  # the history row of the last run; None: nothing recorded
    table: pd.DataFrame | None  # its per-request table

    @property
    def lines(self) -> str:
        return self.out + self.err

    def resent(self) -> int | None:
        """How many requests the run says it sent again on a fresh connection; None where it does not say."""
        if self.table is not None and "resent" in self.table:
            return int(self.table["resent"].fillna(False).astype(bool).sum())
        for name in ("resent", "resent_requests", "n_resent"):
            if self.summary is not None and name in self.summary and pd.notna(self.summary[name]):
                return int(self.summary[name])
        found = re.search(r"\bresent\b[^\d\n]*(\d+)", self.lines, re.IGNORECASE)
        return int(found.group(1)) if found else None


def restful(
    url: str, folder: Path, capsys, *flags: str, prompts: int = 8, output_len: int | None = 8, warmup: bool = False
) -> RestfulRun:
    """A run of `prompts` requests from builtin:sample asking `output_len` tokens each (None: the dataset's own
    lengths, for a dataset that refuses --sharegpt-output-len); `flags` go last (--backend, --model, ...: without
    --model the model is discovered at /v1/models)."""
    capsys.readouterr()  # what came before is not this run's
    argv = [
        "restful",
        "--base-url",
        url,
        "--tokenizer",
        "builtin:tiny-llama",
        "--dataset-path",
        "builtin:sample",
        "--num-prompts",
        str(prompts),
        *([] if output_len is None else ["--sharegpt-output-len", str(output_len)]),
        "--output-file",
        "",
        "--results",
        str(folder / "results"),
        *([] if warmup else ["--disable-warmup"]),
        *flags,
    ]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors leave so, as from `python -m bench_core`
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    summary = table = None
    if (folder / "results").exists():
        history = History(folder / "results")
        runs = history.load()
        if len(runs):
            summary = runs.iloc[-1]
            table = history.requests(summary["run_id"])
    return RestfulRun(code, out.out, out.err, summary, table)
