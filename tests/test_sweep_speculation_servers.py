"""`sweep restful --against-no-speculation` over max concurrency, a server started per run: the scripted server
(tests/load_server.py) with speculation drafts 4 tokens a step and accepts 0.8/0.6/0.4/0.2 of them by position (23
tokens after the first in 9 steps), a step costing 40 ms + 20 ms per request in flight per token verified; without,
the same server drafting nothing (23 steps of 40 + 20 n ms). By its own sleeps TPOT with over without is 0.91 at one
request in flight and 1.63 at 8. What a busy machine adds to each step (d ms) only helps speculation at 1 (it takes 9
steps to the other's 23) and hides its cost at 8 only beyond d = 210 ms a step, so the verdicts hold on a machine
however busy."""

from __future__ import annotations

import json
import re

import pytest
from sweep_cli import SERVER, bench, rows_of

from bench_core.measure.catalog import acceptance_by_position
from bench_core.measure.speculation_speedup import COSTS, PAYS
from bench_core.sweep.plan import SPECULATION

pytestmark = pytest.mark.slow

STEP = "--token-delay-ms 40 --step-ms-per-request 20"
RATES = (0.8, 0.6, 0.4, 0.2)
DRAFTING = f"--draft-tokens {len(RATES)} --acceptance {','.join(map(str, RATES))}"
PAIRED_RUN = (
    "sweep",
    "restful",
    "--backend",
    "vllm",
    "--tokenizer",
    "builtin:tiny-llama",
    *("--num-prompts", "8", "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "24"),
    *("--random-range-ratio", "1"),  # every answer 24 tokens: a short one would end on a step cut short
    *("--disable-warmup", "--output-file", "", "--results", "results"),
)


@pytest.fixture(scope="module")
def paired_sweep(tmp_path_factory):
    work = tmp_path_factory.mktemp("paired")
    proc = bench(
        work,
        *PAIRED_RUN,
        *("--server-cmd", f"{SERVER} {STEP} {DRAFTING}", "--baseline-server-cmd", f"{SERVER} {STEP}"),
        *("--against-no-speculation", "--sweep", "max_concurrency=1,8"),
    )
    return work, proc


def test_the_load_at_which_speculation_stops_paying_is_said_and_tabled(paired_sweep):
    _, proc = paired_sweep
    assert proc.returncode == 0, proc.stderr
    points = proc.stdout.split("Speculation against none")[0].splitlines()
    header = points[1]
    assert "Mean acceptance length (server)" in header and "Acceptance by draft position" in header, header
    speculating = [line for line in points[2:] if " on " in line]
    assert len(speculating) == 2 and all("not reported" not in line for line in speculating), points
    table = proc.stdout.split("Speculation against none, by load")[1].splitlines()
    rows = {line.split()[0]: line for line in table[2:4]}
    assert rows["1"].endswith(PAYS) and rows["8"].endswith(COSTS), table
    assert re.search(
        r"^Speculation paid up to max_concurrency=1 and stopped paying at max_concurrency=8\. TPOT with speculation "
        r"over without, on the same prompts \(95% paired interval\): max_concurrency=1 0\.\d+ \(.*\); "
        r"max_concurrency=8 1\.\d+ \(.*\), costs\.$",
        proc.stdout,
        re.MULTILINE,
    ), proc.stdout


def test_each_run_started_its_own_server_with_or_without_speculation_and_read_its_acceptance(paired_sweep):
    work, _ = paired_sweep
    runs = rows_of(work)
    assert sorted(zip(runs["max_concurrency"], runs["server_settings"])) == [
        (1, '{"speculation": "off"}'),
        (1, '{"speculation": "on"}'),
        (8, '{"speculation": "off"}'),
        (8, '{"speculation": "on"}'),
    ]
    for row in runs.to_dict("records"):
        rates = acceptance_by_position(row)
        if (
            json.loads(row["server_settings"])[SPECULATION] == "on"
        ):  # the server's counters; the rule's exact counts: test_load_server_speculation
            assert rates == pytest.approx(RATES, abs=0.1)
        else:
            assert rates is None
