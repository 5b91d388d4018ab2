"""What a FedC2I client must do with the models it is sent (fedc2i.md §2.2, §2.5, §6.7, §6.10, §6.18, §7).

The client is driven through its message handler (``train``) with ``local-epochs = 0``, so the model it replies
with is exactly the personalized model it built before training.  The expected model is rebuilt here the slow,
obvious way from the equations: an explicit leave-one-out network per client, the classifier edited row by row,
the power ratio ``l^gamma / sum_j l^gamma``.  The influence batch is made the whole training split
(``influence-batch-size`` above its size), so the expectation does not depend on which samples were drawn.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from torch import nn

from task.config import parse_settings
from task.methods import METHODS, load_object
from task.models import build_model
from task.params import record_to_numpy, stacked_record, to_record
from tests.client_kit import distinct_states

PEER_SIZES = [37, 311]  # the peers' training-set sizes the server reports (unequal on purpose)


def make_client(**cfg):
    cfg = {"method": "fedc2i", "partition": "iid", "local-epochs": 0, "influence-batch-size": 100_000, **cfg}
    ctx = Context(
        run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 3}, state=RecordDict(), run_config=cfg
    )
    return load_object(METHODS["fedc2i"].client)(ctx, parse_settings(cfg))


def payload(states, sizes=None, server_round=2):
    content = RecordDict(
        {
            "peers": stacked_record([{k: v.numpy() for k, v in s.items()} for s in states]),
            "config": ConfigRecord({"server-round": server_round}),
        }
    )
    if len(states) > 1:
        sizes = sizes or PEER_SIZES[: len(states) - 1]
        content["peer-clients"] = ConfigRecord({"client-ids": list(range(1, len(states))), "num-examples": sizes})
    return content


def run_train(client, content):
    client.begin(content)
    reply = client.train(content)
    arrays = {k: torch.as_tensor(v) for k, v in record_to_numpy(reply["arrays"]).items()}
    return arrays, dict(reply["metrics"])


def ce(client, state, x, y):
    net = client.reset_model()
    net.load_state_dict(state)
    net.eval()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(net(x), y))


def power_ratio(losses, gamma):
    powered = np.asarray(losses, dtype=np.float64) ** gamma
    return powered / powered.sum()


def mean_of(states, idx, name):
    return torch.stack([states[j][name] for j in idx]).mean(0)


def naive_lambda(client, states, gamma):
    """Eq. 5: leave model i out of the extractor average, keep the client's own classifier, score on the batch."""
    x, y = client.data.x_train, client.data.y_train
    own, k = states[0], len(states)
    losses = []
    for i in range(k):
        others = [j for j in range(k) if j != i]
        state = {
            n: (v if n.startswith("head.") or not v.is_floating_point() else mean_of(states, others, n))
            for n, v in own.items()
        }
        losses.append(ce(client, state, x, y))
    return power_ratio(losses, gamma)


def naive_big_lambda(client, states, theta_star, gamma):
    """Eqs. 7-9 with the extractor ``theta_star``: row c of the client's own classifier replaced by the
    leave-one-out class-c row (bias with it), one network per (i, c); normalised over clients per class."""
    x, y = client.data.x_train, client.data.y_train
    own, k = states[0], len(states)
    classes = own["head.bias"].shape[0]
    losses = np.zeros((k, classes))
    for i in range(k):
        others = [j for j in range(k) if j != i]
        for c in range(classes):
            w, b = own["head.weight"].clone(), own["head.bias"].clone()
            w[c] = mean_of(states, others, "head.weight")[c]
            b[c] = mean_of(states, others, "head.bias")[c]
            losses[i, c] = ce(client, {**theta_star, "head.weight": w, "head.bias": b}, x, y)
    return np.stack([power_ratio(losses[:, c], gamma) for c in range(classes)], axis=1)


def mixed(states, weights, names):
    """Eq. 6: sum_i weights_i * w_i for float tensors; integer buffers stay the client's own."""
    out = {}
    for n in names:
        v = states[0][n]
        out[n] = sum(float(weights[i]) * states[i][n] for i in range(len(states))) if v.is_floating_point() else v
    return out


def eq10(states, big_lambda):
    """Eq. 10 (corrected, fedc2i.md §6.3): class row c = sum_i Lambda[i, c] * phi_{i,c}, bias with it."""
    lam = torch.as_tensor(big_lambda, dtype=torch.float32)
    w = sum(lam[i][:, None] * states[i]["head.weight"] for i in range(len(states)))
    b = sum(lam[i] * states[i]["head.bias"] for i in range(len(states)))
    return {"head.weight": w, "head.bias": b}


