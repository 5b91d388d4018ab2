"""What a PI-FL client may bid and reply, and how the auction places it (pifl.md §2.2, §2.4-§2.5): slots
that hold every client are reported, a bid the client cannot pay or for no tier of the run is refused, a bidder is
only placed in the tier it bid for, and a reply with a broken tier accuracy or source share is rejected."""

import logging

import pytest

from task.methods.pifl import MICRO
from tests.pifl.server_kit import NODES, pifl, pifl_one_slot
from tests.strategy_harness import drive, with_metrics

NO_AUCTION = "the auction would decide nothing"


def bid_for_tier_0(rnd, node, phase, content):
    return [with_metrics(content, bid=[0])] if phase == "bid" else None


def no_auction_warnings(caplog):
    return [r for r in caplog.records if NO_AUCTION in r.getMessage()]


def test_slots_that_hold_every_connected_client_are_reported_once(caplog):
    # pifl.md §2.4-§2.5: the slots of a tier are auctioned among its bidders; with slots-performance + slots-random
    # >= the connected clients every bidder wins every round, which the run must say (PIFLOptions.client_conflicts)
    strat = pifl(**{"slots-performance": 3, "slots-random": 1})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        drive(strat, NODES, 2, bid_for_tier_0)
        (warning,) = no_auction_warnings(caplog)  # at the first auction (round 2; round 1 is the free warm-up)
        drive(strat, NODES, [3], bid_for_tier_0)
    assert no_auction_warnings(caplog) == [warning]  # once
    assert warning.getMessage() == "[pifl] " + strat.options.client_conflicts(4)[0]
    assert warning.getMessage() == (
        "[pifl] slots-performance + slots-random = 4 is not less than the 4 connected clients: every bidder would win "
        "every round and the auction would decide nothing; use fewer slots or more clients"
    )
    assert sorted(strat.winners[0]) == [0, 1, 2, 3]  # indeed: every bidder won


def test_a_fifth_client_makes_the_auction_meaningful_and_losing_it_again_is_reported_again(caplog):
    strat = pifl(**{"slots-performance": 3, "slots-random": 1})
    five = {**NODES, 77: 4}
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        drive(strat, five, 2, bid_for_tier_0)
        assert no_auction_warnings(caplog) == [] and len(strat.winners[0]) == 4  # 4 slots, 5 bidders
        drive(strat, NODES, [3, 4], bid_for_tier_0)
    assert len(no_auction_warnings(caplog)) == 1


@pytest.mark.parametrize("slots", [(1, 1), (2, 1)])
def test_fewer_slots_than_clients_is_an_auction_and_not_reported(caplog, slots):
    strat = pifl(**{"slots-performance": slots[0], "slots-random": slots[1]})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        drive(strat, NODES, 3, bid_for_tier_0)
    assert no_auction_warnings(caplog) == []
    assert len(strat.winners[0]) == sum(slots)


def test_a_client_that_cannot_pay_has_its_bid_refused_and_is_not_charged():
    # pifl.md §2.2: a client with b_c < tau_p may not bid (the server does not trust the client on this)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 1)
    strat.ledger.balances[0] -= 100 * MICRO - (MICRO - 1)  # client 0 keeps one micro-token less than the price
    strat.ledger.pools[1] += 100 * MICRO - (MICRO - 1)
    drive(
        strat,
        NODES,
        [2],
        lambda rnd, node, phase, content: [with_metrics(content, bid=[0])] if phase == "bid" else None,
    )
    assert [(f["phase"], f.get("client")) for f in strat.failures] == [("bid", 0)]
    assert 0 not in strat.winners[0] and 0 not in strat.payers[0] and strat.ledger.balances[0] >= MICRO - 1
    assert sorted(strat.winners[0]) == sorted(strat.payers[0]) and set(strat.winners[0]) <= {1, 2, 3}
    strat.ledger.check()


