"""Synthetic models: a public architecture's shape with random weights, to benchmark a model size with no download.

A name `synthetic:<preset>` picks a public shape (`SYNTHETIC_PRESETS`); `synthetic:<preset>:layers=4,...`
overrides parts of it, and `synthetic:<architecture>:layers=..,hidden=..,intermediate=..,heads=..,kv_heads=..,
vocab=..` gives a custom shape (`custom_model_name` writes one). `write_synthetic_model` writes the Hugging
Face folder in bfloat16: every tensor drawn from its own seed (its name and the model's seed), so a build is
reproducible and independent of the order tensors are written in, and weights go to disk shard by shard so
that building never holds more than one shard and one tensor in memory (an 8B model is 16 GB in bf16). The
draws are made on the CPU unless a torch device is named (a GPU draws an 8B model in moments where one CPU
core takes minutes; its numbers differ from the CPU's, so the marker records the device).
resolve.py resolves the names into the cache; this module imports nothing of ours but errors and shapes (the
parameter count).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from ..errors import UnknownModel
from . import shapes

SYNTHETIC_PREFIX = "synthetic:"
# Written into every synthetic folder: what the history and the page read to label a random-weight run.
MARKER_FILE = "synthetic.json"
# Bump when the recipe (initialisation, file layout) changes, so that stale cached builds are not reused.
RECIPE_VERSION = 1
SEED = 0
# Hugging Face's own initialisation of linear and embedding weights (`initializer_range`).
INIT_STD = 0.02
# Shards of at most this many bytes: building holds one shard in memory, whatever the model's size.
SHARD_BYTES = 2 * 1024**3
# Random numbers are drawn this many at a time, so a 128k x 4k embedding never exists in float32 whole.
DRAW_CHUNK_ELEMENTS = 32 * 1024**2
BYTES_PER_BF16 = 2

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
CUSTOM_KEYS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")


@dataclasses.dataclass(frozen=True)
class SyntheticShape:
    """What sizes the model: the six numbers of a custom shape plus the architecture's other public settings."""

    architecture: str  # a key of ARCHITECTURES
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    rope_theta: float = 10_000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def decoder_sizes(self) -> shapes.DecoderSizes:
        """The sizes its parameter count follows from."""
        return shapes.DecoderSizes(
            layers=self.layers,
            hidden=self.hidden,
            intermediate=self.intermediate,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            vocab=self.vocab,
            qkv_bias=shapes.has_qkv_bias(self.architecture),
        )

    def hf_config(self) -> dict:
        """The config.json this shape writes (without the tokenizer's special token ids)."""
        # rope_theta and rope_scaling spelled as the public configs spell them, which every loader reads.
        return {
            "architectures": [ARCHITECTURES[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": INIT_STD,
            "dtype": "bfloat16",
        }


# The shapes of the public configs (config.json on the hub), weights aside.
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SYNTHETIC_PRESETS: dict[str, SyntheticShape] = {
    "tiny": SyntheticShape(
        "llama",
        layers=2,
        hidden=64,
        intermediate=128,
        heads=4,
        kv_heads=2,
        vocab=4096,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": SyntheticShape(
        "llama",
        layers=16,
        hidden=2048,
        intermediate=8192,
        heads=32,
        kv_heads=8,
        vocab=128256,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_theta=500_000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 32.0},
    ),
    "llama-3.2-3b": SyntheticShape(
        "llama",
        layers=28,
        hidden=3072,
        intermediate=8192,
        heads=24,
        kv_heads=8,
        vocab=128256,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_theta=500_000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 32.0},
    ),
    "llama-3.1-8b": SyntheticShape(
        "llama",
        layers=32,
        hidden=4096,
        intermediate=14336,
        heads=32,
        kv_heads=8,
        vocab=128256,
        max_position_embeddings=131072,
        rope_theta=500_000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 8.0},
    ),
    "qwen2.5-0.5b": SyntheticShape(
        "qwen2",
        layers=24,
        hidden=896,
        intermediate=4864,
        heads=14,
        kv_heads=2,
        vocab=151936,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        rope_scaling=None,
        rms_norm_eps=1e-6,
    ),
    "qwen2.5-7b": SyntheticShape(
        "qwen2",
        layers=28,
        hidden=3584,
        intermediate=18944,
        heads=28,
        kv_heads=4,
        vocab=152064,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
    ),
}
SYNTHETIC_MODELS = {SYNTHETIC_PREFIX + preset: shape for preset, shape in SYNTHETIC_PRESETS.items()}


