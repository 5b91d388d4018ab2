"""pFedLIA strategy (spec pfedlia §2.4-§2.8): FedAvg warm-up, one clustering round, then FedAvg per cluster.

Rounds 1..``warmup-rounds`` are FedAvg.  At the start of the next round the server runs the clustering
phase through the Grid: ``query.lazy`` (every client trains a copy of the warm-up model theta_0 for
``lazy-epochs`` epochs and returns it), then ``query.lia`` (every client receives all lazy models and
theta_0 and returns its lazy-influence row, plus - peer-to-peer - its beneficial peers).  Central mode
clusters the matrix with OPTICS (noise reassigned); peer-to-peer mode uses the clients' own 2-means sets
(the server only relays); ``oracle`` uses the planted groups the clients report (simulation only).
Afterwards each cluster (central/oracle) or each client's beneficial set (p2p) runs FedAvg from theta_0.
Clients that connect after the clustering round score the stored lazy models and join (spec §2.8).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from strategies.base import ClientUpdate, PersonalizedStrategy, wait_for_nodes
from strategies.pfedlia_math import adjusted_rand, assign_late_joiner, cluster_influence, groups_from_sets
from task.params import check_arrays, record_to_numpy, to_record, weighted_average

MODES = ("central", "p2p", "oracle")


class PFedLIAStrategy(PersonalizedStrategy):
    name = "pfedlia"
    default_mode = "central"

    def __init__(self, settings, initial_state, body, head):
        super().__init__(settings, initial_state, body, head)
        self.mode = str(settings.get("lia-mode", self.default_mode)) if self.default_mode != "oracle" else "oracle"
        if self.mode not in MODES:
            raise ValueError(f"run-config key 'lia-mode' must be one of {list(MODES)}, got {self.mode!r}")
        self.warmup = int(settings.get("warmup-rounds", 20))
        if self.warmup < 1:
            raise ValueError(f"run-config key 'warmup-rounds' must be >= 1, got {self.warmup}")
        self.lazy_epochs = int(settings.get("lazy-epochs", 20))
        if self.lazy_epochs < 1:
            raise ValueError(f"run-config key 'lazy-epochs' must be >= 1, got {self.lazy_epochs}")
        self.min_samples = int(settings.get("optics-min-samples", 5))
        self.noise = str(settings.get("lia-noise", "nearest"))
        self.score = str(settings.get("lia-score", "raw"))
        self.standardize = bool(settings.get("lia-row-standardize", False))
        self.clustered = False
        self.theta0: dict[str, np.ndarray] | None = None
        self.assignment: dict[int, int] = {}  # node -> cluster (central/oracle) or group (p2p)
        self.cluster_models: dict[int, dict[str, np.ndarray]] = {}
        self.sets: dict[int, list[int]] = {}  # p2p: node -> beneficial nodes (itself included)
        self.personal: dict[int, dict[str, np.ndarray]] = {}
        self.lazy_nodes: list[int] = []
        self.lazy_stacked: dict[str, np.ndarray] | None = None
        self.matrix: np.ndarray | None = None
        self.planted: dict[int, int] = {}
        self.clustering: dict[str, Any] = {}

    # ------------------------------------------------------------------ what each node trains
    @property
    def has_global_model(self) -> bool:  # type: ignore[override]
        return not self.clustered

    def model_for(self, node_id: int) -> dict[str, np.ndarray]:
        if not self.clustered:
            return self.global_state
        if self.mode == "p2p":
            return self.personal.get(node_id, self.theta0)
        label = self.assignment.get(node_id)
        return self.cluster_models.get(label, self.theta0) if label is not None else self.theta0

    def round_config(self, server_round: int, phase: str) -> ConfigRecord:
        cfg = super().round_config(server_round, phase)
        cfg["clustered"] = self.clustered
        return cfg

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        return RecordDict({"arrays": to_record(self.model_for(node_id))})

    def configure_train(self, server_round: int, arrays, config, grid: Grid):
        clustering_now = not self.clustered and server_round > self.warmup
        if clustering_now:
            self.cluster(grid, server_round)
        elif self.clustered and self.mode != "oracle":
            new = [n for n in grid.get_node_ids() if n not in self.assignment and n not in self.sets]
            if new:
                self.join_late(grid, server_round, sorted(new))
        messages = super().configure_train(server_round, arrays, config, grid)
        if clustering_now:
            self.history[-1].extra["clustering"] = dict(self.clustering)
        return messages

    # ------------------------------------------------------------------ aggregation
    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Any]:
        for u in updates:
            if "planted-cluster" in u.metrics:
                self.planted[u.node_id] = int(u.metrics["planted-cluster"])
        if not self.clustered:
            return super().aggregate(server_round, updates)
        if self.mode == "p2p":
            trained = {u.node_id: u for u in updates}
            for node, members in self.sets.items():
                present = [trained[j] for j in members if j in trained]
                if present:
                    self.personal[node] = weighted_average([u.arrays for u in present], [u.num_examples for u in present])
            return {}
        for label in {self.assignment.get(u.node_id) for u in updates} - {None}:
            group = [u for u in updates if self.assignment.get(u.node_id) == label]
            self.cluster_models[label] = weighted_average([u.arrays for u in group], [u.num_examples for u in group])
        return {}

    # ------------------------------------------------------------------ the clustering round
    def _lazy_models(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, dict[str, np.ndarray]]:
        payloads = {n: RecordDict({"arrays": to_record(self.theta0)}) for n in nodes}
        models = {}
        expected = {k: self.shapes[k] for k in self.all_keys}
        for r in self.send_query(grid, server_round, "lazy", payloads):
            nid = r.metadata.src_node_id
            arrays = record_to_numpy(r.content.array_records["arrays"]) if "arrays" in r.content.array_records else {}
            problem = check_arrays(arrays, expected)
            if problem:
                self.record_failure(server_round, nid, "lazy", problem)
                continue
            models[nid] = arrays
        return models

    def _rows(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, tuple[np.ndarray, list[int]]]:
        lazy = to_record(self.lazy_stacked)
        base = to_record(self.theta0)
        payloads = {}
        for n in nodes:
            payloads[n] = RecordDict({
                "arrays": base, "lazy": lazy,
                "lazy-nodes": ConfigRecord({"node-ids": [int(x) for x in self.lazy_nodes],
                                            "self-index": self.lazy_nodes.index(n) if n in self.lazy_nodes else -1}),
            })
        rows = {}
        for r in self.send_query(grid, server_round, "lia", payloads):
            nid = r.metadata.src_node_id
            metrics = dict(r.content.metric_records["metrics"]) if "metrics" in r.content.metric_records else {}
            row = metrics.get("lia-row")
            if not isinstance(row, list) or len(row) != len(self.lazy_nodes) or not np.all(np.isfinite(row)):
                self.record_failure(server_round, nid, "lia", f"bad influence row (need {len(self.lazy_nodes)} finite values)")
                continue
            beneficial = [int(i) for i in metrics.get("beneficial", [])]
            if any(i < 0 or i >= len(self.lazy_nodes) for i in beneficial):
                self.record_failure(server_round, nid, "lia", "beneficial peers out of range")
                continue
            rows[nid] = (np.asarray(row, float), [self.lazy_nodes[i] for i in beneficial])
        return rows

    def cluster(self, grid: Grid, server_round: int) -> None:
        start = time.monotonic()
        self.theta0 = {k: np.array(v) for k, v in self.global_state.items()}
        nodes = wait_for_nodes(grid, self.settings.min_nodes)
        if self.mode == "oracle":
            missing = [n for n in nodes if n not in self.planted]
            if missing:
                raise ValueError("lia-mode 'oracle' needs planted clusters (partition 'planted-clusters*'); "
                                 f"{len(missing)} nodes reported none")
            self.assignment = {n: self.planted[n] for n in nodes}
        else:
            log_nodes = len(nodes)
            lazy = self._lazy_models(grid, server_round, nodes)
            self.lazy_nodes = sorted(lazy)
            self.lazy_stacked = {k: np.stack([lazy[n][k] for n in self.lazy_nodes]) for k in self.all_keys}
            rows = self._rows(grid, server_round, self.lazy_nodes)
            scored = [n for n in self.lazy_nodes if n in rows]
            self.matrix = np.stack([rows[n][0] for n in scored]) if scored else np.zeros((0, 0))
            self.matrix_nodes = scored
            if self.mode == "central":
                # OPTICS on the square part (clients that both trained a lazy model and scored)
                cols = [self.lazy_nodes.index(n) for n in scored]
                labels = cluster_influence(self.matrix[:, cols], self.min_samples, noise=self.noise, score=self.score,
                                           standardize=self.standardize)
                self.assignment = {n: int(l) for n, l in zip(scored, labels)}
            else:
                self.sets = {n: sorted(set(rows[n][1]) | {n}) for n in scored}
                self.assignment = groups_from_sets({n: frozenset(s) for n, s in self.sets.items()})
                self.personal = {n: self.theta0 for n in scored}
            self.clustering["clients-asked"] = log_nodes
        self.cluster_models = {label: self.theta0 for label in set(self.assignment.values())}
        self.clustered = True
        comm = self.comm.get(server_round, {})
        self.clustering.update({
            "round": server_round, "mode": self.mode, "seconds": time.monotonic() - start,
            "clusters": len(set(self.assignment.values())),
            "bytes-down-per-client": (comm.get("lazy-bytes-down", 0) + comm.get("lia-bytes-down", 0)) / max(1, len(nodes)),
            "bytes-up-per-client": (comm.get("lazy-bytes-up", 0) + comm.get("lia-bytes-up", 0)) / max(1, len(nodes)),
        })
        truth = [self.planted.get(n) for n in self.assignment]
        if truth and all(t is not None for t in truth):
            self.clustering["ari"] = adjusted_rand(truth, list(self.assignment.values()))
            if self.mode == "p2p":
                planted_sets = {n: {m for m in self.assignment if self.planted[m] == self.planted[n]} for n in self.sets}
                self.clustering["p2p-exact-fraction"] = float(np.mean([set(self.sets[n]) == planted_sets[n] for n in self.sets]))
        from strategies.base import log

        log.info("[pfedlia] clustering round %d (%s): %d clusters, ARI %s, %.1f s", server_round, self.mode,
                 self.clustering["clusters"], self.clustering.get("ari"), self.clustering["seconds"])

    def join_late(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        """Spec §2.8: newcomers score the stored lazy models and join the best cluster (or their 2-means set)."""
        if self.lazy_stacked is None:
            return
        rows = self._rows(grid, server_round, nodes)
        order = list(self.matrix_nodes)
        for n, (row, beneficial) in rows.items():
            if self.mode == "p2p":
                self.sets[n] = sorted(set(beneficial) | {n})
                self.personal[n] = self.theta0
                self.assignment[n] = -1
            else:
                cols = [self.lazy_nodes.index(m) for m in order]
                self.assignment[n] = assign_late_joiner(row[cols], np.array([self.assignment[m] for m in order]))

    # ------------------------------------------------------------------ artefacts
    def write_artifacts(self, folder: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pid = lambda n: self.node_partition.get(n, n)  # noqa: E731
        out = {"clustering": self.clustering,
               "assignment": {str(pid(n)): int(l) for n, l in self.assignment.items()},
               "planted": {str(pid(n)): c for n, c in self.planted.items()}}
        if self.sets:
            out["beneficial-sets"] = {str(pid(n)): [pid(m) for m in s] for n, s in self.sets.items()}
        (folder / "pfedlia_clusters.json").write_text(json.dumps(out, indent=1))
        if self.matrix is None or self.matrix.size == 0:
            return
        (folder / "pfedlia_influence.json").write_text(json.dumps({
            "rows (scoring client)": [pid(n) for n in self.matrix_nodes],
            "columns (lazy model of client)": [pid(n) for n in self.lazy_nodes], "matrix": self.matrix.tolist()}))
        order = sorted(range(len(self.matrix_nodes)), key=lambda i: (self.assignment.get(self.matrix_nodes[i], -1), pid(self.matrix_nodes[i])))
        cols = [self.lazy_nodes.index(self.matrix_nodes[i]) for i in order]
        mat = self.matrix[np.ix_(order, cols)]
        lim = np.abs(mat).max() or 1.0
        fig, ax = plt.subplots(figsize=(6, 5))
        im = ax.imshow(mat, cmap="RdBu", vmin=-lim, vmax=lim)
        labels = [self.assignment.get(self.matrix_nodes[i], -1) for i in order]
        for k in range(1, len(labels)):
            if labels[k] != labels[k - 1]:
                ax.axhline(k - 0.5, color="k", lw=0.6)
                ax.axvline(k - 0.5, color="k", lw=0.6)
        ax.set_title(f"lazy influence (rows: scoring client), ordered by cluster; ARI {self.clustering.get('ari', 'n/a')}")
        ax.set_xlabel("lazy model of client")
        ax.set_ylabel("client")
        fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        fig.savefig(folder / "pfedlia_influence.png", dpi=100)
        plt.close(fig)


class OracleStrategy(PFedLIAStrategy):
    """Oracle baseline: the same warm-up and per-cluster FedAvg, clustered by the true planted groups."""

    name = "oracle"
    default_mode = "oracle"
