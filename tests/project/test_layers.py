"""Imports run one way (docs/adding-a-method.md, ground rules): task/ imports nothing of the app; client_app/ and
strategies/ never import each other; server_app/ may import strategies/ and task/, never client_app/.  What both sides
of a method share lives in task/ (task/methods/: the registry, options, wire formats, shared math).  The app never
imports benchmarks/, and benchmarks/ is a package in layers (benchmarks/__init__.py).  No package imports in a
circle.  Every import counts, those inside functions and under ``TYPE_CHECKING`` too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "task": {"strategies", "client_app", "server_app", "benchmarks"},
    "client_app": {"strategies", "server_app", "benchmarks"},
    "strategies": {"client_app", "server_app", "benchmarks"},
    "server_app": {"client_app", "benchmarks"},
}
#: the layers of benchmarks/, lowest first; every other module of benchmarks/ is a script, above them all
BENCHMARK_LAYERS = {
    "benchmarks.records": 1,
    "benchmarks.method_code": 1,
    "benchmarks.running": 2,
    "benchmarks.families": 2,
    "benchmarks.attack_grid": 2,
    "benchmarks.reporting": 3,
    "benchmarks.protocol": 3,  # beside reporting, never importing it
}
SCRIPTS = 4
#: packages whose modules import in no circle
ACYCLIC = ("task", "client_app", "server_app", "strategies", "benchmarks", "deploy/pflower_deploy")


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def imported_packages(path: Path) -> set[str]:
    return {m.split(".")[0] for m in imported_modules(path)}


def test_imports_run_one_way():
    wrong = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            bad = imported_packages(path) & forbidden
            if bad:
                wrong.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not wrong, wrong


def test_models_and_text_do_not_import_each_other():
    assert "task.text" not in imported_modules(ROOT / "task" / "models.py")
    assert "task.models" not in imported_modules(ROOT / "task" / "text.py")


STRATEGIES = ROOT / "strategies"


def test_a_strategy_module_holds_its_algorithm_and_no_plotting():
    """Plotting and the method's files live beside the strategy (strategies/<method>_artifacts.py over
    strategies/plots.py), never in the strategy or the base's parts: a strategy file reads as the method."""
    drawing = {"matplotlib", "strategies.plots"}
    wrong = []
    for path in sorted(STRATEGIES.glob("*.py")):
        if path.name == "plots.py" or path.stem.endswith("_artifacts"):
            continue
        modules = imported_modules(path)
        bad = {m for m in modules if m.split(".")[0] == "matplotlib" or m in drawing or m.endswith("_artifacts")}
        if bad:
            wrong.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not wrong, wrong


def test_every_artefacts_module_is_named_by_the_registry_entries_of_its_strategy():
    """The results writer finds a method's files through its registry entry: an artefacts module no entry names would
    never run, and an entry of a strategy that has one (a family member, such as the Oracle) must name it too."""
    from task.methods import METHODS, load_object

    writers = {p.stem for p in STRATEGIES.glob("*_artifacts.py")}
    named = set()
    for method, spec in METHODS.items():
        module = spec.strategy.split(":")[0].removeprefix("strategies.")
        expected = f"strategies.{module}_artifacts:write_artifacts" if f"{module}_artifacts" in writers else None
        assert spec.artifacts == expected, method
        if spec.artifacts:
            named.add(spec.artifacts.split(":")[0].removeprefix("strategies."))
            assert callable(load_object(spec.artifacts))
    assert named == writers


def test_a_method_leans_on_the_face_module_not_on_the_bases_parts():
    """A method's strategy imports the framework from strategies/api.py only (the base, the reply-spec types, the
    disclosure parts): the base's parts (exchange, gate, schedule, history, persistence, ...) are not its business.
    Besides the face it may import method math (``*_math``) and the PI-FL family's tier tables."""
    from task.methods import METHODS

    modules = {spec.strategy.split(":")[0] for spec in METHODS.values()}
    wrong = []
    for module in sorted(modules):
        path = ROOT / (module.replace(".", "/") + ".py")
        for imported in sorted(imported_modules(path)):
            own = imported.split(".")[0] == "strategies"
            if own and imported not in ("strategies.api", "strategies.tier_tables") and not imported.endswith("_math"):
                wrong.append(f"{path.relative_to(ROOT)} imports {imported}")
        assert "strategies.api" in imported_modules(path), module
    assert not wrong, wrong


# --------------------------------------------------------------------------- the import graph of a package
def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py")) if "out" not in p.parts}


def resolved_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, relative imports resolved and ``from pkg import mod`` read as
    an import of ``pkg.mod``."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            above = package[: len(package) - node.level + 1]
            base = ".".join([*above, node.module or ""]).strip(".") if node.level else (node.module or "")
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in out if m in modules} - {module_name(path)}


def import_graph(package: str) -> dict[str, set[str]]:
    modules = package_modules(package)
    return {name: resolved_imports(path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def benchmark_layer(module: str) -> int:
    return next((n for name, n in BENCHMARK_LAYERS.items() if module == name or module.startswith(name + ".")), SCRIPTS)


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_package_imports_in_a_circle(package):
    assert circles(import_graph(package)) == []


def test_persistence_knows_no_strategy():
    """strategies/persistence.py writes and reads plain data (the base assembles it from its parts' ``state()``):
    it imports nothing of strategies/, not even under ``TYPE_CHECKING`` or inside a function."""
    assert [m for m in imported_modules(STRATEGIES / "persistence.py") if m.split(".")[0] == "strategies"] == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_benchmarks_import_only_from_the_layers_below():
    """records < running, families < reporting < the scripts; reporting's modules may use each other, a script no
    other script, the report never the running layer."""
    graph = import_graph("benchmarks")
    assert {m for m in graph if benchmark_layer(m) < SCRIPTS} >= set(BENCHMARK_LAYERS)  # every layer is a module
    wrong = [
        f"{module} (layer {benchmark_layer(module)}) imports {imported} (layer {benchmark_layer(imported)})"
        for module, imports in graph.items()
        for imported in imports
        if benchmark_layer(imported) >= benchmark_layer(module)
        and not (benchmark_layer(module) == benchmark_layer(imported) == BENCHMARK_LAYERS["benchmarks.reporting"])
    ]
    assert not wrong, wrong
    # the report reads records; it never runs anything
    report = [m for m in graph if m.startswith("benchmarks.reporting")]
    assert report and not [m for m in report if "benchmarks.running" in graph[m]]


def test_benchmarks_edit_no_import_path():
    """The scripts run as ``python -m benchmarks.<script>``: none puts a folder on ``sys.path``."""

    def edits(path: Path) -> bool:
        return any(
            isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys"
            for n in ast.walk(ast.parse(path.read_text()))
        )

    assert [name for name, path in package_modules("benchmarks").items() if edits(path)] == []
