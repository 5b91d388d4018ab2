"""What the PI-FL server must do each round (pifl.md §2.3-§2.7), through its own round loop driven by
tests/strategy_harness.py from a parsed run config as the ServerApp builds it: the free warm-up round, payments and
settlements, who trains and evaluates which tier, per-tier FedAvg, tiers whose winners failed, the utility.  The
auction and what a reply may say are in test_bids.py, the ledger in test_ledger.py, the per-source tier tables in
test_tier_tables.py, the Profiler in test_profiler.py and FedSoft in test_fedsoft.py."""

import numpy as np
import pytest

from task.methods.pifl import MICRO
from task.params import record_to_numpy
from tests.pifl.server_kit import (
    NODES,
    TIER_ACC,
    pifl,
    pifl_one_slot,
    sent,
    tier_accuracies,
    train_one_round_with_offsets,
)
from tests.strategy_harness import drive, with_metrics


def test_round_one_is_a_free_warm_up_on_a_random_partition_that_records_the_utility():
    # pifl.md §2.5 round 1 and §2.3 initial tiering: a random partition, up to slots per tier; nobody pays, nothing is
    # settled, but Omega and Acc^max are recorded (Acc_k = mean over the tier's winners of their a_ck)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 1, tier_accuracies)
    members = [c for k in (0, 1) for c in strat.winners[k]]
    assert sorted(members) == [0, 1, 2, 3] and all(len(strat.winners[k]) == 2 for k in (0, 1))
    assert strat.payers == {0: [], 1: []}
    assert strat.ledger.balances == dict.fromkeys(range(4), 100 * MICRO) and strat.ledger.pools == {0: 0, 1: 0}
    for k in (0, 1):
        entry = strat.ledger_log[0]["tiers"][k]
        assert entry["payments"] == {} and entry["refunds"] == {} and entry["rewards"] == {}
        assert entry["refund-ratio"] is None
        expected = np.mean([TIER_ACC[c][k] for c in strat.winners[k]])
        assert entry["utility"] == pytest.approx(expected) and strat.ledger.best_utility[k] == pytest.approx(expected)
        assert strat.counts[k] == dict.fromkeys(strat.winners[k], 1)
    assert strat.ledger_log[0]["total"] == 400 * MICRO


def test_from_round_two_winning_bidders_pay_into_their_tier_and_are_settled_on_its_utility():
    # pifl.md §2.4: winners that bid pay tau_p into P_k; then refund (none: the tier improved by over gamma) and rank
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "slot-price": 2.5})
    bids = {0: [0], 1: [0], 2: [0], 3: []}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "bid":
            return [with_metrics(content, bid=bids[c])]
        if phase == "evaluate":  # tier 0 is much better in round 2 than in round 1: no refund
            return [with_metrics(content, tier_acc=[0.2 if rnd == 1 else 0.9, 0.5])]
        return None

    grid = drive(strat, NODES, 2, answer)
    assert set(strat.winners[0]) <= {0, 1, 2} and len(strat.winners[0]) == 2 and strat.payers[0] == strat.winners[0]
    assert strat.winners[1] == [3] and strat.payers[1] == []  # drafted for free
    entry = strat.ledger_log[1]["tiers"][0]
    assert entry["payments"] == dict.fromkeys(strat.winners[0], 2500000) and entry["refund-ratio"] == 0.0
    assert entry["utility"] == pytest.approx(0.9)
    ranked = sorted(strat.winners[0], key=lambda c: -strat.scores[0][c])  # the better Shapley score gets 2/3
    assert [entry["rewards"][c] for c in ranked] == [3_333_333, 1_666_666] and entry["pool"] == 1
    for c in strat.winners[0]:
        assert strat.ledger.balances[c] == 100 * MICRO - 2_500_000 + entry["rewards"][c]
    assert strat.ledger.balances[3] == 100 * MICRO and strat.ledger.total() == 400 * MICRO
    # the bid query told every client its balance and the price, with all tiers
    for rnd, _client, content in sent(grid, "bid"):
        assert rnd == 2 and dict(content["ledger"]) == {"balance": 100 * MICRO, "price": 2_500_000}
        assert all(v.shape[0] == 2 for v in record_to_numpy(content["tiers"]).values())
    assert sorted(c for _, c, _ in sent(grid, "bid")) == [0, 1, 2, 3]


