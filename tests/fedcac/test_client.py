"""FedCAC's client handlers (fedcac.md §2.7 Eq. 11, §6.9, §7 "ClientApp"), checked against models built
independently from what the client stored and what the server sent.

The evaluate handler must score three models: the personalized one (Eq. 11 on a copy: critical positions
from u_i, the rest from w_bar, BatchNorm statistics the client's own), the global model w_bar (with the
client's own BatchNorm statistics, which never leave it) and the model right after local training (spec
fedcac.md §6.9 logs "before aggregation" too).  It must not store the mix: the next train message applies it again.
"""

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict

from server_app.app import build_strategy
from strategies.fedcac_artifacts import write_artifacts
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.methods.fedcac import unpack_masks
from task.params import to_record
from task.train import evaluate
from tests.client_kit import node_contexts

CFG: dict[str, bool | float | int | str] = {
    "method": "fedcac",
    "tau": 0.5,
    "beta": 10,
    "partition": "pathological",
    "local-epochs": 3,
    "seed": 0,
}


def first_round(cfg=CFG, n=3):
    """Round 1 of n clients through the strategy's own payloads and aggregation (no Flower runtime)."""
    settings = parse_settings(cfg)
    strat = build_strategy(settings)
    ctxs = node_contexts(cfg, n)
    cls = load_object(METHODS["fedcac"].client)
    ups = []
    for i, ctx in enumerate(ctxs):
        payload = strat.payload(10 + i, 1, "train")
        payload["config"] = ConfigRecord({"server-round": 1})
        up = strat.gate.check(1, 10 + i, cls(ctx, settings).train(payload), "train", set())
        assert up is not None, strat.failures
        ups.append(up)
    diag = strat.aggregate(1, ups)["fedcac"]
    return settings, strat, ctxs, cls, diag


def model_from(client, state):
    model = client.reset_model()
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)
    return model


def scores(client, state):
    return evaluate(model_from(client, state), *client.test_split())  # (loss, acc)


def with_config(payload, rnd):
    payload["config"] = ConfigRecord({"server-round": rnd})
    return payload


@pytest.fixture(scope="module")
def after_round_one():
    return first_round()


def test_evaluate_scores_eq11_w_bar_and_the_trained_model_and_keeps_the_state(after_round_one):
    settings, strat, ctxs, cls, diag = after_round_one
    assert any(diag["collaborators"][pid] for pid in diag["collaborators"])  # some u_i differ from own models
    trained_differs = []
    for i, ctx in enumerate(ctxs):
        client = cls(ctx, settings)
        own = client.kept.load("model")  # post-training model, BatchNorm statistics included
        mask = unpack_masks(client.kept.load("mask")["bits"], strat.param_shapes)
        u, wbar = strat.custom[i], strat.global_state
        assert any("running" in k for k in own) and set(wbar) == set(strat.param_keys)
        personal = {**own, **{k: np.where(mask[k], u[k], wbar[k]) for k in strat.param_keys}}  # Eq. 11
        glob = {**own, **wbar}  # w_bar with this client's own BatchNorm statistics
        expected = {
            "personal": scores(client, personal),
            "global": scores(client, glob),
            "trained": scores(client, own),
        }
        losses = [expected[k][0] for k in expected]
        assert len(set(losses)) == 3  # the three models really are different models here
        trained_differs.append(expected["trained"][1] != expected["personal"][1])

        reply = client.evaluate(with_config(strat.payload(10 + i, 1, "evaluate"), 1))
        m = reply["metrics"]
        assert m["personal-loss"] == pytest.approx(expected["personal"][0], rel=1e-5)
        assert m["personal-acc"] == pytest.approx(expected["personal"][1])
        assert m["global-loss"] == pytest.approx(expected["global"][0], rel=1e-5)
        assert m["global-acc"] == pytest.approx(expected["global"][1])
        assert m["before-agg-acc"] == pytest.approx(expected["trained"][1])
        after = cls(ctx, settings).kept.load("model")
        assert all(np.array_equal(after[k], own[k]) for k in own)  # the mix was not stored
    assert any(trained_differs)  # before-agg-acc is told apart from personal-acc by some client


def test_a_client_with_no_fresh_customized_model_keeps_its_own_critical_values(after_round_one):
    """fedcac.md §6.11: without u_i (absent last round) Eq. 11 uses u_i := the client's own parameters."""
    settings, strat, ctxs, cls, diag = after_round_one
    pid = next(p for p in diag["collaborators"] if diag["collaborators"][p])  # its u_i differs from its own
    client = cls(ctxs[pid], settings)
    own = client.kept.load("model")
    mask = unpack_masks(client.kept.load("mask")["bits"], strat.param_shapes)
    wbar = strat.global_state
    kept = {**own, **{k: np.where(mask[k], own[k], wbar[k]) for k in strat.param_keys}}
    custom = {**own, **{k: np.where(mask[k], strat.custom[pid][k], wbar[k]) for k in strat.param_keys}}
    assert scores(client, kept)[0] != scores(client, custom)[0]
    payload = with_config(RecordDict({"global": to_record(wbar)}), 2)
    m = client.evaluate(payload)["metrics"]
    assert m["personal-loss"] == pytest.approx(scores(client, kept)[0], rel=1e-5)


