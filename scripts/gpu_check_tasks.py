"""The GPU check's commands that need the project, torch or a GPU; scripts/gpu_check.py runs each as a process of its
own under its time limit (and build-carry runs export-sharegpt here).

    python scripts/gpu_check_tasks.py build-model PRESET OUT [--device cuda]
    python scripts/gpu_check_tasks.py build-draft TARGET OUT [--device cuda]
    python scripts/gpu_check_tasks.py worker-run pipeline|throughput DATASET MODEL [the command's flags]
    python scripts/gpu_check_tasks.py sweep-run pipeline DATASET MODEL [sweep pipeline's flags]
    python scripts/gpu_check_tasks.py record-lmdeploy RESULTS CSV_FOLDER WORK
    python scripts/gpu_check_tasks.py export-sharegpt OUT COUNT
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from gpu_check import RESULT_MARKER


def build_model(preset: str, out: Path, device: str) -> None:
    """A synthetic preset's folder (the project's shape, tokenizer and marker), its weights drawn on `device`; made
    in a folder beside `out` and renamed, so `out` only ever appears whole."""
    from bench_core.models.resolve import TOKENIZER_SOURCE, resolve_model
    from bench_core.models.synthetic import SYNTHETIC_PREFIX, write_synthetic_model

    partial = _fresh(out.with_name(out.name + ".partial"))
    write_synthetic_model(SYNTHETIC_PREFIX + preset, partial, Path(resolve_model(TOKENIZER_SOURCE)), device)
    partial.rename(out)
    print(f"built {SYNTHETIC_PREFIX}{preset} on {device} in {out}")


# An Eagle draft as LMDeploy's PyTorch engine loads it (lmdeploy/pytorch/models/llama_eagle.py): one decoder layer
# without its input norm, an `fc` from the embedding and the target's hidden state (2 x hidden) to hidden, no final
# norm and no lm_head (the target's computes the logits); names without the `model.` prefix, which its loader adds.
DRAFT_LAYER = (
    ("self_attn.q_proj.weight", ("q", "hidden")),
    ("self_attn.k_proj.weight", ("kv", "hidden")),
    ("self_attn.v_proj.weight", ("kv", "hidden")),
    ("self_attn.o_proj.weight", ("hidden", "q")),
    ("mlp.gate_proj.weight", ("intermediate", "hidden")),
    ("mlp.up_proj.weight", ("intermediate", "hidden")),
    ("mlp.down_proj.weight", ("hidden", "intermediate")),
    ("post_attention_layernorm.weight", ("hidden",)),
)


def draft_tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The draft's tensors and shapes for a Llama target's config.json."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    sizes = {
        "hidden": config["hidden_size"],
        "intermediate": config["intermediate_size"],
        "q": config["num_attention_heads"] * head_dim,
        "kv": config["num_key_value_heads"] * head_dim,
    }
    shapes = {"embed_tokens.weight": (config["vocab_size"], sizes["hidden"])}
    shapes.update({f"layers.0.{name}": tuple(sizes[dim] for dim in dims) for name, dims in DRAFT_LAYER})
    shapes["fc.weight"] = (sizes["hidden"], 2 * sizes["hidden"])
    return shapes


def build_draft(target: Path, out: Path, device: str) -> None:
    """A random one-layer Eagle draft for the Llama in `target`: LMDeploy runs it as `--speculative-algorithm eagle`."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    partial = _fresh(out.with_name(out.name + ".partial"))
    draft_config = {**config, "num_hidden_layers": 1, "tie_word_embeddings": False}
    (partial / "config.json").write_text(json.dumps(draft_config, indent=2) + "\n", encoding="utf-8")
    generator = torch.Generator(device=device).manual_seed(0)
    tensors = {
        name: (
            torch.ones(shape, dtype=torch.bfloat16, device=device)
            if name.endswith("norm.weight")
            else (torch.randn(shape, generator=generator, device=device) * 0.02).to(torch.bfloat16)
        ).cpu()
        for name, shape in draft_tensor_shapes(config).items()
    }
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    partial.rename(out)
    print(f"built an Eagle draft ({sum(t.numel() for t in tensors.values()) / 1e6:.0f} M parameters) in {out}")


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def worker_run(argv: Sequence[str]) -> int:
    """The `pipeline` or `throughput` command's run (its own flags, `argv[0]` naming it) through the dashboard's
    runner, the engine in a worker process; prints RESULT_MARKER and the run's result as JSON: its id, state, LMDeploy
    row (the columns LMDeploy's scripts write), our metrics and the roofline verdict."""
    from bench_core.cli import build_parser, commands
    from bench_core.cli.common import open_history
    from bench_core.errors import BenchError
    from bench_core.hardware.roofline import describe_roofline
    from bench_core.run.engine_process import ProcessRunner
    from bench_core.states import RunState

    chosen = {command.name: command for command in commands()}.get(argv[0] if argv else "")
    if chosen is None or argv[0] not in ("pipeline", "throughput"):
        print("error: worker-run takes pipeline or throughput, then that command's arguments", file=sys.stderr)
        return 2
    args = build_parser((chosen,)).parse_args(argv)
    history = open_history(args.results)
    runner = ProcessRunner(history)
    try:
        run = runner.submit(chosen.build_config(args))
        run.wait()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        runner.shutdown()
    record = run.record
    result = {
        "run_id": run.run_id,
        "state": str(run.state),
        "message": run.message,
        "lmdeploy": dict(record.lmdeploy_columns) if record else {},
        "metrics": dict(record.metrics) if record else {},
        "roofline": describe_roofline(record.roofline) if record and record.roofline else [],
    }
    print(f"{run.state}: {run.message}" if run.message else str(run.state))
    print(RESULT_MARKER + json.dumps(result, default=str))
    return 0 if record is not None and run.state == RunState.FINISHED else 1


