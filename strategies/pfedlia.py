"""pFedLIA strategy (pfedlia.md §2.4-§2.8): FedAvg warm-up, one clustering round, then FedAvg per cluster.

Rounds 1..``warmup-rounds`` are FedAvg.  At the start of the next round the server runs the clustering
phase through the Grid: ``query.lazy`` (every client trains a copy of the warm-up model theta_0 for
``lazy-epochs`` epochs and returns it), then ``query.lia`` (every client receives all lazy models and
theta_0 and returns its lazy-influence row, plus - peer-to-peer - its beneficial peers).  Central mode
clusters the matrix with OPTICS (noise reassigned); peer-to-peer mode uses the clients' own 2-means sets
(the server only relays); ``oracle`` uses the planted groups the clients report (simulation only).
Afterwards each cluster (central/oracle) or each client's beneficial set (p2p) runs FedAvg from theta_0.
Clients that connect after the clustering round score the stored lazy models and join (pfedlia.md §2.8).

Under ``dp-mode='local'`` every model a client sends (train replies and its lazy model) is its local release,
without integer buffers (they keep the initial model's values here); the server averages the releases **without
weights** (a size-weighted average would make what peers receive depend on un-noised training-set sizes) and
accounts every client's epsilon over its releases: one per round plus its lazy model (docs/privacy.md, "Local DP in
pFedLIA").  The influence rows, the clustering and the metrics are not covered.

See docs/methods/pfedlia.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from strategies.api import (
    IDENTIFY,
    INT_LIMIT,
    PER_CLIENT,
    VALUE_LIMIT,
    Arrays,
    Clients,
    Disclosure,
    Number,
    Numbers,
    Part,
    PersonalizedStrategy,
    Reply,
    ReplySpec,
    lengths_on,
    log,
)
from strategies.pfedlia_math import adjusted_rand, assign_late_joiner, cluster_influence, groups_from_sets
from task.methods.pfedlia import PFedLIAOptions
from task.params import stack_states, to_record, weighted_average


class PFedLIAStrategy(PersonalizedStrategy):
    options: PFedLIAOptions  # the run-config keys of this method, typed

    default_mode = "central"

    def __init__(self, settings, initial_state, model_info):
        super().__init__(settings, initial_state, model_info)
        o = self.options
        self.mode = "oracle" if self.default_mode == "oracle" else o.mode
        self.warmup = o.warmup_rounds
        self.clustered = False
        self.theta0: dict[str, np.ndarray] | None = None
        # everything per client is keyed by client id (partition id)
        self.assignment: dict[int, int] = {}  # client -> cluster (central/oracle) or group (p2p)
        self.cluster_models: dict[int, dict[str, np.ndarray]] = {}
        self.sets: dict[int, list[int]] = {}  # p2p: client -> beneficial clients (itself included)
        self.personal: dict[int, dict[str, np.ndarray]] = {}
        self.lazy_clients: list[int] = []  # column j of the influence matrix is the lazy model of lazy_clients[j]
        self.lazy_stacked: dict[str, np.ndarray] | None = None
        self.matrix: np.ndarray | None = None
        self.matrix_clients: list[int] = []  # row i of the influence matrix was scored by matrix_clients[i]
        self.planted: dict[int, int] = {}
        self.clustering: dict[str, Any] = {}
        self.lazy_queries = 0  # how often the lazy model was asked for (local DP: each is a release of its client)
        self.releases = 0  # the valid train replies of this round (local DP: the releases the server received)

    #: what a resumed run needs: the clustering, every cluster's (or client's) model and the lazy models late
    #: joiners score
    SAVED = (
        "clustered",
        "theta0",
        "assignment",
        "cluster_models",
        "sets",
        "personal",
        "lazy_clients",
        "lazy_stacked",
        "matrix",
        "matrix_clients",
        "planted",
        "clustering",
        "lazy_queries",
    )

    def state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.SAVED}

    def restore(self, state) -> None:
        for name in self.SAVED:
            setattr(self, name, state[name])

    # ------------------------------------------------------------------ what each node trains
    # a global model only until the clients are clustered: a property where the base has a class attribute
    @property
    def has_global_model(self) -> bool:  # type: ignore[override]
        return not self.clustered

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        if not self.clustered:
            return super().server_models()
        if self.mode == "p2p":  # every client's beneficial-set model is its own personalized model
            return {}
        return {f"cluster-{k}": m for k, m in sorted(self.cluster_models.items())}

    def model_for(self, node_id: int) -> dict[str, np.ndarray]:
        if not self.clustered:
            return self.global_state
        client, start = self.client(node_id), self.start_model()
        if client is None:  # a node that never replied: theta_0, as a client outside every cluster
            return start
        if self.mode == "p2p":
            return self.personal.get(client, start)
        label = self.assignment.get(client)
        return self.cluster_models.get(label, start) if label is not None else start

    def round_config(self, server_round: int, phase: str) -> ConfigRecord:
        cfg = super().round_config(server_round, phase)
        cfg["clustered"] = self.clustered
        fused = self.schedule.fused
        if phase == "train" and fused:  # the evaluated model is from before this round's clustering
            cfg["evaluated-clustered"] = bool(self.clustering) and self.clustering.get("round", 0) <= fused
        return cfg

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        return RecordDict({"arrays": to_record(self.model_for(node_id))})

    def config_part(self, **more: bool) -> Part:
        """Every message also says whether the clients are clustered yet (and whether an evaluation riding on a
        train message is of a clustered model)."""
        return super().config_part(clustered=True, **{"evaluated-clustered": False}, **more)

    def disclosure(self) -> dict[str, Disclosure]:
        """Warm-up and per-cluster rounds as FedAvg (the model of the client's cluster).  The clustering round:
        ``query.lazy`` sends the warm-up model and gets back a lazily trained whole model; ``query.lia`` sends
        every client's lazy model with their client ids and gets back the influence row (peer-to-peer: also the
        beneficial peers).  The Oracle has no clustering queries."""
        out = super().disclosure()
        if self.mode == "oracle":  # the Oracle clusters by the planted groups its clients report: no lazy models
            return out
        start = self.model_part("the warm-up model (the clients' average)")
        local = " (its local release around the warm-up model)" if self.settings.dp_mode == "local" else ""
        out["query.lazy"] = Disclosure(
            self.sends("lazy", {"arrays": "its lazily trained whole model" + local}),
            {"config": self.config_part(), "arrays": start},
            "a model trained on its data alone",
        )
        # one score per lazy model it was sent; peer-to-peer, some of them (none, up to all) as beneficial
        scores = {"lia-row": PER_CLIENT, "beneficial": Clients(0, PER_CLIENT.high)} if self.mode == "p2p" else {}
        out["query.lia"] = Disclosure(
            lengths_on(self.sends("lia"), "metrics", scores or {"lia-row": PER_CLIENT}),
            {
                "config": self.config_part(),
                "arrays": start,
                "lazy": self.model_part("every client's lazily trained whole model", count=PER_CLIENT),
                "lazy-clients": Part(
                    "the lazy models' client ids, and which one is its own",
                    entries={"client-ids": True, "self-index": True},
                    from_peers=True,
                    lengths={"client-ids": PER_CLIENT},
                ),
            },
            "which peers' data resemble its own",
        )
        return out

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        spec = super().reply_spec(phase, node_id)
        if phase in ("train", IDENTIFY):  # the planted group (simulation data only) comes with both
            return spec.with_metrics(**{"planted-cluster": Number(int, 0, INT_LIMIT, required=False)})
        if phase == "lazy":  # as a train reply: under DP without integer buffers
            return spec.with_records(arrays=Arrays.like(self.initial_state, self.released_keys()))
        if phase == "lia":
            n = len(self.lazy_clients)
            spec = spec.with_metrics(**{"lia-row": Numbers(float, -VALUE_LIMIT, VALUE_LIMIT, length=n)})
            if self.mode == "p2p":
                spec = spec.with_metrics(beneficial=Numbers(int, 0, max(n - 1, 0), max_length=n, distinct=True))
            return spec
        return spec

    def local_releases(self, server_round: int) -> int:
        """The clustering round releases the lazy model too (pFedLIA, not the Oracle)."""
        return 2 if not self.clustered and server_round > self.warmup and self.mode != "oracle" else 1

    def prepare_round(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        if not self.clustered and server_round > self.warmup:
            self.cluster(grid, server_round, nodes)
            if self.clustered:
                self.history[-1].extra["clustering"] = dict(self.clustering)
        elif self.clustered and self.mode == "oracle":
            self._assign_planted(grid, server_round, nodes)
        elif self.clustered:
            new = [n for n in nodes if self.client(n) not in self.assignment and self.client(n) not in self.sets]
            if new:
                self.join_late(grid, server_round, new)

    def identify(self, grid: Grid, server_round: int, nodes: list[int]) -> list[Reply]:
        replies = super().identify(grid, server_round, nodes)
        self._note_planted(replies)
        return replies

    def _note_planted(self, replies: list[Reply]) -> None:
        for r in replies:
            if "planted-cluster" in r.metrics:
                self.planted[r.client] = int(r.metrics["planted-cluster"])

    def _assign_planted(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        """Oracle: every connected client is in its planted group before it trains.  Nodes whose group the server
        has not learnt yet (from a train or identify reply) are asked for it (``query.identify``)."""
        unknown = [n for n in nodes if self.client(n) not in self.planted]
        if unknown:
            self._note_planted(self.send_query(grid, server_round, IDENTIFY, {n: RecordDict() for n in unknown}))
        self._join_planted_groups()

    def _join_planted_groups(self) -> None:
        """Oracle: every client whose planted group is known and that has no cluster joins its group (a group nobody
        was in yet starts from theta_0); a held-out client (``holdout-clients``) joins none."""
        for client, group in sorted(self.planted.items()):
            if client not in self.assignment and not self.holdout.held_out(client):
                self.assignment[client] = group
                self.cluster_models.setdefault(group, self.start_model())

    def start_model(self) -> dict[str, np.ndarray]:
        """theta_0: the warm-up's last global model, where every cluster and personal model starts (set by the
        clustering round, or restored by a resume)."""
        if self.theta0 is None:
            raise RuntimeError(
                "pFedLIA's theta_0 is read before the clustering round set it; it exists once the clustering round "
                "(the first after the warm-up rounds) has started or a resume has restored it"
            )
        return self.theta0

    # ------------------------------------------------------------------ aggregation
    def complete(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A reply's model with every key of the model: arrays a release leaves out under DP (integer buffers such
        as ``num_batches_tracked``) keep the initial model's values."""
        return {k: arrays[k] if k in arrays else np.array(self.initial_state[k]) for k in self.initial_state}

    def average(
        self, updates: list[Reply], reference: dict[str, np.ndarray] | None = None, group: str = "global"
    ) -> dict[str, np.ndarray]:
        """FedAvg of the replies' models, weighted by their training-set sizes; under local DP unweighted, so that
        the average is a post-processing of the releases alone (a size is not noised).  ``reference``: the model the
        server sent them (the run's aggregation rule, docs/robustness.md)."""
        local = self.settings.dp_mode == "local"
        weights = [1 if local else u.num_examples for u in updates]
        models, clients = [self.complete(u.arrays) for u in updates], [u.client for u in updates]
        return self.robust.average_models(models, weights, clients, reference, group)

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        self._note_planted(updates)
        self.releases = len(updates)
        if self.clustered and self.mode == "oracle":  # a client that gave its group only now joins it at once
            self._join_planted_groups()
        if not self.clustered:  # the base calls aggregate only with valid replies
            self.global_state = self.average(updates, self.global_state)
            return {}
        if self.mode == "p2p":
            trained = {u.client: u for u in updates}
            for client, members in self.sets.items():
                present = [trained[j] for j in members if j in trained]
                if present:
                    self.personal[client] = self.average(present, group=f"set of {client}")
            return {}
        for label in sorted({self.assignment[u.client] for u in updates if u.client in self.assignment}):
            in_cluster = [u for u in updates if self.assignment.get(u.client) == label]
            self.cluster_models[label] = self.average(in_cluster, self.cluster_models.get(label), f"cluster {label}")
        return {}

    def on_round_end(self, server_round: int) -> None:
        """Under local DP: every client's epsilon after this round, composed over one release per round and one
        per lazy query (also a round whose replies were all rejected: the clients released all the same)."""
        if self.settings.dp_mode == "local":
            self.history[-1].extra["dp"] = self.privacy.account_local(self.releases)
        self.releases = 0

    # ------------------------------------------------------------------ the clustering round
    def _lazy_models(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, dict[str, np.ndarray]]:
        payloads = {n: RecordDict({"arrays": to_record(self.start_model())}) for n in nodes}
        if payloads:  # every client asked releases its lazy model, whether or not its reply is admitted
            self.lazy_queries += 1
        return {r.client: self.complete(r.arrays) for r in self.send_query(grid, server_round, "lazy", payloads)}

    def _rows(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, tuple[np.ndarray, list[int]]]:
        """client -> (its influence row over the lazy models, its beneficial clients (p2p))."""
        if self.lazy_stacked is None:
            raise RuntimeError("pFedLIA scores influence rows before any lazy model was collected")
        lazy = to_record(self.lazy_stacked)
        base = to_record(self.start_model())
        payloads = {}
        for n in nodes:
            me = self.client(n)
            payloads[n] = RecordDict(
                {
                    "arrays": base,
                    "lazy": lazy,
                    "lazy-clients": ConfigRecord(
                        {
                            "client-ids": [int(c) for c in self.lazy_clients],
                            "self-index": self.lazy_clients.index(me) if me in self.lazy_clients else -1,
                        }
                    ),
                }
            )
        rows = {}
        for r in self.send_query(grid, server_round, "lia", payloads):
            beneficial = [self.lazy_clients[i] for i in r.metrics.get("beneficial", [])]
            rows[r.client] = (np.asarray(r.metrics["lia-row"], float), beneficial)
        return rows

    def cluster(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        start = time.monotonic()
        self.theta0 = {k: np.array(v) for k, v in self.global_state.items()}
        if self.mode == "oracle":
            self._assign_planted(grid, server_round, nodes)
            if not self.planted:
                raise ValueError(
                    "lia-mode 'oracle' needs planted clusters (partition 'planted-clusters*'); no client reported one"
                )
            # a client whose group is still unknown (it did not answer) joins it when it reports it (see aggregate)
        else:
            lazy = self._lazy_models(grid, server_round, nodes)
            if not lazy:
                log.warning(
                    "[pfedlia] round %d: no client answered the lazy-training query; the clustering round "
                    "moves to the next round (see failures.json)",
                    server_round,
                )
                return
            self.lazy_clients = sorted(lazy)
            self.lazy_stacked = stack_states([lazy[c] for c in self.lazy_clients], self.model_info.keys)
            lazy_nodes = [self.node_of[c] for c in self.lazy_clients]
            rows = self._rows(grid, server_round, lazy_nodes)
            scored = [c for c in self.lazy_clients if c in rows]
            if not scored:
                log.warning(
                    "[pfedlia] round %d: no client answered the influence query; the clustering round moves "
                    "to the next round (see failures.json)",
                    server_round,
                )
                self.lazy_clients, self.lazy_stacked = [], None
                return
            self.matrix = np.stack([rows[c][0] for c in scored])
            self.matrix_clients = scored
            if self.mode == "central":
                # OPTICS on the square part (clients that both trained a lazy model and scored)
                cols = [self.lazy_clients.index(c) for c in scored]
                o = self.options
                labels = cluster_influence(
                    self.matrix[:, cols],
                    o.optics_min_samples,
                    noise=o.noise,
                    score=o.score,
                    standardize=o.row_standardize,
                )
                self.assignment = {c: int(label) for c, label in zip(scored, labels, strict=True)}
            else:
                self.sets = {c: sorted(set(rows[c][1]) | {c}) for c in scored}
                self.assignment = groups_from_sets({c: frozenset(s) for c, s in self.sets.items()})
                self.personal = dict.fromkeys(scored, self.theta0)
            self.clustering["clients-asked"] = len(nodes)
        self.cluster_models = dict.fromkeys(set(self.assignment.values()), self.theta0)
        self.clustered = True
        comm = self.exchange.comm.get(server_round, {})
        self.clustering.update(
            {
                "round": server_round,
                "mode": self.mode,
                "seconds": time.monotonic() - start,
                "clusters": len(set(self.assignment.values())),
                "bytes-down-per-client": (comm.get("lazy-bytes-down", 0) + comm.get("lia-bytes-down", 0))
                / max(1, len(nodes)),
                "bytes-up-per-client": (comm.get("lazy-bytes-up", 0) + comm.get("lia-bytes-up", 0))
                / max(1, len(nodes)),
            }
        )
        truth = [self.planted.get(c) for c in self.assignment]
        if truth and all(t is not None for t in truth):
            self.clustering["ari"] = adjusted_rand(truth, list(self.assignment.values()))
            if self.mode == "p2p":
                planted_sets = {
                    c: {m for m in self.assignment if self.planted[m] == self.planted[c]} for c in self.sets
                }
                self.clustering["p2p-exact-fraction"] = float(
                    np.mean([set(self.sets[c]) == planted_sets[c] for c in self.sets])
                )
        log.info(
            "[pfedlia] clustering round %d (%s): %d clusters, ARI %s, %.1f s",
            server_round,
            self.mode,
            self.clustering["clusters"],
            self.clustering.get("ari"),
            self.clustering["seconds"],
        )

    def newcomer_payloads(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, RecordDict]:
        """What the late-joiner path (pfedlia.md §2.8) gives a newcomer, without making it a member: it scores the
        stored lazy models (``query.lia``) and gets the model of the cluster they point to (central), or the mean
        of its beneficial peers' models (peer-to-peer); the Oracle's newcomer gets its planted group's model.
        Before any clustering: the global model; a newcomer that names no cluster (its reply rejected, its group
        without members): theta_0."""
        if not self.clustered:
            return super().newcomer_payloads(grid, server_round, nodes)
        start = self.start_model()
        models = dict.fromkeys(nodes, start)
        if self.mode == "oracle":
            for n in nodes:
                client = self.client(n)
                group = self.planted.get(client) if client is not None else None  # reported when it identified
                models[n] = self.cluster_models.get(group, start) if group is not None else start
        elif self.lazy_stacked is not None:
            order = list(self.matrix_clients)
            labels = np.array([self.assignment[m] for m in order])
            rows = self._rows(grid, server_round, nodes)
            for n in nodes:
                if (client := self.client(n)) not in rows:
                    continue
                row, beneficial = rows[client]
                if self.mode == "p2p":
                    peers: list[Mapping[str, np.ndarray]] = [self.personal[c] for c in beneficial if c in self.personal]
                    models[n] = weighted_average(peers, [1] * len(peers)) if peers else start
                else:
                    cols = [self.lazy_clients.index(m) for m in order]
                    models[n] = self.cluster_models.get(assign_late_joiner(row[cols], labels), start)
        return {n: RecordDict({"arrays": to_record(models[n])}) for n in nodes}

    def join_late(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        """pfedlia.md §2.8: newcomers score the stored lazy models and join the best cluster (or their 2-means set)."""
        if self.lazy_stacked is None:
            return
        rows = self._rows(grid, server_round, nodes)
        order = list(self.matrix_clients)
        for c, (row, beneficial) in rows.items():
            if self.mode == "p2p":
                self.sets[c] = sorted(set(beneficial) | {c})
                self.personal[c] = self.start_model()
                self.assignment[c] = -1
            else:
                cols = [self.lazy_clients.index(m) for m in order]
                self.assignment[c] = assign_late_joiner(row[cols], np.array([self.assignment[m] for m in order]))

    # ------------------------------------------------------------------ outcome and artefacts
    def clustering_outcome(self) -> tuple[int, str]:
        """(clusters at the end, what a single cluster meant) for the run's summary."""
        if not self.clustered:
            return 1, "the run was FedAvg (no clustering round completed)"
        if self.mode == "p2p":  # identical beneficial sets share a model; one set for all is everyone's
            return (
                len({frozenset(s) for s in self.sets.values()}),
                "the run was FedAvg (every client's beneficial set is every client)",
            )
        found = "one planted group" if self.mode == "oracle" else "OPTICS put every client in one cluster"
        return len(set(self.assignment.values())), f"the run was FedAvg ({found})"


class OracleStrategy(PFedLIAStrategy):
    """Oracle baseline: the same warm-up and per-cluster FedAvg, clustered by the true planted groups."""

    default_mode = "oracle"
