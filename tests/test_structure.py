"""The shape of sweeps, run states and pages: each duty in one module, each state spelled once, thin pages.

These read the source (imports, module-level names, comparisons), so a regression is caught where it is made.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench_core import states
from bench_core.states import RequestStatus, RunState

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "pages").glob("*.py"))
DASHBOARD = sorted((ROOT / "dashboard").glob("*.py"))
SWEEP_MODULES = ("plan", "driver", "results", "store")
CORE = ROOT / "bench_core"
# Every file but the one that defines them names its run states and request statuses from states.py.
STATE_USERS = sorted(path for path in CORE.rglob("*.py") if path != CORE / "states.py") + DASHBOARD + PAGES
PAGE_MAX_LINES = 60
# What a page may import: the dashboard's modules, streamlit, the standard library, and the error a page catches.
PAGE_IMPORTS = ("dashboard", "streamlit", "functools", "bench_core.errors")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved within bench_core)."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            folders = path.relative_to(ROOT).parent.parts
            base = folders[:len(folders) - node.level + 1] if node.level else ()
            names.add(".".join(filter(None, (*base, node.module))))
    return names


def _state_literals(node: ast.AST) -> list[str]:
    """The run states and request statuses `node` spells out: a string constant, or a tuple, list or set of them
    ("failed" as a key of a summary, `summary["failed"]`, is a request count, not a state)."""
    parts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [part.value for part in parts
            if isinstance(part, ast.Constant) and part.value in (*RunState, *RequestStatus)]


def test_the_states_keep_the_strings_the_history_has_always_held():
    assert tuple(RunState) == ("queued", "loading", "running", "finished", "partial", "failed", "cancelled")
    assert states.MEASURED == (RunState.FINISHED, RunState.PARTIAL)
    assert tuple(RequestStatus) == ("success", "failed", "incomplete", "unfinished", "cancelled")
    assert tuple(states.LoadPattern) == ("batch", "concurrency", "request_rate")
    # Written into CSV cells and messages as their strings, as the constants they replace were.
    values = [state.value for state in RunState]
    assert [f"{state}" for state in RunState] == [str(state) for state in RunState] == values


def _only_states(node: ast.AST) -> bool:
    """A state, or states only (`QUEUED, LOADING = "queued", "loading"`); a list of metric keys that holds
    "failed" among others is not a declaration of states."""
    parts = node.elts if isinstance(node, ast.Tuple) else [node]
    return len(_state_literals(node)) == len(parts)


@pytest.mark.parametrize("path", STATE_USERS, ids=lambda path: str(path.relative_to(ROOT)))
def test_run_states_are_named_not_spelled(path):
    """No module declares its own state constant, and no comparison spells a state out."""
    declared = [target.id for node in _tree(path).body if isinstance(node, ast.Assign) and _only_states(node.value)
                for target in ast.walk(node) if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store)]
    compared = [literal for node in ast.walk(_tree(path)) if isinstance(node, ast.Compare)
                for side in (node.left, *node.comparators) for literal in _state_literals(side)]
    assert (declared, compared) == ([], [])


def test_the_runner_and_the_sweep_driver_share_the_states_module():
    for path in (CORE / "run" / "runner.py", CORE / "sweep" / "driver.py"):
        assert "bench_core.states" in _imported_modules(path), path


def test_each_sweep_duty_imports_only_what_it_needs():
    """The plan knows no history and no runner; the store and the results run nothing; only the driver runs."""
    imports = {name: _imported_modules(CORE / "sweep" / f"{name}.py") for name in SWEEP_MODULES}
    assert not imports["plan"] & {"pandas", "bench_core.store.history", "bench_core.run.runner",
                                  *(f"bench_core.sweep.{name}" for name in SWEEP_MODULES)}
    for name in ("store", "results"):
        assert not imports[name] & {"bench_core.run.runner", "bench_core.sweep.driver"}, name
    assert "bench_core.store.history" not in imports["results"]  # pure: rows in, statistics out


@pytest.mark.parametrize("path", PAGES, ids=lambda path: path.name)
def test_a_page_is_a_short_script_over_dashboard_modules(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= PAGE_MAX_LINES
    foreign = {name for name in _imported_modules(path)
               if not any(name == allowed or name.startswith(allowed + ".") for allowed in PAGE_IMPORTS)}
    assert foreign == set()


def test_process_wide_objects_live_in_the_state_module_only():
    holders = {path.name for path in [*DASHBOARD, *PAGES]
               for node in ast.walk(_tree(path)) if isinstance(node, ast.Attribute) and node.attr == "cache_resource"}
    assert holders == {"state.py"}


def test_the_playground_draws_the_sidebars_model_picker():
    """No second list of models or second 'other model' input: the Playground calls the sidebar's picker."""
    view = ROOT / "dashboard" / "playground_view.py"
    assert "bench_core.models.resolve" not in _imported_modules(view)
    calls = [node.func.attr for node in ast.walk(_tree(view))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]
    assert "model_picker" in calls
