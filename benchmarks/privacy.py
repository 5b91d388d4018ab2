"""Personalized accuracy against the privacy budget epsilon (the privacy issue's benchmark).

Four methods on the default digits partition, each at the client-level DP mode it supports (docs/privacy.md):
FedAvg and Ditto with **central** DP (noise on the server's mean), FedC2I with **local** DP (each client noises
what it releases to its peers), and FedCAC, which supports no DP mode: its DP runs are asked for all the same
(``dp-mode='central'``, once per target, at the first seed: the refusal depends on neither), so that the table
shows the refusal the app gives at start-up, and its runs without DP.
Local runs without DP only: no model leaves its clients, so it is the reference a private method has to beat.

For each target epsilon (``TARGETS``: 1, 4, 16) the noise multiplier that reaches it is searched by bisection on
the Rényi-DP bound of the accountant the runs use (``task.privacy.central_bound`` / ``local_bound``), at the run's
settings: the default rounds, the ``CLIENTS`` nodes, the default ``fraction-train`` (the cohort), ``dp-delta`` and
``dp-clip`` (epsilon does not depend on the clip bound; it sets the noise's scale).  The multiplier is rounded up to
``DIGITS`` significant digits, so the runs' epsilon is at most the target and within ``TOLERANCE`` of it.
Epsilon infinity is the run without DP (``dp-mode='off'``).

Every run is a user's command with nothing but the method, the seed and the DP keys set:

    flwr run . --run-config "method='X' seed=S dp-mode='central' dp-noise-multiplier=N" \
               --federation-config "num-supernodes=10 client-resources-num-cpus=1"

through Flower (a private simulation SuperLink, ``flwr run``), and ``min-nodes=10`` as in
``benchmarks/defaults.py`` (every round waits for all ten nodes).  No method is tuned (the same tuning budget
for every method: none); ``dp-clip`` is the default for every method.

One raw record per run goes to ``benchmarks/raw/privacy/`` (``<method>__<epsilon>__<seed>.json``): the run's
record (``benchmarks/running.py``; its summary has the accountant's ``epsilon`` and ``delta`` after the last
round) with ``dp-target``: the target epsilon, the mode, the multiplier found and the epsilon the search
predicted.  A run whose record exists is skipped (the script resumes where it stopped; ``--retry-failed`` reruns
failed ones).  Order: seed by seed, so that a partial run has every method and epsilon at the first seeds.
``benchmarks/reporting/privacy.py`` renders the table and the figure (``benchmarks/privacy_epsilon.png``).

    python -m benchmarks.privacy --dry-run                  # the plan and the noise multipliers, run nothing
    benchmarks/run_committed.sh "privacy"                # every run (45 runs)
    python -m benchmarks.privacy --methods fedavg --epsilons 4 --seeds 0 --raw-dir /tmp/raw   (a quick trial)
    python -m benchmarks.report                             # RESULTS.md and the figure
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.records import run_config_defaults
from benchmarks.reporting import print_section
from benchmarks.reporting.freshness import stale_now
from benchmarks.running import Bench, Progress, Todo, parser, run_all, split

GRID = "privacy"
CLIENTS = 10  # the README's num-supernodes
#: method -> the DP mode its runs ask for (FedCAC supports none: its runs with DP record the refusal); Local, the
#: reference without any release (no model leaves a client), runs without DP only
METHODS: dict[str, str | None] = {
    "fedavg": "central",
    "ditto": "central",
    "fedc2i": "local",
    "fedcac": "central",
    "local": None,
}
TARGETS = (1.0, 4.0, 16.0)
SEEDS = (0, 1, 2)
INF = "inf"
DIGITS = 4  # significant digits of the noise multiplier in the run config (rounded up: epsilon <= target)
TOLERANCE = 0.01  # the runs' epsilon is within 1 % below the target


def label(epsilon: float) -> str:
    """A target's name in the cell (and the record's file name): ``1``, ``4``, ``16``, ``inf``."""
    return INF if math.isinf(epsilon) else f"{epsilon:g}"


# =========================================================================== the noise multiplier of a target
@dataclass(frozen=True)
class Accounting:
    """What epsilon depends on: the mode, rounds, population, cohort and delta (clip only scales the noise)."""

    mode: str
    rounds: int
    population: int
    cohort: int
    delta: float
    clip: float

    def epsilon(self, noise_multiplier: float) -> float:
        """The run's Rényi-DP epsilon after its last round (strategies/privacy.py).  The committed runs were searched
        and reported on it; the server now reports the tighter of it and the PLD bound, which is at most this, so a
        multiplier found here still keeps a run within its target (with less noise possible: rerun the grid with
        ``dp-target-epsilon`` for the tighter calibration)."""
        from task.privacy import central_bound, local_bound

        if self.mode == "central":
            rate = self.cohort / self.population  # each client's chance to be in a round (Poisson, the default)
            return central_bound(noise_multiplier, self.rounds, self.delta, rate).rdp
        if self.mode == "local":  # every client releases once per round
            return local_bound(noise_multiplier, self.rounds, self.delta).rdp
        raise ValueError(f"no accountant for dp-mode {self.mode!r}")


def accounting(mode: str, config: dict[str, Any] | None = None, clients: int = CLIENTS) -> Accounting:
    """The accounting of a run with the app's defaults (overridden by ``config``) on ``clients`` nodes."""
    from strategies.gate import cohort_size

    cfg = {**run_config_defaults(), **(config or {})}
    return Accounting(
        mode,
        int(cfg["num-server-rounds"]),
        clients,
        cohort_size(clients, float(cfg["fraction-train"])),
        float(cfg["dp-delta"]),
        float(cfg["dp-clip"]),
    )


