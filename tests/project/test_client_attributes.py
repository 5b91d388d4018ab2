"""No hidden order on the client side: every attribute a client_app class sets on ``self`` is created in its
``__init__`` (or its bases'), never only as the side effect of another call that a later call relies on (a hook that
reads what another hook left behind works only when the two run in that order, in that process)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def self_targets(node: ast.AST) -> set[str]:
    """Names of ``self.<name>`` assigned anywhere in ``node`` (tuple targets and annotated assignments too)."""
    out = set()
    for sub in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def client_classes() -> dict[str, tuple[list[str], set[str], dict[str, set[str]]]]:
    """class name -> (its base classes' names, attributes its ``__init__`` sets, method -> attributes it sets)."""
    classes = {}
    for path in sorted((ROOT / "client_app").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
            methods = {f.name: self_targets(f) for f in node.body if isinstance(f, ast.FunctionDef)}
            created = methods.pop("__init__", set())
            classes[f"{path.stem}.{node.name}"] = (bases, created, methods)
    return classes


def created_by_init(name: str, classes: dict) -> set[str]:
    """What the ``__init__`` of the class and of its bases in client_app create (bases found by class name)."""
    bases, created, _ = classes[name]
    out = set(created)
    for base in bases:
        for other in classes:
            if other.endswith(f".{base.split('.')[-1]}"):
                out |= created_by_init(other, classes)
    return out


def test_the_scan_sees_the_client_classes():
    classes = client_classes()
    assert "base.ClientMethod" in classes and "fedcac.FedCACClient" in classes
    assert {"context", "settings", "data", "kept"} <= created_by_init("fedcac.FedCACClient", classes)


def test_no_client_attribute_is_created_only_as_a_side_effect():
    classes = client_classes()
    found = []
    for name, (_, _, methods) in classes.items():
        created = created_by_init(name, classes)
        for method, attrs in methods.items():
            found += [f"{name}.{method} sets self.{a}" for a in sorted(attrs - created)]
    assert not found, "attributes no __init__ creates:\n" + "\n".join(found)
