"""PI-FL's math (pifl.md §2.2-§2.5): the token economy (conservation under random play, refunds and rank rewards,
hostile input rejected), the scheduler, the Shapley scores and the client's bid policy and mixture weights."""

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies.pifl_math import (
    LedgerError,
    TokenLedger,
    random_tiering,
    rank_clients,
    schedule,
    schedule_tier,
    shapley_scores,
)
from task.config import parse_settings
from task.methods.pifl import MICRO, PIFLOptions, bid_policy, mixture_weights, personal_weights


def play_round(ledger, bids, utilities, scores, counts, rng, n_perf, n_rand, dropouts):
    """One scheduler + settlement round over the ledger with the strategy's scheduler (:func:`schedule`)."""
    tiers = len(ledger.pools)
    available = {c: [t for t in bids.get(c, []) if ledger.can_pay(c)] for c in ledger.balances if c not in dropouts}
    winners, payers = schedule(
        available, tiers, dict.fromkeys(range(tiers), scores), dict.fromkeys(range(tiers), counts), n_perf, n_rand, rng
    )
    charged: dict[int, set[int]] = {}  # client -> the tiers it paid for
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
    n_clients=st.integers(1, 12),
    n_tiers=st.integers(1, 4),
    initial=st.integers(0, 5 * MICRO),
    price=st.integers(1, 2 * MICRO),
    max_refund=st.floats(0, 1),
    full_gain=st.floats(0.01, 1),
    rounds=st.integers(1, 6),
    seed=st.integers(0, 10**6),
)
def test_random_play_conserves_tokens_and_never_charges_a_non_bidder(
    n_clients, n_tiers, initial, price, max_refund, full_gain, rounds, seed
):
    rng = random.Random(seed)
    ledger = TokenLedger(range(n_clients), n_tiers, initial, price, max_refund, full_gain)
    scores: dict[int, float] = {}
    counts: dict[int, int] = {}
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
        assert all(type(v) is int for v in [*ledger.balances.values(), *ledger.pools.values()])  # micro-tokens


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
    # pifl.md §2.4 step 2: no earlier best (a tier's first settled round), no measurement this round, or a best of
    # 0: the relative gain is undefined, the refund ratio is 0, and the whole pool goes out by rank
    ledger = TokenLedger(range(3), 2, initial=5 * MICRO, price=MICRO, max_refund=1.0)
    ledger.best_utility[1] = best
    ledger.charge(1, [0, 1])
    s = ledger.settle(1, [0, 1], [1, 0], utility=utility)
    assert s.refund_ratio == 0.0 and set(s.refunds.values()) <= {0}
    assert s.utility_gain == 0.0  # no gain is on record where none could be measured
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
        TokenLedger(range(2), 1, price=0.5)  # type: ignore[arg-type]  # the guard against a float price is the test
    assert (ledger.balances, ledger.pools) == before


def test_scheduler_rules():
    rng = random.Random(0)
    scores = {1: 0.9, 2: 0.5, 3: 0.1, 4: -0.2, 5: 0.3}
    drawn = schedule_tier([1, 2, 3, 4, 5], scores, {}, 2, 1, rng)
    assert {1, 2} <= set(drawn) and len(drawn) == 3
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
    # pifl.md §2.2: B_c = {k : a_ck >= T_h} ∪ {argmax a}, truncated to the max_bids highest-scoring tiers
    pay = {"balance": MICRO, "price": MICRO}
    assert bid_policy([0.95, 0.92], **pay) == [0]  # default max_bids = 1: the argmax only
    assert bid_policy([0.95, 0.9], **pay, threshold=0.9, max_bids=2) == [0, 1]  # a_ck == T_h qualifies
    assert bid_policy([0.95, 0.89], **pay, threshold=0.9, max_bids=2) == [0]
    # four tiers qualify; the two most accurate win, whatever their index
    assert bid_policy([0.91, 0.5, 0.95, 0.93], **pay, threshold=0.9, max_bids=2) == [2, 3]
    assert bid_policy([0.2, 0.7], balance=MICRO, price=MICRO) == [1]  # exactly the price: may bid


