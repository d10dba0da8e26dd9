"""The workloads beyond LMDeploy's two (issue 22): what each dataset draws, and the schedule that says when each
request goes. Real tokenizers (the built-in tiny Llama's), real files, no engine."""

from __future__ import annotations

import base64
import io
import json
import math
import random

import numpy as np
import pytest

from bench_core.config import DatasetConfig, LoadConfig
from bench_core.errors import DatasetError
from bench_core.load.datasets import sample_requests
from bench_core.load.requests import SampledRequest, common_prefix_len, render_transcript
from bench_core.load.schedule import SendSchedule
from bench_core.load.shared_prefix_dataset import group_order, hidden_reuse_note
from bench_core.load.workload import with_workload_columns, workload_table
from bench_core.views import workload_charts


def shared_prefix(tiny_tokenizer, **overrides):
    settings = (
        dict(
            dataset_name="shared-prefix",
            num_prompts=12,
            prefix_len=64,
            suffix_len=16,
            prefix_groups=3,
            output_len=8,
            seed=0,
        )
        | overrides
    )
    return sample_requests(DatasetConfig(**settings), tiny_tokenizer)


# ---- shared-prefix ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_shared_prefixes_are_byte_identical_after_tokenization_within_a_group_and_differ_across(tiny_tokenizer):
    sample = shared_prefix(tiny_tokenizer)
    encoded = [tiny_tokenizer.encode(r.prompt) for r in sample.requests]
    groups = [r.facts["prefix_group"] for r in sample.requests]
    assert sorted(set(groups)) == [0, 1, 2] and groups[:6] == [0, 1, 2, 0, 1, 2]  # interleaved
    for group in range(3):
        members = [ids for ids, g in zip(encoded, groups) if g == group]
        assert len(members) == 4
        assert all(ids[:64] == members[0][:64] for ids in members)  # the prefix's 64 tokens, exactly
        assert all(common_prefix_len(ids, members[0]) < 64 + 16 for ids in members[1:])  # suffixes differ
    assert common_prefix_len(encoded[0], encoded[1]) < 8  # another group's prefix
    assert all(r.facts["shared_prefix_tokens"] >= 64 for r in sample.requests)
    assert all(
        r.input_len == len(ids) and 64 + 16 <= r.input_len <= 64 + 16 + 2 for r, ids in zip(sample.requests, encoded)
    )
    assert all(r.output_len == 8 for r in sample.requests) and not sample.warnings


def test_a_share_of_zero_sends_the_same_lengths_with_nothing_to_reuse(tiny_tokenizer):
    reused, unique = shared_prefix(tiny_tokenizer), shared_prefix(tiny_tokenizer, prefix_share=0.0)
    assert [r.input_len for r in unique.requests] == pytest.approx([r.input_len for r in reused.requests], abs=2)
    assert all(r.facts["shared_prefix_tokens"] == 0 for r in unique.requests)
    prompts = [tiny_tokenizer.encode(r.prompt) for r in unique.requests]
    assert max(common_prefix_len(a, b) for i, a in enumerate(prompts) for b in prompts[i + 1 :]) < 8
    half = shared_prefix(tiny_tokenizer, prefix_share=0.5)
    assert half.notes[-1] == "6 of 12 prompts reuse one of 3 prefixes of 64 tokens"
    # a prompt alone in reusing its group's prefix shares it with no other
    assert 0 < sum(r.facts["shared_prefix_tokens"] > 0 for r in half.requests) <= 6


def test_shared_prefix_draws_are_the_seeds_and_the_order_is_asked(tiny_tokenizer):
    assert [r.prompt for r in shared_prefix(tiny_tokenizer).requests] == [
        r.prompt for r in shared_prefix(tiny_tokenizer).requests
    ]
    assert [r.prompt for r in shared_prefix(tiny_tokenizer, seed=1).requests] != [
        r.prompt for r in shared_prefix(tiny_tokenizer).requests
    ]
    grouped = shared_prefix(tiny_tokenizer, prefix_order="grouped")
    assert [r.facts["prefix_group"] for r in grouped.requests] == [0] * 4 + [1] * 4 + [2] * 4
    assert group_order(7, 3, "interleaved", random.Random(0)) == [0, 1, 2, 0, 1, 2, 0]
    shuffled = group_order(12, 3, "random", random.Random(0))
    assert sorted(shuffled) == sorted(group_order(12, 3, "grouped", random.Random(0))) and shuffled != sorted(shuffled)


