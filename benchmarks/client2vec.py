"""Client2Vec's case studies on top of FedAvg (client2vec.md §8), paired over seeds.

Digits with 4 feature-shift domains (original, inverted, rotated, noisy; domain = client id mod 4) crossed
with Dirichlet label skew over 40 clients, 4 clients per round (10 %), 5 local epochs, SGD lr 0.05 batch
32, weight decay 5e-5, MLP (64-d features); the synthetic CLIP encoder (client2vec.md §8: random CLIP text towers
blur the label half), DSA-IGN in Global mode (FF 256, dropout 0, Adam 1e-3, ``--ign-epochs``);
tau 0.5, gamma 0.5, lambda1 1, w 1.  Arms: FedAvg, +i (sampling), +ii (aggregation), +iii (local loss),
+i+ii+iii; and FedBN (local normalisation layers, docs/methods/fedbn.md), which needs a model with normalisation
layers: FedBN-cnn and its reference FedAvg-cnn run the ``cnn`` instead of the MLP.  Every arm of a seed should
share data, split, initial model and (for the index arms) the index; arms without (i) should also draw the same
clients in every round.

Accuracy: the global model on each client's own test split (FedBN, which has none: each client's personalized
model), unweighted mean over clients, best round and last round.  ``python -m benchmarks.report`` prints the paired
delta (arm minus FedAvg on the same seed, FedBN-cnn minus FedAvg-cnn: per seed, mean and std, wins) only when
the records' fingerprints show the pairing holds, and the index phase's seconds next to one training round, and
the index's domain block gap.  One raw record per run goes to
``benchmarks/raw/client2vec/``.

Reproduce: python -m benchmarks.client2vec                         (default grid: 35 runs)
           python -m benchmarks.client2vec --arms FedAvg-cnn,FedBN-cnn   (only the FedBN arms: 10 runs)
           python -m benchmarks.client2vec --seeds 0 --rounds 10 --raw-dir /tmp/raw   (quick look)
"""

from __future__ import annotations

from typing import Any

from benchmarks.reporting import print_section
from benchmarks.running import OUT, Declared

ARMS: dict[str, dict[str, Any]] = {
    "FedAvg": {"c2v-sampling": False, "c2v-aggregation": False, "c2v-local": False},
    "+i": {"c2v-sampling": True, "c2v-aggregation": False, "c2v-local": False},
    "+ii": {"c2v-sampling": False, "c2v-aggregation": True, "c2v-local": False},
    "+iii": {"c2v-sampling": False, "c2v-aggregation": False, "c2v-local": True},
    "+i+ii+iii": {"c2v-sampling": True, "c2v-aggregation": True, "c2v-local": True},
    # FedBN, the feature-shift baseline: it needs normalisation layers, which the MLP lacks, so it runs on the cnn
    # next to plain FedAvg on the same cnn (its reference); neither builds the index
    "FedAvg-cnn": {
        "method": "fedavg",
        "model": "cnn",
        "c2v-sampling": False,
        "c2v-aggregation": False,
        "c2v-local": False,
    },
    "FedBN-cnn": {
        "method": "fedbn",
        "model": "cnn",
        "c2v-sampling": False,
        "c2v-aggregation": False,
        "c2v-local": False,
    },
}
SETTINGS = {
    "4dom-a0.1": {"feature-shift": 4, "alpha": 0.1},
    "4dom-a100": {"feature-shift": 4, "alpha": 100.0},
    "1dom-a0.1": {"feature-shift": 0, "alpha": 0.1},
}


SPEC = Declared(
    "client2vec",
    axes={"setting": SETTINGS, "arm": ARMS},
    defaults={"clients": 40, "seeds": "0,1,2,3,4", "rounds": 50, "settings": "4dom-a0.1"},
    base={
        "method": "client2vec",
        "dataset": "digits",
        "partition": "dirichlet",
        "model": "mlp",
        "fraction-train": 0.1,
        "local-epochs": 5,
        "lr": 0.05,
        "momentum": 0.0,
        "batch-size": 32,
        "weight-decay": 5e-5,
        "c2v-encoder": "synthetic",
        "c2v-tau": 0.5,
        "c2v-gamma": 0.5,
        "c2v-lambda1": 1.0,
        "c2v-local-weight": 1.0,
        "c2v-cache-dir": str(OUT / "c2v-cache"),
    },
)


def main() -> None:
    ap = SPEC.parser(__doc__)
    ap.add_argument("--ign-epochs", type=int, default=5)
    args = SPEC.parse(ap)
    # the seed loop sits outside the arms (setting, seed, arm), so the arms of a seed run back to back
    cells = [
        ({"setting": c["setting"], "seed": c["seed"], "arm": c["arm"]}, cfg)
        for c, cfg in SPEC.cells(args, **{"c2v-ign-epochs": args.ign_epochs})
    ]
    cells.sort(key=lambda cc: (list(SETTINGS).index(cc[0]["setting"]), cc[0]["seed"]))
    SPEC.run(args, cells)
    print_section("client2vec", args.raw_dir)


if __name__ == "__main__":
    main()
