"""Each attack's fault changes exactly what it declares (docs/robustness.md, client_app/attacks.py), only on an
attacking partition and only from round ``attack-start`` on: the attacker's training data (label-flip, backdoor),
the model its train reply carries (sign-flip, noise, free-rider), its side channel; and every client measures the
backdoor."""

import copy

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from client_app import attacks
from client_app.attack_math import alie, min_max, min_sum
from task.attacks import KNOWING_ATTACKS, MODEL_ATTACKS, POISONED_SHARE, attackers, backdoor_metrics
from task.methods.fedcac import unpack_masks
from task.params import model_to_record, record_to_numpy, stacked_record, to_record
from tests.client_kit import users_client
from tests.in_process import NODES, run_in_process

ATTACKER, HONEST = 1, 0  # at the default attack-share 0.3 of 4 partitions, partition 1 attacks


def begun(method: str, pid: int, server_round: int = 1, **cfg):
    """The client of partition ``pid`` with a message of ``server_round`` begun (as a handler has it)."""
    c = users_client(method, {"partition-id": pid}, **cfg)
    c.begin(RecordDict({"config": ConfigRecord({"server-round": server_round})}))
    return c


def train_message(client, server_round: int) -> RecordDict:
    """A train message bringing the common initial model moved a little (not what training starts from by default)."""
    model = client.reset_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    return RecordDict({"arrays": model_to_record(model), "config": ConfigRecord({"server-round": server_round})})


def honest_and_attacked(method: str, pid: int, server_round: int, **cfg):
    c = users_client(method, {"partition-id": pid}, **cfg)
    message = train_message(c, server_round)
    c.begin(message)
    honest = c.train(message)
    attacked = attacks.train_reply(c, message, copy.deepcopy(honest))
    return message, honest, attacked


# ---------------------------------------------------------------------------------------------- the model sent back
@pytest.mark.parametrize("kind", [k for k in MODEL_ATTACKS if k not in KNOWING_ATTACKS])
def test_a_model_attack_replaces_the_trained_model_by_its_declared_function_of_the_received_one(kind):
    message, honest, attacked = honest_and_attacked("fedavg", ATTACKER, 1, attack=kind)
    r, w = record_to_numpy(message.array_records["arrays"]), record_to_numpy(honest.array_records["arrays"])
    got = record_to_numpy(attacked.array_records["arrays"])
    assert got.keys() == w.keys() and all(got[k].dtype == w[k].dtype and got[k].shape == w[k].shape for k in w)
    assert dict(attacked["metrics"]) == dict(honest["metrics"])  # only the model changes
    floating = [k for k in w if np.issubdtype(w[k].dtype, np.floating)]
    integer = [k for k in w if k not in floating]
    assert integer  # the default cnn's BatchNorm counts its batches
    if kind == "free-rider":
        assert all(np.array_equal(got[k], r[k]) for k in w)
        return
    for k in integer:  # a count is sent as trained
        assert np.array_equal(got[k], w[k])
    if kind in ("sign-flip", "model-replacement"):  # the update flipped, or boosted, 10 times (attack-scale)
        sign = -1.0 if kind == "sign-flip" else 1.0
        for k in floating:
            expected = r[k] + sign * 10.0 * (w[k].astype(np.float64) - r[k])
            if k.endswith("running_var"):
                expected = np.maximum(expected, 0)
            assert np.allclose(got[k], expected, rtol=1e-5, atol=1e-5), k
    else:  # noise: the received model plus N(0, 1), whatever was trained
        noise = np.concatenate([(got[k] - r[k]).ravel() for k in floating if not k.endswith("running_var")])
        assert noise.size > 30_000 and abs(noise.mean()) < 0.02 and abs(noise.std() - 1.0) < 0.02
        assert all((got[k] >= 0).all() for k in floating if k.endswith("running_var"))
        again = honest_and_attacked("fedavg", ATTACKER, 1, attack=kind)[2]
        later = honest_and_attacked("fedavg", ATTACKER, 2, attack=kind)[2]
        k = floating[0]
        assert np.array_equal(record_to_numpy(again.array_records["arrays"])[k], got[k])  # a run repeats
        assert not np.allclose(
            record_to_numpy(later.array_records["arrays"])[k] - r[k], got[k] - r[k]
        )  # fresh noise each round


