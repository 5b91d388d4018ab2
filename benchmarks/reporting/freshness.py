"""Records that match the code: a record is *fresh* when its method's files and the shared training code are the same
in the commit it ran and in the code that runs now; otherwise it is *stale* and its numbers describe other code.

A method's files come from the registry (``task.methods.METHODS``): its strategy module, its client module, the module
of its options, its artefacts writer, and the method-math modules (``*_math``) these import.  Every method shares
:data:`SHARED`: the training loop and models, the data (partitions, splits, domains), the client's base (with its
parts: kept state, newcomers, saved models) and handlers, and the server's round loop and checkpoint.  The comparison is
``git diff <record's commit> <now> -- <files>`` (now: the working tree, or a commit), so it needs the record's commit
in the repository's history: a shallow clone lacks it and gets a clear message instead of a verdict.
``python -m benchmarks.report --check`` refuses stale records; the grids script runs a stale record's run again.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.records import BENCHMARKS, Rec

from .text import plural

ROOT = BENCHMARKS.parent
#: the code every method's results depend on, beside its own files
SHARED = (
    "task/train.py",
    "task/models.py",
    "task/data",
    "client_app/base.py",
    "client_app/state.py",
    "client_app/newcomers.py",
    "client_app/saving.py",
    "client_app/app.py",
    "strategies/base.py",
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


class HistoryMissing(RuntimeError):
    """The repository lacks a record's commit because it is a shallow clone (or is no repository), so freshness
    cannot be judged."""


class UnknownCommit(LookupError):
    """A full repository that lacks a record's commit: the record ran code this history does not hold (stale)."""


@dataclass
class Verdict:
    """A record's freshness: ``changed`` lists the files that differ (empty: fresh), ``reason`` why it is stale."""

    path: str
    method: str | None
    commit: str | None
    changed: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def fresh(self) -> bool:
        return self.reason is None


class Checker:
    """Compares records' commits with the code now (``target``: a commit; None: the working tree) in ``repo``."""

    def __init__(self, repo: Path = ROOT, target: str | None = None) -> None:
        self.repo, self.target = Path(repo), target
        self._diffs: dict[tuple[str, str], list[str]] = {}

    def git(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["git", "-C", str(self.repo), *args], capture_output=True, text=True, check=False)
        except OSError as err:
            raise HistoryMissing(f"git cannot run: {err}") from err

    def usable(self) -> bool:
        """Whether ``repo`` is inside a git repository."""
        return self.git("rev-parse", "--git-dir").returncode == 0

    def has_commit(self, commit: str) -> bool:
        return self.git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0

    def shallow(self) -> bool:
        return self.git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"

    def changed(self, commit: str, method: str) -> list[str]:
        """Files of ``method`` (and :data:`SHARED`) that differ between ``commit`` and now."""
        key = (commit, method)
        if key not in self._diffs:
            if not self.has_commit(commit):
                if self.shallow():
                    raise HistoryMissing(
                        f"commit {commit[:12]} is not in this clone's history: it is shallow; run `git fetch "
                        "--unshallow` (or clone without --depth) to check the records"
                    )
                raise UnknownCommit(commit)
            files = [*method_files(method), *SHARED]
            ends = [commit, self.target] if self.target else [commit]
            # pathspecs from the repository's top, wherever in it ``repo`` is
            done = self.git("diff", "--name-only", *ends, "--", *(f":(top){f}" for f in files))
            if done.returncode != 0:
                raise HistoryMissing(f"git diff failed: {done.stderr.strip()}")
            self._diffs[key] = sorted(done.stdout.split())
        return self._diffs[key]

    def verdict(self, rec: Rec, path: str = "") -> Verdict | None:
        """The record's verdict; None for a record that is no federated run (an in-process measurement)."""
        config = rec.get("run-config")
        if not config or "method" not in config:
            return None
        method, code = str(config["method"]), rec.get("code") or {}
        commit = code.get("commit")
        v = Verdict(path, method, commit)
        if not commit:
            v.reason = "the record names no commit"
        elif code.get("dirty"):
            v.reason = "it ran on uncommitted changes of the app's code"
        else:
            try:
                v.changed = self.changed(commit, method)
            except UnknownCommit:
                v.reason = f"its commit {commit[:12]} is not in this repository's history"
            except KeyError as err:
                v.reason = str(err)
            else:
                if v.changed:
                    shown = ", ".join(v.changed[:4]) + (f" and {len(v.changed) - 4} more" if len(v.changed) > 4 else "")
                    v.reason = f"{plural(len(v.changed), 'file')} changed since {commit[:12]}: {shown}"
        return v


def check(paths: Iterable[Path], checker: Checker | None = None) -> tuple[list[Verdict], int]:
    """Every record's verdict (records that are no federated run skipped) and how many were skipped."""
    checker = checker or Checker()
    out, skipped = [], 0
    for p in paths:
        v = checker.verdict(json.loads(Path(p).read_text()), str(p))
        if v is None:
            skipped += 1
        else:
            out.append(v)
    return out, skipped


def summary(verdicts: list[Verdict]) -> list[str]:
    """One line per (grid folder, method, commit) with stale records: how many, and why."""
    groups: dict[tuple[str, str | None, str], list[Verdict]] = {}
    for v in verdicts:
        if not v.fresh:
            groups.setdefault((Path(v.path).parent.name, v.method, v.reason or ""), []).append(v)
    return [
        f"{grid} / {method}: {len(vs)} stale record{'s' if len(vs) > 1 else ''} ({reason})"
        for (grid, method, reason), vs in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
    ]


def stale_test(raw_dir: Path, stamped: str | None = None) -> Callable[[Path], bool]:
    """``path -> whether the record there is stale`` for the code that runs now: this checkout's working tree, or on a
    committed tree without a repository of its own (``run_committed.sh``, ``stamped``: its commit) the raw records'
    repository at that commit.  A history that cannot tell stops the caller with a message (``SystemExit``)."""
    here = Checker()
    if here.usable() and stamped is None:
        checker = here
    else:
        checker = Checker(Path(raw_dir), stamped)
        if not checker.usable():
            raise SystemExit(f"no git repository holds {raw_dir}: cannot tell stale records; keep them instead")

    def is_stale(path: Path) -> bool:
        try:
            verdict = checker.verdict(json.loads(Path(path).read_text()), str(path))
        except HistoryMissing as err:
            raise SystemExit(f"cannot tell whether {path} matches the code: {err}; or keep stale records") from err
        return verdict is not None and not verdict.fresh

    return is_stale
