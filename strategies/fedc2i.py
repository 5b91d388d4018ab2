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

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from strategies.base import PersonalizedStrategy, Reply
from strategies.disclosure import PER_CLIENT, Disclosure, Part
from strategies.plots import integer_ticks, pyplot
from strategies.privacy import account_local
from strategies.replies import Dim, Numbers, ReplySpec
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
        peers = self.peers_for(node_id, server_round)
        self.sent_peers[node_id] = peers
        models = [self.own_model(node_id), *(self.store[c] for c in peers)]
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
        count = Dim(1, self.num_peers) if self.num_peers else PER_CLIENT
        sizes = self.settings.dp_mode != "local"  # under local DP peers get each other's ids only
        peers = {
            "config": self.config_part(),
            "peers": self.model_part("its own latest model, then each peer's latest whole model", count=count),
            "peer-clients": Part(
                "the peers' client ids" + (" and training-set sizes" if sizes else " (no sizes under local DP)"),
                entries={"client-ids": True, "num-examples": True} if sizes else {"client-ids": True},
                required=False,
                from_peers=True,
            ),
        }
        own = {"config": self.config_part(), "arrays": self.model_part("its own latest model", from_peers=False)}
        what = {"arrays": "its whole trained model"}
        out = super().disclosure()
        out["train"] = Disclosure(self.sends("train", what), peers, "its model, and which peers' data resemble its own")
        out["evaluate"] = Disclosure(self.sends("evaluate"), own, out["evaluate"].reveals)
        return out

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
        for u in updates:  # arrays a reply leaves out under DP (integer buffers) keep the initial model's values
            self.store[u.client] = {k: np.array(u.arrays.get(k, self.initial_state[k])) for k in self.initial_state}
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
            self.history[-1].extra["dp"] = account_local(
                self.history, self.releases, self.settings, charged=self.dp.charged
            )
        self.releases = 0

    def write_artifacts(self, folder: Path) -> None:
        plt = pyplot()

        (folder / "fedc2i_influence.json").write_text(
            json.dumps(
                {
                    str(r): {str(p): {str(q): w for q, w in row.items()} for p, row in rows.items()}
                    for r, rows in self.influence.items()
                },
                indent=1,
            )
        )
        rounds = [r for r in sorted(self.influence) if self.influence[r]]
        if not rounds:
            return
        chosen = sorted({rounds[0], rounds[len(rounds) // 2], rounds[-1]})
        clients = sorted({p for r in rounds for p in self.influence[r]})
        fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 3.8), squeeze=False)
        for ax, r in zip(axes[0], chosen, strict=True):
            mat = np.full((len(clients), len(clients)), np.nan)
            for i, p in enumerate(clients):
                for j, q in enumerate(clients):
                    mat[i, j] = self.influence[r].get(p, {}).get(q, np.nan)
            im = ax.imshow(mat, vmin=0, vmax=1, cmap="magma")
            ax.set_title(f"influence vector, round {r}")
            ax.set_xlabel("peer client i")
            integer_ticks(ax, y=True)
            ax.set_ylabel("client m")
            if len(clients) <= 20:
                ax.set_xticks(range(len(clients)), clients)
                ax.set_yticks(range(len(clients)), clients)
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        fig.savefig(folder / "fedc2i_influence.png", dpi=100)
        plt.close(fig)
