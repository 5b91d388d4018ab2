"""What FedBN's client must do (docs/methods/fedbn.md): send every layer but its normalisation layers, keep
those (BatchNorm weight, bias, running statistics and ``num_batches_tracked``) as its own from round to round,
and use the layers it is sent with its own normalisation layers as its personalized model - from an evaluate
message and from the next round's train message alike.  The default model (``cnn``) has two BatchNorm layers."""

import re

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict, UserConfig

from server_app.app import build_strategy
from strategies.replies import Reply
from task.config import parse_settings
from task.data import ClientData
from task.params import record_to_numpy, to_record
from task.train import evaluate
from tests.client_kit import client, client_data, context, digits_of, numpy_state, trained_state

CNN: UserConfig = {"model": "cnn"}
BN = [f"conv.{i}.{k}" for i in (1, 4) for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")]
ALL = list(range(10))


def bn_of(state):
    return {k: v for k, v in state.items() if k in BN}


def shared_of(state):
    return {k: v for k, v in state.items() if k not in BN}


def message(state, rnd=1, **config):
    return RecordDict(
        {"arrays": to_record(numpy_state(state)), "config": ConfigRecord({"server-round": rnd, **config})}
    )


def as_torch(rec):
    return {k: torch.from_numpy(np.array(v)) for k, v in record_to_numpy(rec).items()}


def same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k].reshape(a[k].shape)) for k in a)


def accuracy(c, state):
    model = c.reset_model()
    model.load_state_dict(state)
    return evaluate(model, c.data.x_test, c.data.y_test)


def inverted(data: ClientData) -> ClientData:
    """The same digits with inverted pixels: a feature shift (another domain), the labels unchanged."""
    top = float(data.x_train.max())
    return ClientData(
        top - data.x_train, data.y_train, top - data.x_val, data.y_val, top - data.x_test, data.y_test, num_classes=10
    )


@pytest.fixture(scope="module")
def states():
    """The common initial cnn, and a copy fitted to all digits (its layers are layers that know digits)."""
    c = client("fedbn", client_data(ALL), **CNN)
    init = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    fitted = trained_state(c.reset_model(), *digits_of(ALL, 20, 0), epochs=5)
    return init, fitted


def test_the_client_sends_every_other_layer_and_keeps_its_normalisation_layers(states):
    init, fitted = states
    ctx = context("fedbn", **CNN)
    reply = client("fedbn", client_data(ALL), ctx, **{"local-epochs": 0}).train(message(shared_of(fitted)))
    assert sorted(reply["arrays"].keys()) == sorted(shared_of(init))
    # no training: the reply is what it was sent, and the normalisation layers it keeps are the initial ones
    assert same(as_torch(reply["arrays"]), shared_of(fitted))
    assert same(bn_of(init), as_torch(ctx.state["norm"]))


def test_a_message_without_arrays_gives_the_initial_shared_layers_with_the_own_normalisation_layers(states):
    init, _ = states
    ctx = context("fedbn", **CNN)
    data = inverted(client_data(ALL))
    client("fedbn", data, ctx, **{"local-epochs": 1}).train(message(shared_of(init)))
    own = as_torch(ctx.state["norm"])
    c = client("fedbn", data, ctx)
    model = c.personal_model(RecordDict({"config": ConfigRecord({"server-round": 2})}))
    state = model.state_dict()
    assert same(own, {k: state[k] for k in BN}) and same(shared_of(init), shared_of(state))


def test_the_reply_reports_the_training_and_the_trained_model_with_its_own_normalisation_layers(states):
    init, _ = states
    ctx = context("fedbn", **CNN)
    c = client("fedbn", client_data(ALL), ctx, **{"local-epochs": 1})
    reply = c.train(message(shared_of(init)))
    metrics = reply["metrics"]
    assert {"train-loss", "train-acc", "num-examples", "partition-id"} <= set(metrics.keys())
    trained = {
        **as_torch(reply["arrays"]),
        **{k: v.reshape(init[k].shape) for k, v in as_torch(ctx.state["norm"]).items()},
    }
    assert metrics["trained-acc"] == pytest.approx(accuracy(c, trained)[1])


def test_local_training_updates_the_normalisation_layers_and_the_next_round_starts_from_them(states):
    init, fitted = states
    ctx = context("fedbn", **CNN)
    data = client_data(ALL)
    reply = client("fedbn", data, ctx, **{"local-epochs": 2}).train(message(shared_of(init)))
    own = as_torch(ctx.state["norm"])
    for k in BN:  # every array of both layers moved: affine weight and bias, running statistics, the batch count
        assert not torch.equal(own[k].reshape(init[k].shape), init[k]), k
    assert any(not torch.equal(as_torch(reply["arrays"])[k], init[k]) for k in shared_of(init))  # the rest trained
    # round 2 without training: the kept normalisation layers are the client's own, the rest is what it was sent
    reply = client("fedbn", data, ctx, **{"local-epochs": 0}).train(message(shared_of(fitted), rnd=2))
    assert same(own, as_torch(ctx.state["norm"]))
    assert same(as_torch(reply["arrays"]), shared_of(fitted))


