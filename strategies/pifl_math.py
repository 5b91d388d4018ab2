"""PI-FL's server parts as pure code (pifl.md §2.3-§2.5): token ledger, Shapley profiler, scheduler.

No Flower.  Tokens are integers in micro-tokens (1 token = 10**6 units) so conservation holds exactly:
``sum(balances) + sum(pools) == initial supply`` after every operation, which :meth:`TokenLedger.check`
asserts.  Bad input (unknown tier, non-integer or negative amounts, an empty balance, a duplicate reply)
is rejected with a reason and changes nothing.

See docs/methods/pifl.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from task.methods.pifl import MICRO


class LedgerError(ValueError):
    """A rejected ledger operation; the message says why. Nothing was changed."""


@dataclass
class Settlement:
    """What happened to one tier's pool in one round (pifl.md §2.4 steps 1-4), in micro-tokens."""

    tier: int
    payments: dict[int, int] = field(default_factory=dict)
    refunds: dict[int, int] = field(default_factory=dict)
    rewards: dict[int, int] = field(default_factory=dict)
    utility_gain: float = 0.0
    refund_ratio: float = 0.0
    pool_after: int = 0


class TokenLedger:
    """Integer balances per client and one pool per tier.

    ``price`` is the flat slot price tau_p, ``max_refund`` eta_R, ``full_use_gain`` gamma (pifl.md §3).
    """

    def __init__(
        self,
        clients: Iterable[int],
        num_tiers: int,
        initial: int = 100 * MICRO,
        price: int = MICRO,
        max_refund: float = 1.0,
        full_use_gain: float = 0.1,
    ) -> None:
        for name, value in (("initial", initial), ("price", price)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise LedgerError(f"{name} must be a non-negative integer number of micro-tokens, got {value!r}")
        if price == 0:
            raise LedgerError("price must be > 0")
        if not 0.0 <= max_refund <= 1.0 or not 0.0 < full_use_gain <= 1.0:
            raise LedgerError("max-refund must be in [0, 1] and full-use-gain in (0, 1]")
        self.balances: dict[int, int] = {int(c): int(initial) for c in clients}
        self.pools: dict[int, int] = dict.fromkeys(range(num_tiers), 0)
        self.price, self.max_refund, self.full_use_gain = int(price), float(max_refund), float(full_use_gain)
        self.supply = int(initial) * len(self.balances)
        self.best_utility: dict[int, float | None] = dict.fromkeys(range(num_tiers))

    # ------------------------------------------------------------------ invariants
    def total(self) -> int:
        return sum(self.balances.values()) + sum(self.pools.values())

    def check(self) -> None:
        """Conservation and non-negativity; raises AssertionError on a violation (asserted every round)."""
        assert self.total() == self.supply, f"tokens not conserved: {self.total()} != {self.supply}"
        assert min(self.balances.values(), default=0) >= 0, "negative balance"
        assert min(self.pools.values(), default=0) >= 0, "negative pool"

    def add_client(self, client: int, initial: int) -> None:
        """A late joiner brings its own initial tokens (the supply grows by exactly that)."""
        if client in self.balances:
            raise LedgerError(f"client {client} is already in the ledger")
        self.balances[int(client)] = int(initial)
        self.supply += int(initial)

    def can_pay(self, client: int) -> bool:
        return self.balances.get(client, 0) >= self.price

    # ------------------------------------------------------------------ one tier, one round
    def _tier(self, tier: object) -> int:
        if isinstance(tier, bool) or not isinstance(tier, (int, np.integer)) or int(tier) not in self.pools:
            raise LedgerError(f"unknown tier {tier!r}; tiers are {sorted(self.pools)}")
        return int(tier)

    def charge(self, tier: int | np.integer, payers: Iterable[int]) -> dict[int, int]:
        """Step 1 (Eqs. 6-7): every payer pays the flat price into the tier's pool; all-or-nothing."""
        tier = self._tier(tier)
        payers = list(payers)
        if len(set(payers)) != len(payers):
            raise LedgerError("a client appears twice among the payers")
        for c in payers:
            if c not in self.balances:
                raise LedgerError(f"unknown client {c}")
            if self.balances[c] < self.price:
                raise LedgerError(f"client {c} cannot pay {self.price} (balance {self.balances[c]})")
        for c in payers:
            self.balances[c] -= self.price
            self.pools[tier] += self.price
        return dict.fromkeys(payers, self.price)

    def settle(self, tier: int | np.integer, payers: list[int], ranked: list[int], utility: float | None) -> Settlement:
        """Steps 2-4: utility gain, refund to the payers, then the pool by contribution rank.

        ``payers`` are the clients to refund and ``ranked`` the clients to reward, best first (the Profiler's
        order); the caller leaves out winners whose training failed this round, so their payment stays in the
        pool.  ``utility`` is the tier's new accuracy (None: not measured this round).  Where the relative
        gain of Eq. 8 is undefined - no earlier best (a tier's first settled round), no utility this round, or
        an earlier best of 0 - the refund ratio is 0 and the whole pool goes out by rank (pifl.md §2.4 step 2).
        Eq. 13 uses beta = n(n+1)/2 with n = len(ranked) so the rank shares sum to one (the printed N_r would
        create tokens); Eq. 11 is a refund (the printed form destroys tokens).  Rounding dust stays in the pool.
        """
        tier = self._tier(tier)
        out = Settlement(tier)
        best = self.best_utility[tier]
        if best is None or utility is None or best <= 0:
            gain, ratio = 0.0, 0.0
        else:
            gain = max(0.0, (utility - best) / best)
            ratio = self.max_refund * (self.full_use_gain - min(self.full_use_gain, gain)) / self.full_use_gain
        out.utility_gain, out.refund_ratio = gain, ratio
        if payers:
            refund_total = min(
                self.pools[tier], int(np.floor(ratio * self.pools[tier] + 1e-6))
            )  # float slack, never above the pool
            share = refund_total // len(payers)
            for c in payers:
                self.balances[c] += share
                self.pools[tier] -= share
                out.refunds[c] = share
        n = len(ranked)
        if n:
            pool = self.pools[tier]
            beta = n * (n + 1) // 2
            for pos, c in enumerate(ranked):
                amount = ((n - pos) * pool) // beta
                self.balances[c] += amount
                self.pools[tier] -= amount
                out.rewards[c] = amount
        if utility is not None:
            self.best_utility[tier] = utility if best is None else max(best, utility)
        out.pool_after = self.pools[tier]
        return out


# ------------------------------------------------------------------ profiler
def shapley_scores(
    server_gradient: np.ndarray, updates: np.ndarray, aggregate: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """App. A normalised first-order Shapley estimate: ``psi_i = -g^T lambda_i (W_i - W_M)``.

    ``server_gradient`` g is the mean loss gradient at the new aggregate W_M on the IID server set;
    ``updates`` the participants' flattened models (n x d), ``weights`` the aggregation weights lambda.
    The scores of one tier sum to zero: only their ranks are used (Eq. 12).
    """
    lam = np.asarray(weights, float)
    return -(lam[:, None] * (np.asarray(updates, float) - np.asarray(aggregate, float)[None, :])) @ np.asarray(
        server_gradient, float
    )


def rank_clients(clients: Iterable[int], scores: Mapping[int, float], counts: Mapping[int, int]) -> list[int]:
    """Best first by (score desc, participation count desc, id asc); unscored clients rank last (pifl.md §2.3)."""
    return sorted(clients, key=lambda c: (-(scores.get(c, -np.inf)), -counts.get(c, 0), c))


# ------------------------------------------------------------------ scheduler
def schedule_tier(
    bidders: list[int],
    scores: Mapping[int, float],
    counts: Mapping[int, int],
    n_perf: int,
    n_rand: int,
    rng: random.Random,
) -> list[int]:
    """pifl.md §2.5 for one tier with bidders: the winners (who all pay).

    The best ``n_perf`` bidders by (psi, Omega, id) plus ``n_rand`` drawn at random from the remaining
    bidders; all bidders when there are fewer than n_perf + n_rand.
    """
    if len(bidders) <= n_perf + n_rand:
        return sorted(bidders)
    ranked = rank_clients(bidders, scores, counts)
    top = ranked[:n_perf]
    rest = sorted(set(bidders) - set(top))
    return sorted(top + rng.sample(rest, min(n_rand, len(rest))))


def schedule(
    bids: Mapping[int, list[int]],
    num_tiers: int,
    scores: Mapping[int, Mapping[int, float]],
    counts: Mapping[int, Mapping[int, int]],
    n_perf: int,
    n_rand: int,
    rng: random.Random,
) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """pifl.md §2.5 for one round (r >= 2): (winners, payers) per tier from every available client's bid.

    ``bids`` maps each available client to the tiers it bid for (empty: no bid).  A bidder is only ever
    placed in a tier it bid for, and a tier with bidders gets min(slots, bidders) of them (they pay).  A tier
    nobody bid for drafts n_perf + n_rand clients at random from the clients that bid for no tier at all and
    were not drafted elsewhere; drafted clients pay nothing.
    """
    slots = n_perf + n_rand
    winners: dict[int, list[int]] = {}
    payers: dict[int, list[int]] = {}
    for k in range(num_tiers):
        bidders = sorted(c for c, tiers in bids.items() if k in tiers)
        if bidders:
            winners[k] = schedule_tier(bidders, scores.get(k, {}), counts.get(k, {}), n_perf, n_rand, rng)
            payers[k] = list(winners[k])
    draft_pool = sorted(c for c, tiers in bids.items() if not tiers)
    for k in range(num_tiers):
        if k not in winners:
            winners[k] = sorted(rng.sample(draft_pool, min(slots, len(draft_pool))))
            payers[k] = []
            draft_pool = [c for c in draft_pool if c not in winners[k]]
    return winners, payers


def random_tiering(clients: list[int], num_tiers: int, n_per_tier: int, rng: random.Random) -> dict[int, list[int]]:
    """Round 1 (free warm-up): a random partition into tiers, then up to ``n_per_tier`` clients from each."""
    order = sorted(clients)
    rng.shuffle(order)
    groups = {k: sorted(order[k::num_tiers]) for k in range(num_tiers)}
    return {k: sorted(rng.sample(g, min(n_per_tier, len(g)))) for k, g in groups.items()}