# ------------------------------------------------------------------------------------------ what a reply may say
@pytest.mark.parametrize("bad", [[2], [-1], [0, 1], [0.5], [1, 1]])
def test_a_bid_for_no_tier_of_the_run_or_for_more_than_max_bids_tiers_is_refused(bad):
    # pifl.md §2.2: B_c holds tier ids 0..K-1, at most max-bids (1) of them; anything else is rejected, the client sits
    # the round out and pays nothing, and the others are scheduled as usual
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})

    def answer(rnd, node, phase, content):
        if phase == "bid":
            return [with_metrics(content, bid=bad if NODES[node] == 0 else [1])]
        return None

    drive(strat, NODES, 2, answer)
    assert [(f["round"], f["phase"], f["client"]) for f in strat.failures] == [(2, "bid", 0)]
    assert "bid" in strat.failures[0]["reason"]
    assert 0 not in strat.tier_of and strat.ledger_log[1]["balances"][0] == 100 * MICRO
    assert set(strat.winners[1]) <= {1, 2, 3} and len(strat.winners[1]) == 2 and strat.winners[0] == []


def test_a_valid_bid_for_the_last_tier_or_for_none_is_accepted():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "tiers": 3})
    bids = {0: [2], 1: [], 2: [0], 3: [1]}
    drive(
        strat,
        NODES,
        2,
        lambda rnd, node, phase, content: [with_metrics(content, bid=bids[NODES[node]])] if phase == "bid" else None,
    )
    assert strat.failures == []
    assert strat.winners == {0: [2], 1: [3], 2: [0]} and strat.payers == strat.winners  # client 1 bid for none


def test_the_source_share_is_optional_in_train_and_evaluate_replies_but_checked_when_given():
    # source-a-share only exists on two-source partitions: a reply without it is valid; one outside [0, 1] is not
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase in ("train", "evaluate"):
            metrics = dict(content["metrics"])
            if c == 3:
                metrics["source-a-share"] = 1.5
            else:
                metrics.pop("source-a-share", None)
            out = with_metrics(content)
            out["metrics"] = type(content["metrics"])(metrics)
            return [out]
        return None

    drive(strat, NODES, 1, answer)
    assert sorted((f["phase"], f["client"]) for f in strat.failures) == [("evaluate", 3), ("train", 3)]
    assert all("source-a-share" in f["reason"] for f in strat.failures)
    assert strat.source_share == {} and strat.client_eval.get(3) is None and strat.client_eval.get(0) is not None
    # no client said its share: the membership share of source A is unknown (None, null in the JSON), not NaN
    assert [t["source-a-share"] for t in strat.ledger_log[0]["tiers"].values()] == [None, None]


@pytest.mark.parametrize("seed", range(8))
def test_a_bidder_is_only_placed_in_the_tier_it_bid_for(seed):
    # round 2: clients 0, 1, 2 bid for tier 1, client 3 bids for nothing; tier 0 has no bidder
    strat = pifl_one_slot(seed=seed)
    bids = {0: [1], 1: [1], 2: [1], 3: []}

    def answer(rnd, node, phase, content):
        return [with_metrics(content, bid=bids[NODES[node]])] if phase == "bid" else None

    drive(strat, NODES, 2, answer, seed=seed)
    assert strat.winners[1] and set(strat.winners[1]) <= {0, 1, 2} and len(strat.winners[1]) == 2  # min(slots, bidders)
    assert strat.winners[0] == [3] and strat.payers[0] == []  # drafted from the non-bidders only, for free
    assert strat.payers[1] == strat.winners[1]


def test_a_reply_with_a_broken_tier_accuracy_is_rejected_and_sets_no_best_utility():
    for bad in ([float("nan"), 0.5], [0.5, 1e6], [0.5], [0.5, -0.1]):
        strat = pifl_one_slot()

        def answer(rnd, node, phase, content, bad=bad):
            if phase == "evaluate" and NODES[node] == 0:
                return [with_metrics(content, tier_acc=bad)]
            return None

        drive(strat, NODES, 1, answer)
        assert strat.client_eval.get(0) is None  # nothing of client 0's evaluation is recorded
        assert [(f["client"], f["phase"]) for f in strat.failures if "tier-acc" in f["reason"]] == [(0, "evaluate")], (
            bad
        )
        assert all(u is None or 0.0 <= u <= 1.0 for u in strat.ledger.best_utility.values())
