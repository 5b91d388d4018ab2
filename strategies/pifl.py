"""PI-FL strategy (pifl.md §2): tiers, token "auctions", profiler and scheduler on Flower's Message API.

Per round r:
1. r = 1: free warm-up, a random tiering (nobody pays).  r >= 2: ``query.bid`` sends every available
   client the K tier models, its balance and the price; it replies its per-tier validation accuracies and
   a bid.  Bids are validated (unknown tier, non-integer, too many, a client that cannot pay, duplicate
   replies: rejected with a logged reason, no balance touched, and that client sits the round out).  The
   Scheduler fills each tier's ``slots-performance`` + ``slots-random`` slots from its bidders only; a tier
   nobody bid for drafts clients that bid for nothing (they pay nothing).  Winning bidders pay the slot
   price into the tier pool.
2. Winners train their tier's model; each tier is rebuilt by FedAvg; the Profiler scores every winner with
   the first-order Shapley estimate on the server's IID set (an assumption of the paper, pifl.md §6.16).
3. Evaluation sends all K tier models to every client: it reports its tier accuracies (the utility of a
   tier is the mean over its winners) and the accuracy of its one-shot personalized mixture on its goal
   data, which never leaves it.  The Token Manager then settles every tier (refund, rank reward) among the
   winners whose training arrived this round (a winner whose train reply failed has paid and gets nothing
   back); where the utility gain is undefined (no earlier best, or a round without evaluation) the refund
   ratio is 0.  The ledger's conservation is asserted every round.

See docs/methods/pifl.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from strategies.api import ACCURACY as SHARE
from strategies.api import Dim, Disclosure, Number, Numbers, Part, PersonalizedStrategy, Reply, ReplySpec, lengths_on
from strategies.pifl_math import TokenLedger, random_tiering, rank_clients, schedule, shapley_scores
from strategies.tier_tables import TierTables
from task.data import load_centralized
from task.methods.pifl import MICRO, PIFLOptions
from task.models import build_model
from task.params import load_record, stacked_record, to_record

log = logging.getLogger("flwr.pflower")
#: the ``ledger`` record of a bid message
LEDGER = {"balance": True, "price": True}


class PIFLStrategy(PersonalizedStrategy):
    options: PIFLOptions  # the run-config keys of this method, typed

    has_global_model = False
    evaluate_in_train = False  # every client scores every tier after the round; only winners train
    #: sent, not read: with a bid each tier's accuracy on the validation split (the bid's reasons); with an
    #: evaluation each tier's accuracy on the goal split and the weights of the personalized mixture
    unread_metrics: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "bid": ("tier-acc",),
        "evaluate": ("tier-goal-acc", "mixture-weights"),
    }

    def __init__(self, settings, initial_state, model_info):
        super().__init__(settings, initial_state, model_info)
        o = self.options
        self.num_tiers, self.n_perf, self.n_rand, self.max_bids = (
            o.tiers,
            o.slots_performance,
            o.slots_random,
            o.max_bids,
        )
        self.initial_tokens = round(o.initial_tokens * MICRO)
        self.price = round(o.slot_price * MICRO)
        self.ledger_args: dict[str, Any] = {
            "price": self.price,
            "max_refund": o.max_refund,
            "full_use_gain": o.full_use_gain,
        }
        TokenLedger([], self.num_tiers, self.initial_tokens, **self.ledger_args)  # validates the values now
        self.ledger: TokenLedger | None = None  # opened when the first round starts (or restored)
        self.tiers = {k: {key: np.array(v) for key, v in self.initial_state.items()} for k in range(self.num_tiers)}
        # everything per client is keyed by client id (partition id)
        self.scores: dict[int, dict[int, float]] = {k: {} for k in range(self.num_tiers)}  # tier -> client -> psi
        self.counts: dict[int, dict[int, int]] = {k: {} for k in range(self.num_tiers)}  # tier -> client -> Omega
        self.winners: dict[int, list[int]] = {}  # tier -> clients that train it this round
        self.payers: dict[int, list[int]] = {}  # tier -> winners that bid (and paid)
        self.tier_of: dict[int, int] = {}  # client -> its tier this round
        self.delivered: set[int] = set()  # winners whose train reply was valid this round
        self.ledger_log: list[dict[str, Any]] = []
        self.source_share: dict[int, float] = {}
        self._server_set: tuple[torch.Tensor, torch.Tensor] | None = None
        self._tier_acc: dict[int, list[float]] = {}  # client -> its tier accuracies of this round's evaluation
        self.tier_tables = TierTables()
        # the network the Profiler computes the server-set gradient with (built on first use)
        self._model: torch.nn.Module | None = None
        self._no_auction_for: int | None = None  # the client count last reported as too small for an auction

    def state(self) -> dict[str, Any]:
        """The tier models, the ledger, the Profiler's scores and counts, the logs the artefacts show.  The
        round's winners, payers and tiers are drawn again at the start of every round."""
        ledger = self.ledger
        return {
            "tiers": self.tiers,
            "ledger": None
            if ledger is None
            else {
                "balances": ledger.balances,
                "pools": ledger.pools,
                "supply": ledger.supply,
                "best-utility": ledger.best_utility,
            },
            "scores": self.scores,
            "counts": self.counts,
            "source-share": self.source_share,
            "ledger-log": self.ledger_log,
            "tier-tables": self.tier_tables.by_round,
        }

    def restore(self, state) -> None:
        self.tiers, self.scores, self.counts = state["tiers"], state["scores"], state["counts"]
        self.source_share, self.ledger_log = state["source-share"], state["ledger-log"]
        self.tier_tables.by_round = state["tier-tables"]
        if state["ledger"] is not None:
            self.ledger = TokenLedger([], self.num_tiers, self.initial_tokens, **self.ledger_args)
            self.ledger.balances, self.ledger.pools = state["ledger"]["balances"], state["ledger"]["pools"]
            self.ledger.supply, self.ledger.best_utility = state["ledger"]["supply"], state["ledger"]["best-utility"]

    # ------------------------------------------------------------------ round start: bids and schedule
    def wants_client_ids(self, server_round: int, nodes: list[int]) -> bool:
        return True  # tiers and scores are per client

    def prepare_round(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        clients = sorted(self.client_of[n] for n in nodes if n in self.client_of)
        if self.ledger is None:
            self.ledger = TokenLedger(clients, self.num_tiers, self.initial_tokens, **self.ledger_args)
        for c in clients:
            if c not in self.ledger.balances:
                self.ledger.add_client(c, self.initial_tokens)
        if server_round == 1:
            self.winners = random_tiering(clients, self.num_tiers, self.n_perf + self.n_rand, self.rng)
            self.payers = {k: [] for k in range(self.num_tiers)}
        else:
            self.warn_if_no_auction(len(clients))
            bids = self.collect_bids(grid, server_round, [n for n in nodes if n in self.client_of])
            self.winners, self.payers = schedule(
                bids, self.num_tiers, self.scores, self.counts, self.n_perf, self.n_rand, self.rng
            )
        for k in range(self.num_tiers):
            self.ledger.charge(k, self.payers[k])
            for c in self.winners[k]:
                self.counts[k][c] = self.counts[k].get(c, 0) + 1
        self.tier_of = {c: k for k, cs in self.winners.items() for c in cs}
        self.delivered = set()

    def warn_if_no_auction(self, clients: int) -> None:
        """Report once per client count when one tier's slots hold every connected client (every bidder wins)."""
        problems = self.options.client_conflicts(clients)
        if problems and self._no_auction_for != clients:
            log.warning("[pifl] %s", "; ".join(problems))
        self._no_auction_for = clients if problems else None

    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        return self.by_client(self.node_of[c] for c in self.tier_of)

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        return {f"tier-{k}": self.tiers[k] for k in range(self.num_tiers)}

    def disclosure(self) -> dict[str, Disclosure]:
        """``query.bid``: every tier model (FedAvg of its winners) and the client's token balance and the price
        go out; its bid comes back.  Train: the model of the tier it won goes out, its trained model comes back.
        Evaluate: every tier model goes out; each one's accuracy on its validation split comes back."""
        out = super().disclosure()
        tiers = self.model_part("every tier's model: the average of the tier's winners", count=self.num_tiers)
        config = {"config": self.config_part()}
        per_tier = dict.fromkeys(("tier-acc", "tier-goal-acc", "mixture-weights"), self.num_tiers)
        bid: dict[str, int | Dim] = {
            "bid": Dim(0, self.max_bids),
            "tier-acc": self.num_tiers,
        }  # a client that cannot pay bids for none
        out["query.bid"] = Disclosure(
            lengths_on(self.sends("bid"), "metrics", bid),
            {**config, "tiers": tiers, "ledger": Part("its token balance and the slot price", entries=LEDGER)},
            "which tiers its data is worth paying for",
        )
        out["train"] = Disclosure(
            lengths_on(self.sends("train", {"arrays": "its trained tier model"}), "evaluation", per_tier),
            {
                **config,
                "arrays": self.model_part("the model of the tier it won"),
                "tier": Part("the tier it won", entries={"tier": True}),
            },
            "how its data moved the tier model",
        )
        out["evaluate"] = Disclosure(
            lengths_on(self.sends("evaluate"), "metrics", per_tier),
            {**config, "tiers": tiers},
            "every tier's fit to its data",
        )
        return out

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        spec = super().reply_spec(phase, node_id)
        if phase == "bid":  # a client that cannot pay the price must not bid
            client = self.client(node_id)
            can_pay = self.ledger is not None and client is not None and self.ledger.can_pay(client)
            return spec.with_metrics(
                bid=Numbers(int, 0, self.num_tiers - 1, max_length=self.max_bids if can_pay else 0, distinct=True)
            )
        if phase == "evaluate":  # each tier model's accuracy on the client's validation split: the tiers' utility
            evaluated: dict[str, Number | Numbers] = {
                "tier-acc": Numbers(float, 0.0, 1.0, length=self.num_tiers),
                "source-a-share": replace(SHARE, required=False),
            }
            return spec.with_metrics(**evaluated)
        if phase == "train":
            return spec.with_metrics(**{"source-a-share": replace(SHARE, required=False)})
        return spec

    def open_ledger(self) -> TokenLedger:
        """The ledger, once the first round opened it (or a resume restored it)."""
        if self.ledger is None:
            raise RuntimeError(
                "PI-FL's token ledger is used before the first round opened it; it exists once round 1 has started "
                "(prepare_round) or a resume has restored it"
            )
        return self.ledger

    def collect_bids(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, list[int]]:
        """Every client's bid (client id -> tiers); clients whose reply was rejected are not available."""
        stacked = self.stacked_tiers()
        ledger = self.open_ledger()
        payloads = {
            n: RecordDict(
                {
                    "tiers": stacked,
                    "ledger": ConfigRecord({"balance": ledger.balances[self.client_of[n]], "price": self.price}),
                }
            )
            for n in nodes
        }
        return {r.client: r.metrics["bid"] for r in self.send_query(grid, server_round, "bid", payloads)}

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        """Train: the model of the tier the client won; evaluate: every tier model (it scores each and mixes
        its personalized model from them)."""
        if phase == "evaluate":
            return RecordDict({"tiers": self.stacked_tiers()})
        tier = self.tier_of[self.client_of[node_id]]
        return RecordDict({"arrays": to_record(self.tiers[tier]), "tier": ConfigRecord({"tier": tier})})

    def stacked_tiers(self):
        return stacked_record([self.tiers[t] for t in range(self.num_tiers)], self.model_info.keys)

    # ------------------------------------------------------------------ aggregation and profiling
    def server_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._server_set is None:
            d = self.settings.data
            data = load_centralized(d.dataset, d.data_dir, d.noise_std, samples=d.mnist1d_samples)
            idx = np.random.default_rng(12_345).permutation(len(data.y))[: self.options.server_set_size]
            self._server_set = torch.from_numpy(data.x[idx]), torch.from_numpy(data.y[idx])
        return self._server_set

    def mean_gradient(self, state: dict[str, np.ndarray]) -> np.ndarray:
        s = self.settings
        if self._model is None:
            self._model = build_model(s.model, s.in_channels, s.image_size, s.num_classes)
        load_record(self._model, state)
        self._model.eval()
        self._model.zero_grad()
        x, y = self.server_set()
        torch.nn.functional.cross_entropy(self._model(x), y).backward()
        return np.concatenate(
            [
                p.grad.numpy().ravel() if p.grad is not None else np.zeros(p.numel())
                for _, p in self._model.named_parameters()
            ]
        )

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        params = self.model_info.parameter_keys
        updates = [u for u in updates if u.client in self.tier_of]  # only this round's winners train
        for u in updates:
            if "source-a-share" in u.metrics:
                self.source_share[u.client] = float(u.metrics["source-a-share"])
        self.delivered = {u.client for u in updates}
        for k in range(self.num_tiers):
            group = [u for u in updates if self.tier_of[u.client] == k]
            if not group:
                continue
            weights = np.array([u.num_examples for u in group], float)
            self.tiers[k] = self.robust.average_models(
                [u.arrays for u in group], weights, [u.client for u in group], self.tiers[k], f"tier {k}"
            )
            grad = self.mean_gradient(self.tiers[k])

            def flat(s):
                return np.concatenate([np.asarray(s[p], float).ravel() for p in params])

            psi = shapley_scores(
                grad, np.stack([flat(u.arrays) for u in group]), flat(self.tiers[k]), weights / weights.sum()
            )
            for u, score in zip(group, psi, strict=True):
                self.scores[k][u.client] = float(score)
        return {"pifl": {"tier-sizes": {k: len(v) for k, v in self.winners.items()}}}

    # ------------------------------------------------------------------ settlement after evaluation
    def on_evaluated(self, server_round: int, replies: list[Reply]) -> None:
        self._tier_acc = {r.client: r.metrics["tier-acc"] for r in replies}

    def on_round_end(self, server_round: int) -> None:
        """Settle every tier (pifl.md §2.4): only winners whose training arrived this round are refunded and ranked,
        on this round's scores; the utility is the mean of their own tier accuracies."""
        entry: dict[str, Any] = {"round": server_round, "tiers": {}}
        ledger = self.open_ledger()
        for k in range(self.num_tiers):
            members = [c for c in self.winners.get(k, []) if c in self.delivered]
            accs = [self._tier_acc[c][k] for c in members if c in self._tier_acc]
            utility = float(np.mean(accs)) if accs else None
            ranked = rank_clients(members, self.scores[k], self.counts[k])
            payers = [c for c in self.payers.get(k, []) if c in self.delivered]
            if self.payers.get(k) or server_round > 1:
                s = ledger.settle(k, payers, ranked, utility)
            else:  # round 1: free warm-up, only the utility is recorded
                ledger.best_utility[k] = utility
                s = None
            shares = [x for x in (self.source_share.get(c) for c in members) if x is not None]
            entry["tiers"][k] = {
                "members": list(self.winners.get(k, [])),
                "payers": list(self.payers.get(k, [])),
                "delivered": members,
                "utility": utility,
                "pool": ledger.pools[k],
                "refund-ratio": s.refund_ratio if s else None,
                "payments": dict.fromkeys(self.payers.get(k, []), self.price),
                "refunds": dict(s.refunds) if s else {},
                "rewards": dict(s.rewards) if s else {},
                "source-a-share": float(np.mean(shares)) if shares else None,
            }
        ledger.check()  # conservation asserted every round
        table = self.tier_tables.record(self, server_round, [self.tiers[k] for k in range(self.num_tiers)])
        if table:  # accuracy of each tier model on the source A / B holdouts (paper Tables 1-2)
            entry["tier-table"] = table
        entry["balances"] = dict(ledger.balances)
        entry["total"] = ledger.total()
        self.ledger_log.append(entry)
        self._tier_acc = {}