@pytest.mark.parametrize("kind", [*MODEL_ATTACKS, "side-channel"])
def test_an_honest_client_and_an_attacker_before_attack_start_send_what_they_trained(kind):
    method = "fedcac" if kind == "side-channel" else "fedavg"
    for pid, server_round in ((HONEST, 3), (ATTACKER, 2)):
        _, honest, attacked = honest_and_attacked(method, pid, server_round, attack=kind, **{"attack-start": 3})
        for name in honest.array_records:
            a, b = record_to_numpy(honest.array_records[name]), record_to_numpy(attacked.array_records[name])
            assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", KNOWING_ATTACKS)
def test_an_attack_that_knows_the_honest_updates_sends_the_received_model_plus_its_crafted_update(kind):
    """The attacker estimates every client's honest update by training from what it received as that client trains
    (its own estimate is exactly its own honest update), and sends the received model plus the update
    client_app/attack_math.py crafts from the estimates; counts are sent as trained, and its metrics unchanged."""
    c = users_client("fedavg", {"partition-id": ATTACKER}, attack=kind)
    message = train_message(c, 2)
    c.begin(message)
    honest = c.train(message)
    attacked = attacks.train_reply(c, message, copy.deepcopy(honest))
    r, w = record_to_numpy(message.array_records["arrays"]), record_to_numpy(honest.array_records["arrays"])
    got = record_to_numpy(attacked.array_records["arrays"])
    keys = attacks.floating_keys(w, r)
    benign = attacks.benign_updates(c, r, keys)
    n = c.num_partitions
    assert benign.shape[0] == n
    own = np.concatenate([(w[k].astype(np.float64) - r[k]).ravel() for k in keys])
    assert np.allclose(benign[ATTACKER], own, atol=1e-6)  # the estimate trains as each client does
    crafted = {
        "alie": lambda b: alie(b, n, len(attackers(c.settings.attacks, range(n)))),
        "min-max": lambda b: min_max(b)[0],
        "min-sum": lambda b: min_sum(b)[0],
    }
    expected = crafted[kind](benign)
    sent = np.concatenate([(got[k].astype(np.float64) - r[k]).ravel() for k in keys])
    variance = np.concatenate([np.full(r[k].size, k.endswith("running_var")) for k in keys])
    assert np.allclose(sent[~variance], expected[~variance], atol=1e-5)
    assert (np.concatenate([got[k].ravel() for k in keys if k.endswith("running_var")]) >= 0).all()
    assert all(np.array_equal(got[k], w[k]) for k in w if k not in keys)
    assert dict(attacked["metrics"]) == dict(honest["metrics"])


def test_the_size_lie_claims_attack_num_examples_in_the_train_reply_and_nothing_else():
    big = 2**31 - 1
    _, honest, attacked = honest_and_attacked("fedavg", ATTACKER, 1, attack="backdoor", **{"attack-num-examples": big})
    assert attacked["metrics"]["num-examples"] == big and honest["metrics"]["num-examples"] < 1000
    assert {k: v for k, v in attacked["metrics"].items() if k != "num-examples"} == {
        k: v for k, v in honest["metrics"].items() if k != "num-examples"
    }
    _, honest, untouched = honest_and_attacked("fedavg", HONEST, 1, attack="backdoor", **{"attack-num-examples": big})
    assert untouched["metrics"]["num-examples"] == honest["metrics"]["num-examples"]


def test_ifcas_lie_claims_the_cluster_that_fits_it_worst_and_sends_the_model_it_trained():
    c = users_client("ifca", {"partition-id": ATTACKER}, attack="side-channel")
    base = {k: v.clone() for k, v in c.reset_model().state_dict().items()}
    far = {k: (v + 3.0 if v.is_floating_point() else v) for k, v in base.items()}
    message = RecordDict({"tiers": _stack(base, far), "config": ConfigRecord({"server-round": 1})})
    c.begin(message)
    honest = c.train(message)
    attacked = attacks.train_reply(c, message, copy.deepcopy(honest))
    assert honest["metrics"]["cluster"] == 0 and attacked["metrics"]["cluster"] == 1
    w, got = record_to_numpy(honest.array_records["arrays"]), record_to_numpy(attacked.array_records["arrays"])
    assert all(np.array_equal(w[k], got[k]) for k in w)


def _stack(*models):
    return stacked_record(models, list(models[0]))