def test_mixture_weights_are_a_convex_combination_even_for_a_negative_score():
    # Eq. 4 normalised (pifl.md §2.2): weights are non-negative and sum to one; a score below 0 counts as 0
    np.testing.assert_allclose(mixture_weights([-0.5, 0.5]), [0.0, 1.0])
    np.testing.assert_allclose(mixture_weights([-0.5, 0.0]), [0.5, 0.5])


def test_slots_covering_every_client_are_flagged_as_no_auction():
    from task.methods.pifl import PIFLOptions

    assert PIFLOptions(slots_performance=3, slots_random=1).client_conflicts(5) == []
    assert PIFLOptions(slots_performance=3, slots_random=2).client_conflicts(5)  # 5 slots, 5 clients: all win
    assert PIFLOptions(slots_performance=3, slots_random=2).client_conflicts(4)


# ---------------------------------------------------------------- the Token Manager, step by step (pifl.md §2.4)
def test_a_ledger_starts_every_client_at_b0_with_empty_pools_and_no_best_utility():
    # pifl.md §2.7 init: b_c <- b0 for every client, P_k <- 0 for every tier, Acc^max_k undefined
    ledger = TokenLedger([3, 5, 8], 3, initial=7 * MICRO, price=MICRO)
    assert ledger.balances == {3: 7 * MICRO, 5: 7 * MICRO, 8: 7 * MICRO}
    assert ledger.pools == {0: 0, 1: 0, 2: 0} and ledger.best_utility == {0: None, 1: None, 2: None}
    assert ledger.total() == 21 * MICRO == ledger.supply
    ledger.check()
    TokenLedger([], 2).check()  # a ledger before any client connected (the strategy builds one to validate options)
    TokenLedger(range(2), 0).check()  # and one without pools: the invariants hold over empty sets
    zero = TokenLedger(range(2), 1, initial=0, price=1)  # b0 = 0 is allowed: nobody can bid
    zero.check()
    assert not zero.can_pay(0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": True},
        {"initial": 1.5},
        {"initial": -1},
        {"price": False},
        {"price": -MICRO},
        {"price": 0},
        {"price": 2.0},
        {"max_refund": -0.01},
        {"max_refund": 1.01},
        {"full_use_gain": 0.0},
        {"full_use_gain": -0.1},
        {"full_use_gain": 1.01},
    ],
)
def test_ledger_parameters_outside_their_ranges_are_refused(kwargs):
    # pifl.md §3: integer micro-token amounts, tau_p > 0, eta_R in [0, 1], gamma in (0, 1]
    with pytest.raises(LedgerError):
        TokenLedger(range(2), 1, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0},
        {"initial": np.int64(3 * MICRO), "price": np.int32(MICRO)},
        {"price": 1},
        {"max_refund": 0.0},
        {"max_refund": 1.0},
        {"full_use_gain": 1.0},
        {"full_use_gain": 1e-6},
    ],
)
def test_ledger_parameters_at_the_edges_of_their_ranges_are_accepted(kwargs):
    ledger = TokenLedger(range(2), 1, **kwargs)
    ledger.check()
    assert ledger.price == int(kwargs.get("price", MICRO)) and isinstance(ledger.price, int)


@pytest.mark.parametrize("tamper", ["created", "destroyed", "negative balance", "negative pool"])
def test_check_catches_tokens_created_destroyed_or_negative(tamper):
    # pifl.md §2.4: sum b + sum P == N b0 exactly, and no balance (or pool) below zero
    ledger = TokenLedger(range(3), 2, initial=2 * MICRO, price=MICRO)
    ledger.charge(1, [0, 2])
    ledger.check()
    if tamper == "created":
        ledger.balances[1] += 1
    elif tamper == "destroyed":
        ledger.pools[1] -= 1
    elif tamper == "negative balance":  # conserved in total, but a balance below zero
        ledger.balances[0] -= 2 * MICRO
        ledger.pools[0] += 2 * MICRO
    else:
        ledger.pools[1] -= 3 * MICRO
        ledger.balances[1] += 3 * MICRO
    message = {
        "created": r"tokens not conserved: 6000001 != 6000000",
        "destroyed": r"tokens not conserved: 5999999 != 6000000",
        "negative balance": r"negative balance",
        "negative pool": r"negative pool",
    }[tamper]
    with pytest.raises(AssertionError, match=f"^{message}$"):  # the round's log says which invariant broke
        ledger.check()


