"""Bounds (reliability round 4, n07, n09, n12, n14): every number a user types, in a flag, in a link's setting or
in a dataset file, has a range declared once in the catalog, and a value outside it is refused before anything
runs, in one line naming the value and the bound: the CLI exits 2 and writes nothing, the dashboard shows one
message and starts nothing.

The walks are generated from the catalog: every number setting of every part (the run's and the sweep's own) with
0, -1, NaN, inf, 10**30 and 2**63. NaN, inf (but where it is a value: a request rate of inf), 10**30 and 2**63 are
out of every range; 0 and -1 where the declaration says so. The CLI runs in this process (`bench_core.cli.main`),
each setting on a command line where it applies; two cases run as processes against a real server, and the trace
cases against a real server on 127.0.0.1 too.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from app_under_test import APP, shown
from llama_server import MODEL, NEVER, llama_handler
from raw_http_server import RawServer
from streamlit.testing.v1 import AppTest

from bench_core.cli import main
from bench_core.config import Part, of_part
from bench_core.config.settings import number_text
from bench_core.engines import backend as backend_of
from bench_core.load import datasets_taking
from bench_core.states import LoadPattern
from bench_core.store.history import RESULTS_ENV, History

# Each test here runs the CLI, a server or the app script for seconds: not in the fast suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = [declared for part in Part for declared in of_part(part) if declared.numeric]
VALUES = ("0", "-1", "nan", "inf", str(10**30), str(2**63))
CLOSED = "http://127.0.0.1:9"  # the discard port: a refused run never gets as far as asking it anything


def typed(declared, text: str) -> float:
    """The value `text` sets, as the setting stores it (an SLO typed in ms is kept in seconds)."""
    if declared.kind is int and text.lstrip("-").isdigit():
        return int(text)
    return float(text) * declared.typed_scale


def out_of_range(declared, text: str) -> bool:
    """Whether `text` is outside the setting's range: NaN, inf (where it means nothing), 10**30 and 2**63 always;
    0 and -1 where the declaration says so."""
    number = float(text)
    if math.isinf(number):
        return not declared.allow_inf
    if math.isnan(number) or abs(number) >= 2**63:
        return True
    return bool(declared.problems(typed(declared, text)))


def spellings(declared, text: str) -> set[str]:
    """How a message may spell the value typed: as typed, or as a number."""
    number = float(text)
    return {text, number_text(number), repr(number), f"{number:g}", number_text(typed(declared, text))}


def command_line(declared, results: Path, text: str) -> list[str]:
    """A command line on which the setting's flag is read and the setting applies: the command, backend, dataset and
    load pattern its declaration names (the first of each), with `text` as its value."""
    flag = declared.cli_flag
    server_only = declared.part == Part.SWEEP or (declared.backends is not None and "openai" in declared.backends)
    dataset = datasets_of(declared)[0] if datasets_of(declared) else None
    patterns = declared.load_patterns or ()
    if LoadPattern.TRACE in patterns and LoadPattern.REQUEST_RATE not in patterns and LoadPattern.BATCH not in patterns:
        dataset = "trace"
    if server_only or dataset == "image":
        line = ["restful", "--backend", "vllm-chat" if dataset == "image" else "vllm", "--base-url", CLOSED]
        line += ["--model", "m", "--tokenizer", "builtin:tiny-llama", "--num-prompts", "2", "--output-file", ""]
        source = ["--dataset-path", "builtin:sample" if dataset not in ("trace", "custom") else "mine.jsonl"]
        line += source
        if declared.part == Part.SWEEP:
            line = ["sweep", *line, "--find-max", "request_rate", "--slo-e2e-ms", "1000"]
    else:
        engine_api = patterns == (LoadPattern.ENGINE_API,)
        backend = "transformers" if declared.applies(backend="transformers") else declared.backends[0]
        source = "mine.jsonl" if dataset in ("trace", "custom") else "builtin:sample"
        line = ["throughput" if engine_api else "pipeline", source, "builtin:tiny-llama", "--backend", backend]
        line += ["-n", "2", "--csv", ""]
        if patterns and LoadPattern.BATCH not in patterns and not engine_api:
            line += ["--load", str(next(p for p in patterns if p in (LoadPattern.REQUEST_RATE, LoadPattern.TRACE)))]
    if dataset is not None:
        line += ["--dataset-name", dataset]
    if dataset in ("random", "image"):  # their lengths are needed; a length under test comes last and wins
        line += ["--random-input-len", "8", "--random-output-len", "8"]
    return [*line, "--results", str(results), flag, text]


@pytest.mark.parametrize("declared", NUMBERS, ids=lambda declared: f"{declared.part}-{declared.name}")
def test_every_number_setting_out_of_its_range_is_one_line_and_exit_2_through_the_cli(declared, tmp_path, capsys):
    assert declared.limits.finite, f"{declared.name} has no finite range"
    refused = [text for text in VALUES if out_of_range(declared, text)]
    assert {"nan", str(10**30), str(2**63)} <= set(refused)
    words = declared.limits.words(whole=declared.kind is int, scale=declared.typed_scale)
    for text in refused:
        argv = command_line(declared, tmp_path / "results", text)
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as exit:  # argparse's refusal of the flag's text
            code = exit.code
        out, err = capsys.readouterr()
        assert code == 2 and out == "", (argv, code, out, err)
        (line,) = err.splitlines()
        assert declared.cli_flag in line or declared.name in line, (argv, line)
        assert words in line, (argv, line)
        assert any(spelling in line for spelling in spellings(declared, text)), (argv, line)
        assert not (tmp_path / "results").exists(), argv


def bench(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m bench_core`, a process of its own; the timeout guards against a search that never ends."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "bench_core", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


RESTFUL = ("--tokenizer", "builtin:tiny-llama", "--dataset-path", "builtin:sample", "--num-prompts", "2")


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ("sweep", "restful", "--backend", "vllm", *RESTFUL, "--find-max", "request_rate", "--slo-e2e-ms", "5000",
             "--find-max-limit", "nan"),
            "error: --find-max-limit must be a number from 0.001 to 1,000,000; got nan.",
        ),
        (
            ("restful", "--backend", "vllm-chat", *RESTFUL, "--dataset-name", "image", "--image-resolution",
             "100000x100000", "--random-input-len", "16", "--random-output-len", "8"),
            "each side must be from 1 to 8,192 pixels",
        ),
    ],
    ids=["find-max-limit-nan", "image-100000x100000"],
)  # fmt: skip
def test_an_endless_search_and_an_image_nobody_can_make_are_refused_by_a_real_process(tmp_path, args, said):
    with RawServer(llama_handler(NEVER)) as server:  # it lists a model and answers every completion
        proc = bench(*args, "--base-url", server.url, "--results", "results", "--output-file", "", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert said in line and "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()


# ---- dataset files: a trace's timestamps ----

YEAR_MS = 365.25 * 86_400_000


@pytest.mark.timeout(120)  # a guard: a request scheduled at t0 + inf would hold the run for ever
@pytest.mark.parametrize(
    "timestamp, said",
    [
        ("1e400", "its 'timestamp' must be a finite number of milliseconds, 0 or more, not inf"),
        ("Infinity", "its 'timestamp' must be a finite number of milliseconds, 0 or more, not inf"),
        ("NaN", "its 'timestamp' must be a finite number of milliseconds, 0 or more, not nan"),
        (
            str(int(50 * YEAR_MS)),
            "is 50 years after the trace's earliest (0 ms, line 1): a trace spans at most 30 days",
        ),
    ],
    ids=["1e400", "Infinity", "NaN", "50-years-ahead"],
)
def test_a_trace_timestamp_nobody_can_wait_for_is_refused_with_its_line(tmp_path, capsys, timestamp, said):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 20, "output_length": 8, "hash_ids": [1]}\n'
        f'{{"timestamp": {timestamp}, "input_length": 20, "output_length": 8, "hash_ids": [2]}}\n'
    )
    with RawServer(llama_handler(NEVER)) as server:
        code = main(
            ["restful", "--backend", "vllm", "--base-url", server.url, "--model", MODEL, "--tokenizer",
             "builtin:tiny-llama", "--dataset-name", "trace", "--dataset-path", str(trace), "--num-prompts", "2",
             "--disable-warmup", "--no-server-metrics", "--results", str(tmp_path / "results"), "--output-file", ""]
        )  # fmt: skip
        assert server.requests("POST") == []
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.splitlines()
    assert line.startswith(f"error: Dataset {trace}, line 2: the record is refused because ") and said in line
    assert History(tmp_path / "results").load().empty  # refused input is no run


@pytest.mark.timeout(120)
def test_a_trace_longer_than_a_day_asks_to_be_confirmed(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    records = [(0, 1), (2 * 86_400_000, 2)]  # the second request two days after the first
    trace.write_text(
        "".join(
            json.dumps({"timestamp": ms, "input_length": 20, "output_length": 8, "hash_ids": [block]}) + "\n"
            for ms, block in records
        )
    )
    with RawServer(llama_handler(NEVER)) as server:
        argv = ["restful", "--backend", "vllm", "--base-url", server.url, "--model", MODEL, "--tokenizer",
                "builtin:tiny-llama", "--dataset-name", "trace", "--dataset-path", str(trace), "--num-prompts", "2",
                "--disable-warmup", "--no-server-metrics", "--results", str(tmp_path / "results"), "--output-file", ""]  # fmt: skip
        slow = main([*argv, "--trace-speedup", "0.1"])  # 20 days: longer than a day, within 30
        err = capsys.readouterr().err
        assert slow == 2 and server.requests("POST") == [], err
        (line,) = err.splitlines()
        assert line == (
            "error: The trace at speed-up 0.1 would send the last request 20 days after the start, more than a day: "
            "confirm it with --allow-long-schedule (on the dashboard: 'Allow a schedule longer than a day')."
        )
        endless = main([*argv, "--trace-speedup", "0.01", "--allow-long-schedule"])  # 200 days, confirmed or not
        err = capsys.readouterr().err
        assert endless == 2 and server.requests("POST") == [], err
        assert err.strip().endswith(
            "would send the last request 200 days after the start: no run may take longer than 30 days."
        )


def test_arrivals_over_more_than_a_day_ask_to_be_confirmed(tmp_path, capsys):
    argv = ["restful", "--backend", "vllm", "--base-url", CLOSED, "--model", "m", *RESTFUL, "--output-file", "",
            "--results", str(tmp_path / "results"), "--request-rate", "0.00001"]  # fmt: skip
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "error: 2 prompts at 1e-05 req/s would send the last request 1.2 days after the start, more than a day: "
        "confirm it with --allow-long-schedule (on the dashboard: 'Allow a schedule longer than a day')."
    )
    # Confirmed, the run goes on to the server: here none listens, which is the next line's refusal.
    assert main([*argv, "--allow-long-schedule"]) == 2
    assert "Cannot reach http://127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


# ---- the dashboard: a link's settings ----


def _offered(backend: str) -> tuple[str, ...]:
    return tuple(backend_of(backend).load_patterns)


def dashboard_contexts() -> list[tuple[dict[str, str], list]]:
    """The sidebars that draw every number setting's widget: (the link's backend, dataset and load pattern, the
    settings drawn there that need them), fewest sidebars first found. A context's unset choice is the first
    setting's to make."""
    contexts: list[tuple[dict[str, str], list]] = []
    for declared in NUMBERS:
        if declared.widget is None or declared.part is Part.SWEEP:  # a sweep's own widgets are the Sweep page's
            continue
        for choice, settings in contexts:
            if _fits(declared, choice):
                _narrow(declared, choice)
                settings.append(declared)
                break
        else:
            choice: dict[str, str] = {}
            _narrow(declared, choice)
            contexts.append((choice, [declared]))
    return contexts


