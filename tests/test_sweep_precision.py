"""Repeats until the answer is clear (`sweep ... --target-moe P --max-repeats N`): against a scripted server whose
answers are steady at one point and alternate wildly at the other, the steady point stops at the fewest runs that give
an interval and the noisy one runs up to the cap, and the output says which; a sweep stopped half way and resumed ends
the same way. Repeat counts only: the server's delays, not this machine's speed, make one point steady and the other
not."""

from __future__ import annotations

import asyncio
import html
import json
import threading

import pytest
from aiohttp import web
from openai_server import serving
from sweep_cli import SMALL_RUN, bench, rows_of

from bench_core.cli.common import EXIT_BAD_INPUT, EXIT_OK
from bench_core.config import RunConfig
from bench_core.measure.stats import MIN_INTERVAL_RUNS
from bench_core.run.runner import Runner
from bench_core.store.history import History
from bench_core.sweep.driver import resume_sweep, start_sweep
from bench_core.sweep.plan import plan_for
from bench_core.sweep.precision import CAPPED, REACHED, Precision
from bench_core.sweep.report import PRECISION_TABLE_TITLE
from bench_core.sweep.store import SWEEP_REPEAT, past_sweeps, point_repeats

# Each test here runs real runs against a real server for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

STEADY_TOKENS, NOISY_TOKENS = 4, 5  # the output length of each point: how the server tells them apart
# Every steady answer's first token after 1 s: what the machine adds to a run (a few ms) is a small part of it, so three
# runs' output throughput lies well within +/-20%. The noisy point's runs take turns: 50 ms, then 1 s, so its runs'
# throughputs differ some 10-fold and no number of runs brings their interval within 20%.
STEADY_FIRST_TOKEN_S, FAST_FIRST_TOKEN_S, SLOW_FIRST_TOKEN_S = 1.0, 0.05, 1.0
TARGET, CAP = "0.2", 5
SWEEP_TIMEOUT_S = 300


class Hold:
    """Holds the server's answer to one noisy request (counted from 1) until `released`, saying when it `arrived`: a
    test stops the sweep while that run is under way, whatever this machine's pace."""

    def __init__(self, noisy_request: int):
        self.noisy_request = noisy_request
        self.arrived, self.released = threading.Event(), threading.Event()


def steady_and_noisy_app(hold: Hold | None = None) -> web.Application:
    """An OpenAI completions server (one request per run): a request for STEADY_TOKENS always gets its first token
    after STEADY_FIRST_TOKEN_S; requests for NOISY_TOKENS alternate between the fast and the slow first token. The
    noisy request `hold` names waits for the test."""
    noisy_requests = [0]

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "precision-test", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = int(body.get("max_tokens") or 1)
        if tokens == NOISY_TOKENS:
            noisy_requests[0] += 1
            first_token_s = FAST_FIRST_TOKEN_S if noisy_requests[0] % 2 else SLOW_FIRST_TOKEN_S
            if hold is not None and noisy_requests[0] == hold.noisy_request:
                hold.arrived.set()
                while not hold.released.is_set():
                    await asyncio.sleep(0.05)
        else:
            first_token_s = STEADY_FIRST_TOKEN_S
        await asyncio.sleep(first_token_s)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(tokens):
            chunk = {"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        last = {
            "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8},
        }
        await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.fixture
def server_url():
    with serving(steady_and_noisy_app()) as url:
        yield url


def sweep_args(url: str, *extra: str) -> list[str]:
    """One prompt a run (a run is one of the server's answers), asking for exactly its point's output length (the
    server tells the points apart by it), the two points, and `extra`."""
    args = list(SMALL_RUN)
    args[args.index("--num-prompts") + 1] = "1"
    return [
        *args,
        "--base-url",
        url,
        "--model",
        "precision-test",
        "--random-range-ratio",
        "1",
        "--sweep",
        f"random_output_len={STEADY_TOKENS},{NOISY_TOKENS}",
        *extra,
    ]


def runs_per_point(rows) -> dict[int, int]:
    return rows.groupby("random_output_len").size().astype(int).to_dict()