def test_the_personalized_model_is_the_sent_layers_with_the_own_normalisation_layers(states):
    init, fitted = states
    ctx = context("fedbn", **CNN)
    data = inverted(client_data(ALL))
    client("fedbn", data, ctx, **{"local-epochs": 2}).train(message(shared_of(init)))
    own = as_torch(ctx.state["norm"])
    c = client("fedbn", data, ctx)
    loss, acc = accuracy(c, {**shared_of(fitted), **{k: v.reshape(init[k].shape) for k, v in own.items()}})
    assert loss != pytest.approx(accuracy(c, {**shared_of(fitted), **bn_of(init)})[0])  # the own layers matter
    ev = c.evaluate(message(shared_of(fitted)))["metrics"]
    assert ev["personal-acc"] == pytest.approx(acc) and ev["personal-loss"] == pytest.approx(loss)
    assert "global-acc" not in ev and "global-loss" not in ev  # no model every client uses as it is
    # the evaluation that rides on the next round's train message scores the same model, before training
    train_msg = message(shared_of(fitted), rnd=3, evaluate=True, **{"evaluate-round": 2})
    c = client("fedbn", data, ctx)
    c.begin(train_msg)
    fused = c.evaluation(train_msg)
    assert fused["personal-acc"] == pytest.approx(acc) and fused["personal-loss"] == pytest.approx(loss)
    assert same(own, as_torch(ctx.state["norm"]))  # state untouched
    # a client that never trained: the sent layers with the common initial normalisation layers
    fresh = client("fedbn", data, **CNN)
    assert fresh.evaluate(message(shared_of(fitted)))["metrics"]["personal-loss"] == pytest.approx(
        accuracy(fresh, {**shared_of(fitted), **bn_of(init)})[0]
    )


def test_each_client_keeps_its_own_statistics_while_the_rest_is_averaged_by_examples(states):
    init, _ = states
    s = build_strategy(parse_settings({"method": "fedbn", **CNN}))
    datasets = {"original": client_data(ALL, n=10), "inverted": inverted(client_data(ALL, n=20))}
    ctxs = {name: context("fedbn", pid=i, **CNN) for i, name in enumerate(datasets)}
    replies: list[Reply] = []
    for i, (name, data) in enumerate(datasets.items()):
        r = client("fedbn", data, ctxs[name], **{"local-epochs": 1}).train(message(shared_of(init)))
        checked = s.gate.check(1, 10 + i, r, "train", set())
        assert checked is not None, s.failures  # real client replies pass the strategy's reply spec
        replies.append(checked)
    assert [r.num_examples for r in replies] == [100, 200]
    s.aggregate(1, replies)
    for k in s.shared_keys():
        expected = (100 * replies[0].arrays[k] + 200 * replies[1].arrays[k]) / 300
        np.testing.assert_allclose(s.global_state[k], expected, rtol=1e-5, atol=1e-6)
    own = {name: as_torch(ctx.state["norm"]) for name, ctx in ctxs.items()}
    # the inverted digits are bright where the others are dark: the first layer's statistics are far apart
    assert not torch.allclose(own["original"]["conv.1.running_mean"], own["inverted"]["conv.1.running_mean"], atol=0.1)
    # round 2: both start from the average, each with its own normalisation layers (and keeps them)
    payload = record_to_numpy(s.payload(1, 2, "train").array_records["arrays"])
    assert sorted(payload) == sorted(s.shared_keys())
    for name, data in datasets.items():
        msg = RecordDict({"arrays": to_record(payload), "config": ConfigRecord({"server-round": 2})})
        c = client("fedbn", data, ctxs[name], **{"local-epochs": 0})
        model = c.personal_model(msg)
        assert same({k: v for k, v in model.state_dict().items() if k in BN}, own[name])
        assert same({k: v for k, v in model.state_dict().items() if k not in BN}, as_torch(to_record(payload)))
        c.train(msg)
        assert same(own[name], as_torch(ctxs[name].state["norm"]))


def test_a_message_that_carries_a_normalisation_layer_is_refused_with_the_reason(states):
    init, _ = states
    ctx = context("fedbn", **CNN)
    why = (
        "FedBN keeps the normalisation layers on the client, but the server sent ['conv.1.bias', "
        "'conv.1.num_batches_tracked', 'conv.1.running_mean']; only the other layers may come from the server"
    )
    with pytest.raises(ValueError, match=re.escape(why) + "$"):
        client("fedbn", client_data(ALL), ctx).train(message(init))
    assert "norm" not in ctx.state.array_records


def test_the_normalisation_layers_survive_a_node_restart_through_the_state_folder(states, tmp_path):
    init, fitted = states
    where = {"state-dir": str(tmp_path), "run-key": "run-1"}
    data = client_data(ALL)
    ctx = context("fedbn", **CNN)
    msg = message(shared_of(init), **where)
    c = client("fedbn", data, ctx, **{"local-epochs": 1})
    c.begin(msg)
    c.train(msg)
    own = as_torch(ctx.state["norm"])
    restarted = context("fedbn", **CNN)  # a new process of the same node: nothing in context.state
    c = client("fedbn", data, restarted, **{"local-epochs": 0})
    msg = message(shared_of(fitted), rnd=2, **where)
    c.begin(msg)
    c.train(msg)
    assert same(own, as_torch(restarted.state["norm"]))
