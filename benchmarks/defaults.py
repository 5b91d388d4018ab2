"""Every method at the defaults a new user gets: does each one train a useful model out of the box?

Each value of the run-config key ``method`` (read from the method registry, ``task.methods.METHODS``, so a method
added there is run too) is run with nothing but ``method`` and ``seed`` set, exactly as

    flwr run . --run-config "method='X' seed=S" --federation-config "num-supernodes=10 client-resources-num-cpus=1"

(the README's command), on 10 simulated nodes, through Flower: on the in-process engine (``server_app/engine.py``,
``--engine flwr-run`` for a private SuperLink and ``flwr run``), which tests/engine/test_equality.py holds to it.
The one other key set is ``min-nodes=10`` (the default is 2), so that every round waits for all ten nodes and
no round starts with fewer clients than the user's run would have.  Seed 0 is the user's default; seeds 1 and 2
draw other partitions (the same seed gives every method the same partition: the report pairs runs on it).

One raw record per run goes to ``benchmarks/raw/defaults/`` (a method that refuses the default data at start-up
is a record with its error, and a row that shows it).  ``benchmarks/reporting/defaults.py`` renders the table
(personalized and global accuracy with the seed spread, paired differences to Local and to FedAvg, wins,
seconds per run, and a flag where a method is more than 5 points below Local or more than 2 points below the
better of Local and FedAvg) and the learning curves (``benchmarks/defaults_learning_curves.png``).

Reproduce:  benchmarks/run_committed.sh defaults   (every method x 3 seeds: 60 runs for 20 methods; on the engine
                                                     a run of the default 10 rounds takes 5-20 s on 2 cores: about
                                                     5 minutes in all with two workers on an idle machine)
            python -m benchmarks.report                 (RESULTS.md and benchmarks/defaults_learning_curves.png)
            python -m benchmarks.defaults --methods local,fedavg --seeds 0 --rounds 3 --raw-dir /tmp/raw  (quick)
"""

from __future__ import annotations

import argparse

from benchmarks.reporting import print_section
from benchmarks.running import Declared
from task.methods import METHODS

#: every method of the registry with nothing but ``method`` and ``seed`` set, on the README's 10 nodes
SPEC = Declared("defaults", {"method": {m: {"method": m} for m in METHODS}}, defaults={"clients": 10, "rounds": None})


def cells(args: argparse.Namespace) -> list[tuple[dict, dict]]:
    """The declared cells seed-major: an interrupted grid has every method for the first seeds."""
    return sorted(SPEC.cells(args), key=lambda c: c[0]["seed"])


def main() -> None:
    args = SPEC.parse(SPEC.parser(__doc__))
    SPEC.run(args, cells(args))
    print_section(SPEC.grid, args.raw_dir)


if __name__ == "__main__":
    main()