def test_a_steady_point_stops_at_three_runs_and_a_noisy_one_runs_up_to_the_cap(server_url, tmp_path):
    done = bench(
        tmp_path, *sweep_args(server_url, "--target-moe", TARGET, "--max-repeats", str(CAP), "--report", "report.html")
    )

    assert done.returncode == EXIT_OK, done.stderr
    rows = rows_of(tmp_path)
    assert set(rows["status"]) == {"finished"}
    assert runs_per_point(rows) == {STEADY_TOKENS: MIN_INTERVAL_RUNS, NOISY_TOKENS: CAP}
    noisy = rows[rows["random_output_len"] == NOISY_TOKENS]
    assert sorted(noisy[SWEEP_REPEAT].astype(int)) == list(range(CAP))
    assert f"random_output_len={NOISY_TOKENS} · repeat {CAP} (at most {CAP})" in set(noisy["label"])
    assert "at most 10 runs" in done.stderr and "finished, 8/8 runs finished" in done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("Target ±20% (95% interval) on Output throughput (tok/s), 3 to 5 runs a point. ")
    assert f"{REACHED.capitalize()} at 1 point: random_output_len={STEADY_TOKENS} (3 runs, ±" in summary
    assert f"{CAPPED.capitalize()} at 1 point: random_output_len={NOISY_TOKENS} ({CAP} runs, ±" in summary
    report = html.unescape((tmp_path / "report.html").read_text())
    assert PRECISION_TABLE_TITLE in report
    assert f"{REACHED.capitalize()} at 1 point: random_output_len={STEADY_TOKENS} (3 runs" in report
    assert "repeated until ±20% (95% interval) on Output throughput (tok/s), 3 to 5 runs a point" in report


# The noisy point's 2nd run is in the three planned rounds; its 4th, in the rounds the target adds.
@pytest.mark.parametrize("stopped_at", [2, 4], ids=["in-the-planned-rounds", "in-the-added-rounds"])
def test_a_sweep_stopped_half_way_resumes_to_the_same_end(tmp_path, stopped_at):
    history = History(tmp_path / "results")
    hold = Hold(stopped_at)
    runner = Runner(history)
    with serving(steady_and_noisy_app(hold)) as url:
        plan = plan_for(
            server_base(url),
            [f"random_output_len={STEADY_TOKENS},{NOISY_TOKENS}"],
            precision=Precision(float(TARGET), max_repeats=CAP),
        )
        try:
            sweep = start_sweep(runner, plan)
            assert hold.arrived.wait(SWEEP_TIMEOUT_S)
            sweep.cancel()
            hold.released.set()
            assert sweep.wait(SWEEP_TIMEOUT_S)
            assert sweep.progress().state == "cancelled"
            # The noisy point's runs so far (the last cancelled) and the steady point's, a round ahead until its third.
            assert len(history.load()) == stopped_at + min(stopped_at, MIN_INTERVAL_RUNS)
            resumed = resume_sweep(runner, plan.sweep_id)
            assert resumed.wait(SWEEP_TIMEOUT_S)
            assert resumed.progress().state == "finished", resumed.progress().message
        finally:
            runner.shutdown()
    finished = history.load()
    finished = finished[finished["status"] == "finished"]
    assert runs_per_point(finished) == {STEADY_TOKENS: MIN_INTERVAL_RUNS, NOISY_TOKENS: CAP}
    for tokens, count in ((STEADY_TOKENS, MIN_INTERVAL_RUNS), (NOISY_TOKENS, CAP)):
        repeats = finished[finished["random_output_len"] == tokens][SWEEP_REPEAT].astype(int)
        assert sorted(repeats) == list(range(count))  # each repeat once: a resume runs none twice
    assert [point.standing.outcome for point in point_repeats(plan, history.load())] == [REACHED, CAPPED]
    overview = past_sweeps(history, history.load()).iloc[0]
    assert (overview["finished"], overview["runs"]) == (MIN_INTERVAL_RUNS + CAP, MIN_INTERVAL_RUNS + CAP)


def server_base(url: str) -> RunConfig:
    """What `sweep_args` runs, as a config: one prompt of 8 random tokens a run against the server at `url`."""
    config = RunConfig(label="precision")
    config.engine.backend, config.engine.base_url = "openai", url
    config.engine.model, config.engine.tokenizer = "precision-test", "builtin:tiny-llama"
    config.engine.server_metrics = False
    config.dataset.dataset_name, config.dataset.num_prompts = "random", 1
    config.dataset.random_input_len, config.dataset.random_output_len = 8, STEADY_TOKENS
    config.dataset.random_range_ratio = 1.0  # every request asks for the point's length: the server tells them apart
    config.load.stream_output, config.load.warmup_requests = True, 0
    return config


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--max-repeats", "4"), "--max-repeats applies only with --target-moe P."),
        (("--target-moe", "0.1", "--max-repeats", "2"), "--max-repeats must be at least 3 with --target-moe"),
        (("--target-moe", "0.1", "--repeats", "6", "--max-repeats", "5"), "--repeats 6 is more than --max-repeats 5"),
        (("--target-moe", "0"), "--target-moe must be a number above 0 and at most 1; got 0."),
    ],
)
def test_a_target_that_cannot_work_is_one_line_and_runs_nothing(server_url, tmp_path, extra, said):
    done = bench(tmp_path, *sweep_args(server_url, *extra))
    assert done.returncode == EXIT_BAD_INPUT
    assert said in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "results" / "sweeps").exists()
