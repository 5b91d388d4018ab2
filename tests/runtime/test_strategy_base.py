"""The base's round loop keeps Flower's ``Strategy.start`` contract: its arguments are used and its ``Result``
is returned; a resumed strategy runs only the rounds after its checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord

from task.params import to_record
from tests.strategy_harness import ReplayGrid, outgoing_messages, phase_of, reply_message, strategy, valid_content

NODES = {21: 0, 5: 1, 13: 2}


def answering(s, silent=()):
    def respond(msg):
        node = msg.metadata.dst_node_id
        if node in silent:
            return []
        seed = int(msg.content["config"]["server-round"]) * 100 + node
        return [reply_message(node, valid_content(s.reply_spec(phase_of(msg), node), NODES[node], seed))]

    return ReplayGrid(NODES, respond)


def test_start_returns_flowers_result_with_every_rounds_metrics_and_the_final_model():
    s = strategy("fedavg", model="mlp", **{"min-nodes": 3, "num-server-rounds": 3, "eval-every": 2})
    with outgoing_messages():
        result = s.start(answering(s), to_record(s.global_state), num_rounds=3, timeout=60)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert result.train_metrics_clientapp[2]["num-replies"] == 3
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2, 3]
    assert result.evaluate_metrics_clientapp[3]["personal-acc"] == s.history[-1].evaluate["personal-acc"]
    assert set(result.arrays.keys()) == set(s.global_state)
    for k, v in s.global_state.items():
        np.testing.assert_array_equal(result.arrays[k].numpy(), v)
    assert s.rounds_done == 3 and [r.server_round for r in s.history] == [1, 2, 3]


def test_start_uses_its_initial_arrays_configs_timeout_and_evaluation_function():
    s = strategy("fedavg", model="mlp", **{"min-nodes": 3, "num-server-rounds": 2})
    start = {k: np.full_like(v, 0.5) for k, v in s.global_state.items()}
    grid, calls = answering(s, silent={13}), []

    def evaluate_fn(server_round, arrays):
        calls.append((server_round, {k: arrays[k].numpy().copy() for k in arrays}))
        return MetricRecord({"central-acc": 0.25 * server_round})

    with outgoing_messages():
        result = s.start(
            grid,
            to_record(start),
            num_rounds=2,
            timeout=7.5,
            train_config=ConfigRecord({"lr-scale": 0.5, "server-round": -1}),
            evaluate_config=ConfigRecord({"split": "test"}),
            evaluate_fn=evaluate_fn,
        )
    first = next(m for m in grid.sent if phase_of(m) == "train")
    for k, v in start.items():  # the first round sends the initial arrays given
        np.testing.assert_array_equal(first.content["arrays"][k].numpy(), v)
    cfg = first.content["config"]
    assert cfg["lr-scale"] == 0.5 and cfg["server-round"] == 1  # the caller's config; the base's keys win
    evaluations = [m for m in grid.sent if phase_of(m) == "evaluate"]
    assert evaluations and all(m.content["config"]["split"] == "test" for m in evaluations)
    assert all("lr-scale" not in m.content["config"] for m in evaluations)
    assert [r for r, _ in calls] == [0, 1, 2] and calls[0][1].keys() == start.keys()
    np.testing.assert_array_equal(calls[0][1]["head.bias"], start["head.bias"])
    assert result.evaluate_metrics_serverapp[2]["central-acc"] == 0.5
    silent = [f for f in s.failures if f["node-id"] == 13]
    assert silent and all(f["reason"] == "no reply within 7.5 s (round-timeout)" for f in silent)


@pytest.mark.parametrize("method", ["fedavg", "fedper", "local"])
def test_arrays_that_are_not_the_methods_shared_model_are_refused(method):
    s = strategy(method, model="mlp", **{"min-nodes": 3})
    grid = answering(s)
    whole = {k: np.array(v) for k, v in s.initial_state.items()}
    shared = {k: whole[k] for k in s.shared_keys()}
    wrong = [{**shared, "other": np.zeros(1, np.float32)}]
    if method != "fedavg":
        wrong.append(whole)  # more than the method shares
    if shared:
        first = next(iter(shared))
        wrong += [
            {**shared, first: shared[first][:-1]},
            {**shared, first: shared[first].astype(np.float64)},
            {k: v for k, v in shared.items() if k != first},
        ]
    for arrays in wrong:
        with outgoing_messages(), pytest.raises(ValueError, match="shared model"):
            s.configure_train(1, to_record(arrays), ConfigRecord(), grid)
    with outgoing_messages():
        assert len(list(s.configure_train(1, to_record(shared), ConfigRecord(), grid))) == 3


def test_a_resumed_strategy_starts_after_its_last_round(tmp_path):
    s = strategy("fedavg", model="mlp", **{"min-nodes": 3, "num-server-rounds": 3})
    s.results_dir = tmp_path / "run"
    with outgoing_messages():
        s.start(answering(s), to_record(s.global_state), num_rounds=1, timeout=60)
    resumed = strategy("fedavg", model="mlp", **{"min-nodes": 3, "num-server-rounds": 3})
    resumed.checkpoint.resume(s.checkpoint.state(), s.rounds_done)
    grid = answering(resumed)
    with outgoing_messages():
        result = resumed.start(grid, to_record(resumed.global_state), num_rounds=3, timeout=60)
    assert sorted(result.train_metrics_clientapp) == [2, 3]
    assert {int(m.content["config"]["server-round"]) for m in grid.sent} == {2, 3}
    assert phase_of(grid.sent[0]) == "identify"  # node ids change between runs: every node is asked first
    assert [r.server_round for r in resumed.history] == [1, 2, 3]


def test_the_accuracies_the_base_reads_are_required_where_they_ride():
    """The personalized accuracy is required of an evaluate reply, and of the evaluation a train reply
    carries when the previous round's evaluation rides on it (full participation); a node that leaves them out is
    refused for that message with the metric named, the others go on."""
    s = strategy("fedavg", model="mlp", **{"min-nodes": 3, "num-server-rounds": 2})
    plain = answering(s)

    def respond(msg):
        [reply] = plain.respond(msg)
        node, phase = msg.metadata.dst_node_id, phase_of(msg)
        record = {(5, "train"): "evaluation", (13, "evaluate"): "metrics"}.get((node, phase))
        if record is not None and record in reply.content.metric_records:
            metrics = dict(reply.content.metric_records[record])
            del metrics["personal-acc"]
            reply.content[record] = MetricRecord(metrics)
        return [reply]

    with outgoing_messages():
        s.start(ReplayGrid(NODES, respond), to_record(s.global_state), num_rounds=2, timeout=60)
    assert [(f["round"], f["node-id"], f["phase"], f["reason"]) for f in s.failures] == [
        (2, 5, "train", "evaluation metric 'personal-acc' is missing"),
        (2, 13, "evaluate", "metric 'personal-acc' is missing"),
    ]
