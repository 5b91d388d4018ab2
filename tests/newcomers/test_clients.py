"""What each method's client gives a newcomer (a held-out client that never trained, run-config ``holdout-clients``),
called directly with hand-chosen data and models fitted to known digits (LOW = 0-4, HIGH = 5-9), so the right model
is known in advance: the global model where there is one, its own choice among cluster or tier models, the shared
part under a local part fitted on its own data for the body/head methods, and, for every method, that model after
``local-epochs`` of fine-tuning (``newcomer-finetuned-acc``).  A newcomer keeps nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from client_app.fedsoft import importance_weights
from strategies.gate import parse_reply
from strategies.newcomers import NEWCOMER_SPEC
from task.methods.pifl import mixture_weights
from task.models import norm_keys
from task.params import to_record
from task.train import evaluate, norm_statistics
from tests.client_kit import client, client_data, digits_of, numpy_state, trained_state

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def states():
    """The common initial mlp, and copies fitted to digits 0-4 and 5-9."""
    c = client("fedavg", client_data(LOW))
    init = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    low = trained_state(c.reset_model(), *digits_of(LOW, 30, 0))
    high = trained_state(c.reset_model(), *digits_of(HIGH, 30, 0))
    return init, low, high


def message(**records):
    return RecordDict({"config": ConfigRecord({"server-round": 5}), **records})


def arrays(state, keys=None):
    s = numpy_state(state)
    return to_record(s if keys is None else {k: s[k] for k in keys})


def stacked(*states):
    return to_record({k: np.stack([numpy_state(s)[k] for s in states]) for k in states[0]})


def state_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def newcomer(c, content):
    c.begin(content)
    return state_of(c.newcomer_model(content))


def newcomer_acc(c, content) -> float:
    """``newcomer-acc`` of the client's reply to ``query.newcomer``."""
    metrics, _ = parse_reply(c.query("newcomer", content), NEWCOMER_SPEC)
    return float(metrics["newcomer-acc"])


def accuracy(c, state):
    model = c.reset_model()
    model.load_state_dict(state)
    return evaluate(model, c.data.x_test, c.data.y_test)[1]


def same(a, b, keys):
    return all(torch.equal(a[k], b[k]) for k in keys)


def assert_keeps_nothing(c):
    assert len(c.context.state.array_records) == 0


# ---------------------------------------------------------------------------------------------- every method's reply
def test_the_reply_scores_the_newcomers_model_then_the_same_model_after_local_epochs_of_fine_tuning(states):
    """FedAvg: the newcomer's model is the global model it is sent; the fine-tuned number is that model after
    ``local-epochs`` on its training split (none: the same number), and the reply is what the server's spec
    admits."""
    init, low, _ = states
    for epochs in (0, 10):
        c = client("fedavg", client_data(HIGH), **{"local-epochs": epochs})
        content = message(arrays=arrays(init))
        c.begin(content)
        reply = c.query("newcomer", content)
        metrics, _ = parse_reply(reply, NEWCOMER_SPEC)
        loss, acc = evaluate(c.newcomer_model(message(arrays=arrays(init))), c.data.x_test, c.data.y_test)
        assert metrics["newcomer-acc"] == pytest.approx(acc) and metrics["newcomer-loss"] == pytest.approx(loss)
        assert metrics["test-examples"] == len(c.data.y_test) and metrics["partition-id"] == 0
        if epochs == 0:
            assert metrics["newcomer-finetuned-acc"] == metrics["newcomer-acc"]
        else:  # ten epochs from the untrained model on its own digits: far above where it started
            assert metrics["newcomer-finetuned-loss"] < metrics["newcomer-loss"]
            assert metrics["newcomer-finetuned-acc"] > metrics["newcomer-acc"] + 0.3
        assert_keeps_nothing(c)
    c = client("fedavg", client_data(HIGH))
    assert same(newcomer(c, message(arrays=arrays(low))), low, low)  # the global model, whatever it is


def test_the_scores_are_on_the_split_every_method_is_scored_on_and_on_the_validation_split_when_selecting(states):
    _, _, high = states
    data = client_data(HIGH, val_classes=LOW, test_classes=HIGH)
    content = message(arrays=arrays(high))
    on_test = client("fedavg", data)
    on_test.begin(content)
    selecting: dict[str, str | float] = {"evaluate-split": "validation", "val-fraction": 0.2}
    on_validation = client("fedavg", data, **selecting)
    on_validation.data = data.scored_on_validation()
    on_validation.begin(content)
    assert newcomer_acc(on_test, content) > 0.8  # the HIGH model on HIGH test digits
    assert newcomer_acc(on_validation, content) < 0.2  # on the LOW validation digits


