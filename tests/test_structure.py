"""The shape of sweeps, run states and pages: each duty in one module, each state spelled once, thin pages.

These read the source (imports, module-level names, comparisons), so a regression is caught where it is made.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bench_core import states
from bench_core.config.catalog import SETTINGS, SWEEP_SETTINGS
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
# (and so the endpoint and ignore_eos's spelling), not our backend setting; `history`'s --model and --backend
# choose recorded runs by theirs.
OTHER_MEANINGS = {("restful.py", "--backend"), ("history.py", "--model"), ("history.py", "--backend")}


def own_defaults_and_bounds(source: str, name: str = "module.py") -> list[str]:
    """What a module writes itself for a catalogued setting: a flag added by hand with its default, a widget keyed
    as a setting's with its own start or bounds, or a setting's bounds compared against a number."""
    from bench_core.config import SETTINGS, Part
    from dashboard.setting_widgets import widget_key

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


# ---- tests judge behaviour, not this machine's speed ------------------------------------------------------------

TEST_FILES = sorted(path for path in (ROOT / "tests").rglob("*.py") if path.name.startswith("test_"))
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"}
CLOCKS |= {"thread_time", "cpu_percent", "cpu_times"}
# A local named so holds a measured time, lag or CPU figure, whatever computed it (`seconds = proc.interrupt()`);
# an attribute or a column named so is one too (`prof.elapsed_time`, `row[LAG_COLUMN]`, `row["load_seconds"]`).
MEASURED_NAME = re.compile(r"^(elapsed|seconds|took|duration|wall|lag|lateness|cpu|cores)(_s|_ms)?$|_(elapsed|took)$")
# A bound that is no speed says why on its line: the quantity's own (a share's 100 %), or a fraction of a delay the
# test's own server sets (a tenth of the 60 s it holds a stream).
TIMING_SAFE = "# timing-safe:"
MEASURED_FIELD = re.compile(r"elapsed|seconds|loop_lag|lag_column|cpu|cores|saturated", re.IGNORECASE)


def _without_comparisons(node: ast.AST):
    """`node` and what it holds, but not inside a comparison: `sum(ts > cancelled_at for ts in stamps)` counts."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.Compare):
            yield from _without_comparisons(child)


def _reads_a_clock(node: ast.AST, measured: set[str]) -> bool:
    called = {id(part.func) for part in ast.walk(node) if isinstance(part, ast.Call)}
    for part in _without_comparisons(node):
        if isinstance(part, ast.Call) and getattr(part.func, "attr", getattr(part.func, "id", "")) in CLOCKS:
            return True
        if isinstance(part, ast.Name) and (part.id in measured or MEASURED_NAME.search(part.id)):
            return True
        if isinstance(part, ast.Attribute) and id(part) not in called and MEASURED_FIELD.search(part.attr):
            return True
        if (
            isinstance(part, ast.Subscript)
            and _field_name(part.slice)
            and MEASURED_FIELD.search(_field_name(part.slice))
        ):
            return True
    return False


def _field_name(key: ast.AST) -> str:
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    return key.id if isinstance(key, ast.Name) else key.attr if isinstance(key, ast.Attribute) else ""


def _fixed(node: ast.AST) -> bool:
    """A number the test wrote down: a literal, a CONSTANT (module.CONSTANT too), or arithmetic of them."""
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, float)
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        return name.isupper()
    if isinstance(node, ast.BinOp):
        return _fixed(node.left) and _fixed(node.right)
    if isinstance(node, ast.UnaryOp):
        return _fixed(node.operand)
    return False


def speed_assertions(source: str, name: str = "test_module.py") -> list[str]:
    """Assertions that bound a clock reading (or a local measured from one) from above by a fixed number:
    `assert time.perf_counter() - started < 1.0`, `elapsed = ...; assert elapsed <= LIMIT_S`. Such a test judges
    the machine's speed and fails on a busy one (CONTRIBUTING.md, "Timing-safe tests"). A quantity's own bound
    (a percentage's 100) or a fraction of a delay the test's own server sets is no speed: its line says so with
    TIMING_SAFE and why."""
    found = []
    lines = source.splitlines()
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        measured: set[str] = set()
        assignments = [node for node in ast.walk(function) if isinstance(node, (ast.Assign, ast.AnnAssign))]
        for _ in range(3):  # names measured from names measured from a clock
            for node in assignments:
                if node.value is not None and _reads_a_clock(node.value, measured):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    measured |= {
                        part.id for target in targets for part in ast.walk(target) if isinstance(part, ast.Name)
                    }
        for node in ast.walk(function):
            if not isinstance(node, ast.Assert) or TIMING_SAFE in lines[node.lineno - 1]:
                continue
            for compare in (part for part in ast.walk(node.test) if isinstance(part, ast.Compare)):
                sides = [compare.left, *compare.comparators]
                for left, op, right in zip(sides, compare.ops, sides[1:]):
                    small, large = (left, right) if isinstance(op, (ast.Lt, ast.LtE)) else (right, left)
                    if isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) and _fixed(large):
                        if not _fixed(small) and _reads_a_clock(small, measured):
                            found.append(f"{name}:{node.lineno} bounds {ast.unparse(small)} by {ast.unparse(large)}")
    return found