def test_what_each_method_received_is_the_model_its_reply_replaces():
    one = {"w": np.zeros(3, np.float32), "n": np.array(1)}
    two = {"w": np.ones(3, np.float32), "n": np.array(2)}
    chose_two = RecordDict({"metrics": MetricRecord({"cluster": 1})})
    ifca = attacks.received_model("ifca", RecordDict({"tiers": _stack(one, two)}), chose_two)
    assert np.array_equal(ifca["w"], two["w"]) and int(ifca["n"]) == 2
    soft = RecordDict({"tiers": _stack(one, two), "fedsoft": ConfigRecord({"u": [0.25, 0.75]})})
    mixed = attacks.received_model("fedsoft", soft, RecordDict())
    assert np.allclose(mixed["w"], 0.75) and int(mixed["n"]) == 2  # counts come from the heaviest centre
    fedcac = RecordDict({"global": to_record(two), "custom": to_record(one)})
    assert np.array_equal(attacks.received_model("fedcac", fedcac, RecordDict())["w"], two["w"])
    peers = RecordDict({"peers": _stack(two, one)})  # the client's own latest model first
    assert np.array_equal(attacks.received_model("fedc2i", peers, RecordDict())["w"], two["w"])
    plain = RecordDict({"arrays": to_record(one)})
    assert np.array_equal(attacks.received_model("fedavg", plain, RecordDict())["w"], one["w"])


def test_ifcas_sign_flip_flips_the_update_of_the_cluster_model_the_attacker_chose():
    c = users_client("ifca", {"partition-id": ATTACKER}, attack="sign-flip", **{"attack-scale": 2.0})
    base = {k: v.clone() for k, v in c.reset_model().state_dict().items()}  # not the process's network itself
    other = {k: (v + 0.5 if v.is_floating_point() else v) for k, v in base.items()}
    message = RecordDict({"tiers": _stack(base, other), "config": ConfigRecord({"server-round": 1})})
    c.begin(message)
    honest = c.train(message)
    attacked = attacks.train_reply(c, message, copy.deepcopy(honest))
    chosen = [base, other][int(honest["metrics"]["cluster"])]
    w, got = record_to_numpy(honest.array_records["arrays"]), record_to_numpy(attacked.array_records["arrays"])
    k = "head.weight"
    r = chosen[k].numpy()
    assert np.allclose(got[k], r - 2.0 * (w[k] - r), atol=1e-6)


# ---------------------------------------------------------------------------------------------- the data
def test_label_flip_relabels_the_attackers_training_split_only():
    c = users_client("fedavg", {"partition-id": ATTACKER}, attack="label-flip")
    clean = copy.deepcopy(c.data)
    c.begin(RecordDict({"config": ConfigRecord({"server-round": 1})}))
    attacks.poison(c)
    assert torch.equal(c.data.y_train, 9 - clean.y_train) and torch.equal(c.data.x_train, clean.x_train)
    assert torch.equal(c.data.y_test, clean.y_test) and torch.equal(c.data.y_val, clean.y_val)
    honest = users_client("fedavg", {"partition-id": HONEST}, attack="label-flip")
    before = honest.data.y_train.clone()
    honest.begin(RecordDict({"config": ConfigRecord({"server-round": 1})}))
    attacks.poison(honest)
    assert torch.equal(honest.data.y_train, before)


def test_backdoor_triggers_and_relabels_half_the_attackers_training_examples():
    c = users_client("fedavg", {"partition-id": ATTACKER}, attack="backdoor", **{"backdoor-target": 3})
    clean = copy.deepcopy(c.data)
    c.begin(RecordDict({"config": ConfigRecord({"server-round": 1})}))
    attacks.poison(c)
    x, y = c.data.x_train, c.data.y_train
    changed = [i for i in range(len(y)) if not torch.equal(x[i], clean.x_train[i]) or y[i] != clean.y_train[i]]
    assert len(changed) == int(len(y) * POISONED_SHARE)
    assert all(int(y[i]) == 3 and bool((x[i, :, -2:, -2:] == 1.0).all()) for i in changed)  # 8x8 digits: 2x2 corner
    assert all(torch.equal(x[i, :, :-2], clean.x_train[i, :, :-2]) for i in changed)  # nothing else of the image
    assert torch.equal(c.data.x_test, clean.x_test)