def test_local_gives_a_newcomer_the_common_initial_model_and_nothing_else(states):
    init, low, _ = states
    c = client("local", client_data(HIGH))
    assert same(newcomer(c, message(arrays=arrays(low))), init, init)


@pytest.mark.parametrize("method", ["ditto", "fedrod", "fedprox", "moon", "client2vec"])
def test_a_method_with_a_global_model_gives_a_newcomer_that_model(states, method):
    _, low, _ = states
    extra: dict[str, str] = {"c2v-encoder": "synthetic"} if method == "client2vec" else {}
    c = client(method, client_data(HIGH), **extra)
    assert same(newcomer(c, message(arrays=arrays(low))), low, low)
    assert_keeps_nothing(c)


# ---------------------------------------------------------------------------------------------- body / head methods
@pytest.mark.parametrize("method,epochs", [("fedper", "local-epochs"), ("fedrep", "head-epochs")])
def test_fedper_and_fedrep_give_the_global_body_under_a_head_fitted_on_the_newcomers_data(states, method, epochs):
    """The body fitted to digits 0-4 and the initial head fit digits 5-9 poorly; a newcomer with digits 5-9 keeps that
    body frozen and fits the head on them (FedPer for local-epochs, FedRep for its head-epochs)."""
    init, low, _ = states
    c = client(method, client_data(HIGH), **{"local-epochs": 1, "head-epochs": 1, epochs: 5})
    body = [k for k in low if not k.startswith("head.")]
    got = newcomer(c, message(arrays=arrays(low, body)))
    assert same(got, low, body)  # the body is the global one, frozen
    assert accuracy(c, got) > accuracy(c, {**low, "head.weight": init["head.weight"], "head.bias": init["head.bias"]})
    assert_keeps_nothing(c)
    no_head_epochs = client(method, client_data(HIGH), **{"local-epochs": 1, "head-epochs": 1, epochs: 0})
    assert same(newcomer(no_head_epochs, message(arrays=arrays(low, body))), init, ["head.weight", "head.bias"])


def test_lgfedavg_gives_the_global_head_over_a_body_fitted_on_the_newcomers_data(states):
    init, _, high = states
    c = client("lgfedavg", client_data(HIGH), **{"local-epochs": 2})
    head = ["head.weight", "head.bias"]
    got = newcomer(c, message(arrays=arrays(high, head)))
    assert same(got, high, head)
    body = [k for k in init if k not in head and init[k].is_floating_point()]
    assert not same(got, init, body)
    assert accuracy(c, got) > accuracy(c, {**init, **{k: high[k] for k in head}})
    assert_keeps_nothing(c)


@pytest.fixture(scope="module")
def cnn_states():
    """The common initial cnn (BatchNorm), and a copy fitted to digits 5-9."""
    c = client("fedbn", client_data(HIGH), model="cnn")
    init = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    high = trained_state(c.reset_model(), *digits_of(HIGH, 30, 0))
    return init, high


def test_fedbn_gives_the_averaged_layers_with_normalisation_layers_fitted_on_the_newcomers_data(cnn_states):
    init, high = cnn_states
    c = client("fedbn", client_data(HIGH), model="cnn", **{"local-epochs": 2})
    norms = norm_keys(c.reset_model())
    shared = [k for k in init if k not in norms]
    got = newcomer(c, message(arrays=arrays(high, shared)))
    assert same(got, high, shared)  # every other layer frozen
    assert not any(torch.equal(got[k], init[k]) for k in norms if k.endswith(("weight", "running_mean")))
    assert_keeps_nothing(c)


def test_fedcac_gives_the_global_model_with_the_batchnorm_statistics_of_the_newcomers_data(cnn_states):
    """FedCAC's BatchNorm statistics never leave a client and a newcomer has no mask: w_bar, with the statistics of
    its own training split."""
    init, high = cnn_states
    c = client("fedcac", client_data(HIGH), model="cnn")
    params = [k for k in high if "running" not in k and "num_batches" not in k]
    got = newcomer(c, message(**{"global": arrays(high, params)}))
    assert same(got, high, params)
    expected = c.reset_model()
    expected.load_state_dict({**init, **{k: high[k] for k in params}})
    norm_statistics(expected, c.data.x_train)
    assert same(got, state_of(expected), [k for k in init if "running" in k])
    assert not same(got, init, ["conv.1.running_mean"])
    assert_keeps_nothing(c)


