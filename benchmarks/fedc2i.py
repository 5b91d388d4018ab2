"""FedC2I on feature-shift digits (5 domains, one client each; fedc2i.md §8 "Digit-5-lite" stand-in).

Domains: original, inverted, rotated, noisy, shifted (task.data.DOMAINS), IID labels, the c2i-small CNN,
Adam lr 1e-3, 2 local epochs, batch 32, 20 rounds.  FedBN needs normalisation layers, which c2i-small lacks: it
runs on the ``cnn`` (BatchNorm after each convolution) next to FedAvg on the same ``cnn`` (``fedavg-cnn``).
Same protocol for every method (fedc2i.md §6.12/§8):
``personal-acc`` is each client's own model on its own test split; for FedAvg/FedProx that is the global
model, so ``trained-acc`` (the model right after local training, "FedAvg + fine-tuning") is reported too —
about half of a personalized method's edge over FedAvg comes from that protocol difference alone.
One raw record per run goes to ``benchmarks/raw/fedc2i/``; the table is ``python -m benchmarks.report``'s.

Reproduce: python -m benchmarks.fedc2i              (30 runs, about 20-40 minutes on 2 cores)
           python -m benchmarks.fedc2i --methods fedbn,fedavg-cnn   (only the FedBN rows: 6 runs)
"""

from __future__ import annotations

from typing import Any

from benchmarks.reporting import print_section
from benchmarks.running import Declared

METHODS: dict[str, dict[str, Any]] = {
    "local": {"method": "local"},
    "fedavg": {"method": "fedavg"},
    "fedprox": {"method": "fedprox", "proximal-mu": 0.01},
    "fedrep": {"method": "fedrep"},
    "fedrod": {"method": "fedrod"},
    "fedc2i": {"method": "fedc2i", "gamma": 5.0},
    # the paper's ablation names label the rows; the run config uses today's spellings of c2i-variant
    "lambda-only": {"method": "fedc2i", "gamma": 5.0, "c2i-variant": "client-level"},
    "Lambda-only": {"method": "fedc2i", "gamma": 5.0, "c2i-variant": "class-level-averaged-extractor"},
    # FedBN keeps the normalisation layers local, and c2i-small has none (FedBN refuses it): FedBN runs on the cnn
    # (BatchNorm after each convolution), next to FedAvg on the same cnn as its reference
    "fedbn": {"method": "fedbn", "model": "cnn"},
    "fedavg-cnn": {"method": "fedavg", "model": "cnn"},
}


SPEC = Declared(
    "fedc2i",
    defaults={"clients": 5},
    axes={"method": METHODS},
    base={
        "partition": "iid",
        "feature-shift": 5,
        "model": "c2i-small",
        "optimizer": "adam",
        "lr": 0.001,
        "local-epochs": 2,
        "batch-size": 32,
    },
)


def main() -> None:
    args = SPEC.parse(SPEC.parser(__doc__))
    SPEC.run(args)
    print_section("fedc2i", args.raw_dir)


if __name__ == "__main__":
    main()
