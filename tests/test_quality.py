"""The quality guard's pure parts: the scorers, drift between two answers' ids, the quality set's records."""

import math

import pandas as pd
import pytest

from bench_core.config import DatasetConfig, EngineConfig, RunConfig
from bench_core.errors import DatasetError
from bench_core.load import dataset_problems
from bench_core.load.quality_set import (
    BUILTIN_QUALITY,
    QualityItem,
    builtin_records,
    contains,
    exact,
    number,
    quality_items,
    regex,
)
from bench_core.measure.quality import (
    DRIFT_IDENTICAL,
    QUALITY_CORRECT,
    OutputJudge,
    baseline_differences,
    drift,
    drift_columns,
    runs_with_answers,
    with_drift,
)
from bench_core.views import quality_charts, tables


@pytest.mark.parametrize(
    ("scorer", "answer", "reference", "expected"),
    [
        (exact, "  Paris\n", "Paris", True),
        (exact, "Paris.", "Paris", False),
        (contains, "The capital is PARIS.", "paris", True),
        (contains, "The capital is Lyon.", "Paris", False),
        (regex, "Yes, it is prime.", r"(?i)\byes\b", True),
        (regex, "Yesterday it was not.", r"(?i)\byes\b", False),
        (number, "The answer is 1,000.", "1000", True),
        (number, "72", "72.0", True),
        (number, "It is -3 degrees", "-3", True),
        (number, "seventy-two", "72", False),
        (number, "71 or 72", "72", False),  # the first number is the answer
    ],
)
def test_scorers(scorer, answer, reference, expected):
    assert scorer(answer, reference) is expected


def test_drift_of_identical_answers_is_none():
    found = drift([5, 6, 7], [5, 6, 7])
    assert found.identical and found.divergence == 3 and found.overlap == 1.0


def test_drift_says_where_answers_first_differ_and_what_they_share():
    found = drift([5, 6, 7, 8], [5, 6, 9, 8])
    assert not found.identical and found.divergence == 2 and found.overlap == 0.75


def test_a_shorter_answer_diverges_where_it_ends():
    found = drift([5, 6, 7, 8], [5, 6])
    assert not found.identical and found.divergence == 2 and found.overlap == 0.5


def test_a_request_without_both_answers_has_no_drift():
    assert all(math.isnan(value) for value in drift_columns(None, [1, 2]).values())
    assert all(math.isnan(value) for value in drift_columns([1, 2], None).values())


def test_the_judge_gives_each_request_its_drift_and_score():
    judge = OutputJudge(baseline=[[1, 2, 3], None], items=[QualityItem("q", "3", "number")] * 2)
    assert judge.columns(0, [1, 2, 3], "3")[DRIFT_IDENTICAL] == 1.0
    assert judge.columns(0, [1, 2, 4], "4")[QUALITY_CORRECT] == 0.0
    assert math.isnan(judge.columns(1, [1], "3")[DRIFT_IDENTICAL])  # the baseline did not serve it
    assert math.isnan(judge.columns(1, None, None)[QUALITY_CORRECT])  # this run did not serve it


def test_the_builtin_set_is_a_dozen_valid_records():
    items = quality_items(builtin_records(), BUILTIN_QUALITY)
    assert len(items) == 12 and {item.scorer for item in items} == {"number", "contains", "regex"}


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"prompt": "2+2?", "reference": "4", "scorer": "fuzzy"}, "scorer 'fuzzy' is not one of exact"),
        ({"prompt": "2+2?", "scorer": "exact"}, "'reference' is not a non-empty string"),
        ({"reference": "4"}, "'prompt' is not a non-empty string"),
        ({"prompt": "2+2?", "reference": "(", "scorer": "regex"}, "not a regular expression"),
        ({"prompt": "2+2?", "reference": "four", "scorer": "number"}, "holds no number"),
        (["2+2?", "4"], "JSON list, not an object"),
    ],
)
def test_a_bad_record_is_refused_with_its_line(record, why):
    with pytest.raises(DatasetError, match="line 3") as refused:
        quality_items([(3, record)], "set.jsonl")
    assert why in str(refused.value)


def test_an_empty_set_is_refused():
    with pytest.raises(DatasetError, match="holds no record"):
        quality_items([], "set.jsonl")


def test_a_baseline_of_other_prompts_or_a_sampling_run_is_told():
    assert baseline_differences("b1", [5, 6], [5, 6], samples=False) == []
    (fewer,) = baseline_differences("b1", [5, 6], [5], samples=False)
    assert "baseline b1 has 2 requests, this run 1" in fewer
    (other,) = baseline_differences("b1", [5, 6], [5, 7], samples=False)
    assert "prompts differ" in other
    (sampling,) = baseline_differences("b1", [5], [5], samples=True)
    assert "samples" in sampling


