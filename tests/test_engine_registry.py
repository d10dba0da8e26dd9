"""The backend registry: which backends it finds, that a new backend is one new module, that asking about
one backend imports none of the others' libraries, and that the run config imports nothing of the engines."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench_core import config, engines
from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.errors import ConfigError, EngineUnavailable
from bench_core.run.runner import Runner
from bench_core.store.history import History

BACKENDS = ("turbomind", "pytorch", "transformers", "openai")  # as the sidebar lists them

ROOT = Path(__file__).resolve().parent.parent

# A backend as someone adding one would write it: one module, named *_engine, in bench_core/engines/.
TOY_ENGINE_MODULE = '''
import time

from bench_core.engines.base import Backend, Engine, EngineEvent, EngineInfo
from bench_core.models.resolve import load_tokenizer


class ToyEngine(Engine):
    """Answers every request at once with the tokens it asked for: a stand-in engine, no model behind it."""

    info = EngineInfo("toy", "toy-model", "", "none", "nowhere")

    @property
    def tokenizer(self):
        return load_tokenizer("builtin:tiny-llama")

    def stream(self, requests, generation, load, cancel):
        for index, request in enumerate(requests):
            yield EngineEvent(index, "tokens", time.perf_counter(), n_tokens=request.output_len)
            yield EngineEvent(
                index, "finish", time.perf_counter(), n_tokens=request.output_len, finish_reason="length"
            )


class ToyBackend(Backend):
    names = ("toy", "toy-gpu")
    tokenizer_from_engine = True

    @classmethod
    def availability(cls, backend):
        return "The toy-gpu backend needs a toy GPU." if backend == "toy-gpu" else None

    @classmethod
    def validate(cls, engine, load):
        return [] if engine.model == "toy-model" else ["The toy backend serves toy-model only."]

    @classmethod
    def settings_key(cls, engine, load):
        return (engine.model,)

    @classmethod
    def load(cls, engine, load):
        return ToyEngine()
'''


@pytest.fixture
def toy_backend_module(tmp_path, monkeypatch):
    """bench_core/engines/ with one more module in it, toy_engine.py (kept in tmp_path)."""
    (tmp_path / "toy_engine.py").write_text(TOY_ENGINE_MODULE)
    monkeypatch.setattr(engines, "__path__", [*engines.__path__, str(tmp_path)])
    engines._registry.cache_clear()
    yield
    sys.modules.pop("bench_core.engines.toy_engine", None)
    engines._registry.cache_clear()


def test_the_registry_lists_exactly_the_four_backends_with_their_availability():
    registered = engines.backends()
    assert tuple(registered) == BACKENDS
    assert registered["turbomind"] is registered["pytorch"]  # LMDeploy's two engines, one backend class
    assert engines.availability("transformers") is None and engines.availability("openai") is None
    for name in ("turbomind", "pytorch"):  # a GPU machine with LMDeploy says None; this one says why not
        reason = engines.availability(name)
        assert reason is None or (name in reason and "\n" not in reason)
    assert [engines.tokenizer_from_engine(name) for name in BACKENDS] == [False, False, False, True]


def test_an_unknown_backend_is_one_config_error_naming_the_choices():
    with pytest.raises(
        ConfigError, match=r"^Unknown backend 'vllm'; choose one of turbomind, pytorch, transformers, openai\.$"
    ):
        engines.availability("vllm")


def test_a_new_backend_is_one_new_module_that_the_registry_finds(toy_backend_module):
    assert tuple(engines.backends()) == (*BACKENDS, "toy", "toy-gpu")  # one that says no order comes last
    toy = EngineConfig(backend="toy", model="toy-model")
    assert engines.validate_engine_config(toy, LoadConfig()) == []
    assert engines.validate_engine_config(replace(toy, model="m"), LoadConfig()) == [
        "The toy backend serves toy-model only."
    ]
    assert engines.engine_settings_key(toy, LoadConfig()) == ("toy", "toy-model")
    assert engines.tokenizer_from_engine("toy") is True  # it has no model of its own to take one from
    assert type(engines.load_engine(toy, LoadConfig())).__name__ == "ToyEngine"
    with pytest.raises(EngineUnavailable, match="needs a toy GPU"):
        engines.load_engine(replace(toy, backend="toy-gpu"), LoadConfig())


def toy_run(backend: str = "toy") -> RunConfig:
    return RunConfig(
        engine=EngineConfig(backend=backend, model="toy-model"),
        dataset=DatasetConfig(dataset="builtin:sample", num_prompts=3, sharegpt_output_len=5),
    )


def test_a_new_backends_run_goes_through_the_runner_into_the_history(toy_backend_module, tmp_path, tiny_model_path):
    runner = Runner(History(tmp_path / "results"))
    run = runner.submit(toy_run())
    assert run.wait(60)
    runner.shutdown()
    assert (run.state, run.message) == ("finished", "")
    row = History(tmp_path / "results").load().iloc[0]
    assert (row["backend"], row["completed"], row["total_output_tokens"]) == ("toy", 3, 15)
    assert run.snapshot().ttft.min_s >= 0  # its events carry perf_counter times, as the contract asks
    with pytest.raises(ConfigError, match="needs a toy GPU"):
        runner.submit(toy_run("toy-gpu"))


@pytest.mark.slow
def test_a_new_backend_is_offered_by_the_cli_and_runs_there(tmp_path, tiny_model_path):
    """The CLI in another process, on a copy of bench_core with the one module added."""
    shutil.copytree(ROOT / "bench_core", tmp_path / "bench_core", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "bench_core" / "engines" / "toy_engine.py").write_text(TOY_ENGINE_MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench_core",
            "pipeline",
            "builtin:sample",
            "toy-model",
            "--backend",
            "toy",
            "-n",
            "3",
            "--sharegpt-output-len",
            "5",
            "--csv",
            "",
            "--results",
            "results",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Profile Pipeline API" in done.stdout and "finished in results/history.csv" in done.stderr
    assert History(tmp_path / "results").load()["backend"].tolist() == ["toy"]


# What a page or a CLI command does before it runs anything: list the backends, ask about one.
_ASK_ABOUT_THE_SERVER_BACKEND = """
import json, sys
sys.path.insert(0, {root!r})
from bench_core import engines
from bench_core.config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from bench_core.run.runner import Runner
from bench_core.store.history import History

HEAVY = ("torch", "transformers", "lmdeploy", "aiohttp")
seen = {{}}
engines.backends()
engines.availability("openai")
engines.availability("transformers")
seen["listed"] = [name for name in HEAVY if name in sys.modules]
engines.validate_engine_config(EngineConfig(backend="openai", base_url="http://127.0.0.1:1"), LoadConfig())
seen["openai validated"] = [name for name in HEAVY if name in sys.modules]
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_asking_about_one_backend_imports_no_other_backends_libraries(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _ASK_ABOUT_THE_SERVER_BACKEND.format(root=str(ROOT))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"listed": [], "openai validated": []}  # the server client is the standard library's asyncio


def test_the_run_config_imports_nothing_of_the_engines(tmp_path):
    script = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import bench_core.config; print('bench_core.engines' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    # Nor inside a function: the check that needs both lives with the engines (engines.check_run_config).
    tree = ast.parse(Path(config.__file__).read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not [name for name in imported if "engines" in name]