def test_a_winner_trains_its_own_tiers_model_and_every_client_evaluates_every_tier():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    grid = drive(
        strat,
        NODES,
        2,
        lambda rnd, node, phase, content: [with_metrics(content, bid=[NODES[node] % 2])] if phase == "bid" else None,
    )
    train = [(r, c, content) for r, c, content in sent(grid, "train") if r == 2]
    assert sorted(c for _, c, _ in train) == [0, 1, 2, 3]
    for _, c, content in train:
        assert content["tier"]["tier"] == c % 2 == strat.tier_of[c]
    evaluated = [(r, c, content) for r, c, content in sent(grid, "evaluate") if r == 2]
    assert sorted(c for _, c, _ in evaluated) == [0, 1, 2, 3]
    for _, _, content in evaluated:
        tiers = record_to_numpy(content["tiers"])
        for key, value in tiers.items():
            assert value.shape[0] == 2
            for k in (0, 1):
                np.testing.assert_array_equal(value[k], strat.tiers[k][key])
    assert sorted(strat.server_models()) == ["tier-0", "tier-1"]


def test_each_tier_is_the_example_weighted_average_of_its_winners_and_they_are_scored():
    # pifl.md §2.7: lambda = n_c / sum n, M_k = sum lambda_c W_c over zeta_k; psi_kc for every winner (they sum to 0)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    base, sizes, offset = train_one_round_with_offsets(strat, seed=0, scale=0.5)
    for k in (0, 1):
        group = strat.winners[k]
        lam = np.array([sizes[c] for c in group], float) / sum(sizes[c] for c in group)
        for key, v in strat.tiers[k].items():
            expected = base[key] + sum(w * offset[c][key].astype(float) for w, c in zip(lam, group, strict=True))
            np.testing.assert_allclose(v, expected, rtol=1e-5, atol=1e-5)
        assert sorted(strat.scores[k]) == sorted(group)
        psi = np.array([strat.scores[k][c] for c in group])
        assert abs(psi.sum()) <= 1e-3 * np.abs(psi).max() and np.abs(psi).max() > 0  # sum to 0 (float32 models)
    assert strat.history[-1].extra.get("pifl", {}).get("tier-sizes", {0: 2, 1: 2}) == {0: 2, 1: 2}


def test_a_tier_whose_winners_all_failed_keeps_its_model():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    before = {k: {key: v.copy() for key, v in strat.tiers[k].items()} for k in (0, 1)}
    failed = set()

    def answer(rnd, node, phase, content):
        if phase == "train" and NODES[node] in strat.winners[1]:
            failed.add(NODES[node])
            return []
        return None

    drive(strat, NODES, 1, answer)
    assert failed == set(strat.winners[1])
    for key, v in before[1].items():
        np.testing.assert_array_equal(strat.tiers[1][key], v)
    assert strat.scores[1] == {} and strat.ledger_log[0]["tiers"][1]["delivered"] == []
    assert strat.ledger_log[0]["tiers"][1]["utility"] is None


def test_a_tier_whose_winners_all_failed_does_not_stop_the_next_tier_from_being_aggregated():
    # pifl.md §2.7: per-tier FedAvg and Profiler scores for every tier that got updates, whatever happened to the others
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    before = {k: {key: v.copy() for key, v in strat.tiers[k].items()} for k in (0, 1)}

    def answer(rnd, node, phase, content):
        if phase == "train" and NODES[node] in strat.winners[0]:
            return []
        return None

    drive(strat, NODES, 1, answer)
    assert strat.scores[0] == {} and sorted(strat.scores[1]) == strat.winners[1]
    assert all(np.array_equal(strat.tiers[0][key], v) for key, v in before[0].items())
    assert not all(np.array_equal(strat.tiers[1][key], v) for key, v in before[1].items())


