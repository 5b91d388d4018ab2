"""What each baseline's client must do (Local, FedAvg, FedProx, FedPer, FedRep, FedRoD, Ditto, CFL's cluster
model), called directly with hand-chosen data: which model is trained, what stays on the client, what is sent,
what is evaluated, and the direction each regulariser pulls."""

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from client_app.baselines import balanced_softmax_loss
from task.params import record_to_numpy, to_record
from task.train import evaluate
from tests.client_kit import client, client_data, context, digits_of, numpy_state, trained_state

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def states():
    """The common initial mlp and a copy fitted to digits 0-4 ("low") and to 5-9 ("high")."""
    c = client("fedavg", client_data(LOW))
    init = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    low = trained_state(c.reset_model(), *digits_of(LOW, 30, 0))
    high = trained_state(c.reset_model(), *digits_of(HIGH, 30, 0))
    return init, low, high


def arrays(state, keys=None):
    s = numpy_state(state)
    return RecordDict({"arrays": to_record(s if keys is None else {k: s[k] for k in keys})})


def as_torch(rec):
    return {k: torch.from_numpy(v) for k, v in record_to_numpy(rec).items()}


def acc_of(c, state, split="test"):
    model = c.reset_model()
    model.load_state_dict(state, strict=False)
    return evaluate(model, getattr(c.data, f"x_{split}"), getattr(c.data, f"y_{split}"))


def dist(a, b, keys=None):
    keys = keys if keys is not None else [k for k in a if a[k].is_floating_point()]
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in keys)) ** 0.5


# ------------------------------------------------------------------------------------------ FedAvg / FedProx
def test_fedavg_trains_the_model_it_is_sent_and_evaluates_it_as_both_models(states):
    init, low, high = states
    c = client("fedavg", client_data(HIGH), **{"local-epochs": 2})
    reply = c.train(arrays(high))
    trained = as_torch(reply["arrays"])
    assert dist(trained, high) < dist(trained, init)  # it started from the sent model
    assert reply["metrics"]["num-examples"] == len(c.data.y_train)
    assert reply["metrics"]["trained-acc"] == pytest.approx(acc_of(c, trained)[1])
    ev = c.evaluate(arrays(low))["metrics"]
    loss, acc = acc_of(c, low)
    assert ev["personal-acc"] == pytest.approx(acc) == ev["global-acc"]
    assert ev["personal-loss"] == pytest.approx(loss) == ev["global-loss"]


def test_fedprox_pulls_the_local_model_towards_the_global_one(states):
    _init, low, _high = states
    data = client_data(HIGH)
    free = as_torch(client("fedprox", data, **{"proximal-mu": 0.0, "local-epochs": 3}).train(arrays(low))["arrays"])
    held = as_torch(client("fedprox", data, **{"proximal-mu": 5.0, "local-epochs": 3}).train(arrays(low))["arrays"])
    same = as_torch(client("fedavg", data, **{"local-epochs": 3}).train(arrays(low))["arrays"])
    assert dist(held, low) < 0.8 * dist(free, low)
    assert dist(free, same) < 1e-5  # mu = 0 is FedAvg
    with pytest.raises(ValueError, match="proximal-mu"):
        client("fedprox", data, **{"proximal-mu": -1.0}).train(arrays(low))


# ------------------------------------------------------------------------------------------ Local
def test_local_model_never_leaves_the_client_and_is_what_it_evaluates(states):
    init, low, _high = states
    ctx = context("local")
    c = client("local", client_data(HIGH), ctx)
    reply = c.train(arrays(low))  # whatever the server sends is ignored
    assert "arrays" not in reply
    own = as_torch(ctx.state["model"])
    assert dist(own, init) < dist(own, low)  # trained from the initial model, not from the sent one
    assert reply["metrics"]["trained-acc"] == pytest.approx(acc_of(c, own)[1])
    ev = client("local", client_data(HIGH), ctx).evaluate(arrays(low))["metrics"]
    assert ev["personal-acc"] == pytest.approx(acc_of(c, own)[1]) and "global-acc" not in ev
    client("local", client_data(HIGH), ctx).train(RecordDict())
    assert dist(as_torch(ctx.state["model"]), own) > 0  # the second round continues from the stored model
    fresh_eval = client("local", client_data(HIGH)).evaluate(RecordDict())["metrics"]
    assert fresh_eval["personal-acc"] == pytest.approx(acc_of(c, init)[1])  # nothing stored: the initial model