def datasets_of(declared) -> tuple[str, ...]:
    """The datasets that take a setting of some datasets only, in their order; () for every dataset's."""
    return datasets_taking(declared) if declared.per_dataset else ()


def _backends(declared) -> tuple[str, ...]:
    return tuple(declared.backends or ("transformers", "openai", "turbomind", "pytorch"))


def _fits(declared, choice: dict[str, str]) -> bool:
    backend = choice.get("backend")
    if backend is not None and backend not in _backends(declared):
        return False
    dataset = choice.get("dataset_name")
    if datasets_of(declared) and dataset is not None and dataset not in datasets_of(declared):
        return False
    pattern = choice.get("pattern")
    if declared.load_patterns:
        backends = [backend] if backend else _backends(declared)
        wanted = [p for p in declared.load_patterns if any(p in _offered(b) for b in backends)]
        if pattern is not None and pattern not in wanted or not wanted:
            return False
        if pattern is None and backend is None and dataset not in (None, "trace") and wanted == [LoadPattern.TRACE]:
            return False
    return True


def _narrow(declared, choice: dict[str, str]) -> None:
    """Fix the context's choices this setting needs: its backend, dataset and load pattern."""
    if declared.backends and "backend" not in choice:
        choice["backend"] = next(b for b in declared.backends if b in _backends(declared))
    if declared.load_patterns and "pattern" not in choice:
        backend = choice.get("backend") or next(
            b for b in _backends(declared) if set(declared.load_patterns) & set(_offered(b))
        )
        choice.setdefault("backend", backend)
        choice["pattern"] = next(p for p in declared.load_patterns if p in _offered(backend))
        if choice["pattern"] == LoadPattern.TRACE:
            choice.setdefault("dataset_name", "trace")
    if datasets_of(declared) and "dataset_name" not in choice:
        choice["dataset_name"] = datasets_of(declared)[0]


