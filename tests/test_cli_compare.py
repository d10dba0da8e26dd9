"""`python -m bench_core compare`, run for real on runs recorded against a paced server on 127.0.0.1 whose every
token leaves a fixed delay after the one before (the server's script, not this machine's speed, sets the time): two
groups of repeats at the same pace compare as the same, a group at ten times the delay as a regression; the
markdown and JSON shapes; bad input refused in one line with exit code 2."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from aiohttp import web
from openai_server import serving

from bench_core.cli import main
from bench_core.store.history import History
from bench_core.views import regression

# Each test here records real runs against a server for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

TOKENS = 8
TOKEN_DELAY_S = 0.020  # the server's pace
# Made slower: each token ten times as late. Welch's t-test over 3 repeats stops being significant once one repeat
# strays by about 0.57 of the groups' difference: at 3 times (MAIN 170 ms, SLOW 500 ms mean E2E) one MAIN repeat held
# up 180 ms by a busy machine hides the regression; at 10 times it takes 810 ms (stats.compare on recorded values).
SLOW_FACTOR = 10
PROMPTS = 4
MAIN, SAME, SLOW = "main", "pr-same", "pr-slow"  # the labels of the three groups of repeats
REPEATS = 3


def _paced_app(pace: dict[str, float]) -> web.Application:
    """Every completion streams TOKENS one-token chunks, each pace["delay"] seconds after the one before (the first
    that long after the request arrived), then the usage and [DONE]."""

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.json()
        delay = pace["delay"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        for index in range(TOKENS):
            await asyncio.sleep(max(0.0, arrived + (index + 1) * delay - loop.time()))
            chunk = {"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": TOKENS + 5}
        last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
        await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`python -m bench_core ARGV` in this process: its exit code, stdout and stderr."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors leave so, as from `python -m bench_core`
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A history of three labelled groups of REPEATS runs each, of the same settings against one server: MAIN and SAME
    at its pace, SLOW once it was made slower; MAIN recorded first."""
    folder = tmp_path_factory.mktemp("compare")
    pace = {"delay": TOKEN_DELAY_S}
    with serving(_paced_app(pace)) as url:
        for label, delay in ((MAIN, TOKEN_DELAY_S), (SAME, TOKEN_DELAY_S), (SLOW, TOKEN_DELAY_S * SLOW_FACTOR)):
            pace["delay"] = delay
            for _ in range(REPEATS):
                argv = [
                    "restful",
                    "--backend",
                    "transformers",  # sends no ignore_eos, which this server would not read anyway
                    "--base-url",
                    url,
                    "--model",
                    "paced",
                    "--tokenizer",
                    "builtin:tiny-llama",
                    "--dataset-path",
                    "builtin:sample",
                    "--num-prompts",
                    str(PROMPTS),
                    "--sharegpt-output-len",
                    str(TOKENS),
                    "--disable-warmup",
                    "--output-file",
                    "",
                    "--label",
                    label,
                    "--results",
                    str(folder / "results"),
                ]
                assert main(argv) == 0
    return folder / "results"


def test_two_groups_of_repeats_at_the_same_pace_pass(results, capsys):
    code, out, err = _cli(
        capsys,
        "compare",
        MAIN,
        SAME,
        "--results",
        str(results),
        "--fail-on-regression",
        "mean_e2e_ms=50%",
        "mean_tpot_ms=50%",
        "output_throughput=50%",
    )
    assert code == 0, out + err
    assert "No regression in mean_e2e_ms (tolerance 50 %), mean_tpot_ms (tolerance 50 %)" in out
    assert "(baseline)" in out.splitlines()[0]  # the baseline's column first, as on the page
    # Two setups of REPEATS runs each, though every setting is the same: each group's runs are repeats of one.
    (setup_row,) = [line for line in out.splitlines() if line.startswith("Runs of its setup")]
    assert setup_row.split()[4:] == [str(REPEATS)] * 2 * REPEATS


def test_a_slower_server_is_a_regression_beyond_noise_and_tolerance(results, capsys):
    code, out, err = _cli(
        capsys,
        "compare",
        MAIN,
        SLOW,
        "--results",
        str(results),
        "--fail-on-regression",
        "mean_e2e_ms",
        "output_throughput=20%",
        "mean_tpot_ms=50%",
    )
    assert code == 1, out + err
    lines = [line.strip() for line in out.splitlines()]
    found = lines[lines.index("Regressions:") + 1 :]
    assert len(found) == 3, out
    # Lower is better for latency, higher for throughput: each got worse, by the catalog's direction.
    assert found[0].startswith(f"Mean end-to-end latency (ms): {SLOW} is worse by +")
    assert "beyond the run-to-run noise (Welch's t-test, p = " in found[0]
    assert found[1].startswith(f"Output throughput (tok/s): {SLOW} is worse by -")
    assert found[1].endswith("beyond the 20 % tolerance")
    assert found[2].startswith(f"Mean time per output token (ms): {SLOW} is worse by +")
    # Compared the other way round, the slow group is the baseline and the fast one no regression.
    code, out, _ = _cli(
        capsys,
        "compare",
        SLOW,
        MAIN,
        "--results",
        str(results),
        "--fail-on-regression",
        "mean_e2e_ms",
        "mean_tpot_ms=0%",
    )
    assert code == 0, out


