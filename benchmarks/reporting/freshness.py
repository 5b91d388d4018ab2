"""Records that match the code: a record is *fresh* when its method's files and the shared training code are the same
in the code it ran and in the code that runs now; otherwise it is *stale* and its numbers describe other code.

Which files count is ``benchmarks/method_code.py``'s (the method's files from the registry, and :data:`SHARED`).  A
record that keeps the digests of the files it ran (``code.files``) is compared with the files now, digest by digest:
no repository history is needed, so a fresh shallow clone (CI) can tell.  An older record without them is compared by
``git diff <record's commit> <now> -- <files>`` (now: the working tree, or a commit), which needs the record's commit
in the repository's history: a shallow clone lacks it and gets a clear message instead of a verdict.  Against a named
commit (a committed tree that runs, ``stale_test``) the comparison is always ``git diff``.
``python -m benchmarks.report --check`` refuses stale records; the grids script runs a stale record's run again.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.method_code import SHARED, file_digests, method_files
from benchmarks.records import BENCHMARKS, Rec

from .text import plural

ROOT = BENCHMARKS.parent


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
    """Compares records with the code now (``target``: a commit; None: the working tree) in ``repo``; the files now of
    a record that keeps its files' digests are those under ``code_root`` (default: ``repo``)."""

    def __init__(self, repo: Path = ROOT, target: str | None = None, code_root: Path | None = None) -> None:
        self.repo, self.target = Path(repo), target
        self.code_root = Path(code_root) if code_root is not None else self.repo
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
        elif code.get("files") and self.target is None:  # the digests of the files it ran: no history needed
            try:
                now = file_digests(method, self.code_root)
            except KeyError as err:
                v.reason = str(err)
                return v
            ran = code["files"]
            v.changed = sorted(f for f in {*ran, *now} if ran.get(f) != now.get(f))
            if v.changed:
                shown = ", ".join(v.changed[:4]) + (f" and {len(v.changed) - 4} more" if len(v.changed) > 4 else "")
                v.reason = f"{plural(len(v.changed), 'file')} changed since it ran ({commit[:12]}): {shown}"
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


def stale_now(raw_dir: Path) -> Callable[[Path], bool]:
    """:func:`stale_test` for the code that runs now: on a tree ``run_committed.sh`` exported, its stamped commit
    (``.pflower-commit``), else this checkout's working tree."""
    stamp = ROOT / ".pflower-commit"
    return stale_test(raw_dir, stamp.read_text().strip() if stamp.exists() else None)


def stale_test(raw_dir: Path, stamped: str | None = None) -> Callable[[Path], bool]:
    """``path -> whether the record there is stale`` for the code that runs now: this checkout's working tree, or on a
    committed tree without a repository of its own (``run_committed.sh``, ``stamped``: its commit) the raw records'
    repository at that commit.  A history that cannot tell stops the caller with a message (``SystemExit``)."""
    here = Checker()
    if here.usable() and stamped is None:
        checker = here
    else:
        checker = Checker(Path(raw_dir), stamped, code_root=ROOT)
        if not checker.usable():
            raise SystemExit(f"no git repository holds {raw_dir}: cannot tell stale records; keep them instead")

    def is_stale(path: Path) -> bool:
        try:
            verdict = checker.verdict(json.loads(Path(path).read_text()), str(path))
        except HistoryMissing as err:
            raise SystemExit(f"cannot tell whether {path} matches the code: {err}; or keep stale records") from err
        return verdict is not None and not verdict.fresh

    return is_stale