def test_norm_statistics_are_the_mean_and_unbiased_variance_of_the_data_and_leave_the_rest():
    from task.models import build_model

    c = client("fedbn", client_data(HIGH), model="cnn")
    model = build_model("cnn", 1, 8, 10, seed=0)
    model.eval()
    before = state_of(model)
    x = c.data.x_train
    bn = model.get_submodule("conv.1")
    assert isinstance(bn, torch.nn.BatchNorm2d)
    seen: dict[str, torch.Tensor] = {}
    hook = bn.register_forward_hook(lambda m, inp, out: seen.setdefault("x", inp[0].detach().clone()))
    norm_statistics(model, x, batch_size=len(x))
    hook.remove()
    features = seen["x"].transpose(0, 1).reshape(bn.num_features, -1)
    torch.testing.assert_close(bn.running_mean, features.mean(1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn.running_var, features.var(1, unbiased=True), rtol=1e-4, atol=1e-5)
    assert bn.momentum == 0.1 and not model.training  # as they were
    after = state_of(model)
    assert same(after, before, [k for k in before if "running" not in k and "num_batches" not in k])
    model.load_state_dict(before)
    model.train()
    norm_statistics(model, x[:1])  # one sample gives no statistics: left as it was
    assert same(state_of(model), before, before) and model.training


# ---------------------------------------------------------------------------------------------- choosing among models
@pytest.mark.parametrize("method", ["ifca", "cfl"])
def test_ifca_and_cfl_give_the_cluster_model_with_the_lowest_loss_on_the_newcomers_validation_split(states, method):
    init, low, high = states
    c = client(method, client_data(LOW, val_classes=HIGH, test_classes=HIGH))
    assert same(newcomer(c, message(tiers=stacked(init, low, high))), high, high)
    no_validation = client(method, client_data(LOW, val_classes=HIGH))
    no_validation.data.x_val, no_validation.data.y_val = no_validation.data.x_val[:0], no_validation.data.y_val[:0]
    assert same(newcomer(no_validation, message(tiers=stacked(init, low, high))), low, low)  # its training split


def test_pifl_gives_a_newcomer_its_eq4_mixture_of_the_tiers(states):
    _, low, high = states
    c = client("pifl", client_data(LOW, val_classes=LOW))
    got = newcomer(c, message(tiers=stacked(high, low)))
    accs = [evaluate(model_of(c, s), c.data.x_val, c.data.y_val)[1] for s in (high, low)]
    w = mixture_weights(accs)
    for k, v in got.items():
        torch.testing.assert_close(v.double(), w[0] * high[k].double() + w[1] * low[k].double(), rtol=1e-5, atol=1e-6)
    assert w[1] > 0.8


def test_fedsoft_gives_the_centres_mixed_by_the_newcomers_own_importance_weights(states):
    init, low, high = states
    c = client("fedsoft", client_data(HIGH), tiers=3)
    content = message(tiers=stacked(init, low, high), fedsoft=ConfigRecord({"u": [1.0, 0.0, 0.0]}))
    got = newcomer(c, content)  # the u a message brings is not the newcomer's: it estimates its own
    losses = []
    for s in (init, low, high):
        logits = model_of(c, s)(c.data.x_train)
        losses.append(torch.nn.functional.cross_entropy(logits, c.data.y_train, reduction="none").detach().numpy())
    u = importance_weights(np.stack(losses))
    assert u[2] > 0.8
    for k, v in got.items():
        expected = sum(u[i] * s[k].double() for i, s in enumerate((init, low, high)))
        torch.testing.assert_close(v.double(), expected, rtol=1e-5, atol=1e-6)
    assert_keeps_nothing(c)


def test_fedc2i_gives_the_influence_weighted_mix_of_the_stored_models_its_own_the_initial_one(states):
    """Before its first training a client mixes the models it is sent (its own first) by their influence on its data
    (Eqs. 5-10): every mixed parameter lies between the sent models' values, and a newcomer sent no peers keeps the
    initial model."""
    init, low, high = states
    c = client("fedc2i", client_data(HIGH))
    got = newcomer(c, message(peers=stacked(init, low, high)))
    for k in init:
        lo = torch.minimum(torch.minimum(init[k], low[k]), high[k])
        hi = torch.maximum(torch.maximum(init[k], low[k]), high[k])
        assert bool(((got[k] >= lo - 1e-5) & (got[k] <= hi + 1e-5)).all()), k
    assert not same(got, init, ["fc1.weight"])
    assert same(newcomer(client("fedc2i", client_data(HIGH)), message(peers=stacked(init))), init, init)
    assert_keeps_nothing(c)


def model_of(c, state):
    model = c.reset_model()
    model.load_state_dict(state)
    model.eval()
    return model
