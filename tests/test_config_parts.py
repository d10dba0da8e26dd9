"""The config parts are dataclasses written from the settings catalog (bench_core/config/parts.py): the file is what
the generator writes for today's catalog, each field is a setting with its type and default, and a type checker
sees them, so a misspelt setting fails lint."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from bench_core.config import SETTINGS, Part, of_part
from bench_core.config import parts as config_parts
from bench_core.config.generate_parts import COMMAND, PART_CLASSES, PARTS_FILE, render

ROOT = Path(__file__).resolve().parent.parent


def test_parts_py_is_what_the_generator_writes_for_the_catalog():
    assert PARTS_FILE.read_text(encoding="utf-8") == render(), f"parts.py is out of date: run `{COMMAND}`"


def test_a_setting_added_removed_or_given_another_default_changes_the_written_file():
    batch_tokens = next(s for s in SETTINGS if s.name == "max_batch_tokens")
    changed = [dataclasses.replace(s, default=2048) if s is batch_tokens else s for s in SETTINGS if s.name != "turns"]
    changed.append(dataclasses.replace(batch_tokens, name="max_batch_requests", default=None, optional=True))
    written, today = set(render(tuple(changed)).splitlines()), set(render().splitlines())
    assert sorted(written - today) == ["    max_batch_requests: int | None = None", "    max_batch_tokens: int = 2048"]
    assert sorted(today - written) == ["    max_batch_tokens: int = 1024", "    turns: int = 4"]


def test_each_part_has_a_field_per_catalog_setting_with_its_type_and_default():
    for part, (name, _doc) in PART_CLASSES.items():
        cls = getattr(config_parts, name)
        fields = [(f.name, f.type, f.default, f.repr) for f in dataclasses.fields(cls)]
        assert fields == [(s.name, s.field_type, s.default, not s.secret) for s in of_part(part)], name
    assert set(PART_CLASSES) == set(Part) - {Part.SWEEP}  # a sweep's settings are not a run's


PROBE = """from bench_core.config import RunConfig

config = RunConfig()
concurrency: int = config.load.concurrency
typo = config.load.concurency
"""


def test_a_misspelt_setting_is_a_type_error(tmp_path):
    """mypy with the project's settings (scripts/lint.sh's) on one small module: the correct name passes, the
    misspelt one is the only error."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--cache-dir", str(tmp_path / "cache")]
        + ["--python-executable", sys.executable, str(probe)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f'{probe}:5: error: "LoadConfig" has no attribute "concurency"' in done.stdout
    assert "Found 1 error in 1 file" in done.stdout
