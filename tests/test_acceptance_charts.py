"""The acceptance-by-draft-position chart and line, from a run's summary or history row: a bar per position where
the server counted positions, "not reported" (never a 0) where it reported speculation without them."""

import json

import numpy as np
import pandas as pd

from bench_core.measure.catalog import METRICS, NOT_REPORTED, acceptance_by_position
from bench_core.views.acceptance_charts import (
    acceptance_by_position_figure,
    describe_acceptance_by_position,
    request_acceptance_histogram,
)

COUNTED = {"mean_spec_accept_length": 2.5, "spec_acceptance_by_position": json.dumps([0.75, 0.5, 0.25])}
UNCOUNTED = {"mean_spec_accept_length": 2.5, "server_spec_acceptance_rate": 0.5}


def test_a_bar_per_draft_position_from_one_in_percent():
    figure = acceptance_by_position_figure(COUNTED)
    (bars,) = figure.data
    assert list(bars.x) == [1, 2, 3] and list(bars.y) == [75.0, 50.0, 25.0]
    assert list(figure.layout.xaxis.tickvals) == [1, 2, 3]
    assert not figure.layout.annotations


def test_a_server_without_per_position_counters_is_not_reported_not_zero():
    figure = acceptance_by_position_figure(UNCOUNTED)
    assert not figure.data
    assert [annotation.text for annotation in figure.layout.annotations] == [NOT_REPORTED]


def test_the_line_names_each_position_or_says_not_reported_and_is_absent_without_speculation():
    assert describe_acceptance_by_position(COUNTED) == "Acceptance by draft position (server): 1: 0.75, 2: 0.5, 3: 0.25"
    assert describe_acceptance_by_position(UNCOUNTED) == "Acceptance by draft position (server): not reported"
    assert describe_acceptance_by_position({"mean_ttft_ms": 12.0}) is None
    assert describe_acceptance_by_position({"mean_spec_accept_length": float("nan")}) is None
    # A history row read back from CSV: an empty cell is NaN, and text that is no list is not reported.
    assert describe_acceptance_by_position({**UNCOUNTED, "spec_acceptance_by_position": float("nan")}).endswith(
        NOT_REPORTED
    )
    assert describe_acceptance_by_position({**UNCOUNTED, "spec_acceptance_by_position": "[]"}).endswith(NOT_REPORTED)


def test_the_engines_own_count_is_drawn_under_its_own_name_before_the_servers():
    engine = {"spec_acceptance_length": 2.0, "engine_acceptance_by_position": json.dumps([0.5, 0.25])}
    figure = acceptance_by_position_figure({**COUNTED, **engine})
    (bars,) = figure.data
    assert list(bars.y) == [50.0, 25.0] and figure.layout.title.text == "Acceptance by draft position"
    assert describe_acceptance_by_position(engine) == "Acceptance by draft position: 1: 0.5, 2: 0.25"
    # An engine that counted acceptance but no positions (LMDeploy's engine API) says so.
    assert describe_acceptance_by_position({"spec_acceptance_rate": 0.5}).endswith(NOT_REPORTED)


# Five requests as the engine counted them: drafted / accepted tokens; the last drafted nothing (plain decoding).
PER_REQUEST = pd.DataFrame({"spec_draft_tokens": [10, 10, 8, 4, 0], "spec_accepted_tokens": [10, 5, 4, 0, 0]})


def test_each_requests_acceptance_is_its_accepted_over_its_drafted_tokens():
    rates = METRICS["request_acceptance_rate"].per_request(PER_REQUEST, True)
    assert np.allclose(rates[:4], [1.0, 0.5, 0.5, 0.0]) and np.isnan(rates[4])
    assert METRICS["request_acceptance_rate"].per_request(pd.DataFrame({"input_len": [3]}), True) is None


def test_the_per_request_histogram_counts_requests_per_tenth_of_acceptance():
    figure = request_acceptance_histogram(PER_REQUEST)
    (bars,) = figure.data
    counts = dict(zip(bars.x, bars.y))
    # 0% in the first bin, the two halves in the 50-60% bin, 100% in the last (numpy's closed last bin).
    assert (counts[5.0], counts[55.0], counts[95.0]) == (1, 2, 1) and sum(bars.y) == 4
    assert figure.layout.title.text == "Draft acceptance rate per request"


def test_a_run_without_per_request_counts_has_no_histogram_but_says_not_reported():
    figure = request_acceptance_histogram(pd.DataFrame({"input_len": [3, 4]}))
    assert not figure.data and [annotation.text for annotation in figure.layout.annotations] == [NOT_REPORTED]


def test_a_history_row_s_empty_engine_cell_leaves_the_server_s_positions():
    """A history reads a run's empty text cell back as "": a server's run has no engine count, and its own counters
    stand."""
    row = {"engine_acceptance_by_position": "", "spec_acceptance_by_position": "[0.8, 0.6]"}
    assert acceptance_by_position(row) == [0.8, 0.6]