def link(choice: dict[str, str]) -> dict[str, str]:
    """The query parameters that choose the context's backend, dataset and load pattern."""
    backend = choice.get("backend", "transformers")
    params = {"backend": backend}
    if "dataset_name" in choice:
        params["dataset_name"] = choice["dataset_name"]
    if "pattern" in choice:
        params["load_pattern" if backend_of(backend).in_process else "load_pattern_server"] = choice["pattern"]
    return params


CONTEXTS = dashboard_contexts()


@pytest.mark.parametrize(
    "choice, settings", CONTEXTS, ids=["-".join(map(str, choice.values())) for choice, _ in CONTEXTS]
)
def test_every_number_setting_out_of_its_range_in_a_link_is_one_message_and_starts_nothing(
    fresh_dashboard, tmp_path, monkeypatch, choice, settings
):
    from dashboard.setting_widgets import widget_key
    from dashboard.state import get_runner

    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    family = backend_of(choice.get("backend", "transformers")).run_size.name
    for text in VALUES:
        refused = {widget_key(declared, family): declared for declared in settings if out_of_range(declared, text)}
        at = AppTest.from_file(APP, default_timeout=60)
        for key, value in {**link(choice), **dict.fromkeys(refused, text)}.items():
            at.query_params[key] = value
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        messages = [shown(error.value) for error in at.error]
        assert len(messages) == 1, (text, messages)
        for key, declared in refused.items():
            words = declared.limits.words(whole=declared.kind is int, scale=declared.typed_scale)
            said = f"{key}={text!r}: {declared.cli_flag} must be {words}"
            assert said in messages[0], (said, messages[0])
    assert get_runner().runs() == []


