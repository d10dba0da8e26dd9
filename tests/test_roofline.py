"""The roofline: bytes and FLOPs from a model's config, shares of a device's peak, and the verdict."""

import json

import pytest

from bench_core.errors import ModelError
from bench_core.hardware import roofline
from bench_core.hardware.roofline import (
    COMPUTE_BOUND,
    HOST_BOUND,
    MEMORY_BOUND,
    RunNumbers,
    gpu_peak,
    model_cost,
    verdict,
)
from bench_core.models.synthetic import SYNTHETIC_PRESETS, parameter_count

LLAMA_1B = SYNTHETIC_PRESETS["llama-3.2-1b"].hf_config()
LLAMA_8B = SYNTHETIC_PRESETS["llama-3.1-8b"].hf_config()


def test_a_decode_step_reads_every_weight_but_the_embedding_table():
    cost = model_cost(LLAMA_1B, "bfloat16")
    # Llama 3.2 1B: 1.236 B parameters, the tied 128,256 x 2,048 table read once as the output projection.
    assert cost.weight_bytes_per_step == 2 * parameter_count(SYNTHETIC_PRESETS["llama-3.2-1b"])
    untied = model_cost(LLAMA_8B, "bfloat16")
    embedding = 128256 * 4096
    assert untied.weight_bytes_per_step == 2 * (parameter_count(SYNTHETIC_PRESETS["llama-3.1-8b"]) - embedding)
    assert model_cost(LLAMA_8B, "int4").weight_bytes_per_step == untied.weight_bytes_per_step / 4


def test_kv_bytes_follow_the_grouped_query_heads():
    cost = model_cost(LLAMA_1B)  # auto: the config's bfloat16
    assert cost.kv_bytes_per_token_per_layer == 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, 2 bytes
    assert cost.kv_bytes_per_token == 16 * 2048
    assert model_cost(LLAMA_1B, kv_dtype="int8").kv_bytes_per_token_per_layer == 2 * 8 * 64
    assert roofline.decode_step_bytes(cost, batch=4, mean_context_len=1000) == (
        cost.weight_bytes_per_step + 4 * 1000 * 32768
    )


def test_the_mean_decode_context_weighs_every_output_token():
    # One request of 100 + 4 tokens sees 100..103; one of 10 + 2 sees 10, 11: (406 + 21) / 6.
    assert roofline.mean_decode_context([100, 10], [4, 2]) == pytest.approx(427 / 6)
    assert roofline.mean_decode_context([5], [0]) == 0.0


def test_the_issues_1b_llama_on_an_h200_is_host_bound():
    # Measured on an H200: batch 128, about 8,000 output tok/s, 51 tokens per tick in a streamed run.
    run = RunNumbers(
        output_tokens_per_s=8000,
        input_tokens_per_s=9000,
        batch=128,
        mean_context_len=450,
        streamed=True,
        mean_tokens_per_tick=51.0,
    )
    result = verdict(model_cost(LLAMA_1B), run, gpu_peak("NVIDIA H200"))
    assert result.bound == HOST_BOUND
    numbers = result.numbers
    assert numbers["decode_steps_per_s"] == 62.5
    assert numbers["weight_bytes_per_step"] == pytest.approx(2.47e9, rel=0.01)
    # 4.4 GB a step (weights and 128 x 450 tokens of KV) x 62.5 steps: 270 GB/s, about 6 % of 4.8 TB/s.
    assert 0.04 < numbers["bandwidth_share"] < 0.08
    assert numbers["compute_share"] < 0.1
    assert "51.0 tokens reached the caller per tick" in result.reasons[0]
    assert "6% of H200's 4,800 GB/s" in result.reasons[1]


def test_a_long_context_8b_decode_near_peak_bandwidth_is_memory_bound():
    run = RunNumbers(
        output_tokens_per_s=4600,
        input_tokens_per_s=500,
        batch=64,
        mean_context_len=2000,
        streamed=True,
        mean_tokens_per_tick=1.0,
        gpu_util_percent=97,
    )
    result = verdict(model_cost(LLAMA_8B), run, gpu_peak("NVIDIA H100 80GB HBM3"))
    assert result.bound == MEMORY_BOUND
    assert 0.6 < result.numbers["bandwidth_share"] < 0.75
    assert result.reasons[0].startswith("memory traffic")


