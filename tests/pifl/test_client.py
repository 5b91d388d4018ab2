"""What the PI-FL client must do (pifl.md §2.2, Algorithm 1): score every tier model on its validation split,
bid for the best one it can pay for (PI-FL(NI): a random one), train the tier it won, and mix the tier models
into its one-shot personalized model (Eq. 4) with weights from the calibration part of its goal data.

The tier models are fitted to known digits (LOW = 0-4, HIGH = 5-9), so the right choices are known in advance."""

import re

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from task.methods.pifl import MICRO
from task.params import record_to_numpy, to_record
from task.train import evaluate
from tests.client_kit import client, client_data, context, digits_of, numpy_state, trained_state

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def tier_models():
    c = client("pifl", client_data(LOW))
    init = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    low = trained_state(c.reset_model(), *digits_of(LOW, 30, 0))
    high = trained_state(c.reset_model(), *digits_of(HIGH, 30, 0))
    return init, low, high


def stacked(*states):
    return to_record({k: np.stack([numpy_state(s)[k] for s in states]) for k in states[0]})


def bid_message(tiers, balance=MICRO, price=MICRO, rnd=2):
    content = RecordDict({"tiers": tiers, "config": ConfigRecord({"server-round": rnd})})
    if balance is not None:
        content["ledger"] = ConfigRecord({"balance": balance, "price": price})
    return content


def ask(c, content):
    c.begin(content)
    reply = c.query("bid", content)
    m = reply.metric_records["metrics"]
    return list(m["bid"]), list(m["tier-acc"])


def accuracy(c, state, x, y):
    model = c.reset_model()
    model.load_state_dict(state)
    return evaluate(model, x, y)[1]


# ------------------------------------------------------------------------------------------ the bid
@pytest.mark.parametrize("order", [(1, 2), (2, 1)])
def test_a_client_bids_for_the_tier_most_accurate_on_its_validation_split(tier_models, order):
    # pifl.md §2.2 steps 1-2 (Eq. 3, Alg. 1 lines 5-6): a_ck on the validation split, B_c = {argmax_k a_ck}
    # (max_bids 1); the training and test splits hold the other source, so only the validation split decides
    states = [tier_models[i] for i in order]
    c = client("pifl", client_data(HIGH, val_classes=LOW, test_classes=HIGH))
    bid, accs = ask(c, bid_message(stacked(*states)))
    low_tier = order.index(1)
    assert bid == [low_tier]
    assert len(accs) == 2 and accs[low_tier] > 0.8 and accs[1 - low_tier] < 0.2
    assert accs == pytest.approx([accuracy(c, s, c.data.x_val, c.data.y_val) for s in states])


@pytest.mark.parametrize("threshold,order,best", [(0.0, (2, 1, 1), 1), (0.5, (1, 1), 0)])
def test_every_tier_above_the_threshold_still_gets_only_max_bids_bids(tier_models, threshold, order, best):
    # pifl.md §2.2 step 2: B_c = {k : a_ck >= T_h} u {argmax a_ck}, truncated to the max_bids (= 1) best tiers: a
    # threshold every tier passes does not make the client bid for more than its best tier
    c = client("pifl", client_data(LOW), **{"bid-threshold": threshold})
    bid, accs = ask(c, bid_message(stacked(*[tier_models[i] for i in order])))
    assert min(accs) >= threshold and bid == [best]  # equally good tiers: the lower id wins


def test_a_client_that_cannot_pay_the_price_does_not_bid(tier_models):
    # pifl.md §2.2: a client with b_c < tau_p may not bid; b_c == tau_p may; a message without a ledger offers no credit
    c = client("pifl", client_data(LOW))
    tiers = stacked(tier_models[2], tier_models[1])
    assert ask(c, bid_message(tiers, balance=MICRO - 1, price=MICRO))[0] == []
    assert ask(c, bid_message(tiers, balance=5, price=5))[0] == [1]
    assert ask(c, bid_message(tiers, balance=None))[0] == []
    assert ask(c, bid_message(tiers, balance=1, price=2))[0] == []
    ni = client("pifl-ni", client_data(LOW))
    assert ask(ni, bid_message(tiers, balance=MICRO - 1, price=MICRO))[0] == []
    assert len(ask(ni, bid_message(tiers, balance=MICRO, price=MICRO))[0]) == 1


