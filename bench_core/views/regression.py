"""The History page's comparison without a browser, and the regression gate a CI job runs on it (`python -m bench_core
compare`).

The runs come in named groups (what the user named: a run id, a sweep id or a label). Runs are repeats of one setup
when they are in the same group and share every setting that differs between the runs: two groups of the same
settings (the main branch's runs and a pull request's) are two setups, which the page, knowing no groups, would take
for one. The comparison is the page's (report.comparison_table, tables.against_baseline); the gate reads the same
Welch's t-test between setups (tables.setup_comparison) and the metric catalog's direction.

Pure functions on loaded history rows (History.load); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..measure.stats import Comparison
from . import acceptance_charts, report, run_diff, tables
from .history_text import fixed_width_table, json_text, markdown_table, plain_value

NOISE = "noise"  # a regression judged by Welch's t-test over the repeats
TOLERANCE = "tolerance"  # a regression judged against the relative change allowed
# The page's note (report.COMPARE_NOTE) in the terms of text without colours and of runs chosen by name.
COMPARE_NOTE = (
    "Each run's value, and beside it its change against the baseline's in %. Marked "
    f"{tables.BEYOND_NOISE_MARK}: a change beyond the run-to-run noise of the two setups (runs chosen by one name "
    "that share every setting are repeats of one setup; Welch's t-test, p < 0.05)."
)


@dataclass(frozen=True)
class Gate:
    """One metric `--fail-on-regression` checks: against noise (tolerance None), or against a relative tolerance (0.05:
    5 % worse is allowed)."""

    metric: str
    tolerance: float | None = None


@dataclass(frozen=True)
class Compared:
    """The runs compared, in the order named, with what the comparison needs of them."""

    runs: pd.DataFrame  # report.compared_runs' rows: with the output length and a report.RUN name column
    varied: list[str]  # the settings that differ between them
    groups: list[int]  # a setup number per run (`setups`)
    sources: list[str]  # per run, the name it was chosen by
    baseline: str  # the baseline run's id

    @property
    def position(self) -> int:
        return self.run_ids.index(self.baseline)

    @property
    def run_ids(self) -> list[str]:
        return self.runs["run_id"].astype(str).tolist()


@dataclass(frozen=True)
class Regression:
    """A setup worse than the baseline's on a gated metric."""

    metric: str
    setup: str  # who: the name it was chosen by, and its differing settings
    run_ids: list[str]
    comparison: Comparison  # the baseline's setup (a) against this one (b)
    reason: str  # NOISE or TOLERANCE
    tolerance: float | None

    @property
    def sentence(self) -> str:
        shown = tables.describe_column(self.metric)
        change = tables.format_change(self.comparison.b.mean, self.comparison.a.mean)
        means = (
            f"mean {tables.format_number(self.comparison.b.mean)} against {tables.format_number(self.comparison.a.mean)}"
            f"{' ' + shown.unit if shown.unit else ''}, {tables.count_of(self.comparison.b.n, 'runs')} against "
            f"{self.comparison.a.n}"
        )
        if self.reason == NOISE:
            why = f"beyond the run-to-run noise (Welch's t-test, p = {self.comparison.p_value:.3g})"
        else:
            why = f"beyond the {_percent(self.tolerance or 0.0)} tolerance"
        return f"{shown.title}: {self.setup} is worse by {change} ({means}), {why}"


def named_runs(table: pd.DataFrame, names: Sequence[str]) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The rows of a loaded history that `names` choose, each run once (by the first name that chose it), in the order
    named: a run id is that run, a sweep id the sweep's runs, a label the runs with that label. Returns the rows, the
    name that chose each, and the names that choose no run."""
    columns = [table[column].fillna("").astype(str) for column in ("run_id", "sweep_id", "label") if column in table]
    chosen: dict[int, str] = {}
    unknown = []
    for name in names:
        found = next((rows for column in columns if (rows := np.flatnonzero(column == name)).size), None)
        if found is None:
            unknown.append(name)
            continue
        for row in found:
            chosen.setdefault(int(row), name)
    return table.iloc[list(chosen)], list(chosen.values()), unknown


def setups(chosen: pd.DataFrame, varied: list[str], sources: Sequence[str]) -> list[int]:
    """A setup number per run: runs chosen by the same name that share every differing setting (run_diff.repeat_groups)
    are repeats of one setup; numbered 0, 1, ... in order of first appearance."""
    keys = list(zip(sources, run_diff.repeat_groups(chosen, varied)))
    numbers: dict[tuple[str, int], int] = {}
    return [numbers.setdefault(key, len(numbers)) for key in keys]


def compared(rows: pd.DataFrame, sources: Sequence[str], baseline_source: str) -> Compared:
    """The rows (`named_runs`) as the comparison reads them, against the oldest run chosen by `baseline_source`."""
    runs, varied = report.compared_runs(rows)
    in_baseline = [source == baseline_source for source in sources]
    baseline = report.oldest_run(runs[in_baseline])
    return Compared(runs, varied, setups(runs, varied, sources), list(sources), baseline)


def comparison(compared: Compared, metrics: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """The History page's comparison table of the runs, its marks, and whether any change could be judged."""
    return report.comparison_table(compared.runs, compared.varied, compared.baseline, metrics, compared.groups)


