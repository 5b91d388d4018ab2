"""Build ``benchmarks/RESULTS.md`` from the committed raw records (``benchmarks/raw/<grid>/*.json``).

No number in RESULTS.md is typed by hand: every table cell, every settings line and every claim with a
number in it ("beats FedAvg in 1 of 6 settings", "+1.1 points") is computed here from the records; the
prose below holds no measured number.  Each table states

- the command that produced its records and the code commit they ran,
- every run-config key whose value differs from ``pyproject.toml``'s ``[tool.flwr.app.config]`` defaults
  (and the number of simulated clients),
- every setting that differs from the paper's (declared per benchmark below, citing the spec section),
- the machine and its load (the machine is shared: seconds are only comparable within one table).

A paired comparison (arm minus reference on the same seed) is printed only when the runs it pairs share
their data (the records' data fingerprints agree) and, where the pairing claims it, their draws.

    python benchmarks/report.py            # rewrite benchmarks/RESULTS.md
    python benchmarks/report.py --check    # exit 1 if RESULTS.md differs from what the records give
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import RAW, digest, failure_line, load_records  # noqa: E402

RESULTS = HERE / "RESULTS.md"
PYPROJECT = HERE.parent / "pyproject.toml"
# run-config keys never listed in a settings line: where results go, and the grid coordinates shown in the table
NOT_SETTINGS = {"results-dir", "c2v-cache-dir", "seed", "method"}
Rec = dict[str, Any]
TIE = 1e-9  # accuracies closer than this are equal (float noise of the mean over clients)


# =========================================================================== small helpers
def defaults(pyproject: Path = PYPROJECT) -> dict[str, Any]:
    return tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]


def span(vals: Iterable[float], nd: int = 1, unit: str = "") -> str:
    """ "a-b" (or "a" when they agree at this precision)."""
    vals = list(vals)
    lo, hi = f"{min(vals):.{nd}f}", f"{max(vals):.{nd}f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def ok(recs: Iterable[Rec]) -> list[Rec]:
    return [r for r in recs if not r.get("error")]


def select(recs: Iterable[Rec], **coords: Any) -> list[Rec]:
    return [r for r in recs if all(r["cell"].get(k) == v for k, v in coords.items())]


def axis(recs: Iterable[Rec], name: str, order: Iterable[str] = ()) -> list[Any]:
    """The values of a grid axis present in the records, in ``order`` first, then sorted."""
    present = {r["cell"].get(name) for r in recs} - {None}
    first = [v for v in order if v in present]
    return first + sorted(present - set(first), key=str)


_EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*: \S")  # "task.options.ConfigConflict: run-config key ..."


def error_line(error: str | None) -> str:
    """The line of a failed run's log tail that names its error: the last exception line of a traceback
    (``package.module.SomeConflict: ...``) when there is one, else ``common.failure_line``'s choice (which
    looks for names ending in Error / Exception / Timeout and falls back to the last line)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", l).strip() for l in (error or "").splitlines()]
    raised = [l for l in lines if _EXCEPTION_LINE.match(l)]
    return raised[-1] if raised else failure_line(error)


def num(v: float | None, nd: int = 4) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def pts(delta: float) -> str:
    """A difference of accuracies in percentage points, signed (two decimals when it is below 0.05)."""
    if abs(delta) <= TIE:
        return "0 points"
    return f"{delta * 100:+.{2 if abs(delta) < 5e-4 else 1}f} points"


def values(recs: Iterable[Rec], metric: Callable[[Rec], Any]) -> list[float]:
    return [float(v) for v in (metric(r) for r in ok(recs)) if v is not None]


def mean(recs: Iterable[Rec], metric: Callable[[Rec], Any]) -> float | None:
    vals = values(recs, metric)
    return float(np.mean(vals)) if vals else None


def mean_std(recs: list[Rec], metric: Callable[[Rec], Any], nd: int = 4) -> str:
    """``mean ± std`` over the runs (population std, as numpy), a single value for one run; failures noted."""
    vals = values(recs, metric)
    failed = [r for r in recs if r.get("error")]
    if not vals:
        return f"failed: {error_line(failed[0]['error'])}" if failed else "—"
    text = f"{vals[0]:.{nd}f}" if len(vals) == 1 else f"{np.mean(vals):.{nd}f} ± {np.std(vals):.{nd}f}"
    return text + (f" ({len(failed)} of {len(recs)} runs failed)" if failed else "")


def summary(key: str) -> Callable[[Rec], Any]:
    return lambda r: r["summary"].get(key)


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def bullets(lines: Iterable[str]) -> str:
    return "\n".join(f"- {line}" for line in lines)


def seeds_of(recs: Iterable[Rec]) -> list[int]:
    return sorted({r["cell"]["seed"] for r in recs if "seed" in r["cell"]})


def label(cell: dict[str, Any]) -> str:
    """A row's label: its grid coordinates except the seed."""
    return " / ".join(str(v) for k, v in cell.items() if k != "seed")


# =========================================================================== pairing
@dataclass
class Paired:
    """Per-seed differences ``arm - ref``, or why the runs could not be paired."""

    deltas: list[float]
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None and bool(self.deltas)

    @property
    def mean(self) -> float:
        return float(np.mean(self.deltas))

    @property
    def std(self) -> float:
        return float(np.std(self.deltas))

    @property
    def wins(self) -> int:
        return int(sum(d > TIE for d in self.deltas))

    def text(self, nd: int = 4) -> str:
        if not self.ok:
            return f"no paired Δ ({self.reason})"
        return f"{self.mean:+.{nd}f}" + (f" ± {self.std:.{nd}f}" if len(self.deltas) > 1 else " (one seed)")

    def wins_text(self) -> str:
        return f"{self.wins}/{len(self.deltas)}" if self.ok else "—"


def same_data_on_shared_columns(a: Rec, b: Rec) -> bool:
    """Records written by code that reports more per-client data columns (e.g. ``test-examples``) fingerprint
    more columns: two such runs hold the same data when their rows agree on the data columns both record."""
    ca, cb = a["fingerprint"].get("data-columns") or [], b["fingerprint"].get("data-columns") or []
    shared = [c for c in ca if c in cb]
    if ca == cb or len(shared) < 2:  # the client id alone says nothing about the data
        return False

    def rows(rec: Rec) -> list[list[Any]]:
        cols = rec["clients"]["columns"]
        return [[row[cols.index(c)] for c in shared] for row in rec["clients"]["rows"]]

    return digest(rows(a)) == digest(rows(b))


def pairing_problem(a: Rec, b: Rec, draws: bool) -> str | None:
    """Why runs ``a`` and ``b`` are not a pair (None when they are): same data, and same draws if ``draws``."""
    fa, fb = a.get("fingerprint", {}), b.get("fingerprint", {})
    if not fa.get("data") or not fb.get("data"):
        return "a run has no data fingerprint"
    if fa["data"] != fb["data"] and not same_data_on_shared_columns(a, b):
        return "the runs' data differ (data fingerprints disagree)"
    if draws:
        if fa.get("draws") is None or fb.get("draws") is None:
            return "the clients drawn per round are not recorded"
        if fa["draws"] != fb["draws"]:
            return "the runs drew different clients (draw fingerprints disagree)"
    return None


def paired(
    arm: list[Rec],
    ref: list[Rec],
    metric: Callable[[Rec], Any],
    ref_metric: Callable[[Rec], Any] | None = None,
    draws: bool = False,
) -> Paired:
    """Seed-paired differences of ``metric(arm) - ref_metric(ref)``; refused unless every pair shares data (and draws)."""
    ref_metric = ref_metric or metric
    by_seed = {r["cell"]["seed"]: r for r in ok(ref)}
    deltas = []
    for a in sorted(ok(arm), key=lambda r: r["cell"]["seed"]):
        b = by_seed.get(a["cell"]["seed"])
        if b is None:
            return Paired([], f"no reference run for seed {a['cell']['seed']}")
        problem = pairing_problem(a, b, draws)
        if problem:
            return Paired([], f"seed {a['cell']['seed']}: {problem}")
        va, vb = metric(a), ref_metric(b)
        if va is None or vb is None:
            return Paired([], f"seed {a['cell']['seed']}: a value is missing")
        deltas.append(float(va) - float(vb))
    return Paired(deltas, None if deltas else "no runs to pair")


def versus_many(
    arms: list[tuple[str, list[Rec]]],
    ref_name: str,
    ref: list[Rec],
    metric: Callable[[Rec], Any],
    ref_metric: Callable[[Rec], Any] | None = None,
) -> str:
    """ "A (x, +d points, better in k of n seeds) and B (...) beat REF (y); C (...) does not"."""
    ref_metric = ref_metric or metric
    b = mean(ref, ref_metric)
    if b is None:
        return f"{ref_name}: no result"
    groups: dict[str, list[str]] = {"beat": [], "tie with": [], "do not beat": []}
    for name, arm in arms:
        a = mean(arm, metric)
        if a is None:
            continue
        p = paired(arm, ref, metric, ref_metric)
        seeds = (
            f", better in {p.wins} of {len(p.deltas)} seeds"
            if p.ok and len(p.deltas) > 1
            else ""
            if p.ok
            else f"; {p.text()}"
        )
        groups["beat" if a > b + TIE else "tie with" if abs(a - b) <= TIE else "do not beat"].append(
            f"{name} ({a:.3f}, {pts(a - b)}{seeds})"
        )
    parts = []
    for verb, names in groups.items():
        if names:
            single = {"beat": "beats", "tie with": "ties with", "do not beat": "does not beat"}[verb]
            parts.append(
                f"{' and '.join(names) if len(names) < 3 else ', '.join(names[:-1]) + ' and ' + names[-1]} "
                f"{single if len(names) == 1 else verb}"
            )
    if not parts:
        return f"{ref_name}: no result"
    return "; ".join([parts[0] + f" {ref_name} ({b:.3f})"] + [p + " it" for p in parts[1:]])


