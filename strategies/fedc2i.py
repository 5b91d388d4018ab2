"""FedC2I strategy (spec fedc2i §2.3-§2.5, §7): the server stores every client's latest model and sends each
client the models it needs; it never averages.

Each train message carries ``peers``: for every parameter name one array stacking the k models
(leading dimension k), the receiver's own model first, and the peers' node ids in the config.  With
``c2i-peers = 0`` (default) k = M, all known clients, as in the paper; with ``c2i-peers = k`` each client
gets itself plus k - 1 peers sampled per round (seeded), so its download is O(k) models, not O(M).
Nodes that have not replied yet are not offered as peers (in round 1 every client starts from the common
initial model).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from strategies.base import ClientUpdate, PersonalizedStrategy
from task.params import to_record

VARIANTS = ("full", "lambda-only", "Lambda-only", "Lambda-local")


class FedC2IStrategy(PersonalizedStrategy):
    name = "fedc2i"
    has_global_model = False

    def __init__(self, settings, initial_state, body, head):
        super().__init__(settings, initial_state, body, head)
        self.initial = {k: np.array(v) for k, v in initial_state.items()}
        self.store: dict[int, dict[str, np.ndarray]] = {}
        peers = settings.get("c2i-peers", 0)
        if isinstance(peers, bool) or int(peers) != peers or int(peers) < 0 or int(peers) == 1:
            raise ValueError(f"run-config key 'c2i-peers' must be 0 (all clients) or an integer >= 2, got {peers!r}")
        self.num_peers = int(peers)
        variant = str(settings.get("c2i-variant", "full"))
        if variant not in VARIANTS:
            raise ValueError(f"run-config key 'c2i-variant' must be one of {list(VARIANTS)}, got {variant!r}")
        gamma = float(settings.get("gamma", 5.0))
        if gamma < 0:
            raise ValueError(f"run-config key 'gamma' must be >= 0, got {gamma}")
        self.influence: dict[int, dict[int, dict[int, float]]] = {}  # round -> pid -> peer pid -> weight

    def shared_keys(self) -> list[str]:
        return list(self.all_keys)

    def peers_for(self, node_id: int, server_round: int) -> list[int]:
        others = sorted(n for n in self.store if n != node_id)
        if self.num_peers and len(others) > self.num_peers - 1:
            rng = random.Random(hash((self.settings.seed, server_round, node_id)) & 0xFFFFFFFF)
            others = sorted(rng.sample(others, self.num_peers - 1))
        return [node_id, *others]

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        peers = self.peers_for(node_id, server_round)
        models = [self.store.get(n, self.initial) for n in peers]
        stacked = {k: np.stack([m[k] for m in models]) for k in self.all_keys}
        return RecordDict({"peers": to_record(stacked),
                           "peer-nodes": ConfigRecord({"node-ids": [int(n) for n in peers]})})

    def evaluate_payload(self, node_id: int, server_round: int) -> RecordDict:
        return RecordDict({"arrays": to_record(self.store.get(node_id, self.initial))})

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Any]:
        rows: dict[int, dict[int, float]] = {}
        for u in updates:
            self.store[u.node_id] = {k: np.array(v) for k, v in u.arrays.items()}
            weights, nodes = u.metrics.get("influence"), u.metrics.get("influence-nodes")
            if isinstance(weights, list) and isinstance(nodes, list) and len(weights) == len(nodes):
                rows[u.partition_id] = {int(n): float(w) for n, w in zip(nodes, weights)}
        # node ids -> partition ids for the artefacts
        named = {pid: {self.node_partition.get(n, n): w for n, w in row.items()} for pid, row in rows.items()}
        self.influence[server_round] = named
        self_weights = [row.get(pid, np.nan) for pid, row in named.items()]
        return {"fedc2i": {"self-influence-mean": float(np.nanmean(self_weights)) if self_weights else None,
                           "peers-per-client": float(np.mean([len(r) for r in named.values()])) if named else 0.0}}

    def write_artifacts(self, folder: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        (folder / "fedc2i_influence.json").write_text(json.dumps(
            {str(r): {str(p): {str(q): w for q, w in row.items()} for p, row in rows.items()}
             for r, rows in self.influence.items()}, indent=1))
        rounds = [r for r in sorted(self.influence) if self.influence[r]]
        if not rounds:
            return
        chosen = sorted({rounds[0], rounds[len(rounds) // 2], rounds[-1]})
        clients = sorted({p for r in rounds for p in self.influence[r]})
        fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 3.8), squeeze=False)
        for ax, r in zip(axes[0], chosen):
            mat = np.full((len(clients), len(clients)), np.nan)
            for i, p in enumerate(clients):
                for j, q in enumerate(clients):
                    mat[i, j] = self.influence[r].get(p, {}).get(q, np.nan)
            im = ax.imshow(mat, vmin=0, vmax=1, cmap="magma")
            ax.set_title(f"influence vector, round {r}")
            ax.set_xlabel("peer client i")
            ax.set_ylabel("client m")
            if len(clients) <= 20:
                ax.set_xticks(range(len(clients)), clients)
                ax.set_yticks(range(len(clients)), clients)
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        fig.savefig(folder / "fedc2i_influence.png", dpi=100)
        plt.close(fig)
