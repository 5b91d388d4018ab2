"""Aggregation rules and reply validation of the baseline strategies, on hand-made arrays."""

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from server_app.app import build_strategy
from strategies.base import Reply
from task.config import parse_settings
from task.params import to_record, weighted_average


def strategy(method, **cfg):
    return build_strategy(parse_settings({"method": method, **cfg}))


def update(strat, node, value, n, keys=None):
    keys = strat.shared_keys() if keys is None else keys
    arrays = {k: np.full(strat.shapes[k], value, dtype=np.float32) for k in keys}
    return Reply(node, node, n, {"num-examples": n, "partition-id": node}, {"arrays": arrays})


def test_weighted_average_by_hand():
    a = {"w": np.array([1.0, 2.0]), "n": np.array(1, dtype=np.int64)}
    b = {"w": np.array([3.0, 6.0]), "n": np.array(4, dtype=np.int64)}
    out = weighted_average([a, b], [1, 3])
    np.testing.assert_allclose(out["w"], [2.5, 5.0])
    assert out["n"].dtype == np.int64 and out["n"] == 3  # rint(3.25)
    with pytest.raises(ValueError, match="non-negative"):
        weighted_average([a, b], [1, -1])
    with pytest.raises(ValueError, match="one weight per state"):
        weighted_average([a], [1, 2])


def test_fedavg_averages_everything_by_examples():
    s = strategy("fedavg")
    s.aggregate(1, [update(s, 1, 1.0, 10), update(s, 2, 4.0, 30)])
    assert set(s.global_state) == set(s.all_keys)
    np.testing.assert_allclose(s.global_state["head.weight"], 3.25)
    np.testing.assert_allclose(s.global_state["conv.0.weight"], 3.25)


@pytest.mark.parametrize("method", ["fedper", "fedrep"])
def test_fedper_family_shares_only_the_body(method):
    s = strategy(method)
    assert set(s.shared_keys()) == set(s.body_keys) and not set(s.shared_keys()) & set(s.head_keys)
    s.aggregate(1, [update(s, 1, 0.0, 1), update(s, 2, 2.0, 1)])
    assert "head.weight" not in s.global_state
    np.testing.assert_allclose(s.global_state["fc.weight"], 1.0)


def test_local_shares_nothing():
    s = strategy("local")
    assert s.shared_keys() == [] and s.expected_reply_shapes(1) == {}
    assert len(s.train_payload(1, 1)) == 0


@pytest.mark.parametrize("method", ["fedrod", "ditto", "fedprox"])
def test_global_model_methods_share_the_whole_model(method):
    s = strategy(method)
    assert set(s.shared_keys()) == set(s.all_keys)


def content_with(arrays, n=10, pid=0):
    return RecordDict(
        {
            "arrays": to_record(arrays),
            "metrics": MetricRecord({"num-examples": n, "partition-id": pid}),
        }
    )


def good_arrays(s):
    return {k: np.zeros(shape, dtype=s.initial_state[k].dtype) for k, shape in s.expected_reply_shapes(0).items()}


def test_reply_validation_rejects_and_logs():
    s = strategy("fedavg")
    seen = set()
    ok = s.check_reply(1, 11, content_with(good_arrays(s), pid=1), "train", seen)
    assert ok is not None and ok.num_examples == 10 and ok.client == 1
    # duplicate
    assert s.check_reply(1, 11, content_with(good_arrays(s), pid=1), "train", seen) is None
    # NaN
    bad = good_arrays(s)
    bad["head.bias"][0] = np.nan
    assert s.check_reply(1, 12, content_with(bad, pid=2), "train", seen) is None
    # wrong shape
    bad = good_arrays(s)
    bad["head.weight"] = np.zeros((3, 3), np.float32)
    assert s.check_reply(1, 13, content_with(bad, pid=3), "train", seen) is None
    # missing key
    bad = good_arrays(s)
    del bad["head.bias"]
    assert s.check_reply(1, 14, content_with(bad, pid=4), "train", seen) is None
    # bad num-examples
    assert s.check_reply(1, 15, content_with(good_arrays(s), n=-3, pid=5), "train", seen) is None
    reasons = [f["reason"] for f in s.failures]
    assert reasons[0] == "duplicate reply from the same node"
    assert "non-finite" in reasons[1] and "head.bias" in reasons[1]
    assert "'head.weight' has shape" in reasons[2]
    assert "missing ['head.bias']" in reasons[3]
    assert "num-examples" in reasons[4]


def test_a_rejected_reply_does_not_touch_the_global_model():
    s = strategy("fedavg")
    before = {k: v.copy() for k, v in s.global_state.items()}
    seen = set()
    bad = {
        k: np.full(shape, np.nan, s.initial_state[k].dtype)
        if s.initial_state[k].dtype.kind == "f"
        else np.zeros(shape, s.initial_state[k].dtype)
        for k, shape in s.expected_reply_shapes(0).items()
    }
    good = {k: np.ones(shape, s.initial_state[k].dtype) for k, shape in s.expected_reply_shapes(0).items()}
    ups = [
        u
        for u in (
            s.check_reply(1, 1, content_with(bad, pid=1), "train", seen),
            s.check_reply(1, 2, content_with(good, pid=2), "train", seen),
        )
        if u
    ]
    assert len(ups) == 1
    s.aggregate(1, ups)
    assert all(np.isfinite(v).all() for v in s.global_state.values())
    np.testing.assert_allclose(s.global_state["head.weight"], 1.0)
    assert not np.allclose(before["head.weight"], 1.0)


def _sent(node, message_id):  # the metadata of a sent message, as the grid leaves it after pushing
    return SimpleNamespace(dst_node_id=node, message_id=message_id)


def _error_reply(src, reply_to, reason="Error: Node Unavailable"):
    return SimpleNamespace(
        metadata=SimpleNamespace(src_node_id=src, reply_to_message_id=reply_to),
        has_error=lambda: True,
        error=SimpleNamespace(reason=reason),
    )


def test_lost_and_silent_nodes_are_recorded_under_their_own_ids():
    # node 7 crashed: the SuperLink answers for it (source id 1); node 9 never answers within the time limit;
    # node 8 replies with its own error
    s = strategy("fedavg")
    s._outbox[(3, "train")] = [_sent(7, "m7"), _sent(8, "m8"), _sent(9, "m9")]
    replies = [_error_reply(1, "m7"), _error_reply(8, "m8", "client raised ValueError")]
    seen: set[int] = set()
    assert all(s.validate_reply(3, r, "train", seen) is None for r in replies)
    s.record_silent(3, "train", replies, 120.0)
    got = {(f["node-id"], f["phase"]): f["reason"] for f in s.failures}
    assert set(got) == {(7, "train"), (8, "train"), (9, "train")}
    assert "Node Unavailable" in got[(7, "train")] and "ValueError" in got[(8, "train")]
    assert got[(9, "train")] == "no reply within 120 s (round-timeout)"
    assert (3, "train") not in s._outbox  # the sent messages are not kept after the round
