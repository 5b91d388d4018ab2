"""FedC2I strategy (fedc2i.md §2.3-§2.5, §7): the server stores every client's latest model and sends each
client the models it needs; it never averages.

Each train message carries ``peers``: for every parameter name one array stacking the k models
(leading dimension k), the receiver's own model first, and the other k - 1 clients' ids and training-set
sizes in the config (``peer-clients``).  The reply's ``influence`` vector follows the same order.  With
``c2i-peers = 0`` (default) k = M, all known clients, as in the paper; with ``c2i-peers = k`` each client
gets itself plus k - 1 peers sampled per round (seeded), so its download is O(k) models, not O(M).
Clients that have not replied yet are not offered as peers (in round 1 every client starts from the common
initial model).  Everything is keyed by client id (partition id), so a seed gives the same peers in every run.

Under ``dp-mode='local'`` each reply's model is the client's local release (clipped and noised on the client,
without integer buffers, which keep the initial model's values here); the server forwards peers' ids without their
training-set sizes, and accounts every client's epsilon (docs/privacy.md).

See docs/methods/fedc2i.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from strategies.api import (
    PER_CLIENT,
    PER_PEER,
    Dim,
    Disclosure,
    Numbers,
    Part,
    PersonalizedStrategy,
    Reply,
    ReplySpec,
    lengths_on,
)
from task.methods.fedc2i import FedC2IOptions
from task.params import stacked_record, to_record


class FedC2IStrategy(PersonalizedStrategy):
    options: FedC2IOptions  # the run-config keys of this method, typed

    has_global_model = False

    def __init__(self, settings, initial_state, model_info):
        super().__init__(settings, initial_state, model_info)
        self.store: dict[int, dict[str, np.ndarray]] = {}  # client id -> its latest model
        self.sizes: dict[int, int] = {}  # client id -> its number of training examples
        self.num_peers = self.options.peers
        self.sent_peers: dict[int, list[int]] = {}  # node id -> the other clients it was sent (this round only)
        self.influence: dict[int, dict[int, dict[int, float]]] = {}  # round -> client -> peer client -> weight
        self.releases = 0  # the valid train replies of this round (local DP: the releases the server received)

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        """Under local DP, every client's latest release (what the server forwards to its peers: ``client-<id>``);
        otherwise none (the clients' own models are theirs, not the server's to publish)."""
        if self.settings.dp_mode != "local":
            return {}
        return {f"client-{c}": model for c, model in sorted(self.store.items())}

    def state(self) -> dict[str, Any]:
        return {"store": self.store, "sizes": self.sizes, "influence": self.influence}

    def restore(self, state) -> None:
        self.store, self.sizes, self.influence = state["store"], state["sizes"], state["influence"]

    def peers_for(self, node_id: int, server_round: int) -> list[int]:
        """The other clients whose models ``node_id`` receives: every client with a stored model, or ``c2i-peers``
        - 1 of them drawn with a generator seeded by (seed, round, client id)."""
        me = self.client(node_id)
        others = sorted(c for c in self.store if c != me)
        if self.num_peers and len(others) > self.num_peers - 1:
            seed = (self.settings.seed * 1_000_003 + server_round) * 1_000_033 + (me if me is not None else -1)
            others = sorted(random.Random(seed).sample(others, self.num_peers - 1))
        return others

    def own_model(self, node_id: int) -> dict[str, np.ndarray]:
        me = self.client(node_id)
        return self.store.get(me, self.initial_state) if me is not None else self.initial_state

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        """Train: ``peers``, the client's own latest model stacked with its peers' (their ids and sizes in
        ``peer-clients``); evaluate: ``arrays``, the client's own latest model."""
        if phase == "evaluate":
            return RecordDict({"arrays": to_record(self.own_model(node_id))})
        peers = self.trusted(self.client(node_id), self.own_model(node_id), self.peers_for(node_id, server_round))
        self.sent_peers[node_id] = peers
        return self._peers_payload(self.own_model(node_id), peers)

    def trusted(self, me: int | None, own: dict[str, np.ndarray], peers: list[int]) -> list[int]:
        """The peers a client mixes: every one, or under ``aggregator='multi-krum'`` those Krum trusts among its own
        model and theirs (its own always kept; docs/robustness.md)."""
        models = [own, *(self.store[c] for c in peers)]
        who = "a newcomer" if me is None else str(me)
        kept = self.robust.choose_peers(models, [-1 if me is None else me, *peers], f"peers of {who}")
        return list(kept[1:])

    def newcomer_payloads(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, RecordDict]:
        """What a client gets before its first training: the common initial model (its own) stacked with the stored
        models it would be sent, so the newcomer mixes its personalized model by their influence on its data."""
        return {
            n: self._peers_payload(
                self.initial_state, self.trusted(None, self.initial_state, self.peers_for(n, server_round))
            )
            for n in nodes
        }

    def newcomer_receives(self) -> Mapping[str, Part]:
        return self._peers_part()

    def _peers_payload(self, own: dict[str, np.ndarray], peers: list[int]) -> RecordDict:
        models = [own, *(self.store[c] for c in peers)]
        payload = RecordDict({"peers": stacked_record(models, self.model_info.keys)})
        if peers:  # the other clients' ids and training-set sizes (not under local DP), in the order of their models
            about: dict[str, Any] = {"client-ids": [int(c) for c in peers]}
            if self.settings.dp_mode != "local":
                about["num-examples"] = [int(self.sizes[c]) for c in peers]
            payload["peer-clients"] = ConfigRecord(about)
        return payload

    def disclosure(self) -> dict[str, Disclosure]:
        """Out: the whole trained model and the influence vector over the models it was sent.  In (train): its
        own latest model stacked with the latest whole model of every other client (``c2i-peers`` bounds how
        many), their client ids and (not under local DP) training-set sizes; (evaluate) its own latest model only."""
        peers = self._peers_part()
        own = {"config": self.config_part(), "arrays": self.model_part("its own latest model", from_peers=False)}
        what = {"arrays": "its whole trained model"}
        count = Dim(1, self.num_peers) if self.num_peers else PER_CLIENT
        sends = lengths_on(self.sends("train", what), "metrics", {"influence": count})  # one per model it was sent
        out = super().disclosure()
        out["train"] = Disclosure(sends, peers, "its model, and which peers' data resemble its own")
        out["evaluate"] = Disclosure(self.sends("evaluate"), own, out["evaluate"].reveals)
        return out

    def _peers_part(self) -> dict[str, Part]:
        """What a message with ``peers`` brings: its own latest model stacked with peers' and their ids (and sizes)."""
        count = Dim(1, self.num_peers) if self.num_peers else PER_CLIENT
        others = Dim(1, self.num_peers - 1) if self.num_peers else PER_PEER  # peer-clients only when there are peers
        sizes = self.settings.dp_mode != "local"  # under local DP peers get each other's ids only
        about = {"client-ids": True, "num-examples": True} if sizes else {"client-ids": True}
        return {
            "config": self.config_part(),
            "peers": self.model_part("its own latest model, then each peer's latest whole model", count=count),
            "peer-clients": Part(
                "the peers' client ids" + (" and training-set sizes" if sizes else " (no sizes under local DP)"),
                entries=about,
                required=False,
                from_peers=True,
                lengths=dict.fromkeys(about, others),
            ),
        }

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        spec = super().reply_spec(phase, node_id)
        if phase == "train":  # the influence vector over what this node was sent: itself first, then its peers
            spec = spec.with_metrics(
                influence=Numbers(float, 0.0, 1.0, length=1 + len(self.sent_peers.get(node_id, [])), total=1.0)
            )
        return spec

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        rows: dict[int, dict[int, float]] = {}
        for u in updates:
            peers = self.sent_peers.get(u.node_id, [])
            rows[u.client] = dict(zip([u.client, *peers], u.metrics["influence"], strict=True))
        # arrays a reply leaves out under DP (integer buffers) keep the initial model's values; norm-bound keeps each
        # new model near the client's previous one
        models = {
            u.client: {k: np.array(u.arrays.get(k, self.initial_state[k])) for k in self.initial_state} for u in updates
        }
        previous = {c: self.store.get(c, self.initial_state) for c in models}
        self.store.update(self.robust.bound_models(models, previous))
        for u in updates:
            self.sizes[u.client] = u.num_examples
        self.influence[server_round] = rows
        self_weights = [row[c] for c, row in rows.items()]
        self.releases = len(updates)
        return {
            "fedc2i": {
                "self-influence-mean": float(np.mean(self_weights)) if self_weights else None,
                "peers-per-client": float(np.mean([len(r) for r in rows.values()])) if rows else 0.0,
            },
        }

    def on_round_end(self, server_round: int) -> None:
        """Under local DP: every client's epsilon after this round, also when no reply of the round was valid
        (the clients released all the same)."""
        if self.settings.dp_mode == "local":
            self.history[-1].extra["dp"] = self.privacy.account_local(self.releases)
        self.releases = 0
