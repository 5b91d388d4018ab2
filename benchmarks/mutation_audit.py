"""Mutation audit: mutmut over the modules you name, capped and resumable, and a dated report with its commit.

    python -m benchmarks.mutation_audit strategies/fedcac_math.py client_app/fedcac_math.py --minutes 60
    python -m benchmarks.mutation_audit strategies/cfl_math.py --max-mutants 20 --tests tests/pfedlia/test_math.py
    python -m benchmarks.mutation_audit --table    # re-render docs/mutation/README.md's table from verdicts.json
    python -m benchmarks.mutation_audit --stale    # which recorded verdicts describe code that has since changed

An audit exports the commit (``git archive``: uncommitted work cannot leak in) into a work folder
(``build/mutation-audit/``), runs mutmut there (``[tool.mutmut]`` in pyproject.toml, its ``only_mutate`` narrowed
to the named modules and, with ``--tests``, its test selection to the given paths) on the mutants that have no verdict
for today's code yet, at most ``--max-mutants`` of them and for at most ``--minutes``, and then writes what it has:

- ``docs/mutation/reports/<date>-<commit>.json``: the audited modules' per-mutant verdicts (the data);
- ``docs/mutation/reports/<date>-<commit>.md``: the score table computed from them and ``equivalent.csv``, the
  survivors, and the equivalents to review again;
- ``docs/mutation/verdicts.json``: the latest verdict of every mutant of every module ever audited, which this
  audit's verdicts update; the table in ``docs/mutation/README.md`` is rendered from it.

Running the same command again goes on where a cap stopped it: mutmut keeps its verdicts in the work folder, and
one stands while its function's code (mutmut's hash of it) is unchanged, across commits too.

Score of a module = caught / (run - equivalent - import-time), caught = killed, timeout or crash.  An equivalent
mutant (no test can tell it from the original on the inputs the method gets) is listed in ``equivalent.csv`` with
its reason; one listed there that a test kills is reported, as is one whose function changed since its verdict.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import datetime
import fcntl
import fnmatch
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path("docs") / "mutation"  # below the repository's root, as are the four below
LEDGER = FOLDER / "verdicts.json"
EQUIVALENT = FOLDER / "equivalent.csv"
DOC = FOLDER / "README.md"
REPORTS = FOLDER / "reports"
WORKDIR = Path("build") / "mutation-audit"
BEGIN, END = "<!-- mutation-scores:begin -->", "<!-- mutation-scores:end -->"

#: mutmut 3.8's exit codes (mutmut.stats.status_by_exit_code), folded into what the score needs
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "type check",
    -11: "segfault",
    -9: "segfault",
}
CAUGHT = ("killed", "timeout", "type check", "segfault")
#: kinds of reviewed mutants (equivalent.csv): ``equivalent`` and ``import-time`` (a function that only runs while its
#: module is imported: mutmut switches a mutant on after the imports) are left out of the score; ``gpu-only`` (a
#: device move that only a GPU run can tell from the original) stays in it as not caught
KINDS = ("equivalent", "import-time", "gpu-only")
#: the target: at least this share of the non-equivalent mutants caught in every method module
TARGET = 0.90
#: the modules of each method (and the code every method runs); the target applies to each of them
METHOD_MODULES = {
    "FedC2I": ("client_app/fedc2i.py", "client_app/fedc2i_math.py", "strategies/fedc2i.py", "task/methods/fedc2i.py"),
    "FedCAC": (
        "client_app/fedcac.py",
        "client_app/fedcac_math.py",
        "strategies/fedcac.py",
        "strategies/fedcac_math.py",
        "task/methods/fedcac.py",
    ),
    "pFedLIA": (
        "client_app/pfedlia.py",
        "client_app/pfedlia_math.py",
        "strategies/pfedlia.py",
        "strategies/pfedlia_math.py",
        "task/methods/pfedlia.py",
    ),
    "PI-FL": (
        "client_app/pifl.py",
        "strategies/pifl.py",
        "strategies/pifl_math.py",
        "strategies/tier_tables.py",
        "task/methods/pifl.py",
    ),
    "Client2Vec": (
        "client_app/client2vec.py",
        "client_app/client2vec_math.py",
        "strategies/client2vec.py",
        "strategies/client2vec_math.py",
        "task/dsa_ign.py",
        "task/methods/client2vec.py",
    ),
    "FedBN": ("client_app/fedbn.py", "strategies/fedbn.py", "task/methods/fedbn.py"),
    "every method": ("task/train.py", "task/methods/__init__.py"),
}


# -- the verdict data: {"modules": {module: its mutant count}, "mutants": {name: {module, status, commit}}} --------


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def _numbers(ranges: str) -> list[int]:
    """``"1-3,5"`` -> ``[1, 2, 3, 5]``."""
    out: list[int] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def compact(data: dict) -> dict:
    """The data as stored: module -> commit -> status -> function -> its mutants' numbers as ranges."""
    verdicts: dict[str, dict[str, dict[str, dict[str, list[int]]]]] = {}
    for name, rec in data["mutants"].items():
        function, _, number = name.rpartition("__mutmut_")
        by_status = verdicts.setdefault(rec["module"], {}).setdefault(rec["commit"], {})
        by_status.setdefault(rec["status"], {}).setdefault(function, []).append(int(number))
    return {
        "modules": dict(sorted(data["modules"].items())),
        "verdicts": {
            module: {
                commit: {
                    status: {f: _ranges(ns) for f, ns in sorted(functions.items())}
                    for status, functions in sorted(statuses.items())
                }
                for commit, statuses in sorted(commits.items())
            }
            for module, commits in sorted(verdicts.items())
        },
    }


