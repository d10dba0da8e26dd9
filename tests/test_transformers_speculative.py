"""The embedded engine's speculative decoding by prompt lookup (transformers' generate()), on the real tiny Llama:
the answers are greedy decoding's own, and the acceptance is what generate() accepted, per request and per draft
position, through to the run's history row and its line."""

import json
import re
import threading
from dataclasses import replace

import pandas as pd
import pytest
from test_cli import run_cli

from bench_core.config import EngineConfig, GenerationSettings, LoadConfig
from bench_core.engines import transformers_engine, validate_engine_config
from bench_core.load.datasets import SampledRequest
from bench_core.states import LoadPattern
from bench_core.views.acceptance_charts import acceptance_by_position_figure

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

DRAFT_TOKENS = 4
# Repeated text: prompt lookup finds its n-grams in the prompt and drafts from there.
REQUESTS = [
    SampledRequest("The quick brown fox jumps over the lazy dog. " * 6, 0, 40),
    SampledRequest("def f(x):\n    return x\n" * 5, 0, 25),
    SampledRequest("Once upon a time", 0, 30),
]


def _events(engine) -> list:
    load = LoadConfig(concurrency=1, stream_output=True)
    return list(engine.stream(REQUESTS, GenerationSettings(), load, threading.Event()))


def _finishes(events) -> dict:
    return {event.index: event for event in events if event.kind == "finish"}


@pytest.fixture(scope="module")
def plain_and_speculative(tiny_model_path):
    plain = transformers_engine.TransformersEngine(EngineConfig(model=tiny_model_path), continuous_batching=False)
    plain_events = _events(plain)
    plain.close()
    speculative = transformers_engine.TransformersEngine(
        EngineConfig(
            model=tiny_model_path, speculative_algorithm="prompt_lookup", speculative_num_draft_tokens=DRAFT_TOKENS
        )
    )
    yield plain_events, _events(speculative)
    speculative.close()


def test_speculation_leaves_the_greedy_answers_as_they_were(plain_and_speculative):
    plain, speculative = (_finishes(events) for events in plain_and_speculative)
    assert {i: list(e.token_ids) for i, e in speculative.items()} == {i: list(e.token_ids) for i, e in plain.items()}
    assert all(plain[i].extra is None for i in plain)


def test_each_request_carries_what_generate_drafted_and_accepted_per_position(plain_and_speculative):
    speculative = _finishes(plain_and_speculative[1])
    for finish in speculative.values():
        extra = finish.extra
        by_position = json.loads(extra["spec_accepted_by_position"])
        assert len(by_position) == DRAFT_TOKENS
        # Position i is accepted only where every position before it was.
        assert by_position == sorted(by_position, reverse=True) and by_position[0] <= extra["spec_drafts"]
        assert sum(by_position) == extra["spec_accepted_tokens"] <= extra["spec_draft_tokens"]
        assert extra["spec_draft_tokens"] <= DRAFT_TOKENS * extra["spec_drafts"]
        # Each step yields its accepted drafts and one token of its own: steps + accepted = the tokens streamed.
        assert extra["spec_drafts"] + extra["spec_accepted_tokens"] <= finish.n_tokens
    assert sum(finish.extra["spec_accepted_tokens"] for finish in speculative.values()) > 0


@pytest.mark.parametrize(
    "backend, method, pattern, expected",
    [
        ("transformers", "eagle", LoadPattern.BATCH, "--speculative-algorithm must be one of prompt_lookup"),
        ("pytorch", "prompt_lookup", LoadPattern.BATCH, "--speculative-algorithm must be one of eagle"),
        ("transformers", "prompt_lookup", LoadPattern.ENGINE_API, "engine API load pattern does not drive"),
    ],
)
def test_a_method_the_backend_cannot_run_is_refused(backend, method, pattern, expected):
    engine = replace(EngineConfig(), backend=backend, speculative_algorithm=method)
    problems = validate_engine_config(engine, LoadConfig(load_pattern=pattern))
    assert any(expected in problem for problem in problems), problems