def assert_states_close(got, expected, atol=1e-5):
    assert set(got) == set(expected)
    for n in expected:
        assert got[n].dtype == expected[n].dtype, n
        torch.testing.assert_close(got[n], expected[n], atol=atol, rtol=1e-4, msg=n)


# ------------------------------------------------------------------------------------------------ the method
@pytest.mark.parametrize("k", [2, 3])
def test_a_client_starts_from_the_mix_of_everyone_it_was_sent_not_from_its_own_model(k):
    """The broken-method example (a client that ignores its peers and trains alone) must fail here.

    fedc2i.md §7 test 2: gamma = 0 gives lambda = Lambda = 1/M, so the personalized extractor and classifier are the
    uniform mean of the received models (M = 2 works, fedc2i.md §7 test 10); the influence it reports is uniform."""
    client = make_client(gamma=0.0)
    states = distinct_states(client, k)
    arrays, metrics = run_train(client, payload(states))
    np.testing.assert_allclose(metrics["influence"], [1 / k] * k, rtol=1e-6)
    expected = mixed(states, [1 / k] * k, list(states[0]))
    assert_states_close(arrays, expected)
    assert not torch.allclose(arrays["head.weight"], states[0]["head.weight"])


def test_full_fedc2i_mixes_the_extractor_by_lambda_and_each_class_row_by_its_column_of_big_lambda():
    """fedc2i.md §2.2 / §2.5: lambda from leave-one-out extractors with the client's own classifier (Eq. 5), the
    extractor mixed by lambda (Eq. 6), Lambda from the client's own extractor theta* (fedc2i.md §6.7) with one class row
    swapped (Eqs. 7-9), each class row mixed by its column (Eq. 10 corrected); the reply carries lambda."""
    gamma = 5.0
    client = make_client(gamma=gamma)
    states = distinct_states(client, 3)
    arrays, metrics = run_train(client, payload(states))
    lam = naive_lambda(client, states, gamma)
    np.testing.assert_allclose(metrics["influence"], lam, rtol=1e-4, atol=1e-6)
    assert np.ptp(lam) > 0.01  # the test means something only if lambda is not uniform
    body = [n for n in states[0] if not n.startswith("head.")]
    big = naive_big_lambda(client, states, {n: states[0][n] for n in body}, gamma)
    assert np.ptp(big, axis=0).min() > 1e-3
    assert_states_close(arrays, {**mixed(states, lam, body), **eq10(states, big)})


@pytest.mark.parametrize("variant", ["client-level", "class-level-averaged-extractor", "class-level-own-extractor"])
def test_the_ablations_build_the_model_table_3_describes(variant):
    """fedc2i.md §6.18 (docs' variant table): "-lambda" mixes the whole model by lambda; "Lambda/g" takes the
    size-weighted FedAvg extractor and scores classes with it (theta* = that extractor, fedc2i.md §6.7); "Lambda/l"
    keeps the client's own extractor; both Lambda variants mix the classifier by Eq. 10."""
    gamma = 5.0
    client = make_client(gamma=gamma, **{"c2i-variant": variant})
    states = distinct_states(client, 3)
    arrays, metrics = run_train(client, payload(states))
    lam = naive_lambda(client, states, gamma)
    np.testing.assert_allclose(metrics["influence"], lam, rtol=1e-4, atol=1e-6)
    names = list(states[0])
    body = [n for n in names if not n.startswith("head.")]
    if variant == "client-level":
        expected = mixed(states, lam, names)
    else:
        if variant == "class-level-averaged-extractor":
            sizes = np.array([client.data.num_train, *PEER_SIZES], dtype=np.float64)
            theta = mixed(states, sizes / sizes.sum(), body)
        else:
            theta = {n: states[0][n] for n in body}
        expected = {**theta, **eq10(states, naive_big_lambda(client, states, theta, gamma))}
    assert_states_close(arrays, expected)


def test_the_influence_batch_holds_influence_batch_size_training_samples_drawn_afresh_each_round():
    """fedc2i.md §6.10: one batch of ``influence-batch-size`` samples per round, drawn anew every round (seeded: the
    same round gives the same batch, fedc2i.md §7 test 14)."""
    states = distinct_states(make_client(), 3)
    _whole, _ = run_train(make_client(), payload(states))
    small = make_client(**{"influence-batch-size": 3})
    by_round = {r: run_train(small, payload(states, server_round=r))[1]["influence"] for r in (2, 3)}
    assert by_round[2] == run_train(make_client(**{"influence-batch-size": 3}), payload(states))[1]["influence"]
    assert not np.allclose(by_round[2], by_round[3], atol=1e-4)
    whole_lam = run_train(make_client(), payload(states))[1]["influence"]
    assert not np.allclose(by_round[2], whole_lam, atol=1e-4)