def test_a_ledger_without_a_price_lets_a_funded_client_bid_and_one_without_a_balance_offers_no_credit(tier_models):
    # the price defaults to the smallest amount (one micro-token), never to nothing
    c = client("pifl", client_data(LOW))
    content = RecordDict({"tiers": stacked(tier_models[2], tier_models[1]), "ledger": ConfigRecord({"balance": 1})})
    assert ask(c, content)[0] == [1]
    content = RecordDict({"tiers": stacked(tier_models[2], tier_models[1]), "ledger": ConfigRecord({"balance": 0})})
    assert ask(c, content)[0] == []
    # and one without a balance offers no credit, as no ledger does
    content = RecordDict({"tiers": stacked(tier_models[2], tier_models[1]), "ledger": ConfigRecord({"price": 1})})
    assert ask(c, content)[0] == []


def test_without_incentive_each_client_bids_for_one_tier_uniformly_at_random(tier_models):
    # pifl.md §2.2 ablation PI-FL(NI): one tier chosen uniformly at random, whatever the accuracies say
    tiers = stacked(tier_models[2], tier_models[1], tier_models[0])
    picks = []
    for pid in range(4):
        c = client("pifl-ni", client_data(LOW), context("pifl-ni", pid=pid))
        picks += [ask(c, bid_message(tiers, rnd=r))[0] for r in range(2, 32)]
    assert all(len(p) == 1 and 0 <= p[0] < 3 for p in picks)
    counts = np.bincount([p[0] for p in picks], minlength=3)
    assert counts.min() > 20  # 120 draws: each tier about 40 times, not the most accurate one only
    c = client("pifl-ni", client_data(LOW), context("pifl-ni", pid=1))
    again = [ask(c, bid_message(tiers, rnd=r))[0] for r in range(2, 32)]
    assert again == picks[30:60]  # reproducible from the run's seed


def test_the_client_still_answers_identify_and_refuses_an_unknown_query(tier_models):
    c = client("pifl", client_data(LOW))
    content = RecordDict({"config": ConfigRecord({"server-round": 1})})
    c.begin(content)
    assert c.query("identify", content).metric_records["metrics"]["partition-id"] == 0
    with pytest.raises(ValueError, match="does not answer query"):
        c.query("fedsoft_u", content)


# ------------------------------------------------------------------------------------------ training
def test_a_winner_trains_the_tier_model_it_was_sent(tier_models):
    # pifl.md §2.2 step 4: local training of the tier model it was selected for, returning the weights and n_c
    init, low, _high = tier_models
    c = client("pifl", client_data(LOW))
    content = RecordDict(
        {
            "arrays": to_record(numpy_state(low)),
            "tier": ConfigRecord({"tier": 0}),
            "config": ConfigRecord({"server-round": 3}),
        }
    )
    c.begin(content)
    reply = c.train(content)
    out = {k: torch.from_numpy(v) for k, v in record_to_numpy(reply.array_records["arrays"]).items()}
    m = reply.metric_records["metrics"]
    assert m["num-examples"] == len(c.data.y_train)

    def dist(a, b):
        return sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in a) ** 0.5

    assert 0 < dist(out, low) < dist(out, init)  # trained, starting from the tier model, not from scratch
    assert "source-a-share" not in m


def test_a_two_source_client_reports_its_share_of_source_a(tier_models):
    c = client("pifl", client_data(LOW))
    c.data.meta["source-a-share"] = 0.9
    content = RecordDict(
        {"arrays": to_record(numpy_state(tier_models[1])), "config": ConfigRecord({"server-round": 2})}
    )
    c.begin(content)
    assert c.train(content).metric_records["metrics"]["source-a-share"] == pytest.approx(0.9)


# ------------------------------------------------------------------------------------------ the personalized model
def goal_data(calib_classes, test_classes):
    d = client_data(LOW, val_classes=HIGH, test_classes=test_classes)
    if calib_classes is not None:
        d.x_calib, d.y_calib = digits_of(calib_classes, 20, 145)
    return d