# ------------------------------------------------------------------------------------------ FedPer / FedRep
def test_fedper_sends_the_body_and_keeps_its_head(states):
    init, low, high = states
    ctx = context("fedper")
    c = client("fedper", client_data(HIGH), ctx)
    body = [k for k in init if not k.startswith("head.")]
    reply = c.train(arrays(low, body))
    assert sorted(reply["arrays"].keys()) == sorted(body)
    head = as_torch(ctx.state["head"])
    assert sorted(head) == ["head.bias", "head.weight"]
    # evaluation: the server's body with this client's stored head
    ev = client("fedper", client_data(HIGH), ctx).evaluate(arrays(high, body))["metrics"]
    expected = acc_of(c, {**{k: high[k] for k in body}, **head})
    assert ev["personal-acc"] == pytest.approx(expected[1]) and ev["personal-loss"] == pytest.approx(expected[0])
    # next round trains from the stored head, not the initial one
    reply2 = client("fedper", client_data(HIGH), ctx, **{"local-epochs": 0}).train(arrays(high, body))
    assert all(torch.equal(as_torch(ctx.state["head"])[k], head[k]) for k in head)
    assert reply2["metrics"]["trained-acc"] == pytest.approx(expected[1])


@pytest.mark.parametrize("head_epochs, body_epochs", [(1, 0), (0, 1)])
def test_fedrep_trains_the_head_with_the_body_frozen_then_the_body(states, head_epochs, body_epochs):
    init, low, _high = states
    ctx = context("fedrep")
    body = [k for k in init if not k.startswith("head.")]
    c = client("fedrep", client_data(HIGH), ctx, **{"head-epochs": head_epochs, "local-epochs": body_epochs})
    reply = c.train(arrays(low, body))
    sent_body = as_torch(reply["arrays"])
    head = as_torch(ctx.state["head"])
    body_moved = dist(sent_body, low, body) > 0
    head_moved = dist(head, init, ["head.weight", "head.bias"]) > 0
    assert body_moved == bool(body_epochs) and head_moved == bool(head_epochs)


# ------------------------------------------------------------------------------------------ FedRoD
def test_balanced_softmax_shifts_logits_by_the_log_label_counts():
    logits = torch.tensor([[1.0, 0.5, -0.2], [0.1, 0.3, 0.0]])
    y = torch.tensor([0, 2])
    counts = torch.tensor([8, 2, 0])
    prior = torch.log(torch.tensor([8.0, 2.0, 1e-8]))
    expected = torch.nn.functional.cross_entropy(logits + prior, y)
    assert balanced_softmax_loss(counts)(logits, y).item() == pytest.approx(expected.item(), rel=1e-6)