def test_leaders_first_sends_each_groups_other_prompts_after_its_first(tiny_tokenizer):
    leaders = shared_prefix(tiny_tokenizer).requests  # the default order
    assert [r.facts["prefix_group"] for r in leaders] == [0, 1, 2] * 4  # interleaved, as before
    assert [r.follows for r in leaders] == [None, None, None, 0, 1, 2, 0, 1, 2, 0, 1, 2]
    half = shared_prefix(tiny_tokenizer, prefix_share=0.5).requests
    for request in half:  # a prompt with a prefix of its own waits for nobody, nor does its group's first
        if request.facts["shared_prefix_tokens"] == 0:
            assert request.follows is None
    assert all(r.follows is None for r in shared_prefix(tiny_tokenizer, prefix_order="interleaved").requests)


def test_the_note_says_how_many_prompts_arrive_at_once_and_how_few_can_reuse_a_cached_prefix():
    batch = DatasetConfig(dataset_name="shared-prefix", num_prompts=8, prefix_groups=4, prefix_order="interleaved")
    assert hidden_reuse_note(batch, LoadConfig(concurrency=8), caching=True).startswith(
        "8 prompts arrive at once; at most 4 of the 8 can reuse a cached prefix"
    )
    workers = LoadConfig(load_pattern="concurrency", concurrency=3)
    assert hidden_reuse_note(batch, workers, caching=True).startswith("3 prompts arrive at once; at most 4 of the 8")
    paced = LoadConfig(load_pattern="request_rate", request_rate=2.0)
    assert hidden_reuse_note(batch, paced, caching=True) == ""  # spread in time: nothing hidden
    assert hidden_reuse_note(batch, LoadConfig(concurrency=8), caching=False) == ""
    assert hidden_reuse_note(DatasetConfig(dataset_name="shared-prefix"), LoadConfig(), caching=True) == ""


# ---- multi-turn ------------------------------------------------------------------------------------------------


def multi_turn(tiny_tokenizer, **overrides):
    settings = dict(dataset="builtin:sample", dataset_name="multi-turn", num_prompts=4, turns=3, seed=0) | overrides
    return sample_requests(DatasetConfig(**settings), tiny_tokenizer)


def test_every_turn_resends_the_conversation_so_far_and_follows_the_turn_before(tiny_tokenizer):
    sample = multi_turn(tiny_tokenizer, multi_turn_answers="dataset", think_time_s=1.5)
    requests = sample.requests
    assert len(requests) == 12 and [r.session for r in requests] == [s for s in range(4) for _ in range(3)]
    for index, request in enumerate(requests):
        assert request.turn == index % 3 and request.facts == {
            "session": request.session,
            "turn": request.turn,
            "shared_prefix_tokens": requests[index - 1].input_len if request.turn else 0,
        }
        assert request.input_len == len(tiny_tokenizer.encode(request.prompt))
        assert request.prompt == render_transcript(request.messages)
        if request.turn == 0:
            assert request.follows is None and request.think_s == 0 and len(request.messages) == 1
            continue
        before = requests[index - 1]
        assert request.follows == index - 1 and request.think_s == 1.5 and not request.builds_on_answer
        # the previous turn's whole prompt, its answer, then this turn's own message
        assert request.messages[:-2] == before.messages and request.messages[-2]["role"] == "assistant"
        assert request.prompt.startswith(before.prompt) and request.input_len > before.input_len
        assert (
            tiny_tokenizer.encode(request.prompt)[: before.input_len - 1]
            == tiny_tokenizer.encode(before.prompt)[: before.input_len - 1]
        )
    assert sample.notes[-1] == "4 sessions of 3 turns (12 requests), repeating the dataset's answers"


def test_on_the_models_answers_later_turns_build_on_them_and_their_lengths_are_estimated(tiny_tokenizer):
    dataset_answers = multi_turn(tiny_tokenizer, multi_turn_answers="dataset", sharegpt_output_len=16)
    live = multi_turn(tiny_tokenizer, sharegpt_output_len=16)
    assert [r.builds_on_answer for r in live.requests] == [r.turn > 0 for r in live.requests]
    assert all(r.output_len == 16 for r in live.requests)
    for estimate, request in zip(live.requests, dataset_answers.requests):
        previous_answers = [m for m in request.messages if m["role"] == "assistant"]
        dataset_tokens = sum(len(tiny_tokenizer.encode(m["content"])) for m in previous_answers)
        assert estimate.input_len == request.input_len - dataset_tokens + 16 * len(previous_answers)


