"""A roofline verdict: how far a run's numbers are from what the hardware allows, and what holds it back.

Decoding reads every weight once per engine step (the batch shares that read) and each running sequence's
KV cache; `model_cost` derives those bytes, and the FLOPs per token, from a Hugging Face config. With a
run's decode steps per second they give the memory bandwidth it achieved, and with its token rates the
FLOP/s, each as a share of the device's peak (`KNOWN_GPUS`, from vendor datasheets, or on CPU a copy
benchmark measured once per machine and cached). `verdict` names the bound: memory bandwidth, compute
(prefill-heavy) or the host side (scheduling, launches, output handling), with the numbers behind it.

Assumptions: a dense decoder (mixture-of-experts configs are refused); every weight but the embedding table
is read once per step (the embedding only for the rows looked up); the KV cache of each sequence is read in
full once per step; attention FLOPs counted at the run's mean context for every token; logits computed for
output tokens only (prefill keeps the last position's). Pure functions except the copy benchmark.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import re
import time
from pathlib import Path

import numpy as np
import psutil
from filelock import FileLock

from ..csvstore import replace_bytes
from ..errors import ModelError
from ..models.shapes import DecoderSizes, has_qkv_bias, stack_parameters, vocabulary_table_parameters

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
DEFAULT_DTYPE = "bfloat16"

MEMORY_BOUND = "memory-bandwidth bound"
COMPUTE_BOUND = "compute bound (prefill-heavy)"
HOST_BOUND = "host bound"

# Decode kernels that stream weights and KV cache reach 70-90 % of a GPU's datasheet bandwidth at best;
# past half of it, moving bytes is what the step's time is spent on.
MEMORY_BOUND_SHARE = 0.5
# Dense bf16 matrix products reach 60-80 % of the datasheet's (boost clock) tensor peak; at 40 % the tensor
# cores are the limit, which in serving happens when prompts (prefill) dominate the work.
COMPUTE_BOUND_SHARE = 0.4
# NVML's utilisation is the share of time a kernel was running: a GPU that waits half the time for work is
# held back by whoever feeds it, whatever the byte counts say.
HOST_BOUND_GPU_UTIL_PERCENT = 50.0
# An engine step adds one token to each running sequence (a few with speculative decoding); more than two per
# tick in a streamed run means several steps passed between the caller's reads: outputs coalesce on the host.
COALESCED_TOKENS_PER_TICK = 2.0


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """A device's peak memory bandwidth and dense bf16 FLOP/s (None where unknown, e.g. a CPU)."""

    name: str
    bandwidth_bytes_per_s: float
    bf16_flops: float | None


# Vendor datasheets: SXM / PCIe product briefs; dense tensor FLOP/s (the sparse figure is twice these).
KNOWN_GPUS: dict[str, DevicePeak] = {
    "H200": DevicePeak("H200", 4.8e12, 989e12),
    "H100 SXM": DevicePeak("H100 SXM", 3.35e12, 989e12),
    "H100 PCIe": DevicePeak("H100 PCIe", 2.0e12, 756e12),
    "A100 40GB": DevicePeak("A100 40GB", 1.555e12, 312e12),
    "A100 80GB": DevicePeak("A100 80GB", 2.039e12, 312e12),
    "A100 80GB PCIe": DevicePeak("A100 80GB PCIe", 1.935e12, 312e12),
    "L40S": DevicePeak("L40S", 864e9, 362e12),
    "A10": DevicePeak("A10", 600e9, 125e12),
    "RTX 4090": DevicePeak("RTX 4090", 1.008e12, 165e12),  # bf16 with fp32 accumulation, GeForce's rate
}
# How the driver names them (NVML, nvidia-smi, torch), most specific first.
_GPU_NAME_PATTERNS = (
    (r"h200", "H200"),
    (r"h100.*pcie", "H100 PCIe"),
    (r"h100", "H100 SXM"),
    (r"a100.*80gb.*pcie", "A100 80GB PCIe"),
    (r"a100.*80gb", "A100 80GB"),
    (r"a100", "A100 40GB"),
    (r"l40s", "L40S"),
    (r"\ba10\b", "A10"),
    (r"rtx 4090", "RTX 4090"),
)


