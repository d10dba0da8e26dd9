"""The quality guard on real runs: drift from a baseline run on the embedded tiny model (greedy), and a quality set
scored from a real HTTP server's known answers."""

import json

import pandas as pd
import pytest
from aiohttp import web
from openai_server import add_openai_routes, serving, sse_chunk

from bench_core.cli import main
from bench_core.load.quality_set import BUILTIN_RECORDS
from bench_core.store.history import History

# Each test here runs a real engine or server for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

EMBEDDED = [
    "pipeline",
    "builtin:sample",
    "builtin:tiny-llama",
    "--backend",
    "transformers",
    "-n",
    "4",
    "-c",
    "2",
    "--seed",
    "3",
    "--temperature",
    "0",
    "--csv",
    "",
]


def _last_run(results) -> pd.Series:
    return History(results).load().iloc[-1]


def _mean_output_len(results, row: pd.Series) -> float:
    return float(History(results).requests(row["run_id"])["output_len"].mean())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, tiny_model_path):
    """A float32 run that kept its answers, and the history it is in."""
    results = tmp_path_factory.mktemp("drift") / "results"
    assert main([*EMBEDDED, "--dtype", "float32", "--keep-outputs", "--results", str(results)]) == 0
    row = _last_run(results)
    requests = History(results).requests(row["run_id"])
    assert requests["output_ids"].map(len).tolist() == requests["output_len"].tolist()
    return results, row["run_id"]


