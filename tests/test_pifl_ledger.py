"""PI-FL token economy (spec pifl §2.4-§2.5): conservation under random play, and hostile input rejected."""

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strategies.pifl_math import (
    MICRO, LedgerError, TokenLedger, bid_policy, mixture_weights, random_tiering, rank_clients, schedule_tier,
    shapley_scores, validate_bid,
)


def play_round(ledger, bids, utilities, scores, counts, rng, n_perf, n_rand, dropouts):
    """One scheduler + settlement round over the ledger, as the strategy drives it."""
    tiers = len(ledger.pools)
    available = sorted(c for c in ledger.balances if c not in dropouts)
    charged = {}
    for k in range(tiers):
        bidders = [c for c in available if k in bids.get(c, []) and ledger.can_pay(c)]
        winners, payers = schedule_tier(bidders, available, scores, counts, n_perf, n_rand, rng)
        before = dict(ledger.balances)
        ledger.charge(k, payers)
        for c in ledger.balances:
            if ledger.balances[c] < before[c]:
                charged.setdefault(c, set()).add(k)
        ranked = rank_clients(winners, scores, counts)
        ledger.settle(k, payers, ranked, utilities.get(k))
        ledger.check()
    return charged


@settings(max_examples=150, deadline=None)
@given(
    n_clients=st.integers(1, 12), n_tiers=st.integers(1, 4), initial=st.integers(0, 5 * MICRO),
    price=st.integers(1, 2 * MICRO), max_refund=st.floats(0, 1), full_gain=st.floats(0.01, 1),
    rounds=st.integers(1, 6), seed=st.integers(0, 10**6),
)
def test_random_play_conserves_tokens_and_never_charges_a_non_bidder(n_clients, n_tiers, initial, price, max_refund,
                                                                     full_gain, rounds, seed):
    rng = random.Random(seed)
    ledger = TokenLedger(range(n_clients), n_tiers, initial, price, max_refund, full_gain)
    scores, counts = {}, {}
    for _ in range(rounds):
        bids = {c: rng.sample(range(n_tiers), rng.randint(0, n_tiers)) for c in range(n_clients)}
        dropouts = {c for c in range(n_clients) if rng.random() < 0.2}
        utilities = {k: rng.random() for k in range(n_tiers) if rng.random() < 0.8}
        for c in range(n_clients):
            if rng.random() < 0.5:
                scores[c] = rng.uniform(-1, 1)
        charged = play_round(ledger, bids, utilities, scores, counts, rng, 2, 1, dropouts)
        for c, tiers in charged.items():
            assert tiers <= set(bids[c]), f"client {c} charged for {tiers} but bid {bids[c]}"
            assert c not in dropouts
        assert ledger.total() == n_clients * initial
        assert min(ledger.balances.values()) >= 0


def test_worked_example_from_the_spec():
    # n = 5, price 1, pool 5, gain 0.02 vs gamma 0.1 -> theta 0.8: 4 refunded, 1 paid by rank
    ledger = TokenLedger(range(5), 1, initial=10 * MICRO, price=MICRO, max_refund=1.0, full_use_gain=0.1)
    ledger.best_utility[0] = 0.5
    ledger.charge(0, range(5))
    s = ledger.settle(0, list(range(5)), [4, 3, 2, 1, 0], utility=0.51)
    assert s.refund_ratio == pytest.approx(0.8)
    assert all(v == 800_000 for v in s.refunds.values())
    assert s.rewards[4] == 333_333 and s.rewards[0] == 66_666
    assert s.pool_after == 1_000_000 - sum(s.rewards.values())  # rounding dust stays in the pool
    ledger.check()


def test_first_settled_round_refunds_everything():
    ledger = TokenLedger(range(3), 2, initial=5 * MICRO, price=MICRO)
    ledger.charge(1, [0, 1])
    s = ledger.settle(1, [0, 1], [0, 1], utility=0.7)
    assert s.utility_gain == 0.0 and s.refund_ratio == 1.0 and ledger.pools[1] == 0
    assert ledger.balances == {0: 5 * MICRO, 1: 5 * MICRO, 2: 5 * MICRO}


