"""`python -m bench_core doctor [--smoke]` on this CPU machine, for real: the versions it reports are the installed
ones, transformers is available, turbomind and pytorch answer with their reason, and --smoke benchmarks the embedded
engine through the dashboard's worker process and records the run."""

from __future__ import annotations

import platform

import pytest
import torch
import transformers
from openai_server import free_port, serving, vllm_like
from test_cli import run_cli

from bench_core.store.history import History

# Each test here runs a real engine, server, app script or process for seconds: not in the fast suite.
pytestmark = pytest.mark.slow


def _lines(text: str) -> dict[str, str]:
    """Each indented row of a part of the report by its first word."""
    return {line.split()[0]: line.strip() for line in text.splitlines() if line.startswith("  ")}


def test_doctor_reports_the_software_the_gpus_and_why_a_backend_cannot_run(tmp_path):
    proc = run_cli("doctor", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # ready: the embedded engine runs here
    out = proc.stdout
    assert [line for line in out.splitlines() if not line.startswith(" ")][1:] == ["Software", "GPUs", "Backends"]
    rows = _lines(out.split("Backends\n", 1)[0])
    assert rows["Python"].split()[1] == platform.python_version()
    assert rows["torch"].split()[1] == torch.__version__ and rows["transformers"].split()[1] == transformers.__version__
    assert " ".join(rows["CUDA"].split()) == "CUDA torch sees no GPU (torch.cuda.is_available() is False)"
    backends = out.split("Backends\n", 1)[1]
    assert "  transformers  available\n" in backends
    for name in ("turbomind", "pytorch"):
        (line,) = [line for line in backends.splitlines() if line.split()[0] == name]
        assert "unavailable: " in line and "use the transformers backend" in line  # the reason and the fix
    assert "TurboMind extension" in out and "Not ready" not in out
    assert not (tmp_path / "results").exists()  # without --smoke nothing is recorded


def test_doctor_smoke_benchmarks_each_available_backend_in_the_worker_process(tmp_path, tiny_model_path):
    proc = run_cli("doctor", "--smoke", "--model", "builtin:tiny-llama", "--results", "results", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("Backends\n", 1)[1]
    assert "Smoke run on transformers (builtin:tiny-llama, worker process)" in out
    assert "turbomind" not in out.split("Smoke run", 1)[1]  # only what is available is smoked
    (row,) = History(tmp_path / "results").load().to_dict("records")
    assert (row["backend"], row["label"], row["status"], row["stream_output"]) == (
        "transformers",
        "doctor --smoke",
        "finished",
        True,
    )
    assert f"{row['output_throughput']:,.1f} output tok/s, {row['completed']}/{row['total_requests']} requests" in out
    assert "Roofline verdict:" in out
    assert f"recorded as run {row['run_id']} in results/history.csv" in out


def test_doctor_help_documents_its_exit_codes(tmp_path):
    proc = run_cli("doctor", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert "exit codes:" in proc.stdout and "4    not ready" in proc.stdout and "130" in proc.stdout


def test_doctor_checks_a_server_as_the_run_page_does(tmp_path):
    """--server URL: the Run page's Test connection in the terminal; a server that is not there is "not ready"."""
    with serving(vllm_like("served-model", metrics=True, answer_as="short")) as url:
        proc = run_cli("doctor", "--server", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    server = proc.stdout.split(f"Server {url}\n", 1)[1]
    assert "  Models served       served-model\n" in server
    assert '  Server kind         vllm, detected from /v1/models (owned_by "vllm")\n' in server
    assert "  Metrics (/metrics)  available (Running requests, Waiting requests)\n" in server
    assert (
        "  ignore_eos          not honoured: asked for 4 tokens with ignore_eos, the server stopped at EOS after 2"
        in server
    )

    proc = run_cli("doctor", "--server", f"http://127.0.0.1:{free_port()}", "--server-kind", "vllm", cwd=tmp_path)
    assert proc.returncode == 4
    assert "  Server              Cannot reach http://127.0.0.1:" in proc.stdout