def evaluate_reply(c, tiers):
    content = RecordDict({"tiers": tiers, "config": ConfigRecord({"server-round": 4})})
    c.begin(content)
    return c.evaluate(content).metric_records["metrics"]


def test_the_mixture_weights_come_from_the_calibration_half_of_the_goal_data(tier_models):
    # pifl.md §2.2 step 3 (Eq. 4): upsilon_ck = a_ck / sum_j a_cj with a on the goal data's calibration half, P_c =
    # sum_k upsilon_ck omega_k; the validation split (HIGH here) and the held-out goal half do not choose the weights
    _init, low, high = tier_models
    c = client("pifl", goal_data(calib_classes=LOW, test_classes=HIGH))
    m = evaluate_reply(c, stacked(high, low))
    a = [accuracy(c, s, c.data.x_calib, c.data.y_calib) for s in (high, low)]
    assert list(m["mixture-weights"]) == pytest.approx([a[0] / sum(a), a[1] / sum(a)], abs=1e-6)
    assert m["mixture-weights"][1] > 0.8
    # the other metrics: each tier on the validation split (the tiers' utility) and on the held-out goal half
    assert list(m["tier-acc"]) == pytest.approx([accuracy(c, s, c.data.x_val, c.data.y_val) for s in (high, low)])
    assert list(m["tier-goal-acc"]) == pytest.approx(
        [accuracy(c, s, c.data.x_test, c.data.y_test) for s in (high, low)]
    )
    assert m["tier-acc"][0] > 0.8 and m["tier-goal-acc"][0] > 0.8  # HIGH validation and held-out data
    model = c.personal_model(RecordDict({"tiers": stacked(high, low)}))
    w = list(m["mixture-weights"])  # the weights the client reports
    mixed = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the client's network is reused
    for k, v in mixed.items():
        expected = w[0] * high[k].double() + w[1] * low[k].double()
        torch.testing.assert_close(v.double(), expected, rtol=1e-5, atol=1e-6)
    assert m["personal-acc"] == pytest.approx(accuracy(c, mixed, c.data.x_test, c.data.y_test))


def test_one_tier_model_or_one_hot_weights_give_that_tier_model(tier_models):
    # pifl.md §7 client-logic tests: P_c equals M_k under one-hot weights and equals M_1 when K = 1
    _init, low, _high = tier_models
    c = client("pifl", goal_data(calib_classes=LOW, test_classes=LOW), tiers=1)
    model = c.personal_model(RecordDict({"tiers": stacked(low)}))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, low[k])
    assert list(evaluate_reply(c, stacked(low))["mixture-weights"]) == [1.0]


def test_choosing_keeps_the_single_best_tier_where_it_beats_the_mixture_on_the_calibration_data(tier_models):
    # pifl-personal='choose': on calibration data of LOW digits and one HIGH digit both tiers score, so Eq. 4 mixes
    # them; the mixture of a tier fitted to LOW and one fitted to HIGH scores worse there than the LOW tier alone,
    # so the client keeps the LOW tier, as one-hot weights it reports; the default ('mixture') keeps Eq. 4's weights
    _init, low, high = tier_models
    tiers = stacked(high, low)
    mixture = client("pifl", goal_data(calib_classes=[*LOW, 5], test_classes=LOW))
    w = list(evaluate_reply(mixture, tiers)["mixture-weights"])
    assert 0 < w[1] < 1  # a real mixture
    mixed = mixture.personal_model(RecordDict({"tiers": tiers})).state_dict()
    calibration = (mixture.data.x_calib, mixture.data.y_calib)
    assert accuracy(mixture, low, *calibration) > accuracy(mixture, mixed, *calibration)  # the case this pins
    chooser = client("pifl", goal_data(calib_classes=[*LOW, 5], test_classes=LOW), **{"pifl-personal": "choose"})
    m = evaluate_reply(chooser, tiers)
    assert list(m["mixture-weights"]) == [0.0, 1.0]
    for k, v in chooser.personal_model(RecordDict({"tiers": tiers})).state_dict().items():
        torch.testing.assert_close(v, low[k])
    assert m["personal-acc"] == pytest.approx(accuracy(chooser, low, chooser.data.x_test, chooser.data.y_test))