def test_the_utility_counts_only_the_tiers_winners_that_delivered():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    failed: dict[int, bool] = {}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "train" and not failed and c in strat.winners[0]:
            failed[c] = True
            return []
        return tier_accuracies(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    (lost,) = failed
    delivered = [c for c in strat.winners[0] if c != lost]
    assert strat.ledger_log[0]["tiers"][0]["utility"] == pytest.approx(np.mean([TIER_ACC[c][0] for c in delivered]))


def test_a_tier_drafted_after_round_one_is_settled_and_keeps_its_best_utility():
    # pifl.md §2.5: a tier nobody bid for drafts non-bidders for free; from round 2 on it is still settled (pifl.md
    # pifl.md §2.4):
    # its refund ratio comes from its utility gain and Acc^max_k stays the best of all rounds (here round 1's)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "max-refund": 0.4})

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "bid":
            return [with_metrics(content, bid=[0] if c < 2 else [])]
        if phase == "evaluate":
            return [with_metrics(content, tier_acc=[0.5, 0.8 if rnd == 1 else 0.6])]
        return None

    drive(strat, NODES, 2, answer)
    assert sorted(strat.winners[1]) == [2, 3] and strat.payers[1] == []
    entry = strat.ledger_log[1]["tiers"][1]
    assert entry["utility"] == pytest.approx(0.6) and entry["refund-ratio"] == pytest.approx(0.4)  # no gain: eta_R
    assert entry["payments"] == {} and entry["refunds"] == {} and entry["rewards"] == {2: 0, 3: 0}
    assert strat.ledger.best_utility[1] == pytest.approx(0.8)


def test_the_utility_is_the_mean_over_the_winners_whose_evaluation_arrived():
    # pifl.md §2.4 step 2: Acc_k is the mean a_ck over the tier's winners; one whose evaluate reply was lost is left out
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    lost: list[int] = []

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "evaluate" and not lost and c in strat.winners[0]:
            lost.append(c)
            return []
        return tier_accuracies(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    others = [c for c in strat.winners[0] if c not in lost]
    entry = strat.ledger_log[0]["tiers"][0]
    assert entry["delivered"] == strat.winners[0] and len(others) == 1
    assert entry["utility"] == pytest.approx(TIER_ACC[others[0]][0])


def test_a_round_in_which_every_training_failed_settles_nobody_and_keeps_the_payments_in_the_pools():
    # pifl.md §2.4 as the strategy resolves it: winners whose training did not arrive are neither refunded nor
    # rewarded; when no train reply arrives at all the tiers keep their models and the pools keep the payments
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})

    def answer(rnd, node, phase, content):
        if phase == "bid":
            return [with_metrics(content, bid=[NODES[node] % 2])]
        if rnd == 2 and phase == "train":
            return []
        return tier_accuracies(rnd, node, phase, content)

    drive(strat, NODES, 2, answer)
    entry = strat.ledger_log[1]
    for k in (0, 1):
        t = entry["tiers"][k]
        assert t["payers"] == strat.winners[k] and len(t["payers"]) == 2 and t["delivered"] == []
        assert t["refunds"] == {} and t["rewards"] == {} and t["utility"] is None
        assert t["pool"] == strat.ledger_log[0]["tiers"][k]["pool"] + 2 * strat.price
    assert entry["total"] == 400 * MICRO


def test_a_round_without_evaluation_refunds_nothing():
    strat = pifl_one_slot(**{"eval-every": 2, "bid-threshold": 0.0})
    drive(
        strat, NODES, 3, lambda rnd, node, phase, content: [with_metrics(content, bid=[0])] if phase == "bid" else None
    )
    by_round = {e["round"]: e for e in strat.ledger_log}
    tier = by_round[3]["tiers"][0]  # round 3 is not evaluated (eval-every 2, 4 rounds would evaluate in 4)
    assert tier["payers"] and tier["utility"] is None and tier["refund-ratio"] == 0.0
    assert all(v == 0 for v in tier["refunds"].values())
    assert sum(tier["rewards"].values()) + tier["pool"] >= len(tier["payers"]) * strat.price - 3


def test_a_winner_whose_training_failed_gets_no_refund_and_no_reward():
    strat = pifl_one_slot()
    failed: dict[int, bool] = {}

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
