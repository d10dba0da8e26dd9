"""A setting declared once in config/catalog.py is everywhere a user meets settings: the CLI, the sidebar, validation,
the history, "What differs" and sweeps. Shown for the two settings added as one declaration each
(max_prefill_token_num, and dtype on LMDeploy's engines), and for the whole catalog where it can be said generally."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from app_under_test import APP
from streamlit.testing.v1 import AppTest

from bench_core.cli import build_parser
from bench_core.cli.pipeline import PipelineCommand
from bench_core.config import (
    KNOBS,
    SETTINGS,
    SWEEPABLE,
    EngineConfig,
    Part,
    RunConfig,
    format_value,
    parse_bool,
    setting,
)
from bench_core.engines import run_config_problems
from bench_core.engines.lmdeploy_configs import engine_config_kwargs
from bench_core.errors import ConfigError
from bench_core.sweep.plan import SweepPlan, parse_sweep_arg
from bench_core.views.run_diff import NOT_APPLICABLE, differing_settings, setting_cells
from bench_core.views.tables import describe_column
from dashboard.setting_widgets import widget_key

# (setting, a backend it applies to, a value other than its default, a value it refuses there and the refusal)
PROOF = [
    (
        "max_prefill_token_num",
        "pytorch",
        2048,
        -1,
        "--max-prefill-token-num must be a whole number from 0 to 16,777,216; got -1.",
    ),
    ("dtype", "turbomind", "float16", "float32", "Unknown dtype 'float32'; choose one of auto, float16, bfloat16."),
]


def pipeline_config(*flags: str) -> RunConfig:
    args = build_parser((PipelineCommand(),)).parse_args(["pipeline", "builtin:sample", "builtin:tiny-llama", *flags])
    return PipelineCommand().build_config(args)


@pytest.mark.parametrize("name, backend, value, refused, message", PROOF)
def test_the_cli_takes_it_with_lmdeploys_spelling(name, backend, value, refused, message):
    declared = setting(name)
    config = pipeline_config("--backend", backend, declared.cli_flag, str(value))
    assert getattr(config.engine, name) == value
    assert pipeline_config("--backend", backend).engine.__dict__[name] == declared.default


def test_a_knob_of_lmdeploy_is_refused_for_the_transformers_engine():
    with pytest.raises(ConfigError, match="applies to the turbomind and pytorch backends only, not to transformers"):
        pipeline_config("--backend", "transformers", "--max-prefill-token-num", "2048")


@pytest.mark.parametrize("name, backend, value, refused, message", PROOF)
def test_validation_refuses_what_its_declaration_refuses(name, backend, value, refused, message):
    assert run_config_problems(RunConfig(engine=EngineConfig(backend=backend, **{name: value}))) == []
    assert run_config_problems(RunConfig(engine=EngineConfig(backend=backend, **{name: refused}))) == [message]


@pytest.mark.parametrize("name, backend, value, refused, message", PROOF)
def test_lmdeploys_engine_config_gets_it_under_its_own_field(name, backend, value, refused, message):
    kwargs = engine_config_kwargs(EngineConfig(backend=backend, **{name: value}), RunConfig().load)
    assert kwargs[setting(name).engine_fields[backend]] == value


@pytest.mark.parametrize("name, backend, value, refused, message", PROOF)
def test_the_history_records_it_and_reads_it_back(name, backend, value, refused, message):
    config = RunConfig(engine=EngineConfig(backend=backend, **{name: value}))
    flat = config.to_flat_dict()
    assert flat[name] == value
    assert RunConfig.from_flat_dict({key: "" if cell is None else str(cell) for key, cell in flat.items()}) == config
    assert describe_column(name).label == setting(name).shown_label


@pytest.mark.parametrize("name, backend, value, refused, message", PROOF)
def test_what_differs_names_it_where_it_applies_and_not_elsewhere(name, backend, value, refused, message):
    rows = pd.DataFrame(
        [
            RunConfig(engine=EngineConfig(backend=backend)).to_flat_dict(),
            RunConfig(engine=EngineConfig(backend=backend, **{name: value})).to_flat_dict(),
        ]
    )
    assert differing_settings(rows) == [name]
    cpu_run = RunConfig(engine=EngineConfig(backend="openai")).to_flat_dict()
    assert setting_cells(pd.DataFrame([cpu_run]), [name])[name] == [NOT_APPLICABLE]


@pytest.mark.parametrize("name, backend, value, refused, message", PROOF)
def test_a_sweep_varies_it(name, backend, value, refused, message):
    axis = parse_sweep_arg(f"{name}={setting(name).default},{value}")
    assert axis.values == (setting(name).default, value)
    plan = SweepPlan("sweep-x", RunConfig(engine=EngineConfig(backend=backend)), (axis,))
    plan.check(runs_here=False)  # LMDeploy's engines need a GPU: the plan is for a cluster's
    assert [run.config.engine.__dict__[name] for run in plan.points()] == [setting(name).default, value]
    with pytest.raises(ConfigError, match="Sweep points with"):
        SweepPlan(
            "sweep-x", RunConfig(engine=EngineConfig(backend=backend)), (parse_sweep_arg(f"{name}={value},{refused}"),)
        ).check(runs_here=False)


def test_the_sidebar_draws_both_for_lmdeploys_engines_from_their_declarations():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.sidebar.selectbox(key="backend").select("turbomind").run()
    assert not at.exception
    prefill = at.sidebar.number_input(key="knob_max_prefill_token_num")
    assert (prefill.value, prefill.label) == (8192, "--max-prefill-token-num")
    prefill.set_value(-1).run()  # its bounds are said under it, from its declaration
    assert [error.value for error in at.sidebar.error] == [
        "--max-prefill-token-num must be a whole number from 0 to 16,777,216; got -1."
    ]
    at.sidebar.number_input(key="knob_max_prefill_token_num").set_value(8192).run()
    assert at.sidebar.selectbox(key="knob_dtype").options == ["auto", "float16", "bfloat16"]  # no float32 here
    at.sidebar.selectbox(key="backend").select("transformers").run()
    assert "float32" in at.sidebar.selectbox(key="knob_dtype").options
    assert not [widget for widget in at.sidebar.number_input if widget.key == "knob_max_prefill_token_num"]


# ---- the whole catalog ---------------------------------------------------------------------------------------


def test_every_sweepable_setting_parses_its_own_default_back():
    for name in SWEEPABLE:
        declared = setting(name)
        if declared.default is not None:
            assert parse_sweep_arg(f"{name}={format_value(declared.default)}").values == (declared.default,), name


def test_every_setting_but_a_secret_is_a_history_column():
    flat = RunConfig().to_flat_dict()
    assert [declared.key for declared in SETTINGS if not declared.secret] == [
        key for key in flat if key not in ("label", "percentiles")
    ]
    assert "api_key" not in flat


def test_every_knob_has_a_flag_and_a_widget_key_of_its_own():
    keys = [widget_key(knob, "cpu") for knob in KNOBS]
    flags = [knob.cli_flag for knob in KNOBS]
    assert len(set(keys)) == len(keys) and len(set(flags)) == len(flags)
    assert all(knob.part == Part.ENGINE and knob.backends for knob in KNOBS)


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True),
        ("Yes", True),
        ("on", True),
        ("1", True),
        ("false", False),
        ("NO", False),
        ("off", False),
        ("0", False),
    ],
)
def test_booleans_have_one_spelling_read_everywhere(text, value):
    assert parse_bool(text) is value
    assert setting("enable_prefix_caching").parse_text(text) is value
    assert setting("enable_prefix_caching").from_cell(text) is value
    assert format_value(value) == ("true" if value else "false")


# A dataset setting added as someone adding one would write it: one declaration in config/catalog.py's DATASET.
NEW_DATASET_SETTING = """    Setting("system_prompt_len", Part.DATASET, int, 0, label="System prompt length", unit="tokens", sweepable=True,
            bounds=Bounds(low=0, high=4096), help="Tokens of the system prompt every request opens with.",
            cli_help="tokens of the system prompt every request opens with"),