def test_in_round_one_a_client_alone_keeps_its_model_and_reports_full_self_influence():
    """fedc2i.md §6.13 (docs: round 1 sends each client only its own initial model): nothing to mix, lambda = [1]."""
    client = make_client()
    states = distinct_states(client, 1)
    arrays, metrics = run_train(client, payload(states, server_round=1))
    assert list(metrics["influence"]) == [1.0]
    assert_states_close(arrays, states[0], atol=0)


def test_the_reply_reports_the_trained_models_test_accuracy():
    """docs Messages: ``trained-acc`` is the accuracy, on the client's test split, of the model it replies with;
    the influence computation and mixing is timed as the method's own client work (``time-method``, beside
    ``time-train``; client_app/base.py ``timed``)."""
    client = make_client(**{"local-epochs": 1})
    states = distinct_states(client, 2)
    arrays, metrics = run_train(client, payload(states))
    net = client.reset_model()
    net.load_state_dict(arrays)
    assert metrics["trained-acc"] == pytest.approx(client.test(net)[1])
    assert metrics["num-examples"] == client.data.num_train and metrics["partition-id"] == 0
    assert metrics["time-method"] > 0 and metrics["time-train"] > 0


def test_the_personal_model_is_the_clients_own_stored_model():
    """fedc2i.md §6.12 (docs "The personalized model"): ``arrays`` of an evaluate message, else the first model of a
    train message's stack, else the common initial model."""
    client = make_client()
    states = distinct_states(client, 3)
    own = client.personal_model(payload(states)).state_dict()
    assert_states_close(own, states[0], atol=0)
    ev = RecordDict({"arrays": to_record(states[1])})
    assert_states_close(client.personal_model(ev).state_dict(), states[1], atol=0)
    assert_states_close(
        client.personal_model(RecordDict({"config": ConfigRecord({})})).state_dict(),
        client.reset_model().state_dict(),
        atol=0,
    )


@pytest.mark.parametrize("variant,own_extractor_matters", [("class-level-averaged-extractor", False), ("full", True)])
def test_the_lambda_g_ablation_scores_classes_with_the_global_extractor(variant, own_extractor_matters):
    # fedc2i.md §6.7: for the Lambda/g ablation the class-level influence uses the current global theta (the average
    # extractor), not the client's own.  Two sets of peers with the same average extractor but a different own
    # extractor must then give the same personalized model (the model the client replies with after zero local
    # epochs); in the full method (own theta*) they must not.
    client = make_client(model="mlp", **{"c2i-variant": variant})
    torch.manual_seed(0)
    base = [build_model("mlp", 1, 8, 10, seed=s).state_dict() for s in range(3)]
    shifted = [{k: v.clone() for k, v in s.items()} for s in base]
    for k in shifted[0]:
        if not k.startswith("head."):  # move extractor mass from peer 1 to the client itself: same average
            d = 0.5 * torch.randn_like(shifted[0][k])
            shifted[0][k] += d
            shifted[1][k] -= d
    sizes = [client.data.num_train] * 2  # every model weighs the same
    out = [run_train(client, payload(states, sizes))[0] for states in (base, shifted)]
    same_head = torch.allclose(out[0]["head.weight"], out[1]["head.weight"], atol=1e-6)
    assert same_head != own_extractor_matters
    if not own_extractor_matters:
        for k in out[0]:
            torch.testing.assert_close(out[0][k], out[1][k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bad", [PEER_SIZES[0], "37,311", 2.5])
def test_peer_sizes_that_are_not_a_list_are_refused_naming_the_key(bad):
    """The server sends the peers' training-set sizes as one list (one entry per peer model); anything else is a
    malformed message, refused with the key and what arrived instead of being read as sizes."""
    client = make_client()
    states = distinct_states(client, 2)
    run_train(client, payload(states))  # the well-formed message is answered
    content = payload(states)
    content["peer-clients"] = ConfigRecord({"client-ids": [1], "num-examples": bad})
    allowed = "'peer-clients' needs a list 'num-examples'"
    with pytest.raises(ValueError, match=re.escape(allowed)) as err:
        run_train(client, content)
    assert repr(bad) in str(err.value)  # what arrived
