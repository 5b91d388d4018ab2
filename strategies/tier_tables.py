"""Per-source accuracy of tier / cluster models (the tables of PI-FL's paper, pifl.md Tables 1-2).

Two-source partitions (digits label halves, SynthConcept's two concepts) have a source A and a source B.
The holdout of each source is every sample of that source that no client trains on (simulation only:
the server reads the embedded data set to evaluate, never to train).  Each tier model's accuracy on
the A and B holdouts shows whether the tiers specialise (PI-FL: tier 0 ~ A, tier 1 ~ B on 10:90).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from task.data import TwoSourcePartitioner, partitioner_for
from task.models import build_model
from task.params import load_record
from task.train import evaluate

log = logging.getLogger("flwr.pflower")


class SourceHoldouts:
    """The A / B holdouts of a two-source partition over ``num_partitions`` clients, or none."""

    def __init__(self, settings, num_partitions: int, max_per_source: int = 1000) -> None:
        self.sets: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if settings.data.partition != "two-source":
            return
        try:
            part, data = partitioner_for(settings.data, num_partitions)
        except (ValueError, OSError) as err:  # e.g. a deployment whose server has no copy of the data
            log.info("no per-source holdouts (%s); tier tables skipped", err)
            return
        if not isinstance(part, TwoSourcePartitioner):
            return
        used = np.concatenate([np.asarray(part.load_partition(i)["idx"], np.int64) for i in range(num_partitions)])
        rest = np.setdiff1d(np.arange(data.originals), used)  # originals: a copy of a trained sample is no holdout
        source = part.source_of_labels(data.y, settings.num_classes)
        rng = np.random.default_rng(54_321)
        for name, s in (("A", 0), ("B", 1)):
            idx = rest[source[rest] == s]
            idx = np.sort(rng.permutation(idx)[:max_per_source])
            if len(idx):
                self.sets[name] = torch.from_numpy(data.x[idx]), torch.from_numpy(data.y[idx])
        self.model = build_model(settings.model, settings.in_channels, settings.image_size, settings.num_classes)

    def table(self, models: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
        """[{source: accuracy}] per model; empty when there are no holdouts."""
        out: list[dict[str, Any]] = []
        if not self.sets:
            return out
        for state in models:
            load_record(self.model, state)
            out.append({name: float(evaluate(self.model, x, y)[1]) for name, (x, y) in self.sets.items()})
        return out


class TierTables:
    """The tier table of every round for a strategy with several models (holdouts built on first use)."""

    def __init__(self) -> None:
        self.by_round: dict[int, list[dict[str, float]]] = {}
        self._holdouts: SourceHoldouts | None = None

    def record(self, strategy, server_round: int, models: list[dict[str, np.ndarray]]) -> list[dict[str, float]]:
        """Table of ``models`` after ``server_round``, kept here and in the round's history (``tier-table``)."""
        # the holdouts are built from the settings on first use (a strategy's state() saves only by_round)
        if self._holdouts is None:
            known = strategy.client_of.values()
            self._holdouts = SourceHoldouts(
                strategy.settings, max(len(known), max(known, default=-1) + 1, strategy.settings.min_nodes)
            )
        table = self._holdouts.table(models)
        if table:
            self.by_round[server_round] = table
            strategy.history[-1].extra["tier-table"] = table
        return table


def distinct_starting_models(state: dict[str, np.ndarray], k: int, seed: int) -> list[dict[str, np.ndarray]]:
    """k copies of ``state``; copy j > 0 gets seeded noise (std 0.01) so cluster models can diverge (IFCA, FedSoft)."""
    rng = np.random.default_rng(seed + 1)
    return [
        {
            key: (v + (0.0 if j == 0 else 0.01) * rng.standard_normal(v.shape)).astype(v.dtype)
            if np.issubdtype(v.dtype, np.floating)
            else v
            for key, v in state.items()
        }
        for j in range(k)
    ]
