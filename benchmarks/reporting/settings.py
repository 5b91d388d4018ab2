"""The lines above a table: the command, every setting that differs from the defaults and from the paper,
the machine and the code that ran."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.records import Rec, axis, label, ok, seeds_of

from .text import plural

# run-config keys never listed in a settings line: where results go, and the grid coordinates shown in the table
NOT_SETTINGS = {"results-dir", "c2v-cache-dir", "seed", "method"}


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
        failed = len(recs) - len(ok(recs))
        ran = f"{plural(len(recs), 'run')} ({failed} failed), {seconds:,.0f} s of ServerApp time summed"
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


#: a script named by its path: the command of a record made before the scripts became modules of ``benchmarks``
_SCRIPT_PATH = re.compile(r"^python benchmarks/(\w+)\.py\b")


def command(rec: Rec) -> str:
    """The command that runs a record's cell again today (the records' folder, ``--raw-dir``, left out)."""
    return _SCRIPT_PATH.sub(r"python -m benchmarks.\1", rec["command"].split(" --raw-dir")[0])


def header(recs: list[Rec], paper: list[Paper], defaults_: dict[str, Any]) -> str:
    """Command, settings that differ from the defaults and from the paper, machine: the lines above a table."""
    by_command: dict[str, list[Rec]] = {}
    for r in recs:
        by_command.setdefault(command(r), []).append(r)

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
