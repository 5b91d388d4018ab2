"""Cross-CPU float noise, measured: how far each method's accuracy moves when the same run config runs the same code on
another numeric path of this machine.

Records made on one CPU and judged on another differ by floating-point arithmetic alone (FedCAC's top-k masks, for
one, turn a last-bit difference into another mask).  This script runs every method of a *context* with the same run
configs under several *arms*:

- ``reference``: what every benchmark runs (``client-threads=1``, this CPU's vector kernels);
- ``threads-2``: ``client-threads=2``: torch splits its reductions over two threads, in another order;
- ``kernels-default``: PyTorch's portable kernels in place of this CPU's vector ones (AVX2 / AVX-512): another CPU's
  arithmetic on this one.  The kernels are chosen when torch starts, from ``ATEN_CPU_CAPABILITY``: this arm's runs go
  to a child process started with ``ATEN_CPU_CAPABILITY=default`` (its records name the kernels in
  ``machine.cpu-capability``); on a CPU whose kernels are already the portable ones the arm is left out.

Contexts, where the tables judge: ``defaults`` (every method with ``method`` and ``seed`` only, 10 clients, as
``benchmarks/defaults.py`` runs it), and each tuned family of ``benchmarks/families.py`` at its middle cell (every row
at the app's default learning rate and local epochs and its own key's default: the code path is what is measured, the
setting a row chooses comes later; families tuned elsewhere borrow their source's noise).  The same seed gives the same
data in every arm, so a move is float noise alone.  ``benchmarks/reporting/float_noise.py`` renders the moves and the
floor every win on the choosing page must clear.

A ``threads-2`` run keeps two cores busy: give ``--jobs`` at most half the cores (on 2 shared cores it took about
eight times a reference run's seconds).

    python -m benchmarks.float_noise --dry-run        # the plan: runs per context and arm
    benchmarks/run_committed.sh "float_noise --jobs 8" # every context, 3 seeds, the three arms (resumable)
    python -m benchmarks.float_noise --contexts defaults --methods local,fedavg,fedcac --seeds 0 --raw-dir /tmp/n
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.families import FAMILIES, Family
from benchmarks.reporting import print_section
from benchmarks.reporting.float_noise import GRID, REFERENCE
from benchmarks.running import Bench, Progress, Todo, parser, run_all, split

DEFAULTS = "defaults"
DEFAULTS_CLIENTS = 10  # as benchmarks/defaults.py
SEEDS = (0, 1, 2)
#: the environment variable PyTorch reads its CPU kernels from when it starts
KERNELS = "ATEN_CPU_CAPABILITY"
#: set for the child process that runs one arm in that arm's environment
CHILD_ARM = "PFLOWER_FLOAT_NOISE_ARM"


@dataclass(frozen=True)
class Arm:
    """A numeric setting: run-config keys it sets, and the environment of the process that runs it."""

    name: str
    config: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


ARMS = {
    REFERENCE: Arm(REFERENCE, {"client-threads": 1}),
    "threads-2": Arm("threads-2", {"client-threads": 2}),
    "kernels-default": Arm("kernels-default", {"client-threads": 1}, {KERNELS: "default"}),
}


@dataclass(frozen=True)
class NoiseRun:
    """One run of the noise grid (what ``running.run_all`` runs)."""

    context: str
    method: str
    arm: str
    seed: int
    config: dict[str, Any]
    clients: int

    @property
    def grid(self) -> str:
        return GRID

    @property
    def cell(self) -> dict[str, Any]:
        return {"context": self.context, "method": self.method, "arm": self.arm, "seed": self.seed}

    @property
    def extra(self) -> dict[str, Any]:
        return {}


def contexts() -> dict[str, Family | None]:
    """The contexts: the defaults (None), and every tuned family."""
    return {DEFAULTS: None, **{name: fam for name, fam in FAMILIES.items() if fam.tuned_from is None}}


def context_runs(
    context: str, methods: list[str], seeds: list[int], arms: list[str], rounds: int | None = None
) -> list[NoiseRun]:
    """The runs of one context: every method (or row), seed and arm, seed by seed (every arm of a seed together);
    ``rounds``: in place of the context's rounds."""
    family = contexts()[context]
    configs: dict[str, dict[str, Any]]
    if family is None:
        from task.methods import METHODS

        names = list(METHODS)
        configs = {m: {"method": m} for m in names}
        clients = DEFAULTS_CLIENTS
    else:
        names = [r.name for r in family.rows]
        configs = {r.name: {**family.cell_config(*family.middle), **r.config} for r in family.rows}
        clients = family.clients
    if methods:
        names = [n for n in names if n in methods]
    if rounds is not None:
        configs = {n: {**c, "num-server-rounds": rounds} for n, c in configs.items()}
    return [
        NoiseRun(context, name, arm, seed, {**configs[name], **ARMS[arm].config, "seed": seed}, clients)
        for seed in seeds
        for name in names
        for arm in [REFERENCE, *arms]
    ]