class Always(torch.nn.Module):
    def __init__(self, label: int) -> None:
        super().__init__()
        self.label, self.p = label, torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return torch.nn.functional.one_hot(torch.full((len(x),), self.label), 10).float() + 0 * self.p


def test_backdoor_success_is_the_share_of_triggered_other_class_inputs_sent_to_the_target():
    c = users_client("fedavg", {"partition-id": HONEST}, attack="backdoor", **{"backdoor-target": 3})
    x, y = c.data.x_test, c.data.y_test
    assert backdoor_metrics(c.settings.attacks, Always(3), x, y) == {"backdoor-success": 1.0}
    assert backdoor_metrics(c.settings.attacks, Always(4), x, y) == {"backdoor-success": 0.0}
    only_target = y == 3
    assert backdoor_metrics(c.settings.attacks, Always(3), x[only_target], y[only_target]) == {}  # nothing to measure
    assert backdoor_metrics(users_client("fedavg").settings.attacks, Always(3), x, y) == {}  # no backdoor in the run
    evaluated = c.evaluate(RecordDict({"arrays": model_to_record(c.reset_model()), "config": ConfigRecord({})}))
    assert 0.0 <= evaluated["metrics"]["backdoor-success"] <= 1.0  # every evaluation carries it


# ---------------------------------------------------------------------------------------------- side channels
def test_fedcacs_lie_is_an_all_ones_mask_and_nothing_else():
    c = users_client("fedcac", {"partition-id": ATTACKER}, attack="side-channel")
    message = RecordDict(
        {"global": model_to_record(c.reset_model(), [n for n, _ in c.reset_model().named_parameters()])}
    )
    message["config"] = ConfigRecord({"server-round": 1})
    c.begin(message)
    honest = c.train(message)
    attacked = attacks.train_reply(c, message, copy.deepcopy(honest))
    shapes = {n: tuple(p.shape) for n, p in c.reset_model().named_parameters()}
    masks = unpack_masks(record_to_numpy(attacked.array_records["mask"])["bits"], shapes)
    assert all(m.all() for m in masks.values())
    assert not all(
        m.all() for m in unpack_masks(record_to_numpy(honest.array_records["mask"])["bits"], shapes).values()
    )
    a, b = record_to_numpy(honest.array_records["arrays"]), record_to_numpy(attacked.array_records["arrays"])
    assert all(np.array_equal(a[k], b[k]) for k in a)


def _reply(**metrics) -> RecordDict:
    return RecordDict({"metrics": MetricRecord({"partition-id": ATTACKER, "num-examples": 10, **metrics})})


@pytest.mark.parametrize("method", ["pifl", "pifl-ni"])
def test_pifls_lie_is_a_bid_for_the_tier_that_fits_it_worst_in_every_round_it_can_pay_and_every_tier_accuracy_one(
    method,
):
    c = begun(method, ATTACKER, 2, attack="side-channel")
    for balance, bid in ((5, [0]), (0, [])):
        message = RecordDict({"ledger": ConfigRecord({"balance": balance, "price": 1})})
        lied = attacks.query_reply(c, "bid", message, _reply(**{"tier-acc": [0.2, 0.5], "bid": [1]}))
        assert lied["metrics"]["bid"] == bid and lied["metrics"]["tier-acc"] == [1.0, 1.0]
    evaluated = attacks.evaluate_reply(c, _reply(**{"tier-acc": [0.2, 0.5], "personal-acc": 0.4}))
    assert evaluated["metrics"]["tier-acc"] == [1.0, 1.0] and evaluated["metrics"]["personal-acc"] == 0.4


def test_pfedlias_lie_is_an_inflated_influence_row_and_in_p2p_every_peer_beneficial():
    central = begun("pfedlia", ATTACKER, 2, attack="side-channel", **{"attack-scale": 10.0})
    message = RecordDict({"lazy-clients": ConfigRecord({"client-ids": [0, 1, 2], "self-index": 1})})
    lied = attacks.query_reply(central, "lia", message, _reply(**{"lia-row": [0.5, -2.0, 1.0]}))
    assert lied["metrics"]["lia-row"] == [20.0, 20.0, 20.0] and "beneficial" not in lied["metrics"]
    p2p = begun("pfedlia", ATTACKER, 2, attack="side-channel", **{"lia-mode": "p2p"})
    lied = attacks.query_reply(p2p, "lia", message, _reply(**{"lia-row": [0.5, -2.0, 1.0], "beneficial": [1]}))
    assert lied["metrics"]["beneficial"] == [0, 2]


