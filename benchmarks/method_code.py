"""The app's code a run's numbers depend on: the method's own files, found through the registry, and the code every
method shares; with a digest of each file's content.

A record keeps the digests of the files that ran (``code.files``, written by ``running.py``), so whether its
method's code changed since is read from the record and the files now, without the repository's history (a fresh
shallow clone can tell, CI can tell); ``reporting/freshness.py`` judges records without them by ``git diff`` against
their commit.

A method's files: its strategy module, its client module, the module of its options, its artefacts writer, and the
method-math modules (``*_math``) these import.  Every method shares :data:`SHARED`: the training loop and models, the
data (partitions, splits, domains), the client's base (with its parts: the node's data, kept state, newcomers, saved
models) and handlers, and the server's base, its round loop and its checkpoint.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the code every method's results depend on, beside its own files (a folder: every file in it)
SHARED = (
    "task/train.py",
    "task/models.py",
    "task/data",
    "client_app/base.py",
    "client_app/node.py",
    "client_app/state.py",
    "client_app/newcomers.py",
    "client_app/saving.py",
    "client_app/app.py",
    "strategies/base.py",
    "strategies/rounds.py",
    "strategies/checkpointing.py",
)


def _module_file(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _math_imports(path: Path) -> set[str]:
    if not path.exists():
        return set()
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("_math"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.endswith("_math")}
    return out


@functools.cache
def method_files(method: str, root: Path = ROOT) -> tuple[str, ...]:
    """The files of ``method`` (paths relative to the repository), from the registry; :data:`SHARED` not included."""
    from task.methods import METHODS

    if method not in METHODS:
        raise KeyError(f"method {method!r} is not in the registry (allowed: {sorted(METHODS)})")
    spec = METHODS[method]
    modules = {spec.strategy.split(":")[0], spec.client.split(":")[0], spec.options.__module__}
    if spec.artifacts:
        modules.add(spec.artifacts.split(":")[0])
    for m in list(modules):
        modules |= _math_imports(root / _module_file(m))
    return tuple(sorted(_module_file(m) for m in modules))


def shared_files(root: Path = ROOT) -> list[str]:
    """:data:`SHARED` with each folder replaced by the files in it (compiled files left out)."""
    out = []
    for entry in SHARED:
        path = root / entry
        if path.is_dir():
            out += [
                p.relative_to(root).as_posix()
                for p in sorted(path.rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            ]
        else:
            out.append(entry)
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "missing"


def file_digests(method: str, root: Path = ROOT) -> dict[str, str]:
    """Every file ``method``'s results depend on (its own and the shared ones) -> a digest of its content under
    ``root`` ("missing" for a file that is not there)."""
    return {f: _digest(root / f) for f in sorted({*method_files(method, root), *shared_files(root)})}
