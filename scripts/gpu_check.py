"""The GPU check: one command that proves the project's GPU paths on a lent H200 in one device call.

    scripts/gpu-check.sh --dry-run     # here: every step and command with its time limit, and the sum
    scripts/gpu-carry.sh               # here: build .gpu/ (git-ignored), the files the check needs there
    scripts/gpu-check.sh               # there, in one call of the device tool with `.gpu` carried

On the GPU machine it installs the carried wheels, builds random-weight models on the GPU, and runs in order: the
doctor; the pipeline through the dashboard's worker process against LMDeploy's profile_pipeline_api.py on the same
sampled requests, alternating, two pairs; the engine API (`throughput`) against profile_throughput.py the same way,
streamed, with --cancel-rate; shared prefixes with prefix caching off and on; speculative decoding with an Eagle
draft; a synthetic 8B for telemetry, J/token and the roofline verdict; speculation against none at concurrency 1 and
64 (a paired sweep). Every command runs in a process group of its own under its own time limit (SIGTERM, then SIGKILL
for the whole group, so a hung engine frees the GPU), and one that fails or runs out of time is recorded and the next
one starts; one that could end past the check's deadline is skipped, so that the report is always written. It writes
under $OUT (or --out): gpu-check.md (the report), results.json (each command's outcome and figures), history.csv
(every run, ours and LMDeploy's scripts' imported) and gpu-check.log (every command's output).

This module is the plan (steps, budgets), the carry's manifest and its check, the run loop and the report; it uses
the standard library only, so that the dry run and the tests need nothing else. What needs the project, torch or a
GPU is in gpu_check_tasks.py, run as a command of its own. docs/gpu.md has the results and how to run it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".gpu"
TASKS = ROOT / "scripts" / "gpu_check_tasks.py"
MAKE_CARRY = "make-carry.sh"  # the shared recipe (../shared/gpu/ beside the checkout): LMDeploy without TurboMind
MB = 1000**2
MIB = 1024**2
# The device tool uploads at most this much per call: the working tree and the carried folders together.
UPLOAD_LIMIT_BYTES = 64 * MIB
# What the working tree may weigh beside the carry (5.1 MB on 2026-12-05): the carry's parts get the rest.
TREE_ALLOWANCE_BYTES = 10 * MB
# The device tool allows 10 minutes a command. The check ends by TOTAL_BUDGET_S, installs included, starting no
# command that could end past it, so that its report is written and comes back; the rest of the lease (15 minutes a
# session) pays for the machine's start and the upload.
DEVICE_CALL_LIMIT_S = 600
TOTAL_BUDGET_S = DEVICE_CALL_LIMIT_S - 30
# A command past its limit gets SIGTERM this long before the limit, then SIGKILL: its budget is the most it takes.
KILL_GRACE_S = 3
# The line gpu_check_tasks.py's worker-run prints, followed by the run's result as JSON.
RESULT_MARKER = "GPU-CHECK-RESULT "
# Each command's output is kept in the log up to this much (its tail: where an error is).
LOG_TAIL_BYTES = 200_000

# Where the commands keep their files on the GPU machine (its disk is 64 GiB; an 8B model is 16 GB).
DEFAULT_WORK = Path("/tmp/gpu-check")

# The benchmark sizes. A pair's runs are short (an engine start costs more than the run) so that two pairs of each
# script fit; the 2026-11-30 runs took 37-41 s each at -n 1000 -c 128 on the same 1B shape.
PAIR_SIZE = ("-n", "200", "-c", "64")
CANCEL_RATE = "0.1"
SHARED_PREFIX = (
    "--dataset-name",
    "shared-prefix",
    "--prefix-len",
    "512",
    "--prefix-groups",
    "4",
    "--suffix-len",
    "32",
    "--output-len",
    "32",
    "-n",
    "200",
    "-c",
    "64",
)
EAGLE = ("--speculative-algorithm", "eagle", "--speculative-num-draft-tokens", "2")
SPECULATIVE = (*EAGLE, "-n", "100", "-c", "32")
# Speculation against none at one request in flight and at 64: a sweep of four runs, each from an engine of its own
# (LMDeploy's engine is built for its max_batch_size, the concurrency). Fixed 32-token answers keep the concurrency-1
# runs (64 requests one after another) to seconds; streamed, as TPOT needs.
SPECULATION_LOADS = "concurrency=1,64"
SPECULATION_BY_LOAD = (
    *EAGLE,
    "-n",
    "64",
    "--sharegpt-output-len",
    "32",
    "--stream-output",
    "--against-no-speculation",
    "--sweep",
    SPECULATION_LOADS,
)
SHAREGPT_RECORDS = 2000  # the carried ShareGPT export: its first 2,000 conversations, first two turns each
MODEL_1B = "llama-3.2-1b"  # the project's synthetic presets (bench_core/models/synthetic.py)
MODEL_8B = "llama-3.1-8b"

# LMDeploy's imports that the GPU machine lacks, as make-carry.sh downloads them into .gpu/whl (wheel file names).
LMDEPLOY_WHEELS = (
    "pyzmq",
    "xgrammar",
    "apache_tvm_ffi",
    "shortuuid",
    "pydantic",
    "pydantic_core",
    "openai",
    "fastapi",
    "uvicorn",
    "fire",
    "mmengine_lite",
    "partial_json_parser",
    "openai_harmony",
)
# This project's requirements (requirements.txt, whose pins they take) that the GPU machine's image lacks: the HTTP
# parser and chunk JSON that bench_core.engines imports, the history's index, and plotly (the CLI's sweep command
# imports its charts).
BENCH_WHEELS = ("orjson", "httptools", "adbc-driver-sqlite", "plotly")
# adbc-driver-sqlite's own requirement, not in requirements.txt: the version it was built against.
BENCH_WHEEL_EXTRAS = ("adbc-driver-manager==1.13.0",)


@dataclasses.dataclass(frozen=True)
class CarryPart:
    """A folder under .gpu/: the files in it the check needs, and the most it may weigh (its declared size)."""

    folder: str
    needs: tuple[str, ...]  # glob patterns, each of which must match a file in the folder
    max_bytes: int
    what: str


def _wheel_globs(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"{name.replace('-', '_')}-*.whl" for name in names)


CARRY_PARTS = (
    CarryPart(
        "site",
        ("lmdeploy/__init__.py", "lmdeploy/pytorch/engine/engine.py", "lmdeploy/profiler.py"),
        10 * MB,
        "LMDeploy's Python package without the TurboMind extension (make-carry.sh)",
    ),
    CarryPart("whl", _wheel_globs(LMDEPLOY_WHEELS), 18 * MB, "wheels of LMDeploy's imports (make-carry.sh)"),
    CarryPart(
        "whl-bench",
        _wheel_globs((*BENCH_WHEELS, *(pin.split("==")[0] for pin in BENCH_WHEEL_EXTRAS))),
        18 * MB,
        "wheels of this project's requirements the GPU machine lacks",
    ),
    CarryPart(
        "lmdeploy-benchmark",
        ("profile_pipeline_api.py", "profile_throughput.py"),
        1 * MB,
        "LMDeploy's own benchmark scripts, from its repository's benchmark/ folder",
    ),
    CarryPart(
        "data",
        ("sharegpt.json",),
        7 * MB,
        f"the built-in ShareGPT's first {SHAREGPT_RECORDS:,} conversations, first two turns each",
    ),
)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else 0


def check_carry(carry: Path, tree_bytes: int | None = None) -> list[str]:
    """What is wrong with the carry folder: a part or a file the check needs that is missing, a part over its declared
    size, or (with `tree_bytes`, what the working tree weighs) an upload over the device tool's limit. Empty: fine."""
    if not carry.is_dir():
        return [f"{_shown(carry)} is not there: scripts/gpu-carry.sh builds it"]
    problems = []
    for part in CARRY_PARTS:
        folder = carry / part.folder
        if not folder.is_dir():
            problems.append(f"{_shown(folder)} is missing ({part.what})")
            continue
        missing = [pattern for pattern in part.needs if not any(folder.glob(pattern))]
        if missing:
            problems.append(f"{_shown(folder)} lacks {', '.join(missing)} ({part.what})")
        size = folder_bytes(folder)
        if size > part.max_bytes:
            problems.append(f"{_shown(folder)} weighs {size / MB:.1f} MB, over its {part.max_bytes / MB:.0f} MB")
    if tree_bytes is not None:
        total = folder_bytes(carry) + tree_bytes
        if total > UPLOAD_LIMIT_BYTES:
            problems.append(
                f"the upload would be {total / MIB:.1f} MiB (carry {folder_bytes(carry) / MIB:.1f} MiB, tree "
                f"{tree_bytes / MIB:.1f} MiB), over the device tool's {UPLOAD_LIMIT_BYTES / MIB:.0f} MiB"
            )
    return problems


