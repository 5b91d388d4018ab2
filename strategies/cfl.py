"""CFL baseline (Sattler et al.): FedAvg inside clusters that split in two when the cluster's mean update is
small but some member's update is still large (a pFedLIA baseline, pfedlia.md §5).

See docs/methods/pfedlia.md; its last section says where each section number cited here is explained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from strategies.api import PER_CLIENT, Part, PersonalizedStrategy, Reply
from strategies.cfl_math import cosine_similarity_matrix, optimal_bipartition, should_split
from task.methods.pfedlia import CFLOptions
from task.params import stacked_record, to_record


class CFLStrategy(PersonalizedStrategy):
    options: CFLOptions  # the run-config keys of this method, typed

    has_global_model = False

    def __init__(self, settings, initial_state, model_info):
        super().__init__(settings, initial_state, model_info)
        self.eps1, self.eps2, self.min_rounds = self.options.eps1, self.options.eps2, self.options.min_rounds
        self.cluster_of: dict[int, int] = {}  # client id -> cluster
        self.models: dict[int, dict[str, np.ndarray]] = {0: dict(self.global_state)}
        self.splits: list[dict[str, Any]] = []

    def state(self) -> dict[str, Any]:
        return {"cluster-of": self.cluster_of, "models": self.models, "splits": self.splits}

    def restore(self, state) -> None:
        self.cluster_of, self.models, self.splits = state["cluster-of"], state["models"], state["splits"]

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        return {f"cluster-{k}": m for k, m in sorted(self.models.items())}

    def _model(self, node_id: int) -> dict[str, np.ndarray]:
        client = self.client(node_id)
        return self.models[self.cluster_of.get(client, 0) if client is not None else 0]

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        return RecordDict({"arrays": to_record(self._model(node_id))})

    def newcomer_payloads(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, RecordDict]:
        """A newcomer is in no cluster: it gets every cluster model (``tiers``) and takes the one with the lowest loss
        on its own data (its updates, which CFL splits clusters by, it has none of)."""
        stacked = stacked_record([m for _, m in sorted(self.models.items())], self.model_info.keys)
        return {n: RecordDict({"tiers": stacked}) for n in nodes}

    def newcomer_receives(self) -> Mapping[str, Part]:
        return {"config": self.config_part(), "tiers": self.model_part("every cluster model", count=PER_CLIENT)}

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        norms = {}
        for cid in sorted({self.cluster_of.setdefault(u.client, 0) for u in updates}):
            members = [u for u in updates if self.cluster_of[u.client] == cid]
            base = self.models[cid]
            keys = [k for k in base if np.issubdtype(base[k].dtype, np.floating)]
            deltas = np.stack([np.concatenate([(u.arrays[k] - base[k]).ravel() for k in keys]) for u in members])
            split, mean_norm, max_norm = should_split(deltas, self.eps1, self.eps2)
            norms[cid] = {"mean-update-norm": mean_norm, "max-update-norm": max_norm}
            groups = [members]
            if split and server_round >= self.min_rounds:
                a, b = optimal_bipartition(cosine_similarity_matrix(deltas))
                groups = [[members[i] for i in a], [members[i] for i in b]]
                new = max(self.models) + 1
                for u in groups[1]:
                    self.cluster_of[u.client] = new
                self.splits.append(
                    {
                        "round": server_round,
                        "cluster": cid,
                        "new-cluster": new,
                        "sizes": [len(groups[0]), len(groups[1])],
                    }
                )
            for group in groups:
                target = self.cluster_of[group[0].client]
                self.models[target] = self.robust.average_models(
                    [u.arrays for u in group],
                    [u.num_examples for u in group],
                    [u.client for u in group],
                    base,
                    f"cluster {target}",
                )
        return {"cfl": {"clusters": len(set(self.cluster_of.values())), "norms": norms}}

    def clustering_outcome(self) -> tuple[int, str]:
        """(clusters at the end, what a single cluster meant) for the run's summary."""
        return len(self.models), (
            "the run was FedAvg (no cluster split: no round from cfl-min-rounds on had a mean update norm below "
            "cfl-eps1 and a client's above cfl-eps2; rounds.json lists the norms)"
        )