"""

PROBE = """
import json, sys
sys.path.insert(0, {root!r})
from bench_core.config import RunConfig, DatasetConfig
from bench_core.engines import run_config_problems
from bench_core.sweep.plan import parse_sweep_arg
from bench_core.views.tables import describe_column
flat = RunConfig(dataset=DatasetConfig(system_prompt_len=64)).to_flat_dict()
print(json.dumps({{
    "column": flat["system_prompt_len"], "read back": RunConfig.from_flat_dict(flat).dataset.system_prompt_len,
    "swept": list(parse_sweep_arg("system_prompt_len=0,64").values), "title": describe_column("system_prompt_len").title,
    "refused": run_config_problems(RunConfig(dataset=DatasetConfig(system_prompt_len=-1))),
}}))
"""


@pytest.mark.slow
def test_a_new_dataset_setting_is_one_declaration(tmp_path):
    """On a copy of bench_core with one Setting added to the catalog and the config parts written again from it
    (`python -m bench_core.config.generate_parts`): both commands take its flag, and the config, the history,
    validation, sweeps and the column titles know it, with no other file touched."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "bench_core", tmp_path / "bench_core", ignore=shutil.ignore_patterns("__pycache__"))
    catalog = tmp_path / "bench_core" / "config" / "catalog.py"
    text = catalog.read_text()
    anchor = "\nDATASET = (\n"
    catalog.write_text(text.replace(anchor, anchor + NEW_DATASET_SETTING, 1))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    assert run("-m", "bench_core.config.generate_parts").returncode == 0
    for command in ("pipeline", "restful"):
        helped = run("-m", "bench_core", command, "--help")
        assert helped.returncode == 0, helped.stderr
        assert "--system-prompt-len SYSTEM_PROMPT_LEN" in helped.stdout
        assert "tokens of the system prompt every request opens with (default: 0)" in helped.stdout
    probe = run("-c", PROBE.format(root=str(tmp_path)))
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {
        "column": 64,
        "read back": 64,
        "swept": [0, 64],
        "title": "System prompt length (tokens)",
        "refused": ["--system-prompt-len must be a whole number from 0 to 4,096; got -1."],
    }
