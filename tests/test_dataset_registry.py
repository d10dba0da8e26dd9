"""The datasets' registry: each built-in dataset declares settings of the catalog and one output length of them, and
every setting of some datasets only is taken by one at least.

A dataset is one module: the guide's example dataset (CONTRIBUTING.md, "Adding a dataset"), written to a plugin
file in tmp_path and named in BENCH_STUDIO_PLUGINS, is offered and run by the CLI and by the dashboard's sidebar
(its engine process included) into the history, with its setting, its output length and its per-request facts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from app_under_test import APP
from streamlit.testing.v1 import AppTest

from bench_core.cli import main
from bench_core.config import DatasetConfig, EngineConfig, Part, RunConfig, of_part, setting
from bench_core.config.catalog import BY_NAME
from bench_core.engines import run_config_problems
from bench_core.load import dataset, dataset_names, datasets_taking, output_length, takes
from bench_core.plugins import PLUGINS_ENV
from bench_core.store.history import RESULTS_ENV, History
from bench_core.views.report import describe_config
from dashboard.state import get_runner

GUIDE = (Path(__file__).resolve().parent.parent / "CONTRIBUTING.md").read_text(encoding="utf-8")
SECTION = GUIDE[GUIDE.index("## Adding a dataset") : GUIDE.index("## Adding a backend")]
(DATASET_MODULE,) = re.findall(r"```python\n(.*?)```", SECTION, flags=re.S)


def test_the_built_in_datasets_keep_their_names_and_order():
    assert dataset_names() == ("sharegpt", "random", "shared-prefix", "multi-turn", "trace", "custom", "image")


@pytest.mark.parametrize("name", dataset_names())
def test_a_dataset_takes_settings_of_some_datasets_only_and_its_output_length_among_them(name):
    declared = [BY_NAME[setting] for setting in dataset(name).settings]
    assert all(setting.part == Part.DATASET and setting.per_dataset for setting in declared), name
    length = dataset(name).output_length
    assert length is None or (length in dataset(name).settings and BY_NAME[length].output_length)


def test_every_setting_of_some_datasets_only_is_taken_by_one_at_least():
    assert all(datasets_taking(setting) for setting in of_part(Part.DATASET) if setting.per_dataset)


def test_a_run_of_a_dataset_no_module_declares_here_is_described_and_refused_in_one_sentence():
    config = RunConfig(
        engine=EngineConfig(backend="transformers", model="builtin:tiny-llama"),
        dataset=DatasetConfig(dataset="builtin:sample", dataset_name="gone", output_len=9),
    )
    assert "(gone, conversation lengths)" in describe_config(config)
    assert output_length("gone") is None
    assert takes("gone", setting("num_prompts")) and not takes("gone", setting("output_len"))
    names = ", ".join(dataset_names())
    assert run_config_problems(config) == [f"Unknown dataset name 'gone'; choose one of {names}."]


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "plugins" / "repeated_dataset.py"
    path.parent.mkdir()
    path.write_text(DATASET_MODULE)
    monkeypatch.setenv(PLUGINS_ENV, str(path.parent))
    return path


def test_a_plugin_dataset_is_registered_with_its_setting_and_output_length(plugin, monkeypatch):
    assert dataset_names()[-1] == "repeated" and "sharegpt" in dataset_names()
    assert dataset("repeated").settings == ("output_len",)
    assert output_length("repeated").name == "output_len"
    monkeypatch.delenv(PLUGINS_ENV)
    assert "repeated" not in dataset_names()  # the environment decides, at each ask


def test_a_broken_plugin_is_one_line_of_the_cli_not_a_traceback(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "broken" / "broken_dataset.py"
    broken.parent.mkdir()
    broken.write_text("import not_a_module_anywhere\n")
    _help(capsys)  # the commands' modules are imported before the plugin is named, as earlier tests may have
    monkeypatch.setenv(PLUGINS_ENV, str(broken.parent))
    assert main(["pipeline", "--help"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {PLUGINS_ENV}: {broken} could not be imported: ModuleNotFoundError")
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_cli_runs_a_plugin_dataset_into_the_history(plugin, tmp_path, tiny_model_path, capsys):
    assert "{sharegpt,random,shared-prefix,multi-turn,trace,custom,image,repeated}" in _help(capsys)
    results = tmp_path / "results"
    argv = ["pipeline", "builtin:sample", "builtin:tiny-llama", "--backend", "transformers", "--dataset-name"]
    code = main([*argv, "repeated", "-n", "3", "--output-len", "5", "--csv", "", "--results", str(results)])
    said = capsys.readouterr().err  # read here, so that the refusal below is all that is said after
    assert code == 0, said
    row = History(results).load().iloc[0]
    assert (row["dataset_name"], row["completed"], row["total_output_tokens"]) == ("repeated", 3, 15)
    assert History(results).requests(row["run_id"])["copy"].tolist() == [0, 0, 0]
    # Its setting given to another dataset is refused naming the datasets that take it, the plugin among them.
    refused = main([*argv, "sharegpt", "--output-len", "5", "--csv", "", "--results", str(results)])
    message = "error: --output-len applies to the shared-prefix, custom and repeated datasets only.\n"
    assert (refused, capsys.readouterr().err) == (2, message)


def _help(capsys) -> str:
    with pytest.raises(SystemExit):
        main(["pipeline", "--help"])
    return capsys.readouterr().out


@pytest.mark.slow
def test_the_sidebar_offers_a_plugin_dataset_and_runs_it_into_the_history(plugin, tmp_path, fresh_dashboard):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RESULTS_ENV, str(tmp_path / "results"))
        at = AppTest.from_file(APP, default_timeout=120).run()
        assert "repeated" in at.sidebar.radio(key="dataset_name").options
        at.sidebar.selectbox(key="model_choice").select("builtin:tiny-llama")
        at.sidebar.selectbox(key="dataset_builtin").select("builtin:sample")
        at.sidebar.radio(key="dataset_name").set_value("repeated").run()
        keys = {widget.key for widget in at.sidebar if getattr(widget, "key", None)}
        assert "output_len" in keys and "prefix_len" not in keys  # its setting, not another dataset's
        at.sidebar.number_input(key="output_len").set_value(4)
        at.sidebar.number_input(key="num_prompts_cpu").set_value(2)
        at.run().sidebar.button(key="start").click().run()
        assert not at.exception and not at.error
        run = get_runner().get(at.query_params["run"])
        assert run.wait(120) and run.state == "finished", run.message
        row = History(tmp_path / "results").load().iloc[0]
        assert (row["dataset_name"], row["completed"], row["total_output_tokens"]) == ("repeated", 2, 8)