def test_a_repeat_of_the_baseline_has_no_drift(baseline, capsys):
    results, baseline_id = baseline
    argv = [*EMBEDDED, "--dtype", "float32", "--drift-baseline", baseline_id, "--results", str(results)]
    capsys.readouterr()
    assert main(argv) == 0
    (printed,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Exact-match rate")]
    assert printed.split()[-1] == "1.000"
    row = _last_run(results)
    assert row["drift_exact_match_rate"] == 1.0 and row["drift_token_overlap"] == 1.0
    assert row["drift_mean_divergence"] == _mean_output_len(results, row)  # no answer diverges before its end


def test_bfloat16_drifts_from_float32(baseline):
    """The tiny Llama's random weights make near ties common, which bfloat16's rounding breaks the other way."""
    results, baseline_id = baseline
    argv = [*EMBEDDED, "--dtype", "bfloat16", "--drift-baseline", baseline_id, "--results", str(results)]
    assert main(argv) == 0
    row = _last_run(results)
    assert row["drift_exact_match_rate"] < 1.0
    assert row["drift_mean_divergence"] < _mean_output_len(results, row)


def test_the_engine_api_hands_over_its_answers_for_drift(baseline, capsys):
    """The engine_api load pattern (the throughput command) keeps each answer from its outputs' ids, as LMDeploy's
    engine instances hand them over, so its drift is measured, not left empty."""
    results, baseline_id = baseline
    greedy_flags = EMBEDDED.index("--temperature")  # the throughput command samples, as profile_throughput.py
    same = EMBEDDED[1:greedy_flags] + EMBEDDED[greedy_flags + 2 :]
    throughput = ["throughput", *same, "--dtype", "float32", "--drift-baseline", baseline_id]
    assert main([*throughput, "--results", str(results)]) == 0
    assert "handed over no answer" not in capsys.readouterr().err
    row = _last_run(results)
    assert row["load_pattern"] == "engine_api"
    requests = History(results).requests(row["run_id"])
    assert requests["output_ids"].map(len).tolist() == requests["output_len"].tolist()
    assert 0.0 <= row["drift_token_overlap"] <= 1.0


def test_a_baseline_that_kept_no_answers_is_refused_with_one_line(baseline, capsys):
    results, _ = baseline
    assert main([*EMBEDDED, "--results", str(results)]) == 0
    plain = _last_run(results)["run_id"]
    capsys.readouterr()
    code = main([*EMBEDDED, "--drift-baseline", plain, "--results", str(results)])
    err = capsys.readouterr().err
    assert code == 2 and f"Run {plain} kept no answers to compare with" in err and "Traceback" not in err


def test_an_unknown_baseline_is_refused_with_one_line(baseline, capsys):
    results, _ = baseline
    code = main([*EMBEDDED, "--drift-baseline", "20990101-000000-none", "--results", str(results)])
    err = capsys.readouterr().err
    assert code == 2 and "run 20990101-000000-none is not in" in err and "Traceback" not in err


# The server's answer to each prompt of the built-in set: right for all but the three wrong ones.
WRONG = {0: "13", 6: "Lyon", 11: "No, it is not."}
ANSWERS = {
    record["prompt"]: WRONG.get(index, record["reference"] if record["scorer"] != "regex" else "Yes.")
    for index, record in enumerate(BUILTIN_RECORDS)
}


def _answering_app() -> web.Application:
    async def answer(request: web.Request, endpoint: str) -> web.StreamResponse:
        body = await request.json()
        words = ANSWERS[body["prompt"]].split(" ")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, word in enumerate(words):
            await response.write(sse_chunk(endpoint, text=word if i == 0 else " " + word))
        usage = {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": len(words) + 3}
        await response.write(sse_chunk(endpoint, finish_reason="stop", usage=usage))
        await response.write(b"data: [DONE]\n\n")
        return response

    return add_openai_routes(web.Application(), answer)


def test_the_builtin_quality_set_scores_a_servers_known_answers_exactly(tmp_path, capsys, tiny_model_path):
    with serving(_answering_app()) as url:
        argv = [
            "restful",
            "--backend",
            "transformers",
            "--base-url",
            url,
            "--model",
            "scripted",
            "--tokenizer",
            "builtin:tiny-llama",
            "--quality-set",
            "builtin:quality",
            "--disable-ignore-eos",
            "--disable-warmup",
            "--output-file",
            str(tmp_path / "out.csv"),
            "--results",
            str(tmp_path / "results"),
        ]
        assert main(argv) == 0
    assert "Quality-set accuracy (fraction)" in capsys.readouterr().out
    row = _last_run(tmp_path / "results")
    assert row["quality_accuracy"] == (len(BUILTIN_RECORDS) - len(WRONG)) / len(BUILTIN_RECORDS)
    requests = History(tmp_path / "results").requests(row["run_id"])
    assert requests["quality_correct"].tolist() == [float(i not in WRONG) for i in range(len(BUILTIN_RECORDS))]
    assert requests["output_text"].tolist() == list(ANSWERS.values())


def test_a_quality_set_file_with_a_bad_record_is_refused_before_the_run(tmp_path, capsys, tiny_model_path):
    bad = tmp_path / "set.jsonl"
    bad.write_text(json.dumps({"prompt": "2+2?", "reference": "4", "scorer": "fuzzy"}) + "\n")
    results = tmp_path / "results"
    code = main([*EMBEDDED, "--quality-set", str(bad), "--results", str(results)])
    err = capsys.readouterr().err
    assert code == 2 and "line 1" in err and "scorer 'fuzzy'" in err and "Traceback" not in err
    assert not list(results.glob("runs/*"))


def test_a_sweep_checks_each_point_against_the_baseline_in_its_results_folder(baseline):
    """The sweep's runs read the baseline from the history --results names, as a single run does."""
    results, baseline_id = baseline
    sweep = ["sweep", *EMBEDDED, "--dtype", "float32", "--sweep", "concurrency=1,2", "--drift-baseline", baseline_id]
    assert main([*sweep, "--results", str(results)]) == 0
    history = History(results).load()
    points = history[history["sweep_id"].astype(str).str.startswith("sweep-")].sort_values("concurrency")
    assert points["concurrency"].tolist() == [1, 2]
    assert points["drift_exact_match_rate"].between(0, 1).all()
    # Concurrency 2 is the baseline's own setting: the same answers. (Concurrency 1 may differ: no padding.)
    assert points["drift_exact_match_rate"].iloc[-1] == 1.0


def test_a_sweep_with_a_baseline_not_in_its_results_folder_is_refused_before_its_plan_is_saved(
    baseline, tmp_path, capsys
):
    _, baseline_id = baseline
    other = tmp_path / "other"
    sweep = ["sweep", *EMBEDDED, "--sweep", "concurrency=1,2", "--drift-baseline", baseline_id]
    code = main([*sweep, "--results", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and f"run {baseline_id} is not in {other}" in err and "Traceback" not in err
    assert not list(other.glob("sweeps/*")) and not list(other.glob("runs/*"))


def test_a_sweep_scores_each_point_on_the_quality_set(tmp_path):
    results = tmp_path / "results"
    sweep = ["sweep", *EMBEDDED, "--sweep", "concurrency=1,2", "--quality-set", "builtin:quality"]
    assert main([*sweep, "-n", "2", "--output-len", "4", "--results", str(results)]) == 0
    history = History(results).load()
    assert len(history) == 2 and history["quality_accuracy"].between(0, 1).all()
    for run_id in history["run_id"]:
        assert History(results).requests(run_id)["quality_correct"].notna().all()
