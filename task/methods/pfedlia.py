"""pFedLIA's, the Oracle's and CFL's options (docs/methods/pfedlia.md)."""

from __future__ import annotations

from dataclasses import dataclass

from task.options import OptionSet, option


@dataclass(frozen=True)
class PFedLIAOptions(OptionSet):
    mode: str = option(
        "lia-mode",
        "central",
        "central: OPTICS on the server; p2p: every client's own 2-means set",
        choices=("central", "p2p"),
    )
    warmup_rounds: int = option("warmup-rounds", 5, "FedAvg rounds before the clustering round", minimum=1)
    lazy_epochs: int = option("lazy-epochs", 20, "epochs of lazy training from the warm-up model", minimum=1)
    optics_min_samples: int = option(
        "optics-min-samples", 5, "OPTICS min_samples (at most the smallest cluster)", minimum=2
    )
    noise: str = option(
        "lia-noise",
        "nearest",
        "OPTICS noise points: nearest cluster or a cluster of their own",
        choices=("nearest", "singleton"),
    )
    score: str = option(
        "lia-score", "raw", "clustering features: raw influence rows or their signs", choices=("raw", "sign")
    )
    row_standardize: bool = option("lia-row-standardize", False, "standardise each influence row before OPTICS")
    reduction: str = option(
        "lia-reduction", "sum", "influence over the validation split: sum (paper) or mean", choices=("sum", "mean")
    )
    p2p_require_positive: bool = option("p2p-require-positive", False, "p2p: keep only peers with positive influence")

    def conflicts(self, settings) -> list[str]:
        if self.warmup_rounds >= settings.num_rounds:
            return [
                (
                    f"warmup-rounds={self.warmup_rounds} is not shorter than num-server-rounds={settings.num_rounds}: "
                    "the clustering round (round warmup-rounds + 1) would never come and the run would be plain "
                    "FedAvg; use warmup-rounds < num-server-rounds, "
                    f"e.g. warmup-rounds={max(1, settings.num_rounds // 2)}"
                )
            ]
        return []


def oracle_conflicts(settings) -> list[str]:
    """The Oracle's registry entry's ``conflicts`` (its keys are pFedLIA's): it needs data whose clients belong to
    planted groups."""
    if settings.data.partition.startswith("planted-clusters"):
        return []
    return [
        (
            "method 'oracle' clusters the clients by their planted groups, which only partition "
            f"'planted-clusters' or 'planted-clusters-noisy' has (got partition={settings.data.partition!r}); "
            "set --run-config \"method='oracle' partition='planted-clusters'\" (num-clusters sets the groups), "
            "or use method 'pfedlia' to find clusters in any data"
        )
    ]


@dataclass(frozen=True)
class CFLOptions(OptionSet):
    eps1: float = option(
        "cfl-eps1", 0.4, "CFL: a cluster may split when its mean update norm is below eps1", minimum=0.0
    )
    eps2: float = option("cfl-eps2", 1.6, "CFL: ... and some member's update norm is above eps2", minimum=0.0)
    min_rounds: int = option("cfl-min-rounds", 5, "CFL: first round in which a cluster may split", minimum=1)

    def conflicts(self, settings) -> list[str]:
        if self.min_rounds > settings.num_rounds:
            return [
                (
                    f"cfl-min-rounds={self.min_rounds} is after the last round "
                    f"(num-server-rounds={settings.num_rounds}): no cluster could ever split; "
                    "use cfl-min-rounds <= num-server-rounds"
                )
            ]
        return []
