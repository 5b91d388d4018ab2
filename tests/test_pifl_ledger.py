"""PI-FL token economy (spec pifl §2.4-§2.5): conservation under random play, and hostile input rejected."""

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strategies.pifl_math import (
    LedgerError, TokenLedger, random_tiering, rank_clients, schedule, schedule_tier, shapley_scores,
)
from task.methods.pifl import MICRO, bid_policy, mixture_weights


def play_round(ledger, bids, utilities, scores, counts, rng, n_perf, n_rand, dropouts):
    """One scheduler + settlement round over the ledger with the strategy's scheduler (:func:`schedule`)."""
    tiers = len(ledger.pools)
    available = {c: [t for t in bids.get(c, []) if ledger.can_pay(c)] for c in ledger.balances if c not in dropouts}
    winners, payers = schedule(available, tiers, {k: scores for k in range(tiers)}, {k: counts for k in range(tiers)},
                               n_perf, n_rand, rng)
    charged = {}
    for k in range(tiers):
        before = dict(ledger.balances)
        ledger.charge(k, payers[k])
        for c in ledger.balances:
            if ledger.balances[c] < before[c]:
                charged.setdefault(c, set()).add(k)
        ranked = rank_clients(winners[k], scores, counts)
        ledger.settle(k, payers[k], ranked, utilities.get(k))
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
        bids = {c: rng.sample(range(n_tiers), rng.randint(0, 1)) for c in range(n_clients)}  # max-bids 1
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


@pytest.mark.parametrize("best,utility", [(None, 0.7), (0.6, None), (0.0, 0.5)])
def test_an_undefined_utility_gain_refunds_nothing_and_pays_the_pool_by_rank(best, utility):
    # spec §2.4 step 2: no earlier best (a tier's first settled round), no measurement this round, or a best of
    # 0: the relative gain is undefined, the refund ratio is 0, and the whole pool goes out by rank
    ledger = TokenLedger(range(3), 2, initial=5 * MICRO, price=MICRO, max_refund=1.0)
    ledger.best_utility[1] = best
    ledger.charge(1, [0, 1])
    s = ledger.settle(1, [0, 1], [1, 0], utility=utility)
    assert s.refund_ratio == 0.0 and set(s.refunds.values()) <= {0}
    assert abs(s.rewards[1] - 2 * s.rewards[0]) <= 2 and s.rewards[1] + s.rewards[0] + ledger.pools[1] == 2 * MICRO
    assert ledger.pools[1] < 3  # rounding dust only
    ledger.check()


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
    winners = schedule_tier([1, 2, 3, 4, 5], scores, {}, 2, 1, rng)
    assert {1, 2} <= set(winners) and len(winners) == 3
    assert schedule_tier([3, 4], scores, {}, 2, 1, rng) == [3, 4]
    bids = {c: [0] for c in (1, 2, 3, 4, 5)} | {c: [] for c in (6, 7, 8, 9)}
    winners, payers = schedule(bids, 2, {0: scores}, {}, 2, 1, rng)
    assert len(winners[1]) == 3 and set(winners[1]) <= {6, 7, 8, 9} and payers[1] == []  # drafted: free
    assert payers[0] == winners[0] and len(winners[0]) == 3
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


def test_a_bid_is_the_best_tiers_at_or_above_the_threshold_up_to_max_bids():
    # spec §2.2: B_c = {k : a_ck >= T_h} ∪ {argmax a}, truncated to the max_bids highest-scoring tiers
    pay = dict(balance=MICRO, price=MICRO)
    assert bid_policy([0.95, 0.92], **pay) == [0]  # default max_bids = 1: the argmax only
    assert bid_policy([0.95, 0.9], **pay, threshold=0.9, max_bids=2) == [0, 1]  # a_ck == T_h qualifies
    assert bid_policy([0.95, 0.89], **pay, threshold=0.9, max_bids=2) == [0]
    # four tiers qualify; the two most accurate win, whatever their index
    assert bid_policy([0.91, 0.5, 0.95, 0.93], **pay, threshold=0.9, max_bids=2) == [2, 3]
    assert bid_policy([0.2, 0.7], balance=MICRO, price=MICRO) == [1]  # exactly the price: may bid


def test_mixture_weights_are_a_convex_combination_even_for_a_negative_score():
    # Eq. 4 normalised (spec §2.2): weights are non-negative and sum to one; a score below 0 counts as 0
    np.testing.assert_allclose(mixture_weights([-0.5, 0.5]), [0.0, 1.0])
    np.testing.assert_allclose(mixture_weights([-0.5, 0.0]), [0.5, 0.5])


def test_slots_covering_every_client_are_flagged_as_no_auction():
    from task.methods.pifl import PIFLOptions

    assert PIFLOptions(slots_performance=3, slots_random=1).client_conflicts(5) == []
    assert PIFLOptions(slots_performance=3, slots_random=2).client_conflicts(5)  # 5 slots, 5 clients: all win
    assert PIFLOptions(slots_performance=3, slots_random=2).client_conflicts(4)


