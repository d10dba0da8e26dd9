"""The workload a run sends, as a table: per request its input and output lengths and what its dataset knows of
it (a multi-turn session and turn, a prefix group, the tokens it shares with earlier prompts, its images' vision
tokens, its trace time), so a figure can show it before the run and the run's request table keeps it after.

Pure: from sampled requests (requests.SampledRequest), no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .requests import SampledRequest

# The built-in datasets' facts, in the order the request table shows them; another dataset's follow, in the order
# its requests first give them.
FACT_COLUMNS = ("session", "turn", "prefix_group", "shared_prefix_tokens", "vision_tokens", "images", "trace_input_len")


def workload_table(requests: Sequence[SampledRequest]) -> pd.DataFrame:
    """One row per request: input_len, req_output_len (the output asked for), send_at_s where a trace says when,
    and the facts its dataset gives (NaN where a request lacks one)."""
    table = pd.DataFrame(
        {"input_len": [r.input_len for r in requests], "req_output_len": [r.output_len for r in requests]}
    )
    if any(r.send_at_s is not None for r in requests):
        table["send_at_s"] = [np.nan if r.send_at_s is None else r.send_at_s for r in requests]
    for name, values in _facts(requests).items():
        table[name] = values
    return table


def with_workload_columns(table: pd.DataFrame, requests: Sequence[SampledRequest]) -> pd.DataFrame:
    """A run's request table (one row per request, in order) with the facts of its sampled requests as columns."""
    if len(requests) != len(table):
        return table
    # Another dataset's fact never overwrites what was measured.
    facts = {name: values for name, values in _facts(requests).items() if name in FACT_COLUMNS or name not in table}
    return table.assign(**facts) if facts else table


def _facts(requests: Sequence[SampledRequest]) -> dict[str, list]:
    given = dict.fromkeys(name for r in requests for name in r.facts)
    present = [name for name in FACT_COLUMNS if name in given] + [name for name in given if name not in FACT_COLUMNS]
    return {name: [r.facts.get(name, np.nan) for r in requests] for name in present}