def versus(
    name: str,
    arm: list[Rec],
    ref_name: str,
    ref: list[Rec],
    metric: Callable[[Rec], Any],
    ref_metric: Callable[[Rec], Any] | None = None,
) -> str:
    """ "A (x) beats B (y): +d points, wins k/n seeds (paired)" or "does not beat", from the records."""
    ref_metric = ref_metric or metric
    a, b = mean(arm, metric), mean(ref, ref_metric)
    if a is None or b is None:
        return f"{name} vs {ref_name}: no result"
    verb = "beats" if a > b + TIE else ("ties with" if abs(a - b) <= TIE else "does not beat")
    p = paired(arm, ref, metric, ref_metric)
    seeds = (
        f", better in {p.wins} of {len(p.deltas)} seeds (paired)"
        if p.ok and len(p.deltas) > 1
        else ""
        if p.ok
        else f"; {p.text()}"
    )
    return f"{name} ({a:.3f}) {verb} {ref_name} ({b:.3f}): {pts(a - b)}{seeds}"


# =========================================================================== settings lines
def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _where(recs: list[Rec], chosen: list[Rec]) -> str:
    """Name the rows ``chosen`` among ``recs`` by a grid axis when one explains them, else by their labels."""
    ids = {id(r) for r in chosen}
    for name in [k for k in recs[0]["cell"] if k != "seed"]:
        vals = {r["cell"].get(name) for r in chosen}
        if {id(r) for r in recs if r["cell"].get(name) in vals} == ids:
            return f"{name} {', '.join(str(v) for v in axis(chosen, name))}"
    return "; ".join(sorted({label(r["cell"]) for r in chosen}))


def _axis_named_by(recs: list[Rec], by_value: dict[str, list[Rec]]) -> str | None:
    """The grid axis whose label is the key's value in every run that sets it, if there is one."""
    for name in [k for k in recs[0]["cell"] if k != "seed"]:
        if by_value and all(
            {str(r["cell"].get(name)) for r in chosen} == {value}
            and {id(r) for r in recs if str(r["cell"].get(name)) == value} == {id(r) for r in chosen}
            for value, chosen in by_value.items()
        ):
            return name
    return None


def settings_diff(recs: list[Rec], defaults_: dict[str, Any]) -> list[str]:
    """Every run-config key whose value differs from the default, with the rows that use the value when it
    is not the same in every run; and the number of simulated clients."""
    recs = [r for r in recs if r.get("run-config")]
    if not recs:
        return []
    out = []
    sizes = sorted({r["num-supernodes"] for r in recs})
    if len(sizes) == 1:
        out.append(f"clients (num-supernodes)={sizes[0]}")
    keys = sorted({k for r in recs for k in r["run-config"]} - NOT_SETTINGS)
    for key in keys:
        missing = object()
        by_value: dict[str, list[Rec]] = {}
        for r in recs:
            v = r["run-config"].get(key, missing)
            if v is missing or (key in defaults_ and v == defaults_[key]):
                continue
            by_value.setdefault(_fmt_value(v), []).append(r)
        unknown = "" if key in defaults_ else " (not a run-config key any more)"
        named = _axis_named_by(recs, by_value)
        if named:  # the value is the row's label on an axis (e.g. partition=iid on the iid rows): say so once
            out.append(f"{key}: as in the {named} column{unknown}")
            continue
        for value, chosen in by_value.items():
            where = "" if len(chosen) == len(recs) else f" ({_where(recs, chosen)})"
            # runs that did not set the key used the default of their code: the default has changed since
            then = (
                ""
                if key not in defaults_ or any(key in r.get("overrides", [key]) for r in chosen)
                else f" (the default when these ran; now {_fmt_value(defaults_[key])})"
            )
            out.append(f"{key}={value}{where}{unknown}{then}")
    return out


@dataclass
class Paper:
    """One setting of the paper: ``ours`` computes our value from the records (a string compared with ``paper``)."""

    name: str
    paper: str
    ours: Callable[[list[Rec]], str]
    ref: str


def key(name: str, fmt: Callable[[Any], str] = _fmt_value) -> Callable[[list[Rec]], str]:
    """Our value of a run-config key, with the rows when it varies."""

    def ours(recs: list[Rec]) -> str:
        groups: dict[str, list[Rec]] = {}
        for r in recs:
            groups.setdefault(fmt(r["run-config"].get(name)), []).append(r)
        if len(groups) == 1:
            return next(iter(groups))
        return "; ".join(f"{v} ({_where(recs, g)})" for v, g in groups.items())

    return ours


def trained_model(recs: list[Rec]) -> str:
    """The model the runs trained (what ``model=auto`` resolved to, where the record knows it)."""
    names = sorted({str(r.get("resolved-model") or r["run-config"].get("model")) for r in recs})
    return " / ".join(names)


def fixed(text: str) -> Callable[[list[Rec]], str]:
    return lambda recs: text


def n_clients(recs: list[Rec]) -> str:
    return " / ".join(str(n) for n in sorted({r["num-supernodes"] for r in recs}))


def n_seeds(recs: list[Rec]) -> str:
    """How many seeds each row (grid cell without its seed) ran, naming the rows when the count differs."""
    rows: dict[tuple, list[Rec]] = {}
    for r in recs:
        rows.setdefault(tuple((k, str(v)) for k, v in r["cell"].items() if k != "seed"), []).append(r)
    by_count: dict[int, list[Rec]] = {}
    for row in rows.values():
        by_count.setdefault(len(seeds_of(row)), []).extend(row)
    if len(by_count) <= 1:
        return str(len(seeds_of(recs)))
    return "; ".join(f"{n} ({_where(recs, chosen)})" for n, chosen in sorted(by_count.items(), reverse=True))


def percent(v: Any) -> str:
    return f"{float(v) * 100:g} %"


def paper_diff(recs: list[Rec], paper: list[Paper]) -> tuple[list[str], list[str]]:
    """(settings that differ from the paper, settings that are the paper's)."""
    recs = [r for r in recs if r.get("run-config")]
    differ, same = [], []
    for p in paper:
        ours = p.ours(recs)
        if ours == p.paper:
            same.append(p.name)
        else:
            differ.append(f"{p.name}: paper {p.paper}, here {ours} ({p.ref})")
    return differ, same


def machine_note(recs: list[Rec]) -> str:
    m = [r["machine"] for r in recs if r.get("machine")]
    if not m:
        return ""
    first = m[0]
    loads = [x["load-before"] for x in m if x.get("load-before") is not None]
    load = (
        (
            f"; 1-minute load average when a run started: median {np.median(loads):.1f}, "
            f"range {min(loads):.1f}-{max(loads):.1f}"
        )
        if loads
        else ""
    )
    by_commit: dict[str, list[Rec]] = {}
    for r in recs:
        by_commit.setdefault((r.get("code") or {}).get("commit") or "unknown", []).append(r)
    commits = sorted(by_commit)
    # several code versions in one table: say which rows ran which
    where = {c: f" ({_where(recs, by_commit[c])})" if len(commits) > 1 else "" for c in commits}
    dirty = any((r.get("code") or {}).get("dirty") for r in recs)
    if any("summary" in r for r in recs):
        seconds = sum(r["summary"].get("seconds") or 0 for r in ok(recs))
        ran = f"{plural(len(recs), 'run')} ({len(recs) - len(ok(recs))} failed), {seconds:,.0f} s of ServerApp time summed"
    elif any("wall-seconds" in (r.get("measurements") or {}) for r in recs):
        ran = plural(len(recs), "measurement")
    else:
        ran = plural(len(recs), "in-process measurement")
    return (
        f"Measured on a shared machine: {first['cores']} cores, {first['memory-gib']} GiB, "
        f"{'a GPU' if first['gpu'] else 'no GPU'}, Python {first['python']}, flwr {first['flwr']}, torch "
        f"{first['torch']}{load}. {ran}; code {', '.join(c[:10] + where[c] for c in commits)}"
        f"{' with uncommitted changes' if dirty else ''}."
    )


def header(recs: list[Rec], paper: list[Paper], defaults_: dict[str, Any]) -> str:
    """Command, settings that differ from the defaults and from the paper, machine: the lines above a table."""
    by_command: dict[str, list[Rec]] = {}
    for r in recs:
        by_command.setdefault(r["command"].split(" --raw-dir")[0], []).append(r)

    def seeds(rs: list[Rec]) -> str:
        return f" (seeds {', '.join(map(str, seeds_of(rs)))})" if seeds_of(rs) else ""

    if len({seeds(rs) for rs in by_command.values()}) <= 1:  # one command, or all ran the same seeds
        lines = ["Command: " + "; ".join(f"`{c}`" for c in sorted(by_command)) + seeds(recs) + "."]
    else:  # say which seeds each command ran (a subset re-run next to a full one)
        lines = ["Commands: " + "; ".join(f"`{c}`{seeds(by_command[c])}" for c in sorted(by_command)) + "."]
    diff = settings_diff(recs, defaults_)
    if diff:
        lines.append(
            "Settings that differ from the defaults (pyproject.toml): " + ", ".join(f"`{d}`" for d in diff) + "."
        )
    differ, same = paper_diff(recs, paper)
    if differ:
        lines.append("Differs from the paper: " + "; ".join(differ) + ".")
    if same:
        lines.append("As in the paper: " + ", ".join(same) + ".")
    note = machine_note(recs)
    if note:
        lines.append(note)
    return "\n".join(lines)


def missing(command: str) -> str:
    return f"*Not yet re-run with raw outputs: run `{command}`, then `python benchmarks/report.py`.*"


# =========================================================================== sections
@dataclass
class Section:
    title: str
    grids: list[str]
    render: Callable[[Path, dict[str, Any]], str]
    level: int = 2


# --------------------------------------------------------------------------- baselines
BASELINE_METHODS = ["local", "fedavg", "fedprox", "fedper", "fedrep", "fedrod", "ditto"]
NAMES = {
    "local": "Local",
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedper": "FedPer",
    "fedrep": "FedRep",
    "fedrod": "FedRoD",
    "ditto": "Ditto",
    "fedcac": "FedCAC",
    "cfl": "CFL (Sattler's thresholds)",
    "cfl-tuned": "CFL (tuned thresholds)",
    "oracle": "Oracle",
    "pfedlia-central": "pFedLIA central (OPTICS)",
    "pfedlia-p2p": "pFedLIA peer-to-peer",
    "ifca": "IFCA",
    "fedsoft": "FedSoft",
    "pifl": "PI-FL",
    "pifl-ni": "PI-FL(NI)",
}
PERSONAL, GLOBAL = summary("personal-acc"), summary("global-acc")


