"""CONTRIBUTING.md stays true: every path and `path.py::Name` it gives exists, and its worked examples (a metric,
a setting, a dataset and a backend) work as written against the code they are meant to be pasted into."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench_core import engines, load
from bench_core.config import DatasetConfig, EngineConfig, RunConfig
from bench_core.config import catalog as settings_catalog
from bench_core.exports import RunSubject, Scope, exports
from bench_core.load import requests as load_requests
from bench_core.measure import catalog as metric_catalog
from bench_core.plugins import PLUGINS_ENV
from bench_core.run.runner import Runner
from bench_core.store.history import History

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
EXAMPLES = re.findall(r"```python\n(.*?)```", GUIDE, flags=re.S)
METRIC_FORMULA, METRIC, SETTING, DATASET_MODULE, BACKEND_MODULE, EXPORT_MODULE = EXAMPLES
BACKEND_EXAMPLE = "bench_core/engines/instant_engine.py"  # the files the guide has you create
DATASET_EXAMPLE = "bench_core/load/repeated_dataset.py"
EXPORT_EXAMPLE = "bench_core/exports/requests_parquet_export.py"
INSTALLED_ONLY = ("bench_studio/root/",)  # exists in an installed package only (pyproject.toml)
PACKAGES = [ROOT / name for name in ("bench_core", "dashboard", "bench_studio")]
QUOTED = re.findall(r"`([^`\s]+)`", GUIDE)
REFERENCES = sorted({(path, name) for path, name in (ref.split("::") for ref in QUOTED if "::" in ref)})
PATHS = sorted(
    {
        ref
        for ref in QUOTED
        if "::" not in ref and "<" not in ref and re.fullmatch(r"[\w./-]+\.(py|md|toml|txt|ini|sh)|[\w./-]+/", ref)
    }
)


def defined_names(path: Path) -> set[str]:
    """The classes, functions and assigned names of a module, and `Class.member` for each class's members."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {
                    f"{node.name}.{member.name}"
                    for member in node.body
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def test_the_guide_has_its_examples_and_references():
    assert len(EXAMPLES) == 6 and len(REFERENCES) > 20 and len(PATHS) > 20


@pytest.mark.parametrize("quoted", PATHS)
def test_every_path_the_guide_names_exists(quoted):
    if quoted in (BACKEND_EXAMPLE, DATASET_EXAMPLE, EXPORT_EXAMPLE) or quoted in INSTALLED_ONLY:
        return
    here = (ROOT / quoted).exists() or (ROOT / "bench_core" / quoted).exists()  # from the root, or in bench_core/
    named = "/" not in quoted.rstrip("/") and any(any(folder.rglob(quoted.rstrip("/"))) for folder in PACKAGES)
    assert here or named, quoted  # a bare name: a file or folder of the package its table row is about


@pytest.mark.parametrize("path, name", REFERENCES, ids=lambda part: part)
def test_every_name_the_guide_gives_is_defined_where_it_says(path, name):
    assert name in defined_names(ROOT / path)


def test_the_metric_example_computes_its_formula_per_request():
    namespace = dict(vars(metric_catalog))
    exec(METRIC_FORMULA, namespace)
    metric = eval(METRIC.strip().rstrip(","), namespace)
    table = pd.DataFrame({"input_len": [100, 300, 50], "ttft_s": [0.5, 1.5, 0.0]})
    np.testing.assert_allclose(metric.per_request(table, True), [200.0, 200.0, np.nan])
    assert metric.column("mean") == "mean_prefill_tokens_per_s" and metric.key not in metric_catalog.METRICS


def test_the_setting_example_is_a_knob_of_the_embedded_engine_with_its_flag_and_bounds():
    knob = eval(SETTING.strip().rstrip(","), dict(vars(settings_catalog)))
    assert (knob.cli_flag, knob.default, knob.backends, knob.is_knob) == (
        "--max-batch-requests",
        64,
        ("transformers",),
        True,
    )
    assert knob.bounds.low == 1 and knob.name not in {declared.name for declared in settings_catalog.SETTINGS}


def test_the_dataset_example_is_found_by_the_registry_and_samples_its_requests(tiny_tokenizer, tmp_path, monkeypatch):
    (tmp_path / Path(DATASET_EXAMPLE).name).write_text(DATASET_MODULE)
    monkeypatch.setattr(load, "__path__", [*load.__path__, str(tmp_path)])
    load._registry.cache_clear()
    try:
        repeated = load.dataset("repeated")
        sample = repeated.sample(DatasetConfig(dataset="builtin:sample", num_prompts=3, output_len=16), tiny_tokenizer)
    finally:
        load._registry.cache_clear()
    assert [request.output_len for request in sample.requests] == [16, 16, 16]
    assert sample.total_input_tokens == 3 * sample.requests[0].input_len > 0
    assert load_requests.SampledRequest is type(sample.requests[0])


@pytest.fixture
def backend_example(tmp_path, monkeypatch):
    """bench_core/engines/ with the guide's module added to it (kept in tmp_path)."""
    (tmp_path / Path(BACKEND_EXAMPLE).name).write_text(BACKEND_MODULE)
    monkeypatch.setattr(engines, "__path__", [*engines.__path__, str(tmp_path)])
    engines._registry.cache_clear()
    yield
    engines._registry.cache_clear()


def test_the_backend_example_is_found_by_the_registry_and_runs_into_the_history(
    backend_example, tmp_path, tiny_model_path
):
    assert "instant" in engines.backends()
    runner = Runner(History(tmp_path / "results"))
    run = runner.submit(
        RunConfig(
            engine=EngineConfig(backend="instant", model="builtin:tiny-llama"),
            dataset=DatasetConfig(dataset="builtin:sample", num_prompts=3, sharegpt_output_len=5),
        )
    )
    assert run.wait(60)
    runner.shutdown()
    assert (run.state, run.message) == ("finished", "")
    row = History(tmp_path / "results").load().iloc[0]
    assert (row["backend"], row["completed"], row["total_output_tokens"]) == ("instant", 3, 15)


def test_the_export_example_in_a_plugin_folder_is_registered_for_a_run_and_builds_its_file(tmp_path, monkeypatch):
    (tmp_path / Path(EXPORT_EXAMPLE).name).write_text(EXPORT_MODULE)
    monkeypatch.setenv(PLUGINS_ENV, str(tmp_path))
    assert "requests-parquet" in exports(Scope.RUN) and "requests-parquet" not in exports(Scope.SWEEP)
    requests = pd.DataFrame({"request": [0, 1], "ttft_s": [0.125, 0.25], "status": ["success", "failed"]})
    subject = RunSubject(History(tmp_path / "results"), "r1", requests, {}, parts=lambda: None)
    chosen = exports()["requests-parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(io.BytesIO(chosen.build(subject))), requests)
    assert chosen.name_for(subject) == "run-r1-requests.parquet"
