"""Mutation-testing results, kept traceable (how to run mutmut: docs/mutation/README.md).

mutmut keeps its verdicts in ``mutants/**/*.meta``, which is not committed (it is a copy of the tree with every
mutant in it).  This script copies the verdicts that matter into ``docs/mutation/verdicts.json`` (committed) and
renders the per-module score table of ``docs/mutation/README.md`` from that file and the reviewed list of
equivalent mutants, ``docs/mutation/equivalent.csv``; no score in the README is typed by hand.

    python tests/mutation_scores.py collect MUTANTS_DIR --commit REV [--only "strategies.fedcac_math.*" ...]
    python tests/mutation_scores.py table            # rewrites the table in docs/mutation/README.md
    python tests/mutation_scores.py table --check    # exit 1 if the README's table is not what the files give
    python tests/mutation_scores.py list [--status survived ...]   # every mutant: name, status, commit
    python tests/mutation_scores.py stale [--check]  # verdicts whose function changed since the commit they name
    python tests/mutation_scores.py stale --drop     # drop them, and count every module's mutants in today's code

``collect`` records, for each mutant mutmut has a verdict for (optionally only those matching the globs), its
status and the commit of the tree it was run on; it also records every module's mutant count so that the
mutants not run show up as such.  Several exports (one per person or helper) can be collected into the same file
one after another; a later verdict for the same mutant replaces an earlier one.  ``verdicts.json`` holds the
verdicts compactly and losslessly: per module, commit and status, each function's mutant numbers as ranges
(``"1-45,47"``); ``list`` prints them one mutant a line.

Score of a module = (killed + timeout) / (run - equivalent - import-time), where "run" counts every mutant with
a verdict.  An equivalent mutant is one no test can tell from the original on the inputs the method gets; each
has a reason in equivalent.csv, and one listed there that a test now kills is reported as stale.
"""

from __future__ import annotations

import argparse
import ast
import csv
import fcntl
import fnmatch
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "mutation"
RESULTS = FOLDER / "verdicts.json"
EQUIVALENT = FOLDER / "equivalent.csv"
DOC = FOLDER / "README.md"
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
#: kinds of reviewed mutants (docs/mutation/equivalent.csv): ``equivalent`` and ``import-time`` are left out of the
#: score; ``gpu-only`` (a device move that only a GPU run can tell from the original) stays in it as not caught
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


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    numbers = sorted(numbers)
    runs: list[list[int]] = []
    for n in numbers:
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
    """``{"modules", "mutants"}`` (one entry per mutant) as stored: module -> commit -> status -> function ->
    its mutants' numbers as ranges."""
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
    """:func:`compact`'s inverse: ``{"modules": {module: mutants}, "mutants": {name: {module, status, commit}}}``."""
    mutants = {
        f"{function}__mutmut_{n}": {"module": module, "status": status, "commit": commit}
        for module, commits in stored["verdicts"].items()
        for commit, statuses in commits.items()
        for status, functions in statuses.items()
        for function, ranges in functions.items()
        for n in _numbers(ranges)
    }
    return {"modules": dict(stored["modules"]), "mutants": dict(sorted(mutants.items()))}


def _save(data: dict, path: Path) -> None:
    """Write ``data`` compactly to ``path`` in one step (a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(compact(data), indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _dotted(module: str) -> str:
    """A module's path as the prefix of its mutant names: ``strategies/robust.py`` -> ``strategies.robust``; a
    package's ``__init__.py`` is the package (``task/methods/__init__.py`` -> ``task.methods``), as mutmut names it."""
    dotted = module[: -len(".py")].replace("/", ".")
    return dotted.removesuffix(".__init__")


def load(path: Path = RESULTS) -> dict:
    if path.exists():
        return expand(json.loads(path.read_text()))
    return {"modules": {}, "mutants": {}}


def collect(mutants_dir: Path, commit: str, only: list[str], path: Path = RESULTS) -> tuple[int, int]:
    metas = sorted(mutants_dir.rglob("*.py.meta"))
    if not metas:
        raise SystemExit(f"no mutmut results (*.py.meta) under {mutants_dir}: run `mutmut run` there first")
    path.parent.mkdir(parents=True, exist_ok=True)
    added = counted = 0
    with path.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load(path)
        for meta in metas:
            module = str(meta.relative_to(mutants_dir))[: -len(".meta")]
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            if not codes:
                continue
            if not only or any(fnmatch.fnmatch(k, g) for k in codes for g in only):
                data["modules"][module] = len(codes)
                # a verdict for a mutant the module no longer has (the code changed and mutmut renumbered) goes
                gone = [k for k, v in data["mutants"].items() if v["module"] == module and k not in codes]
                for name in gone:
                    del data["mutants"][name]
            for name, code in codes.items():
                if code is None or (only and not any(fnmatch.fnmatch(name, g) for g in only)):
                    continue
                status = STATUS.get(code, "suspicious")
                data["mutants"][name] = {"module": module, "status": status, "commit": commit[:12]}
                added += 1
            counted += 1
        data["mutants"] = dict(sorted(data["mutants"].items()))
        data["modules"] = dict(sorted(data["modules"].items()))
        _save(data, path)
    return added, counted