def sweep_run(argv: Sequence[str]) -> int:
    """`python -m bench_core sweep` with `argv`, in this process; prints what the sweep printed (its tables and
    sentences: its progress and warnings go to stderr), then RESULT_MARKER with that printout as JSON. Its exit code
    is the sweep's."""
    from bench_core.cli import main as cli_main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli_main(["sweep", *argv])
    print(printed.getvalue(), end="")
    print(RESULT_MARKER + json.dumps({"exit_code": code, "printed": printed.getvalue()}))
    return code


def record_lmdeploy(results: Path, csv_folder: Path, work: Path) -> int:
    """Import every CSV LMDeploy's scripts wrote in `csv_folder` into the history at `results` (a row each becomes
    a run), export the whole history to `work`/history.csv, and print RESULT_MARKER with the imported run ids by
    file."""
    from bench_core.cli import main as cli_main
    from bench_core.cli.common import open_history

    results.mkdir(parents=True, exist_ok=True)  # no run of ours may have been recorded
    history = open_history(str(results))
    imported = {str(path): history.import_csv(path) for path in sorted(csv_folder.glob("*.csv"))}
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["history", "export", "--results", str(results), "--output", str(work / "history.csv")])
    print(f"imported {sum(len(ids) for ids in imported.values())} rows of {len(imported)} files; export exit {code}")
    print(RESULT_MARKER + json.dumps({"imported": imported}))
    return code


def export_sharegpt(out: Path, count: int) -> None:
    """The built-in ShareGPT's first `count` complete conversations, first two turns each (all that LMDeploy's
    scripts and ours sample from), as a JSON file both read."""
    from bench_core.load.datasets import BUILTIN_SHAREGPT, load_records

    records = load_records(BUILTIN_SHAREGPT).records[:count]
    trimmed = [{**record, "conversations": record["conversations"][:2]} for _, record in records]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trimmed, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {len(trimmed)} conversations to {out}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker-run"]:
        return worker_run(argv[1:])
    if argv[:1] == ["sweep-run"]:
        return sweep_run(argv[1:])
    parser = argparse.ArgumentParser(prog="gpu_check_tasks.py")
    tasks = parser.add_subparsers(dest="task", required=True)
    for name, target in (("build-model", "preset"), ("build-draft", "target")):
        task = tasks.add_parser(name)
        task.add_argument(target)
        task.add_argument("out", type=Path)
        task.add_argument("--device", default="cuda")
    record = tasks.add_parser("record-lmdeploy")
    for name in ("results", "csv_folder", "work"):
        record.add_argument(name, type=Path)
    export = tasks.add_parser("export-sharegpt")
    export.add_argument("out", type=Path)
    export.add_argument("count", type=int)
    args = parser.parse_args(argv)
    if args.task == "build-model":
        build_model(args.preset, args.out, args.device)
    elif args.task == "build-draft":
        build_draft(Path(args.target), args.out, args.device)
    elif args.task == "record-lmdeploy":
        return record_lmdeploy(args.results, args.csv_folder, args.work)
    else:
        export_sharegpt(args.out, args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