def test_choosing_keeps_the_mixture_where_no_single_tier_beats_it(tier_models):
    # two equal tiers: the mixture is each of them, no tier scores strictly higher, so Eq. 4's weights stay
    _init, low, _high = tier_models
    c = client("pifl", goal_data(calib_classes=LOW, test_classes=LOW), **{"pifl-personal": "choose"})
    assert list(evaluate_reply(c, stacked(low, low))["mixture-weights"]) == pytest.approx([0.5, 0.5])


def test_on_a_node_data_file_the_test_split_is_halved_calibration_first(tier_models):
    # pifl.md §2.2 step 3: split the goal data into a calibration half (for upsilon) and a held-out half (reported);
    # a node's own data file has only a test split, which may follow another distribution than its training data:
    # its first half calibrates, the second half is scored
    _, low, high = tier_models
    d = client_data(LOW, val_classes=HIGH)
    d.meta["data-path"] = "/data/me.npz"
    xl, yl = digits_of(LOW, 10, 120)
    xh, yh = digits_of(HIGH, 11, 120)
    d.x_test, d.y_test = torch.cat([xl, xh]), torch.cat([yl, yh])  # 50 LOW then 55 HIGH: halves at 52
    c = client("pifl", d)
    (_xc, yc), (xe, ye) = c.goal_splits()
    assert len(yc) == 52 and len(ye) == 53
    torch.testing.assert_close(torch.cat([yc, ye]), d.y_test)
    _x, y = c.test_split()
    torch.testing.assert_close(y, ye)
    m = evaluate_reply(c, stacked(high, low))
    assert m["mixture-weights"][1] > 0.8  # calibrated on the (mostly LOW) first half
    assert list(m["tier-goal-acc"]) == pytest.approx([accuracy(c, s, xe, ye) for s in (high, low)])


def test_on_a_partition_of_the_embedded_data_the_validation_split_calibrates_and_the_whole_test_split_is_scored(
    tier_models,
):
    # the goal data of a partition without a goal set of its own follows the client's own distribution, so the
    # validation split calibrates the mixture, and the personalized model is scored on the whole test split: the
    # same data every other method is scored on (a halved test split made PI-FL's accuracy incomparable)
    _, low, high = tier_models
    c = client("pifl", client_data(LOW, val_classes=HIGH, test_classes=LOW))
    (_, yc), (_, ye) = c.goal_splits()
    assert yc is c.data.y_val and ye is c.data.y_test
    x, y = c.test_split()
    assert y is c.data.y_test and x is c.data.x_test  # what the base (every other method) scores on
    m = evaluate_reply(c, stacked(high, low))
    assert m["test-examples"] == len(c.data.y_test)
    a = [accuracy(c, s, c.data.x_val, c.data.y_val) for s in (high, low)]
    assert list(m["mixture-weights"]) == pytest.approx([a[0] / sum(a), a[1] / sum(a)], abs=1e-6)
    assert m["mixture-weights"][0] > 0.8  # calibrated on the (HIGH) validation split, not on the (LOW) test split
    assert list(m["tier-goal-acc"]) == pytest.approx(
        [accuracy(c, s, c.data.x_test, c.data.y_test) for s in (high, low)]
    )


def test_a_calibration_split_is_used_as_is_and_the_test_split_is_the_held_out_half(tier_models):
    c = client("pifl", goal_data(calib_classes=HIGH, test_classes=LOW))
    (_xc, yc), (_xe, ye) = c.goal_splits()
    assert yc is c.data.y_calib and ye is c.data.y_test and c.test_split()[1] is c.data.y_test


def test_scoring_the_tiers_for_a_bid_is_accounted_as_method_work(tier_models):
    # the client's replies split its wall time by phase (time-train, time-method): scoring every tier model for
    # the bid (Eq. 3, Alg. 1) is PI-FL's own client work, so the bid reply reports it as time-method
    _init, low, high = tier_models
    c = client("pifl", client_data(LOW))
    content = bid_message(stacked(high, low))
    c.begin(content)
    m = c.query("bid", content).metric_records["metrics"]
    assert sorted(k for k in m if k.startswith("time-")) == ["time-method"] and m["time-method"] > 0


