"""Synthetic models: public shapes with random weights, built into the cache on first use."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench_core.errors import ModelError
from bench_core.models import resolve as models
from bench_core.models import synthetic as synthetic_models
from bench_core.models.synthetic import SYNTHETIC_PRESETS, custom_model_name, parameter_count, parse_synthetic_name

ROOT = Path(__file__).resolve().parent.parent
TINY = "synthetic:tiny"


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def cache(monkeypatch, tmp_path, tiny_model_path):
    """An empty model cache holding only the tiny Llama (the synthetic models' tokenizer), so builds are seen."""
    target = tmp_path / "cache"
    target.mkdir()
    (target / Path(tiny_model_path).name).symlink_to(tiny_model_path)
    monkeypatch.setenv("BENCH_STUDIO_CACHE", str(target))
    return target


def test_the_public_shapes_have_their_published_sizes():
    # Parameter counts as the model cards give them.
    published = {
        "llama-3.2-1b": 1.24,
        "llama-3.2-3b": 3.21,
        "llama-3.1-8b": 8.03,
        "qwen2.5-0.5b": 0.49,
        "qwen2.5-7b": 7.62,
    }
    assert {preset: round(parameter_count(SYNTHETIC_PRESETS[preset]) / 1e9, 2) for preset in published} == published
    assert {"synthetic:llama-3.2-1b", "synthetic:llama-3.1-8b", "synthetic:qwen2.5-7b", TINY} <= set(
        synthetic_models.SYNTHETIC_MODELS
    )


def test_a_custom_name_parses_back_to_its_shape():
    shape = parse_synthetic_name("synthetic:qwen2:layers=3,hidden=96,intermediate=160,heads=6,kv_heads=2,vocab=5000")
    assert (shape.architecture, shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.vocab) == (
        "qwen2",
        3,
        96,
        6,
        2,
        5000,
    )
    assert parse_synthetic_name(custom_model_name(shape)) == shape
    overridden = parse_synthetic_name("synthetic:llama-3.1-8b:layers=2")
    assert overridden.layers == 2 and overridden.hidden == 4096


@pytest.mark.parametrize(
    "name, words",
    [
        ("synthetic:gpt-9", "choose one of synthetic:tiny"),
        ("synthetic:llama:layers=2,hidden=64", "lacks intermediate, heads, kv_heads, vocab"),
        ("synthetic:tiny:depth=3", "'depth=3'"),
        ("synthetic:tiny:heads=3", "hidden (64) must be a multiple of heads (3)"),
        ("synthetic:tiny:kv_heads=0", "kv_heads must be at least 1"),
    ],
)
def test_a_bad_synthetic_name_is_one_model_error(name, words, cache):
    with pytest.raises(ModelError) as caught:
        models.resolve_model(name)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert not [p for p in cache.iterdir() if p.name.startswith("synthetic")], "nothing is built for a bad name"


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(cache):
    with pytest.raises(ModelError, match="give vocab=4096 or more"):
        models.resolve_model("synthetic:tiny:vocab=1000")
    assert not [p for p in cache.iterdir() if p.name.startswith("synthetic") and p.is_dir()]


def test_a_synthetic_model_is_built_once_and_then_reused_from_the_cache(cache):
    assert not models.synthetic_is_built(TINY)
    folder = Path(models.resolve_model(TINY))
    assert folder.parent == cache and models.synthetic_is_built(TINY)
    built_at = (folder / "model.safetensors").stat().st_mtime_ns
    assert models.resolve_model(TINY) == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == built_at
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["num_hidden_layers"] == 2
    assert (folder / "model.safetensors").stat().st_mode & 0o044 == 0o044, "readable by every user of the cache"
    assert not list(cache.glob("*.partial"))


def test_the_first_use_is_announced_until_the_model_is_built(cache):
    assert models.first_use_phase("synthetic:llama-3.1-8b") == (
        "building synthetic:llama-3.1-8b with random weights, once (8.03 B parameters, 16.1 GB in bfloat16)"
    )
    assert models.first_use_phase(TINY).startswith("building synthetic:tiny with random weights")
    models.resolve_model(TINY)
    assert models.first_use_phase(TINY) is None
    assert models.first_use_phase("builtin:tiny-llama") is None  # linked into this cache, built
    assert models.known_context_window("synthetic:llama-3.2-1b") == 131072
    assert models.known_context_window("synthetic:qwen2.5-7b:layers=2") == 32768
    assert models.known_context_window("builtin:tiny-llama") == 2048
    assert models.known_context_window("some/hub-model") is None


@pytest.mark.slow
def test_two_builds_write_identical_weights(tmp_path, tiny_model_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        out.mkdir()
        synthetic_models.write_synthetic_model(TINY, out, Path(tiny_model_path))
    assert _digests(first) == _digests(second)
    other_shape = tmp_path / "c"
    other_shape.mkdir()
    synthetic_models.write_synthetic_model("synthetic:tiny:layers=3", other_shape, Path(tiny_model_path))
    assert _digests(other_shape)["model.safetensors"] != _digests(first)["model.safetensors"]


def test_a_sharded_build_loads_with_the_weights_of_an_unsharded_one(tmp_path, tiny_model_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    name = "synthetic:qwen2:layers=2,hidden=64,intermediate=96,heads=4,kv_heads=2,vocab=4200"
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    whole.mkdir()
    sharded.mkdir()
    synthetic_models.write_synthetic_model(name, whole, Path(tiny_model_path))
    monkeypatch.setattr(synthetic_models, "SHARD_BYTES", 64 * 1024)
    synthetic_models.write_synthetic_model(name, sharded, Path(tiny_model_path))
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    a = AutoModelForCausalLM.from_pretrained(whole, local_files_only=True)
    b = AutoModelForCausalLM.from_pretrained(sharded, local_files_only=True)
    assert a.dtype == torch.bfloat16 and sum(p.numel() for p in a.parameters()) == parameter_count(
        parse_synthetic_name(name)
    )
    for (key, left), (_, right) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(left, right), key
    assert a.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v biases are there


def test_the_record_says_the_weights_are_random(cache):
    record = models.describe_model(TINY)
    assert (record.kind, record.random_weights, record.parameters) == ("synthetic", True, 336_192)
    assert not models.synthetic_is_built(TINY), "describing a model builds nothing"
    by_path = models.describe_model(models.resolve_model(TINY))
    assert (by_path.kind, by_path.random_weights, by_path.parameters) == ("synthetic", True, 336_192)
    assert models.describe_model("builtin:tiny-llama").random_weights
    assert not models.describe_model("builtin:smollm2-135m").random_weights
    assert not models.describe_model(str(ROOT)).random_weights


@pytest.mark.slow
def test_a_tiny_synthetic_model_generates_tokens_through_the_transformers_engine(cache, tmp_path):
    results = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "bench_core",
        "pipeline",
        "builtin:sample",
        TINY,
        "--backend",
        "transformers",
        "--num-prompts",
        "2",
        "--sharegpt-output-len",
        "4",
        "--csv",
        "",
        "--results",
        str(results),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Successful requests                              2" in done.stdout
    assert "Total generated tokens                           8" in done.stdout
    assert models.synthetic_is_built(TINY)


@pytest.mark.slow
def test_a_bad_synthetic_name_is_refused_before_the_run_in_one_line(cache, tmp_path):
    """It used to start the run, which then broke recording its model: a traceback and nothing saved."""
    results = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "bench_core",
        "pipeline",
        "builtin:sample",
        "synthetic:llama:layers=abc",
        "--backend",
        "transformers",
        "--num-prompts",
        "2",
        "--csv",
        "",
        "--results",
        str(results),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: 'layers=abc' in synthetic model 'synthetic:llama:layers=abc' is not "
        "a size: write key=number with a key among layers, hidden, intermediate, "
        "heads, kv_heads, vocab."
    ]
    assert not (results / "history.csv").exists()
