"""PI-FL strategy (spec pifl §2): tiers, token "auctions", profiler and scheduler on Flower's Message API.

Per round r:
1. r = 1: free warm-up, a random tiering (nobody pays).  r >= 2: ``query.bid`` sends every available
   client the K tier models, its balance and the price; it replies its per-tier validation accuracies and
   a bid.  Bids are validated (unknown tier, non-integer, too many, a client that cannot pay, duplicate
   replies: rejected with a logged reason, no balance touched).  The Scheduler fills each tier's
   ``slots-performance`` + ``slots-random`` slots; winning bidders pay the slot price into the tier pool.
2. Winners train their tier's model; each tier is rebuilt by FedAvg; the Profiler scores every winner with
   the first-order Shapley estimate on the server's IID set (an assumption of the paper, spec §6.16).
3. Evaluation sends all K tier models to every client: it reports its tier accuracies (the utility of a
   tier is the mean over its winners) and the accuracy of its one-shot personalized mixture on its goal
   data, which never leaves it.  The Token Manager then settles every tier (refund, rank reward) and the
   ledger's conservation is asserted.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from strategies.tier_tables import TierTables
from strategies.base import ClientUpdate, PersonalizedStrategy, log, wait_for_nodes
from strategies.pifl_math import (
    MICRO, LedgerError, TokenLedger, random_tiering, rank_clients, schedule_tier, shapley_scores, validate_bid,
)
from task.data import load_centralized
from task.models import build_model
from task.params import load_record, to_record, weighted_average


class PIFLStrategy(PersonalizedStrategy):
    name = "pifl"
    has_global_model = False

    def __init__(self, settings, initial_state, body, head):
        super().__init__(settings, initial_state, body, head)
        g = settings.get
        self.num_tiers = int(g("tiers", 2))
        self.n_perf, self.n_rand = int(g("slots-performance", 4)), int(g("slots-random", 1))
        self.max_bids = int(g("max-bids", 1))
        if self.num_tiers < 1 or self.n_perf < 0 or self.n_rand < 0 or self.n_perf + self.n_rand < 1:
            raise ValueError("run-config keys 'tiers' >= 1 and 'slots-performance' + 'slots-random' >= 1 required")
        if self.max_bids != 1:
            raise ValueError("run-config key 'max-bids' must be 1 in this version (one tier per client and round)")
        self.initial_tokens = int(round(float(g("initial-tokens", 100)) * MICRO))
        self.price = int(round(float(g("slot-price", 1)) * MICRO))
        self.ledger_args = dict(price=self.price, max_refund=float(g("max-refund", 1.0)),
                                full_use_gain=float(g("full-use-gain", 0.1)))
        TokenLedger([], self.num_tiers, self.initial_tokens, **self.ledger_args)  # validates the values now
        self.ledger: TokenLedger | None = None
        self.tiers = {k: dict(self.global_state) for k in range(self.num_tiers)}
        self.scores: dict[int, dict[int, float]] = {k: {} for k in range(self.num_tiers)}
        self.counts: dict[int, dict[int, int]] = {k: {} for k in range(self.num_tiers)}
        self.winners: dict[int, list[int]] = {}
        self.payers: dict[int, list[int]] = {}
        self.tier_of: dict[int, int] = {}
        self.rng = random.Random(settings.seed)
        self.ledger_log: list[dict[str, Any]] = []
        self.source_share: dict[int, float] = {}
        self._server_set: tuple[torch.Tensor, torch.Tensor] | None = None
        self._tier_acc: dict[int, list[float]] = {}
        self.tier_tables = TierTables()
        self._model = build_model(settings.model, settings.in_channels, settings.image_size, settings.num_classes)

    # ------------------------------------------------------------------ round start: bids and schedule
    def configure_train(self, server_round: int, arrays, config, grid: Grid):
        nodes = wait_for_nodes(grid, self.settings.min_nodes)
        if self.ledger is None:
            self.ledger = TokenLedger(nodes, self.num_tiers, self.initial_tokens, **self.ledger_args)
        for n in nodes:
            if n not in self.ledger.balances:
                self.ledger.add_client(n, self.initial_tokens)
        slots = self.n_perf + self.n_rand
        if server_round == 1:
            self.winners = random_tiering(nodes, self.num_tiers, slots, self.rng)
            self.payers = {k: [] for k in range(self.num_tiers)}
        else:
            bids = self.collect_bids(grid, server_round, nodes)
            available = sorted(bids)
            self.winners, self.payers = {}, {}
            for k in range(self.num_tiers):
                bidders = [c for c in available if k in bids[c] and self.ledger.can_pay(c)]
                self.winners[k], self.payers[k] = schedule_tier(bidders, available, self.scores[k], self.counts[k],
                                                                self.n_perf, self.n_rand, self.rng)
                # a client wins at most one tier per round (max-bids 1): drafted clients already placed are dropped
                self.winners[k] = [c for c in self.winners[k] if all(c not in self.winners[j] for j in range(k))]
                self.payers[k] = [c for c in self.payers[k] if c in self.winners[k]]
        for k in range(self.num_tiers):
            self.ledger.charge(k, self.payers[k])
            for c in self.winners[k]:
                self.counts[k][c] = self.counts[k].get(c, 0) + 1
        self.tier_of = {c: k for k, cs in self.winners.items() for c in cs}
        msgs = super().configure_train(server_round, arrays, config, grid)
        return [m for m in msgs if m.metadata.dst_node_id in self.tier_of]

    def sample(self, grid: Grid, server_round: int) -> list[int]:
        return sorted(self.tier_of)

    def collect_bids(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, list[int]]:
        stacked = to_record({k: np.stack([self.tiers[t][k] for t in range(self.num_tiers)]) for k in self.all_keys})
        payloads = {n: RecordDict({"tiers": stacked, "ledger": ConfigRecord({
            "balance": self.ledger.balances[n], "price": self.price})}) for n in nodes}
        bids: dict[int, list[int]] = {}
        for r in self.send_query(grid, server_round, "bid", payloads):
            nid = r.metadata.src_node_id
            if nid in bids:
                self.record_failure(server_round, nid, "bid", "duplicate reply from the same node")
                continue
            metrics = dict(r.content.metric_records["metrics"]) if "metrics" in r.content.metric_records else {}
            try:
                bid = validate_bid(metrics.get("bid"), self.num_tiers, self.max_bids)
                if bid and not self.ledger.can_pay(nid):
                    raise LedgerError(f"balance {self.ledger.balances[nid]} cannot pay the price {self.price}")
            except LedgerError as err:
                self.record_failure(server_round, nid, "bid", str(err))
                bids[nid] = []  # still available for drafting, never charged
                continue
            bids[nid] = bid
        return bids

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        tier = self.tier_of[node_id]
        return RecordDict({"arrays": to_record(self.tiers[tier]), "tier": ConfigRecord({"tier": tier})})

    def evaluate_payload(self, node_id: int, server_round: int) -> RecordDict:
        stacked = to_record({k: np.stack([self.tiers[t][k] for t in range(self.num_tiers)]) for k in self.all_keys})
        return RecordDict({"tiers": stacked})

    # ------------------------------------------------------------------ aggregation and profiling
    def server_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._server_set is None:
            data = load_centralized(self.settings.data.dataset, self.settings.data.data_dir, self.settings.data.noise_std)
            idx = np.random.default_rng(12_345).permutation(len(data.y))[: int(self.settings.get("server-set-size", 500))]
            self._server_set = torch.from_numpy(data.x[idx]), torch.from_numpy(data.y[idx])
        return self._server_set

    def mean_gradient(self, state: dict[str, np.ndarray]) -> np.ndarray:
        load_record(self._model, state)
        self._model.eval()
        self._model.zero_grad()
        x, y = self.server_set()
        torch.nn.functional.cross_entropy(self._model(x), y).backward()
        return np.concatenate([p.grad.numpy().ravel() if p.grad is not None else np.zeros(p.numel())
                               for _, p in self._model.named_parameters()])

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Any]:
        params = [n for n, _ in self._model.named_parameters()]
        for u in updates:
            if "source-a-share" in u.metrics:
                self.source_share[u.node_id] = float(u.metrics["source-a-share"])
        for k in range(self.num_tiers):
            group = [u for u in updates if self.tier_of.get(u.node_id) == k]
            if not group:
                continue
            weights = np.array([u.num_examples for u in group], float)
            self.tiers[k] = weighted_average([u.arrays for u in group], weights)
            grad = self.mean_gradient(self.tiers[k])
            flat = lambda s: np.concatenate([np.asarray(s[p], float).ravel() for p in params])  # noqa: E731
            psi = shapley_scores(grad, np.stack([flat(u.arrays) for u in group]), flat(self.tiers[k]), weights / weights.sum())
            for u, score in zip(group, psi):
                self.scores[k][u.node_id] = float(score)
        return {"pifl": {"tier-sizes": {k: len(v) for k, v in self.winners.items()}}}

    # ------------------------------------------------------------------ settlement after evaluation
    def on_round_end(self, server_round: int) -> None:
        tier_acc: dict[int, list[float]] = {k: [] for k in range(self.num_tiers)}
        for node, k in self.tier_of.items():
            pid = self.node_partition.get(node, node)
            accs = self._tier_acc.get(pid)
            if accs is not None and len(accs) == self.num_tiers:
                tier_acc[k].append(accs[k])
        entry: dict[str, Any] = {"round": server_round, "tiers": {}}
        pid = lambda n: self.node_partition.get(n, n)  # noqa: E731
        for k in range(self.num_tiers):
            utility = float(np.mean(tier_acc[k])) if tier_acc[k] else None
            ranked = rank_clients(self.winners.get(k, []), self.scores[k], self.counts[k])
            if self.payers.get(k) or server_round > 1:
                s = self.ledger.settle(k, self.payers.get(k, []), ranked, utility)
            else:  # round 1: free warm-up, only the utility is recorded
                self.ledger.best_utility[k] = utility
                s = None
            shares = [self.source_share.get(c) for c in self.winners.get(k, [])]
            shares = [x for x in shares if x is not None]
            entry["tiers"][k] = {
                "members": [pid(c) for c in self.winners.get(k, [])], "payers": [pid(c) for c in self.payers.get(k, [])],
                "utility": utility, "pool": self.ledger.pools[k],
                "payments": {pid(c): self.price for c in self.payers.get(k, [])},
                "refunds": {pid(c): v for c, v in (s.refunds.items() if s else [])},
                "rewards": {pid(c): v for c, v in (s.rewards.items() if s else [])},
                "source-a-share": float(np.mean(shares)) if shares else None,
            }
        self.ledger.check()  # conservation asserted every round
        table = self.tier_tables.record(self, server_round, [self.tiers[k] for k in range(self.num_tiers)])
        if table:  # accuracy of each tier model on the source A / B holdouts (paper Tables 1-2)
            entry["tier-table"] = table
        entry["balances"] = {pid(c): b for c, b in self.ledger.balances.items()}
        entry["total"] = self.ledger.total()
        self.ledger_log.append(entry)

    def aggregate_evaluate(self, server_round: int, replies):
        replies = list(replies)
        self._tier_acc = {}
        for r in replies:
            if not r.has_error() and "metrics" in r.content.metric_records:
                m = dict(r.content.metric_records["metrics"])
                if isinstance(m.get("tier-acc"), list):
                    self._tier_acc[int(m.get("partition-id", -1))] = [float(v) for v in m["tier-acc"]]
        return super().aggregate_evaluate(server_round, replies)

    # ------------------------------------------------------------------ artefacts
    def write_artifacts(self, folder: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        (folder / "pifl_ledger.json").write_text(json.dumps({"micro-tokens-per-token": MICRO, "rounds": self.ledger_log}, indent=1))
        if not self.ledger_log:
            return
        rounds = [e["round"] for e in self.ledger_log]
        clients = sorted(self.ledger_log[-1]["balances"])
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for c in clients:
            ax1.plot(rounds, [e["balances"].get(c, np.nan) / MICRO for e in self.ledger_log], lw=0.8)
        ax1.set_title("token balance per client")
        ax1.set_xlabel("round")
        ax1.set_ylabel("tokens")
        for k in range(self.num_tiers):
            ys = [e["tiers"][k]["source-a-share"] for e in self.ledger_log]
            ax2.plot(rounds, [np.nan if y is None else y for y in ys], marker="o", label=f"tier {k}")
        ax2.set_ylim(0, 1)
        ax2.set_title("tier membership: mean share of source A")
        ax2.set_xlabel("round")
        ax2.legend()
        fig.tight_layout()
        fig.savefig(folder / "pifl_ledger.png", dpi=100)
        plt.close(fig)


class PIFLNoIncentiveStrategy(PIFLStrategy):
    """PI-FL(NI) ablation (spec pifl §2.2): the same system, but every client bids for a random tier."""

    name = "pifl-ni"