def test_a_client_can_pay_exactly_when_its_balance_covers_the_price():
    # pifl.md §2.2 / §2.4: a client with b_c < tau_p may not bid; b_c == tau_p may
    ledger = TokenLedger(range(2), 1, initial=5, price=5)
    assert ledger.can_pay(0)
    ledger.balances[1] = 4
    ledger.pools[0] = 1
    assert not ledger.can_pay(1)
    cheap = TokenLedger([0], 1, initial=1, price=1)
    assert cheap.can_pay(0) and not cheap.can_pay(99)  # a client the ledger does not know has nothing


def test_charging_takes_exactly_the_price_from_each_payer_into_that_tier_only():
    # pifl.md §2.4 step 1 (Eqs. 6-7): b_c -= tau_p, P_k += tau_p for each payer; nobody else is touched
    ledger = TokenLedger(range(5), 3, initial=4 * MICRO, price=3 * MICRO // 2)
    paid = ledger.charge(2, [4, 1, 3])
    assert paid == {4: 1_500_000, 1: 1_500_000, 3: 1_500_000}
    assert ledger.balances == {0: 4 * MICRO, 1: 2_500_000, 2: 4 * MICRO, 3: 2_500_000, 4: 2_500_000}
    assert ledger.pools == {0: 0, 1: 0, 2: 4_500_000}
    assert ledger.charge(0, []) == {} and ledger.pools[0] == 0
    ledger.check()


@pytest.mark.parametrize("payers,match", [([0, 1, 9], "unknown client 9"), ([0, 1, 2], "client 2 cannot pay")])
def test_a_charge_that_fails_for_one_payer_charges_nobody(payers, match):
    # all-or-nothing: a rejected operation changes nothing, even for the payers listed before the bad one
    ledger = TokenLedger(range(3), 2, initial=MICRO, price=MICRO)
    ledger.balances[2] = MICRO - 1
    ledger.pools[1] = 1
    before = (dict(ledger.balances), dict(ledger.pools))
    with pytest.raises(LedgerError, match=match):
        ledger.charge(0, payers)
    assert (ledger.balances, ledger.pools) == before


@pytest.mark.parametrize("tier", [True, 1.0, "1", None, -1, 2])
def test_a_tier_that_is_not_one_of_the_ledgers_tier_ids_is_refused(tier):
    ledger = TokenLedger(range(2), 2, initial=MICRO, price=MICRO)
    with pytest.raises(LedgerError, match="unknown tier"):
        ledger.charge(tier, [0])
    with pytest.raises(LedgerError, match="unknown tier"):
        ledger.settle(tier, [], [0], 0.5)
    assert ledger.balances == {0: MICRO, 1: MICRO} and ledger.pools == {0: 0, 1: 0}


def test_a_numpy_integer_tier_id_is_a_tier():
    ledger = TokenLedger(range(2), 2, initial=MICRO, price=MICRO)
    ledger.charge(np.int64(1), [0])
    s = ledger.settle(np.int64(1), [0], [0], None)
    assert s.tier == 1 and ledger.balances[0] == MICRO and ledger.pools[1] == 0


def settled(best, utility, max_refund=1.0, full_use_gain=0.1, n=2):
    """One settlement of a tier whose earlier best utility is ``best``: the refund ratio and the gain."""
    ledger = TokenLedger(
        range(n), 1, initial=10 * MICRO, price=MICRO, max_refund=max_refund, full_use_gain=full_use_gain
    )
    ledger.best_utility[0] = best
    ledger.charge(0, range(n))
    s = ledger.settle(0, list(range(n)), list(range(n)), utility)
    ledger.check()
    return s


def test_the_refund_ratio_falls_linearly_from_eta_at_no_gain_to_zero_at_gamma():
    # pifl.md §2.4 step 3 (Eq. 9): theta = eta_R (gamma - min(gamma, delta)) / gamma, delta = max(0, relative gain)
    assert settled(0.5, 0.5, max_refund=0.6).refund_ratio == pytest.approx(0.6)  # no gain: eta_R
    assert settled(0.5, 0.4, max_refund=0.6).refund_ratio == pytest.approx(0.6)  # worse: delta = 0, not negative
    assert settled(0.5, 0.4, max_refund=0.6).utility_gain == 0.0
    s = settled(0.5, 0.525, max_refund=0.6, full_use_gain=0.1)  # delta = 0.05 = gamma / 2
    assert s.utility_gain == pytest.approx(0.05) and s.refund_ratio == pytest.approx(0.3)
    assert settled(0.5, 0.55, max_refund=0.6, full_use_gain=0.1).refund_ratio == pytest.approx(0.0, abs=1e-9)
    assert settled(0.5, 0.9, max_refund=0.6, full_use_gain=0.1).refund_ratio == 0.0  # delta > gamma: still 0
    assert settled(0.4, 0.5, full_use_gain=0.5).utility_gain == pytest.approx(0.25)  # (0.5 - 0.4) / 0.4
    ratios = [settled(0.5, u, max_refund=0.8, full_use_gain=0.2).refund_ratio for u in np.linspace(0.3, 0.7, 41)]
    assert all(0.0 <= r <= 0.8 + 1e-12 for r in ratios)  # within [0, eta_R] (up to float rounding)
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(ratios)) and ratios[0] == pytest.approx(0.8)  # monotone