@pytest.mark.slow
def test_conversations_too_short_for_the_turns_asked_are_skipped_and_said(tiny_tokenizer):
    sample = multi_turn(tiny_tokenizer, num_prompts=500, turns=3)
    sessions = {r.session for r in sample.requests}
    assert 10 < len(sessions) < 500 and "sessions asked for have 3 turns" in sample.warnings[0]
    with pytest.raises(DatasetError, match="has 8 turns"):
        multi_turn(tiny_tokenizer, turns=8)


# ---- trace -----------------------------------------------------------------------------------------------------

TRACE = [
    {"timestamp": 27482, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]},
    {"timestamp": 27982, "input_length": 1100, "output_length": 6, "hash_ids": [1, 2, 3]},
    {"timestamp": 29482, "input_length": 100, "output_length": 7, "hash_ids": [4]},
    {"timestamp": 30482, "input_length": 600, "output_length": 8, "hash_ids": [4]},
]


def write_jsonl(path, records) -> str:
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n")
    return str(path)


def test_equal_hash_ids_give_byte_identical_blocks_and_each_request_keeps_its_time(tmp_path, tiny_tokenizer):
    config = DatasetConfig(dataset=write_jsonl(tmp_path / "trace.jsonl", TRACE), dataset_name="trace", num_prompts=10)
    requests = sample_requests(config, tiny_tokenizer).requests
    assert [r.send_at_s for r in requests] == [0.0, 0.5, 2.0, 3.0]  # from the first record, in seconds
    assert [r.output_len for r in requests] == [5, 6, 7, 8]
    first, second, third, fourth = (r.prompt for r in requests)
    # 512-token blocks: the first request is block 1 and 188 tokens of block 2, the second blocks 1, 2 and 76 of 3
    assert second.startswith(first) and len(second) > len(first)
    assert fourth.startswith(third)  # block 4 cut to 100 tokens, then all of it and 88 tokens of its own
    assert [r.facts["trace_input_len"] for r in requests] == [700, 1100, 100, 600]
    # as far as earlier prompts held the blocks: all of the first prompt, 100 tokens of block 4
    assert [r.facts["shared_prefix_tokens"] for r in requests] == [0, 700, 0, 100]
    for request, record in zip(requests, TRACE):
        assert abs(request.input_len - record["input_length"]) <= 8  # text round trips within a few tokens


def test_a_bad_trace_line_is_refused_with_its_number(tmp_path, tiny_tokenizer):
    records = [*TRACE[:2], {"timestamp": 3, "input_length": 0, "output_length": 4, "hash_ids": []}]
    config = DatasetConfig(dataset=write_jsonl(tmp_path / "bad.jsonl", records), dataset_name="trace")
    with pytest.raises(
        DatasetError,
        match=r"bad.jsonl, line 3: the record is refused because its 'input_length' "
        r"must be a whole number from 1 to 16,777,216, not 0",
    ):
        sample_requests(config, tiny_tokenizer)


@pytest.mark.parametrize("key", ["input_length", "output_length"])
def test_a_trace_length_beyond_what_a_history_column_holds_is_refused_with_its_line(tmp_path, tiny_tokenizer, key):
    # Line 3 is refused too: were line 2's length let through, no prompt of 10**30 tokens would be built for it.
    records = [TRACE[0], {**TRACE[1], key: 10**30}, {**TRACE[2], "hash_ids": "not a list"}]
    config = DatasetConfig(dataset=write_jsonl(tmp_path / "big.jsonl", records), dataset_name="trace")
    with pytest.raises(DatasetError) as caught:
        sample_requests(config, tiny_tokenizer)
    assert str(caught.value).startswith(
        f"Dataset {config.dataset}, line 2: the record is refused because its '{key}' must be a whole number "
        f"from 1 to 16,777,216, not {10**30}; "
    )
    assert "\n" not in str(caught.value)


# ---- custom ----------------------------------------------------------------------------------------------------