def expand(stored: dict) -> dict:
    """:func:`compact`'s inverse."""
    mutants = {
        f"{function}__mutmut_{n}": {"module": module, "status": status, "commit": commit}
        for module, commits in stored["verdicts"].items()
        for commit, statuses in commits.items()
        for status, functions in statuses.items()
        for function, ranges in functions.items()
        for n in _numbers(ranges)
    }
    return {"modules": dict(stored["modules"]), "mutants": dict(sorted(mutants.items()))}


def load(path: Path) -> dict:
    return expand(json.loads(path.read_text())) if path.exists() else {"modules": {}, "mutants": {}}


def save(data: dict, path: Path, **extra: object) -> None:
    """Write ``data`` compactly (with ``extra`` keys first) to ``path`` in one step: a reader never sees half a file.
    One line per module in each of "modules" and "verdicts", so that an audit's diff shows the modules it changed."""

    def dumps(value: object) -> str:
        return json.dumps(value, ensure_ascii=False)

    def block(mapping: dict) -> str:
        return "{\n" + ",\n".join(f"  {dumps(k)}: {dumps(v)}" for k, v in mapping.items()) + "\n }"

    stored = compact(data)
    items = [f" {dumps(k)}: {dumps(v)}" for k, v in extra.items()]
    items += [f" {dumps(k)}: {block(stored[k])}" for k in ("modules", "verdicts")]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("{\n" + ",\n".join(items) + "\n}\n")
    tmp.replace(path)


def dotted(module: str) -> str:
    """A module's path as the prefix of its mutant names: ``strategies/robust.py`` -> ``strategies.robust``; a
    package's ``__init__.py`` is the package (``task/methods/__init__.py`` -> ``task.methods``), as mutmut names it."""
    return module[: -len(".py")].replace("/", ".").removesuffix(".__init__")


def function_of(name: str, module: str) -> str:
    """The function part of a mutant's name as mutmut keys its hashes: ``x_f`` or ``xǁClassǁmethod``."""
    return name[len(dotted(module)) + 1 :].rpartition("__mutmut_")[0]


# -- from mutmut to verdicts ----------------------------------------------------------------------------------------