def function_sources(source: str) -> dict[str, str]:
    """Each function mutmut mutates (``x_name`` for a module's function, ``xǁClassǁname`` for a method, as in its
    mutant names) as normalised code: docstrings, comments and type annotations out, one layout.  mutmut mutates none
    of these, so two versions with the same normalised code have the same mutants under the same numbers."""

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


def stale(data: dict, root: Path = ROOT) -> tuple[dict[str, str], list[str]]:
    """The recorded verdicts that no longer describe today's code: {mutant: why} for each whose function's code at the
    commit the verdict names differs from the working tree's (or is gone), and the commits git does not have (a
    shallow clone), whose verdicts cannot be checked."""
    at: dict[tuple[str, str], dict[str, str] | None] = {}
    now: dict[str, dict[str, str]] = {}
    out, missing = {}, set()
    for name, rec in data["mutants"].items():
        module, commit = rec["module"], rec["commit"]
        if module not in now:
            path = root / module
            now[module] = function_sources(path.read_text()) if path.exists() else {}
        if (commit, module) not in at:
            shown = subprocess.run(
                ["git", "-C", str(root), "show", f"{commit}:{module}"], capture_output=True, text=True, check=False
            )
            at[commit, module] = function_sources(shown.stdout) if shown.returncode == 0 else None
        then = at[commit, module]
        if then is None:
            missing.add(commit)
            continue
        function = name[len(_dotted(module)) + 1 :].rsplit("__mutmut_", 1)[0]
        if function not in now[module]:
            out[name] = f"{function} is no longer in {module}"
        elif then.get(function) != now[module][function]:
            out[name] = f"{function} changed since {commit}"
    return out, sorted(missing)


def todays_mutants(modules: list[str], root: Path = ROOT) -> dict[str, list[str]]:
    """Every mutant mutmut makes of each module today (its names, generated the way ``mutmut run`` does; run from the
    repository root, whose pyproject.toml holds mutmut's configuration)."""
    import mutmut.__main__ as mm  # mutmut reads its configuration when imported

    out: dict[str, list[str]] = {}
    for module in modules:
        path = root / module
        if not path.exists():
            out[module] = []
            continue
        prefix = _dotted(module) + "."
        names = mm.mutate_file_contents(module, path.read_text()).mutant_names
        out[module] = [n if n.startswith(prefix) else prefix + n for n in names]
    return out


def drop_stale(path: Path = RESULTS, root: Path = ROOT) -> tuple[int, int]:
    """Drop every verdict that no longer describes today's code (:func:`stale`, and any for a mutant today's code does
    not have) and set each module's mutant count to today's, so that the table counts what was never run on today's
    code as not run.  Returns (verdicts dropped, verdicts kept)."""
    with path.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load(path)
        old, missing = stale(data, root)
        if missing:
            raise SystemExit(f"git does not have {', '.join(missing)}: fetch the history (git fetch --unshallow) first")
        today = todays_mutants(sorted(data["modules"]), root)
        names = {n for ns in today.values() for n in ns}
        gone = [n for n in data["mutants"] if n in old or n not in names]
        for n in gone:
            del data["mutants"][n]
        data["modules"] = {m: len(today[m]) for m in sorted(data["modules"])}
        _save(data, path)
    return len(gone), len(data["mutants"])


def equivalents(path: Path = EQUIVALENT) -> dict[str, tuple[str, str]]:
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


