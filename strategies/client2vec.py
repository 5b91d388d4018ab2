"""Client2Vec (Guo et al.): a one-off client index phase, then FL with index-aware sampling, aggregation and
local training (spec client2vec.md).  The base algorithm (``c2v-base``: FedAvg, FedProx or MOON) runs
unchanged underneath; the three case studies are independent switches:

- ``c2v-sampling`` (i): Eq. 1 - clients similar to the previous cohort are more likely, recent ones blocked;
- ``c2v-aggregation`` (ii): Eq. 3 - weights q_i exp(H_i / lambda1) instead of q_i = N_i / N_C;
- ``c2v-local`` (iii): every train message carries all feature indices B_f (M x 512) and the clients add
  the orthogonality + distillation loss; P and h_P travel with the model under ``c2v.*`` keys.

Index phase (before round 1's cohort is drawn, and again for nodes that connect later):
Global mode - each node uploads one batch of CLIP (D, L) pairs (``query.c2v_embed``), the server trains
DSA-IGN on the pool; Federated mode - DSA-IGN is trained by FedAvg over ``query.c2v_ign`` messages to a
``c2v-ign-fraction`` of the nodes per round.  Then every node computes its index (``query.c2v_index``).

Privacy (spec A20): the label half is a linear map of the label histogram, which the server can invert;
Global mode also uploads 128 raw embeddings per client.  Nothing here claims otherwise.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from client_app.client2vec_math import build_aux
from strategies.base import ClientUpdate, PersonalizedStrategy, wait_for_nodes
from strategies.client2vec_math import C2VServerState
from task.dsa_ign import build_ign, c2v_options, train_dsa_ign
from task.models import build_model
from task.params import check_arrays, load_record, record_to_numpy, state_to_numpy, to_record, weighted_average

log = logging.getLogger("flwr.pflower")


class Client2VecStrategy(PersonalizedStrategy):
    name = "client2vec"

    def __init__(self, settings, initial_state, body, head):
        self.opts = c2v_options(settings)
        state = dict(initial_state)
        if self.opts.local:
            model = build_model(settings.model, settings.in_channels, settings.image_size, settings.num_classes,
                                seed=settings.seed)
            aux = build_aux(model.feature_dim, self.opts.ign.dim, settings.num_classes, int(settings.seed))
            state.update(state_to_numpy(aux.state_with_prefix()))
        super().__init__(settings, state, body, head)
        self.ign = build_ign(self.opts.ign, int(settings.seed))
        self.ign_history: list[dict[str, float]] = []
        self.index_nodes: list[int] = []  # row r of the index matrices is node index_nodes[r]
        self.index_partition: list[int] = []
        self.c2v: C2VServerState | None = None
        self.index_seconds = 0.0
        self.cohorts: dict[int, list[int]] = {}
        # with every case study off this is the plain base algorithm: no index phase at all
        self.enabled = self.opts.sampling or self.opts.aggregation or self.opts.local
        self._uniform = np.random.default_rng(int(settings.seed))
        self.agg_weights: dict[int, dict[int, float]] = {}

    # ------------------------------------------------------------------ index phase
    def _check(self, server_round: int, nid: int, reply: RecordDict, phase: str, shapes: dict[str, tuple]) -> dict | None:
        """Arrays, sample count and partition id of an index-phase reply, or None (failure recorded)."""
        metrics = dict(reply.metric_records["metrics"]) if "metrics" in reply.metric_records else {}
        n = metrics.get("num-examples")
        if not isinstance(n, (int, float)) or isinstance(n, bool) or not np.isfinite(n) or n <= 0:
            self.record_failure(server_round, nid, phase, f"invalid num-examples {n!r}")
            return None
        arrays = record_to_numpy(reply.array_records["arrays"]) if "arrays" in reply.array_records else {}
        problem = check_arrays(arrays, shapes)
        if problem:
            self.record_failure(server_round, nid, phase, problem)
            return None
        pid = int(metrics.get("partition-id", -1))
        if pid >= 0:
            self.node_partition[nid] = pid
        return {"arrays": arrays, "n": int(n), "pid": pid if pid >= 0 else nid}

    def _train_ign_global(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        o, dim = self.opts, self.opts.ign.dim
        pool_d, pool_l = [], []
        for r in self.send_query(grid, server_round, "c2v_embed", {n: RecordDict() for n in nodes}):
            rec = r.content.array_records.get("arrays") if "arrays" in r.content.array_records else None
            rows = rec["D"].shape[0] if rec is not None and "D" in rec else 0
            got = self._check(server_round, r.metadata.src_node_id, r.content, "c2v_embed",
                              {"D": (rows, dim), "L": (rows, dim)})
            if got is not None and 0 < rows <= o.ign_upload:
                pool_d.append(got["arrays"]["D"])
                pool_l.append(got["arrays"]["L"])
            elif got is not None:
                self.record_failure(server_round, r.metadata.src_node_id, "c2v_embed",
                                    f"uploaded {rows} pairs; allowed 1..{o.ign_upload} (c2v-ign-upload)")
        if not pool_d:
            raise RuntimeError("no node uploaded usable embeddings; the DSA-IGN cannot be trained")
        D, L = np.concatenate(pool_d), np.concatenate(pool_l)
        log.info("[client2vec] training DSA-IGN on %d pooled pairs from %d nodes for %d epochs", len(D), len(pool_d),
                 o.ign_epochs)
        step = max(1, o.ign_epochs // 5)

        def progress(epoch: int, losses: dict[str, float]) -> None:
            if epoch % step == 0 or epoch == o.ign_epochs:
                log.info("[client2vec] DSA-IGN epoch %d/%d: loss %.4f (div %.3f sim %.3f orth %.3f recon %.4f)", epoch,
                         o.ign_epochs, losses["total"], losses["div"], losses["sim"], losses["orth"], losses["recon"])

        start = time.perf_counter()
        self.ign_history = train_dsa_ign(self.ign, D, L, epochs=o.ign_epochs, batch_size=o.ign_batch, lr=o.ign_lr,
                                         seed=int(self.settings.seed), orth_mode=o.orth_mode, progress=progress)
        self._server_time(time.perf_counter() - start)

    def _train_ign_federated(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        o = self.opts
        shapes = {k: tuple(v.shape) for k, v in self.ign.state_dict().items()}
        k = max(1, int(round(o.ign_fraction * len(nodes))))
        for r in range(1, o.ign_epochs + 1):
            cohort = sorted(self.rng.sample(nodes, k))
            weights = to_record(self.ign.state_dict())
            states, ns, losses = [], [], []
            for reply in self.send_query(grid, server_round, "c2v_ign", {n: RecordDict({"ign": weights}) for n in cohort}):
                got = self._check(server_round, reply.metadata.src_node_id, reply.content, "c2v_ign", shapes)
                if got is not None:
                    states.append(got["arrays"])
                    ns.append(got["n"])
                    losses.append(float(dict(reply.content.metric_records["metrics"]).get("ign-loss", np.nan)))
            if states:
                avg = weighted_average(states, ns)
                load_record(self.ign, avg, strict_keys=True)
                self.ign_history.append({"total": float(np.nanmean(losses)) if losses else float("nan")})
            log.info("[client2vec] federated DSA-IGN round %d/%d: %d/%d replies, mean local loss %.4f", r, o.ign_epochs,
                     len(states), k, self.ign_history[-1]["total"] if self.ign_history else float("nan"))

    def _collect_index(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        dim = self.opts.ign.dim
        weights = to_record(self.ign.state_dict())
        rows = []
        for r in self.send_query(grid, server_round, "c2v_index", {n: RecordDict({"ign": weights}) for n in nodes}):
            nid = r.metadata.src_node_id
            got = self._check(server_round, nid, r.content, "c2v_index", {"beta_f": (dim,), "beta_l": (dim,)})
            if got is not None and nid not in self.index_nodes and nid not in [x[0] for x in rows]:
                rows.append((nid, got))
        if not rows:
            return
        rows.sort()
        bf = np.stack([g["arrays"]["beta_f"] for _, g in rows])
        bl = np.stack([g["arrays"]["beta_l"] for _, g in rows])
        n = np.array([g["n"] for _, g in rows], dtype=float)
        if self.c2v is None:
            s = self.settings
            self.c2v = C2VServerState(bf, bl, n, tau=self.opts.tau, gamma=self.opts.gamma, lambda1=self.opts.lambda1,
                                      seed=int(s.seed))
        else:
            self.c2v.add(bf, bl, n)
        self.index_nodes += [nid for nid, _ in rows]
        self.index_partition += [g["pid"] for _, g in rows]

    def ensure_index(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        """Index nodes that have none yet (all of them the first time; late joiners later)."""
        missing = [n for n in nodes if n not in self.index_nodes]
        if not missing:
            return
        start = time.perf_counter()
        if not self.ign_history and self.opts.ign_epochs > 0:
            if self.opts.ign_mode == "global":
                self._train_ign_global(grid, server_round, missing)
            else:
                self._train_ign_federated(grid, server_round, missing)
        self._collect_index(grid, server_round, missing)
        seconds = time.perf_counter() - start
        self.index_seconds += seconds
        self.history[-1].extra["index-seconds"] = self.history[-1].extra.get("index-seconds", 0.0) + seconds
        log.info("[client2vec] index phase: %d nodes indexed (%d total) in %.1f s", len(missing), len(self.index_nodes),
                 seconds)

    # ------------------------------------------------------------------ rounds
    def sample(self, grid: Grid, server_round: int) -> list[int]:
        nodes = wait_for_nodes(grid, self.settings.min_nodes)
        if not self.enabled:  # same uniform draws as the index-aware arms without (i)
            k = max(1, int(round(self.settings.fraction_train * len(nodes))))
            rows = np.sort(self._uniform.choice(len(nodes), size=k, replace=False, p=np.full(len(nodes), 1 / len(nodes))))
            self.cohorts[server_round] = [int(r) for r in rows]
            return [nodes[r] for r in rows]
        self.ensure_index(grid, server_round, nodes)
        if self.c2v is None:
            raise RuntimeError("no node returned a usable client index; see failures.json")
        connected = set(nodes)
        available = np.array([n in connected for n in self.index_nodes])
        k = max(1, int(round(self.settings.fraction_train * int(available.sum()))))
        rows = self.c2v.sample(server_round, k, self.opts.sampling, available)
        cohort = [self.index_nodes[r] for r in rows]
        self.cohorts[server_round] = [self.index_partition[r] for r in rows]
        return cohort

    def round_config(self, server_round: int, phase: str) -> ConfigRecord:
        cfg = super().round_config(server_round, phase)
        cfg["c2v-local"] = bool(self.opts.local and phase == "train")
        return cfg

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        payload = RecordDict({"arrays": to_record(self.global_state)})
        if self.opts.local and self.c2v is not None:
            payload["c2v"] = to_record({"B_f": self.c2v.beta_f.astype(np.float32)})
        return payload

    def evaluate_payload(self, node_id: int, server_round: int) -> RecordDict:
        return RecordDict({"arrays": to_record(self.global_state)})

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Any]:
        if not self.enabled:
            return super().aggregate(server_round, updates)
        assert self.c2v is not None
        updates = [u for u in updates if u.node_id in self.index_nodes]
        if not updates:
            return {}
        rows = [self.index_nodes.index(u.node_id) for u in updates]
        self.c2v.observe(rows)  # H <- gamma H + S(., C^t), C^t = this round's participants
        w = self.c2v.weights(rows, self.opts.aggregation)
        self.global_state = weighted_average([u.arrays for u in updates], w)
        self.agg_weights[server_round] = {self.index_partition[r]: float(x) for r, x in zip(rows, w)}
        return {"c2v-weights": self.agg_weights[server_round]}

    # ------------------------------------------------------------------ artefacts
    def domain_of(self, pid: int) -> int:
        shift = int(self.settings.data.feature_shift)
        return pid % shift if shift else 0

    def index_quality(self) -> dict[str, float]:
        """Mean beta_f cosine within a feature-shift domain minus across domains (the Fig. 2 block structure)."""
        if self.c2v is None or self.c2v.size < 2:
            return {}
        dom = np.array([self.domain_of(p) for p in self.index_partition])
        same = dom[:, None] == dom[None, :]
        off = ~np.eye(len(dom), dtype=bool)
        out = {}
        if (same & off).any() and (~same).any():
            out["beta-f-same-domain"] = float(self.c2v.sim_f[same & off].mean())
            out["beta-f-cross-domain"] = float(self.c2v.sim_f[~same].mean())
            out["beta-f-block-gap"] = out["beta-f-same-domain"] - out["beta-f-cross-domain"]
        return out

    def write_artifacts(self, folder: Path) -> None:
        if self.c2v is None:
            return
        order = sorted(range(self.c2v.size), key=lambda r: (self.domain_of(self.index_partition[r]), self.index_partition[r]))
        pids = [self.index_partition[r] for r in order]
        np.savez(folder / "client2vec_index.npz", partition_id=np.array(pids), domain=np.array([self.domain_of(p) for p in pids]),
                 beta_f=self.c2v.beta_f[order], beta_l=self.c2v.beta_l[order], num_examples=self.c2v.n[order])
        best = max((r.evaluate.get("global-acc", -1.0) for r in self.history), default=-1.0)
        (folder / "client2vec.json").write_text(json.dumps({
            "options": {k: (v if not hasattr(v, "__dict__") else vars(v)) for k, v in vars(self.opts).items()},
            "index-seconds": self.index_seconds, "index-quality": self.index_quality(),
            "best-global-acc": best if best >= 0 else None,
            "dsa-ign-losses": self.ign_history, "cohorts": self.cohorts,
            "aggregation-weights": self.agg_weights,
        }, indent=1, default=str))
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        doms = [self.domain_of(p) for p in pids]
        fig, axes = plt.subplots(1, 2, figsize=(11, 5))
        for ax, sim, title in ((axes[0], self.c2v.sim_f, "feature half cos(beta_f)"),
                               (axes[1], self.c2v.sim_l, "label half cos(beta_l)")):
            im = ax.imshow(sim[np.ix_(order, order)], cmap="RdBu_r", vmin=-1, vmax=1)
            for k in range(1, len(doms)):
                if doms[k] != doms[k - 1]:
                    ax.axhline(k - 0.5, color="k", lw=0.6)
                    ax.axvline(k - 0.5, color="k", lw=0.6)
            ax.set_title(title)
            ax.set_xlabel("client (ordered by domain)")
            fig.colorbar(im, ax=ax, fraction=0.046)
        q = self.index_quality()
        gap = f"; same - cross domain beta_f cos {q['beta-f-block-gap']:.2f}" if "beta-f-block-gap" in q else ""
        fig.suptitle(f"Client2Vec pairwise index similarity ({self.c2v.size} clients{gap})")
        fig.tight_layout()
        fig.savefig(folder / "client2vec_similarity.png", dpi=100)
        plt.close(fig)