def _requests(answers, statuses=None):
    return pd.DataFrame(
        {"status": statuses or ["success"] * len(answers), "output_ids": pd.Series(answers, dtype=object)}
    )


def test_compare_gives_each_run_that_kept_answers_its_drift_from_the_picked_baseline():
    runs = pd.DataFrame({"run_id": ["base", "same", "other", "bare"], "drift_exact_match_rate": [math.nan] * 4})
    tables = {
        "base": _requests([[1, 2, 3], [4, 5]]),
        "same": _requests([[1, 2, 3], [4, 5]]),
        "other": _requests([[1, 9, 3], [4, 5]]),
        "bare": _requests([[1, 2, 3], [4, 5]]).drop(columns="output_ids"),
    }
    shown = with_drift(runs, tables, "base").set_index("run_id")
    assert shown.loc["same", "drift_exact_match_rate"] == 1.0
    assert shown.loc["other", "drift_exact_match_rate"] == 0.5
    assert shown.loc["other", "drift_mean_divergence"] == 1.5  # diverges at 1, and at its end (2)
    assert math.isnan(shown.loc["bare", "drift_exact_match_rate"])  # it kept no answers


def test_compare_leaves_runs_as_recorded_where_the_baseline_kept_no_answers():
    runs = pd.DataFrame({"run_id": ["base", "same"], "drift_exact_match_rate": [math.nan, 0.25]})
    tables = {"base": _requests([[1]]).drop(columns="output_ids"), "same": _requests([[1]])}
    assert with_drift(runs, tables, "base")["drift_exact_match_rate"].tolist()[1] == 0.25


def test_a_failed_request_has_no_drift_in_compare():
    runs = pd.DataFrame({"run_id": ["base", "half"]})
    tables = {"base": _requests([[1], [2]]), "half": _requests([[1], [3]], ["success", "failed"])}
    assert with_drift(runs, tables, "base").set_index("run_id").loc["half", "drift_exact_match_rate"] == 1.0


def test_output_len_sets_a_quality_sets_answer_length_on_any_dataset():
    def problems(**dataset):
        config = RunConfig(engine=EngineConfig(backend="transformers"), dataset=DatasetConfig(output_len=16, **dataset))
        return [problem for problem in dataset_problems(config) if "--output-len" in problem]

    assert problems() == ["--output-len applies to the shared-prefix and custom datasets only."]
    assert problems(quality_set="builtin:quality") == []


def test_the_runs_offered_as_a_baseline_are_those_that_kept_their_answers_newest_first():
    runs = pd.DataFrame(
        {
            "run_id": ["kept", "plain", "checked", "scored", "old"],
            "keep_outputs": pd.array([True, False, False, False, pd.NA], dtype="boolean"),
            "drift_baseline": ["", "", "kept", "", None],
            "quality_set": ["", "", "", "builtin:quality", None],
        }
    )
    assert runs_with_answers(runs) == ["scored", "checked", "kept"]
    assert runs_with_answers(pd.DataFrame({"run_id": ["before the guard"]})) == []  # a history without the columns


def test_the_quality_table_holds_the_guards_metrics_and_the_throughput_table_does_not():
    summary = {
        "completed": 4,
        "drift_exact_match_rate": 0.5,
        "drift_mean_divergence": 7.0,
        "quality_accuracy": math.nan,
    }
    judged = tables.quality_table(summary)
    assert judged["value"].to_dict() == {
        "Exact-match rate with the baseline": 0.5,
        "Mean first divergence from the baseline": 7.0,
    }
    assert tables.throughput_table(summary).index.intersection(judged.index).empty
    assert tables.quality_table({"completed": 4}).empty


def test_the_divergence_histogram_stacks_the_answers_that_differ_on_those_identical_to_the_baseline():
    requests = pd.DataFrame(
        {DRIFT_IDENTICAL: [0.0, 0.0, 1.0, math.nan], "drift_divergence": [3.0, 5.0, 12.0, math.nan]}
    )
    figure = quality_charts.divergence_histogram(requests)
    differs, identical = figure.data
    assert (differs.name, list(differs.x)) == (quality_charts.DIFFERENT, [3.0, 5.0])
    assert (identical.name, list(identical.x)) == (quality_charts.IDENTICAL, [12.0])  # a failed request: none
    assert figure.layout.barmode == "stack"
    assert quality_charts.divergence_histogram(pd.DataFrame({"output_len": [3]})) is None  # no baseline