def gpu_peak(gpu_name: str, table: dict[str, DevicePeak] | None = None) -> DevicePeak | None:
    """The peaks of the GPU the driver calls `gpu_name` ("NVIDIA H100 80GB HBM3"); entries of `table`
    replace or add to KNOWN_GPUS (a table key that occurs in the name matches first). None when unknown."""
    lowered = gpu_name.lower()
    for key, peak in (table or {}).items():
        if key.lower() in lowered:
            return peak
    for pattern, key in _GPU_NAME_PATTERNS:
        if re.search(pattern, lowered):
            return KNOWN_GPUS[key]
    return None


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """What a dense decoder costs per token, from its config and dtype."""

    layers: int
    kv_heads: int
    head_dim: int
    heads: int
    layer_params: int  # every decoder layer's weights together, norms included
    lm_head_params: int  # the output projection (the tied embedding table when tied)
    dtype_bytes: float
    kv_dtype_bytes: float

    @property
    def weight_bytes_per_step(self) -> float:
        """Weights read by one decode step: the layers, the final norm and the output projection."""
        return (self.layer_params + self.lm_head_params) * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> float:
        """One token's keys and values in one layer."""
        return 2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_bytes_per_token_per_layer * self.layers


def model_cost(config: dict, dtype: str = "auto", kv_dtype: str | None = None) -> ModelCost:
    """The cost of the model a Hugging Face config.json describes, its weights in `dtype` ("auto": the
    config's own) and its KV cache in `kv_dtype` (default: the weights' dtype)."""
    text = config.get("text_config") or config
    if any(key in text for key in ("num_experts", "num_local_experts", "n_routed_experts")):
        raise ModelError("The roofline models dense decoders only; this config is a mixture of experts.")
    try:
        hidden, layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
        heads, vocab = int(text["num_attention_heads"]), int(text["vocab_size"])
        intermediate = int(text["intermediate_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"The model's config lacks {exc} for the roofline.") from exc
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    sizes = DecoderSizes(
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        qkv_bias=has_qkv_bias(text.get("model_type"), bool(text.get("attention_bias"))),
    )
    weights = _dtype_bytes(dtype, text)
    return ModelCost(
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        heads=heads,
        layer_params=stack_parameters(sizes),
        lm_head_params=vocabulary_table_parameters(sizes),
        dtype_bytes=weights,
        kv_dtype_bytes=weights if kv_dtype is None else _dtype_bytes(kv_dtype, text),
    )


def _dtype_bytes(dtype: str, config: dict) -> float:
    if dtype == "auto":
        dtype = str(config.get("dtype") or config.get("torch_dtype") or DEFAULT_DTYPE)
    name = dtype.removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ModelError(f"Unknown dtype '{dtype}' for the roofline; choose one of {', '.join(DTYPE_BYTES)}.")
    return DTYPE_BYTES[name]


def mean_decode_context(input_lens: np.ndarray, output_lens: np.ndarray) -> float:
    """The context a decode step sees on average over every output token of every request: a request's k-th
    output token (k from 0) attends over its input plus k tokens."""
    inputs, outputs = np.asarray(input_lens, dtype=float), np.asarray(output_lens, dtype=float)
    tokens = outputs.sum()
    if tokens <= 0:
        return 0.0
    return float((outputs * inputs + outputs * (outputs - 1) / 2).sum() / tokens)


def decode_step_bytes(cost: ModelCost, batch: float, mean_context_len: float) -> float:
    """Bytes one decode step reads: the weights once, and each of `batch` sequences' KV cache."""
    return cost.weight_bytes_per_step + batch * mean_context_len * cost.kv_bytes_per_token


def achieved_bandwidth(step_bytes: float, steps_per_s: float) -> float:
    """Bytes per second moved by decoding at `steps_per_s`."""
    return step_bytes * steps_per_s


def share_of_peak(achieved: float, peak: float | None) -> float | None:
    return None if not peak else achieved / peak


def achieved_flops(
    cost: ModelCost, input_tokens_per_s: float, output_tokens_per_s: float, mean_context_len: float
) -> float:
    """FLOP/s of the run: 2 per weight per token (logits for output tokens only) plus attention's 4 per
    head dimension per context position per layer."""
    attention = 4 * cost.layers * cost.heads * cost.head_dim * mean_context_len
    per_input = 2 * cost.layer_params + attention
    per_output = 2 * (cost.layer_params + cost.lm_head_params) + attention
    return input_tokens_per_s * per_input + output_tokens_per_s * per_output


@dataclasses.dataclass(frozen=True)
class RunNumbers:
    """What the verdict needs from a run. `batch`: sequences decoding at once (the concurrency, or the mean
    in flight); `mean_tokens_per_tick` and `gpu_util_percent` None where not measured."""

    output_tokens_per_s: float
    input_tokens_per_s: float
    batch: float
    mean_context_len: float
    streamed: bool = False
    mean_tokens_per_tick: float | None = None
    gpu_util_percent: float | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    bound: str  # MEMORY_BOUND, COMPUTE_BOUND or HOST_BOUND
    reasons: list[str]  # sentences, the deciding one first
    numbers: dict[str, float | None]  # flat keys with their unit, for a table or the history


def verdict(cost: ModelCost, run: RunNumbers, device: DevicePeak) -> Verdict:
    """Which bound the run hit. A GPU idle half the time is host bound whatever else; otherwise the larger of
    bandwidth and compute pressure (share of peak over its threshold) wins when it reaches 1; a run that
    uses neither is held back on the host side."""
    steps_per_s = run.output_tokens_per_s / run.batch if run.batch > 0 else 0.0
    step_bytes = decode_step_bytes(cost, run.batch, run.mean_context_len)
    bandwidth = achieved_bandwidth(step_bytes, steps_per_s)
    flops = achieved_flops(cost, run.input_tokens_per_s, run.output_tokens_per_s, run.mean_context_len)
    bandwidth_share = bandwidth / device.bandwidth_bytes_per_s  # every known device's is positive
    compute_share = share_of_peak(flops, device.bf16_flops)
    numbers = {
        "weight_bytes_per_step": cost.weight_bytes_per_step,
        "kv_bytes_per_step": step_bytes - cost.weight_bytes_per_step,
        "decode_steps_per_s": steps_per_s,
        "achieved_bandwidth_bytes_per_s": bandwidth,
        "peak_bandwidth_bytes_per_s": device.bandwidth_bytes_per_s,
        "bandwidth_share": bandwidth_share,
        "achieved_flops": flops,
        "peak_flops": device.bf16_flops,
        "compute_share": compute_share,
        "mean_tokens_per_tick": run.mean_tokens_per_tick,
        "gpu_util_percent": run.gpu_util_percent,
    }
    bandwidth_text = (
        f"memory traffic {_bytes(bandwidth)}/s is {bandwidth_share:.0%} of {device.name}'s "
        f"{device.bandwidth_bytes_per_s / 1e9:,.0f} GB/s ({_bytes(step_bytes)} per step x "
        f"{steps_per_s:,.1f} steps/s)"
    )
    compute_text = (
        f"compute {flops / 1e12:,.1f} TFLOP/s is {compute_share:.0%} of the {device.bf16_flops / 1e12:,.0f} "
        f"TFLOP/s bf16 peak"
        if compute_share is not None and device.bf16_flops
        else "the device's peak FLOP/s is unknown"
    )
    host_signs = []
    gpu_waits = run.gpu_util_percent is not None and run.gpu_util_percent < HOST_BOUND_GPU_UTIL_PERCENT
    if gpu_waits:
        host_signs.append(f"the GPU ran kernels {run.gpu_util_percent:.0f}% of the time")
    if run.streamed and run.mean_tokens_per_tick is not None and run.mean_tokens_per_tick > COALESCED_TOKENS_PER_TICK:
        host_signs.append(
            f"{run.mean_tokens_per_tick:,.1f} tokens reached the caller per tick (one per engine step "
            "expected): outputs coalesce on the host"
        )

    if gpu_waits:
        return Verdict(HOST_BOUND, host_signs + [bandwidth_text, compute_text], numbers)
    memory_pressure = bandwidth_share / MEMORY_BOUND_SHARE
    compute_pressure = compute_share / COMPUTE_BOUND_SHARE if compute_share is not None else 0.0
    if max(memory_pressure, compute_pressure) >= 1.0:
        if memory_pressure >= compute_pressure:
            return Verdict(MEMORY_BOUND, [bandwidth_text, compute_text] + host_signs, numbers)
        return Verdict(COMPUTE_BOUND, [compute_text, bandwidth_text] + host_signs, numbers)
    idle_hardware = (
        f"the hardware is not the limit: {bandwidth_text}, under the {MEMORY_BOUND_SHARE:.0%} a "
        f"bandwidth-bound decode reaches; {compute_text}"
    )
    return Verdict(HOST_BOUND, host_signs + [idle_hardware], numbers)


def _bytes(count: float) -> str:
    """A byte count in GB, or MB below one GB (a tiny test model moves megabytes): three significant digits."""
    return f"{count / 1e9:,.3g} GB" if count >= 1e9 else f"{count / 1e6:,.3g} MB"


# On CPU: memory bandwidth measured once per machine.

BANDWIDTH_CACHE_FILE = "memory-bandwidth.json"
COPY_BYTES = 256 * 1024**2  # well past any CPU cache, a few tenths of a second in all
COPY_REPEATS = 4


def measure_copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Bytes per second a single-threaded numpy copy moves (read + write, as STREAM's copy counts it), best of
    `repeats`: the bandwidth one torch CPU thread (the engine's default) can draw on."""
    source = np.ones(nbytes // 8, dtype=np.float64)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return 2 * source.nbytes / best


def machine_key() -> str:
    """What identifies this machine's memory system: the CPU model and the installed RAM."""
    return f"{_cpu_model()} | {psutil.virtual_memory().total / 1024**3:.0f} GiB"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_memory_bandwidth(cache_dir: Path, key: str | None = None) -> DevicePeak:
    """This machine's CPU as a device: its copy bandwidth, measured on first use and kept in `cache_dir`
    (one JSON file, an entry per machine key); no FLOP/s peak. A cache that cannot be written (a read-only mount)
    serves what it holds, and where it holds nothing for this machine the bandwidth is measured for this run alone."""
    key = key or machine_key()
    path = Path(cache_dir) / BANDWIDTH_CACHE_FILE
    entry = kept_bandwidth(path, key)  # no lock to read: the file is only ever replaced whole
    if entry is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Two processes starting at once (a dashboard run and a CLI run) measure once, not side by side.
            with FileLock(str(path) + ".lock"):
                entry = kept_bandwidth(path, key)
                if entry is None:
                    entry = _measured_bandwidth()
                    replace_bytes(path, (json.dumps({**_kept_entries(path), key: entry}, indent=2) + "\n").encode())
        except OSError:
            entry = entry or _measured_bandwidth()
    return DevicePeak(f"CPU ({key})", float(entry["copy_bytes_per_s"]), None)


def kept_bandwidth(path: Path, key: str) -> dict | None:
    """The bandwidth entry the cache file at `path` holds for machine `key`; None where it holds none."""
    entry = _kept_entries(path).get(key)
    return entry if isinstance(entry, dict) and isinstance(entry.get("copy_bytes_per_s"), (int, float)) else None


def _kept_entries(path: Path) -> dict:
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _measured_bandwidth() -> dict:
    return {
        "copy_bytes_per_s": measure_copy_bandwidth(),
        "array_bytes": COPY_BYTES,
        "threads": 1,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# A run's verdict, as the runner records it and the pages and the CLI show it.

NO_ROOFLINE = "No roofline for this model"


def device_peak(device: str, gpu_name: str, cache_dir: Path) -> tuple[DevicePeak, str]:
    """The peaks of the device a run used (the engine's `device`: "cpu", "cuda:0", ...; `gpu_name` as the
    environment records it), with a line saying where they come from; ModelError when unknown."""
    if device.startswith("cpu"):
        cpu = cpu_memory_bandwidth(cache_dir)
        path = Path(cache_dir) / BANDWIDTH_CACHE_FILE
        kept = kept_bandwidth(path, machine_key()) is not None
        return cpu, (
            f"CPU copy bandwidth {cpu.bandwidth_bytes_per_s / 1e9:,.1f} GB/s, "
            + (
                f"measured once per machine and cached in {path}"
                if kept
                else f"measured now ({path} cannot be written)"
            )
        )
    peak_found = gpu_peak(gpu_name or "")
    if peak_found is None:
        raise ModelError(
            f"the peak bandwidth of the device ({device or 'unknown'}, GPU '{gpu_name or 'none'}') is "
            f"not known; known GPUs: {', '.join(KNOWN_GPUS)}"
        )
    return peak_found, (
        f"{peak_found.name} datasheet: {peak_found.bandwidth_bytes_per_s / 1e12:,.2f} TB/s, "
        f"{(peak_found.bf16_flops or 0) / 1e12:,.0f} TFLOP/s dense bf16"
    )


def read_model_config(model_folder: str | Path) -> dict:
    """The config.json of a local model folder; ModelError when there is none (a server's model, a hub id)."""
    if "://" in str(model_folder):  # a server's address, which a Path would fold to "http:/host"
        raise ModelError(f"the model is served from {model_folder}, so its config.json is not here")
    path = Path(model_folder) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"its config.json is not readable here ({path})") from exc


def roofline_record(config: dict, dtype: str, device: DevicePeak, device_note: str, run: RunNumbers) -> dict:
    """The verdict of a run as the run folder keeps it (roofline.json): bound, reasons, numbers, device."""
    found = verdict(model_cost(config, dtype), run, device)
    return {
        "bound": found.bound,
        "reasons": found.reasons,
        "numbers": found.numbers,
        "device": device.name,
        "device_note": device_note,
    }


def describe_roofline(record: dict) -> list[str]:
    """The verdict in a few plain lines: the bound, then the reasons and where the peak came from."""
    if "unavailable" in record:
        return [f"{NO_ROOFLINE}: {record['unavailable']}."]
    return [
        f"Roofline verdict: {record['bound']}.",
        *(f"- {reason}" for reason in record["reasons"]),
        f"- peak: {record['device_note']}",
    ]
