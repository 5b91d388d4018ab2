"""What LG-FedAvg's client must do (docs/methods/lgfedavg.md): send the head and keep the body (BatchNorm
statistics included), which never leaves the client, and use its own body under the global head as its
personalized model - from an evaluate message and from the next round's train message alike."""

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from task.params import record_to_numpy, to_record
from task.train import evaluate
from tests.client_kit import client, client_data, context, digits_of, numpy_state, trained_state
from tests.strategy_harness import strategy

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def states():
    """The common initial mlp, and a copy fitted to digits 5-9 (its head is a head that knows those digits)."""
    c = client("lgfedavg", client_data(HIGH))
    init = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    high = trained_state(c.reset_model(), *digits_of(HIGH, 30, 0))
    return init, high


def head_of(state):
    return {k: v for k, v in state.items() if k.startswith("head.")}


def body_of(state):
    return {k: v for k, v in state.items() if not k.startswith("head.")}


def message(state, rnd=1, **config):
    return RecordDict(
        {"arrays": to_record(numpy_state(state)), "config": ConfigRecord({"server-round": rnd, **config})}
    )


def as_torch(rec):
    return {k: torch.from_numpy(v) for k, v in record_to_numpy(rec).items()}


def accuracy(c, state):
    model = c.reset_model()
    model.load_state_dict(state)
    return evaluate(model, c.data.x_test, c.data.y_test)


# ------------------------------------------------------------------------------------------ client
def test_the_client_sends_the_head_and_keeps_its_body(states):
    init, high = states
    ctx = context("lgfedavg")
    c = client("lgfedavg", client_data(HIGH), ctx, **{"local-epochs": 0})
    reply = c.train(message(head_of(high)))
    assert sorted(reply["arrays"].keys()) == ["head.bias", "head.weight"]
    body = as_torch(ctx.state["body"])
    assert sorted(body) == sorted(body_of(init))
    # no training: the reply is the head it was sent, and the body is the common initial body
    assert all(torch.equal(as_torch(reply["arrays"])[k], high[k]) for k in head_of(high))
    assert all(torch.equal(body[k], init[k]) for k in body)


def test_local_training_updates_both_parts_and_the_next_round_starts_from_the_stored_body(states):
    init, high = states
    ctx = context("lgfedavg")
    data = client_data(HIGH)
    reply = client("lgfedavg", data, ctx, **{"local-epochs": 2}).train(message(head_of(init)))
    trained_body = as_torch(ctx.state["body"])
    assert any(not torch.equal(trained_body[k], init[k]) for k in trained_body)  # the body was trained
    assert any(not torch.equal(as_torch(reply["arrays"])[k], init[k]) for k in head_of(init))  # so was the head
    # round 2 without training: the stored body is kept, the head comes from the message
    client("lgfedavg", data, ctx, **{"local-epochs": 0}).train(message(head_of(high), rnd=2))
    assert all(torch.equal(as_torch(ctx.state["body"])[k], trained_body[k]) for k in trained_body)


def test_the_personalized_model_is_the_own_body_under_the_sent_head(states):
    init, high = states
    ctx = context("lgfedavg")
    data = client_data(HIGH)
    client("lgfedavg", data, ctx, **{"local-epochs": 2}).train(message(head_of(init)))
    own_body = as_torch(ctx.state["body"])
    c = client("lgfedavg", data, ctx)
    loss, acc = accuracy(c, {**own_body, **head_of(high)})
    ev = c.evaluate(message(head_of(high)))["metrics"]
    assert ev["personal-acc"] == pytest.approx(acc) and ev["personal-loss"] == pytest.approx(loss)
    assert "global-acc" not in ev  # no model every client uses
    # the evaluation that rides on the next round's train message scores the same model, before training
    train_msg = message(head_of(high), rnd=3, evaluate=True, **{"evaluate-round": 2})
    c = client("lgfedavg", data, ctx)
    c.begin(train_msg)
    fused = c.evaluation(train_msg)
    assert fused["personal-acc"] == pytest.approx(acc) and fused["personal-loss"] == pytest.approx(loss)
    assert all(torch.equal(as_torch(ctx.state["body"])[k], own_body[k]) for k in own_body)  # state untouched
    # a client that never trained: the common initial body under the sent head
    fresh = client("lgfedavg", data)
    assert fresh.evaluate(message(head_of(high)))["metrics"]["personal-acc"] == pytest.approx(
        accuracy(fresh, {**body_of(init), **head_of(high)})[1]
    )


def test_bodies_stay_personal_while_the_heads_meet(states):
    init, _ = states
    ctxs = {name: context("lgfedavg", pid=i) for i, name in enumerate(("low", "high"))}
    s = strategy("lgfedavg", model="mlp")
    replies = []
    for i, (name, classes) in enumerate((("low", LOW), ("high", HIGH))):
        r = client("lgfedavg", client_data(classes), ctxs[name], **{"local-epochs": 2}).train(message(head_of(init)))
        replies.append(s.gate.check(1, 10 + i, r, "train", set()))
    assert all(r is not None for r in replies), s.failures  # real client replies pass the strategy's reply spec
    s.aggregate(1, replies)
    low, high = as_torch(ctxs["low"].state["body"]), as_torch(ctxs["high"].state["body"])
    assert any(not torch.allclose(low[k], high[k]) for k in low)  # each client keeps its own body
    n = np.array([r.num_examples for r in replies], float)
    expected = sum(r.arrays["head.weight"] * w for r, w in zip(replies, n, strict=True)) / n.sum()
    np.testing.assert_allclose(s.global_state["head.weight"], expected, rtol=1e-5, atol=1e-6)


def test_a_message_that_carries_local_layers_is_refused_with_the_reason(states):
    _init, high = states
    ctx = context("lgfedavg")
    with pytest.raises(ValueError, match="keeps the local layers on the client"):
        client("lgfedavg", client_data(HIGH), ctx).train(message(high))
    assert "body" not in ctx.state.array_records


def test_batchnorm_statistics_stay_local_with_the_cnn():
    s = strategy("lgfedavg", model="cnn")
    bn = [k for k in s.model_info.keys if "running_" in k or "num_batches" in k]
    assert bn and not set(bn) & set(s.shared_keys())
    ctx = context("lgfedavg", model="cnn")
    reply = client("lgfedavg", None, ctx).train(
        RecordDict({"arrays": s.payload(1, 1, "train")["arrays"], "config": ConfigRecord({"server-round": 1})})
    )
    assert sorted(reply["arrays"].keys()) == sorted(s.model_info.head_keys)
    assert set(bn) <= set(ctx.state["body"].keys())
