"""bench_core's modules import each other without a loop: every import statement (at the top or inside a
function, relative ones resolved) is an arrow, and no group of modules may reach itself through them."""

import ast
from pathlib import Path

BENCH_CORE = Path(__file__).resolve().parent.parent / "bench_core"


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package at `root` by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(filter(None, (base, node.module)))
            # `from package import module` imports the module; `from module import name`, the module
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a module: its nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a loop (strongly connected, more than one), sorted."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def describe(groups: list[list[str]], graph: dict[str, set[str]]) -> str:
    return "\n".join(
        " ; ".join(f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group) for group in groups
    )


def test_the_walker_follows_relative_and_late_imports_round_a_loop(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "a.py").write_text("from .sub import b\nimport os\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def late():\n    from ..c import name\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from . import a\nfrom .sub.b import late\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a", "pkg.sub.b"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_the_cli_is_a_package_whose_modules_import_without_a_loop():
    graph = import_graph(BENCH_CORE)
    through_cli = [group for group in cycles(graph) if any(name.startswith("bench_core.cli") for name in group)]
    assert not through_cli, describe(through_cli, graph)
    assert {
        "bench_core.cli",
        "bench_core.cli.common",
        "bench_core.cli.pipeline",
        "bench_core.cli.restful",
        "bench_core.cli.sweep",
    } <= set(graph)


def test_a_subcommand_imports_only_the_shared_module_of_the_cli():
    graph = import_graph(BENCH_CORE)
    for name in ("pipeline", "restful", "sweep", "model_path"):
        of_cli = {target for target in graph[f"bench_core.cli.{name}"] if target.startswith("bench_core.cli")}
        assert of_cli == {"bench_core.cli.common"}, name


def test_bench_core_imports_without_a_loop():
    graph = import_graph(BENCH_CORE)
    groups = cycles(graph)
    assert not groups, describe(groups, graph)


# bench_core's packages in the order the data flows, lowest first: a package imports only those before it.
LAYERS = (
    "redact",
    "terminal",
    "errors",
    "plugins",
    "csvstore",
    "states",
    "models",
    "config",
    "load",
    "engines",
    "measure",
    "hardware",
    "store",
    "views",
    "run",
    "sweep",
    "exports",
    "cli",
)
TOP_LEVEL_MAX = 20


def _package(module: str) -> str:
    """bench_core.store.history -> store; bench_core.errors -> errors."""
    return module.split(".")[1] if "." in module else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        if name == "bench_core" or name == "bench_core.__main__":
            continue
        packages.setdefault(_package(name), set()).update(
            _package(target) for target in targets if target != "bench_core" and _package(target) != _package(name)
        )
    return packages


def test_bench_core_is_a_few_packages_by_role():
    entries = sorted(path.name for path in BENCH_CORE.iterdir() if path.name != "__pycache__")
    assert len(entries) <= TOP_LEVEL_MAX, entries
    assert set(package_graph(import_graph(BENCH_CORE))) == set(LAYERS)


def test_each_package_imports_only_the_packages_below_it_in_the_data_flow():
    upward = sorted(
        f"{package} -> {target}"
        for package, targets in package_graph(import_graph(BENCH_CORE)).items()
        for target in targets
        if LAYERS.index(target) >= LAYERS.index(package)
    )
    assert upward == []