def _baselines_table(recs: list[Rec]) -> str:
    rows = []
    for part in axis(recs, "partition", ["pathological", "iid"]):
        for m in axis(recs, "method", BASELINE_METHODS):
            sel = select(recs, partition=part, method=m)
            rows.append([part, m, mean_std(sel, PERSONAL), mean_std(sel, GLOBAL)])
    n = len(seeds_of(recs))
    over = "" if n == 1 else f" (mean ± std over {n} seeds)"
    return md_table(["partition", "method", f"personalized acc{over}", "global-model acc"], rows)


def _baselines_claims(recs: list[Rec]) -> list[str]:
    out = []
    fedavg = lambda part: select(recs, partition=part, method="fedavg")  # noqa: E731
    arms = [
        (NAMES[m], select(recs, partition="pathological", method=m)) for m in ("local", "fedper", "fedrep", "ditto")
    ]
    if any(a for _, a in arms) and fedavg("pathological"):
        out.append(
            "Pathological split: "
            + versus_many([x for x in arms if x[1]], "FedAvg's global model", fedavg("pathological"), PERSONAL, GLOBAL)
            + "."
        )
    local = select(recs, partition="pathological", method="local")
    pers = [(NAMES[m], select(recs, partition="pathological", method=m)) for m in ("fedper", "fedrep", "ditto")]
    if local and any(a for _, a in pers):
        out.append(
            "Pathological split, against training alone: "
            + versus_many([x for x in pers if x[1]], "Local", local, PERSONAL)
            + "."
        )
    if select(recs, partition="iid", method="local"):
        out.append(
            "IID: "
            + versus(
                "FedAvg's global model",
                fedavg("iid"),
                "Local",
                select(recs, partition="iid", method="local"),
                GLOBAL,
                PERSONAL,
            )
            + "."
        )
    for part in axis(recs, "partition"):
        ditto, avg = select(recs, partition=part, method="ditto"), fedavg(part)
        p = paired(ditto, avg, GLOBAL)
        if p.ok:
            gap = max(abs(d) for d in p.deltas)
            out.append(
                f"{part}: Ditto's global model "
                + ("equals FedAvg's in every seed" if gap <= TIE else f"differs from FedAvg's by up to {gap:.4f}")
                + "."
            )
    if select(recs, method="fedprox"):
        out.append(
            "FedProx vs FedAvg: "
            + "; ".join(
                f"{part}: "
                + versus("FedProx", select(recs, partition=part, method="fedprox"), "FedAvg", fedavg(part), PERSONAL)
                for part in axis(recs, "partition")
            )
            + "."
        )
    return out


def render_baselines(raw: Path, d: dict[str, Any]) -> str:
    parts = [
        "The baselines of issue 2 on the embedded digits. Expected: on the pathological split (2 classes per "
        "client) Local and the personalized methods beat FedAvg's global model; on IID, FedAvg's global model "
        "beats Local. Accuracy = each client's own model on its own test split, mean over clients, last round."
    ]
    for grid, title, command in (
        ("baselines-clean", "Clean digits", "python benchmarks/baselines.py --grid clean"),
        (
            "baselines-noisy",
            "Noisy digits (fixed Gaussian pixel noise, as the FedCAC spec uses to separate methods)",
            "python benchmarks/baselines.py --grid noisy",
        ),
    ):
        recs = load_records(grid, raw)
        parts.append(f"### {title}")
        if not recs:
            parts.append(missing(command))
            continue
        parts += [header(recs, [], d), _baselines_table(recs)]
        if len(seeds_of(recs)) == 1:
            parts.append("One seed: no spread is measured, so small differences below may be noise.")
        parts.append(bullets(_baselines_claims(recs)))
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- FedCAC
FEDCAC_PAPER = [
    Paper("clients", "40", n_clients, "fedcac §3"),
    Paper("local epochs", "5", key("local-epochs"), "fedcac §3"),
    Paper("batch size", "100", key("batch-size"), "fedcac §3"),
    Paper("lr", "0.1", key("lr"), "fedcac §3"),
    Paper("momentum", "0.9", key("momentum"), "fedcac §3, official config"),
    Paper("rounds", "500", key("num-server-rounds"), "fedcac §3"),
    Paper("beta", "100 (CIFAR-10)", key("beta"), "fedcac §3"),
    Paper("tau", "0.5", key("tau"), "fedcac §3"),
    Paper("participation", "100 %", key("fraction-train", percent), "fedcac §3"),
    Paper("seeds", "5", n_seeds, "fedcac §3"),
    Paper(
        "data",
        "CIFAR-10 / CIFAR-100 / Tiny ImageNet, 500 train / 100 test samples per client",
        fixed("digits (8x8) with Gaussian pixel noise, all samples split among clients"),
        "fedcac §4",
    ),
    Paper("model", "ResNet-8 / ResNet-10", trained_model, "fedcac §4"),
    Paper("headline metric", "best round", fixed("last round"), "fedcac §3"),
]
FEDCAC_METHODS = ["local", "fedavg", "fedper", "fedrep", "ditto", "fedcac"]