def test_the_refund_is_floor_theta_pool_in_equal_shares_to_the_payers_only():
    # pifl.md §2.4 step 3 (Eqs. 10-11 corrected): R = floor(theta P_k), each payer floor(R / n); a drafted winner
    # (no payment) gets no refund but is ranked
    ledger = TokenLedger(range(3), 1, initial=10 * MICRO, price=3 * MICRO, max_refund=0.5)
    ledger.best_utility[0] = 0.8
    ledger.charge(0, [0])
    s = ledger.settle(0, [0], [0, 2], utility=0.8)  # no gain: theta = eta_R = 0.5 of a pool of 3 tokens
    assert s.refunds == {0: 1_500_000}
    assert s.rewards == {0: 1_000_000, 2: 500_000}  # the other 1.5 tokens by rank: 2/3 and 1/3
    assert ledger.balances == {0: 7 * MICRO + 2_500_000, 1: 10 * MICRO, 2: 10 * MICRO + 500_000}
    assert ledger.pools[0] == 0 == s.pool_after
    ledger.check()


def test_with_the_full_refund_every_payer_gets_its_price_back():
    # no improvement and eta_R = 1: the whole pool goes back to the payers in equal shares, nothing is left to rank
    ledger = TokenLedger(range(4), 2, initial=5 * MICRO, price=MICRO, max_refund=1.0)
    ledger.best_utility[1] = 0.7
    ledger.charge(1, [0, 1, 3])
    s = ledger.settle(1, [0, 1, 3], [3, 0, 1], utility=0.7)
    assert s.refunds == {0: MICRO, 1: MICRO, 3: MICRO} and set(s.rewards.values()) == {0}
    assert ledger.balances == dict.fromkeys(range(4), 5 * MICRO) and ledger.pools[1] == 0