def regressions(compared: Compared, gates: Sequence[Gate]) -> list[Regression]:
    """Every setup worse than the baseline's on a gated metric, by the gate's rule, in the gates' order."""
    found = []
    groups = np.asarray(compared.groups)
    firsts = [int(np.flatnonzero(groups == group)[0]) for group in dict.fromkeys(compared.groups)]
    for gate in gates:
        values = _numbers(compared.runs, gate.metric)
        better_larger = tables.describe_column(gate.metric).larger_is_better
        for position in firsts:
            result = tables.setup_comparison(values, groups, compared.position, position)
            if result is None:
                continue
            if gate.tolerance is None:
                worse = tables.change_verdict(result, gate.metric) == tables.WORSE
            else:
                worse = better_larger is not None and _worse_beyond(result.relative, better_larger, gate.tolerance)
            if worse:
                members = [run_id for run_id, group in zip(compared.run_ids, groups) if group == groups[position]]
                found.append(
                    Regression(
                        gate.metric,
                        _setup_name(compared, position),
                        members,
                        result,
                        NOISE if gate.tolerance is None else TOLERANCE,
                        gate.tolerance,
                    )
                )
    return found


def unmeasured(compared: Compared, gates: Sequence[Gate]) -> list[str]:
    """The gated metrics that the baseline's setup, or every other setup, has no value of: a gate on them would pass
    having checked nothing (a TTFT of runs that were not streamed)."""
    groups = np.asarray(compared.groups)
    in_baseline = groups == groups[compared.position]
    missing = []
    for gate in dict.fromkeys(gate.metric for gate in gates):
        measured = np.isfinite(_numbers(compared.runs, gate))
        if not measured[in_baseline].any() or not measured[~in_baseline].any():
            missing.append(gate)
    return missing


def unjudged(compared: Compared, gates: Sequence[Gate]) -> list[str]:
    """The gated metrics checked against noise that no setup could be judged on (a setup run once has no spread),
    which therefore can never fail: said, so a CI job does not pass by having nothing to judge."""
    groups = np.asarray(compared.groups)
    base = groups[compared.position]
    judged_setups = (groups == base).sum() > 1 and any((groups == group).sum() > 1 for group in set(groups) - {base})
    return [] if judged_setups else [gate.metric for gate in gates if gate.tolerance is None]


def comparison_text(compared: Compared, metrics: Sequence[str], format_name: str) -> str:
    """The comparison in `format_name` (table or markdown), with the page's note under it."""
    table, _, judged = comparison(compared, metrics)
    notes = [COMPARE_NOTE, *([] if judged else [report.UNJUDGED_NOTE])]
    positions = _position_cells(compared)
    if format_name == "markdown":
        body = markdown_table(table.reset_index())
        text = f"{body}\n" + "".join(f"{note}\n\n" for note in notes).rstrip("\n") + "\n"
        if not positions.empty:
            text += f"\n**{report.POSITIONS_TITLE}**\n\n{markdown_table(positions.reset_index())}\n"
        return text
    text = fixed_width_table(table.reset_index()) + "\n" + "".join(f"{note}\n" for note in notes)
    if not positions.empty:
        text += f"\n{report.POSITIONS_TITLE}:\n{fixed_width_table(positions.reset_index())}\n"
    return text


def _position_cells(compared: Compared) -> pd.DataFrame:
    """The runs' acceptance by draft position as text cells ("57%", "-" where a run has none there)."""
    table = acceptance_charts.position_table(compared.runs, compared.runs[report.RUN])
    return table.map(lambda rate: "-" if math.isnan(rate) else f"{rate:.0%}")