def mutants_of(module: str, source: str) -> dict[str, str]:
    """Every mutant mutmut makes of ``source`` (the code of ``module``), by name, with the hash of its function's
    code: the names and hashes ``mutmut run`` gives them."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    mutated = mutate_file_contents(module, source)
    prefix = dotted(module)
    return {
        f"{prefix}.{name}": mutated.hash_by_function_name.get(name.rpartition("__mutmut_")[0], "")
        for name in mutated.mutant_names
    }


def verdicts_from_meta(meta: dict, today: dict[str, str], module: str, commit: str) -> tuple[dict, list[str]]:
    """The verdicts mutmut's ``.meta`` file of ``module`` holds for today's mutants (:func:`mutants_of`), labelled
    with ``commit``, and the mutants without one.  A verdict stands only while its function hashes as it did when
    mutmut ran it."""
    codes, hashes = meta.get("exit_code_by_key", {}), meta.get("hash_by_function_name", {})
    verdicts, pending = {}, []
    for name, digest in today.items():
        code = codes.get(name)
        if code is None or hashes.get(function_of(name, module)) != digest:
            pending.append(name)
        else:
            verdicts[name] = {"module": module, "status": STATUS.get(code, "suspicious"), "commit": commit}
    return verdicts, pending


def function_sources(source: str) -> dict[str, str]:
    """Each function mutmut mutates (``x_name``, ``xǁClassǁname``) as normalised code: docstrings, comments and
    annotations out, one layout.  mutmut mutates none of these, so two versions with the same normalised code have
    the same mutants under the same numbers."""

    class Unannotated(ast.NodeTransformer):
        def visit_arg(self, node: ast.arg) -> ast.arg:
            node.annotation = None
            return node

        def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
            if node.value is None:
                return ast.Pass()
            return ast.Assign(targets=[node.target], value=self.visit(node.value), lineno=node.lineno)

    def normalised(node: ast.AST) -> str:
        node = Unannotated().visit(ast.parse(ast.unparse(node)).body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
        for n in ast.walk(node):
            body = getattr(n, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                n.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        return ast.unparse(node)

    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[f"x_{node.name}"] = normalised(node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"xǁ{node.name}ǁ{sub.name}"] = normalised(sub)
    return out


def _source(root: Path, module: str, commit: str | None) -> str | None:
    """``module``'s code at ``commit`` (None: the working tree), or None where there is none."""
    if commit is None:
        path = root / module
        return path.read_text() if path.exists() else None
    shown = subprocess.run(
        ["git", "-C", str(root), "show", f"{commit}:{module}"], capture_output=True, text=True, check=False
    )
    return shown.stdout if shown.returncode == 0 else None


def stale(data: dict, root: Path = ROOT, at: str | None = None) -> tuple[dict[str, str], list[str]]:
    """The recorded verdicts that do not describe the code at ``at`` (None: the working tree): {mutant: why} for each
    whose function's code at the commit the verdict names differs (or is gone), and the commits git does not have (a
    shallow clone), whose verdicts cannot be checked."""
    then_by: dict[tuple[str, str], dict[str, str] | None] = {}
    now_by: dict[str, dict[str, str]] = {}
    out, missing = {}, set()
    for name, rec in data["mutants"].items():
        module, commit = rec["module"], rec["commit"]
        if module not in now_by:
            source = _source(root, module, at)
            now_by[module] = function_sources(source) if source is not None else {}
        if (commit, module) not in then_by:
            source = _source(root, module, commit)
            then_by[commit, module] = function_sources(source) if source is not None else None
        then, now = then_by[commit, module], now_by[module]
        if then is None:
            missing.add(commit)
            continue
        function = function_of(name, module)
        if function not in now:
            out[name] = f"{function} is no longer in {module}"
        elif then.get(function) != now[function]:
            out[name] = f"{function} changed since {commit}"
    return out, sorted(missing)


def merge(ledger: dict, audit: dict, today: dict[str, set[str]], outdated: set[str]) -> tuple[dict, list[str]]:
    """The ledger with an audit's verdicts: for each audited module (``today``: its mutants in the audited code), its
    count becomes today's and the audit's verdicts replace earlier ones; an earlier verdict of a mutant the audit did
    not run stays unless the mutant is gone or ``outdated`` (its function changed).  Also returns the dropped ones."""
    mutants, dropped = {}, []
    for name, rec in ledger["mutants"].items():
        if rec["module"] in today and (name not in today[rec["module"]] or name in outdated):
            dropped.append(name)
        else:
            mutants[name] = rec
    mutants |= audit["mutants"]
    modules = ledger["modules"] | {m: len(names) for m, names in today.items()}
    return {"modules": dict(sorted(modules.items())), "mutants": dict(sorted(mutants.items()))}, sorted(dropped)


