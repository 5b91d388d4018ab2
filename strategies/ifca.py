"""IFCA (Ghosh et al.), a PI-FL baseline (pifl.md §5): K cluster models; every client takes the one with the
lowest loss on its own data, trains it, and each cluster model is the FedAvg of its takers.

See docs/methods/pifl.md; its last section says where each section number cited here is explained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from flwr.app import RecordDict

from strategies.api import Disclosure, Number, PersonalizedStrategy, Reply, ReplySpec
from strategies.tier_tables import TierTables, distinct_starting_models
from task.methods.pifl import TierOptions
from task.params import stacked_record


class IFCAStrategy(PersonalizedStrategy):
    options: TierOptions  # the run-config keys of this method, typed

    has_global_model = False
    #: sent, not read: an evaluation names the cluster model that fits the client's validation split best
    unread_metrics: ClassVar[Mapping[str, tuple[str, ...]]] = {"evaluate": ("cluster",)}

    def __init__(self, settings, initial_state, model_info):
        super().__init__(settings, initial_state, model_info)
        self.k = self.options.tiers
        # IFCA needs distinct starting points: cluster j starts from the common model plus seeded noise
        self.models = distinct_starting_models(self.global_state, self.k, settings.seed)
        self.choices: dict[int, dict[int, int]] = {}
        self.tier_tables = TierTables()

    def state(self) -> dict[str, Any]:
        return {"models": self.models, "choices": self.choices, "tier-tables": self.tier_tables.by_round}

    def restore(self, state) -> None:
        self.models, self.choices, self.tier_tables.by_round = state["models"], state["choices"], state["tier-tables"]

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        return {f"cluster-{k}": m for k, m in enumerate(self.models)}

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        return RecordDict({"tiers": stacked_record(self.models, self.model_info.keys)})

    def disclosure(self) -> dict[str, Disclosure]:
        """Every message brings all K cluster models; a train reply says which one fits the client best."""
        out = super().disclosure()
        receives = {
            "config": self.config_part(),
            "tiers": self.model_part("every cluster model: the average of its members", count=self.k),
        }
        what = {"arrays": "its trained model (of the cluster it chose)"}
        out["train"] = Disclosure(self.sends("train", what), receives, "which group its data belongs to")
        out["evaluate"] = Disclosure(self.sends("evaluate"), receives, out["evaluate"].reveals)
        return out

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        spec = super().reply_spec(phase, node_id)
        return spec.with_metrics(cluster=Number(int, 0, self.k - 1)) if phase == "train" else spec

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        chosen = {u.client: int(u.metrics["cluster"]) for u in updates}
        for j in range(self.k):
            group = [u for u in updates if chosen[u.client] == j]
            if group:
                self.models[j] = self.robust.average_models(
                    [u.arrays for u in group],
                    [u.num_examples for u in group],
                    [u.client for u in group],
                    self.models[j],
                    f"cluster {j}",
                )
        self.choices[server_round] = chosen
        return {"ifca": {"cluster-sizes": [sum(1 for c in chosen.values() if c == j) for j in range(self.k)]}}

    def on_round_end(self, server_round: int) -> None:
        self.tier_tables.record(self, server_round, self.models)

    def clustering_outcome(self) -> tuple[int, str] | None:
        """(cluster models chosen in the last round, what a single one meant) for the run's summary."""
        if not self.choices:
            return None
        last = sorted(set(self.choices[max(self.choices)].values()))
        if all(set(chosen.values()) == {last[0]} for chosen in self.choices.values()):
            return len(last), f"the run was FedAvg (every client chose cluster model {last[0]} in every round)"
        return len(last), f"every client chose cluster model {last[0]} in the last round"