def table(data: dict, equiv: dict[str, tuple[str, str]]) -> tuple[str, list[str]]:
    per: dict[str, Counter] = {m: Counter() for m in data["modules"]}
    stale, surviving, gpu_only = [], [], []
    for name, rec in data["mutants"].items():
        c = per.setdefault(rec["module"], Counter())
        status = rec["status"]
        c["run"] += 1
        if name in equiv:
            if status in CAUGHT:
                stale.append(name)
                c["caught"] += 1
            else:
                c[equiv[name][0]] += 1
                if equiv[name][0] == "gpu-only":
                    gpu_only.append(name)
        elif status in CAUGHT:
            c["caught"] += 1
            if status != "killed":  # a timeout or crash: on a loaded machine not always the mutant's doing
                c["not killed outright"] += 1
        elif status == "survived":
            c["survived"] += 1
            surviving.append(name)
        else:
            c[status] += 1
    lines = [
        (
            "| module | mutants | not run | run | caught | of which timeout / crash | survived | gpu-only | no tests | "
            "equivalent | import-time | score |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals: Counter[str] = Counter()
    for module in sorted(per):
        c = per[module]
        total = data["modules"].get(module, c["run"])
        if not c["run"]:  # no row (listed under "Not run at all"), but its mutants count in the total
            totals["total"] += total
            continue
        scored = c["run"] - c["equivalent"] - c["import-time"]
        score = f"{100 * c['caught'] / scored:.1f}%" if scored else "-"
        lines.append(
            f"| {module} | {total} | {total - c['run']} | {c['run']} | {c['caught']} | {c['not killed outright']} | "
            f"{c['survived']} | "
            f"{c['gpu-only']} | {c['no tests'] + c['skipped'] + c['suspicious']} | {c['equivalent']} | "
            f"{c['import-time']} | {score} |"
        )
        totals.update(c)
        totals["total"] += total
    scored = totals["run"] - totals["equivalent"] - totals["import-time"]
    lines.append(
        f"| **all of the above** | {totals['total']} | {totals['total'] - totals['run']} | {totals['run']} | "
        f"{totals['caught']} | {totals['not killed outright']} | {totals['survived']} | {totals['gpu-only']} | "
        f"{totals['no tests'] + totals['skipped'] + totals['suspicious']} | {totals['equivalent']} | "
        f"{totals['import-time']} | {100 * totals['caught'] / max(scored, 1):.1f}% |"
    )
    lines += ["", *method_summary(data, per)]
    commits = sorted({rec["commit"] for rec in data["mutants"].values()})
    not_run = sorted(m for m in data["modules"] if not per.get(m, Counter())["run"])
    text = "\n".join(lines) + "\n\nRun on commit(s) " + ", ".join(f"`{c}`" for c in commits) + "."
    if not_run:
        text += "  Not run at all: " + ", ".join(f"`{m}` ({data['modules'][m]})" for m in not_run) + "."
    if surviving:
        text += "\n\nSurviving (not equivalent, no test kills them yet):\n\n" + "\n".join(f"- `{s}`" for s in surviving)
    if gpu_only:
        text += (
            "\n\nNot caught, kind gpu-only (a device move: the same values on a CPU, so only a run with a GPU, "
            "which these machines lack, could tell it; counted against the score):\n\n"
            + "\n".join(f"- `{s}`" for s in sorted(gpu_only))
        )
    eq_lines = ["| mutant | kind | why no test can tell it from the original |", "|---|---|---|"]
    eq_lines += [f"| `{m}` | {k} | {r} |" for m, (k, r) in sorted(equiv.items()) if m in data["mutants"]]
    text += "\n\n### Equivalent, import-time and gpu-only mutants ([equivalent.csv](equivalent.csv))\n\n" + "\n".join(
        eq_lines
    )
    return text, stale


def method_summary(data: dict, per: dict[str, Counter], methods: dict = METHOD_MODULES) -> list[str]:
    """One row per method: is every module of it run completely, and is each at or above the target?"""
    out = [
        (
            f"Target: at least {TARGET:.0%} of the non-equivalent mutants caught in every module of "
            "every method, with every mutant run."
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


def render(check: bool) -> int:
    text, stale = table(load(), equivalents())
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} block to fill")
    new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}\n{END}", doc, flags=re.DOTALL)
    for name in stale:
        print(f"stale: {name} is listed as equivalent but a test kills it; take it out of {EQUIVALENT.name}")
    if check:
        if new != doc:
            print(f"{DOC} is not what {RESULTS.name} and {EQUIVALENT.name} give: run `python {__file__} table`")
            return 1
        return 1 if stale else 0
    DOC.write_text(new)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="copy mutmut's verdicts from a mutants/ folder into results.json")
    c.add_argument("mutants_dir", type=Path)
    c.add_argument("--commit", required=True, help="the commit the mutated tree was exported from")
    c.add_argument("--only", nargs="*", default=[], help="mutant-name globs to collect (default: all with a verdict)")
    t = sub.add_parser("table", help="render the score table into docs/mutation/README.md")
    t.add_argument("--check", action="store_true")
    li = sub.add_parser("list", help="every recorded mutant: name, status, commit (one a line)")
    li.add_argument("--status", nargs="*", default=[], help="only these statuses (e.g. survived timeout)")
    st = sub.add_parser("stale", help="verdicts whose function changed since the commit they were run on")
    st.add_argument("--check", action="store_true", help="exit 1 if there is any")
    st.add_argument("--drop", action="store_true", help="drop them and count each module's mutants in today's code")
    args = ap.parse_args(argv)
    if args.cmd == "collect":
        added, modules = collect(args.mutants_dir, args.commit, args.only)
        print(f"collected {added} verdicts from {modules} modules into {RESULTS}")
        return 0
    if args.cmd == "stale" and args.drop:
        dropped, kept = drop_stale()
        print(f"dropped {dropped} verdicts of code that has since changed; {kept} kept")
        return 0
    if args.cmd == "stale":
        data = load()
        old, missing = stale(data)
        per = Counter(why for why in old.values())
        for why, n in sorted(per.items()):
            print(f"{n:5d}  {why}")
        if missing:
            print("commits git does not have (their verdicts were not checked):", ", ".join(missing))
        print(f"{len(old)} of {len(data['mutants'])} verdicts describe code that has since changed")
        return 1 if args.check and (old or missing) else 0
    if args.cmd == "list":
        for name, rec in load()["mutants"].items():
            if not args.status or rec["status"] in args.status:
                print(name, rec["status"], rec["commit"])
        return 0
    return render(args.check)


if __name__ == "__main__":
    sys.exit(main())