@pytest.mark.parametrize("bid,reason", [
    ([7], "unknown tier"), ([-1], "unknown tier"), (["a"], "not an integer"), ([1.5], "not an integer"),
    ([0, 0], "twice"), ([0, 1], "at most 1"), ("0", "must be a list"),
])
def test_hostile_bids_are_rejected(bid, reason):
    with pytest.raises(LedgerError, match=reason):
        validate_bid(bid, num_tiers=2, max_bids=1)


def test_rejected_operations_change_nothing():
    ledger = TokenLedger(range(3), 2, initial=MICRO // 2, price=MICRO)
    before = (dict(ledger.balances), dict(ledger.pools))
    with pytest.raises(LedgerError, match="cannot pay"):
        ledger.charge(0, [0, 1])  # empty balance
    with pytest.raises(LedgerError, match="unknown tier"):
        ledger.charge(5, [0])
    with pytest.raises(LedgerError, match="twice"):
        ledger.charge(0, [1, 1])  # duplicate reply
    with pytest.raises(LedgerError, match="non-negative integer"):
        TokenLedger(range(2), 1, initial=-5)
    with pytest.raises(LedgerError, match="non-negative integer"):
        TokenLedger(range(2), 1, price=0.5)
    assert (ledger.balances, ledger.pools) == before


def test_scheduler_rules():
    rng = random.Random(0)
    scores = {1: 0.9, 2: 0.5, 3: 0.1, 4: -0.2, 5: 0.3}
    winners, payers = schedule_tier([1, 2, 3, 4, 5], list(range(1, 10)), scores, {}, 2, 1, rng)
    assert {1, 2} <= set(winners) and len(winners) == 3 and payers == winners
    winners, payers = schedule_tier([3, 4], list(range(1, 10)), scores, {}, 2, 1, rng)
    assert winners == payers == [3, 4]
    drafted, payers = schedule_tier([], list(range(1, 10)), scores, {}, 2, 1, rng)
    assert len(drafted) == 3 and payers == []  # drafted non-bidders are not charged
    assert rank_clients([7, 1, 2], {1: 0.5, 2: 0.5}, {2: 3}) == [2, 1, 7]  # ties by count, unscored last
    tiers = random_tiering(list(range(10)), 2, 3, random.Random(1))
    assert all(len(v) == 3 for v in tiers.values()) and not set(tiers[0]) & set(tiers[1])


def test_shapley_scores_sum_to_zero_and_rank_helpful_clients_first():
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(4, 6))
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    aggregate = weights @ updates
    grad = rng.normal(size=6)
    psi = shapley_scores(grad, updates, aggregate, weights)
    assert abs(psi.sum()) < 1e-9
    # a client whose update points against the gradient (lowers the loss) scores highest
    helpful = aggregate - 0.5 * grad
    ups = np.vstack([updates[:3], helpful])
    agg = weights @ ups
    assert np.argmax(shapley_scores(grad, ups, agg, weights)) == 3


def test_client_bid_policy_and_mixture():
    assert bid_policy([0.2, 0.7, 0.5], balance=MICRO, price=MICRO) == [1]
    assert bid_policy([0.95, 0.92, 0.1], balance=MICRO, price=MICRO, max_bids=2) == [0, 1]
    assert bid_policy([0.2, 0.7], balance=MICRO - 1, price=MICRO) == []  # cannot pay: no bid
    w = mixture_weights([0.2, 0.6, 0.0])
    assert np.all(w >= 0) and w.sum() == pytest.approx(1.0) and w[1] == pytest.approx(0.75)
    np.testing.assert_allclose(mixture_weights([0.0, 0.0]), [0.5, 0.5])


def test_fedsoft_importance_weights():
    import numpy as np

    from client_app.fedsoft import importance_weights

    losses = np.array([[0.1, 0.2, 3.0, 0.3], [1.0, 0.1, 0.2, 0.4]])  # centre 0 best for points 0 and 3
    np.testing.assert_allclose(importance_weights(losses, sigma=0.0), [0.5, 0.5])
    u = importance_weights(np.array([[0.1, 0.1], [1.0, 1.0]]))
    assert u[1] > 0 and abs(u.sum() - 1) < 1e-12 and u[0] > 0.99  # smoothed, never exactly zero
