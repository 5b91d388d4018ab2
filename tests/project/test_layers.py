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