def test_markdown_is_a_pull_request_comment(results, capsys):
    code, out, _ = _cli(
        capsys,
        "compare",
        MAIN,
        SLOW,
        "--results",
        str(results),
        "--format",
        "markdown",
        "--metrics",
        "mean_e2e_ms,output_throughput",
        "--fail-on-regression",
        "mean_e2e_ms",
    )
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("| run | ") and "(baseline)" in lines[0]
    assert lines[1].startswith("| --- |")
    assert len(lines[0].split(" | ")) == 2 * REPEATS + 1  # the row titles, then every run of both groups
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in lines[2:] if line.startswith("| ")}
    assert set(rows) == {"Runs of its setup", "Mean end-to-end latency (ms)", "Output throughput (tok/s)"}
    assert rows["Mean end-to-end latency (ms)"].count(" *") == REPEATS  # the slow runs' changes, beyond noise
    assert "**Regressions**" in lines
    assert any(line.startswith(f"- Mean end-to-end latency (ms): {SLOW} is worse by +") for line in lines)


def test_json_holds_each_runs_value_change_and_verdict(results, capsys):
    code, out, _ = _cli(
        capsys,
        "compare",
        SLOW,
        "--baseline",
        MAIN,
        "--results",
        str(results),
        "--format",
        "json",
        "--metrics",
        "mean_e2e_ms",
        "--fail-on-regression",
        "mean_e2e_ms=10%",
    )
    assert code == 1
    document = json.loads(out)
    runs = document["runs"]
    assert [run["chosen_by"] for run in runs] == [MAIN] * REPEATS + [SLOW] * REPEATS  # the baseline's added first
    assert document["baseline"] == runs[0]["run_id"]
    assert [run["setup"] for run in runs] == [0] * REPEATS + [1] * REPEATS
    (metric,) = document["metrics"]
    assert metric["metric"] == "mean_e2e_ms" and metric["larger_is_better"] is False
    cells = metric["runs"]
    assert cells[0]["change_percent"] is None and cells[0]["verdict"] is None
    assert [cell["verdict"] for cell in cells[REPEATS:]] == ["worse"] * REPEATS
    assert all(cell["change_percent"] > 50 for cell in cells[REPEATS:])  # ten times each token's delay
    (regression,) = document["regressions"]
    assert regression["reason"] == "tolerance" and regression["tolerance_percent"] == 10
    assert regression["run_ids"] == [run["run_id"] for run in runs[REPEATS:]]
    assert regression["mean"] > regression["baseline_mean"]
    assert document["passed"] is False


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ((MAIN, "no-such-run"), "has no run, sweep or label no-such-run"),
        ((MAIN, SLOW, "--metrics", "ttft_p99"), "'ttft_p99' is not a metric"),
        ((MAIN, SLOW, "--fail-on-regression", "mean_e2e_ms=fast"), "the tolerance is a relative change in %"),
        ((MAIN, SLOW, "--fail-on-regression", "mean_e2e_ms=-5%"), "the tolerance is a relative change in %"),
        ((MAIN, SLOW, "--fail-on-regression", "p99_ttft_ms=5%%"), "the tolerance is a relative change in %"),
        ((MAIN, SLOW, "--fail-on-regression", "spec_acceptance_rate"), "nothing to gate on"),  # none measured it
    ],
)
def test_bad_input_is_one_line_and_exit_2(results, capsys, argv, said):
    code, out, err = _cli(capsys, "compare", *argv, "--results", str(results))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and said in err, err


def test_a_missing_history_or_a_single_run_is_refused(results, tmp_path, capsys):
    code, _, err = _cli(capsys, "compare", MAIN, SLOW, "--results", str(tmp_path / "nowhere"))
    assert code == 2 and "there is no history in" in err
    code, out, _ = _cli(capsys, "compare", MAIN, "--results", str(results), "--format", "json")
    one_run = json.loads(out)["runs"][0]["run_id"]
    code, _, err = _cli(capsys, "compare", one_run, "--results", str(results))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "compare needs two runs or more" in err


def test_the_comparison_exports_its_report_and_history_rows_against_its_baseline(
    results, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ("compare", SAME, MAIN, "--baseline", MAIN, "--results", str(results))
    code, out, err = _cli(capsys, *argv, "--export", "report:compared.html", "--export", "history-rows")
    assert code == 0, out + err
    history = History(results)
    rows, _, _ = regression.named_runs(history.load(), [MAIN, SAME])
    run_ids = sorted(rows["run_id"].astype(str))
    (written,) = tmp_path.glob("compare-*-history.csv")
    assert sorted(row["run_id"] for row in csv.DictReader(written.open())) == run_ids
    assert written.read_bytes() == history.to_csv_bytes(run_ids)
    document = (tmp_path / "compared.html").read_text(encoding="utf-8")
    heading = document[document.index("<h1>") : document.index("</h1>")]
    assert all(run_id in heading for run_id in run_ids)
    # The run of main that started first (two runs started in one second have ids in no order of their start).
    of_main = rows[rows["label"] == MAIN]
    oldest_of_main = str(of_main["run_id"].loc[pd.to_datetime(of_main["started_at"], utc=True).idxmin()])
    assert "(baseline)" in out.splitlines()[0] and f"{MAIN} · {oldest_of_main} (baseline)" in document
    assert [line.split(" (")[0] for line in err.splitlines()] == [
        "report: compared.html",
        f"history-rows: {written.name}",
    ]


def test_an_export_a_comparison_cannot_have_is_refused_before_the_history_is_read(tmp_path, capsys):
    code, _, err = _cli(capsys, "compare", "a", "b", "--results", str(tmp_path / "none"), "--export", "requests")
    assert code == 2
    assert err == "error: --export requests: it is of run; this command ends with comparison.\n"