def test_the_mixture_is_accounted_as_method_work_in_the_next_reply(tier_models):
    # scoring the tiers on the goal data and mixing them (Eq. 4) is method work too, reported as time-method (the
    # evaluate reply's timings are taken before its evaluation, so the next reply carries it)
    _init, low, high = tier_models
    c = client("pifl", goal_data(calib_classes=LOW, test_classes=HIGH))
    assert not any(k.startswith("time-") for k in evaluate_reply(c, stacked(high, low)))  # nothing timed before
    content = RecordDict({"config": ConfigRecord({"server-round": 4})})
    m = c.query("identify", content).metric_records["metrics"]
    assert sorted(k for k in m if k.startswith("time-")) == ["time-method"] and m["time-method"] > 0


def counters(state):
    return {k: v for k, v in state.items() if not v.is_floating_point()}


def test_integer_buffers_of_the_tier_models_are_kept_as_they_are_not_mixed():
    # Eq. 4 mixes the tier models' weights; a model with BatchNorm also holds integer counters
    # (num_batches_tracked), which are no weights: the personalized model keeps them as they are in the tier
    # models (every tier has trained the same number of batches here), never a weighted sum cut to an integer
    c = client("pifl", goal_data(calib_classes=LOW, test_classes=LOW), model="cnn")
    base = c.reset_model().state_dict()
    assert counters(base)  # the CNN does have integer buffers
    tiers = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        tiers.append(
            {
                k: (v + 0.1 * torch.randn_like(v) if v.is_floating_point() else torch.full_like(v, 7))
                for k, v in base.items()
            }
        )
    # goal labels each tier gets half right (its own predictions), so the mixture weights are strictly between 0 and 1
    preds = []
    for state in tiers:
        model = c.reset_model()
        model.load_state_dict(state)
        model.eval()
        with torch.no_grad():
            preds.append(model(c.data.x_calib).argmax(1))
    half = len(preds[0]) // 2
    c.data.y_calib = torch.cat([preds[0][:half], preds[1][half:]])
    model = c.personal_model(RecordDict({"tiers": stacked(*tiers)}))
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the client's network is reused
    w = list(evaluate_reply(c, stacked(*tiers))["mixture-weights"])  # the weights the client reports
    assert 0 < w[0] < 1 and sum(w) == pytest.approx(1.0)  # a real mixture of the two tiers
    for k, v in counters(out).items():
        assert v.dtype == base[k].dtype and int(v) == 7
    for k, v in out.items():
        if v.is_floating_point():
            torch.testing.assert_close(
                v.double(), w[0] * tiers[0][k].double() + w[1] * tiers[1][k].double(), rtol=1e-5, atol=1e-6
            )
    # K = 1: the personalized model is the tier model itself, counters included (pifl.md §7 client-logic tests)
    out = {
        k: v.detach().clone()
        for k, v in c.personal_model(RecordDict({"tiers": stacked(tiers[1])})).state_dict().items()
    }
    assert list(evaluate_reply(c, stacked(tiers[1]))["mixture-weights"]) == [1.0]
    for k, v in out.items():
        torch.testing.assert_close(v, tiers[1][k])


@pytest.mark.parametrize(
    "key, bad",
    [("balance", 1.5), ("balance", "100"), ("balance", True), ("price", 0.5), ("price", [MICRO]), ("price", b"\x01")],
)
def test_a_bid_query_whose_ledger_is_not_two_integers_is_refused_naming_the_keys(tier_models, key, bad):
    """The server's ledger record is read as integer micro-tokens; anything else is a malformed message, refused with
    the keys that must be integers and what arrived, instead of being rounded into a bid."""
    _, low, high = tier_models
    c = client("pifl", client_data(LOW))
    ask(c, bid_message(stacked(low, high)))  # the well-formed message is answered
    allowed = "'ledger' needs integer 'balance' and 'price'"
    with pytest.raises(ValueError, match=re.escape(allowed)) as err:
        ask(c, bid_message(stacked(low, high), **{key: bad}))
    assert repr(bad) in str(err.value)  # what arrived
