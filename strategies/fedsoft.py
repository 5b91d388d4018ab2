"""FedSoft (Ruan & Joe-Wong), a PI-FL baseline (pifl.md §5): soft clustering with S cluster centres.

Every ``fedsoft-estimate-every`` rounds each client estimates its importance weights u_ks: the share of its
training points for which centre s has the lowest loss, smoothed by sigma = 1e-4 (``query.fedsoft_u``).
For every centre s the server draws ``fedsoft-clients-per-cluster`` clients with probability proportional
to u_ks * n_k.  A drawn client solves min f_k(w) + lambda/2 sum_s u_ks ||w - c_s||^2 (``fedsoft-lambda``)
from its own model, and centre s becomes the plain mean of the models of the clients drawn for it (the draw
already weights them by u_ks n_k).  A client's personalized model is its own model (the u-weighted mix of centres
before it first trains).

See docs/methods/pifl.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from strategies.api import Disclosure, Numbers, Part, PersonalizedStrategy, Reply, ReplySpec
from strategies.tier_tables import TierTables, distinct_starting_models
from task.methods.pifl import FedSoftOptions
from task.params import stacked_record


class FedSoftStrategy(PersonalizedStrategy):
    options: FedSoftOptions  # the run-config keys of this method, typed

    has_global_model = False
    evaluate_in_train = False  # only the clients drawn for a centre train; every client is evaluated

    def __init__(self, settings, initial_state, model_info):
        super().__init__(settings, initial_state, model_info)
        o = self.options
        self.k, self.per_cluster, self.every, self.lam = o.tiers, o.clients_per_cluster, o.estimate_every, o.lam
        self.models = distinct_starting_models(self.global_state, self.k, settings.seed)  # as IFCA
        self.np_rng = np.random.default_rng(settings.seed)
        self.u: dict[int, np.ndarray] = {}  # client id -> importance weights over the centres
        self.n: dict[int, int] = {}  # client id -> number of training examples
        self.selected: dict[int, list[int]] = {}
        self.u_log: dict[int, dict[int, list[float]]] = {}
        self.selection_log: dict[int, dict[int, list[int]]] = {}
        self.tier_tables = TierTables()

    def state(self) -> dict[str, Any]:
        """The centres, the draw generator, every client's importance weights and size, and the logs the
        artefacts show (the round's selection is drawn again every round)."""
        return {
            "models": self.models,
            "np-rng": self.np_rng,
            "u": self.u,
            "n": self.n,
            "u-log": self.u_log,
            "selection-log": self.selection_log,
            "tier-tables": self.tier_tables.by_round,
        }

    def restore(self, state) -> None:
        self.models, self.np_rng, self.u, self.n = state["models"], state["np-rng"], state["u"], state["n"]
        self.u_log, self.selection_log = state["u-log"], state["selection-log"]
        self.tier_tables.by_round = state["tier-tables"]

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        return {f"centre-{k}": m for k, m in enumerate(self.models)}

    def _stacked(self) -> RecordDict:
        return RecordDict({"tiers": stacked_record(self.models, self.model_info.keys)})

    def disclosure(self) -> dict[str, Disclosure]:
        """Every message brings every centre; ``query.fedsoft_u`` returns u, the share of the client's training
        points each centre fits best; train and evaluate messages also bring the client's own u back."""
        out = super().disclosure()
        centres = {
            "config": self.config_part(),
            "tiers": self.model_part("every centre: the mean of the models drawn for it", count=self.k),
        }
        receives = {
            **centres,
            "fedsoft": Part("its own importance weights u", entries={"u": True}, lengths={"u": self.k}),
        }
        what = {"arrays": "its trained model"}
        out["query.fedsoft_u"] = Disclosure(self.sends("fedsoft_u"), centres, "a soft cluster membership of its data")
        out["train"] = Disclosure(self.sends("train", what), receives, out["train"].reveals)
        out["evaluate"] = Disclosure(self.sends("evaluate"), receives, out["evaluate"].reveals)
        return out

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        spec = super().reply_spec(phase, node_id)
        if phase == "fedsoft_u":  # importance weights: a distribution over the centres
            return spec.with_metrics(**{"fedsoft-u": Numbers(float, 0.0, 1.0, length=self.k, total=1.0)})
        return spec

    def estimate(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        payload = self._stacked()
        for r in self.send_query(grid, server_round, "fedsoft_u", dict.fromkeys(nodes, payload)):
            self.u[r.client], self.n[r.client] = np.asarray(r.metrics["fedsoft-u"], float), r.num_examples
        self.u_log[server_round] = {c: self.u[c].round(4).tolist() for c in sorted(self.u)}

    def prepare_round(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        if (
            server_round == 1
            or (server_round - 1) % self.every == 0
            or any(self.client(n) not in self.u for n in nodes)
        ):
            self.estimate(grid, server_round, nodes)

    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        known = [c for c in map(self.client, self.by_client(nodes)) if c is not None and c in self.u]
        self.selected = {}
        for s in range(self.k):
            w = np.array([self.u[c][s] * self.n[c] for c in known])
            if not known or w.sum() <= 0:
                continue
            take = min(self.per_cluster, int((w > 0).sum()))
            self.selected[s] = sorted(
                int(known[i]) for i in self.np_rng.choice(len(known), take, replace=False, p=w / w.sum())
            )
        self.selection_log[server_round] = {s: list(v) for s, v in self.selected.items()}
        return self.by_client(self.node_of[c] for c in sorted({c for v in self.selected.values() for c in v}))

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        """Every centre, and this client's importance weights (uniform until it has sent its own)."""
        payload = self._stacked()
        client = self.client(node_id)
        u = self.u[client] if client is not None and client in self.u else np.full(self.k, 1.0 / self.k)
        payload["fedsoft"] = ConfigRecord({"u": [float(x) for x in u]})
        return payload

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        """Centre s becomes the plain mean of the models of the clients drawn for it (FedSoft's Algorithm 1, 1/K
        each): the draw is already proportional to u_ks n_k, so weighting by u_ks n_k again would count it twice."""
        by_client = {u.client: u for u in updates}
        for s, members in self.selected.items():
            group = [by_client[c] for c in members if c in by_client]
            if group:
                self.models[s] = self.robust.average_models(
                    [u.arrays for u in group], [1.0] * len(group), [u.client for u in group], group=f"centre {s}"
                )
        return {"fedsoft": {"selected": {s: len(v) for s, v in self.selected.items()}}}

    def on_round_end(self, server_round: int) -> None:
        self.tier_tables.record(self, server_round, self.models)

    def clustering_outcome(self) -> tuple[int, str] | None:
        """(centres that are some client's largest importance weight, what a single one meant) for the summary."""
        if not self.u:
            return None
        favoured = sorted({int(np.argmax(u)) for u in self.u.values()})
        return len(favoured), f"every client's importance weights favour centre {favoured[0]} (last estimate)"