def test_the_dashboard_asks_to_confirm_arrivals_over_more_than_a_day_and_starts_nothing(
    fresh_dashboard, tmp_path, monkeypatch
):
    from bench_core.config import setting
    from dashboard.setting_widgets import widget_key
    from dashboard.state import get_runner

    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    family = backend_of("openai").run_size.name
    at = AppTest.from_file(APP, default_timeout=60)
    link_params = {
        "backend": "openai",
        "knob_base_url": CLOSED,
        "request_rate": "0.01",  # the widget's least
        widget_key(setting("num_prompts"), family): "1000",
    }
    for key, value in link_params.items():
        at.query_params[key] = value
    at.run()
    at.button(key="start").click().run()
    assert not at.exception
    (message,) = [shown(error.value) for error in at.error]
    assert message == (
        "1,000 prompts at 0.01 req/s would send the last request 1.2 days after the start, more than a day: confirm "
        "it with --allow-long-schedule (on the dashboard: 'Allow a schedule longer than a day')."
    )
    assert at.sidebar.checkbox(key="allow_long_schedule").label == "Allow a schedule longer than a day"
    assert get_runner().runs() == []


# ---- an error that says nothing ----


def test_an_error_raised_without_a_message_still_says_what_it_is():
    from bench_core.errors import ConfigError, DatasetError

    assert str(ConfigError("")) == "ConfigError (raised without a message)"
    assert str(DatasetError("  ")) == "DatasetError (raised without a message)"


@pytest.mark.timeout(120)  # a guard: the old code ran the probe, 1,000 requests at 0.01 req/s
def test_a_capacity_search_whose_probe_is_refused_says_why_in_one_line(tmp_path, capsys):
    with RawServer(llama_handler(NEVER)) as server:
        code = main(
            ["sweep", "restful", "--backend", "vllm", "--base-url", server.url, "--model", MODEL, "--tokenizer",
             "builtin:tiny-llama", "--dataset-path", "builtin:sample", "--num-prompts", "1000", "--disable-warmup",
             "--no-server-metrics", "--results", str(tmp_path / "results"), "--output-file", "",
             "--find-max", "request_rate", "--slo-e2e-ms", "5000", "--find-max-start", "0.01"]
        )  # fmt: skip
        assert server.requests("POST") == []
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines()[-1] == (
        "error: The search stopped: 1,000 prompts at 0.01 req/s would send the last request 1.2 days after the start, "
        "more than a day: "
        "confirm it with --allow-long-schedule (on the dashboard: 'Allow a schedule longer than a day')."
    )
    assert History(tmp_path / "results").load().empty


@pytest.mark.parametrize(
    "rates, said",
    [
        ("1,inf,1", "'1,inf,1' is not a range of finite numbers"),
        ("nan,5,1", "'nan,5,1' is not a range of finite numbers"),
        ("0.001,1000000,0.001", "'0.001,1000000,0.001' is 999,999,999 rates; a range gives at most 1,000"),
    ],
)
def test_a_range_of_rates_that_never_ends_is_one_line_and_exit_2(tmp_path, capsys, rates, said):
    argv = ["restful", "--backend", "vllm", "--base-url", CLOSED, "--model", "m", *RESTFUL, "--output-file", "",
            "--results", str(tmp_path / "results"), "--multi", "--request-rate-range", rates]  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"error: argument --request-rate-range: {said} (see --help)")