def equivalents(path: Path) -> dict[str, tuple[str, str]]:
    """equivalent.csv: mutant -> (kind, reason); a kind not in :data:`KINDS` or an empty reason is refused."""
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for row in rows:
        kind = row["kind"].strip()
        if kind not in KINDS:
            raise SystemExit(f"{path}: kind of {row['mutant']} is {kind!r}; allowed: {', '.join(KINDS)}")
        if not row["reason"].strip():
            raise SystemExit(f"{path}: {row['mutant']} has no reason")
        out[row["mutant"].strip()] = (kind, row["reason"].strip())
    return out


# -- the tables ----------------------------------------------------------------------------------------------------


def counts(data: dict, equiv: dict[str, tuple[str, str]]) -> tuple[dict[str, Counter], list[str]]:
    """Per module: how many mutants were run, caught, survived, were equivalent ...; and the listed equivalents a
    test kills (they count as caught)."""
    per: dict[str, Counter] = {m: Counter() for m in data["modules"]}
    killed_equivalents = []
    for name, rec in data["mutants"].items():
        c = per.setdefault(rec["module"], Counter())
        status = rec["status"]
        c["run"] += 1
        if status in CAUGHT:
            c["caught"] += 1
            if name in equiv:
                killed_equivalents.append(name)
            elif status != "killed":  # a timeout or crash: on a loaded machine not always the mutant's doing
                c["not killed outright"] += 1
        elif name in equiv:
            c[equiv[name][0]] += 1
        else:
            c["no tests" if status in ("skipped", "suspicious") else status] += 1
    return per, killed_equivalents


def _score(c: Counter) -> str:
    scored = c["run"] - c["equivalent"] - c["import-time"]
    return f"{100 * c['caught'] / scored:.1f}%" if scored else "-"


def score_table(data: dict, equiv: dict[str, tuple[str, str]]) -> list[str]:
    """The per-module table (a module none of whose mutants was run has no row, its mutants count in the total), the
    survivors and the gpu-only mutants not caught."""
    per, _ = counts(data, equiv)
    commits: dict[str, set[str]] = {}
    for rec in data["mutants"].values():
        commits.setdefault(rec["module"], set()).add(rec["commit"][:7])
    lines = [
        (
            "| module | mutants | not run | run | caught | of which timeout / crash | survived | gpu-only | no tests | "
            "equivalent | import-time | score | run on |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals: Counter[str] = Counter()
    for module in sorted(per):
        c = per[module]
        total = data["modules"].get(module, c["run"])
        totals["total"] += total
        if not c["run"]:
            continue
        lines.append(
            f"| {module} | {total} | {total - c['run']} | {c['run']} | {c['caught']} | {c['not killed outright']} | "
            f"{c['survived']} | {c['gpu-only']} | {c['no tests']} | {c['equivalent']} | {c['import-time']} | "
            f"{_score(c)} | {', '.join(sorted(commits[module]))} |"
        )
        totals.update(c)
    lines.append(
        f"| **all of the above** | {totals['total']} | {totals['total'] - totals['run']} | {totals['run']} | "
        f"{totals['caught']} | {totals['not killed outright']} | {totals['survived']} | {totals['gpu-only']} | "
        f"{totals['no tests']} | {totals['equivalent']} | {totals['import-time']} | {_score(totals)} | |"
    )
    not_run = sorted(m for m in data["modules"] if not per[m]["run"])
    if not_run:
        lines += ["", "Not run at all: " + ", ".join(f"`{m}` ({data['modules'][m]})" for m in not_run) + "."]
    survived = [n for n, r in data["mutants"].items() if r["status"] == "survived" and n not in equiv]
    if survived:
        lines += ["", "Surviving (not equivalent, no test kills them yet):", "", *(f"- `{n}`" for n in survived)]
    gpu = [
        n for n, r in data["mutants"].items() if n in equiv and equiv[n][0] == "gpu-only" and r["status"] not in CAUGHT
    ]
    if gpu:
        lines += ["", "Not caught, gpu-only (the same values on a CPU; counted against the score):", ""]
        lines += [f"- `{n}`" for n in gpu]
    return lines


def method_summary(data: dict, per: dict[str, Counter], methods: dict = METHOD_MODULES) -> list[str]:
    """One row per method: is every module of it run completely, and is each at or above the target?"""
    out = [
        (
            f"Target: at least {TARGET:.0%} of the non-equivalent mutants caught in every module of every method, "
            "with every mutant run."
        ),
        "",
        "| method | modules | mutants not run | lowest module score | target met |",
        "|---|---|---|---|---|",
    ]
    for method, modules in methods.items():
        not_run, scores, unknown = 0, [], []
        for module in modules:
            c = per.get(module, Counter())
            total = data["modules"].get(module)
            if total is None:
                unknown.append(module)
                continue
            not_run += total - c["run"]
            scored = c["run"] - c["equivalent"] - c["import-time"]
            if scored:
                scores.append((c["caught"] / scored, module))
        lowest = min(scores) if scores else None
        met = not unknown and not not_run and lowest is not None and lowest[0] >= TARGET
        low = f"{100 * lowest[0]:.1f}% (`{lowest[1]}`)" if lowest else "-"
        missing = f"{not_run}" + (f" + never run: {', '.join(f'`{m}`' for m in unknown)}" if unknown else "")
        out.append(f"| {method} | {len(modules)} | {missing} | {low} | {'yes' if met else 'no'} |")
    return out


def render_doc(doc: str, data: dict, equiv: dict[str, tuple[str, str]]) -> str:
    """``doc`` with its generated block holding the score table and the method summary of ``data``."""
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"no {BEGIN} ... {END} block to fill")
    per, _ = counts(data, equiv)
    text = "\n".join([*score_table(data, equiv), "", *method_summary(data, per)])
    return re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}\n{END}", doc, flags=re.DOTALL)


