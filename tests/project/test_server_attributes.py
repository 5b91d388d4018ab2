"""No hidden order on the server side: every attribute a class of strategies/ or server_app/ sets on ``self`` is created
by its ``__init__`` (or its bases', or as a declared field), never only as the side effect of another call that a
later call relies on (an attribute that exists only once some method ran works only when the calls come in that
order)."""

import ast
from pathlib import Path

import pytest

from tests.project.test_client_attributes import self_targets

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("strategies", "server_app")


def classes_of(package: str) -> dict[str, tuple[list[str], set[str], dict[str, set[str]]]]:
    """class name -> (its bases' names, what its ``__init__`` sets or its body declares (fields, properties), method ->
    what it sets)."""
    classes = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases]
            functions = [f for f in node.body if isinstance(f, ast.FunctionDef)]
            methods = {f.name: self_targets(f) for f in functions if not is_property(f)}
            declared = {t.id for f in node.body if isinstance(f, ast.AnnAssign | ast.Assign) for t in self_names(f)}
            declared |= {f.name for f in functions if is_property(f)}  # with their setters
            created = methods.pop("__init__", set()) | methods.pop("__post_init__", set()) | declared
            classes[f"{path.relative_to(ROOT).with_suffix('')}.{node.name}"] = (bases, created, methods)
    return classes


def is_property(function: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) == "property" or ast.unparse(d).endswith(".setter") for d in function.decorator_list)


def self_names(node: ast.AnnAssign | ast.Assign) -> list[ast.Name]:
    targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
    return [t for t in targets if isinstance(t, ast.Name)]


def created_by_init(name: str, classes: dict) -> set[str]:
    """What the class and its bases in the package create (bases found by class name)."""
    bases, created, _ = classes[name]
    out = set(created)
    for base in bases:
        for other in classes:
            if other.endswith(f".{base}") and other != name:
                out |= created_by_init(other, classes)
    return out


def test_the_scan_sees_the_strategies_and_their_parts():
    classes = classes_of("strategies")
    created = created_by_init("strategies/fedcac.FedCACStrategy", classes)
    assert {"settings", "history", "gate", "robust", "checkpoint", "loop", "custom"} <= created
    assert "root" in created_by_init("strategies/robust.RobustAveraging", classes)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_server_attribute_is_created_only_as_a_side_effect(package):
    classes = classes_of(package)
    found = []
    for name, (_, _, methods) in classes.items():
        created = created_by_init(name, classes)
        for method, attrs in methods.items():
            found += [f"{name}.{method} sets self.{a}" for a in sorted(attrs - created)]
    assert not found, "attributes no __init__ creates:\n" + "\n".join(found)
