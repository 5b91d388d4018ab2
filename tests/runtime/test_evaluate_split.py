"""``evaluate-split='validation'`` (runs that select settings) scores every method on the clients' validation
splits, and no method touches a test split: every method's real client code answers its strategy's real round loop
(train, evaluate and every query phase) on clients whose test split would fail any use (NaN images, labels out of
range), and the run completes with every reply accepted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, MetricRecord, RecordDict, UserConfig

import client_app.node as client_node
from server_app.app import build_strategy
from task.config import parse_settings
from task.data import ClientData, DataSettings, load_client_data
from task.methods import METHODS, load_object
from task.train import evaluate
from tests.runtime.test_hostile_replies import CLIENT_OF, COMMON, NODES, SCENARIOS
from tests.strategy_harness import ReplayGrid, outgoing_messages, phase_of, reply_message, run_round

# Oracle clusters on planted groups; everything else on the default partition
DATA: dict[str, UserConfig] = {"oracle": {"partition": "planted-clusters", "num-clusters": 2}}
OUT_OF_RANGE = 10_000


def poisoned(data: ClientData) -> ClientData:
    """The client's data with a test split that fails any evaluation: NaN images, labels no model has."""
    return ClientData(
        data.x_train,
        data.y_train,
        data.x_val,
        data.y_val,
        torch.full_like(data.x_test, float("nan")),
        torch.full_like(data.y_test, OUT_OF_RANGE),
        data.num_classes,
        data.domain,
        data.meta,
        data.x_calib,
        data.y_calib,
    )


@pytest.fixture
def poisoned_test_splits(monkeypatch):
    def load(settings: DataSettings, partition_id: int, num_partitions: int, cache_dir=None) -> ClientData:
        return poisoned(load_client_data(settings, partition_id, num_partitions))

    monkeypatch.setattr(client_node, "load_client_data", load)


def answer(client, kind: str, content: RecordDict) -> RecordDict:
    """What client_app.app's handlers do with a message of ``kind`` (without Flower's Message wrapper)."""
    client.begin(content)
    if kind == "train":
        evaluation = client.evaluation(content) if client.config.get("evaluate") else None
        reply = client.train(content)
        if evaluation is not None:
            reply["evaluation"] = MetricRecord(evaluation)
        return reply
    if kind == "evaluate":
        return client.evaluate(content)
    return client.query(kind.split(".", 1)[1], content)


def run_with_real_clients(name: str, split: str):
    method, extra, rounds = SCENARIOS[name]
    cfg: UserConfig = {**COMMON, "method": method, "num-server-rounds": rounds, **extra, **DATA.get(method, {})}
    cfg.update({"evaluate-split": split, "val-fraction": 0.2})
    settings = parse_settings(cfg)
    strategy = build_strategy(settings)
    client_class = load_object(METHODS[method].client)
    states = {node: RecordDict() for node in NODES}
    replies: list[RecordDict] = []

    def respond(msg):
        node = msg.metadata.dst_node_id
        ctx = Context(
            run_id=1,
            node_id=node,
            node_config={"partition-id": CLIENT_OF[node], "num-partitions": len(NODES)},
            state=states[node],
            run_config=cfg,
        )
        content = answer(client_class(ctx, settings), msg.metadata.message_type, msg.content)
        replies.append(content)
        return [reply_message(node, content)]

    grid = ReplayGrid(NODES, respond)
    with outgoing_messages():
        for r in range(1, rounds + 1):
            run_round(strategy, grid, r)
    return strategy, grid, replies


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_selection_runs_of_every_method_never_touch_a_test_split(name, poisoned_test_splits):
    strategy, grid, replies = run_with_real_clients(name, "validation")
    assert not strategy.failures, strategy.failures
    assert {phase_of(m) for m in grid.sent} >= {"train"}
    evaluations = [dict(r["metrics"]) for r, m in zip(replies, grid.sent, strict=True) if phase_of(m) == "evaluate"]
    evaluations += [dict(r["evaluation"]) for r in replies if "evaluation" in r.metric_records]
    assert evaluations, "the run evaluated nothing"
    for ev in evaluations:
        assert 0.0 <= ev["personal-acc"] <= 1.0 and np.isfinite(ev["personal-loss"])


def test_the_poisoned_test_split_fails_a_run_that_scores_on_the_test_split(poisoned_test_splits):
    with pytest.raises((IndexError, RuntimeError)):
        run_with_real_clients("fedavg", "test")


def test_a_selection_run_reports_the_accuracy_on_the_validation_split(poisoned_test_splits):
    cfg = {**COMMON, "method": "fedavg", "evaluate-split": "validation", "val-fraction": 0.2}
    ctx = Context(
        run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 4}, state=RecordDict(), run_config=cfg
    )
    settings = parse_settings(cfg)
    strategy = build_strategy(settings)
    client = load_object(METHODS["fedavg"].client)(ctx, settings)
    reply = dict(client.evaluate(strategy.payload(7, 1, "evaluate"))["metrics"])
    val = load_client_data(settings.data, 1, 4)
    model = client.reset_model()  # the initial weights: the global model of round 1
    assert reply["test-examples"] == len(val.y_val) > 0
    assert reply["personal-acc"] == pytest.approx(evaluate(model, val.x_val, val.y_val)[1])


def test_selection_needs_a_validation_split():
    message = (
        r"^evaluate-split='validation' scores on the validation split, but val-fraction=0 leaves it empty; use "
        r"val-fraction > 0 \(e\.g\. 0\.2\)$"
    )
    with pytest.raises(ValueError, match=message):
        parse_settings({"evaluate-split": "validation", "val-fraction": 0.0})
    with pytest.raises(ValueError, match=r"'evaluate-split' must be one of \['test', 'validation'\], got 'train'"):
        parse_settings({"evaluate-split": "train"})


@pytest.mark.slow
def test_a_flower_run_at_the_defaults_trains_on_the_cap_and_scores_on_validation(engine):
    """Through Flower with what a user gets from ``flwr run .`` (cnn with BatchNorm, SGD with momentum 0.9) and
    the two keys a selection run of the benchmark grids sets."""
    import csv
    from pathlib import Path

    asked = {"min-nodes": 3, "num-server-rounds": 2, "train-samples": 15, "evaluate-split": "validation"}
    asked["val-fraction"] = 0.3  # not the test share (0.2), so that the two splits differ in size
    summary = engine.run(asked, num_supernodes=3)
    assert summary["failures"] == 0 and summary["clients"] == 3 and 0.0 <= summary["personal-acc"] <= 1.0
    with (Path(summary["results"]) / "clients.csv").open(newline="") as fh:
        rows = {int(r["client"]): r for r in csv.DictReader(fh)}
    settings = parse_settings(asked)
    for pid, row in rows.items():
        data = load_client_data(settings.data, pid, 3)
        assert int(float(row["num-examples"])) == 15 == len(data.y_train)
        assert int(float(row["test-examples"])) == len(data.y_val) != len(data.y_test)
