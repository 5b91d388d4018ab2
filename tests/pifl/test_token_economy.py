"""PI-FL's token economy (pifl.md §2.4, strategies/pifl_math.TokenLedger): tokens are conserved under random
play and never charged to a non-bidder, the spec's worked example, the Token Manager step by step (charges,
refunds, rank rewards, the best utility), and hostile input rejected with its reason, changing nothing."""

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies.pifl_math import (
    LedgerError,
    TokenLedger,
    rank_clients,
    schedule,
)
from task.methods.pifl import MICRO
from tests.strategy_harness import strategy


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


def test_the_ledger_used_before_round_one_opened_it_is_a_clear_error():
    s = strategy("pifl", model="mlp")
    with pytest.raises(RuntimeError) as err:
        s.open_ledger()
    assert str(err.value) == (
        "PI-FL's token ledger is used before the first round opened it; it exists once round 1 has started "
        "(prepare_round) or a resume has restored it"
    )