def synthetic_name_problems(name: str) -> list[str]:
    """What is wrong with a `synthetic:` name, as sentences (none for a good one or another kind of name), so a
    run is refused before it starts rather than failing when it records its model."""
    if not name.strip().startswith(SYNTHETIC_PREFIX):
        return []
    try:
        parse_synthetic_name(name)
    except UnknownModel as exc:
        return [str(exc)]
    return []


def parse_synthetic_name(name: str) -> SyntheticShape:
    """The shape a `synthetic:` name asks for; UnknownModel names what is wrong and what is accepted."""
    body = name.strip().removeprefix(SYNTHETIC_PREFIX)
    base, _, overrides_text = body.partition(":")
    overrides = _parse_overrides(name, overrides_text)
    if base in SYNTHETIC_PRESETS:
        shape = dataclasses.replace(SYNTHETIC_PRESETS[base], **overrides)
    elif base in ARCHITECTURES:
        if absent := [key for key in CUSTOM_KEYS if key not in overrides]:
            raise UnknownModel(
                f"The custom synthetic model '{name}' lacks {', '.join(absent)}: give all of "
                f"{', '.join(CUSTOM_KEYS)}, e.g. {custom_model_name(SYNTHETIC_PRESETS['tiny'])}."
            )
        shape = SyntheticShape(base, **overrides)
    else:
        raise UnknownModel(
            f"Unknown synthetic model '{name}'; choose one of {', '.join(SYNTHETIC_MODELS)}, or a custom "
            f"shape such as {custom_model_name(SYNTHETIC_PRESETS['tiny'])}."
        )
    _check_shape(name, shape)
    return shape


def custom_model_name(shape: SyntheticShape) -> str:
    """The `synthetic:` name of a custom shape (its architecture and six sizes), which parses back to it."""
    sizes = ",".join(f"{key}={getattr(shape, key)}" for key in CUSTOM_KEYS)
    return f"{SYNTHETIC_PREFIX}{shape.architecture}:{sizes}"


def folder_name(name: str) -> str:
    """The cache folder of synthetic model `name`: readable, one per distinct shape and recipe."""
    shape = parse_synthetic_name(name)
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(shape), sort_keys=True).encode()).hexdigest()[:10]
    base = name.strip().removeprefix(SYNTHETIC_PREFIX).partition(":")[0]
    return f"synthetic-{base}-{digest}-v{RECIPE_VERSION}"


def parameter_count(shape: SyntheticShape) -> int:
    """Parameters of the shape, counted as the Hugging Face model holds them (tied embeddings once)."""
    return shapes.parameter_count(shape.decoder_sizes(), shape.tie_word_embeddings)


def _parse_overrides(name: str, text: str) -> dict[str, Any]:
    """SyntheticShape's keyword arguments that `text` sets, whole numbers of CUSTOM_KEYS."""
    overrides: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in CUSTOM_KEYS or not value.strip().isdigit():
            raise UnknownModel(
                f"'{item}' in synthetic model '{name}' is not a size: write key=number with a key among "
                f"{', '.join(CUSTOM_KEYS)}."
            )
        overrides[key] = int(value)
    return overrides


def _check_shape(name: str, shape: SyntheticShape) -> None:
    problems = [f"{key} must be at least 1" for key in CUSTOM_KEYS if getattr(shape, key) < 1]
    if not problems:
        if shape.hidden % shape.heads:
            problems.append(f"hidden ({shape.hidden}) must be a multiple of heads ({shape.heads})")
        if shape.heads % shape.kv_heads:
            problems.append(f"heads ({shape.heads}) must be a multiple of kv_heads ({shape.kv_heads})")
    if problems:
        raise UnknownModel(f"Synthetic model '{name}': {'; '.join(problems)}.")