def test_fedsoft_importance_weights():
    import numpy as np

    from client_app.fedsoft import importance_weights

    losses = np.array([[0.1, 0.2, 3.0, 0.3], [1.0, 0.1, 0.2, 0.4]])  # centre 0 best for points 0 and 3
    np.testing.assert_allclose(importance_weights(losses, sigma=0.0), [0.5, 0.5])
    u = importance_weights(np.array([[0.1, 0.1], [1.0, 1.0]]))
    assert u[1] > 0 and abs(u.sum() - 1) < 1e-12 and u[0] > 0.99  # smoothed, never exactly zero


# ---------------------------------------------------------------- the strategy's own round path
from server_app.app import build_strategy  # noqa: E402
from task.config import parse_settings  # noqa: E402
from tests.strategy_harness import drive, with_metrics  # noqa: E402

NODES = {901: 0, 17: 1, 4242: 2, 333: 3}  # node id -> partition id


def pifl(**cfg):
    return build_strategy(parse_settings({"method": "pifl", "dataset": "digits", "model": "mlp", "min-nodes": 4,
                                          "slots-performance": 1, "slots-random": 1, "server-set-size": 50, **cfg}))


@pytest.mark.parametrize("seed", range(8))
def test_a_bidder_is_only_placed_in_the_tier_it_bid_for(seed):
    # round 2: clients 0, 1, 2 bid for tier 1, client 3 bids for nothing; tier 0 has no bidder
    strat = pifl(seed=seed)
    bids = {0: [1], 1: [1], 2: [1], 3: []}

    def answer(rnd, node, phase, content):
        return [with_metrics(content, bid=bids[NODES[node]])] if phase == "bid" else None

    drive(strat, NODES, 2, answer, seed=seed)
    assert strat.winners[1] and set(strat.winners[1]) <= {0, 1, 2} and len(strat.winners[1]) == 2  # min(slots, bidders)
    assert strat.winners[0] == [3] and strat.payers[0] == []  # drafted from the non-bidders only, for free
    assert strat.payers[1] == strat.winners[1]


def test_a_reply_with_a_broken_tier_accuracy_is_rejected_and_sets_no_best_utility():
    for bad in ([float("nan"), 0.5], [0.5, 1e6], [0.5], [0.5, -0.1]):
        strat = pifl()

        def answer(rnd, node, phase, content, bad=bad):
            if phase == "evaluate" and NODES[node] == 0:
                return [with_metrics(content, tier_acc=bad)]
            return None

        drive(strat, NODES, 1, answer)
        assert 0 not in strat._tier_acc and strat.client_eval.get(0) is None
        assert any(f["phase"] == "evaluate" and "tier-acc" in f["reason"] for f in strat.failures), bad
        assert all(u is None or 0.0 <= u <= 1.0 for u in strat.ledger.best_utility.values())


def test_a_round_without_evaluation_refunds_nothing():
    strat = pifl(**{"eval-every": 2, "bid-threshold": 0.0})
    drive(strat, NODES, 3, lambda rnd, node, phase, content: [with_metrics(content, bid=[0])] if phase == "bid" else None)
    by_round = {e["round"]: e for e in strat.ledger_log}
    tier = by_round[3]["tiers"][0]  # round 3 is not evaluated (eval-every 2, 4 rounds would evaluate in 4)
    assert tier["payers"] and tier["utility"] is None and tier["refund-ratio"] == 0.0
    assert all(v == 0 for v in tier["refunds"].values())
    assert sum(tier["rewards"].values()) + tier["pool"] >= len(tier["payers"]) * strat.price - 3


def test_a_winner_whose_training_failed_gets_no_refund_and_no_reward():
    strat = pifl()
    failed = {}

    def answer(rnd, node, phase, content):
        if phase == "bid":
            return [with_metrics(content, bid=[0])]
        if rnd == 2 and phase == "train" and not failed:
            failed[NODES[node]] = True  # the first winner to train in round 2 crashes
            return []
        return None

    drive(strat, NODES, 2, answer)
    (loser,) = failed
    entry = strat.ledger_log[-1]["tiers"][0]
    assert loser in entry["payers"] and loser not in entry["delivered"]
    assert loser not in entry["refunds"] and loser not in entry["rewards"]
    assert set(entry["rewards"]) == set(entry["delivered"]) and entry["delivered"]
    strat.ledger.check()


def test_a_late_joiner_brings_its_own_tokens_and_joins_only_once():
    ledger = TokenLedger([0, 1], num_tiers=2, initial=100 * MICRO, price=MICRO)
    ledger.charge(0, [0])
    ledger.add_client(7, 40 * MICRO)
    assert ledger.balances[7] == 40 * MICRO and ledger.supply == 240 * MICRO
    ledger.check()  # conserved: the supply grew by exactly the newcomer's tokens
    with pytest.raises(LedgerError, match="client 7 is already in the ledger"):
        ledger.add_client(7, 10 * MICRO)
    assert ledger.balances[7] == 40 * MICRO and ledger.supply == 240 * MICRO