def tree_bytes(root: Path = ROOT) -> int | None:
    """What the device tool uploads of the working tree: tracked files and untracked ones git does not ignore."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = (root / name for name in listed.decode().split("\0") if name)
    return sum(path.stat().st_size for path in paths if path.is_file())


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def requirement_pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements file, by lower-case name."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, separator, version = line.split("#")[0].strip().partition("==")
        if separator:
            pins[name.strip().lower()] = version.strip()
    return pins


# The GPU machine's Python (3.12) and platform, for `pip download` here (make-carry.sh's list).
WHEEL_PLATFORM = (
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *(
        arg
        for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
        for arg in ("--platform", tag)
    ),
)
LMDEPLOY_SCRIPTS = ("profile_pipeline_api.py", "profile_throughput.py")


def build_carry(recipe: Path, lmdeploy_repo: Path, python: str, carry: Path = CARRY) -> list[str]:
    """Build `carry`: make-carry.sh's part (LMDeploy without TurboMind, its imports' wheels), then this project's
    wheels, LMDeploy's benchmark scripts from `lmdeploy_repo` (a checkout or a bare clone) and the ShareGPT export;
    the problems check_carry finds in the result."""
    lmdeploy = requirement_pins(ROOT / "requirements-gpu.txt")["lmdeploy"]
    with tempfile.TemporaryDirectory() as staging:
        # make-carry.sh runs in a project root and records .gpu/ in .git/info/exclude, which a git worktree (.git is a
        # file there) lacks: it runs in a staging root with the project's package linked in.
        stage = Path(staging)
        (stage / ".git" / "info").mkdir(parents=True)
        (stage / ".git" / "info" / "exclude").write_text("/.gpu/\n", encoding="utf-8")
        (stage / "bench_core").symlink_to(ROOT / "bench_core")
        env = {**os.environ, "PYTHON": python, "LMDEPLOY": lmdeploy}
        subprocess.run(["bash", str(recipe)], cwd=stage, env=env, check=True)
        shutil.rmtree(carry, ignore_errors=True)
        shutil.move(str(stage / ".gpu"), carry)
    pins = requirement_pins(ROOT / "requirements.txt")
    wanted = [f"{name}=={pins[name]}" for name in BENCH_WHEELS] + list(BENCH_WHEEL_EXTRAS)
    pip = [python, "-m", "pip", "download", "-q", "--no-deps", *WHEEL_PLATFORM, "-d", str(carry / "whl-bench")]
    subprocess.run([*pip, *wanted], check=True)
    scripts = carry / "lmdeploy-benchmark"
    scripts.mkdir()
    checkout = (lmdeploy_repo / "benchmark").is_dir()
    git = ["git", "-C" if checkout else "--git-dir", str(lmdeploy_repo)]
    for name in LMDEPLOY_SCRIPTS:
        shown = [*git, "show", f"HEAD:benchmark/{name}"]
        (scripts / name).write_bytes(subprocess.run(shown, capture_output=True, check=True).stdout)
    commit = subprocess.run([*git, "log", "-1", "--format=%H %cs %s"], capture_output=True, text=True, check=True)
    (scripts / "SOURCE").write_text(f"InternLM/lmdeploy {commit.stdout}", encoding="utf-8")
    export = [python, str(TASKS), "export-sharegpt", str(carry / "data" / "sharegpt.json"), str(SHAREGPT_RECORDS)]
    subprocess.run(export, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return check_carry(carry, tree_bytes(ROOT))


# ---- the plan -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Command:
    """One process of the check, with its time limit. `side`: "ours" or "lmdeploy" for a benchmark run, whose figures
    the report reads (ours: the RESULT_MARKER line; LMDeploy's scripts: the CSV row they append to `csv`). `needs`: a
    path that an earlier command makes; without it the command is skipped and says so."""

    label: str
    argv: tuple[str, ...]
    budget_s: int
    side: str = ""
    csv: str = ""
    needs: str = ""
    why_needed: str = ""


@dataclasses.dataclass(frozen=True)
class Step:
    """Commands run in order. `always_runs`: its time is kept for it from the check's start, so that no other step
    squeezes it out (see run_check)."""

    name: str
    title: str
    commands: tuple[Command, ...]
    always_runs: bool = False

    @property
    def budget_s(self) -> int:
        return sum(command.budget_s for command in self.commands)


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the check reads and writes on the GPU machine."""

    work: Path
    carry: Path = CARRY
    python: str = sys.executable

    @property
    def deps(self) -> Path:
        return self.work / "deps"

    @property
    def results(self) -> Path:
        return self.work / "results"

    @property
    def lmdeploy_csvs(self) -> Path:
        return self.work / "lmdeploy-csv"

    @property
    def dataset(self) -> str:
        return str(self.carry / "data" / "sharegpt.json")

    def model(self, name: str) -> str:
        return str(self.work / f"model-{name}")

    @property
    def draft(self) -> str:
        return str(self.work / f"draft-{MODEL_1B}")

    def script(self, name: str) -> str:
        return str(self.carry / "lmdeploy-benchmark" / name)

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """The commands' environment: the carried LMDeploy and wheels importable, this checkout as the project, no
        hub, the project's cache and history in the work folder."""
        path = [str(self.carry / "site"), str(self.deps), str(ROOT), base.get("PYTHONPATH", "")]
        return {
            **base,
            "PYTHONPATH": os.pathsep.join(filter(None, path)),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "BENCH_STUDIO_CACHE": str(self.work / "cache"),
            "BENCH_STUDIO_RESULTS": str(self.results),
        }


def plan(paths: Paths) -> tuple[Step, ...]:
    """The check's steps in the order they run, each command with its time limit (seconds)."""
    py, work = paths.python, paths.work
    model_1b = paths.model(MODEL_1B)
    missing_1b = f"the 1B model was not built (step models): {model_1b} is missing"
    missing_draft = f"the Eagle draft was not built (step models): {paths.draft} is missing"

    def ours(
        kind: str,
        label: str,
        budget_s: int,
        model: str,
        *flags: str,
        needs: str = "",
        why: str = "",
        task: str = "worker-run",
    ) -> Command:
        argv = (py, str(TASKS), task, kind, paths.dataset, model, "--backend", "pytorch", *flags)
        argv += ("--label", f"gpu-check {label}", "--results", str(paths.results))
        return Command(label, argv, budget_s, "ours", needs=needs or model, why_needed=why or missing_1b)

    def lmdeploys(script: str, label: str, budget_s: int, *flags: str) -> Command:
        csv_path = str(paths.lmdeploy_csvs / f"{label.replace(' ', '-')}.csv")
        argv = (py, paths.script(script), paths.dataset, model_1b, "--backend", "pytorch", *flags, "--csv", csv_path)
        return Command(label, argv, budget_s, "lmdeploy", csv_path, needs=model_1b, why_needed=missing_1b)

    def alternating(kind: str, script: str, budget_s: int, *flags: str) -> tuple[Command, ...]:
        return tuple(
            command
            for pair in (1, 2)
            for command in (
                ours(kind, f"{kind} ours {pair}", budget_s, model_1b, *flags),
                lmdeploys(script, f"{kind} lmdeploy {pair}", budget_s, *flags),
            )
        )

    # The shell expands the carried wheels' names; "$0" is this Python.
    install = (
        f'exec "$0" -m pip install -q --no-index --no-deps --no-compile --target {shlex.quote(str(paths.deps))} '
        f"{shlex.quote(str(paths.carry))}/whl/*.whl {shlex.quote(str(paths.carry))}/whl-bench/*.whl"
    )
    return (
        Step(
            "install",
            "the GPU, and the carried wheels installed (no index)",
            (
                Command("gpu", ("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"), 5),
                Command("wheels", ("bash", "-c", install, py), 15),
            ),
        ),
        Step(
            "models",
            f"synthetic:{MODEL_1B} drawn on the GPU, and a one-layer Eagle draft for it",
            (
                Command("1B", (py, str(TASKS), "build-model", MODEL_1B, model_1b), 25),
                Command(
                    "draft",
                    (py, str(TASKS), "build-draft", model_1b, paths.draft),
                    10,
                    needs=model_1b,
                    why_needed=missing_1b,
                ),
            ),
        ),
        Step("doctor", "python -m bench_core doctor", (Command("doctor", (py, "-m", "bench_core", "doctor"), 15),)),
        Step(
            "warm-up",
            "a first engine start through the worker process (Triton compiles its kernels once, for the runs after)",
            (ours("pipeline", "warm-up", 45, model_1b, "-n", "16", "-c", "16", "--stream-output"),),
        ),
        Step(
            "pipeline",
            "the worker process against profile_pipeline_api.py, streamed, alternating",
            alternating("pipeline", "profile_pipeline_api.py", 24, *PAIR_SIZE, "--stream-output"),
        ),
        Step(
            "throughput",
            "the engine API against profile_throughput.py, streamed, with --cancel-rate, alternating",
            alternating("throughput", "profile_throughput.py", 24, *PAIR_SIZE, "--cancel-rate", CANCEL_RATE),
        ),
        Step(
            "prefix",
            "shared prefixes, prefix caching off then on, each from a fresh engine with no warm-up",
            (
                ours("pipeline", "prefix caching off", 22, model_1b, *SHARED_PREFIX, "--stream-output"),
                ours(
                    "pipeline",
                    "prefix caching on",
                    22,
                    model_1b,
                    *SHARED_PREFIX,
                    "--stream-output",
                    "--enable-prefix-caching",
                ),
            ),
        ),
        Step(
            "speculative",
            "the engine API with the Eagle draft",
            (
                ours(
                    "throughput",
                    "speculative eagle",
                    24,
                    model_1b,
                    *SPECULATIVE,
                    "--speculative-draft-model",
                    paths.draft,
                    needs=paths.draft,
                    why=missing_draft,
                ),
            ),
        ),
        Step(
            "8b",
            f"synthetic:{MODEL_8B} drawn on the GPU, then a pipeline run: telemetry, J/token, the roofline verdict",
            (
                Command("8B", (py, str(TASKS), "build-model", MODEL_8B, paths.model(MODEL_8B)), 35),
                ours(
                    "pipeline",
                    "8b",
                    40,
                    paths.model(MODEL_8B),
                    *PAIR_SIZE,
                    "--stream-output",
                    why=f"the 8B model was not built: {paths.model(MODEL_8B)} is missing",
                ),
            ),
        ),
        # Last of the optional steps: past the deadline it is the one skipped, and the Eagle engine path it needs is
        # proven by "speculative" already; 8b before it is the only step for telemetry, J/token and the roofline.
        Step(
            "spec-by-load",
            f"speculation against none at {SPECULATION_LOADS}: the pipeline swept in process, the Eagle draft on "
            "and off on the same prompts",
            (
                ours(
                    "pipeline",
                    "speculation by load",
                    150,
                    model_1b,
                    *SPECULATION_BY_LOAD,
                    "--speculative-draft-model",
                    paths.draft,
                    needs=paths.draft,
                    why=missing_draft,
                    task="sweep-run",
                ),
            ),
        ),
        Step(
            "history",
            "LMDeploy's CSV rows imported into the history, which is exported beside the report",
            (
                Command(
                    "history",
                    (py, str(TASKS), "record-lmdeploy", str(paths.results), str(paths.lmdeploy_csvs), str(work)),
                    15,
                ),
            ),
            always_runs=True,
        ),
    )


# The steps whose outcomes the report's sections read (plan's names), present even when a run had none of them.
PLAN_STEPS = frozenset({"pipeline", "throughput", "prefix", "speculative", "8b", "spec-by-load", "history"})


def total_budget_s(steps: Sequence[Step]) -> int:
    return sum(step.budget_s for step in steps)


def describe_plan(steps: Sequence[Step]) -> list[str]:
    """The dry run's lines: each step, each command with its limit and its command line, then the sum."""
    lines = []
    for number, step in enumerate(steps, start=1):
        lines.append(f"{number:>2}. {step.name:<12} {step.budget_s:>4} s  {step.title}")
        for command in step.commands:
            lines.append(f"      {command.budget_s:>4} s  {command.label}: {' '.join(command.argv)}")
    total = total_budget_s(steps)
    commands = sum(len(step.commands) for step in steps)
    always = ", ".join(step.name for step in steps if step.always_runs)
    lines.append(
        f"Sum: {total} s ({total // 60} min {total % 60} s) for {len(steps)} steps and {commands} commands; the check "
        f"ends within {TOTAL_BUDGET_S} s: a command that could end past it is skipped ({always} always runs)"
    )
    return lines


# ---- running it ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What one command did: `status` ok, failed, timed out or skipped; `detail` why (an exit code, a missing file);
    `result` the figures read from it (see read_result)."""

    step: str
    label: str
    side: str
    status: str
    detail: str
    wall_s: float
    result: dict = dataclasses.field(default_factory=dict)
    tail: str = ""  # the end of its output, for a command that did not end well


def run_command(command: Command, env: dict[str, str], cwd: Path, log: Path) -> tuple[str, str, float]:
    """Run `command` in a process group of its own, its output to `log`; (status, detail, wall seconds). Past
    budget_s - KILL_GRACE_S the group gets SIGTERM, KILL_GRACE_S later SIGKILL; when the command ends, whatever it
    left in its group is killed too, so that nothing holds the GPU into the next command."""
    started = time.monotonic()
    with log.open("wb") as output:
        try:
            process = subprocess.Popen(
                command.argv, stdout=output, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True
            )
        except OSError as exc:
            return "failed", f"could not start: {exc}", time.monotonic() - started
        try:
            code = process.wait(timeout=max(command.budget_s - KILL_GRACE_S, 1))
            status, detail = ("ok", "") if code == 0 else ("failed", f"exit {code}")
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            status, detail = "timed out", f"stopped at its {command.budget_s} s limit"
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
    return status, detail, time.monotonic() - started


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def read_result(command: Command, output: str) -> dict:
    """What a command reports: LMDeploy's script, the last row of the CSV it appended to (LMDeploy's column names,
    as ours are under "lmdeploy"); the others, the JSON of their last RESULT_MARKER line (gpu_check_tasks.py's
    worker-run and record-lmdeploy print one). Empty when there is none."""
    if command.csv:
        rows = read_lmdeploy_csv(Path(command.csv))
        return {"lmdeploy": rows[-1]} if rows else {}
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                return json.loads(line[len(RESULT_MARKER) :])
            except ValueError:
                return {}
    return {}


def read_lmdeploy_csv(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as file:
            return list(csv.DictReader(file))
    except OSError:
        return []


def run_check(
    steps: Sequence[Step],
    paths: Paths,
    out: Path,
    say: Callable[[str], None] = print,
    deadline_s: int = TOTAL_BUDGET_S,
) -> list[Outcome]:
    """Run every command of every step in order; a failure or a timeout is recorded and the next command runs. A
    command whose whole limit does not fit in what is left of `deadline_s` (seconds from the start, less the limits
    of the steps that always run, kept for them) is skipped, saying so: the check ends within `deadline_s` however
    long each command takes, and the device tool's per-call limit never cuts it off before the report is written."""
    logs = paths.work / "logs"
    for folder in (paths.work, logs, paths.lmdeploy_csvs, out):
        folder.mkdir(parents=True, exist_ok=True)
    env = paths.environment(dict(os.environ))
    outcomes = []
    started = time.monotonic()
    kept_s = sum(step.budget_s for step in steps if step.always_runs)
    with (out / "gpu-check.log").open("w", encoding="utf-8") as main_log:
        for step in steps:
            kept_s -= step.budget_s if step.always_runs else 0
            for number, command in enumerate(step.commands, start=1):
                say(f"[{step.name}] {command.label} (limit {command.budget_s} s)")
                left_s = deadline_s - (time.monotonic() - started) - kept_s
                if command.needs and not Path(command.needs).exists():
                    outcome = Outcome(step.name, command.label, command.side, "skipped", command.why_needed, 0.0)
                elif not step.always_runs and command.budget_s > left_s:
                    why = f"{max(left_s, 0):.0f} s of the check's {deadline_s} s were left, less than its limit"
                    outcome = Outcome(step.name, command.label, command.side, "skipped", why, 0.0)
                else:
                    log = logs / f"{step.name}-{number}.log"
                    status, detail, wall_s = run_command(command, env, paths.work, log)
                    output = _tail(log)
                    outcome = Outcome(step.name, command.label, command.side, status, detail, wall_s)
                    outcome.result = read_result(command, output)
                    if status != "ok" or (command.side and not outcome.result):
                        outcome.tail = "\n".join(output.replace("\r", "\n").splitlines()[-15:])
                    main_log.write(f"===== [{step.name}] {command.label}: {' '.join(command.argv)}\n{output}\n")
                    main_log.write(f"===== {status} {detail} after {wall_s:.1f} s\n\n")
                    main_log.flush()
                say(f"  {outcome.status}{': ' + outcome.detail if outcome.detail else ''} ({outcome.wall_s:.1f} s)")
                outcomes.append(outcome)
    return outcomes


