"""The modules mypy holds to less than the rest (pyproject.toml's overrides) may only become fewer: a module added
to either list fails here, and one cleared from a list is deleted here too, so that it cannot come back."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Checked with None taken to fit every type (strict_optional = false).
NONE_FITS_ALL = {
    "bench_core.cli.sweep",
    "bench_core.load.datasets",
    "bench_core.sweep.driver",
    "bench_core.sweep.find_max",
    "bench_core.sweep.report",
}
# Not checked at all (ignore_errors = true).
UNCHECKED = {
    "bench_core.cli.pipeline",
    "bench_core.cli.restful",
    "bench_core.cli.throughput",
    "bench_core.sweep.cluster",
    "bench_core.views.report",
}


def _overridden(option: str) -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {
        module
        for override in config["tool"]["mypy"]["overrides"]
        if option in override
        for module in override["module"]
        if module.startswith("bench_core")
    }


@pytest.mark.parametrize("option, held", [("strict_optional", NONE_FITS_ALL), ("ignore_errors", UNCHECKED)])
def test_the_modules_held_to_less_only_become_fewer(option, held):
    listed = _overridden(option)
    assert listed - held == set(), f"fix these modules' type errors rather than adding them to the {option} list"
    assert held - listed == set(), "cleared from pyproject.toml: delete them from this test's list too"
