"""Imports run one way (docs/adding-a-method.md, ground rules): task/ imports nothing of the app; client_app/ and
strategies/ never import each other; server_app/ may import strategies/ and task/, never client_app/.  What both sides
of a method share lives in task/ (task/methods/: the registry, options, wire formats, shared math)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "task": {"strategies", "client_app", "server_app"},
    "client_app": {"strategies", "server_app"},
    "strategies": {"client_app", "server_app"},
    "server_app": {"client_app"},
}


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