def test_the_rank_reward_pays_alpha_over_beta_of_the_pool_by_reverse_rank():
    # pifl.md §2.4 step 4 (Eqs. 12-14 corrected): alpha = n - pos + 1, beta = n(n+1)/2, floor(alpha P / beta) each
    ledger = TokenLedger(range(4), 1, initial=10 * MICRO, price=2 * MICRO)
    ledger.charge(0, [0, 1, 2])  # pool 6 tokens; first settled round: no refund
    s = ledger.settle(0, [0, 1, 2], [2, 0, 1], utility=0.5)
    assert s.refund_ratio == 0.0 and s.refunds == {0: 0, 1: 0, 2: 0}
    assert s.rewards == {2: 3 * MICRO, 0: 2 * MICRO, 1: MICRO} and s.pool_after == 0
    # seven winners sharing 1 micro-token each: floor(alpha * 7 / 28) = 1 for the two best, 0 below; dust stays
    ledger = TokenLedger(range(7), 1, initial=1, price=1)
    ledger.charge(0, range(7))
    s = ledger.settle(0, list(range(7)), list(range(7)), utility=None)
    assert [s.rewards[c] for c in range(7)] == [1, 1, 1, 1, 0, 0, 0]
    assert s.pool_after == 3 == ledger.pools[0]
    ledger.check()


@given(n=st.integers(1, 12), pool=st.integers(0, 10**8))
@settings(max_examples=60, deadline=None)
def test_rank_rewards_never_rise_down_the_ranking_and_leave_less_than_n_units(n, pool):
    ledger = TokenLedger(range(n), 1, initial=0, price=1)
    ledger.pools[0] = ledger.supply = pool  # a pool carried over from earlier rounds
    s = ledger.settle(0, [], list(range(n)), utility=None)
    rewards = [s.rewards[c] for c in range(n)]
    assert all(a >= b for a, b in itertools.pairwise(rewards))
    assert 0 <= pool - sum(rewards) < n and s.pool_after == pool - sum(rewards)
    for pos, r in enumerate(rewards):  # alpha / beta of the pool, rounded down
        assert r == (n - pos) * pool // (n * (n + 1) // 2)
    ledger.check()
    # pifl.md §2.4: an integer ledger in micro-tokens, so conservation is exact
    assert all(type(v) is int for v in [*ledger.balances.values(), *ledger.pools.values(), *rewards])