def write_synthetic_model(name: str, out: Path, tokenizer_dir: Path, device: str = "cpu") -> None:
    """Write synthetic model `name` to folder `out`: config, the tokenizer of `tokenizer_dir`, sharded bf16
    safetensors drawn on torch `device` and the marker that says the weights are random."""
    from transformers import AutoTokenizer, GenerationConfig

    shape = parse_synthetic_name(name)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    if shape.vocab < len(tokenizer):
        raise UnknownModel(
            f"Synthetic model '{name}' has a vocabulary of {shape.vocab:,} tokens, fewer than the "
            f"built-in tokenizer's {len(tokenizer):,}; give vocab={len(tokenizer)} or more."
        )
    tokenizer.save_pretrained(out)
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = {**shape.hf_config(), **special}
    if shape.architecture == "qwen2":
        config["use_sliding_window"] = False
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    # As the tiny Llama: random weights decode greedily into one repeated token; sampling gives varied text.
    GenerationConfig(do_sample=True, temperature=1.0, top_k=0, **special).save_pretrained(out)
    _write_weights(out, device)
    marker = {
        "random_weights": True,
        "shape": dataclasses.asdict(shape),
        "parameters": parameter_count(shape),
        "seed": SEED,
        "recipe_version": RECIPE_VERSION,
        "device": device,
    }
    (out / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def read_marker(folder: str | Path) -> dict | None:
    """The synthetic marker of a model folder, or None for a folder of real weights (or an unreadable marker)."""
    try:
        return json.loads((Path(folder) / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_weights(out: Path, device: str) -> None:
    """Draw every tensor the architecture in `out`/config.json holds on `device` and write them in shards with an
    index, one shard in memory."""
    from safetensors.torch import save_file

    tensors = _tensor_shapes(out)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    shard_bytes = 0
    for tensor_name, size in tensors:
        nbytes = _elements(size) * BYTES_PER_BF16
        if shards[-1] and shard_bytes + nbytes > SHARD_BYTES:
            shards.append([])
            shard_bytes = 0
        shards[-1].append((tensor_name, size))
        shard_bytes += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for number, shard in enumerate(shards, start=1):
        file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        data = {tensor_name: _draw(tensor_name, size, device).cpu() for tensor_name, size in shard}
        save_file(data, str(out / file_name), metadata={"format": "pt"})
        (out / file_name).chmod(0o644)  # safetensors writes it private; the cache is shared like the rest
        total += sum(t.numel() * BYTES_PER_BF16 for t in data.values())
        del data
        weight_map.update({tensor_name: file_name for tensor_name, _ in shard})
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def _tensor_shapes(folder: Path) -> list[tuple[str, tuple[int, ...]]]:
    """The names and shapes of the weights the folder's config loads, read from a model built on the meta
    device (no memory), less the tied copies that save_pretrained leaves out."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if config.tie_word_embeddings else set()
    return [(key, tuple(value.shape)) for key, value in model.state_dict().items() if key not in tied]


def _elements(size: tuple[int, ...]) -> int:
    count = 1
    for dim in size:
        count *= dim
    return count


def _draw(tensor_name: str, size: tuple[int, ...], device: str = "cpu"):
    """One tensor in bf16 on `device`: norms ones and biases zeros (as Hugging Face initialises them), matrices
    drawn from N(0, INIT_STD) with a generator seeded by the tensor's name, in chunks so float32 never holds it
    whole."""
    import torch

    if tensor_name.endswith("norm.weight"):
        return torch.ones(size, dtype=torch.bfloat16, device=device)
    if tensor_name.endswith(".bias"):
        return torch.zeros(size, dtype=torch.bfloat16, device=device)
    flat = torch.empty(_elements(size), dtype=torch.bfloat16, device=device)
    seed = int.from_bytes(hashlib.sha256(f"{SEED}:{tensor_name}".encode()).digest()[:8], "little")
    generator = torch.Generator(device=device).manual_seed(seed)
    for start in range(0, flat.numel(), DRAW_CHUNK_ELEMENTS):
        chunk = flat[start : start + DRAW_CHUNK_ELEMENTS]
        chunk.copy_(torch.randn(chunk.numel(), generator=generator, device=device) * INIT_STD)
    return flat.view(size)