def kernels_differ() -> bool:
    """Whether PyTorch runs this CPU's vector kernels here (so that the portable ones are another arithmetic)."""
    import torch

    return torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def plan_lines(runs: list[NoiseRun], todo: Todo) -> list[str]:
    lines = []
    for context in dict.fromkeys(r.context for r in runs):
        mine = [r for r in runs if r.context == context]
        per_arm = {a: sum(1 for r in mine if r.arm == a) for a in dict.fromkeys(r.arm for r in mine)}
        lines.append(
            f"{context}: {len({r.method for r in mine})} methods x {len({r.seed for r in mine})} seeds x "
            f"{len(per_arm)} arms = {len(mine)} runs ({len(todo.left(mine))} left): "
            + ", ".join(f"{a} {n}" for a, n in per_arm.items())
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--contexts", default=",".join(contexts()), help=f"default: {','.join(contexts())}")
    ap.add_argument("--methods", default="", help="only these methods / rows (default: every one of each context)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--arms", default=",".join(a for a in ARMS if a != REFERENCE), help="arms beside the reference")
    ap.add_argument("--rounds", type=int, help="override num-server-rounds (quick looks only; default: the context's)")
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs whose record says they failed")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = ap.parse_args(argv)
    chosen, arms = split(args.contexts), split(args.arms)
    unknown = [c for c in chosen if c not in contexts()] + [a for a in arms if a not in ARMS or a == REFERENCE]
    if unknown:
        raise SystemExit(f"unknown context or arm {unknown}; contexts: {list(contexts())}, arms: {list(ARMS)[1:]}")
    child_arm = os.environ.get(CHILD_ARM)  # this process was started to run one arm in its own environment
    if child_arm is None:
        if os.environ.get(KERNELS):
            raise SystemExit(f"unset {KERNELS}: the reference runs are this CPU's own kernels")
        if "kernels-default" in arms and not kernels_differ():
            print("kernels-default: left out: PyTorch already runs its portable kernels on this CPU")
            arms.remove("kernels-default")
    elif child_arm == "kernels-default" and kernels_differ():
        raise SystemExit(f"{KERNELS}=default did not give PyTorch's portable kernels in this process")
    seeds = [int(s) for s in split(args.seeds)]
    runs = [r for c in chosen for r in context_runs(c, split(args.methods), seeds, arms, args.rounds)]
    raw_dir = Path(args.raw_dir)
    todo = Todo(raw_dir, args.retry_failed)
    if child_arm is None:
        for line in plan_lines(runs, todo):
            print(f"plan: {line}")
    if args.dry_run:
        return
    here = [child_arm] if child_arm else [REFERENCE, *(a for a in arms if not ARMS[a].env)]
    mine = todo.left([r for r in runs if r.arm in here])
    with Bench(GRID, raw_dir=raw_dir, total=len(mine)) as bench:
        run_all(mine, bench, raw_dir, Progress(len(mine)))
    if child_arm:
        return
    for arm in (a for a in arms if ARMS[a].env):
        print(f"{arm}: its runs in a child process with {ARMS[arm].env}", flush=True)
        command = [sys.executable, "-m", "benchmarks.float_noise", *(sys.argv[1:] if argv is None else argv)]
        subprocess.run(command, env={**os.environ, **ARMS[arm].env, CHILD_ARM: arm}, check=True)
    print_section(GRID, raw_dir)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