def report_text(report: dict, equiv: dict[str, tuple[str, str]], review: list[str]) -> str:
    """A report's page: what was run, how far it got, its scores, and what to do about what it found."""
    data = expand(report)
    _, killed = counts(data, equiv)
    pending = sum(data["modules"].values()) - len(data["mutants"])
    lines = [
        f"# Mutation audit of {report['date']}, commit `{report['commit']}`",
        "",
        f"`{report['command']}`",
        "",
        (
            f"Tests: {', '.join(f'`{t}`' for t in report['tests'])} (a narrower selection than the default can only "
            "lower a score)."
            if report["tests"]
            else "Tests: the default selection of `[tool.mutmut]`."
        ),
        "",
        f"{len(data['mutants'])} of {sum(data['modules'].values())} mutants have a verdict"
        + (f"; {pending} not run yet (a cap stopped it): the same command goes on." if pending else "."),
        "",
        *score_table(data, equiv),
    ]
    if killed:
        lines += ["", "Listed in equivalent.csv but killed by a test (take them out):", ""]
        lines += [f"- `{n}`" for n in killed]
    if review:
        lines += ["", "Listed in equivalent.csv, but their function changed since (review them again):", ""]
        lines += [f"- `{n}`" for n in review]
    return "\n".join(lines) + "\n"


# -- running mutmut ------------------------------------------------------------------------------------------------


def check_modules(modules: list[str], root: Path) -> None:
    """Refuse a module that does not exist or that ``[tool.mutmut] only_mutate`` does not mutate."""
    allowed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    for module in modules:
        if not (root / module).is_file():
            raise SystemExit(f"{module}: no such file (name modules by their path from the repository root)")
        if not any(fnmatch.fnmatch(module, pattern) for pattern in allowed):
            raise SystemExit(f"{module}: not a module mutmut mutates; [tool.mutmut] only_mutate allows {allowed}")


def _toml_array(key: str, values: list[str], text: str) -> str:
    """``text`` with the array assigned to ``key`` (one or several lines) replaced by ``values``."""
    pattern = re.compile(rf"^{re.escape(key)} = \[.*?\]$", re.MULTILINE | re.DOTALL)
    new, n = pattern.subn(lambda _: f"{key} = {json.dumps(values)}", text, count=1)
    if n != 1:
        raise SystemExit(f"pyproject.toml has no `{key} = [...]` under [tool.mutmut]")
    return new


