"""The tables of ``benchmarks/float_noise.py`` (grid ``float-noise``): how far each method's accuracy moves when the
same run config runs the same code on another numeric path of the same machine, and the noise floor a win must clear.

Each record is one run of a *context* (where a table judges: ``defaults``, or a tuned family of
``benchmarks/families.py``), a method (a row name), a seed and an *arm*: ``reference`` (what the benchmarks run) or
another numeric setting (more torch threads, PyTorch's portable kernels in place of this CPU's vector ones; the
records say which: ``client-threads`` and the machine's ``cpu-capability``).  The same seed gives the same data, so a
run of an arm and the reference run of its seed differ only by floating-point arithmetic.

A method's *move* on a seed and arm is its personalized accuracy there minus the reference's.  Its *noise* is the
largest move, in absolute value, over the seeds and arms: how far its accuracy can go on another CPU with the same
code.  A paired difference between two methods moves by the difference of their moves; its *noise floor* is the
largest such movement over the seeds and arms both ran (:meth:`Noise.floor`).  The choosing page does not call a win
whose paired difference is not larger than its floor (``choosing.judge``); where a family has no records of its
own context it borrows its source family's (``tuned_from``), and says so.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.families import FAMILIES
from benchmarks.records import PERSONAL, Rec, load_records, ok

from .pairing import REFERENCES, pairing_problem
from .settings import machine_note
from .text import md_table, missing, plural

GRID = "float-noise"
REFERENCE = "reference"
COMMAND = 'benchmarks/run_committed.sh "float_noise"'


@dataclass
class Noise:
    """One context's moves: method -> (arm, seed) -> its accuracy there minus the reference's (same seed, same data).
    ``unpaired`` counts (method, arm, seed) runs that could not be compared (no reference run, other data, failed)."""

    context: str
    moves: dict[str, dict[tuple[str, int], float]] = field(default_factory=dict)
    unpaired: int = 0

    @classmethod
    def from_records(cls, context: str, recs: Iterable[Rec]) -> Noise:
        recs = [r for r in recs if r["cell"].get("context") == context]
        refs = {(r["cell"]["method"], r["cell"]["seed"]): r for r in ok(recs) if r["cell"].get("arm") == REFERENCE}
        noise = cls(context)
        for r in recs:
            arm, method, seed = r["cell"].get("arm"), r["cell"].get("method"), r["cell"].get("seed")
            if arm == REFERENCE:
                continue
            ref = refs.get((method, seed))
            if r.get("error") or ref is None or PERSONAL(r) is None or PERSONAL(ref) is None:
                noise.unpaired += 1
                continue
            if pairing_problem(r, ref, draws=False) is not None:
                noise.unpaired += 1
                continue
            noise.moves.setdefault(method, {})[(arm, seed)] = float(PERSONAL(r)) - float(PERSONAL(ref))
        return noise

    def __bool__(self) -> bool:
        return bool(self.moves)

    @property
    def arms(self) -> list[str]:
        return sorted({arm for m in self.moves.values() for arm, _ in m})

    def of(self, method: str) -> float | None:
        """The largest move of ``method``'s accuracy, in absolute value (None: not measured)."""
        moves = self.moves.get(method)
        return max(abs(v) for v in moves.values()) if moves else None

    def floor(self, method: str, reference: str) -> float | None:
        """How far the paired difference ``method - reference`` moved at most, over the seeds and arms both ran
        (None: no seed and arm in common)."""
        a, b = self.moves.get(method, {}), self.moves.get(reference, {})
        shared = set(a) & set(b)
        return max(abs(a[k] - b[k]) for k in shared) if shared else None


def load(raw: Path) -> dict[str, Noise]:
    """Every context's :class:`Noise` from the records under ``raw`` (contexts without a comparable run left out).
    Read once per state of the records' folder (the page asks for every family and method)."""
    folder = Path(raw) / GRID
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return _load(str(raw), tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files))