def test_custom_records_take_a_prompt_or_messages_and_their_own_output_length(tmp_path, tiny_tokenizer):
    records = [
        {"prompt": "What is a hash map?", "output_len": 12},
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
            "max_tokens": 5,
        },
        {"prompt": [{"role": "user", "content": "a list prompt is messages"}]},
        {"prompt": "no length: the setting's"},
    ]
    config = DatasetConfig(dataset=write_jsonl(tmp_path / "c.jsonl", records), dataset_name="custom", output_len=9)
    requests = sample_requests(config, tiny_tokenizer).requests
    assert [r.output_len for r in requests] == [12, 5, 9, 9]
    assert requests[0].prompt == "What is a hash map?" and requests[0].messages is None
    assert requests[1].messages == tuple(records[1]["messages"])
    assert requests[1].prompt == "System: Be brief.\n\nUser: Hello\n\nAssistant:"
    assert requests[2].messages == ({"role": "user", "content": "a list prompt is messages"},)
    assert all(r.input_len == len(tiny_tokenizer.encode(r.prompt)) for r in requests)


@pytest.mark.parametrize(
    "record, why",
    [
        ({"text": "hi"}, "it has no 'prompt' string and no 'messages' list"),
        ({"prompt": ""}, "its 'prompt' is empty or not a string"),
        ({"prompt": "hi", "max_tokens": 0}, "its 'max_tokens' must be a whole number from 1 to 16,777,216, not 0"),
        (
            {"prompt": "hi", "output_len": 10**30},
            f"its 'output_len' must be a whole number from 1 to 16,777,216, not {10**30}",
        ),
        (
            {"prompt": "hi", "max_tokens": 2**31},
            f"its 'max_tokens' must be a whole number from 1 to 16,777,216, not {2**31}",
        ),
        ({"messages": [{"content": "no role"}]}, "its message 1 is not an object with a 'role'"),
        (["not", "an", "object"], "it is a JSON list, not an object"),
    ],
)
def test_a_bad_custom_record_is_refused_with_its_line(tmp_path, tiny_tokenizer, record, why):
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "fine"}, record])
    with pytest.raises(DatasetError, match=rf"c.jsonl, line 2: the record is refused because {why}"):
        sample_requests(DatasetConfig(dataset=path, dataset_name="custom"), tiny_tokenizer)


def test_a_json_array_names_the_line_its_bad_record_starts_on(tmp_path, tiny_tokenizer):
    path = tmp_path / "c.json"
    path.write_text('[\n  {"prompt": "one"},\n  {"prompt": "two"},\n\n  {"prompt":\n     7}\n]\n')
    with pytest.raises(DatasetError, match="c.json, line 5: "):
        sample_requests(DatasetConfig(dataset=str(path), dataset_name="custom"), tiny_tokenizer)


# ---- image -----------------------------------------------------------------------------------------------------


def test_image_lengths_are_the_random_rule_and_each_request_carries_its_images(tiny_tokenizer):
    from PIL import Image

    config = DatasetConfig(
        dataset_name="image",
        num_prompts=6,
        random_input_len=20,
        random_output_len=10,
        random_range_ratio=0.5,
        image_count=2,
        image_resolution="48x64",
        seed=3,
    )
    sample = sample_requests(config, tiny_tokenizer)
    np.random.seed(3)  # profile_restful_api.py's compute_random_lens from the seeded global generator
    inputs, outputs = np.random.randint(10, 21, size=6), np.random.randint(5, 11, size=6)
    assert [r.output_len for r in sample.requests] == outputs.tolist()
    vocabulary = sorted(tiny_tokenizer.get_vocab().values())
    assert sample.requests[0].prompt == tiny_tokenizer.decode(random.Random(3).choices(vocabulary, k=int(inputs[0])))
    pixels = np.random.rand(48, 64, 3)  # the images continue the same generator, after the lengths
    for request in sample.requests:
        assert len(request.images) == 2 and request.facts["images"] == 2
        header, data = request.images[0].split(",", 1)
        assert header == "data:image/jpeg;base64"
        assert Image.open(io.BytesIO(base64.b64decode(data))).size == (64, 48)  # 48x64 is height x width
        assert math.isnan(request.facts["vision_tokens"])  # a text-only model: no processor to count them
    first = np.asarray(Image.open(io.BytesIO(base64.b64decode(sample.requests[0].images[0].split(",", 1)[1]))))
    assert abs(first.astype(float).mean() - (pixels * 255).mean()) < 8  # the same noise, through JPEG
    assert "no image processor" in sample.notes[-1]