def render_fedcac(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("fedcac", raw)
    intro = (
        "FedCAC against Local, FedAvg, FedPer, FedRep and Ditto on noisy digits (spec fedcac §8). Final-round "
        "accuracy of each client's model on its own test split (FedCAC: after Eq. 11), mean over clients, "
        "mean ± std over seeds; FedAvg: its global model. Bold: the best mean of a row."
    )
    if not recs:
        return intro + "\n\n" + missing("python benchmarks/fedcac.py")
    methods = axis(recs, "method", FEDCAC_METHODS)
    rows, claims = [], []
    for part in axis(recs, "partition", ["pathological", "dirichlet-0.5", "dirichlet-1.0"]):
        means = {m: mean(select(recs, partition=part, method=m), PERSONAL) for m in methods}
        best = max((m for m in methods if means[m] is not None), key=lambda m: means[m], default=None)
        cells = [mean_std(select(recs, partition=part, method=m), PERSONAL) for m in methods]
        rows.append([part] + [f"**{c}**" if m == best else c for m, c in zip(methods, cells)])
        if "fedcac" in methods and best is not None and means["fedcac"] is not None:
            others = [m for m in methods if m != "fedcac" and means[m] is not None]
            rival = max(others, key=lambda m: means[m]) if others else None
            std = max(np.std(values(select(recs, partition=part, method=m), PERSONAL)) for m in ("fedcac", rival))
            line = f"{part}: best mean {NAMES.get(best, best)}"
            if rival:
                gap = means["fedcac"] - means[rival]
                within = "within" if abs(gap) <= std else "more than"
                line += (
                    "; "
                    + versus(
                        "FedCAC",
                        select(recs, partition=part, method="fedcac"),
                        f"the best other method, {NAMES.get(rival, rival)}",
                        select(recs, partition=part, method=rival),
                        PERSONAL,
                    )
                    + f"; the gap is {within} one seed std"
                )
            claims.append(line + ".")
    wins = sum(1 for r in rows if "**" in r[1 + methods.index("fedcac")]) if "fedcac" in methods else 0
    claims.insert(0, f"FedCAC has the best mean in {wins} of {len(rows)} partitions.")
    ratios = {
        r["artefacts"]["fedcac"].get("mask-to-model-ratio") for r in ok(recs) if r.get("artefacts", {}).get("fedcac")
    }
    if ratios and None not in ratios:
        claims.append(
            f"The packed mask a client sends costs 1/{1 / max(ratios):.0f} of the float32 model "
            "(`fedcac_communication.json`)."
        )
    return "\n\n".join([intro, header(recs, FEDCAC_PAPER, d), md_table(["partition"] + methods, rows), bullets(claims)])


# --------------------------------------------------------------------------- pFedLIA
PFEDLIA_PAPER = [
    Paper("clients", "100", n_clients, "pfedlia §3"),
    Paper("participation per round", "10 %", key("fraction-train", percent), "pfedlia §3"),
    Paper("warm-up rounds", "20", key("warmup-rounds"), "pfedlia §3"),
    Paper("lazy epochs", "20", key("lazy-epochs"), "pfedlia §3"),
    Paper("OPTICS min_samples", "5", key("optics-min-samples"), "pfedlia §3"),
    Paper(
        "train / validation split",
        "3:1 (no test split named)",
        lambda recs: (
            key("val-fraction", lambda v: f"validation {percent(v)}")(recs)
            + ", "
            + key("test-fraction", lambda v: f"test {percent(v)}")(recs)
        ),
        "pfedlia §3, §4",
    ),
    Paper("seeds", "4", n_seeds, "pfedlia §3"),
    Paper("model", "ResNet18 / GPT-2, pretrained", trained_model, "pfedlia §3, §4"),
    Paper(
        "data",
        "FashionMNIST / CIFAR-10 / CIFAR-100; OSCAR Nordic text",
        key("dataset", lambda v: "digits (8x8)" if v == "digits" else "synthetic dialects" if v == "dialects" else v),
        "pfedlia §4",
    ),
    Paper("rounds", "not given (100 inferred from FL-Bench)", key("num-server-rounds"), "pfedlia §3"),
    Paper("local epochs", "not given (5 inferred)", key("local-epochs"), "pfedlia §3"),
    Paper("batch size", "not given (32 inferred)", key("batch-size"), "pfedlia §3"),
]
DIALECTS_PAPER = [
    Paper(
        "model",
        "GPT-2 small (124M), pretrained",
        key("model", lambda v: f"{v} (a GPT-2 config, randomly initialised)"),
        "pfedlia §3, §4",
    ),
    Paper("data", "OSCAR text in Norwegian, Swedish, Danish", fixed("three synthetic dialects"), "pfedlia §4"),
    Paper("warm-up rounds", "20", key("warmup-rounds"), "pfedlia §3"),
    Paper("lazy epochs", "20", key("lazy-epochs"), "pfedlia §3"),
    Paper("participation per round", "10 %", key("fraction-train", percent), "pfedlia §3"),
    Paper("seeds", "4", n_seeds, "pfedlia §3"),
]
PFEDLIA_METHODS = ["local", "fedavg", "cfl", "cfl-tuned", "oracle", "pfedlia-central", "pfedlia-p2p"]


def ari(rec: Rec) -> tuple[float | None, bool]:
    """(ARI of the clustering against the planted groups, whether over every client).  The server learns a
    client's planted group from its training replies, so with sampling some may be unknown at the clustering
    round: the ARI is then computed here over the clients known at the end of the run."""
    art = rec.get("artefacts", {}).get("pfedlia")
    if not art:
        return None, True
    if art["clustering"].get("ari") is not None:
        return float(art["clustering"]["ari"]), True
    known = [c for c in art["assignment"] if c in art["planted"]]
    if len(known) < 2:
        return None, False
    from sklearn.metrics import adjusted_rand_score

    value = adjusted_rand_score([art["planted"][c] for c in known], [art["assignment"][c] for c in known])
    return float(value), len(known) == len(art["assignment"])


def clusters_found(rec: Rec) -> int | None:
    art = rec.get("artefacts", {})
    if "pfedlia" in art:
        return art["pfedlia"]["clustering"].get("clusters")
    if "cfl" in art:
        return art["cfl"]["clusters"]
    return None


def clustering_round(rec: Rec) -> int | None:
    return rec.get("artefacts", {}).get("pfedlia", {}).get("clustering", {}).get("round")


def normal_rounds(rec: Rec) -> list[dict]:
    """Rounds other than round 1 (which pays for process start-up) and the clustering round."""
    return [r for r in rec["rounds"] if r["round"] not in (1, clustering_round(rec)) and r.get("train-clients")]


def normal_round_mb(rec: Rec) -> float | None:
    rounds = normal_rounds(rec)
    return (
        float(np.median([r.get("train-bytes-down", 0) / r["train-clients"] for r in rounds])) / 1e6 if rounds else None
    )


def normal_round_seconds(rec: Rec) -> float | None:
    rounds = [r for r in normal_rounds(rec) if r.get("seconds") is not None]
    return float(np.median([r["seconds"] for r in rounds])) if rounds else None


def clu(name: str) -> Callable[[Rec], Any]:
    return lambda r: r.get("artefacts", {}).get("pfedlia", {}).get("clustering", {}).get(name)


def _range(vals: list[Any]) -> str:
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return "—"
    return str(vals[0]) if vals[0] == vals[-1] else f"{vals[0]}-{vals[-1]}"


def _pfedlia_rows(recs: list[Rec], key_metric: str) -> tuple[list[list[Any]], list[str]]:
    rows, notes = [], []
    for part_ in axis(recs, "participation", ["full", "10%"]):
        for part in axis(recs, "partition", ["pathological", "noisy", "dialects"]):
            for m in axis(recs, "method", PFEDLIA_METHODS):
                sel = select(recs, participation=part_, partition=part, method=m)
                if not sel:
                    continue
                aris = [ari(r) for r in ok(sel)]
                a = [v for v, _ in aris if v is not None]
                partial = any(not full for v, full in aris if v is not None)
                ari_text = (
                    "—"
                    if not a
                    else (f"{np.mean(a):.4f} ± {np.std(a):.4f}" if len(a) > 1 else f"{a[0]:.4f}")
                    + (" *" if partial else "")
                )
                cost = "—"
                if m != "oracle" and values(sel, clu("bytes-down-per-client")):
                    cost = f"{mean(sel, clu('bytes-down-per-client')) / 1e6:.2f} MB, {mean(sel, clu('seconds')):.1f} s"
                normal = "—"
                if values(sel, clustering_round) and values(sel, normal_round_seconds):
                    normal = f"{mean(sel, normal_round_mb):.2f} MB, {mean(sel, normal_round_seconds):.1f} s"
                metric = [mean_std(sel, PERSONAL)]
                if key_metric == "perplexity":
                    metric.append(mean_std(sel, summary("personal-perplexity"), 2))
                rows.append(
                    [
                        part_,
                        part,
                        NAMES.get(m, m),
                        *metric,
                        ari_text,
                        _range([clusters_found(r) for r in ok(sel)]),
                        cost,
                        normal,
                    ]
                )
                if partial:
                    notes.append(part_)
    return rows, notes


def _pfedlia_claims(recs: list[Rec]) -> list[str]:
    out = []
    for part_ in axis(recs, "participation", ["full", "10%"]):
        for part in axis(recs, "partition", ["pathological", "noisy", "dialects"]):
            sel = lambda m: select(recs, participation=part_, partition=part, method=m)  # noqa: E731
            row_seeds = seeds_of(select(recs, participation=part_, partition=part))
            where = f"{part}, {part_} participation" + (f" (seed {row_seeds[0]} only)" if len(row_seeds) == 1 else "")
            lines = []
            for m in ("pfedlia-central", "pfedlia-p2p"):
                aris = [ari(r)[0] for r in ok(sel(m))]
                aris = [v for v in aris if v is not None]
                if aris:
                    lines.append(
                        f"{NAMES[m]} ARI per seed "
                        + " / ".join(f"{v:.2f}" for v in aris)
                        + f" (>= 0.9 in {sum(v >= 0.9 for v in aris)} of {len(aris)})"
                    )
            main = next((m for m in ("pfedlia-central", "pfedlia-p2p") if ok(sel(m))), None)
            if main:
                for ref in ("oracle", "fedavg", "local", "cfl-tuned"):
                    if ok(sel(ref)):
                        lines.append(versus(NAMES[main], sel(main), NAMES[ref], sel(ref), PERSONAL))
            cfl = ok(sel("cfl"))
            if cfl:
                found = [clusters_found(r) for r in cfl]
                same = paired(sel("cfl"), sel("fedavg"), PERSONAL)
                if all(f == 1 for f in found):
                    lines.append(
                        "CFL with Sattler's thresholds never splits (1 cluster in every seed)"
                        + (
                            ", so it is FedAvg exactly (same accuracy in every seed)"
                            if same.ok and all(abs(d) <= TIE for d in same.deltas)
                            else ""
                        )
                    )
                else:
                    lines.append(f"CFL with Sattler's thresholds finds {_range(found)} clusters")
            failed = [r for m in PFEDLIA_METHODS for r in sel(m) if r.get("error")]
            for m in sorted({r["cell"]["method"] for r in failed}):
                fails = [r for r in failed if r["cell"]["method"] == m]
                lines.append(
                    f"{NAMES.get(m, m)} failed in {len(fails)} of {len(sel(m))} runs: {error_line(fails[0]['error'])}"
                )
            if main:
                ratio = [r for r in ok(sel(main)) if normal_round_mb(r) and clu("bytes-down-per-client")(r)]
                if ratio:
                    down = [clu("bytes-down-per-client")(r) / 1e6 / normal_round_mb(r) for r in ratio]
                    secs = [clu("seconds")(r) / normal_round_seconds(r) for r in ratio if normal_round_seconds(r)]
                    lines.append(
                        f"the clustering round downloads {np.mean(down):.0f}x a normal round's bytes per client"
                        + (f" and takes {span(secs, 1, 'x')} its seconds" if secs else "")
                    )
            if lines:
                out.append(f"{where}: " + "; ".join(lines) + ".")
    return out


def render_pfedlia(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("pfedlia", raw)
    intro = (
        "pFedLIA central (OPTICS on the server) and peer-to-peer against Local, FedAvg, CFL and the Oracle (the "
        "planted groups) on planted clusters of digits (spec pfedlia §8). Planted groups: 5 clusters x 2 labels "
        '("pathological"); "noisy" adds, for about half of the clients, one shard of a label from another '
        'cluster (spec §6). Two participation settings: every client trains in every round ("full"), and 10 % '
        'of the clients drawn per round as in the paper ("10%"; the clustering round still asks every client). '
        "Personalized accuracy = each client's assigned model on its own test split at the last round, mean ± "
        "std over seeds. ARI = adjusted Rand index of the clustering against the planted groups. Costs are "
        "per client, seconds measured on a shared machine; a normal round is the median of the rounds other "
        "than round 1 and the clustering round."
    )
    if not recs:
        return intro + "\n\n" + missing("python benchmarks/pfedlia.py --grid planted")
    rows, notes = _pfedlia_rows(recs, "acc")
    table = md_table(
        [
            "participation",
            "partition",
            "method",
            "personalized acc",
            "ARI",
            "clusters found",
            "clustering round: MB down, s (shared machine)",
            "normal round: MB down, s (shared machine)",
        ],
        rows,
    )
    foot = (
        (
            "\n\n\\* ARI over the clients whose planted group the server knows at the end of the run: it learns a "
            "client's group from its training replies, and with client sampling some clients had not trained by the "
            "clustering round."
        )
        if notes
        else ""
    )
    return "\n\n".join([intro, header(recs, PFEDLIA_PAPER, d), table + foot, bullets(_pfedlia_claims(recs))])


def render_dialects(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("pfedlia-dialects", raw)
    intro = (
        "Next-word prediction on three synthetic dialects (client i speaks dialect i mod 3; the dialects share "
        "most of their vocabulary), a causal LM from a transformers GPT-2 config (randomly initialised), a "
        "word-level tokenizer built offline. Per-token accuracy and perplexity (lower is better) on each "
        "client's test lines at the last round."
    )
    if not recs:
        return intro + "\n\n" + missing("python benchmarks/pfedlia.py --grid dialects")
    rows, _ = _pfedlia_rows(recs, "perplexity")
    table = md_table(
        [
            "participation",
            "partition",
            "method",
            "next-word accuracy",
            "perplexity",
            "ARI",
            "clusters found",
            "clustering round: MB down, s (shared machine)",
            "normal round: MB down, s (shared machine)",
        ],
        rows,
    )
    claims = []
    ppl = summary("personal-perplexity")
    for m in ("pfedlia-p2p", "pfedlia-central"):
        sel = select(recs, method=m)
        if ok(sel):
            aris = [v for v, _ in map(ari, ok(sel)) if v is not None]
            if aris:
                claims.append(f"{NAMES[m]} ARI per seed " + " / ".join(f"{v:.2f}" for v in aris))
            for ref in ("fedavg", "oracle", "local"):
                if ok(select(recs, method=ref)):
                    a, b = mean(sel, ppl), mean(select(recs, method=ref), ppl)
                    claims.append(
                        f"perplexity {NAMES[m]} {a:.2f} vs {NAMES[ref]} {b:.2f} ({'lower' if a < b else 'not lower'})"
                    )
    return "\n\n".join([intro, header(recs, DIALECTS_PAPER, d), table, bullets(claims)])


# --------------------------------------------------------------------------- FedC2I
FEDC2I_PAPER = [
    Paper("clients", "5", n_clients, "fedc2i §3"),
    Paper("optimizer", "adam", key("optimizer"), "fedc2i §3"),
    Paper("lr", "0.001", key("lr"), "fedc2i §3"),
    Paper("local epochs", "2", key("local-epochs"), "fedc2i §3"),
    Paper("batch size", "32", key("batch-size"), "fedc2i §3"),
    Paper("rounds", "20", key("num-server-rounds"), "fedc2i §3"),
    Paper("participation", "100 %", key("fraction-train", percent), "fedc2i §3"),
    Paper("seeds", "3", n_seeds, "fedc2i §3"),
    Paper(
        "data",
        "Digit-5 (MNIST, SVHN, USPS, SynthDigits, MNIST-M), 1,000 training images per client",
        fixed("digits (8x8), 5 hand-made feature-shift domains, about 250 training images per client"),
        "fedc2i §4.1",
    ),
    Paper("model", 'CIFAR-style CNN 64-64-384-192 ("LeNet")', trained_model, "fedc2i §4.2"),
]
FEDC2I_METHODS = [
    "local",
    "fedavg",
    "fedprox",
    "fedrep",
    "fedrod",
    "fedc2i",
    "lambda-only",
    "Lambda-only",
    "fedavg-cnn",
    "fedbn",
]
#: rows on another model than the grid's c2i-small (FedBN needs normalisation layers): compared with each other only
FEDC2I_CNN_ROWS = ("fedavg-cnn", "fedbn")


def render_fedc2i(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("fedc2i", raw)
    intro = (
        "FedC2I and its ablations against the baselines on feature-shift digits: IID labels, 5 clients, each with "
        "its own domain (original, inverted, rotated, noisy, shifted). `personal-acc` is each client's own model "
        "on its own test split; for FedAvg, FedProx and FedRoD `trained-acc` is the model right after local "
        "training (the protocol FedC2I is evaluated with). lambda-only: client-level influence only; "
        "Lambda-only: class-level matrix with a plain-average extractor."
    )
    if not recs:
        return intro + "\n\n" + missing("python benchmarks/fedc2i.py")
    if any(select(recs, method=m) for m in FEDC2I_CNN_ROWS):
        intro += (
            " FedBN keeps the normalisation layers on the clients and c2i-small has none: fedbn and its reference "
            "fedavg-cnn (FedAvg) run the `cnn` (BatchNorm after each convolution) instead, so FedBN is compared "
            "with fedavg-cnn only."
        )
    rows = [
        [
            m,
            mean_std(select(recs, method=m), PERSONAL),
            mean_std(select(recs, method=m), summary("trained-acc")),
            mean_std(select(recs, method=m), GLOBAL),
        ]
        for m in axis(recs, "method", FEDC2I_METHODS)
    ]
    fed = [
        m
        for m in axis(recs, "method", FEDC2I_METHODS)
        if m != "local" and m not in FEDC2I_CNN_ROWS and ok(select(recs, method=m))
    ]
    best = max(fed, key=lambda m: mean(select(recs, method=m), PERSONAL), default=None)
    claims = []
    if best:
        claims.append(f"Best federated method by personal-acc: {best}.")
        if ok(select(recs, method="local")):  # the federated methods' best against training alone
            claims.append(
                f"Best federated method against Local: "
                + versus(best, select(recs, method=best), "Local", select(recs, method="local"), PERSONAL)
                + "."
            )
    full = select(recs, method="fedc2i")
    for ref in ("local", "fedrep", "fedavg"):
        if ok(full) and ok(select(recs, method=ref)):
            claims.append(versus("FedC2I", full, NAMES[ref], select(recs, method=ref), PERSONAL) + ".")
    if ok(full) and ok(select(recs, method="fedavg")):
        claims.append(
            versus(
                "FedC2I",
                full,
                "FedAvg after local training",
                select(recs, method="fedavg"),
                PERSONAL,
                summary("trained-acc"),
            )
            + "."
        )
    fedbn, fedavg_cnn = select(recs, method="fedbn"), select(recs, method="fedavg-cnn")
    if ok(fedbn) and ok(fedavg_cnn):
        claims.append(versus("FedBN", fedbn, "FedAvg on the same cnn", fedavg_cnn, PERSONAL) + ".")
        claims.append(
            versus(
                "FedBN",
                fedbn,
                "FedAvg on the same cnn after local training",
                fedavg_cnn,
                PERSONAL,
                summary("trained-acc"),
            )
            + "."
        )
    for v in ("lambda-only", "Lambda-only"):
        if ok(select(recs, method=v)) and ok(full):
            p = paired(select(recs, method=v), full, PERSONAL)
            claims.append(
                f"{v} minus full FedC2I, paired by seed: {p.text()}"
                + (f", higher in {p.wins} of {len(p.deltas)} seeds" if p.ok else "")
                + "."
            )
    return "\n\n".join(
        [
            intro,
            header(recs, FEDC2I_PAPER, d),
            md_table(["method", "personal-acc", "trained-acc (after local training)", "global-model acc"], rows),
            bullets(claims),
        ]
    )


def render_fedc2i_speed(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("fedc2i-speed", raw)
    intro = (
        "The client's influence phase of one round (leave-one-out losses from the sum, one vmapped evaluation of "
        "the M candidates, the class-level matrix, mixing) against one round of local training (2 epochs of "
        "Adam, batch 32), on one thread as a simulated client runs, median of the repeats; and the bytes a client "
        "downloads per round with all M models and with `c2i-peers=5`. Not a federated run: the method's own "
        "code timed in-process."
    )
    if not recs:
        return intro + "\n\n" + missing("python benchmarks/fedc2i_speed.py")
    rows, claims = [], []
    for r in sorted(recs, key=lambda r: (r["cell"]["model"], -r["cell"]["train-samples"], r["cell"]["M"])):
        m, c = r["measurements"], r["cell"]
        rows.append(
            [
                c["model"],
                c["train-samples"],
                c["M"],
                f"{m['influence-s']:.3f}",
                f"{m['local-training-s']:.3f}",
                f"{m['influence-s'] / m['local-training-s']:.2f}",
                f"{m['download-all-bytes'] / 1e6:.2f} MB",
                f"{m['download-k5-bytes'] / 1e6:.2f} MB",
            ]
        )
    for n in sorted({r["cell"]["train-samples"] for r in recs}, reverse=True):
        sel = [r for r in recs if r["cell"]["train-samples"] == n]
        top = max(sel, key=lambda r: r["cell"]["M"])["measurements"]
        claims.append(
            f"{n} training samples: at the largest M the influence phase is "
            f"{top['influence-s'] / top['local-training-s']:.2f}x the local training."
        )
    return "\n\n".join(
        [
            intro,
            header(recs, [], d),
            md_table(
                [
                    "model",
                    "training samples",
                    "M",
                    "influence phase (s, shared machine)",
                    "local training (s)",
                    "ratio",
                    "download per client per round, all M",
                    "with `c2i-peers=5`",
                ],
                rows,
            ),
            bullets(claims),
        ]
    )


# --------------------------------------------------------------------------- Client2Vec
C2V_PAPER = [
    Paper("clients", "100 (CIFAR-10) / 60 (DomainNet)", n_clients, "client2vec §4"),
    Paper("participation", "10 %", key("fraction-train", percent), "client2vec §3"),
    Paper("rounds", "100", key("num-server-rounds"), "client2vec §3"),
    Paper("local epochs", "5", key("local-epochs"), "client2vec §3"),
    Paper("lr", "0.01", key("lr"), "client2vec §3"),
    Paper("weight decay", "5e-05", key("weight-decay"), "client2vec §3"),
    Paper("CLIP encoder", "ViT-B-32, openai weights", key("c2v-encoder"), "client2vec §3"),
    Paper("DSA-IGN epochs", "500", key("c2v-ign-epochs"), "client2vec §3"),
    Paper("DSA-IGN FF width", "2048", key("c2v-ign-ff"), "client2vec §3"),
    Paper("tau (sampling, Global mode)", "1.0", key("c2v-tau"), "client2vec §3"),
    Paper("gamma (aggregation)", "0.5", key("c2v-gamma"), "client2vec §3"),
    Paper("w (local loss, Global mode)", "5.0", key("c2v-local-weight"), "client2vec §3"),
    Paper("seeds", "3", n_seeds, "client2vec §3"),
    Paper(
        "data",
        "CIFAR-10 (Dirichlet 0.1), DomainNet (6 domains), Shakespeare",
        fixed("digits (8x8), feature-shift domains x Dirichlet label skew"),
        "client2vec §4",
    ),
    Paper("model", "ResNet18 / MobileNetV2", trained_model, "client2vec §4"),
]
C2V_ARMS = ["FedAvg", "+i", "+ii", "+iii", "+i+ii+iii", "FedAvg-cnn", "FedBN-cnn"]
#: the arm each arm is paired with (FedBN runs on the cnn: its reference is FedAvg on the cnn); others: FedAvg
C2V_REFERENCE = {"FedAvg-cnn": "FedAvg-cnn", "FedBN-cnn": "FedAvg-cnn"}
C2V_BLOCK_GAP_TARGET = 0.5  # spec client2vec §8: acceptance threshold of the index's domain block gap


def c2v_accs(rec: Rec) -> list[float]:
    """The global model's accuracy per round; for a method without one (FedBN), the personalized models'."""
    key = "global-acc" if any(r.get("global-acc") is not None for r in rec["rounds"]) else "personal-acc"
    return [r[key] for r in rec["rounds"] if r.get(key) is not None]


def c2v_best(rec: Rec) -> float | None:
    return max(c2v_accs(rec)) if c2v_accs(rec) else None


def c2v_last(rec: Rec) -> float | None:
    return c2v_accs(rec)[-1] if c2v_accs(rec) else None


def c2v_round_seconds(rec: Rec) -> float | None:
    secs = [r["seconds"] for r in rec["rounds"][1:] if r.get("seconds")]
    return float(np.median(secs)) if secs else None


def c2v_art(name: str) -> Callable[[Rec], Any]:
    def get(rec: Rec) -> Any:
        art = rec.get("artefacts", {}).get("client2vec") or {}
        return (art.get("index-quality") or {}).get(name) if name == "beta-f-block-gap" else art.get(name)

    return get


def render_client2vec(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("client2vec", raw)
    intro = (
        "FedAvg with and without each Client2Vec case study ((i) index-aware sampling, (ii) aggregation weights, "
        "(iii) the local loss) and all three, on digits with feature-shift domains crossed with Dirichlet label "
        "skew. Accuracy: the global model on each client's own test split, unweighted mean, best and last round. "
        "Paired: arm minus FedAvg on the same seed; printed only when the two runs share their data, and, for "
        "arms without (i), drew the same clients in every round. β_f gap: mean cosine of the index's feature "
        "half within a domain minus across domains."
    )
    if not recs:
        return intro + "\n\n" + missing("python benchmarks/client2vec.py")
    if any(select(recs, arm=a) for a in set(C2V_REFERENCE.values()) | set(C2V_REFERENCE)):
        intro += (
            " FedBN (local normalisation layers) needs a model with normalisation layers, which the MLP lacks: "
            "FedBN-cnn and its reference FedAvg-cnn (plain FedAvg, no index) run the `cnn` instead, FedBN-cnn is "
            "paired with FedAvg-cnn, and FedBN's accuracy is its personalized models' (it has no global model)."
        )
    parts = [intro, header(recs, C2V_PAPER, d)]
    for setting in axis(recs, "setting", ["4dom-a0.1", "4dom-a100", "1dom-a0.1"]):
        sel = select(recs, setting=setting)
        rows, claims = [], []
        for arm in axis(sel, "arm", C2V_ARMS):
            a = select(sel, arm=arm)
            ref_arm = C2V_REFERENCE.get(arm, "FedAvg")
            ref = select(sel, arm=ref_arm)
            draws = not any(r["run-config"].get("c2v-sampling") for r in a)
            p = paired(a, ref, c2v_best, draws=draws) if arm != ref_arm and ref else None
            gaps = values(a, c2v_art("beta-f-block-gap"))
            rows.append(
                [
                    setting,
                    arm,
                    mean_std(a, c2v_best),
                    mean_std(a, c2v_last),
                    "—" if p is None else p.text(),
                    "—" if p is None else p.wins_text(),
                    num(mean(a, c2v_art("index-seconds")), 1),
                    num(mean(a, c2v_round_seconds), 2),
                    num(float(np.mean(gaps)) if gaps else None, 2),
                ]
            )
            if p is not None:
                claims.append(
                    f"{arm}: "
                    + (
                        f"paired Δ (best round) per seed "
                        + " / ".join(f"{x:+.4f}" for x in p.deltas)
                        + f"; better than {ref_arm} in {p.wins} of {len(p.deltas)} seeds"
                        if p.ok
                        else p.text()
                    )
                    + "."
                )
                a_mean, ref_mean = mean(a, c2v_best), mean(ref, c2v_best)
                if not p.ok and a_mean is not None and ref_mean is not None:  # the means, without a pairing claim
                    claims[-1] = claims[-1][:-1] + (
                        f"; unpaired, its mean best-round accuracy is {pts(a_mean - ref_mean)} "
                        f"against {ref_arm}'s ({a_mean:.3f} vs {ref_mean:.3f})."
                    )
        gaps = values(sel, c2v_art("beta-f-block-gap"))
        if gaps:
            claims.append(
                f"Index block gap: {_range([round(g, 2) for g in gaps])} over the index arms' runs (the spec's "
                f"acceptance threshold is {C2V_BLOCK_GAP_TARGET}; "
                f"{'met' if min(gaps) >= C2V_BLOCK_GAP_TARGET else 'not met'} in every run)."
            )
        parts += [
            md_table(
                [
                    "setting",
                    "arm",
                    "best-round acc",
                    "last-round acc",
                    "paired Δ best (mean ± std)",
                    "wins",
                    "index phase s (shared machine)",
                    "s / round (shared machine)",
                    "β_f gap",
                ],
                rows,
            ),
            bullets(claims),
        ]
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- PI-FL
PIFL_PAPER = [
    Paper("clients", "100", n_clients, "pifl §3"),
    Paper("tiers", "2", key("tiers"), "pifl §3"),
    Paper("rounds", "300 (synthetic) / 500 (CIFAR-10)", key("num-server-rounds"), "pifl §3"),
    Paper("lr", "0.01", key("lr"), "pifl §3"),
    Paper("batch size", "128", key("batch-size"), "pifl §3"),
    Paper("local epochs", "not stated (5 in the code)", key("local-epochs"), "pifl §3"),
    Paper(
        "slots per tier (performance / random)",
        "4 / 1",
        lambda recs: key("slots-performance")(recs) + " / " + key("slots-random")(recs),
        "pifl §3 (code)",
    ),
    Paper("server IID set", "2000 (code)", key("server-set-size"), "pifl §3"),
    Paper("seeds", "3", n_seeds, "pifl §3 (spec default)"),
    Paper(
        "data",
        "FedSoft's synthetic set, CIFAR-10, EMNIST",
        key(
            "dataset",
            lambda v: "SynthConcept (spec §4)" if v == "synth-concept" else "digits (8x8)" if v == "digits" else str(v),
        ),
        "pifl §4",
    ),
]
PIFL_METHODS = ["fedavg", "ifca", "fedsoft", "pifl", "pifl-ni"]


def tier_shares(rec: Rec) -> list[float]:
    tiers = (rec.get("artefacts", {}).get("pifl") or {}).get("tiers", {})
    return sorted(t["source-a-share"] for t in tiers.values() if t.get("source-a-share") is not None)


def goal_examples(rec: Rec) -> list[float]:
    cols = rec["clients"]["columns"]
    name = next((c for c in cols if c in ("goal-examples", "test-examples", "eval-examples")), None)
    return [row[cols.index(name)] for row in rec["clients"]["rows"]] if name else []


def render_pifl(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("pifl", raw)
    intro = (
        "PI-FL against FedAvg, IFCA, FedSoft and PI-FL(NI) (random bids) on two-source data: synthetic concept "
        "shift (spec §4: sources A and B label the same inputs differently) and digits two-source mixtures "
        "(source A = labels 0-4, source B = labels 5-9). Personalized accuracy (`personal-acc`) = each client's "
        "model on its goal data (PI-FL and PI-FL(NI): the one-shot mixture of tier models; IFCA: the chosen "
        "cluster model; FedSoft: the client's centre mixture; FedAvg: the global model), mean ± std over seeds; "
        "Δ vs FedAvg = the same client data, paired by seed. Tier source-A shares = the tier members' mean share "
        "of source A at the last round; the last column is the paper's Tables 1-2: each tier (cluster) model's "
        "accuracy on the source-A and source-B holdouts, tiers ordered by their A accuracy, mean over seeds."
    )
    if not recs:
        return intro + "\n\n" + missing("python benchmarks/pifl.py")
    rows, beats, empty, settings = (
        [],
        [],
        [],
        axis(
            recs,
            "partition",
            ["synth-10:90", "synth-30:70", "digits-10:90", "digits-30:70", "digits-linear", "digits-random"],
        ),
    )
    for part in settings:
        ref = select(recs, partition=part, method="fedavg")
        for m in axis(recs, "method", PIFL_METHODS):
            sel = select(recs, partition=part, method=m)
            if not sel:  # this method did not run on this mixture
                continue
            p = paired(sel, ref, PERSONAL) if m != "fedavg" else None
            if m == "pifl" and p is not None:
                beats.append((part, p, mean(sel, PERSONAL), mean(ref, PERSONAL)))
            shares = [tier_shares(r) for r in ok(sel) if tier_shares(r)]
            if shares and len({len(s) for s in shares}) == 1:
                share = " / ".join(f"{v:.2f}" for v in np.mean(np.array(shares), axis=0))
            elif shares:  # a tier had no members at the last round in some seeds: per seed, empty tiers left out
                share = "per seed: " + "; ".join(" / ".join(f"{v:.2f}" for v in s) for s in shares)
                tiers = [len((r["artefacts"].get("pifl") or {}).get("tiers", {})) for r in ok(sel)]
                empty.append(
                    f"{part}: a {NAMES.get(m, m)} tier had no members at the last round in "
                    f"{sum(len(s) < t for s, t in zip(shares, tiers))} of {plural(len(shares), 'seed')}."
                )
            else:
                share = "—"
            tables = [
                sorted(r["artefacts"]["tier-table"], key=lambda t: -t["A"])
                for r in ok(sel)
                if r.get("artefacts", {}).get("tier-table")
            ]
            table = "—"
            if tables and len({len(t) for t in tables}) == 1:
                avg = [{k: np.mean([t[i][k] for t in tables]) for k in ("A", "B")} for i in range(len(tables[0]))]
                table = "; ".join(f"θ{i}: {t['A']:.3f} / {t['B']:.3f}" for i, t in enumerate(avg))
            goal = [g for r in ok(sel) for g in goal_examples(r)]
            rows.append(
                [
                    part,
                    m,
                    mean_std(sel, PERSONAL),
                    "—" if p is None else p.text(),
                    "—" if p is None else p.wins_text(),
                    f"{np.median(goal):g}" if goal else "not recorded",
                    share,
                    table,
                ]
            )
    claims = []
    if beats:
        won = [b for b in beats if b[2] is not None and b[3] is not None and b[2] > b[3]]
        claims.append(
            f"PI-FL's mean beats FedAvg's in {len(won)} of {len(beats)} settings"
            + (f" ({', '.join(b[0] for b in won)})" if won else "")
            + "."
        )
        for part, p, a, b in beats:
            if p.ok:
                spread = (
                    f"mean {pts(p.mean)}, std {p.std * 100:.1f} points; "
                    if len(p.deltas) > 1
                    else "one seed, no spread; "
                )
                claims.append(
                    f"{part}: PI-FL minus FedAvg per seed "
                    + " / ".join(f"{x:+.4f}" for x in p.deltas)
                    + f" ({spread}PI-FL better in {p.wins} of {plural(len(p.deltas), 'seed')})."
                )
            else:
                claims.append(f"{part}: {p.text()}.")
    for part in settings:
        ni, pi = select(recs, partition=part, method="pifl-ni"), select(recs, partition=part, method="pifl")
        others = [
            (NAMES[m], select(recs, partition=part, method=m))
            for m in ("ifca", "fedsoft")
            if ok(select(recs, partition=part, method=m))
        ]
        if others and ok(pi):  # PI-FL against the clustered baselines, not only against FedAvg
            claims.append(f"{part}: " + versus_many(others, "PI-FL", pi, PERSONAL) + ".")
        if ok(ni) and ok(pi):
            claims.append(f"{part}: " + versus("PI-FL(NI)", ni, "PI-FL", pi, PERSONAL) + ".")
        for m in axis(recs, "method", PIFL_METHODS):
            sel = select(recs, partition=part, method=m)
            failed = [r for r in sel if r.get("error")]
            if failed:
                claims.append(
                    f"{part}: {NAMES.get(m, m)} failed in {len(failed)} of {plural(len(sel), 'run')}: "
                    f"{error_line(failed[0]['error'])}."
                )
    claims += empty
    if not any(goal_examples(r) for r in ok(recs)):
        claims.append(
            "The size of each client's goal set is not in the records (clients.csv has no per-client "
            "goal-example count), so how many samples a difference rests on cannot be checked here."
        )
    conserved = [r for r in ok(recs) if (r.get("artefacts", {}).get("pifl") or {}).get("totals")]
    if conserved:
        const = sum(len(r["artefacts"]["pifl"]["totals"]) == 1 for r in conserved)
        claims.append(
            f"Token supply constant over all rounds in {const} of {len(conserved)} PI-FL / PI-FL(NI) runs "
            "(conservation is also asserted in every round)."
        )
    return "\n\n".join(
        [
            intro,
            header(recs, PIFL_PAPER, d),
            md_table(
                [
                    "data / mixture",
                    "method",
                    "personalized acc",
                    "Δ vs FedAvg, paired (mean ± std)",
                    "wins vs FedAvg",
                    "goal samples per client (median)",
                    "tier source-A shares (last round)",
                    "tier accuracy on A / B holdouts",
                ],
                rows,
            ),
            bullets(claims),
        ]
    )


# --------------------------------------------------------------------------- speed and scale
def round_split(rec: Rec) -> dict[str, float | None]:
    """Median per-round split of a run: rounds after the first, training-only rounds when there are any."""
    workers = rec["machine"]["cores"] or 1
    later = rec["rounds"][1:] or rec["rounds"]
    later = [r for r in later if not r.get("eval-clients")] or later
    rows = []
    for r in later:
        n = max(1, int(r.get("train-clients", 0)))
        w = min(workers, n)
        floor = r.get("train-seconds-per-client", 0.0) * n / w
        method = r.get("method-seconds-per-client", 0.0) * n / w
        seconds, server = r.get("seconds") or 0.0, r.get("server-seconds", 0.0)
        rows.append(
            {
                "seconds": seconds,
                "local-train": floor,
                "method-client": method,
                "server": server,
                "rest": seconds - floor - method - server,
                "ratio": seconds / floor if floor > 0 else None,
                "kb-down": r.get("bytes-down", 0) / n / 1e3,
                "kb-up": r.get("bytes-up", 0) / n / 1e3,
                "server-mb": r.get("server-rss-mb"),
                "client-mb": r.get("client-rss-mb"),
                "train-per-client": r.get("train-seconds-per-client"),
            }
        )
    keys = rows[0].keys() if rows else []
    return {
        k: (float(np.median([x[k] for x in rows if x[k] is not None])) if any(x[k] is not None for x in rows) else None)
        for k in keys
    }


SPLIT_HEADER = [
    "method",
    "clients",
    "s / round",
    "local training (floor)",
    "method client work",
    "server",
    "rest (Flower, dispatch)",
    "round / floor",
    "KB down / client",
    "KB up / client",
    "server peak MB",
    "client peak MB",
]


def _split_rows(recs: list[Rec], order: list[str]) -> list[list[Any]]:
    rows = []
    for n in sorted({r["cell"]["clients"] for r in recs}):
        for m in axis(recs, "method", order):
            for r in select(recs, method=m, clients=n):
                if r.get("error"):
                    rows.append([m, n, f"failed: {error_line(r['error'])}"] + ["—"] * 9)
                    continue
                s = round_split(r)
                rows.append(
                    [
                        m,
                        n,
                        num(s["seconds"], 2),
                        num(s["local-train"], 2),
                        num(s["method-client"], 2),
                        num(s["server"], 2),
                        num(s["rest"], 2),
                        num(s["ratio"], 2),
                        num(s["kb-down"], 1),
                        num(s["kb-up"], 1),
                        num(s["server-mb"], 0),
                        num(s["client-mb"], 0),
                    ]
                )
    return rows


SCALE_METHODS = [
    "local",
    "fedavg",
    "fedprox",
    "fedper",
    "fedrep",
    "fedrod",
    "ditto",
    "fedcac",
    "fedc2i",
    "pfedlia",
    "cfl",
    "pifl",
    "ifca",
    "fedsoft",
    "client2vec",
    "moon",
]
FLOOR_TARGET = 1.5  # issue 9: a round within 1.5x of its pure local training


def render_scale(raw: Path, d: dict[str, Any]) -> str:
    parts = [
        "Seconds per round through Flower's simulation runtime, split into the clients' local training (the "
        "floor: the sum of the clients' training seconds over the workers, one client per core), the clients' "
        "method-specific work, the server's strategy time and the rest (Flower messaging, Ray dispatch, "
        "serialisation). Medians over the rounds after the first (process start-up) without an evaluation "
        "phase. KB per client = all bytes of a round, every phase, over the clients that trained. Ratios are "
        "measured against the floor of the same run; absolute seconds depend on the machine's load."
    ]
    floor = load_records("scale-floor", raw)
    parts.append("### Flower's overhead against pure local training (the floor)")
    if floor:
        parts += [header(floor, [], d), md_table(SPLIT_HEADER, _split_rows(floor, ["fedavg"]))]
        for r in ok(floor):
            s = round_split(r)
            if s["ratio"] is not None:
                parts.append(
                    f"- One client's local training takes {s['train-per-client']:.2f} s; the round is "
                    f"{s['ratio']:.2f}x its floor ({'within' if s['ratio'] <= FLOOR_TARGET else 'above'} the "
                    f"{FLOOR_TARGET}x target of issue 9)."
                )
    else:
        parts.append(missing("python benchmarks/scale.py floor"))
    over = load_records("scale-overhead", raw)
    parts.append("### Every method: split of a round, bytes, memory")
    if over:
        parts += [header(over, [], d), md_table(SPLIT_HEADER, _split_rows(over, SCALE_METHODS))]
        ratios = [(r["cell"]["method"], r["cell"]["clients"], round_split(r)["ratio"]) for r in ok(over)]
        ratios = [x for x in ratios if x[2] is not None]
        if ratios:
            lo, hi = min(ratios, key=lambda x: x[2]), max(ratios, key=lambda x: x[2])
            parts.append(
                f"- Round / floor ranges from {lo[2]:.2f} ({lo[0]}, {lo[1]} clients) to {hi[2]:.2f} "
                f"({hi[0]}, {hi[1]} clients) on this deliberately tiny workload."
            )
    else:
        parts.append(missing("python benchmarks/scale.py overhead"))
    scale = load_records("scale-scale", raw)
    parts.append("### Scaling to 1,000 clients")
    if scale:
        parts += [header(scale, [], d), md_table(SPLIT_HEADER, _split_rows(scale, ["fedavg", "fedcac", "fedc2i"]))]
        sizes = sorted({r["cell"]["clients"] for r in scale})
        rows = []
        for m in axis(scale, "method", ["fedavg", "fedcac", "fedc2i"]):
            per = {
                n: round_split(r)["seconds"] / n * 1000 for n in sizes for r in ok(select(scale, method=m, clients=n))
            }
            rows.append([m] + [num(per.get(n), 1) for n in sizes])
        parts.append(md_table(["method"] + [f"ms per client per round: {n} clients" for n in sizes], rows))
    else:
        parts.append(missing("python benchmarks/scale.py scale"))
    kernels = load_records("scale-kernels", raw)
    parts.append("### Server kernels that are quadratic in clients (in-process, one thread)")
    if kernels:
        parts += [
            header(kernels, [], d),
            md_table(
                ["server kernel", "clients", "seconds (best of the repeats, shared machine)"],
                [
                    [
                        r["cell"]["kernel"]
                        + (
                            f" ({r['measurements']['parameters']:,} parameters)"
                            if "FedCAC" in r["cell"]["kernel"]
                            else ""
                        ),
                        r["cell"]["clients"],
                        f"{r['measurements']['seconds']:.2f}",
                    ]
                    for r in kernels
                ],
            ),
        ]
    else:
        parts.append(missing("python benchmarks/scale.py kernels"))
    return "\n\n".join(parts)


def _med(xs: list[float] | None) -> float | None:
    return float(np.median(xs)) if xs else None


#: issue 17's reference: a single-process research library's median FedAvg / FedCAC round on the same setting,
#: measured on this machine by the issue's author (not reproducible here: the library is not installed)
RESEARCH_LIBRARY_ROUND = {"fedavg": 0.46, "fedcac": 0.47}
SIM_TARGET, DEPLOY_TARGET = 1.1, 3.0


def noop_payload(sim: list[dict]) -> str:
    """What the no-op app's messages carried, from its records (older records: one array of the cnn's floats)."""
    kinds = sorted(
        {
            (r["measurements"].get("payload-arrays", 1), r["measurements"].get("payload-floats", 38_330))
            for r in sim
            if r["cell"].get("app") == "noop"
        }
    )
    said = "; ".join(f"{a} array{'s' if a != 1 else ''} of {f:,} floats in all" for a, f in kinds)
    return (
        f"the no-op app's messages carry {said} each way (the arrays of the cnn's state, as pflower's FedAvg "
        "messages do; Flower serialises each array of a record on its own, so the count matters)."
    )


def render_speed(raw: Path, d: dict[str, Any]) -> str:
    parts = [
        "How close a round comes to what Flower's runtime allows: pflower against a no-op Flower app "
        "(`benchmarks/noop_app`, a ClientApp that replies at once) with the same nodes and messages, and on the "
        "deployment runtime against the time a fresh ClientApp process needs to import torch and flwr. "
        "Since issue 17 a round sends one message per client: the evaluation of round r rides on round r + 1's "
        "train message, and only the last round has an evaluate phase. Seconds per round are the server's "
        "(rounds.json); a round's compute is the clients' handler time summed over its messages, over the "
        "clients that run at a time."
    ]
    sim = load_records("speed-sim", raw)
    parts.append("### Simulation: pflower against a no-op Flower app")
    if sim:
        m0 = next((r["measurements"] for r in sim if "run-config" in r["measurements"]), {})
        cfg = m0.get("run-config", {})
        shown = {k: v for k, v in cfg.items() if k not in ("method", "results-dir", "min-nodes")}
        parts.append(
            header(sim, [], d).split("\n")[0]
            + "\n"
            + "Setting (issue 17's): "
            + ", ".join(f"`{k}={v}`" for k, v in shown.items())
            + "; `client-resources-num-cpus=1` (two clients at a time on 2 cores); "
            + noop_payload(sim)
            + "\n"
            + machine_note(sim)
        )
        rows, claims = [], []
        for n in sorted({r["cell"]["clients"] for r in sim}):
            noop = next((r["measurements"] for r in sim if r["cell"] == {"clients": n, "app": "noop"}), None)
            noop_med = _med(noop["round-seconds"]) if noop else None
            if noop:
                rows.append(
                    [
                        n,
                        "no-op Flower app",
                        num(noop_med, 3),
                        num(float(np.mean(noop["round-seconds"])), 3),
                        num(noop["round-seconds"][0], 2),
                        "—",
                        "—",
                        f"{noop['wall-seconds']:.1f}",
                        "—",
                    ]
                )
            for r in sorted(
                (r for r in sim if r["cell"]["clients"] == n and r["cell"]["app"] != "noop"),
                key=lambda r: r["cell"]["app"],
            ):
                m = r["measurements"]
                if "error" in m:
                    rows.append([n, r["cell"]["app"], "failed", "", "", "", "", "", ""])
                    continue
                med, comp = _med(m["round-seconds"]), _med(m["compute-seconds"])
                ratio = med / (noop_med + comp) if noop_med is not None else None
                rows.append(
                    [
                        n,
                        r["cell"]["app"],
                        num(med, 3),
                        num(float(np.mean(m["round-seconds"])), 3),
                        num(m["round-seconds"][0], 2),
                        num(comp, 3),
                        num(ratio, 2),
                        f"{m['wall-seconds']:.1f}",
                        num(m.get("personal-acc"), 4),
                    ]
                )
                if ratio is not None:
                    claims.append(
                        f"{n} clients, {r['cell']['app']}: a round is {ratio:.2f}x the no-op round plus its "
                        f"compute ({'within' if ratio <= SIM_TARGET else 'above'} the {SIM_TARGET}x target)"
                    )
                ref = RESEARCH_LIBRARY_ROUND.get(r["cell"]["app"])
                if ref and n == 20:
                    claims.append(
                        f"{n} clients, {r['cell']['app']}: median round {med:.2f} s = {med / ref:.2f}x the "
                        f"research library's {ref} s of issue 17 (target 1.5x; that figure was measured by "
                        f"the issue's author, not in this run)"
                    )
        parts.append(
            md_table(
                [
                    "clients",
                    "app",
                    "median s/round",
                    "mean s/round",
                    "round 1 s",
                    "compute s/round",
                    "ratio",
                    "whole run s",
                    "personal acc",
                ],
                rows,
            )
        )
        parts.append(bullets(claims))
    else:
        parts.append(missing("python benchmarks/speed.py sim"))
    dep = load_records("speed-deploy", raw)
    parts.append("### Loopback deployment: seconds per round and where a message's time goes")
    if dep:
        ref = next((r["measurements"]["seconds"] for r in dep if r["cell"].get("what") == "import-torch-flwr"), None)
        parts.append(
            header(dep, [], d).split("\n")[0] + "\n" + "`python deploy/local_cluster.py --nodes N "
            "--rounds 4` defaults (FedAvg, digits, Dirichlet 0.5, TLS, node authentication, direct topology); "
            "a fresh `flwr-clientapp` process per message. Breakdown: medians over the train messages of "
            "rounds 2 and later (round 1 pays the FAB download); on one machine the client's and server's "
            "clocks agree, so the split is exact.\n" + machine_note(dep)
        )
        comps = ["dispatch", "start-up", "imports", "setup", "work", "return", "total"]
        rows, claims, dispatch = [], [], {}
        for r in sorted(
            (r for r in dep if "nodes" in r["cell"]),
            key=lambda r: (r["cell"]["nodes"], -r["cell"]["task-poll-interval"]),
        ):
            m = r["measurements"]
            if not m.get("round-seconds"):
                rows.append([r["cell"]["nodes"], r["cell"]["task-poll-interval"], "failed"] + [""] * (len(comps) + 1))
                continue
            later = [t.get("train", {}) for t in m["message-timing"][1:]]
            # rounds after the first without an evaluate phase (the last round has one: two messages per node)
            plain = [x for x, t in list(zip(m["round-seconds"], m["message-timing"]))[1:] if "evaluate" not in t]
            med = _med(plain or m["round-seconds"])
            dispatch[(r["cell"]["nodes"], r["cell"]["task-poll-interval"])] = _med(
                [t["dispatch"] for t in later if "dispatch" in t]
            )
            rows.append(
                [r["cell"]["nodes"], f"{r['cell']['task-poll-interval']:g}", num(med, 1), num(m["round-seconds"][0], 1)]
                + [num(_med([t[c] for t in later if c in t]), 2) for c in comps]
            )
            if ref and r["cell"]["nodes"] == 2 and r["cell"]["task-poll-interval"] < 1:
                x = med / _med(ref)
                claims.append(
                    f"2 nodes: a deployed round (median of the rounds after the first without an evaluate "
                    f"phase) takes {med:.1f} s = {x:.1f}x "
                    f'`python -c "import torch, flwr"` ({_med(ref):.2f} s in the same run; target '
                    f"{DEPLOY_TARGET:g}x: {'met' if x <= DEPLOY_TARGET else 'not met'})"
                )
                legs = {c: _med([t[c] for t in later if c in t]) for c in ("dispatch", "start-up", "return")}
                if all(v is not None for v in legs.values()):
                    flower = sum(legs.values())
                    claims.append(
                        f"2 nodes: Flower's own legs of a message (dispatch + start-up of the fresh "
                        f"`flwr-clientapp` process + return) take {flower:.2f} s = "
                        f"{flower / _med(ref):.1f}x the import time, before any of pflower's imports or "
                        f"work: flwr 1.41 starts a process per message, its SuperNode sleeps a fixed 3 s "
                        f"after an empty pull and polls for a finished reply every 0.5 s (neither is "
                        f"configurable)"
                    )
        fast, slow = dispatch.get((2, 0.1)), dispatch.get((2, 1.0))
        if fast is not None and slow is not None:
            claims.append(
                f"2 nodes: a message's dispatch (push to the ClientApp process's start) takes {fast:.2f} s "
                f"with a 0.1 s task poll against {slow:.2f} s with Flower's default 1 s"
            )
        parts.append(
            md_table(["nodes", "task poll s", "median s/round", "round 1 s"] + [f"{c} s" for c in comps], rows)
        )
        parts.append(bullets(claims))
    else:
        parts.append(missing("python benchmarks/speed.py deploy"))
    comp = load_records("speed-compose", raw)
    parts.append("### The docker-compose demo")
    if comp:
        m = comp[-1]["measurements"]
        parts.append(header(comp, [], d).split("\n")[0] + "\n" + machine_note(comp))
        parts.append(
            md_table(
                ["images", "exit", "start to end of round 1 s", "s per later round", "whole demo s"],
                [
                    [
                        m.get("base-image", "not recorded"),
                        m["exit"],
                        num(m.get("to-first-round-end"), 1),
                        ", ".join(f"{x:.1f}" for x in m.get("round-seconds") or []) or "—",
                        f"{m['wall-seconds']:.0f}",
                    ]
                ],
            )
        )
    else:
        parts.append(missing("python benchmarks/speed.py compose"))
    return "\n\n".join(parts)


# =========================================================================== the document
PREAMBLE = """# Benchmark results

Generated by `python benchmarks/report.py` from the raw records in `benchmarks/raw/<grid>/` (one small JSON per
run: its full run config, the summary, per-round and per-client essentials, the method artefacts the tables use,
and fingerprints of its data and draws). Do not edit this file by hand: `tests/test_benchmark_report.py` fails
when it differs from what the records give. Every run goes through Flower: a private simulation SuperLink and
`flwr run` (`server_app/runner.py`). Accuracy = each client's model on its own held-out test split, mean over
clients, at the last round, unless a table says otherwise. Each table names the command that produced it, every
setting that differs from the defaults in `pyproject.toml` and from the paper, and the machine; the machine is
shared with other work, so seconds compare only within a table. A paired difference (arm minus reference on the
same seed) is printed only when the two runs share their data (and, where claimed, their client draws)."""

SECTIONS = [
    Section("Baselines on digits (issue 2)", ["baselines-clean", "baselines-noisy"], render_baselines),
    Section("FedC2I on feature-shift digits (issue 4)", ["fedc2i"], render_fedc2i),
    Section("FedC2I: influence phase vs local training (issue 4)", ["fedc2i-speed"], render_fedc2i_speed, 3),
    Section("FedCAC on noisy digits (issue 3)", ["fedcac"], render_fedcac),
    Section(
        "Client2Vec case studies on feature-shift x label-skew digits (issue 7)", ["client2vec"], render_client2vec
    ),
    Section("pFedLIA on planted clusters (issue 5)", ["pfedlia"], render_pfedlia),
    Section("pFedLIA: next-word prediction on three synthetic dialects", ["pfedlia-dialects"], render_dialects, 3),
    Section(
        "Speed and scale (issue 9)", ["scale-floor", "scale-overhead", "scale-scale", "scale-kernels"], render_scale
    ),
    Section("PI-FL on two-source data (issue 6)", ["pifl"], render_pifl),
    Section(
        "Rounds as fast as the runtime allows (issue 17)", ["speed-sim", "speed-deploy", "speed-compose"], render_speed
    ),
]


def build(raw: Path = RAW, pyproject: Path = PYPROJECT) -> str:
    d = defaults(pyproject)
    parts = [PREAMBLE]
    for s in SECTIONS:
        parts.append("#" * s.level + " " + s.title)
        parts.append(s.render(Path(raw), d))
    return "\n\n".join(parts).rstrip() + "\n"


def render_grid(grid: str, raw: Path = RAW) -> str:
    """The section(s) of RESULTS.md that show ``grid`` (what a benchmark script prints after its runs)."""
    d = defaults()
    return "\n\n".join(f"{'#' * s.level} {s.title}\n\n{s.render(Path(raw), d)}" for s in SECTIONS if grid in s.grids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw-dir", default=str(RAW))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--check", action="store_true", help="exit 1 if the file differs from what the records give")
    args = ap.parse_args()
    text = build(Path(args.raw_dir))
    out = Path(args.out)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from the raw records; run python benchmarks/report.py'}")
        sys.exit(0 if same else 1)
    out.write_text(text)
    print(f"wrote {out} from {args.raw_dir}")


if __name__ == "__main__":
    main()
