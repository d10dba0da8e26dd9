"""SGLang's native /generate API (`restful --backend sglang` / `sglang-native`): its body, its answers read as SGLang
writes them (whole text so far or new text only, streamed or not, errors, a server without the route), and each
request's speculative accounting from its meta_info, which lands in the embedded engine's per-request columns and so
in the same run metrics as every other source of per-position acceptance (vLLM's per-position counters in /metrics:
tests/test_server_metrics.py)."""

import json

import numpy as np
import pandas as pd
import pytest
from metrics_server import (
    SPEC_ACCEPTED_BY_POSITION,
    SPEC_DRAFTS_PER_REQUEST,
    metrics_server,  # noqa: F401 (fixture)
)
from restful_cli import restful
from sglang_server import (
    BODIES,
    ERROR_MESSAGE,
    FIRST_STEP_S,
    HISTOGRAMS,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    sglang_server,  # noqa: F401 (fixture)
)

from bench_core.cli import main
from bench_core.engines.engine_api import ENGINE_POSITION_COLUMN, SPEC_COLUMNS
from bench_core.engines.openai_request import ServerSpec, build_payload, speculation_columns
from bench_core.engines.openai_stream import NativeReader, SSEMessage
from bench_core.errors import ConfigError
from bench_core.measure.catalog import METRICS, RunFacts, acceptance_by_position, position_metric
from bench_core.models.resolve import load_tokenizer
from bench_core.views.acceptance_charts import acceptance_by_position_figure, describe_acceptance_by_position

# The scripted server's two histograms, worked by hand (k = 4 draft tokens per step):
# (2, 1, 3, 2): 8 steps; accepted 1*1 + 2*3 + 3*2 = 13; position 1 in 1+3+2 = 6 steps, 2 in 3+2 = 5, 3 in 2, 4 in 0.
# (1, 0, 2, 1, 2): 6 steps; accepted 2*2 + 3*1 + 4*2 = 15; positions: 0+2+1+2 = 5, 2+1+2 = 5, 1+2 = 3, 2.
BY_HAND = {  # histogram: (drafts, draft tokens, accepted tokens, accepted per position)
    HISTOGRAMS[0]: (8, 32, 13, [6, 5, 2, 0]),
    HISTOGRAMS[1]: (6, 24, 15, [5, 5, 3, 2]),
}
# Four requests, two of each: 28 drafts, 56 of 112 draft tokens accepted, positions 22, 20, 10, 4 of 28.
RUN_BY_POSITION = [22 / 28, 20 / 28, 10 / 28, 4 / 28]
RUN_ACCEPTANCE_LENGTH = 1 + 56 / 28
RUN_ACCEPTANCE_RATE = 56 / 112


def native_run(url, tmp_path, capsys, *flags, backend="sglang", warmup=False):
    BODIES.clear()
    return restful(
        url, tmp_path, capsys, "--backend", backend, *flags, prompts=4, output_len=OUTPUT_TOKENS, warmup=warmup
    )


@pytest.mark.parametrize(
    "route, flags, backend",
    [
        ("", (), "sglang"),  # SGLang's default: each event holds the whole text so far
        ("/incremental", (), "sglang-native"),  # --incremental-streaming-output: the new text only
        ("", ("--disable-stream",), "sglang"),
    ],
    ids=["whole-text-events", "incremental-events", "not-streamed"],
)
def test_sglang_native_run_gives_each_requests_acceptance_by_position_from_its_histogram(
    sglang_server, tmp_path, capsys, route, flags, backend
):
    run = native_run(sglang_server + route, tmp_path, capsys, *flags, backend=backend)
    assert run.code == 0, run.lines
    streamed = not flags
    (body, *_) = BODIES
    assert body == {
        "text": body["text"],
        "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "temperature": 0.0, "ignore_eos": True},
        "stream": streamed,
    }
    table, summary = run.table, run.summary
    assert (table["usage_output_len"] == OUTPUT_TOKENS).all() and (table["output_len"] == OUTPUT_TOKENS).all()
    assert (table["usage_input_len"] == PROMPT_TOKENS).all()
    # The text, whichever way it came, is each answer once: 21 " tok"s, as our tokenizer counts them.
    tokenizer = load_tokenizer("builtin:tiny-llama")
    answer_tokens = len(tokenizer.encode(" tok" * OUTPUT_TOKENS, add_special_tokens=False))
    assert (table["retokenized_output_len"] == answer_tokens).all()
    if streamed:  # the server's first step leaves FIRST_STEP_S after the request arrived
        assert (table["ttft_s"] >= FIRST_STEP_S).all()
    # Per request: the engine's columns, as worked by hand from the histogram it was sent.
    rows = {
        (
            row.spec_drafts,
            row.spec_draft_tokens,
            row.spec_accepted_tokens,
            tuple(json.loads(row.spec_accepted_by_position)),
        )
        for row in table.itertuples()
    }
    assert rows == {(d, t, a, tuple(p)) for d, t, a, p in BY_HAND.values()}
    # Per run: the catalog's metrics from those columns.
    assert json.loads(summary["engine_acceptance_by_position"]) == pytest.approx(RUN_BY_POSITION, abs=1e-4)
    assert summary["spec_acceptance_length"] == pytest.approx(RUN_ACCEPTANCE_LENGTH)
    assert summary["spec_acceptance_rate"] == pytest.approx(RUN_ACCEPTANCE_RATE)
    assert summary["mean_request_acceptance_rate"] == pytest.approx((13 / 32 + 15 / 24) / 2)
    assert "Acceptance by draft position: 1: 0.786, 2: 0.714, 3: 0.357, 4: 0.143\n" in run.out
    assert (
        "Speculative decoding (the server's count per request): mean acceptance length 3 tokens; "
        "draft acceptance rate 0.5 fraction." in run.out
    )