@functools.lru_cache(maxsize=8)
def _load(raw: str, state: tuple[tuple[str, int, int], ...]) -> dict[str, Noise]:
    recs = load_records(GRID, raw)
    contexts = sorted({r["cell"].get("context") for r in recs} - {None})
    found = {c: Noise.from_records(c, recs) for c in contexts}
    return {c: n for c, n in found.items() if n}


def _points(v: float | None) -> str:
    return "—" if v is None else f"{v * 100:.2f}"


def _arm_settings(recs: list[Rec]) -> str:
    """What each arm ran with, from its records: torch threads per client and the CPU kernels."""
    parts = []
    for arm in sorted({r["cell"].get("arm") for r in recs} - {None}, key=lambda a: (a != REFERENCE, a)):
        mine = [r for r in recs if r["cell"].get("arm") == arm]
        threads = sorted({str((r.get("run-config") or {}).get("client-threads")) for r in mine})
        kernels = sorted({str((r.get("machine") or {}).get("cpu-capability")) for r in mine})
        parts.append(f"`{arm}`: client-threads {', '.join(threads)}, CPU kernels {', '.join(kernels)}")
    return "; ".join(parts)


def context_table(noise: Noise, recs: list[Rec]) -> str:
    arms = noise.arms
    present = {r["cell"]["method"] for r in recs if r["cell"].get("context") == noise.context}
    family = FAMILIES.get(noise.context)
    order = [r.name for r in family.rows] if family else list(REFERENCES)
    methods = [m for m in order if m in present] + sorted(present - set(order))
    rows = []
    for m in methods:
        ref = [r for r in ok(recs) if r["cell"].get("method") == m and r["cell"].get("arm") == REFERENCE]
        accs = [float(PERSONAL(r)) for r in ref if PERSONAL(r) is not None]
        moves = noise.moves.get(m, {})
        per_arm = []
        for arm in arms:
            vals = [v for (a, _), v in sorted(moves.items()) if a == arm]
            per_arm.append(", ".join(f"{v * 100:+.2f}" for v in vals) if vals else "—")
        rows.append(
            [
                f"`{m}`",
                f"{np.mean(accs):.3f}" if accs else "—",
                *per_arm,
                _points(noise.of(m)),
                _points(noise.floor(m, "local")) if m != "local" else "",
                _points(noise.floor(m, "fedavg")) if m != "fedavg" else "",
            ]
        )
    return md_table(
        [
            "method",
            "reference acc (mean over seeds)",
            *(f"move under `{a}`, points per seed" for a in arms),
            "noise: largest move, points",
            "floor of Δ to Local, points",
            "floor of Δ to FedAvg, points",
        ],
        rows,
    )


def render_float_noise(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records(GRID, raw)
    intro = (
        "How far each method's accuracy moves when the same run config runs the same code on another numeric path of "
        "the same machine (more torch threads per client; PyTorch's portable kernels in place of this CPU's vector "
        "ones): the noise between this machine's records and another CPU's. A move is an arm's personalized accuracy "
        "minus the reference run's on the same seed (same data); a method's noise is its largest move; the floor of "
        "a paired difference is the largest amount it moved between the arms. The choosing page calls no win whose "
        "paired difference is not above its floor."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.float_noise")
    found = load(raw)
    parts = [intro, f"Command: `{COMMAND}`. Arms: {_arm_settings(recs)}.", machine_note(recs)]
    for context in sorted({r["cell"].get("context") for r in recs} - {None}):
        mine = [r for r in recs if r["cell"].get("context") == context]
        noise = found.get(context, Noise(context))
        runs = plural(len(mine), "run")
        head = f"**{context}** ({runs}; {noise.unpaired} not comparable: failed, or no reference run of its seed)"
        parts += [head, context_table(noise, mine) if noise else "*No run of an arm could be compared.*"]
    return "\n\n".join(p for p in parts if p)
