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
PAGES = sorted((ROOT / "app_pages").glob("*.py"))
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
            base = folders[: len(folders) - node.level + 1] if node.level else ()
            names.add(".".join(filter(None, (*base, node.module))))
    return names


def _state_literals(node: ast.AST) -> list[str]:
    """The run states and request statuses `node` spells out: a string constant, or a tuple, list or set of them
    ("failed" as a key of a summary, `summary["failed"]`, is a request count, not a state)."""
    parts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        part.value for part in parts if isinstance(part, ast.Constant) and part.value in (*RunState, *RequestStatus)
    ]


def test_the_states_keep_the_strings_the_history_has_always_held():
    assert tuple(RunState) == ("queued", "loading", "running", "finished", "partial", "failed", "cancelled")
    assert states.MEASURED == (RunState.FINISHED, RunState.PARTIAL)
    assert tuple(RequestStatus) == ("success", "failed", "incomplete", "overrun", "unfinished", "cancelled")
    assert tuple(states.LoadPattern) == ("batch", "concurrency", "engine_api", "request_rate", "trace")
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
    declared = [
        target.id
        for node in _tree(path).body
        if isinstance(node, ast.Assign) and _only_states(node.value)
        for target in ast.walk(node)
        if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store)
    ]
    compared = [
        literal
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Compare)
        for side in (node.left, *node.comparators)
        for literal in _state_literals(side)
    ]
    assert (declared, compared) == ([], [])


def test_the_runner_and_the_sweep_driver_share_the_states_module():
    for path in (CORE / "run" / "runner.py", CORE / "sweep" / "driver.py"):
        assert "bench_core.states" in _imported_modules(path), path


def test_each_sweep_duty_imports_only_what_it_needs():
    """The plan knows no history and no runner; the store and the results run nothing; only the driver runs."""
    imports = {name: _imported_modules(CORE / "sweep" / f"{name}.py") for name in SWEEP_MODULES}
    assert not imports["plan"] & {
        "pandas",
        "bench_core.store.history",
        "bench_core.run.runner",
        *(f"bench_core.sweep.{name}" for name in SWEEP_MODULES),
    }
    for name in ("store", "results"):
        assert not imports[name] & {"bench_core.run.runner", "bench_core.sweep.driver"}, name
    assert "bench_core.store.history" not in imports["results"]  # pure: rows in, statistics out


@pytest.mark.parametrize("path", PAGES, ids=lambda path: path.name)
def test_a_page_is_a_short_script_over_dashboard_modules(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= PAGE_MAX_LINES
    foreign = {
        name
        for name in _imported_modules(path)
        if not any(name == allowed or name.startswith(allowed + ".") for allowed in PAGE_IMPORTS)
    }
    assert foreign == set()


def test_process_wide_objects_live_in_the_state_module_only():
    holders = {
        path.name
        for path in [*DASHBOARD, *PAGES]
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Attribute) and node.attr == "cache_resource"
    }
    assert holders == {"state.py"}


def test_the_playground_draws_the_sidebars_model_picker():
    """No second list of models or second 'other model' input: the Playground calls the sidebar's picker."""
    view = ROOT / "dashboard" / "playground_view.py"
    assert "bench_core.models.resolve" not in _imported_modules(view)
    calls = [
        node.func.attr
        for node in ast.walk(_tree(view))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    assert "model_picker" in calls


# ---- settings: declared once, in the catalog -------------------------------------------------------------------

CATALOG_FILES = sorted((CORE / "config").glob("*.py"))
SETTING_USERS = sorted(path for path in [*CORE.rglob("*.py"), *DASHBOARD, *PAGES] if path not in CATALOG_FILES)
# A flag spelled like a setting's that means something else: profile_restful_api.py's --backend names the server
# (and so the endpoint and ignore_eos's spelling), not our backend setting.
OTHER_MEANINGS = {("restful.py", "--backend")}


def own_defaults_and_bounds(source: str, name: str = "module.py") -> list[str]:
    """What a module writes itself for a catalogued setting: a flag added by hand with its default, a widget keyed
    as a setting's with its own start or bounds, or a setting's bounds compared against a number."""
    from bench_core.config import SETTINGS, Part
    from dashboard.sidebar import widget_key

    flags = {flag for setting in SETTINGS for flag in setting.cli_flags}
    keys = {widget_key(setting, family) for setting in SETTINGS for family in ("cpu", "lmdeploy")}
    bounded = {setting.name for setting in SETTINGS if setting.bounds is not None and setting.part != Part.GENERATION}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            literals = {arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
            if getattr(node.func, "attr", "") == "add_argument":
                found += [
                    f"{name}:{node.lineno} adds {flag}"
                    for flag in sorted(literals & flags)
                    if (name, flag) not in OTHER_MEANINGS
                ]
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            key = keywords.get("key")
            own = [word for word in ("value", "min_value", "max_value") if isinstance(keywords.get(word), ast.Constant)]
            if isinstance(key, ast.Constant) and key.value in keys and own:
                found.append(f"{name}:{node.lineno} draws {key.value} with its own {', '.join(own)}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = [side.attr for side in sides if isinstance(side, ast.Attribute)]  # a config's, not a local's
            numbers = [side for side in sides if isinstance(side, ast.Constant) and type(side.value) in (int, float)]
            found += [f"{name}:{node.lineno} bounds {setting}" for setting in named if setting in bounded and numbers]
    return found


def test_the_check_finds_a_default_and_a_bound_written_by_hand():
    source = (
        'parser.add_argument("--random-range-ratio", type=float, default=0.0)\n'
        'persisted(st.slider, "Range ratio", min_value=0.0, value=0.0, key="random_range_ratio")\n'
        "if data.num_prompts < 1: pass\n"
        "if num_prompts < 1: pass\n"
    )
    assert own_defaults_and_bounds(source) == [
        "module.py:1 adds --random-range-ratio",
        "module.py:2 draws random_range_ratio with its own value, min_value",
        "module.py:3 bounds num_prompts",
    ]


@pytest.mark.parametrize("path", SETTING_USERS, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_module_writes_its_own_default_or_bounds_for_a_catalogued_setting(path):
    assert own_defaults_and_bounds(path.read_text(encoding="utf-8"), path.name) == []


def test_no_folder_named_pages_beside_app_py():
    # Streamlit, finding pages/ beside its entry script, runs a first direct URL (/history on a fresh server) from
    # that folder's script alone, without app.py: no navigation, no wide layout (the comparison's pinned verdicts
    # and its legends were cut), until someone opens "/".
    assert not (ROOT / "pages").exists() and PAGES