def test_the_next_round_starts_from_the_model_that_was_evaluated(after_round_one):
    """fedcac.md §2.7: Eq. 11 does not depend on the client's current weights, so the evaluation of round t and
    the train message of round t + 1 (same w_bar, u_i and mask) give the same model; training starts from it
    (its critical mask is scored against that start, Eq. 5)."""
    settings, strat, ctxs, cls, _ = after_round_one
    client = cls(ctxs[0], settings)
    evaluated = client.personal_model(with_config(strat.payload(10, 1, "evaluate"), 1))
    started = client.personal_model(with_config(strat.payload(10, 2, "train"), 2))
    for k, v in evaluated.state_dict().items():
        torch.testing.assert_close(started.state_dict()[k], v)


def test_first_contact_evaluates_the_common_model_with_w_bar_and_has_no_trained_model():
    """A node that never trained (no stored model) evaluates the common initial model with the server's
    current w_bar: personalized and global model are the same, and there is no "before aggregation" model."""
    settings, strat, _, cls, _ = first_round(n=2)
    ctx = Context(
        run_id=1, node_id=99, node_config={"partition-id": 2, "num-partitions": 3}, state=RecordDict(), run_config=CFG
    )
    client = cls(ctx, settings)
    init = client.reset_model().state_dict()
    expected = {**{k: v.numpy() for k, v in init.items()}, **strat.global_state}
    m = client.evaluate(with_config(RecordDict({"global": to_record(strat.global_state)}), 1))["metrics"]
    assert "before-agg-acc" not in m
    assert m["personal-loss"] == pytest.approx(scores(client, expected)[0], rel=1e-5)
    assert m["global-loss"] == pytest.approx(m["personal-loss"], rel=1e-5)


def test_without_the_servers_models_a_trained_client_evaluates_its_own_post_training_model(after_round_one):
    """Nothing to mix (no w_bar, no u_i in the message): the personalized model is the client's own model
    from its last local training, and there is no global model to score."""
    settings, _strat, ctxs, cls, _ = after_round_one
    client = cls(ctxs[1], settings)
    own = client.kept.load("model")
    m = client.evaluate(with_config(RecordDict(), 2))["metrics"]
    assert m["personal-loss"] == pytest.approx(scores(client, own)[0], rel=1e-5)
    assert "global-acc" not in m and m["before-agg-acc"] == pytest.approx(scores(client, own)[1])


def test_a_train_reply_reports_the_trained_models_accuracy_and_its_time_split_under_the_names_the_server_reads():
    """fedcac.md §6.9 logs the model right after local training ("before aggregation") as well: the train reply's
    ``trained-acc`` is that model's test accuracy.  The server reads a reply's time split as ``time-train``
    (local training) and ``time-method`` (the method's own client work: here the Eq. 11 mix and the Eq. 5/6
    masks); time reported under any other name is lost.  A second-round train message exercises both the
    mix and the masks."""
    settings, strat, ctxs, cls, _ = first_round(n=2)
    client = cls(ctxs[0], settings)
    reply = client.train(with_config(strat.payload(10, 2, "train"), 2))
    m = reply["metrics"]
    assert m["trained-acc"] == pytest.approx(scores(client, client.kept.load("model"))[1])
    assert {k for k in m if k.startswith("time-")} == {"time-train", "time-method"}
    assert m["time-method"] > 0


def test_the_reported_mask_cost_is_what_the_clients_sent_one_bit_per_parameter(after_round_one, tmp_path):
    """fedcac.md §2.4 / §2.8: the uplink mask costs one bit per trainable parameter, ceil(n / 8) bytes, about
    1/32 of the float32 model; the run's communication record reports the bytes the clients really sent."""
    _, strat, _, _, _ = after_round_one
    write_artifacts(strat, tmp_path)
    import json

    comm = json.loads((tmp_path / "fedcac_communication.json").read_text())
    n = sum(int(np.prod(s)) for s in strat.param_shapes.values())
    assert comm["parameters"] == n and comm["float32-model-bytes"] == 4 * n
    assert comm["packed-mask-bytes"] == -(-n // 8)
    assert comm["mask-to-model-ratio"] == pytest.approx(1 / 32, rel=1e-3)


def test_the_global_model_is_w_bar_with_own_bn_statistics_and_leaves_the_personalized_model_alone(after_round_one):
    """docs "The personalized model": the global model is w_bar with the client's own BatchNorm statistics; it is
    a separate model, so building it does not turn the Eq. 11 model (scored and saved as the personalized model)
    into w_bar."""
    settings, strat, ctxs, cls, _ = after_round_one
    client = cls(ctxs[2], settings)
    payload = with_config(strat.payload(12, 1, "evaluate"), 1)
    personal = client.personal_model(payload)
    before = {k: v.clone() for k, v in personal.state_dict().items()}
    glob = client.global_model(payload, personal)
    own = client.kept.load("model")
    for k, v in glob.state_dict().items():
        expected = strat.global_state[k] if k in strat.global_state else own[k]
        np.testing.assert_array_equal(v.numpy(), expected)
    assert any(
        not torch.equal(before[k], torch.from_numpy(np.asarray(strat.global_state[k]))) for k in strat.param_keys
    )
    for k, v in personal.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