def test_a_prefill_heavy_run_is_compute_bound():
    run = RunNumbers(
        output_tokens_per_s=300, input_tokens_per_s=12000, batch=8, mean_context_len=3000, gpu_util_percent=99
    )
    result = verdict(model_cost(LLAMA_8B), run, gpu_peak("NVIDIA A100-SXM4-80GB"))
    assert result.bound == COMPUTE_BOUND
    assert result.numbers["compute_share"] > roofline.COMPUTE_BOUND_SHARE > 0
    assert result.numbers["compute_share"] / roofline.COMPUTE_BOUND_SHARE > (
        result.numbers["bandwidth_share"] / roofline.MEMORY_BOUND_SHARE
    )


def test_a_gpu_idle_half_the_time_is_host_bound_whatever_the_bytes_say():
    run = RunNumbers(
        output_tokens_per_s=4600, input_tokens_per_s=500, batch=64, mean_context_len=2000, gpu_util_percent=30
    )
    result = verdict(model_cost(LLAMA_8B), run, gpu_peak("NVIDIA H100 80GB HBM3"))
    assert result.bound == HOST_BOUND
    assert result.reasons[0] == "the GPU ran kernels 30% of the time"


@pytest.mark.parametrize(
    "driver_name, known",
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ],
)
def test_driver_names_find_their_datasheet_peaks(driver_name, known):
    assert gpu_peak(driver_name) == roofline.KNOWN_GPUS[known]


def test_a_table_entry_overrides_the_datasheet_and_unknown_gpus_have_none():
    mine = roofline.DevicePeak("H200 (measured)", 4.1e12, 900e12)
    assert gpu_peak("NVIDIA H200", {"H200": mine}) == mine
    assert gpu_peak("NVIDIA T4") is None


def test_configs_the_roofline_cannot_model_are_one_model_error():
    with pytest.raises(ModelError, match="mixture of experts"):
        model_cost({**LLAMA_1B, "num_local_experts": 8})
    with pytest.raises(ModelError, match="intermediate_size"):
        model_cost({key: value for key, value in LLAMA_1B.items() if key != "intermediate_size"})
    with pytest.raises(ModelError, match="Unknown dtype 'float64'"):
        model_cost(LLAMA_1B, "float64")


def test_a_servers_model_is_named_by_its_whole_address():
    with pytest.raises(ModelError) as unavailable:
        roofline.read_model_config("http://127.0.0.1:23333/v1")
    assert (
        str(unavailable.value) == "the model is served from http://127.0.0.1:23333/v1, so its config.json is not here"
    )


@pytest.mark.slow
def test_cpu_bandwidth_is_measured_once_per_machine_and_then_read_back(tmp_path, monkeypatch):
    measured = []
    real_measure = roofline.measure_copy_bandwidth
    monkeypatch.setattr(roofline, "measure_copy_bandwidth", lambda: measured.append(1) or real_measure())
    first = roofline.cpu_memory_bandwidth(tmp_path)
    # A copy streams at hundreds of MB/s at the very least and no CPU reaches 1 TB/s on one thread.
    assert 1e8 < first.bandwidth_bytes_per_s < 1e12 and first.bf16_flops is None
    cached = json.loads((tmp_path / roofline.BANDWIDTH_CACHE_FILE).read_text())
    assert list(cached) == [roofline.machine_key()]
    assert roofline.cpu_memory_bandwidth(tmp_path) == first and len(measured) == 1
    roofline.cpu_memory_bandwidth(tmp_path, key="another machine | 64 GiB")
    assert len(measured) == 2 and len(json.loads((tmp_path / roofline.BANDWIDTH_CACHE_FILE).read_text())) == 2


def test_a_tiny_cpu_run_is_host_bound_on_its_measured_bandwidth(tmp_path):
    cpu = roofline.cpu_memory_bandwidth(tmp_path)
    tiny = SYNTHETIC_PRESETS["tiny"].hf_config()
    result = verdict(model_cost(tiny), RunNumbers(50, 200, 4, 100), cpu)
    assert result.bound == HOST_BOUND and result.numbers["compute_share"] is None
    assert "peak FLOP/s is unknown" in result.reasons[-1]