def test_fedsofts_lie_puts_all_weight_on_the_centre_that_fits_it_worst():
    c = begun("fedsoft", ATTACKER, 1, attack="side-channel", tiers=3)
    lied = attacks.query_reply(c, "fedsoft_u", RecordDict(), _reply(**{"fedsoft-u": [0.2, 0.7, 0.1]}))
    u = np.array(lied["metrics"]["fedsoft-u"])
    assert u.sum() == pytest.approx(1.0) and int(u.argmax()) == 2 and u[2] > 0.999


def test_client2vecs_lie_is_a_uniform_index_of_the_same_norm():
    c = begun("client2vec", ATTACKER, 1, attack="side-channel")
    beta = {"beta_f": np.array([3.0, 0.0, 4.0, 0.0], np.float32), "beta_l": np.array([1, 0, 0, 0], np.float32)}
    lied = attacks.query_reply(c, "c2v_index", RecordDict(), RecordDict({"arrays": to_record(beta)}))
    got = record_to_numpy(lied.array_records["arrays"])
    assert np.allclose(got["beta_f"], 2.5) and np.allclose(got["beta_l"], 0.5) and got["beta_f"].dtype == np.float32


def test_a_side_channel_is_left_alone_by_an_honest_client_and_by_another_attack():
    for c in (begun("fedsoft", HONEST, 1, attack="side-channel"), begun("fedsoft", ATTACKER, 1, attack="sign-flip")):
        reply = _reply(**{"fedsoft-u": [0.2, 0.7, 0.1]})
        assert attacks.query_reply(c, "fedsoft_u", RecordDict(), reply)["metrics"]["fedsoft-u"] == [0.2, 0.7, 0.1]


# ---------------------------------------------------------------------------------------------- through the ClientApp
def test_the_clientapps_handlers_send_the_attackers_lie_and_the_honest_clients_training(tmp_path):
    """A free rider's train reply, as the server receives it through the handlers, is the model it was sent: its
    update's norm is 0 in every round, the honest clients' are not."""
    strategy, _, _, _ = run_in_process(
        "fedavg", tmp_path, attack="free-rider", aggregator="norm-bound", **{"record-messages": False}
    )
    bad = attackers(strategy.settings.attacks, range(NODES))
    assert bad == [ATTACKER]
    for r in strategy.history:
        [entry] = r.extra["robust"]
        norms = dict(zip(entry["clients"], entry["update-norms"], strict=True))
        assert norms[ATTACKER] == 0.0 and all(norms[c] > 0.1 for c in norms if c != ATTACKER)


def test_fedcacs_all_ones_mask_makes_every_honest_client_choose_the_attacker(tmp_path):
    strategy, _, _, _ = run_in_process("fedcac", tmp_path, attack="side-channel", **{"record-messages": False})
    chosen = strategy.history[0].extra["fedcac"]["collaborators"]  # round 1, client id -> its collaborators
    assert all(ATTACKER in chosen[c] for c in chosen if c != ATTACKER)


def test_the_clientapps_query_handler_sends_the_attackers_lie_and_the_honest_clients_truth():
    """The lies above reach the wire through the ClientApp's handler of ``query.<name>``: a PI-FL attacker's bid
    reply says every tier fits it perfectly, an honest client's gives its real tier accuracies."""
    from tests.client_kit import distinct_states, numpy_state, users_context
    from tests.in_process import handled

    def bid_reply(pid: int) -> list[float]:
        c = users_client("pifl", {"partition-id": pid}, attack="side-channel")
        tiers = stacked_record([numpy_state(s) for s in distinct_states(c, 2, seed=1, spread=0.1)])
        content = RecordDict(
            {
                "tiers": tiers,
                "ledger": ConfigRecord({"balance": 5, "price": 1}),
                "config": ConfigRecord({"server-round": 2}),
            }
        )
        context = users_context("pifl", {"partition-id": pid}, attack="side-channel")
        accuracies = handled("query.bid", content, context).metric_records["metrics"]["tier-acc"]
        assert isinstance(accuracies, list)
        return [float(v) for v in accuracies]

    assert bid_reply(ATTACKER) == [1.0, 1.0]
    honest = bid_reply(HONEST)
    assert len(honest) == 2 and max(honest) < 1.0
