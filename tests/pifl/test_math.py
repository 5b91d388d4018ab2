"""PI-FL's math (pifl.md §2.2-§2.5): the scheduler, the Shapley scores, the client's bid policy and mixture
weights, round one's tiering and the start-up conflicts.  The token economy is in test_token_economy.py."""

import random

import numpy as np
import pytest

from strategies.pifl_math import (
    random_tiering,
    rank_clients,
    schedule,
    schedule_tier,
    shapley_scores,
)
from task.config import parse_settings
from task.methods.pifl import MICRO, PIFLOptions, bid_policy, mixture_weights, personal_weights


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