def _tail(log: Path) -> str:
    with log.open("rb") as file:
        file.seek(max(log.stat().st_size - LOG_TAIL_BYTES, 0))
        return file.read().decode("utf-8", "replace")


# ---- the report ---------------------------------------------------------------------------------------------------


def figure(outcome: Outcome, column: str) -> float | None:
    """A number of the run's LMDeploy row (ours and LMDeploy's scripts alike); None where missing or not a number
    ("-", LMDeploy's mark for a figure of an unstreamed run)."""
    return _number(outcome.result.get("lmdeploy", {}).get(column))


def metric(outcome: Outcome, key: str) -> float | None:
    """One of our run's metrics (the history's column names); None where the run or the metric is missing."""
    return _number(outcome.result.get("metrics", {}).get(key))


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _fmt(value: float | None, digits: int = 0, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}{unit}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "n/a" if ours is None or not theirs else f"{ours / theirs:.2f}x"


def _state(outcome: Outcome) -> str:
    """How the command ended, with why; a skipped one's why is said once under the steps' table."""
    return outcome.status + (f" ({outcome.detail})" if outcome.detail and outcome.status != "skipped" else "")


def pair_table(outcomes: Sequence[Outcome], step: str) -> list[str]:
    """Ours against LMDeploy's script, pair by pair: output tok/s and their ratio, durations, requests completed and
    the token totals (equal totals: the same requests were sampled)."""
    ours = [o for o in outcomes if o.step == step and o.side == "ours"]
    theirs = [o for o in outcomes if o.step == step and o.side == "lmdeploy"]
    lines = [
        "| pair | ours: output tok/s | LMDeploy's script: output tok/s | ratio | duration (ours / script) "
        "| completed (ours / script) | input + output tokens (ours / script) |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, (mine, script) in enumerate(zip(ours, theirs), start=1):
        lines.append(
            f"| {number} | {_cell(mine, 'output_throughput')} | {_cell(script, 'output_throughput')} "
            f"| {_ratio(figure(mine, 'output_throughput'), figure(script, 'output_throughput'))} "
            f"| {_fmt(figure(mine, 'duration'), 1, ' s')} / {_fmt(figure(script, 'duration'), 1, ' s')} "
            f"| {_fmt(figure(mine, 'completed'))} / {_fmt(figure(script, 'completed'))} "
            f"| {_tokens(mine)} / {_tokens(script)} |"
        )
    return lines


def _cell(outcome: Outcome, column: str) -> str:
    value = figure(outcome, column)
    return _fmt(value) if value is not None else _state(outcome)


def _tokens(outcome: Outcome) -> str:
    return f"{_fmt(figure(outcome, 'total_input_tokens'))} + {_fmt(figure(outcome, 'total_output_tokens'))}"


def runs_table(outcomes: Sequence[Outcome], columns: Sequence[tuple[str, str, int | None, str]]) -> list[str]:
    """Our runs, one a row: (heading, metric, digits, unit) per column, digits None for a text (the roofline's bound);
    a run without figures says how it ended."""
    lines = ["| run | " + " | ".join(heading for heading, *_ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for outcome in outcomes:
        if not outcome.result.get("metrics"):
            lines.append(f"| {outcome.label} | {_state(outcome)} |" + " |" * (len(columns) - 1))
            continue
        cells = [
            _fmt(metric(outcome, key), digits, unit)
            if digits is not None
            else str(outcome.result["metrics"].get(key) or "n/a")
            for _, key, digits, unit in columns
        ]
        lines.append(f"| {outcome.label} | " + " | ".join(cells) + " |")
    return lines


def printed_by(outcomes: Sequence[Outcome]) -> list[str]:
    """What commands that report their printout (gpu_check_tasks.py's sweep-run) printed, each under how it ended
    unless it ended well; "not run" without any."""
    lines = []
    for outcome in outcomes:
        if outcome.status != "ok":
            lines += [f"{outcome.label}: {outcome.status}" + (f" ({outcome.detail})" if outcome.detail else ""), ""]
        if outcome.result.get("printed"):
            lines += ["```", outcome.result["printed"].rstrip(), "```", ""]
    return lines[:-1] or ["not run"]


def machine_line(logs: dict[str, str]) -> str:
    """The GPU as nvidia-smi names it (name, driver, memory), from the install step's first command."""
    rows = [line for line in logs.get("gpu", "").splitlines() if line.strip() and not line.startswith("name")]
    return rows[0].strip() if rows else "GPU unknown (nvidia-smi gave nothing)"


def assemble_report(
    steps: Sequence[Step],
    outcomes: Sequence[Outcome],
    logs: dict[str, str],
    when: datetime.datetime,
    carry_problems: Sequence[str] = (),
) -> str:
    """The report's markdown: the machine and date, each step's time and outcome, then the comparisons, our runs'
    figures, the doctor's output and the end of each failed command's output. `logs`: the gpu and doctor commands'
    output; `carry_problems`: what check_carry found before the run."""
    by_step = {name: [o for o in outcomes if o.step == name] for name in {s.name for s in steps} | PLAN_STEPS}
    took = sum(o.wall_s for o in outcomes)
    lines = [
        f"# GPU check, {when:%Y-%m-%d %H:%M} UTC: {machine_line(logs)}",
        "",
        f"Took {took:.0f} s; the limits sum to {total_budget_s(steps)} s, and no command started that could end "
        f"past {TOTAL_BUDGET_S} s. PyTorch "
        f"engine (TurboMind is not carried: docs/gpu.md), random-weight synthetic:{MODEL_1B} unless named, "
        "the carried ShareGPT export, seed 0, for ours and LMDeploy's scripts alike.",
        "",
        *(f"- carry: {problem}" for problem in carry_problems),
        *([""] if carry_problems else []),
        "| step | budget | took | outcomes |",
        "|---|---|---|---|",
    ]
    for step in steps:
        done = by_step[step.name]
        states = ", ".join(f"{o.label}: {_state(o)}" for o in done) or "not run"
        lines.append(f"| {step.name} | {step.budget_s} s | {sum(o.wall_s for o in done):.1f} s | {states} |")
    skipped: dict[str, list[str]] = {}
    for outcome in outcomes:
        if outcome.status == "skipped":
            skipped.setdefault(outcome.detail, []).append(outcome.label)
    if skipped:
        lines.append("")
        lines += [f"- skipped, {why}: {', '.join(labels)}" for why, labels in skipped.items()]
    lines += [
        "",
        "## Pipeline: the dashboard's worker process against profile_pipeline_api.py",
        "",
        f"`{' '.join(PAIR_SIZE)} --stream-output`, alternating ours, LMDeploy's, ours, LMDeploy's.",
        "",
        *pair_table(outcomes, "pipeline"),
        "",
        "## Engine API: `throughput` in the worker process against profile_throughput.py",
        "",
        f"`{' '.join(PAIR_SIZE)} --cancel-rate {CANCEL_RATE}`, streamed; the cancelled requests are drawn by each "
        "tool from the seed, so the completed counts may differ.",
        "",
        *pair_table(outcomes, "throughput"),
        "",
        "## Prefix caching on shared prefixes",
        "",
        f"`{' '.join(SHARED_PREFIX)}`: a fresh engine per run and no warm-up request (the project has no other cold "
        "state to set for an in-process engine); cached prompt tokens are LMDeploy's Response.cached_tokens.",
        "",
        *runs_table(
            by_step["prefix"],
            (
                ("output tok/s", "output_throughput", 0, ""),
                ("mean TTFT", "mean_ttft_ms", 1, " ms"),
                ("cached prompt tokens", "total_cached_tokens", 0, ""),
                ("hit rate", "prefix_cache_hit_rate", 3, ""),
            ),
        ),
        "",
        "## Speculative decoding (random target, random one-layer Eagle draft: acceptance near nothing is expected)",
        "",
        *runs_table(
            by_step["speculative"],
            (
                ("output tok/s", "output_throughput", 0, ""),
                ("acceptance length", "spec_acceptance_length", 3, ""),
                ("acceptance rate", "spec_acceptance_rate", 3, ""),
            ),
        ),
        "",
        f"## Speculation against none, by load: {SPECULATION_LOADS}",
        "",
        f"`sweep pipeline {' '.join(SPECULATION_BY_LOAD)}` with the Eagle draft above: at each load a run without "
        "speculation, then one with it, on the same prompts. What the sweep printed: each point's figures and "
        "acceptance by draft position, then with over without request by request, and where speculation stopped "
        "paying.",
        "",
        *printed_by(by_step["spec-by-load"]),
        "",
        f"## Telemetry and the roofline: synthetic:{MODEL_8B}",
        "",
        *runs_table(
            [o for o in by_step["8b"] if o.side == "ours"] + [o for o in by_step["pipeline"] if o.side == "ours"],
            (
                ("output tok/s", "output_throughput", 0, ""),
                ("GPU util", "mean_gpu_util_percent", 0, " %"),
                ("GPU power", "mean_gpu_power_w", 0, " W"),
                ("J/token", "energy_per_output_token_j", 3, ""),
                ("peak GPU memory", "peak_gpu_memory_gib", 1, " GiB"),
                ("bound", "roofline_bound", None, ""),
            ),
        ),
    ]
    for outcome in by_step["8b"]:
        lines += [f"- {line}" for line in outcome.result.get("roofline", [])]
    lines += ["", "## Doctor", "", "```", logs.get("doctor", "(not run)").strip(), "```", ""]
    ended_badly = [o for o in outcomes if o.tail]
    if ended_badly:
        lines += ["## The end of what the failed commands printed", ""]
        for outcome in ended_badly:
            lines += [f"### {outcome.step}: {outcome.label}, {_state(outcome)}", "", "```", outcome.tail, "```", ""]
    ids = [f"{o.label}: {o.result['run_id']}" for o in outcomes if o.result.get("run_id")]
    imported = next((o.result.get("imported", {}) for o in by_step["history"] if o.result), {})
    lines += [
        "## The runs in the history (history.csv beside this report)",
        "",
        "Ours: " + ("; ".join(ids) or "none"),
        "",
        "LMDeploy's, imported: "
        + ("; ".join(f"{Path(k).stem}: {', '.join(v)}" for k, v in imported.items()) or "none"),
        "",
    ]
    return "\n".join(lines)


def write_report(
    steps: Sequence[Step],
    outcomes: Sequence[Outcome],
    paths: Paths,
    out: Path,
    when: datetime.datetime,
    carry_problems: Sequence[str] = (),
) -> Path:
    """gpu-check.md and results.json under `out`, and the exported history (record-lmdeploy wrote it to the work
    folder) beside them."""
    logs = {}
    for step in steps:
        for number, command in enumerate(step.commands, start=1):
            log = paths.work / "logs" / f"{step.name}-{number}.log"
            if command.label in ("gpu", "doctor") and log.is_file():
                logs[command.label] = _tail(log)
    report = out / "gpu-check.md"
    report.write_text(assemble_report(steps, outcomes, logs, when, carry_problems), encoding="utf-8")
    results = {"date": when.isoformat(), "outcomes": [dataclasses.asdict(o) for o in outcomes]}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    history = paths.work / "history.csv"
    if history.is_file():
        (out / "history.csv").write_bytes(history.read_bytes())
    return report


# ---- the command line ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check.sh", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--dry-run", action="store_true", help="print the steps and their time limits; run nothing")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "artifacts" / "gpu-check"))
    parser.add_argument("--work", default=str(DEFAULT_WORK), help="folder for the models, runs and logs")
    parser.add_argument("--build-carry", action="store_true", help="build .gpu/ here (scripts/gpu-carry.sh)")
    parser.add_argument(
        "--recipe",
        default=os.environ.get("GPU_RECIPE", str(ROOT.parent / "shared" / "gpu" / MAKE_CARRY)),
        help=f"the shared {MAKE_CARRY} (--build-carry); env GPU_RECIPE",
    )
    parser.add_argument(
        "--lmdeploy-repo",
        default=os.environ.get("LMDEPLOY_REPO", ""),
        help="a checkout or bare clone of InternLM/lmdeploy, for benchmark/profile_*.py (--build-carry); env "
        "LMDEPLOY_REPO",
    )
    args = parser.parse_args(argv)
    if args.build_carry:
        return _build_carry_command(Path(args.recipe), args.lmdeploy_repo)
    paths = Paths(Path(args.work))
    steps = plan(paths)
    if args.dry_run:
        print("\n".join(describe_plan(steps)))
        problems = check_carry(paths.carry, tree_bytes(ROOT))
        print(
            f"Carry {_shown(paths.carry)}: "
            + (
                "; ".join(problems)
                if problems
                else f"{folder_bytes(paths.carry) / MB:.1f} MB, every file the check needs, within the upload limit"
            )
        )
        return 0
    problems = check_carry(paths.carry)
    for problem in problems:
        print(f"carry: {problem}", file=sys.stderr)
    when = datetime.datetime.now(datetime.UTC)
    outcomes = run_check(steps, paths, Path(args.out))
    report = write_report(steps, outcomes, paths, Path(args.out), when, problems)
    print(f"Report: {report}")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


def _build_carry_command(recipe: Path, lmdeploy_repo: str) -> int:
    if not recipe.is_file():
        print(f"error: {recipe} is not there: give the shared {MAKE_CARRY} with --recipe", file=sys.stderr)
        return 2
    if not lmdeploy_repo or not Path(lmdeploy_repo).exists():
        print("error: give a checkout or bare clone of InternLM/lmdeploy with --lmdeploy-repo", file=sys.stderr)
        return 2
    python = str(ROOT / ".venv" / "bin" / "python")
    try:
        problems = build_carry(recipe, Path(lmdeploy_repo), python if Path(python).exists() else sys.executable)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"error: building {_shown(CARRY)} failed: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    for part in CARRY_PARTS:
        print(f"{part.folder:<20} {folder_bytes(CARRY / part.folder) / MB:5.1f} MB  {part.what}")
    print(f"{_shown(CARRY)}: {folder_bytes(CARRY) / MB:.1f} MB in all")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