def test_an_error_event_fails_its_request_with_sglangs_message(sglang_server, tmp_path, capsys):
    run = native_run(sglang_server + "/error", tmp_path, capsys)
    assert "Traceback" not in run.lines
    assert run.table is not None and (run.table["status"] != "success").all()
    assert f"the server reported an error: {ERROR_MESSAGE}" in run.lines


def test_a_server_without_generate_is_one_line_saying_so(sglang_server, tmp_path, capsys):
    url = sglang_server + "/no-generate"
    flags = ["--tokenizer", "builtin:tiny-llama", "--dataset-path", "builtin:sample", "--num-prompts", "2"]
    flags += ["--output-file", "", "--results", str(tmp_path / "results")]
    assert main(["restful", "--backend", "sglang", "--base-url", url, *flags]) == 2  # the warm-up finds no route
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "HTTP 404" in line and f"{url}/generate" in line
    assert "only SGLang serves /generate" in line and "Traceback" not in captured.out + captured.err


def test_vllms_per_position_counters_and_sglangs_histograms_land_in_the_same_metrics(
    metrics_server, sglang_server, tmp_path, capsys
):
    """One run per source: vLLM's per-position counters in /metrics, SGLang's per-request histograms on /generate.
    Each gives the catalog's acceptance by position (what the Run page's chart, the report, compare and sweeps read),
    the same line and the same chart, each with its own numbers."""
    vllm = restful(f"{metrics_server}/vllm", tmp_path / "vllm", capsys, "--backend", "vllm", "--model", "tiny",
                   "--server-metrics-interval", "0.2", prompts=4, output_len=4)  # fmt: skip
    sglang = native_run(sglang_server, tmp_path / "sglang", capsys)
    assert vllm.code == 0 and sglang.code == 0, vllm.lines + sglang.lines
    by_counters = [count / SPEC_DRAFTS_PER_REQUEST for count in SPEC_ACCEPTED_BY_POSITION]
    for run, expected, origin in ((vllm, by_counters, " (server)"), (sglang, RUN_BY_POSITION, "")):
        summary = run.summary.to_dict()
        assert acceptance_by_position(summary) == pytest.approx(expected, abs=1e-4)
        assert position_metric(summary).label == f"Acceptance by draft position{origin}"
        assert describe_acceptance_by_position(summary).startswith(f"Acceptance by draft position{origin}: 1: ")
        (bars,) = acceptance_by_position_figure(summary).data
        assert list(bars.y) == pytest.approx([rate * 100 for rate in expected], abs=1e-2)
        assert 0 < summary["spec_acceptance_rate" if run is sglang else "server_spec_acceptance_rate"] <= 1


# ---- the parts, without a server ----


def native_spec(**fields) -> ServerSpec:
    return ServerSpec("http://127.0.0.1:30000", endpoint="generate", server_kind="sglang", **fields)


def test_the_native_body_nests_the_sampling_and_takes_the_extra_body_last():
    sampling = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    spec = native_spec(stream=False, sampling=sampling, extra_body={"stream": True, "rid": "x"})
    assert build_payload(spec, "model", "hello", 16, ignore_eos=False) == {
        "text": "hello",
        "sampling_params": {"max_new_tokens": 16, **sampling, "ignore_eos": False},
        "stream": True,
        "rid": "x",
    }
    assert spec.url == "http://127.0.0.1:30000/generate"