def test_a_prompt_lookup_run_records_its_acceptance_in_the_history(tmp_path):
    done = run_cli(
        *("pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "-n", "6"),
        *("--speculative-algorithm", "prompt_lookup", "--speculative-num-draft-tokens", "3"),
        *("--csv", "", "--results", str(tmp_path / "results")),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (row,) = pd.read_csv(tmp_path / "results" / "history.csv").to_dict("records")
    rates = json.loads(row["engine_acceptance_by_position"])
    assert len(rates) == 3 and all(0 <= rate <= 1 for rate in rates) and rates == sorted(rates, reverse=True)
    assert 0 < row["spec_acceptance_rate"] <= 1 and 1 < row["spec_acceptance_length"] <= 4
    assert "Acceptance by draft position: 1: " in done.stdout
    (bars,) = acceptance_by_position_figure(row).data
    assert list(bars.x) == [1, 2, 3]


def test_the_tokens_a_step_accepts_arrive_as_one_tick(plain_and_speculative):
    plain, speculative = plain_and_speculative

    def largest_tick(events) -> int:
        counts: dict[int, int] = {}
        largest = 0
        for event in events:
            if event.kind == "tokens":
                largest = max(largest, event.n_tokens - counts.get(event.index, 0))
                counts[event.index] = event.n_tokens
        return largest

    assert largest_tick(plain) == 1 and 1 < largest_tick(speculative) <= DRAFT_TOKENS + 1


@pytest.fixture(scope="module")
def paired_run(tmp_path_factory):
    """pipeline --against-no-speculation on the tiny model, with its report: the CLI's answer and the results folder."""
    folder = tmp_path_factory.mktemp("paired")
    done = run_cli(
        *("pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "-n", "6"),
        *("--load", "concurrency", "--stream-output", "--sharegpt-output-len", "16"),
        *(
            "--speculative-algorithm",
            "prompt_lookup",
            "--speculative-num-draft-tokens",
            "3",
            "--against-no-speculation",
        ),
        *("--csv", "", "--results", str(folder / "results"), "--report", str(folder / "report.html")),
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr
    return done, folder


def test_a_run_against_no_speculation_pairs_the_same_prompts_on_the_same_path(paired_run):
    done, folder = paired_run
    results = folder / "results"
    off, on = pd.read_csv(results / "history.csv").to_dict("records")
    configs = [json.loads((results / "runs" / row["run_id"] / "config.json").read_text()) for row in (off, on)]
    assert [config["flat"]["speculative_algorithm"] for config in configs] == [None, "prompt_lookup"]
    # The baseline decodes where speculation does: generate(), not continuous batching.
    assert [config["flat"]["decode_path"] for config in configs] == ["generate", "generate"]
    tables = [pd.read_parquet(results / "runs" / row["run_id"] / "requests.parquet") for row in (off, on)]
    for column in ("index", "input_len", "req_output_len"):
        assert tables[0][column].tolist() == tables[1][column].tolist()
    assert "spec_accepted_tokens" in tables[1] and "spec_accepted_tokens" not in tables[0]
    heading = (
        "speculative_algorithm=prompt_lookup against speculative_algorithm=none, request by request "
        f"({on['run_id']} over {off['run_id']}"
    )
    assert heading in done.stdout
    lines = done.stdout.split(heading)[1].splitlines()[1:]
    ratios = dict(line.strip().split(": ") for line in lines if line.startswith("  "))
    assert set(ratios) == {
        "Time to first token",
        "Time per output token",
        "End-to-end latency",
        "Decode tokens/s per request",
    }
    for cell in ratios.values():
        value, low, high = map(float, re.fullmatch(r"(\S+) \((\S+) to (\S+)\)", cell).groups())
        assert low <= value <= high


def test_compare_and_the_report_show_each_runs_acceptance_by_position(paired_run):
    folder = paired_run[1]
    results = folder / "results"
    off, on = pd.read_csv(results / "history.csv").to_dict("records")
    rates = json.loads(on["engine_acceptance_by_position"])
    ids = (off["run_id"], on["run_id"])
    as_json = run_cli("compare", *ids, "--format", "json", "--results", str(results), cwd=folder)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["acceptance_by_position"] == {ids[0]: [None] * 3, ids[1]: rates}
    as_table = run_cli("compare", *ids, "--results", str(results), cwd=folder)
    (row,) = [line for line in as_table.stdout.splitlines() if line.startswith("Speculative algorithm prompt_lookup")][
        -1:
    ]
    assert row.split()[-3:] == [f"{rate:.0%}" for rate in rates]
    as_markdown = run_cli("compare", *ids, "--format", "markdown", "--results", str(results), cwd=folder)
    assert "| run | position 1 | position 2 | position 3 |" in as_markdown.stdout
    report = (folder / "report.html").read_text()
    assert "Acceptance by draft position (accepted / drafts at each position)" in report
    assert "Against the baseline, request by request" in report


def test_a_run_against_no_speculation_needs_speculation(tmp_path):
    done = run_cli(
        *("pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "-n", "2"),
        *("--against-no-speculation", "--csv", "", "--results", str(tmp_path / "results")),
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "needs speculation to set against" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "results" / "history.csv").exists()


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("sweep", "needs speculation to set against: give --speculative-algorithm"),
        ("tune", "A tune picks its points and does not pair them"),
    ],
)
def test_a_sweep_without_speculation_or_a_tune_refuses_a_pair_before_any_run(tmp_path, command, said):
    axis = ["--sweep", "concurrency=1,2"] if command == "sweep" else ["--space", "concurrency=1,2"]
    done = run_cli(
        *(command, "pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers", *axis),
        *("--against-no-speculation", "--csv", "", "--results", str(tmp_path / "results")),
        cwd=tmp_path,
    )
    assert done.returncode == 2 and said in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "results" / "history.csv").exists()