def test_the_best_utility_is_the_best_of_earlier_rounds_and_kept_when_unmeasured():
    # pifl.md §2.4 step 2: delta compares with Acc^max of *earlier* rounds, then Acc^max <- max(Acc^max, Acc^r);
    # a round without a measurement leaves Acc^max as it was
    ledger = TokenLedger(range(2), 1, initial=10 * MICRO, price=MICRO, max_refund=1.0, full_use_gain=0.1)
    ratios = []
    for utility in (0.5, 0.4, None, 0.44, 0.6, 0.6):
        ledger.charge(0, [0, 1])
        ratios.append(ledger.settle(0, [0, 1], [0, 1], utility).refund_ratio)
        ledger.check()
    # 0.5: first round, undefined; 0.4: worse than 0.5; None: undefined; 0.44: still worse than 0.5 (not a
    # 10 % gain over 0.4); 0.6: +20 % over 0.5; 0.6 again: no gain over 0.6
    assert ratios == pytest.approx([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    assert ledger.best_utility[0] == 0.6


def test_settling_a_tier_without_winners_moves_nothing_and_other_tiers_are_untouched():
    ledger = TokenLedger(range(3), 2, initial=3 * MICRO, price=MICRO)
    ledger.charge(0, [0, 1])
    ledger.charge(1, [2])
    s = ledger.settle(1, [], [], 0.5)  # the winner of tier 1 failed: its payment stays in the pool
    assert s.refunds == {} and s.rewards == {} and s.pool_after == MICRO == ledger.pools[1]
    assert ledger.pools[0] == 2 * MICRO and ledger.balances == {0: 2 * MICRO, 1: 2 * MICRO, 2: 2 * MICRO}
    ledger.check()


# ---------------------------------------------------------------- the Profiler (App. A, pifl.md §2.3)
def test_on_a_linear_loss_the_shapley_estimate_is_the_leave_one_out_gain_times_one_minus_lambda():
    # Eqs. 39-47: without client i the normalised aggregate is W_M - lambda_i (W_i - W_M) / (1 - lambda_i); on a
    # linear loss L(W) = g.W the first-order estimate is exact up to that factor:
    # psi_i = (1 - lambda_i) (L(W_-i) - L(W_M))
    rng = np.random.default_rng(3)
    updates = rng.normal(size=(5, 7))
    weights = np.array([0.05, 0.15, 0.2, 0.25, 0.35])
    aggregate = weights @ updates
    g = rng.normal(size=7)
    psi = shapley_scores(g, updates, aggregate, weights)
    for i in range(5):
        others = [j for j in range(5) if j != i]
        without_i = weights[others] @ updates[others] / weights[others].sum()
        assert psi[i] == pytest.approx((1 - weights[i]) * (g @ without_i - g @ aggregate), rel=1e-9, abs=1e-12)
    assert shapley_scores(g, np.vstack([updates[:4], aggregate]), aggregate, weights)[4] == 0.0  # W_c = W_M


def test_rank_ties_go_to_the_more_frequent_participant_then_the_lower_id_and_unscored_clients_come_last():
    # pifl.md §2.3 / §6.6: sort by (psi desc, Omega desc, id asc); a client with no score ranks below every scored one
    assert rank_clients([1, 2], {1: 0.5, 2: 0.5}, {2: 1}) == [2, 1]  # one participation beats none
    assert rank_clients([2, 1], {1: 0.5, 2: 0.5}, {1: 2, 2: 2}) == [1, 2]
    assert rank_clients([5, 4, 3], {3: -1e300, 4: -2.0, 5: 1.0}, {}) == [5, 4, 3]
    assert rank_clients([9, 3], {3: -1e300}, {9: 50}) == [3, 9]  # unscored below even a very bad score


# ---------------------------------------------------------------- the Scheduler (pifl.md §2.5)
def key(scores, counts):
    return lambda c: (-scores.get(c, -np.inf), -counts.get(c, 0), c)


@pytest.mark.parametrize("n_perf,n_rand", [(2, 1), (0, 3), (3, 0), (1, 2)])
def test_a_tier_takes_the_top_n_p_bidders_plus_n_r_random_others_without_duplicates(n_perf, n_rand):
    bidders = [11, 3, 7, 1, 9, 5, 2]
    scores, counts = {11: 0.3, 3: 0.9, 7: 0.3, 1: -0.1, 9: 0.05}, {7: 4, 11: 1}
    best = sorted(bidders, key=key(scores, counts))[:n_perf]  # 3, then 7 (more participations than 11), then 11
    drawn = set()
    for seed in range(60):
        winners = schedule_tier(list(bidders), scores, counts, n_perf, n_rand, random.Random(seed))
        assert winners == sorted(winners) and len(set(winners)) == len(winners) == n_perf + n_rand
        assert set(best) <= set(winners) and set(winners) <= set(bidders)
        drawn |= set(winners) - set(best)
    if n_rand:  # uniform over the remaining bidders: each of them is drawn sometimes
        assert drawn == set(bidders) - set(best)


def test_a_tier_with_at_most_n_p_plus_n_r_bidders_takes_them_all():
    for bidders in ([4], [8, 2], [9, 1, 5]):
        assert schedule_tier(bidders, {}, {}, 2, 1, random.Random(0)) == sorted(bidders)


def test_the_same_seed_gives_the_same_schedule():
    bids = {c: [c % 3] if c % 4 else [] for c in range(20)}
    scores = {k: {c: (c * 7 % 5) / 5 for c in range(20)} for k in range(3)}
    a = schedule(bids, 4, scores, {}, 1, 2, random.Random(5))
    b = schedule(bids, 4, scores, {}, 1, 2, random.Random(5))
    assert a == b


@pytest.mark.parametrize("seed", range(6))
def test_bids_place_clients_only_in_their_tier_and_drafts_come_only_from_non_bidders_once(seed):
    # pifl.md §2.5: zeta_k within the bidders of k, |zeta_k| = min(slots, bidders); a tier nobody bid for drafts
    # slots clients at random from the available clients that bid for nothing, who pay nothing; tiers are
    # disjoint with max_bids = 1
    rng = random.Random(seed)
    bids = {c: [0] for c in (0, 1, 2, 3)} | {4: [2]} | {c: [] for c in (5, 6, 7, 8, 9)}
    winners, payers = schedule(bids, 5, {}, {}, 2, 1, rng)
    assert set(winners) == set(payers) == set(range(5))
    assert set(winners[0]) <= {0, 1, 2, 3} and len(winners[0]) == 3 and payers[0] == winners[0]
    assert winners[2] == [4] == payers[2]
    drafted = winners[1] + winners[3] + winners[4]
    assert set(drafted) <= {5, 6, 7, 8, 9} and len(set(drafted)) == len(drafted) == 5  # 3, then the 2 left, then none
    assert sorted(map(len, (winners[1], winners[3], winners[4]))) == [0, 2, 3]
    assert payers[1] == payers[3] == payers[4] == []
    assert all(w == sorted(w) for w in winners.values())


def test_drafts_over_seeds_reach_every_non_bidder():
    seen = set()
    for seed in range(40):
        winners, _ = schedule({0: [1], 1: [], 2: [], 3: [], 4: []}, 2, {}, {}, 1, 1, random.Random(seed))
        seen |= set(winners[0])
    assert seen == {1, 2, 3, 4}


# ---------------------------------------------------------------- round 1 (pifl.md §2.3 initial tiering, §2.5)
@pytest.mark.parametrize("n,k,per", [(10, 2, 5), (7, 3, 3), (5, 5, 1), (9, 2, 9)])
def test_round_one_is_a_random_partition_of_every_client_when_the_slots_allow(n, k, per):
    for seed in range(5):
        tiers = random_tiering(list(range(n)), k, per, random.Random(seed))
        assert sorted(tiers) == list(range(k))
        members = [c for t in tiers.values() for c in t]
        assert sorted(members) == list(range(n))  # every client once: a partition
        assert all(t for t in tiers.values()) and max(map(len, tiers.values())) - min(map(len, tiers.values())) <= 1


def test_round_one_samples_at_most_the_slots_from_each_group_and_is_random_and_order_free():
    tiers = random_tiering(list(range(12)), 2, 2, random.Random(0))
    assert all(len(t) == 2 for t in tiers.values()) and not set(tiers[0]) & set(tiers[1])
    where: dict[int, set[int]] = {c: set() for c in range(12)}
    for seed in range(30):
        for k, t in random_tiering(list(range(12)), 2, 6, random.Random(seed)).items():
            for c in t:
                where[c].add(k)
    assert all(v == {0, 1} for v in where.values())  # any client may land in any tier
    # the same seed gives the same tiering whatever order the nodes were listed in
    assert random_tiering([5, 3, 9, 1, 7], 2, 2, random.Random(4)) == random_tiering(
        [1, 3, 5, 7, 9], 2, 2, random.Random(4)
    )


# ---------------------------------------------------------------- start-up conflicts (docs/methods/pifl.md "Options")
@pytest.mark.parametrize("perf,rand,tiers,min_nodes", [(0, 1, 2, 2), (1, 0, 2, 2), (2, 3, 3, 3), (1, 1, 1, 1)])
def test_one_slot_per_tier_and_as_many_tiers_as_nodes_are_allowed(perf, rand, tiers, min_nodes):

    s = parse_settings(
        {"method": "pifl", "slots-performance": perf, "slots-random": rand, "tiers": tiers, "min-nodes": min_nodes}
    )
    assert isinstance(s.options, PIFLOptions)
    assert (s.options.slots_performance, s.options.slots_random, s.options.tiers) == (perf, rand, tiers)


def test_a_tier_without_slots_or_more_tiers_than_nodes_is_refused_at_start_up():

    with pytest.raises(ValueError, match="slots-performance") as err:
        parse_settings({"method": "pifl", "slots-performance": 0, "slots-random": 0})
    assert str(err.value) == "slots-performance + slots-random must be >= 1: a tier with no slot never trains"
    with pytest.raises(ValueError, match=r"tiers=4 is more than min-nodes=3"):
        parse_settings({"method": "pifl", "tiers": 4, "min-nodes": 3})


def test_each_tiers_performance_slots_go_by_that_tiers_own_scores_and_participation():
    # pifl.md §2.3 / §2.5: psi_kc and Omega_kc are per tier; a client good in tier 1 is not thereby good in tier 0
    bids = {c: [0] for c in range(4)} | {c: [1] for c in range(4, 8)}
    scores = {0: {2: 0.5, 1: 0.1}, 1: {0: 9.0, 6: 0.3, 5: 0.2}}
    winners, _ = schedule(bids, 2, scores, {}, 1, 0, random.Random(0))
    assert winners == {0: [2], 1: [6]}
    counts = {0: {3: 5, 1: 2}, 1: {3: 9, 7: 1}}
    winners, _ = schedule(bids, 2, {}, counts, 1, 0, random.Random(0))
    assert winners == {0: [3], 1: [7]}


def test_every_rejected_ledger_operation_says_exactly_why():
    # module docstring: bad input is rejected with a reason (the server logs it) and changes nothing
    def refused(call, message):
        with pytest.raises(LedgerError) as err:
            call()
        assert str(err.value) == message

    refused(
        lambda: TokenLedger(range(2), 1, initial=-1),
        "initial must be a non-negative integer number of micro-tokens, got -1",
    )
    refused(
        lambda: TokenLedger(range(2), 1, price=0.5),  # type: ignore[arg-type]  # the guard against a float is the test
        "price must be a non-negative integer number of micro-tokens, got 0.5",
    )
    refused(lambda: TokenLedger(range(2), 1, price=0), "price must be > 0")
    refused(
        lambda: TokenLedger(range(2), 1, max_refund=2.0), "max-refund must be in [0, 1] and full-use-gain in (0, 1]"
    )
    ledger = TokenLedger(range(3), 2, initial=MICRO, price=MICRO)
    ledger.balances[2] = MICRO - 1
    ledger.pools[0] = 1
    refused(lambda: ledger.add_client(1, MICRO), "client 1 is already in the ledger")
    refused(lambda: ledger.charge(5, [0]), "unknown tier 5; tiers are [0, 1]")
    refused(lambda: ledger.charge(True, [0]), "unknown tier True; tiers are [0, 1]")
    refused(lambda: ledger.charge(0, [1, 1]), "a client appears twice among the payers")
    refused(lambda: ledger.charge(0, [9]), "unknown client 9")
    refused(lambda: ledger.charge(0, [2]), "client 2 cannot pay 1000000 (balance 999999)")


@pytest.mark.parametrize("accuracies", [[0.2, 0.6, 0.0], [0.9, 0.1], [0.5, 0.5]])
def test_choosing_keeps_the_mixture_unless_the_best_tier_scores_strictly_higher(accuracies):
    # pifl-personal='choose': the client compares the Eq. 4 mixture with its single most accurate tier on the same
    # calibration data; without a mixture accuracy (the default, 'mixture') the weights are Eq. 4's
    best = int(np.argmax(accuracies))
    np.testing.assert_allclose(personal_weights(accuracies), mixture_weights(accuracies))
    for mixture_acc in (accuracies[best], accuracies[best] + 0.01, 1.0):  # the mixture at least as good
        np.testing.assert_allclose(personal_weights(accuracies, mixture_acc), mixture_weights(accuracies))
    one_hot = personal_weights(accuracies, accuracies[best] - 0.01)  # the best tier strictly better
    assert one_hot.tolist() == [1.0 if k == best else 0.0 for k in range(len(accuracies))]