def test_blank_png_images(tiny_tokenizer):
    from PIL import Image

    config = DatasetConfig(
        dataset_name="image",
        num_prompts=1,
        random_input_len=4,
        random_output_len=4,
        image_content="blank",
        image_format="png",
        image_resolution="360p",
    )
    (request,) = sample_requests(config, tiny_tokenizer).requests
    picture = Image.open(io.BytesIO(base64.b64decode(request.images[0].split(",", 1)[1])))
    assert picture.size == (640, 360) and picture.getextrema() == ((255, 255),) * 3


# ---- the schedule ----------------------------------------------------------------------------------------------


def turns(*think: float, builds: bool = True) -> list[SampledRequest]:
    """One session of len(think) + 1 turns with these think times."""
    first = SampledRequest("User: a\n\nAssistant:", 4, 2, messages=({"role": "user", "content": "a"},), session=0)
    requests = [first]
    for turn, seconds in enumerate(think, 1):
        user = {"role": "user", "content": f"q{turn}"}
        requests.append(
            SampledRequest(
                "estimate",
                9,
                2,
                messages=(*requests[-1].messages, {"role": "assistant", "content": "dataset's"}, user),
                session=0,
                turn=turn,
                follows=turn - 1,
                think_s=seconds,
                builds_on_answer=builds,
            )
        )
    return requests


def test_a_turn_is_due_its_think_time_after_the_answer_and_repeats_it():
    schedule = SendSchedule(turns(0.5, 1.0))
    schedule.start(100.0)
    assert schedule.next_due(100.0) == 0 and schedule.wait_s(100.0) == 0
    assert schedule.take(0).prompt == "User: a\n\nAssistant:"
    assert schedule.next_due(1e9) is None and schedule.wait_s(100.0) == math.inf  # waiting for an answer
    assert schedule.wants_answer(0) and schedule.finish(0, 102.0, served=True, answer=" hello") == []
    assert schedule.next_due(102.4) is None and schedule.wait_s(102.0) == pytest.approx(0.5)
    assert schedule.next_due(102.5) == 1
    sent = schedule.take(1)
    assert sent.built and sent.prompt == "User: a\n\nAssistant:  hello\n\nUser: q1\n\nAssistant:"
    assert sent.messages[-2:] == ({"role": "assistant", "content": " hello"}, {"role": "user", "content": "q1"})
    schedule.finish(1, 103.0, served=True, answer=" again")
    assert schedule.take(2).prompt.endswith(
        "Assistant:  hello\n\nUser: q1\n\nAssistant:  again\n\nUser: q2\n\nAssistant:"
    )
    assert schedule.pending() == 0


def test_the_turns_after_a_failed_one_are_dropped_and_dataset_answers_are_kept():
    schedule = SendSchedule(turns(0.0, 0.0))
    schedule.start(0.0)
    schedule.take(0)
    assert schedule.finish(0, 1.0, served=False) == [1, 2] and schedule.pending() == 0
    kept = SendSchedule(turns(0.0, builds=False))
    kept.start(0.0)
    kept.take(0)
    assert not kept.wants_answer(0)
    kept.finish(0, 1.0, served=True)
    assert kept.take(1) == type(kept.take(1))("estimate", kept.requests[1].messages, False)


def test_a_trace_is_due_at_its_times_over_the_speedup_and_rates_give_the_starters_offsets():
    requests = [SampledRequest("a", 1, 1, send_at_s=s) for s in (0.0, 2.0, 1.0)]
    schedule = SendSchedule(requests, LoadConfig(load_pattern="trace", trace_speedup=2.0))
    schedule.start(10.0)
    assert [schedule.offset(i) for i in range(3)] == [0.0, 1.0, 0.5] and not schedule.plain
    order = []
    for now in (10.0, 10.5, 11.0):
        while (index := schedule.next_due(now)) is not None:
            order.append(schedule.take(index) and index)
    assert order == [0, 2, 1]
    assert SendSchedule(requests, LoadConfig()).plain  # another pattern: their times mean nothing
    rated = SendSchedule(turns(0.0) + [SampledRequest("b", 1, 1)], offsets=[0.0, 3.0])
    assert [rated.offset(i) for i in range(3)] == [0.0, None, 3.0]