def test_fedrod_shares_the_generic_model_and_keeps_a_personal_head(states):
    init, low, _high = states
    ctx = context("fedrod")
    data = client_data(HIGH)
    c = client("fedrod", data, ctx, **{"local-epochs": 2})
    reply = c.train(arrays(low))
    generic = as_torch(reply["arrays"])
    assert sorted(generic) == sorted(init)  # the personal head is not sent
    phead = as_torch(ctx.state["phead"])
    assert sorted(phead) == ["bias", "weight"] and float(phead["weight"].abs().sum()) > 0  # trained from zeros
    # evaluation: personalized = generic logits + personal head; global = generic model alone
    ev = client("fedrod", data, ctx).evaluate(arrays(generic))["metrics"]
    model = c.reset_model()
    model.load_state_dict(generic)
    with torch.no_grad():
        z = model.features(data.x_test)
        logits = model.head(z) + z @ phead["weight"].T + phead["bias"]
    assert ev["personal-acc"] == pytest.approx(float((logits.argmax(1) == data.y_test).float().mean()))
    assert ev["personal-loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, data.y_test)), rel=1e-5)
    # the accuracy the train reply reports is the personalized model's, not the generic one's
    assert reply["metrics"]["trained-acc"] == pytest.approx(ev["personal-acc"])
    gl, ga = acc_of(c, generic)
    assert ga != pytest.approx(ev["personal-acc"])  # so the two could be told apart
    assert ev["global-acc"] == pytest.approx(ga) and ev["global-loss"] == pytest.approx(gl, rel=1e-6)


def test_fedrod_generic_head_learns_with_the_balanced_loss(states):
    # a client with only digits 5-9: the plain cross-entropy pushes the generic head's bias towards 5-9; the
    # balanced softmax already explains that skew by the label prior, so the bias moves much less
    init, _, _ = states
    data = client_data(HIGH)
    rod = as_torch(client("fedrod", data, **{"local-epochs": 2}).train(arrays(init))["arrays"])
    avg = as_torch(client("fedavg", data, **{"local-epochs": 2}).train(arrays(init))["arrays"])

    def shift(s):
        return float(s["head.bias"][HIGH].mean() - s["head.bias"][LOW].mean())

    base = shift(init)
    assert abs(shift(rod) - base) < 0.5 * abs(shift(avg) - base)


# ------------------------------------------------------------------------------------------ Ditto
def test_ditto_trains_a_personal_model_near_the_global_one_and_sends_the_global_update(states):
    _init, low, high = states
    data = client_data(HIGH)
    ctxs = {lam: context("ditto") for lam in (0.0, 5.0)}
    for lam, ctx in ctxs.items():
        client("ditto", data, ctx, **{"ditto-lambda": lam, "ditto-epochs": 3}).train(arrays(low))
    near, free = as_torch(ctxs[5.0].state["personal"]), as_torch(ctxs[0.0].state["personal"])
    assert dist(near, low) < 0.8 * dist(free, low)
    c = client("ditto", data, ctxs[0.0], **{"ditto-lambda": 0.0})
    reply = c.train(arrays(low))
    sent = as_torch(reply["arrays"])
    fedavg = as_torch(client("fedavg", data).train(arrays(low))["arrays"])
    assert dist(sent, fedavg) < 1e-5  # the global part is plain FedAvg training
    personal = as_torch(ctxs[0.0].state["personal"])
    assert reply["metrics"]["trained-acc"] == pytest.approx(acc_of(c, personal)[1])
    ev = client("ditto", data, ctxs[0.0]).evaluate(arrays(high))["metrics"]
    assert ev["personal-acc"] == pytest.approx(acc_of(c, personal)[1])
    assert ev["global-acc"] == pytest.approx(acc_of(c, high)[1])
    fresh = client("ditto", data).evaluate(arrays(high))["metrics"]  # no personal model yet: the global one
    assert fresh["personal-acc"] == pytest.approx(acc_of(c, high)[1])
    with pytest.raises(ValueError, match="ditto-lambda"):
        client("ditto", data, **{"ditto-lambda": -0.1}).train(arrays(low))


def test_ditto_personal_model_continues_from_the_stored_one(states):
    init, low, _high = states
    ctx = context("ditto")
    data = client_data(HIGH)
    client("ditto", data, ctx, **{"ditto-epochs": 2}).train(arrays(low))
    first = as_torch(ctx.state["personal"])
    client("ditto", data, ctx, **{"ditto-epochs": 0}).train(arrays(init))
    assert dist(as_torch(ctx.state["personal"]), first) == 0.0


def test_cluster_model_client_reports_only_a_personalized_accuracy(states):
    _init, low, _high = states
    c = client("cfl", client_data(LOW))
    ev = c.evaluate(arrays(low))["metrics"]
    loss, acc = acc_of(c, low)
    assert ev["personal-acc"] == pytest.approx(acc) and ev["personal-loss"] == pytest.approx(loss)
    assert "global-acc" not in ev
    assert acc > 0.8 and np.isfinite(loss)
