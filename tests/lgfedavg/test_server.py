"""What LG-FedAvg's server must do (docs/methods/lgfedavg.md): share and send only the head (the mirror of
FedPer), average the heads by training examples, and refuse a reply that sends the body."""

import numpy as np
from flwr.app import MetricRecord, RecordDict

from strategies.base import Reply
from task.params import record_to_numpy, to_record
from tests.strategy_harness import strategy


def test_the_server_shares_and_sends_only_the_head_the_mirror_of_fedper():
    s, fedper = strategy("lgfedavg", model="mlp"), strategy("fedper", model="mlp")
    assert s.shared_keys() == s.model_info.head_keys == ["head.weight", "head.bias"]
    assert set(s.shared_keys()) | set(fedper.shared_keys()) == set(s.model_info.keys)
    assert not set(s.shared_keys()) & set(fedper.shared_keys())
    assert sorted(s.payload(1, 1, "train")["arrays"].keys()) == ["head.bias", "head.weight"]
    assert not s.has_global_model and s.server_models() == {}


def test_the_server_averages_the_heads_by_training_examples():
    s = strategy("lgfedavg", model="mlp")
    replies = [
        Reply(
            n,
            n,
            examples,
            {"num-examples": examples, "partition-id": n},
            {"arrays": {k: np.full(s.model_info.shapes[k], value, np.float32) for k in s.model_info.head_keys}},
        )
        for n, value, examples in ((1, 1.0, 10), (2, 4.0, 30))
    ]
    s.aggregate(1, replies)
    assert sorted(s.global_state) == ["head.bias", "head.weight"]
    np.testing.assert_allclose(s.global_state["head.weight"], 3.25)  # (10 * 1 + 30 * 4) / 40
    np.testing.assert_allclose(record_to_numpy(s.payload(1, 2, "train")["arrays"])["head.bias"], 3.25)


def test_a_reply_that_sends_the_body_is_rejected_and_a_head_only_reply_accepted():
    s = strategy("lgfedavg", model="mlp")
    head = {k: np.zeros(s.model_info.shapes[k], np.float32) for k in s.model_info.head_keys}
    body = {k: np.zeros(s.model_info.shapes[k], np.float32) for k in s.model_info.body_keys}
    metrics = MetricRecord({"num-examples": 5, "partition-id": 0})
    assert (
        s.gate.check(1, 7, RecordDict({"arrays": to_record({**head, **body}), "metrics": metrics}), "train", set())
        is None
    )
    assert "unexpected ['fc1.bias'" in s.failures[-1]["reason"]
    assert s.gate.check(1, 7, RecordDict({"arrays": to_record(head), "metrics": metrics}), "train", set()) is not None