# ---- the workload table and its figures ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_workload_table_keeps_each_datasets_facts_and_the_figures_draw_them(tmp_path, tiny_tokenizer):
    sessions = workload_table(multi_turn(tiny_tokenizer).requests)
    assert list(sessions.columns) == ["input_len", "req_output_len", "session", "turn", "shared_prefix_tokens"]
    figure = workload_charts.reuse_figure(sessions)
    assert figure.layout.title.text == "Turns: 4 sessions, up to 3 turns each"
    assert [trace.name for trace in figure.data] == ["repeated from earlier turns", "new in this turn"]
    prefixes = workload_table(shared_prefix(tiny_tokenizer).requests)
    assert workload_charts.reuse_figure(prefixes).layout.title.text.startswith("Prefix share: ")
    lengths = workload_charts.length_histograms(prefixes)
    assert [trace.name.split(" (")[0] for trace in lengths.data] == ["Input", "Output asked"]
    config = DatasetConfig(dataset=write_jsonl(tmp_path / "t.jsonl", TRACE), dataset_name="trace")
    traced = workload_table(sample_requests(config, tiny_tokenizer).requests)
    assert traced["send_at_s"].tolist() == [0.0, 0.5, 2.0, 3.0]
    assert sum(workload_charts.send_times_figure(traced).data[0].y) == 4
    plain = workload_table(
        sample_requests(DatasetConfig(dataset="builtin:sample", num_prompts=4), tiny_tokenizer).requests
    )
    assert workload_charts.reuse_figure(plain) is None and workload_charts.send_times_figure(plain) is None
    measured = with_workload_columns(plain[["input_len"]].assign(index=range(4)), multi_turn(tiny_tokenizer).requests)
    assert "turn" not in measured  # not the same requests: left as it is


# ---- what is sent ----------------------------------------------------------------------------------------------


def test_a_chat_request_sends_its_messages_and_its_images_before_the_text(tiny_tokenizer):
    from bench_core.engines.openai_request import ServerSpec, build_payload

    chat = ServerSpec("http://h:1", endpoint="chat")
    image = sample_requests(
        DatasetConfig(
            dataset_name="image",
            num_prompts=1,
            random_input_len=4,
            random_output_len=4,
            image_count=2,
            image_resolution="360p",
        ),
        tiny_tokenizer,
    ).requests[0]
    (message,) = build_payload(chat, "m", image.prompt, 4, False, images=image.images)["messages"]
    assert message["role"] == "user" and [part["type"] for part in message["content"]] == [
        "image_url",
        "image_url",
        "text",
    ]
    assert (
        message["content"][0]["image_url"]["url"] == image.images[0] and message["content"][2]["text"] == image.prompt
    )
    turn = multi_turn(tiny_tokenizer, multi_turn_answers="dataset").requests[1]
    assert build_payload(chat, "m", turn.prompt, 4, False, turn.messages)["messages"] == list(turn.messages)
    completions = build_payload(ServerSpec("http://h:1"), "m", turn.prompt, 4, False, turn.messages)
    assert completions["prompt"] == turn.prompt and "messages" not in completions  # the transcript


@pytest.mark.parametrize(
    "engine, refused",
    [
        (dict(backend="transformers"), "The transformers engine takes text only, so it cannot run the image dataset"),
        (
            dict(backend="openai", base_url="http://127.0.0.1:1", endpoint="completions"),
            "The image dataset sends its images in chat messages: use the chat endpoint",
        ),
    ],
)
def test_the_image_dataset_is_refused_where_no_image_can_go(engine, refused):
    from bench_core.config import EngineConfig, RunConfig
    from bench_core.engines import run_config_problems

    config = RunConfig(
        engine=EngineConfig(**engine),
        load=LoadConfig(load_pattern="request_rate" if engine["backend"] == "openai" else "batch"),
        dataset=DatasetConfig(dataset_name="image", random_input_len=8, random_output_len=8),
    )
    assert [problem[: len(refused)] for problem in run_config_problems(config)] == [refused]


def test_ttft_by_turn_boxes_each_turns_completed_requests():
    import pandas as pd

    table = pd.DataFrame(
        {
            "turn": [0, 1, 0, 1, 1],
            "ttft_s": [0.3, 0.05, 0.35, 0.04, np.nan],
            "status": ["success", "success", "success", "success", "failed"],
        }
    )
    (box,) = workload_charts.ttft_by_turn(table).data
    assert box.x.tolist() == [1, 2, 1, 2] and box.y.tolist() == pytest.approx([300, 50, 350, 40])
    assert workload_charts.ttft_by_turn(table.drop(columns="turn")) is None  # not a multi-turn run
    assert workload_charts.ttft_by_turn(table.assign(ttft_s=np.nan)) is None  # not streamed