def test_the_check_finds_a_clock_bounded_by_a_fixed_number():
    source = (
        "def test_a():\n"
        "    started = time.monotonic()\n"
        "    assert time.monotonic() - started < 1.0\n"
        "    took = time.perf_counter() - started\n"
        "    assert 0 < took <= LIMIT_S * 2\n"
        "    seconds = process.interrupt()\n"
        "    assert EXIT_WITHIN_S > seconds\n"
        "def test_fine():\n"
        "    started = time.monotonic()\n"
        "    reference = time.monotonic() - started\n"
        "    assert time.monotonic() - started >= 0.5\n"  # a lower bound the test's own sleep gives
        "    assert time.monotonic() - started < 10 * reference\n"  # relative to a reference measured beside it
        "    assert len(events) < 5 and run.wait(120)\n"
        "    assert summary['mean_machine_cpu_percent'] <= 100  # timing-safe: a share of the machine\n"
        "    late = [sum(ts > started for ts in stamps) for stamps in sessions]\n"
        "    assert max(late) <= 2\n"  # a count of stamps, not a time
        "    assert 1e8 < roofline.cpu_memory_bandwidth(path) and not pool.cpu_count() > 64\n"  # no figure measured
    )
    assert speed_assertions(source) == [
        "test_module.py:3 bounds time.monotonic() - started by 1.0",
        "test_module.py:5 bounds took by LIMIT_S * 2",
        "test_module.py:7 bounds seconds by EXIT_WITHIN_S",
    ]


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_test_bounds_a_clock_reading_by_a_fixed_number(path):
    assert speed_assertions(path.read_text(encoding="utf-8"), path.name) == []


# ---- the fast tier (-m "not slow", scripts/test.sh --fast) reaches every package ---------------------------------

PACKAGES = sorted(
    [f"bench_core.{path.parent.name}" for path in CORE.glob("*/__init__.py")] + ["dashboard", "bench_studio"]
)


def _slow_marks(nodes: list[ast.stmt]) -> bool:
    return any("slow" in ast.unparse(node) for node in nodes)


def fast_tier_reach(path: Path) -> set[str]:
    """The packages a test file imports, where it has a test outside the slow tier, and app_pages where such a
    file opens a page."""
    tree = _tree(path)
    marks = [node for node in tree.body if isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node.targets)]
    tests = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    if "e2e" in path.parts or _slow_marks(marks) or all(_slow_marks(test.decorator_list) for test in tests):
        return set()
    reached = {package for package in PACKAGES for name in _imported_modules(path) if name.startswith(package)}
    return reached | ({"app_pages"} if "app_pages/" in path.read_text(encoding="utf-8") else set())


def test_the_fast_tier_reaches_every_package():
    reached = set().union(*(fast_tier_reach(path) for path in TEST_FILES))
    assert sorted({*PACKAGES, "app_pages"} - reached) == []


# A dataset answers for itself (bench_core/load/base.py::Dataset): no module but its own asks which dataset a run
# uses by its name. Its modules are the registry's (`*_dataset.py`), where it declares that name.
DATASET_MODULES = sorted((CORE / "load").glob("*_dataset.py"))
# The words other settings choose among, which a dataset's name may also be ("random").
OTHER_CHOICES = frozenset(
    choice
    for declared in (*SETTINGS, *SWEEP_SETTINGS)
    if declared.name != "dataset_name"
    for choice in declared.choices or ()
    if isinstance(choice, str)
)
DATASET_ASKERS = sorted(set(CORE.rglob("*.py")) - set(DATASET_MODULES)) + DASHBOARD + PAGES + [ROOT / "app.py"]


def dataset_name_comparisons(source: str, names: tuple[str, ...], words: frozenset[str] = frozenset()) -> list[str]:
    """Where `source` compares a dataset's name, or a run's `dataset_name`, with anything, or keys a dict by a
    dataset's name: "line: the names or dataset_name". A name that is also a word of other choices (`words`: "random",
    an arrival order's, a sampler's) counts only beside something named for a dataset."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            sides = [key for key in node.keys if key is not None]
        else:
            continue
        spelled = [
            part.value
            for side in sides
            for part in (side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side])
            if isinstance(part, ast.Constant) and part.value in names
        ]
        if not any("dataset" in ast.unparse(side) for side in sides):
            spelled = [name for name in spelled if name not in words]
        # A run's dataset_name itself compared with a value (its being unset, None, asks nothing of it).
        asked = (
            isinstance(node, ast.Compare)
            and any(
                (isinstance(side, ast.Attribute) and side.attr == "dataset_name")
                or (isinstance(side, ast.Name) and side.id == "dataset_name")
                for side in sides
            )
            and not any(isinstance(side, ast.Constant) and side.value is None for side in sides)
        )
        if spelled or asked:
            found.append(f"{node.lineno}: {', '.join(spelled) or 'dataset_name'}")
    return found


def test_the_check_finds_a_dataset_asked_by_its_name():
    from bench_core.load import dataset_names

    source = (
        'if config.dataset.dataset_name == "multi-turn": pass\n'
        'if name in ("sharegpt", "image"): pass\n'
        "if args.dataset_name != TRACE: pass\n"
        'FILES = {"custom": "JSON records"}\n'
        'if declared.name != "dataset_name" and style == "radio": pass\n'
        "if where.dataset_name is None or output_length(data.dataset_name) is not None: pass\n"
        'if tune.search == "random" or data.prefix_order in ("random", "grouped"): pass\n'
        'if chosen_dataset == "random": pass\n'
    )
    assert dataset_name_comparisons(source, dataset_names(), OTHER_CHOICES) == [
        "1: multi-turn",
        "2: sharegpt, image",
        "3: dataset_name",
        "4: custom",
        "8: random",
    ]


@pytest.mark.parametrize("path", DATASET_ASKERS, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_dataset_name_is_compared_outside_its_module(path):
    from bench_core.load import dataset_names

    assert dataset_name_comparisons(path.read_text(encoding="utf-8"), dataset_names(), OTHER_CHOICES) == []