def gate_text(found: Sequence[Regression], gates: Sequence[Gate], format_name: str) -> str:
    """What the gate found, as lines (a list in markdown): each regression, or that none of the metrics regressed."""
    bullet = "- " if format_name == "markdown" else ""
    if not found:
        checked = ", ".join(_gate_name(gate) for gate in gates)
        return f"{bullet}No regression in {checked}.\n"
    heading = "**Regressions**\n\n" if format_name == "markdown" else "Regressions:\n"
    return heading + "".join(f"{bullet or '  '}{regression.sentence}\n" for regression in found)


def comparison_json(
    compared: Compared, metrics: Sequence[str], gates: Sequence[Gate] | None, found: Sequence[Regression]
) -> str:
    """The comparison as JSON for scripts: the runs (with the name that chose each and their setup), the differing
    settings, each metric's value, change against the baseline in % and verdict per run, and, with `gates`, the gate's
    regressions."""
    run_ids = compared.run_ids
    _, marks = tables.against_baseline(compared.runs, metrics, run_ids, compared.groups, compared.position)
    cells = run_diff.setting_cells(compared.runs, compared.varied)
    base = compared.position
    metric_entries = []
    for metric, verdicts in zip(metrics, marks.to_numpy()):
        values = _numbers(compared.runs, metric)
        verdict_of = dict(zip(marks.columns, verdicts))
        metric_entries.append(
            {
                "metric": metric,
                "title": tables.describe_column(metric).title,
                "larger_is_better": tables.describe_column(metric).larger_is_better,
                "runs": [
                    {
                        "run_id": run_id,
                        "value": plain_value(value),
                        "change_percent": None if position == base else plain_value(_change(value, values[base])),
                        "verdict": verdict_of[run_id] or None,
                    }
                    for position, (run_id, value) in enumerate(zip(run_ids, values))
                ],
            }
        )
    document: dict[str, Any] = {
        "baseline": compared.baseline,
        "runs": [
            {
                "run_id": run_id,
                "name": name,
                "chosen_by": source,
                "setup": group,
                "settings": {setting: run_diff.show(cells[setting][at]) for setting in compared.varied},
            }
            for at, (run_id, name, source, group) in enumerate(
                zip(run_ids, compared.runs[report.RUN], compared.sources, compared.groups)
            )
        ],
        "metrics": metric_entries,
    }
    positions = acceptance_charts.position_table(compared.runs, run_ids)
    if not positions.empty:
        document["acceptance_by_position"] = {
            run_id: [plain_value(rate) for rate in rates] for run_id, rates in positions.iterrows()
        }
    if gates is not None:
        document["regressions"] = [_regression_record(regression) for regression in found]
        document["passed"] = not found
    return json_text(document)


def _regression_record(regression: Regression) -> Mapping[str, Any]:
    result = regression.comparison
    return {
        "metric": regression.metric,
        "setup": regression.setup,
        "run_ids": regression.run_ids,
        "reason": regression.reason,
        "baseline_mean": plain_value(result.a.mean),
        "mean": plain_value(result.b.mean),
        "change_percent": plain_value(result.relative * 100),
        "p_value": plain_value(result.p_value),
        "tolerance_percent": None if regression.tolerance is None else plain_value(regression.tolerance * 100),
    }


def _setup_name(compared: Compared, position: int) -> str:
    """A setup as the gate names it: the name that chose it, and its values of the differing settings."""
    settings = run_diff.point_labels(compared.runs.iloc[[position]], compared.varied)[0]
    source = compared.sources[position]
    return f"{source} ({settings})" if settings else source


def _worse_beyond(relative: float, larger_is_better: bool, tolerance: float) -> bool:
    worse_by = -relative if larger_is_better else relative
    return math.isfinite(worse_by) and worse_by > tolerance


def _gate_name(gate: Gate) -> str:
    return gate.metric if gate.tolerance is None else f"{gate.metric} (tolerance {_percent(gate.tolerance)})"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g} %"


def _change(value: float, base: float) -> float:
    return (value - base) / abs(base) * 100 if math.isfinite(value) and math.isfinite(base) and base else math.nan


def _numbers(runs: pd.DataFrame, metric: str) -> np.ndarray:
    if metric not in runs:
        return np.full(len(runs), math.nan)
    return pd.to_numeric(runs[metric], errors="coerce").to_numpy(dtype=np.float64)
