"""Every method at the defaults a new user gets: does each one train a useful model out of the box?

Each value of the run-config key ``method`` (read from the method registry, ``task.methods.METHODS``, so a method
added there is run too) is run with nothing but ``method`` and ``seed`` set, exactly as

    flwr run . --run-config "method='X' seed=S" --federation-config "num-supernodes=10 client-resources-num-cpus=1"

(the README's command), on 10 simulated nodes, through Flower (a private simulation SuperLink, ``flwr run``).
The one other key set is ``min-nodes=10`` (the default is 2), so that every round waits for all ten nodes and
no round starts with fewer clients than the user's run would have.  Seed 0 is the user's default; seeds 1 and 2
draw other partitions (the same seed gives every method the same partition: the report pairs runs on it).

One raw record per run goes to ``benchmarks/raw/defaults/`` (a method that refuses the default data at start-up
is a record with its error, and a row that shows it).  ``benchmarks/reporting/defaults.py`` renders the table
(personalized and global accuracy with the seed spread, paired differences to Local and to FedAvg, wins,
seconds per run, and a flag where a method is more than 5 points below Local or more than 2 points below the
better of Local and FedAvg) and the learning curves (``benchmarks/defaults_learning_curves.png``).

Reproduce:  benchmarks/run_committed.sh defaults   (every method x 3 seeds: 60 runs for 20 methods; a run of the
                                                     default 10 rounds takes about 20-60 s of ServerApp time on 2
                                                     cores plus Ray's start, Client2Vec's index phase more: about
                                                     an hour in all on an idle machine)
            python -m benchmarks.report                 (RESULTS.md and benchmarks/defaults_learning_curves.png)
            python -m benchmarks.defaults --methods local,fedavg --seeds 0 --rounds 3 --raw-dir /tmp/raw  (quick)
"""

from __future__ import annotations

from benchmarks.reporting import print_section
from benchmarks.running import parser, product, run_grid, split
from task.methods import METHODS

GRID = "defaults"
CLIENTS = 10  # the README's num-supernodes


def cells(methods: list[str] | None, seeds: list[int], rounds: int | None) -> list[tuple[dict, dict]]:
    """(cell, run config) per method (None: every method of the registry) and seed, seed-major: an interrupted
    grid has every method for the first seeds.  The run config sets ``method`` and ``seed`` only (and
    ``num-server-rounds`` when ``rounds`` is given, for quick looks)."""
    methods = list(METHODS) if methods is None else methods
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {', '.join(unknown)}; the registry has: {', '.join(METHODS)}")
    base = {} if rounds is None else {"num-server-rounds": rounds}
    grid = product({"method": {m: {"method": m} for m in methods}}, seeds, base)
    return sorted(grid, key=lambda c: c[0]["seed"])


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--methods", help="comma-separated (default: every method of the registry)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, help="override num-server-rounds (quick looks only; default: the app's)")
    args = ap.parse_args()
    grid = cells(split(args.methods) if args.methods else None, [int(s) for s in split(args.seeds)], args.rounds)
    run_grid(GRID, grid, CLIENTS, args.raw_dir)
    print_section(GRID, args.raw_dir)


if __name__ == "__main__":
    main()