def test_the_native_endpoint_is_sglangs_alone():
    with pytest.raises(ConfigError, match="SGLang's native /generate API: set the server kind to sglang"):
        ServerSpec("http://127.0.0.1:30000", endpoint="generate", server_kind="vllm")


def read_all(*bodies: dict) -> NativeReader:
    reader = NativeReader()
    for body in bodies:
        reader.read_message(SSEMessage(json.dumps(body).encode()))
    reader.read_message(SSEMessage(b"[DONE]"))
    return reader


def event(text: str, ids: list[int], finish: dict | None = None, **meta) -> dict:
    return {"text": text, "output_ids": ids, "meta_info": {"completion_tokens": len(meta.pop("all", ids)),
            "prompt_tokens": 3, "finish_reason": finish, **meta}}  # fmt: skip


def test_whole_text_events_and_new_text_events_read_as_the_same_answer():
    finish = {"type": "length", "length": 3}
    whole = read_all(event("a", [1]), event("ab", [1, 2]), event("abc", [1, 2, 3], finish))
    new = read_all(event("a", [1]), event("b", [2], all=[1, 2]), event("c", [3], finish, all=[1, 2, 3]))
    for reader in (whole, new):
        assert "".join(reader.text_parts) == "abc" and reader.n_tokens == 3
        assert reader.usage_completion_tokens == 3 and reader.usage_prompt_tokens == 3
        assert reader.finish() == ("length", "")


def test_an_abort_fails_the_request_with_the_servers_message():
    reader = read_all(event("a", [1], {"type": "abort", "message": "Request aborted by the scheduler"}))
    assert reader.finish() == ("error", "the server aborted the request: Request aborted by the scheduler")


@pytest.mark.parametrize(
    "meta, said",
    [
        ({"finish_reason": "length"}, "meta_info.finish_reason this client cannot read"),
        ({"completion_tokens": -1}, "meta_info.completion_tokens this client cannot count"),
        ({"spec_accept_histogram": "1,2"}, "meta_info.spec_accept_histogram that is not a list"),
    ],
)
def test_a_meta_info_this_client_cannot_read_fails_the_request_naming_the_field(meta, said):
    body = event("a", [1], {"type": "length"})
    body["meta_info"].update(meta)
    reason, message = read_all(body).finish()
    assert reason == "error" and said in message


def test_without_the_draft_length_the_histogram_gives_the_positions_it_reaches():
    """SGLang grows the histogram only as far as the most a step accepted: without the proposed count, k is read as
    len(H) - 1, and a run's shorter lists accepted nothing past their end."""
    columns = speculation_columns({"histogram": [2, 1, 3, 2]})
    assert dict(zip(SPEC_COLUMNS, (8, 24, 13))) | {ENGINE_POSITION_COLUMN: "[6, 5, 2]"} == columns
    with_length = speculation_columns({"histogram": [2, 1, 3, 2], "steps": 8, "proposed": 32})
    assert json.loads(with_length[ENGINE_POSITION_COLUMN]) == [6, 5, 2, 0] and with_length["spec_draft_tokens"] == 32


def test_an_sglang_without_the_histogram_gives_length_and_rate_but_no_positions():
    """Older SGLang: spec_accept_token_num and spec_draft_token_num, no histogram."""
    reader = read_all(
        event("abc", [1, 2, 3], {"type": "stop"}, spec_verify_ct=2, spec_draft_token_num=6, spec_accept_token_num=1)
    )
    assert speculation_columns(reader.speculation) == dict(zip(SPEC_COLUMNS, (2, 6, 1)))
    assert speculation_columns({}) == {} and speculation_columns({"histogram": [0]}) == {}


def test_the_runs_acceptance_by_position_pads_shorter_lists():
    table = pd.DataFrame(
        {
            "spec_drafts": [8.0, 6.0],
            "spec_draft_tokens": [24.0, 24.0],
            "spec_accepted_tokens": [13.0, 15.0],
            ENGINE_POSITION_COLUMN: ["[6, 5, 2]", "[5, 5, 3, 2]"],
        }
    )
    ok = np.ones(len(table), dtype=bool)
    facts = RunFacts(table, np.array(["success"] * len(table)), ok, 1.0, "", None)
    rates = METRICS["engine_acceptance_by_position"].aggregate(facts)
    assert json.loads(rates) == pytest.approx(np.array([11, 10, 5, 2]) / 14, abs=1e-4)
