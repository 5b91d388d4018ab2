"""The baseline ClientApp handlers called directly with a hand-built Context (no Ray, no SuperLink)."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict, UserConfig

from server_app.app import build_strategy
from strategies.ifca import IFCAStrategy
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.params import record_to_numpy
from tests.strategy_harness import build_as

BASELINES = ["local", "fedavg", "fedprox", "fedper", "fedrep", "fedrod", "ditto"]
CFG: UserConfig = {"num-server-rounds": 2, "local-epochs": 1, "partition": "pathological", "classes-per-client": 2}


def context(method, pid=0, n=5, **extra):
    cfg = {**CFG, "method": method, **extra}
    return Context(
        run_id=1,
        node_id=100 + pid,
        node_config={"partition-id": pid, "num-partitions": n},
        state=RecordDict(),
        run_config=cfg,
    )


def client(ctx):
    settings = parse_settings(ctx.run_config)
    return load_object(METHODS[settings.method].client)(ctx, settings)


def payload(strategy, rnd):
    content = strategy.payload(1, rnd, "train")
    content["config"] = ConfigRecord({"server-round": rnd})
    return content


@pytest.mark.parametrize("method", BASELINES)
def test_train_and_evaluate_reply_what_the_strategy_expects(method):
    ctx = context(method)
    strat = build_strategy(parse_settings(ctx.run_config))
    reply = client(ctx).train(payload(strat, 1))
    metrics = dict(reply["metrics"])
    assert metrics["num-examples"] > 0 and metrics["partition-id"] == 0
    assert 0.0 <= metrics["trained-acc"] <= 1.0 and metrics["steps"] > 0
    update = strat.gate.check(1, 100, reply, "train", set())
    assert update is not None, strat.failures
    strat.aggregate(1, [update])
    c = client(ctx)
    ev_reply = c.evaluate(payload(strat, 1))
    ev = dict(ev_reply["metrics"])
    assert 0.0 <= ev["personal-acc"] <= 1.0
    assert ("global-acc" in ev) == strat.has_global_model
    # how many samples the accuracy rests on travels with it (benchmarks report it), and the server accepts it
    _x_test, y_test = c.test_split()
    assert ev["test-examples"] == len(y_test) > 0
    assert round(ev["personal-acc"] * len(y_test), 6) == round(ev["personal-acc"] * len(y_test))
    assert strat.gate.check(1, 100, ev_reply, "evaluate", set()) is not None, strat.failures


def test_local_model_persists_in_context_state():
    ctx = context("local")
    client(ctx).train(RecordDict())
    first = record_to_numpy(ctx.state["model"])
    client(ctx).train(RecordDict())
    second = record_to_numpy(ctx.state["model"])
    assert any(not np.allclose(first[k], second[k]) for k in first if k.endswith("weight"))


def test_fedper_head_stays_on_the_client():
    ctx = context("fedper")
    strat = build_strategy(parse_settings(ctx.run_config))
    reply = client(ctx).train(payload(strat, 1))
    assert not any(k.startswith("head.") for k in reply["arrays"])
    head = record_to_numpy(ctx.state["head"])
    assert set(head) == {"head.weight", "head.bias"}


def test_fedrep_trains_head_then_body():
    ctx = context("fedrep", **{"head-epochs": 2})
    strat = build_strategy(parse_settings(ctx.run_config))
    init_head = strat.global_state  # body only
    reply = client(ctx).train(payload(strat, 1))
    body = record_to_numpy(reply["arrays"])
    assert any(not np.allclose(body[k], init_head[k]) for k in body if k.endswith("weight"))


def test_personal_models_differ_between_clients_with_different_labels():
    states = []
    for pid in (0, 3):
        ctx = context("ditto", pid=pid)
        strat = build_strategy(parse_settings(ctx.run_config))
        client(ctx).train(payload(strat, 1))
        states.append(record_to_numpy(ctx.state["personal"]))
    assert not np.allclose(states[0]["head.bias"], states[1]["head.bias"])


def test_missing_partition_in_node_config_is_a_clear_error():
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={"method": "fedavg"})
    with pytest.raises(ValueError, match="partition-id"):
        client(ctx)


def test_ifca_client_picks_the_cluster_with_the_lowest_loss():
    cfg: UserConfig = {"method": "ifca", "tiers": 3, "partition": "iid"}
    ctx = Context(
        run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(), run_config=cfg
    )
    settings = parse_settings(cfg)
    strat = build_as(IFCAStrategy, settings)
    strat.models[2] = {k: v.copy() for k, v in strat.models[2].items()}
    # make cluster 1 a model already trained on this client's data: it must be chosen
    cls = load_object(METHODS["ifca"].client)
    c = cls(ctx, settings)
    model = c.reset_model()
    c.fit(model, epochs=5)
    strat.models[1] = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    reply = cls(ctx, settings).train(payload(strat, 1))
    assert reply["metrics"]["cluster"] == 1
    update = strat.gate.check(1, 5, reply, "train", set())
    assert update is not None, strat.failures
    assert strat.aggregate(1, [update])["ifca"]["cluster-sizes"] == [0, 1, 0]


def test_node_trains_on_its_own_data_file(tmp_path):
    # a deployed node without the embedded partitions: its own .npz (here: partition 3 exported), no num-partitions
    from task.data import export_client_file, load_client_data

    settings = parse_settings({**CFG, "method": "fedavg"})
    path = export_client_file(settings.data, 3, 5, tmp_path / "node3.npz")
    ctx = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 3, "data-path": str(path)},
        state=RecordDict(),
        run_config={**CFG, "method": "fedavg"},
    )
    c = client(ctx)
    ref = load_client_data(settings.data, 3, 5)
    assert len(c.data.y_test) == len(ref.y_test) and c.data.num_train + len(c.data.y_val) == ref.num_train + len(
        ref.y_val
    )
    assert set(c.data.y_train.tolist()) == set(ref.y_train.tolist())  # the same two classes
    strat = build_strategy(settings)
    reply = c.train(payload(strat, 1))
    assert strat.gate.check(1, 7, reply, "train", set()) is not None, strat.failures


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.zeros((4, 3), np.float32), "y": np.zeros(4, np.int64)}, "needs (N, 1, 8, 8)"),
        ({"x": np.zeros((4, 1, 8, 8), np.float32), "y": np.full(4, 10)}, "must be in [0, 10)"),
        ({"x": np.zeros((4, 1, 8, 8), np.float32), "y": np.zeros(4, np.float32)}, "must be integers"),
        ({"x": np.zeros((4, 1, 8, 8), np.float32)}, "needs 'x' and 'y'"),
        ({"x": np.full((4, 1, 8, 8), np.nan, np.float32), "y": np.zeros(4, np.int64)}, "NaN"),
    ],
)
def test_bad_node_data_file_says_what_is_wrong(tmp_path, arrays, message):
    from task.data import DataSettings, load_local_file

    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_local_file(str(path), DataSettings(dataset="digits"), 0)
    with pytest.raises(ValueError, match="no such file"):
        load_local_file(str(tmp_path / "missing.npz"), DataSettings(dataset="digits"), 0)


def test_node_config_without_data_source_is_refused():
    ctx = Context(
        run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config={**CFG, "method": "fedavg"}
    )
    with pytest.raises(ValueError, match="data-path"):
        client(ctx)