def narrowed_pyproject(text: str, modules: list[str], tests: list[str]) -> str:
    """The export's pyproject.toml: mutmut mutates only ``modules`` and, if ``tests`` are given, runs them in place
    of ``tests`` in the test selection (its markers and deselected tests stay)."""
    text = _toml_array("only_mutate", modules, text)
    if tests:
        selection = tomllib.loads(text)["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
        if "tests" not in selection:
            raise SystemExit("[tool.mutmut] pytest_add_cli_args_test_selection does not name `tests` to narrow")
        i = selection.index("tests")
        text = _toml_array("pytest_add_cli_args_test_selection", [*selection[:i], *tests, *selection[i + 1 :]], text)
    return text


def export(root: Path, workdir: Path, commit: str, modules: list[str], tests: list[str]) -> Path:
    """The commit's tree in ``workdir/tree``, its mutmut configuration narrowed, with mutmut's verdicts (``.meta``)
    kept from earlier audits.  Made afresh (mutmut's copies and test map dropped) unless the commit, the modules and
    the tests are those of the last audit, whose copies and test map mutmut then reuses."""
    tree, state_file = workdir / "tree", workdir / "state.json"
    state = {"commit": commit, "modules": sorted(modules), "tests": tests}
    if tree.is_dir() and state_file.exists() and json.loads(state_file.read_text()) == state:
        return tree
    metas = {p.relative_to(tree): p.read_bytes() for p in (tree / "mutants").rglob("*.meta")} if tree.is_dir() else {}
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", commit], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    for rel, content in metas.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(content)
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(narrowed_pyproject(pyproject.read_text(), modules, tests))
    state_file.write_text(json.dumps(state))
    return tree


def run_capped(command: list[str], cwd: Path, seconds: float) -> int | None:
    """Run ``command`` in its own process group; past ``seconds``, interrupt it (mutmut then stops its workers and
    keeps every verdict it has) and then kill whatever of the group is left.  Returns its exit status, None if it was
    stopped.  A process it leaves behind (mutmut's forkserver outlives it) is killed too."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests must import the mutants' copy
    env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)  # an export is no checkout of the repository
    proc = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        return None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def audit(
    modules: list[str],
    *,
    root: Path = ROOT,
    commit: str = "HEAD",
    minutes: float = 60,
    max_mutants: int | None = None,
    tests: list[str] | None = None,
    workers: int = 1,
    workdir: Path | None = None,
    command: str = "",
    date: str | None = None,
) -> Path:
    """Run the audit (the module's docstring) and return its report's path."""
    modules, tests = sorted(set(modules)), list(tests or [])
    check_modules(modules, root)
    git = ["git", "-C", str(root)]
    sha = subprocess.run([*git, "rev-parse", "--short=12", commit], capture_output=True, text=True, check=True)
    commit = sha.stdout.strip()
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", *modules], capture_output=True, text=True, check=False
    )
    if changed.stdout.strip():
        print(f"auditing commit {commit}; the uncommitted changes to these modules are not audited:\n{changed.stdout}")
    workdir = workdir or root / WORKDIR
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"another audit is running in {workdir}: wait for it, or give another --workdir") from None
        return _audit(root, workdir, commit, modules, tests, minutes, max_mutants, workers, command, date)


def _audit(
    root: Path,
    workdir: Path,
    commit: str,
    modules: list[str],
    tests: list[str],
    minutes: float,
    max_mutants: int | None,
    workers: int,
    command: str,
    date: str | None,
) -> Path:
    tree = export(root, workdir, commit, modules, tests)
    today = {m: mutants_of(m, (tree / m).read_text()) for m in modules}

    def read() -> tuple[dict, list[str]]:
        verdicts: dict[str, dict] = {}
        pending: list[str] = []
        for m in modules:
            meta_path = tree / "mutants" / f"{m}.meta"
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            found, left = verdicts_from_meta(meta, today[m], m, commit)
            verdicts |= found
            pending += left
        return verdicts, pending

    verdicts, pending = read()
    chosen = pending[:max_mutants] if max_mutants is not None else pending
    if chosen:
        print(f"running {len(chosen)} of the {len(pending)} mutants without a verdict, for at most {minutes} min")
        mutmut = shutil.which("mutmut") or str(Path(sys.executable).with_name("mutmut"))
        status = run_capped(
            ["nice", "-n", "10", mutmut, "run", "--max-children", str(workers), *chosen], tree, minutes * 60
        )
        if status is None:
            print(f"stopped after {minutes} min")
        elif status != 0:
            raise SystemExit(f"mutmut stopped with status {status} (its output is above); nothing was recorded")
        verdicts, pending = read()
    audited = {"modules": {m: len(today[m]) for m in modules}, "mutants": verdicts}

    ledger = load(root / LEDGER)
    mine = {"modules": {}, "mutants": {n: r for n, r in ledger["mutants"].items() if r["module"] in today}}
    outdated, missing = stale(mine, root, at=commit)
    unknown = {n for n, r in mine["mutants"].items() if r["commit"] in missing}
    if unknown:  # a rebased branch's commit, or a shallow clone: nothing says the verdict is of today's code
        print(f"{len(unknown)} recorded verdicts name commits git does not have ({', '.join(missing)}): dropped")
    ledger, dropped = merge(ledger, audited, {m: set(names) for m, names in today.items()}, set(outdated) | unknown)
    save(ledger, root / LEDGER)
    equiv = equivalents(root / EQUIVALENT)
    doc = root / DOC
    if doc.exists():
        doc.write_text(render_doc(doc.read_text(), ledger, equiv))

    date = date or datetime.datetime.now(datetime.UTC).date().isoformat()
    path = root / REPORTS / f"{date}-{commit}.json"
    if path.exists():  # the same day and commit: one report, this audit's modules replacing their earlier verdicts
        earlier = load(path)
        audited = {
            "modules": earlier["modules"] | audited["modules"],
            "mutants": {n: r for n, r in earlier["mutants"].items() if r["module"] not in today} | verdicts,
        }
    command = command or shlex.join(["python", "-m", "benchmarks.mutation_audit", *modules])
    save(audited, path, date=date, commit=commit, command=command, tests=tests)
    review = [n for n in dropped if n in equiv]
    path.with_suffix(".md").write_text(report_text(json.loads(path.read_text()), equiv, review))
    print(f"{len(verdicts)} verdicts, {len(pending)} mutants left; report: {path.with_suffix('.md')}")
    print(f"{LEDGER} and the table of {DOC} updated")
    return path.with_suffix(".md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help="the modules to audit, by path (e.g. strategies/fedcac_math.py)")
    ap.add_argument("--minutes", type=float, default=60, help="stop mutmut after this long (default 60)")
    ap.add_argument("--max-mutants", type=int, help="run at most this many mutants this time")
    ap.add_argument("--tests", nargs="*", default=[], help="test paths to run in place of all of tests/")
    ap.add_argument("--workers", type=int, default=1, help="mutants run at once (default 1)")
    ap.add_argument("--commit", default="HEAD", help="the commit to audit (default HEAD)")
    ap.add_argument("--workdir", type=Path, default=ROOT / WORKDIR, help=f"mutmut's work folder (default {WORKDIR})")
    ap.add_argument("--table", action="store_true", help="only re-render docs/mutation/README.md's table")
    ap.add_argument("--stale", action="store_true", help="list the recorded verdicts of code that has since changed")
    args = ap.parse_args(argv)
    if args.table:
        (ROOT / DOC).write_text(
            render_doc((ROOT / DOC).read_text(), load(ROOT / LEDGER), equivalents(ROOT / EQUIVALENT))
        )
        print(f"rendered {DOC} from {LEDGER} and {EQUIVALENT}")
        return 0
    if args.stale:
        data = load(ROOT / LEDGER)
        old, missing = stale(data)
        for module, n in sorted(Counter(data["mutants"][name]["module"] for name in old).items()):
            print(f"{n:5d}  {module}")
        if missing:
            print("commits git does not have (their verdicts were not checked):", ", ".join(missing))
        print(
            f"{len(old)} of {len(data['mutants'])} verdicts describe code that has since changed: audit those modules"
        )
        return 0
    if not args.modules:
        ap.error("name the modules to audit (or --table, --stale)")
    command = shlex.join(["python", "-m", "benchmarks.mutation_audit", *(argv if argv is not None else sys.argv[1:])])
    audit(
        args.modules,
        commit=args.commit,
        minutes=args.minutes,
        max_mutants=args.max_mutants,
        tests=args.tests,
        workers=args.workers,
        workdir=args.workdir,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
