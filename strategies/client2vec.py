"""Client2Vec (Guo et al.): a one-off client index phase, then FL with index-aware sampling, aggregation and
local training (docs/methods/client2vec.md).  The base algorithm (``c2v-base``: FedAvg, FedProx or MOON) runs
unchanged underneath; the three case studies are independent switches:

- ``c2v-sampling`` (i): Eq. 1 - clients similar to the previous cohort are more likely, recent ones blocked;
- ``c2v-aggregation`` (ii): Eq. 3 - weights q_i exp(H_i / lambda1) instead of q_i = N_i / N_C;
- ``c2v-local`` (iii): every train message carries all feature indices B_f (M x 512) and the clients add
  the orthogonality + distillation loss; P and h_P travel with the model under ``c2v.*`` keys.

Index phase (before round 1's cohort is drawn, and again for nodes that connect later):
Global mode - each node uploads one batch of CLIP (D, L) pairs (``query.c2v_embed``), the server trains
DSA-IGN on the pool; Federated mode - DSA-IGN is trained by FedAvg over ``query.c2v_ign`` messages to a
``c2v-ign-fraction`` of the nodes per round.  Then every node computes its index (``query.c2v_index``).

Privacy (client2vec.md A20): the label half is a linear map of the label histogram, which the server can invert;
Global mode also uploads 128 raw embeddings per client.  Nothing here claims otherwise.

See docs/methods/client2vec.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from strategies.api import (
    LOSS_LIMIT,
    PER_CLIENT,
    Arrays,
    Dim,
    Disclosure,
    Number,
    Part,
    PersonalizedStrategy,
    Reply,
    ReplySpec,
    Tensor,
)
from strategies.client2vec_math import C2VServerState
from task.dsa_ign import build_ign, torch_threads, train_dsa_ign
from task.methods.client2vec import Client2VecOptions, build_aux
from task.params import load_record, state_to_numpy, to_record

log = logging.getLogger("flwr.pflower")


class Client2VecStrategy(PersonalizedStrategy):
    def __init__(self, settings, initial_state, model_info):
        self.opts: Client2VecOptions = settings.options
        state = dict(initial_state)
        if self.opts.local:  # case study (iii): P and h_P travel with the model under c2v.* keys
            aux = build_aux(model_info.feature_dim, self.opts.ign.dim, settings.num_classes, int(settings.seed))
            state.update(state_to_numpy(aux.state_with_prefix()))
        super().__init__(settings, state, model_info)
        self.ign = build_ign(self.opts.ign, int(settings.seed))
        self.ign_history: list[dict[str, float]] = []
        self.index_clients: list[int] = []  # row r of the index matrices is client index_clients[r]
        self.c2v: C2VServerState | None = None
        self.index_seconds = 0.0
        self.cohorts: dict[int, list[int]] = {}
        self.enabled = self.opts.enabled  # with every case study off: the base algorithm, no index phase
        self._uniform = np.random.default_rng(int(settings.seed))
        self.agg_weights: dict[int, dict[int, float]] = {}

    def state(self) -> dict[str, Any]:
        """The DSA-IGN (late joiners are indexed with it), the index and the sampler's state (the pairwise
        similarities are recomputed from the index), the uniform draws' generator and the logs."""
        c2v = self.c2v
        return {
            "ign": state_to_numpy(self.ign.state_dict()),
            "ign-history": self.ign_history,
            "index-clients": self.index_clients,
            "index": None
            if c2v is None
            else {
                "beta-f": c2v.beta_f,
                "beta-l": c2v.beta_l,
                "n": c2v.n,
                "H": c2v.H,
                "last-drawn": c2v.last_drawn,
                "prev-cohort": c2v.prev_cohort,
                "prev-drawn-size": c2v.prev_drawn_size,
                "rng": c2v.rng,
            },
            "index-seconds": self.index_seconds,
            "cohorts": self.cohorts,
            "uniform": self._uniform,
            "aggregation-weights": self.agg_weights,
        }

    def restore(self, state) -> None:
        load_record(self.ign, state["ign"], strict_keys=True)
        self.ign_history, self.index_clients = state["ign-history"], state["index-clients"]
        self.index_seconds, self.cohorts = state["index-seconds"], state["cohorts"]
        self._uniform, self.agg_weights = state["uniform"], state["aggregation-weights"]
        index = state["index"]
        if index is not None:
            o = self.opts
            self.c2v = C2VServerState(
                index["beta-f"], index["beta-l"], index["n"], tau=o.tau, gamma=o.gamma, lambda1=o.lambda1
            )
            self.c2v.H, self.c2v.last_drawn = index["H"], index["last-drawn"]
            self.c2v.prev_cohort, self.c2v.prev_drawn_size = index["prev-cohort"], index["prev-drawn-size"]
            self.c2v.rng = index["rng"]

    # ------------------------------------------------------------------ index phase
    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        spec = super().reply_spec(phase, node_id)
        dim, o = self.opts.ign.dim, self.opts
        if phase == "c2v_embed":  # one batch of (image, label-prompt) embedding pairs
            rows = Dim(1, o.ign_upload)
            return spec.with_records(arrays=Arrays({"D": Tensor((rows, dim)), "L": Tensor((rows, dim))})).with_rule(
                lambda m, r: (
                    None
                    if len(r["arrays"]["D"]) == len(r["arrays"]["L"])
                    else f"uploaded {len(r['arrays']['D'])} image but {len(r['arrays']['L'])} label embeddings"
                )
            )
        if phase == "c2v_ign":
            return spec.with_records(arrays=Arrays.like(state_to_numpy(self.ign.state_dict()))).with_metrics(
                **{"ign-loss": Number(float, -LOSS_LIMIT, LOSS_LIMIT)}
            )
        if phase == "c2v_index":
            return spec.with_records(arrays=Arrays({"beta_f": Tensor((dim,)), "beta_l": Tensor((dim,))}))
        return spec

    def _train_ign_global(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        o = self.opts
        replies = self.send_query(grid, server_round, "c2v_embed", {n: RecordDict() for n in nodes})
        if not replies:
            raise RuntimeError("no node uploaded usable embeddings; the DSA-IGN cannot be trained")
        # pooled in client-id order, so a seed trains the same DSA-IGN in every run
        D = np.concatenate([r.arrays["D"] for r in replies])
        L = np.concatenate([r.arrays["L"] for r in replies])
        log.info(
            "[client2vec] training DSA-IGN on %d pooled pairs from %d nodes for %d epochs",
            len(D),
            len(replies),
            o.ign_epochs,
        )
        step = max(1, o.ign_epochs // 5)

        def progress(epoch: int, losses: dict[str, float]) -> None:
            if epoch % step == 0 or epoch == o.ign_epochs:
                log.info(
                    "[client2vec] DSA-IGN epoch %d/%d: loss %.4f (div %.3f sim %.3f orth %.3f recon %.4f)",
                    epoch,
                    o.ign_epochs,
                    losses["total"],
                    losses["div"],
                    losses["sim"],
                    losses["orth"],
                    losses["recon"],
                )

        start = time.perf_counter()
        with torch_threads(o.ign_threads):
            self.ign_history = train_dsa_ign(
                self.ign,
                D,
                L,
                epochs=o.ign_epochs,
                batch_size=o.ign_batch,
                lr=o.ign_lr,
                seed=int(self.settings.seed),
                orth_mode=o.orth_mode,
                progress=progress,
            )
        self.server_time(time.perf_counter() - start)

    def _train_ign_federated(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        o = self.opts
        k = self.cohort_size(len(nodes), o.ign_fraction)
        for r in range(1, o.ign_epochs + 1):
            cohort = self.draw(nodes, k)
            weights = to_record(self.ign.state_dict())
            replies = self.send_query(grid, server_round, "c2v_ign", {n: RecordDict({"ign": weights}) for n in cohort})
            if replies:
                sent = state_to_numpy(self.ign.state_dict())
                sizes, clients = [u.num_examples for u in replies], [u.client for u in replies]
                avg = self.robust.average_models([u.arrays for u in replies], sizes, clients, sent, "dsa-ign")
                load_record(self.ign, avg, strict_keys=True)
                self.ign_history.append({"total": float(np.mean([u.metrics["ign-loss"] for u in replies]))})
            log.info(
                "[client2vec] federated DSA-IGN round %d/%d: %d/%d replies, mean local loss %.4f",
                r,
                o.ign_epochs,
                len(replies),
                k,
                self.ign_history[-1]["total"] if self.ign_history else float("nan"),
            )

    def _collect_index(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        weights = to_record(self.ign.state_dict())
        replies = self.send_query(grid, server_round, "c2v_index", {n: RecordDict({"ign": weights}) for n in nodes})
        rows = [r for r in replies if r.client not in self.index_clients]  # ordered by client id
        if not rows:
            return
        bf = np.stack([r.arrays["beta_f"] for r in rows])
        bl = np.stack([r.arrays["beta_l"] for r in rows])
        n = np.array([r.num_examples for r in rows], dtype=float)
        if self.c2v is None:
            self.c2v = C2VServerState(
                bf,
                bl,
                n,
                tau=self.opts.tau,
                gamma=self.opts.gamma,
                lambda1=self.opts.lambda1,
                seed=int(self.settings.seed),
            )
        else:
            self.c2v.add(bf, bl, n)
        self.index_clients += [r.client for r in rows]

    def ensure_index(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        """Index the clients that have none yet (all of them the first time; late joiners later)."""
        missing = [n for n in nodes if self.client(n) not in self.index_clients]
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
        log.info(
            "[client2vec] index phase: %d nodes asked, %d clients indexed in %.1f s",
            len(missing),
            len(self.index_clients),
            seconds,
        )

    # ------------------------------------------------------------------ rounds
    def wants_client_ids(self, server_round: int, nodes: list[int]) -> bool:
        # Federated DSA-IGN draws cohorts among the nodes before any index exists
        return super().wants_client_ids(server_round, nodes) or (self.enabled and self.opts.ign_mode == "federated")

    def prepare_round(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        if self.enabled:
            self.ensure_index(grid, server_round, nodes)
            if self.c2v is None:
                raise RuntimeError("no node returned a usable client index; see failures.json")

    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        """Eq. 1 (with (i)) or uniform draws, both over the clients in client-id order, so that every arm of a
        seed draws the same clients where its sampling is the same."""
        if not self.enabled:  # the same uniform draws as the index arms without (i)
            ordered = self.by_client(nodes)
            k = self.cohort_size(len(ordered), self.settings.fraction_train)
            rows = np.sort(
                self._uniform.choice(len(ordered), size=k, replace=False, p=np.full(len(ordered), 1 / len(ordered)))
            )
            cohort = [ordered[r] for r in rows]
            self.cohorts[server_round] = [self.client_of.get(n, -1) for n in cohort]
            return cohort
        assert self.c2v is not None
        connected = {self.client_of[n] for n in nodes if n in self.client_of}
        available = np.array([c in connected for c in self.index_clients])
        k = self.cohort_size(int(available.sum()), self.settings.fraction_train)
        rows = self.c2v.sample(server_round, k, self.opts.sampling, available)
        self.cohorts[server_round] = [self.index_clients[r] for r in rows]
        return [self.node_of[self.index_clients[r]] for r in rows]

    def config_part(self, **more: bool) -> Part:
        """Every message also says whether the local index-aware loss applies (``c2v-local``)."""
        return super().config_part(**{"c2v-local": True}, **more)

    def disclosure(self) -> dict[str, Disclosure]:
        """Index phase (round 1), Global mode: ``query.c2v_embed`` uploads up to ``c2v-ign-upload`` CLIP embeddings
        of its training images with their label embeddings; Federated mode: ``query.c2v_ign`` trains the DSA-IGN
        it is sent and returns it.  ``query.c2v_index``: its client index (feature and label halves).  Train:
        the trained model; with ``c2v-local`` the message brings every client's feature index."""
        out = super().disclosure()
        ign = Part(
            "the DSA-IGN (trained on the clients' embeddings)",
            arrays=Arrays.like(state_to_numpy(self.ign.state_dict())),
            from_peers=True,
        )
        config = {"config": self.config_part()}
        out["query.c2v_embed"] = Disclosure(
            self.sends("c2v_embed", {"arrays": "CLIP embeddings of its training images (D) and of their labels (L)"}),
            config,
            "embeddings close to its images and its label distribution",
        )
        out["query.c2v_ign"] = Disclosure(
            self.sends("c2v_ign", {"arrays": "the DSA-IGN after training on its embeddings"}),
            {**config, "ign": ign},
            "an update computed on its embeddings",
        )
        out["query.c2v_index"] = Disclosure(
            self.sends("c2v_index", {"arrays": "its client index: feature half and label half"}),
            {**config, "ign": ign},
            "its feature distribution and (invertibly) its label histogram",
        )
        train = dict(out["train"].receives)
        if self.opts.local:
            train["c2v"] = Part(
                "every client's feature index B_f",
                arrays=Arrays({"B_f": Tensor((PER_CLIENT, self.opts.ign.dim))}),
                required=False,
                from_peers=True,
            )
        out["train"] = Disclosure(out["train"].sends, train, out["train"].reveals)
        return out

    def round_config(self, server_round: int, phase: str) -> ConfigRecord:
        cfg = super().round_config(server_round, phase)
        cfg["c2v-local"] = bool(self.opts.local and phase == "train")
        return cfg

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        """The global model; with case study (iii) a train message also carries every feature index B_f."""
        payload = RecordDict({"arrays": to_record(self.global_state)})
        if phase == "train" and self.opts.local and self.c2v is not None:
            payload["c2v"] = to_record({"B_f": self.c2v.beta_f.astype(np.float32)})
        return payload

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        if not self.enabled:
            return super().aggregate(server_round, updates)
        assert self.c2v is not None
        updates = [u for u in updates if u.client in self.index_clients]
        if not updates:
            return {}
        rows = [self.index_clients.index(u.client) for u in updates]
        self.c2v.observe(rows)  # H <- gamma H + S(., C^t), C^t = this round's participants
        w = self.c2v.weights(rows, self.opts.aggregation)
        self.global_state = self.robust.average_models(
            [u.arrays for u in updates], w, [u.client for u in updates], self.global_state
        )
        self.agg_weights[server_round] = {self.index_clients[r]: float(x) for r, x in zip(rows, w, strict=True)}
        return {"c2v-weights": self.agg_weights[server_round]}

    # ------------------------------------------------------------------ artefacts
    def domain_of(self, pid: int) -> int:
        shift = int(self.settings.data.feature_shift)
        return pid % shift if shift else 0

    def index_quality(self) -> dict[str, float]:
        """Mean beta_f cosine within a feature-shift domain minus across domains (the Fig. 2 block structure)."""
        if self.c2v is None or self.c2v.size < 2:
            return {}
        dom = np.array([self.domain_of(p) for p in self.index_clients])
        same = dom[:, None] == dom[None, :]
        off = ~np.eye(len(dom), dtype=bool)
        out = {}
        if (same & off).any() and (~same).any():
            out["beta-f-same-domain"] = float(self.c2v.sim_f[same & off].mean())
            out["beta-f-cross-domain"] = float(self.c2v.sim_f[~same].mean())
            out["beta-f-block-gap"] = out["beta-f-same-domain"] - out["beta-f-cross-domain"]
        return out