def round_up(x: float, digits: int = DIGITS) -> float:
    """``x`` rounded up to ``digits`` significant digits."""
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale - 1e-9) / scale


def noise_multiplier_for(
    target: float, epsilon: Callable[[float], float], tolerance: float = TOLERANCE, digits: int = DIGITS
) -> float:
    """The noise multiplier whose ``epsilon`` (decreasing in it) is at most ``target`` and within ``tolerance``
    (relative) of it: bisection on the logarithm of the multiplier, then rounded up to ``digits`` significant
    digits (more noise, so the target still holds)."""
    if not (target > 0 and math.isfinite(target)):
        raise ValueError(f"the target epsilon must be finite and > 0, got {target}")
    lo, hi = 1e-3, 1.0
    eps_hi = epsilon(hi)
    while eps_hi > target:  # hi: enough noise
        lo, hi = hi, hi * 2
        eps_hi = epsilon(hi)
        if hi > 1e6:
            raise ValueError(f"no noise multiplier up to 1e6 reaches epsilon {target}")
    if epsilon(lo) <= target:
        raise ValueError(f"epsilon {target} is reached with almost no noise (multiplier {lo}): nothing to search")
    # invariant: epsilon(lo) > target >= epsilon(hi); stop well inside the tolerance, before rounding up
    for _ in range(200):
        if eps_hi >= target * (1 - tolerance / 2):
            break
        mid = math.sqrt(lo * hi)
        eps_mid = epsilon(mid)
        if eps_mid > target:
            lo = mid
        else:
            hi, eps_hi = mid, eps_mid
    sigma = round_up(hi, digits)
    if not target * (1 - tolerance) <= epsilon(sigma) <= target:
        raise ValueError(f"multiplier {sigma} gives epsilon {epsilon(sigma)}, not within {tolerance:%} below {target}")
    return sigma


# =========================================================================== the runs
@dataclass
class Run:
    """One planned run (what ``running.run_all`` runs): its record keeps the target it was planned for."""

    cell: dict[str, Any]
    config: dict[str, Any]
    target: dict[str, Any]
    grid: str = GRID
    clients: int = CLIENTS

    @property
    def extra(self) -> dict[str, Any]:
        return {"dp-target": self.target}


def refused(method: str, mode: str) -> bool:
    """Whether ``method`` refuses ``mode`` at start-up (its registry entry declares no such mode)."""
    from task.methods import METHODS as REGISTRY

    return mode not in REGISTRY[method].privacy.modes


def plan(methods: list[str], targets: list[float], seeds: list[int]) -> list[Run]:
    """Every run, seed by seed; within a seed every method without DP first, then the targets."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; this benchmark has: {', '.join(METHODS)}")
    multipliers: dict[tuple[str, float], float] = {}
    runs = []
    for seed in seeds:
        for epsilon in [math.inf, *targets]:
            for method in methods:
                mode = METHODS[method]
                if not math.isinf(epsilon) and (mode is None or (refused(method, mode) and seed != seeds[0])):
                    continue  # a refusal depends on neither seed nor multiplier: asked once per target
                cell = {"method": method, "epsilon": label(epsilon), "seed": seed}
                config: dict[str, Any] = {"method": method, "seed": seed}
                target: dict[str, Any] = {"epsilon": None, "mode": "off"}
                if mode is not None and not math.isinf(epsilon):
                    acc = accounting(mode)
                    key = (acc.mode, epsilon)
                    if key not in multipliers:
                        multipliers[key] = noise_multiplier_for(epsilon, acc.epsilon)
                    sigma = multipliers[key]
                    config |= {"dp-mode": acc.mode, "dp-noise-multiplier": sigma}
                    target = {
                        "epsilon": epsilon,
                        "mode": acc.mode,
                        "noise-multiplier": sigma,
                        "predicted-epsilon": acc.epsilon(sigma),
                        "accounting": {k: v for k, v in asdict(acc).items() if k != "mode"},
                    }
                runs.append(Run(cell, config, target))
    return runs


def expected_failure(run: Run) -> bool:
    """FedCAC's refusals are expected failures; anything else in a row means a broken set-up."""
    return run.target["mode"] != "off" and refused(run.cell["method"], run.target["mode"])


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--epsilons", default=",".join(label(t) for t in TARGETS), help="targets (inf: always run)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs whose record says they failed")
    ap.add_argument("--keep-stale", action="store_true", help="keep records whose method's code changed since")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the noise multipliers, run nothing")
    args = ap.parse_args()
    raw_dir = Path(args.raw_dir)
    targets = [float(t) for t in split(args.epsilons) if t != INF]
    runs = plan(split(args.methods), targets, [int(s) for s in split(args.seeds)])
    # a record whose method's code changed since it ran is run again (unless --keep-stale)
    left = Todo(raw_dir, args.retry_failed, None if args.keep_stale else stale_now(raw_dir)).left(runs)
    shown = set()
    for r in runs:
        t = r.target
        if t["mode"] != "off" and (t["mode"], t["epsilon"]) not in shown:
            shown.add((t["mode"], t["epsilon"]))
            a = t["accounting"]
            print(
                f"{t['mode']} epsilon {t['epsilon']:g}: dp-noise-multiplier {t['noise-multiplier']} (epsilon "
                f"{t['predicted-epsilon']:.4f} after {a['rounds']} rounds, {a['cohort']} of {a['population']} "
                f"clients, delta {a['delta']:g})"
            )
    print(f"plan: {len(runs)} runs, {len(left)} to do (records in {raw_dir / GRID}/)")
    if args.dry_run:
        return
    with Bench(GRID, raw_dir=raw_dir, total=len(left)) as bench:
        run_all(left, bench, raw_dir, Progress(len(left)), expected_failure)
    print_section(GRID, raw_dir)


if __name__ == "__main__":
    main()
