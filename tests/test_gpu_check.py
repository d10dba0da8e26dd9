"""The GPU check (scripts/gpu_check.py, scripts/gpu-check.sh), checked here without a GPU: the dry run's steps and
their time limits, the carry's manifest against a carry folder made here, the run loop with real processes (one that
fails, one that hangs with a child ignoring SIGTERM, one skipped), the report read from a row LMDeploy's own Profiler
wrote, and the tasks that run on the GPU machine done here on the CPU (a model drawn, an Eagle draft, a run through
the worker process, LMDeploy's CSV imported into the history)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lmdeploy_reference import load_lmdeploy_profiler, why_missing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402
import gpu_check_tasks  # noqa: E402
from gpu_check import CARRY_PARTS, Command, Outcome, Paths, Step  # noqa: E402

WHEN = datetime.datetime(2026, 12, 5, 1, 2, tzinfo=datetime.UTC)


def _plan(tmp_path) -> tuple[Step, ...]:
    return gpu_check.plan(Paths(tmp_path / "work", tmp_path / "carry", "python3"))


def _commands(steps):
    return [(step.name, command) for step in steps for command in step.commands]


def by_name(steps) -> dict[str, Step]:
    return {step.name: step for step in steps}


def test_the_dry_run_lists_every_step_and_command_with_its_limit_the_sum_and_the_checks_deadline():
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    steps = gpu_check.plan(Paths(gpu_check.DEFAULT_WORK))
    lines = proc.stdout.splitlines()
    step_lines = [line.split()[:3] for line in lines if line[:3].strip().rstrip(".").isdigit()]
    assert step_lines == [[f"{n}.", step.name, str(step.budget_s)] for n, step in enumerate(steps, start=1)]
    for step in steps:
        for command in step.commands:
            assert f"{command.budget_s:>4} s  {command.label}: {' '.join(command.argv)}" in proc.stdout
    total = sum(command.budget_s for _, command in _commands(steps))
    assert f"Sum: {total} s ({total // 60} min {total % 60} s)" in lines[-2]
    assert f"the check ends within {gpu_check.TOTAL_BUDGET_S} s" in lines[-2] and "(history always runs)" in lines[-2]
    assert gpu_check.TOTAL_BUDGET_S == 570 < gpu_check.DEVICE_CALL_LIMIT_S == 600  # the report is written in time
    # At worst (every command using its whole limit) the deadline skips the last optional step only.
    assert total - by_name(steps)["spec-by-load"].budget_s <= gpu_check.TOTAL_BUDGET_S < total
    assert lines[-1].startswith("Carry .gpu: ")  # built or not, the dry run says so


def test_the_plan_runs_what_the_issue_asks_in_its_order(tmp_path):
    steps = _plan(tmp_path)
    assert [step.name for step in steps] == [
        "install",
        "models",
        "doctor",
        "warm-up",
        "pipeline",
        "throughput",
        "prefix",
        "speculative",
        "8b",
        "spec-by-load",
        "history",
    ]
    assert [step.name for step in steps if step.always_runs] == ["history"]
    steps_by_name = by_name(steps)
    for name, script in (("pipeline", "profile_pipeline_api.py"), ("throughput", "profile_throughput.py")):
        commands = steps_by_name[name].commands
        assert [c.side for c in commands] == ["ours", "lmdeploy"] * 2  # alternating, two pairs
        assert all(c.argv[2:4] == ("worker-run", name) for c in commands[::2])  # ours: the worker process
        assert all(Path(c.argv[1]).name == script for c in commands[1::2])
        flags = {c.argv[c.argv.index("--backend") :][:2] + tuple(c.argv[c.argv.index("-n") :][:4]) for c in commands}
        assert flags == {("--backend", "pytorch", "-n", "200", "-c", "64")}  # the same requests and engine
        datasets = {c.argv[4] if c.side == "ours" else c.argv[2] for c in commands}
        assert datasets == {str(tmp_path / "carry" / "data" / "sharegpt.json")}
        assert all("--cancel-rate" in c.argv for c in commands) == (name == "throughput")
        assert all("--stream-output" in c.argv for c in commands) == (name == "pipeline")  # throughput: streams
    off, on = steps_by_name["prefix"].commands
    assert set(on.argv) - set(off.argv) == {"--enable-prefix-caching", "gpu-check prefix caching on"}  # and its label
    assert "--warmup-requests" not in off.argv + on.argv  # cold: no warm-up, a fresh engine each
    (speculative,) = steps_by_name["speculative"].commands
    assert speculative.needs == str(tmp_path / "work" / "draft-llama-3.2-1b")
    assert "--speculative-draft-model" in speculative.argv and speculative.why_needed
    assert [c.argv[2] for c in steps_by_name["8b"].commands[:1]] == ["build-model"]
    assert all(c.budget_s > gpu_check.KILL_GRACE_S for _, c in _commands(steps))


def test_speculation_by_load_sweeps_the_pipeline_with_the_eagle_draft_against_none_at_one_and_64(tmp_path):
    from bench_core.cli import build_parser, commands
    from bench_core.cli.sweep import build_plan
    from bench_core.engines import run_config_problems

    steps = by_name(_plan(tmp_path))
    (sweep,) = steps["spec-by-load"].commands
    (speculative,) = steps["speculative"].commands
    assert sweep.argv[2:4] == ("sweep-run", "pipeline") and sweep.side == "ours"
    assert (sweep.needs, sweep.why_needed) == (speculative.needs, speculative.why_needed)  # skipped without the draft
    assert "draft" in sweep.why_needed
    parsed = build_parser(commands()).parse_args(["sweep", *sweep.argv[3:]])  # sweep-run hands these to the CLI
    (command,) = [c for c in commands() if c.name == "sweep"]
    plan = build_plan(parsed, command.engine_commands["pipeline"])
    assert plan.speculation_pairing == ("speculative_algorithm", None, "eagle")
    assert [(run.values["concurrency"], run.config.engine.speculative_algorithm) for run in plan.points()] == [
        (1, None),
        (1, "eagle"),
        (64, None),
        (64, "eagle"),
    ]
    base = plan.base
    assert (base.engine.backend, base.engine.speculative_draft_model) == (
        "pytorch",
        str(tmp_path / "work" / "draft-llama-3.2-1b"),
    )
    assert base.engine.speculative_num_draft_tokens == 2 and base.engine.model == speculative.argv[5]
    assert base.dataset.num_prompts == 64 and base.load.stream_output  # every request in flight at 64; TPOT streamed
    assert base.dataset.sharegpt_output_len == 32
    # The carried ShareGPT export is on the GPU machine only; its file is checked before anything loads.
    dataset = Path(base.dataset.dataset)
    dataset.parent.mkdir(parents=True, exist_ok=True)
    dataset.write_text(
        json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]}])
    )
    assert [run_config_problems(run.config) for run in plan.points()] == [[]] * 4
    assert parsed.results == str(tmp_path / "work" / "results")  # the history the step "history" exports


def test_a_command_that_could_end_past_the_deadline_is_skipped_and_the_step_that_always_runs_still_runs(tmp_path):
    paths = Paths(tmp_path / "work", tmp_path / "carry", sys.executable)
    quick = (sys.executable, "-c", "pass")
    steps = (
        Step("first", "fits", (Command("fits", quick, 20),)),
        Step("long", "could end past the deadline", (Command("too long", quick, 26), Command("short", quick, 2))),
        Step("last", "always runs", (Command("closing", quick, 5),), always_runs=True),
    )
    # 30 s, of which 5 kept for "last": "fits" starts with 25 left, "too long" could not end in time, "short" can.
    outcomes = gpu_check.run_check(steps, paths, tmp_path / "out", say=lambda _: None, deadline_s=30)
    assert [(o.label, o.status) for o in outcomes] == [
        ("fits", "ok"),
        ("too long", "skipped"),
        ("short", "ok"),
        ("closing", "ok"),
    ]
    assert (
        outcomes[1].detail.endswith("s of the check's 30 s were left, less than its limit") and not outcomes[1].wall_s
    )
    late = gpu_check.run_check(steps, paths, tmp_path / "out", say=lambda _: None, deadline_s=3)
    assert [(o.label, o.status) for o in late] == [
        ("fits", "skipped"),
        ("too long", "skipped"),
        ("short", "skipped"),
        ("closing", "ok"),  # past the deadline, still run: the history it exports is kept for
    ]


def test_every_carried_file_the_plan_names_is_in_the_manifest(tmp_path):
    carry = tmp_path / "carry"
    named = {
        Path(arg.split("/*")[0].split(" ")[0]).relative_to(carry)
        for _, command in _commands(_plan(tmp_path))
        for part in command.argv
        for arg in part.split()
        if arg.startswith(str(carry))
    }
    assert named, "the plan reads the carry"
    for path in named:
        part = next((p for p in CARRY_PARTS if path.parts[0] == p.folder), None)
        assert part is not None, f"{path} is in no part of the manifest"
        rest = Path(*path.parts[1:])
        assert not rest.parts or any(rest.match(pattern) for pattern in part.needs), f"{path}: not in {part.needs}"
    environment = Paths(tmp_path / "work", carry).environment({})
    assert environment["PYTHONPATH"].split(os.pathsep)[0] == str(carry / "site")  # LMDeploy from the carry


def _fabricated_carry(root: Path) -> Path:
    """A carry with one small file for each pattern the manifest needs."""
    carry = root / "carry"
    for part in CARRY_PARTS:
        for pattern in part.needs:
            path = carry / part.folder / pattern.replace("*", "0.1")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
    return carry


def test_the_carry_check_names_a_missing_file_a_part_over_its_size_and_an_upload_over_the_limit(tmp_path):
    carry = _fabricated_carry(tmp_path)
    assert gpu_check.check_carry(carry, tree_bytes=5 * gpu_check.MB) == []
    (carry / "lmdeploy-benchmark" / "profile_throughput.py").unlink()
    with (carry / "data" / "sharegpt.json").open("wb") as data:
        data.truncate(next(p.max_bytes for p in CARRY_PARTS if p.folder == "data") + 1)  # sparse: no disk used
    problems = gpu_check.check_carry(carry, tree_bytes=gpu_check.UPLOAD_LIMIT_BYTES)
    assert [p.split(" ")[0] for p in problems] == [str(carry / "lmdeploy-benchmark"), str(carry / "data"), "the"]
    assert "lacks profile_throughput.py" in problems[0] and "over its 7 MB" in problems[1]
    assert "over the device tool's 64 MiB" in problems[2]
    assert gpu_check.check_carry(tmp_path / "none") == [
        f"{tmp_path / 'none'} is not there: scripts/gpu-carry.sh builds it"
    ]


def test_the_declared_sizes_fit_the_upload_limit_and_the_wheels_take_the_projects_pins():
    declared = sum(part.max_bytes for part in CARRY_PARTS) + gpu_check.TREE_ALLOWANCE_BYTES
    assert declared <= gpu_check.UPLOAD_LIMIT_BYTES
    tree = gpu_check.tree_bytes(ROOT)
    if tree is not None:  # a checkout: what travels beside the carry stays within its allowance
        assert tree <= gpu_check.TREE_ALLOWANCE_BYTES
    pins = gpu_check.requirement_pins(ROOT / "requirements.txt")
    assert all(name in pins for name in gpu_check.BENCH_WHEELS)
    assert "lmdeploy" in gpu_check.requirement_pins(ROOT / "requirements-gpu.txt")


def _alive(pid: int) -> bool:
    """Whether process `pid` runs: neither gone nor a zombie (killed, waiting to be reaped by whoever adopted it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _run_loop(tmp_path, commands: list[Command]) -> tuple[list[Outcome], Paths]:
    paths = Paths(tmp_path / "work", tmp_path / "carry", sys.executable)
    steps = (Step("fake", "commands that end every way", tuple(commands)),)
    outcomes = gpu_check.run_check(steps, paths, tmp_path / "out", say=lambda _: None)
    gpu_check.write_report(steps, outcomes, paths, tmp_path / "out", WHEN, ["a problem"])
    return outcomes, paths


def test_a_failed_a_hung_and_a_skipped_command_are_recorded_and_the_next_ones_run(tmp_path):
    grandchild_pid = tmp_path / "grandchild.pid"
    hang = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(grandchild_pid)!r}, 'w').write(str(child.pid))\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "time.sleep(600)\n"
    )
    result = {"run_id": "r1", "lmdeploy": {"output_throughput": "12.5"}, "metrics": {"output_throughput": 12.5}}
    commands = [
        Command("fails", (sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"), 20),
        Command("hangs", (sys.executable, "-c", hang), gpu_check.KILL_GRACE_S + 1),
        Command("skipped", ("false",), 20, needs=str(tmp_path / "absent"), why_needed="nothing made it"),
        Command("runs", (sys.executable, "-c", f"print({gpu_check.RESULT_MARKER + json.dumps(result)!r})"), 20, "ours"),
    ]
    outcomes, _ = _run_loop(tmp_path, commands)
    assert [(o.label, o.status, o.detail) for o in outcomes] == [
        ("fails", "failed", "exit 3"),
        ("hangs", "timed out", f"stopped at its {gpu_check.KILL_GRACE_S + 1} s limit"),
        ("skipped", "skipped", "nothing made it"),
        ("runs", "ok", ""),
    ]
    assert outcomes[0].tail == "boom" and outcomes[3].result == result
    pid = int(grandchild_pid.read_text())
    if _alive(pid):
        os.kill(pid, 9)  # not left running when the check failed to end it
        pytest.fail("the hung command's child outlived its time limit: the group was not killed")
    report = (tmp_path / "out" / "gpu-check.md").read_text()
    assert report.startswith("# GPU check, 2026-12-05 01:02 UTC: GPU unknown (nvidia-smi gave nothing)\n")
    assert "- carry: a problem\n" in report
    assert "| fake | 64 s | " in report and "fails: failed (exit 3), hangs: timed out" in report
    assert "### fake: fails, failed (exit 3)\n\n```\nboom\n```" in report
    assert "Ours: runs: r1" in report
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [o["status"] for o in saved["outcomes"]] == ["failed", "timed out", "skipped", "ok"]
    log = (tmp_path / "out" / "gpu-check.log").read_text()
    assert "===== [fake] fails: " in log and "===== timed out " in log and "===== ok  after " in log


def test_the_report_sets_each_run_beside_lmdeploys_and_reads_the_row_its_profiler_wrote(tmp_path):
    profiler_module = load_lmdeploy_profiler()
    if profiler_module is None:
        pytest.skip(why_missing())
    script_csv = tmp_path / "pipeline-lmdeploy-1.csv"
    profiler = profiler_module.Profiler(True, [50, 75, 95, 99])
    profiler.start()
    for output in (10, 20):
        session = profiler.new_session(30, output)
        for tokens in (0, output // 2, output):
            session.tick(tokens)
        session.finish(profiler_module.Session.SUCCESS)
    profiler.finish()
    profiler.compute_metrics()
    profiler.save_csv(str(script_csv), (("backend", "pytorch"), ("bs", 64)))
    script = Command("pipeline lmdeploy 1", (), 1, "lmdeploy", str(script_csv))
    theirs = Outcome("pipeline", script.label, "lmdeploy", "ok", "", 1.0, gpu_check.read_result(script, ""))
    written = float(theirs.result["lmdeploy"]["output_throughput"])
    assert theirs.result["lmdeploy"]["completed"] == "2" and written > 0
    mine = float(f"{written * 1.1:.3f}")
    ours_row = {"output_throughput": f"{mine:.3f}", "duration": 2.5, "completed": 2}
    ours_row |= {"total_input_tokens": 60, "total_output_tokens": 30}
    ours = Outcome("pipeline", "pipeline ours 1", "ours", "ok", "", 1.0, {"lmdeploy": ours_row, "run_id": "r"})
    failed = Outcome("pipeline", "pipeline ours 2", "ours", "timed out", "stopped at its 24 s limit", 24.0)
    table = gpu_check.pair_table([ours, theirs, failed], "pipeline")
    assert table[2].startswith(f"| 1 | {mine:,.0f} | {written:,.0f} | 1.10x | 2.5 s / ")
    assert table[2].endswith("| 2 / 2 | 60 + 30 / 60 + 30 |")  # the same requests: the same totals
    assert len(table) == 3  # a pair without LMDeploy's run is not shown as one
    steps = _plan(tmp_path)
    prefix = Outcome("prefix", "prefix caching on", "ours", "ok", "", 9.0)
    prefix.result = {"metrics": {"output_throughput": 5000.0, "total_cached_tokens": 90000, "mean_ttft_ms": "nan"}}
    roofline = ["Roofline verdict: memory-bandwidth bound.", "- peak: NVIDIA H200's datasheet"]
    eight = Outcome("8b", "8b", "ours", "ok", "", 30.0, {"metrics": {"energy_per_output_token_j": 0.25}})
    eight.result["roofline"] = roofline
    history = Outcome("history", "history", "", "ok", "", 1.0, {"imported": {"/w/pipeline-lmdeploy-1.csv": ["i1"]}})
    everything = [ours, theirs, failed, prefix, eight, history]
    report = gpu_check.assemble_report(steps, everything, {"doctor": "Software"}, WHEN)
    assert "| prefix caching on | 5,000 | n/a | 90,000 | n/a |" in report
    assert "| 8b | n/a | n/a | n/a | 0.250 | n/a | n/a |" in report
    assert "- Roofline verdict: memory-bandwidth bound.\n- - peak: NVIDIA H200's datasheet" in report
    assert "| speculative | 24 s | 0.0 s | not run |" in report
    assert "## Doctor\n\n```\nSoftware\n```" in report
    assert "Ours: pipeline ours 1: r\n\nLMDeploy's, imported: pipeline-lmdeploy-1: i1\n" in report


PRINTED = (
    "Sweep sweep-1: mean [95% CI, within the metric's bounds] over each point's finished runs\n"
    " concurrency speculative_algorithm  Acceptance by draft position\n"
    "           1                 eagle                        0%, 0%\n"
    "Speculation against none, by load: with over without, request by request, mean ratio (95% interval):\n"
    " concurrency  run pairs Time per output token speculation\n"
    "           1          1   1.4 (1.3 to 1.5)          costs\n"
    "Speculation paid at no load swept.\n"
)


def _speculation_section(steps, outcomes) -> str:
    report = gpu_check.assemble_report(steps, outcomes, {}, WHEN)
    return report.split("## Speculation against none, by load: concurrency=1,64\n\n")[1].split("\n## ")[0]


def test_the_report_shows_what_the_speculation_sweep_printed_or_why_it_did_not_run(tmp_path):
    steps = _plan(tmp_path)
    nothing = _speculation_section(steps, [])
    assert "--against-no-speculation --sweep concurrency=1,64" in nothing and nothing.endswith("\n\nnot run\n")
    assert "| spec-by-load | 150 s | 0.0 s | not run |" in gpu_check.assemble_report(steps, [], {}, WHEN)
    ran = Outcome("spec-by-load", "speculation by load", "ours", "ok", "", 95.0, {"exit_code": 0, "printed": PRINTED})
    assert _speculation_section(steps, [ran]).endswith("paying.\n\n```\n" + PRINTED.rstrip() + "\n```\n")
    partly = dataclasses.replace(ran, status="failed", detail="exit 1")  # a run failed: what it printed still shows
    assert _speculation_section(steps, [partly]).endswith(
        "paying.\n\nspeculation by load: failed (exit 1)\n\n```\n" + PRINTED.rstrip() + "\n```\n"
    )
    why = "the Eagle draft was not built (step models): /w/draft is missing"
    skipped = Outcome("spec-by-load", "speculation by load", "ours", "skipped", why, 0.0)
    assert _speculation_section(steps, [skipped]).endswith(f"paying.\n\nspeculation by load: skipped ({why})\n")
    assert f"- skipped, {why}: speculation by load" in gpu_check.assemble_report(steps, [skipped], {}, WHEN)


def test_the_draft_has_the_eagle_layout_lmdeploy_loads(tmp_path, tiny_model_path):
    from safetensors import safe_open

    target = tmp_path / "target"
    gpu_check_tasks.build_model("tiny", target, "cpu")
    assert json.loads((target / "synthetic.json").read_text())["device"] == "cpu"
    gpu_check_tasks.build_draft(target, tmp_path / "draft", "cpu")
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["tie_word_embeddings"], config["architectures"]) == (
        1,
        False,
        ["LlamaForCausalLM"],  # LMDeploy renames it EagleLlamaForCausalLM for --speculative-algorithm eagle
    )
    with safe_open(str(tmp_path / "draft" / "model.safetensors"), "pt") as weights:
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    hidden = config["hidden_size"]
    assert shapes["fc.weight"] == (hidden, 2 * hidden) and shapes["embed_tokens.weight"] == (4096, hidden)
    assert "layers.0.input_layernorm.weight" not in shapes and not any(
        n.startswith(("model.", "lm_head")) for n in shapes
    )
    assert shapes == gpu_check_tasks.draft_tensor_shapes(config)


@pytest.mark.slow
def test_worker_run_benchmarks_through_the_worker_process_and_lmdeploys_csv_is_imported(tmp_path, tiny_model_path):
    results, csvs = tmp_path / "results", tmp_path / "lmdeploy-csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_STUDIO_RESULTS": str(results)}
    tasks = [sys.executable, str(ROOT / "scripts" / "gpu_check_tasks.py")]
    flags = ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "-n", "3", "-c", "3"]
    run = subprocess.run(
        [*tasks, "worker-run", "pipeline", *flags, "--stream-output", "--results", str(results)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    command = Command("ours", (), 1, "ours")
    result = gpu_check.read_result(command, run.stdout)
    assert result["state"] == "finished" and result["lmdeploy"]["completed"] == 3
    assert result["metrics"]["total_output_tokens"] == result["lmdeploy"]["total_output_tokens"] > 0
    csvs.mkdir()
    script_row = subprocess.run(  # a row in LMDeploy's CSV format, as profile_pipeline_api.py appends it
        [sys.executable, "-m", "bench_core", "pipeline", *flags, "--results", str(tmp_path / "other")]
        + ["--csv", str(csvs / "pipeline-lmdeploy-1.csv")],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert script_row.returncode == 0
    record = subprocess.run(
        [*tasks, "record-lmdeploy", str(results), str(csvs), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert record.returncode == 0, record.stderr
    imported = gpu_check.read_result(command, record.stdout)["imported"]
    assert (
        list(imported) == [str(csvs / "pipeline-lmdeploy-1.csv")]
        and len(imported[str(csvs / "pipeline-lmdeploy-1.csv")]) == 1
    )
    rows = gpu_check.read_lmdeploy_csv(tmp_path / "history.csv")
    assert [row["status"] for row in rows] == ["finished", "imported"]
    assert rows[0]["run_id"] == result["run_id"]


@pytest.mark.slow
def test_sweep_run_prints_the_sweeps_tables_and_the_report_shows_them(tmp_path, tiny_model_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_STUDIO_RESULTS": str(tmp_path / "results")}
    flags = ["builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "-n", "4", "--stream-output"]
    flags += ["--sharegpt-output-len", "8", "--speculative-algorithm", "prompt_lookup"]
    flags += ["--against-no-speculation", "--sweep", "concurrency=1,4", "--results", str(tmp_path / "results")]
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check_tasks.py"), "sweep-run", "pipeline", *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = gpu_check.read_result(Command("speculation by load", (), 1, "ours"), run.stdout)
    assert result["exit_code"] == 0 and run.stdout.startswith(result["printed"])  # also in the log, as printed
    printed = result["printed"]
    assert "Acceptance by draft position" in printed  # the point table, acceptance per position
    assert "Speculation against none, by load: with over without" in printed
    assert printed.rstrip().splitlines()[-1].startswith("Speculation paid ")
    assert "sweep " not in printed and "warning:" not in printed  # progress and warnings: stderr, not the report
    outcome = Outcome("spec-by-load", "speculation by load", "ours", "ok", "", 9.0, result)
    assert _speculation_section(_plan(tmp_path), [outcome]).endswith("```\n" + printed.rstrip() + "\n```\n")
