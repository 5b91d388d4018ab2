"""Aggregation rules and reply validation of the baseline strategies, on hand-made arrays."""

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from strategies.base import Reply
from task.params import to_record, weighted_average
from tests.strategy_harness import strategy


def update(strat, node, value, n, keys=None):
    keys = strat.shared_keys() if keys is None else keys
    arrays = {k: np.full(strat.model_info.shapes[k], value, dtype=np.float32) for k in keys}
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
    assert set(s.global_state) == set(s.model_info.keys)
    np.testing.assert_allclose(s.global_state["head.weight"], 3.25)
    np.testing.assert_allclose(s.global_state["conv.0.weight"], 3.25)


@pytest.mark.parametrize("method", ["fedper", "fedrep"])
def test_fedper_family_shares_only_the_body(method):
    s = strategy(method)
    assert set(s.shared_keys()) == set(s.model_info.body_keys) and not set(s.shared_keys()) & set(
        s.model_info.head_keys
    )
    s.aggregate(1, [update(s, 1, 0.0, 1), update(s, 2, 2.0, 1)])
    assert "head.weight" not in s.global_state
    np.testing.assert_allclose(s.global_state["fc.weight"], 1.0)


def test_local_shares_nothing():
    s = strategy("local")
    assert s.shared_keys() == [] and "arrays" not in s.reply_spec("train", 1).records
    assert len(s.payload(1, 1, "train")) == 0


def trained_per_round(method, rounds=3, n=10, **cfg):
    from tests.strategy_harness import drive, phase_of

    strat = strategy(method, **{"model": "mlp", "min-nodes": n, **cfg})
    grid = drive(strat, {i + 1: i for i in range(n)}, rounds)
    per_round: dict[int, list[int]] = {}
    for m in grid.sent:
        if phase_of(m) == "train":
            per_round.setdefault(int(m.content["config"]["server-round"]), []).append(m.metadata.dst_node_id)
    return strat, per_round


def test_local_trains_every_client_in_every_round_whatever_fraction_train():
    """A local-only client does not wait to be drawn: with fraction-train 0.2 all 10 clients train in each round
    (and the rounds record 10 replies), while FedAvg under the same settings trains 2 per round."""
    strat, local = trained_per_round("local", **{"fraction-train": 0.2})
    assert local == {r: list(range(1, 11)) for r in (1, 2, 3)}
    assert [r.train["num-replies"] for r in strat.history] == [10, 10, 10]
    _, fedavg = trained_per_round("fedavg", **{"fraction-train": 0.2})
    assert sorted(map(len, fedavg.values())) == [2, 2, 2]


@pytest.mark.parametrize("method", ["fedrod", "ditto", "fedprox"])
def test_global_model_methods_share_the_whole_model(method):
    s = strategy(method)
    assert set(s.shared_keys()) == set(s.model_info.keys)


def content_with(arrays, n=10, pid=0):
    return RecordDict(
        {
            "arrays": to_record(arrays),
            "metrics": MetricRecord({"num-examples": n, "partition-id": pid}),
        }
    )


def reply_shapes(s):
    return {k: s.model_info.shapes[k] for k in s.shared_keys()}


def good_arrays(s):
    return {k: np.zeros(shape, dtype=s.initial_state[k].dtype) for k, shape in reply_shapes(s).items()}


def test_reply_validation_rejects_and_logs():
    s = strategy("fedavg")
    seen: set[int] = set()
    ok = s.gate.check(1, 11, content_with(good_arrays(s), pid=1), "train", seen)
    assert ok is not None and ok.num_examples == 10 and ok.client == 1
    # duplicate
    assert s.gate.check(1, 11, content_with(good_arrays(s), pid=1), "train", seen) is None
    # NaN
    bad = good_arrays(s)
    bad["head.bias"][0] = np.nan
    assert s.gate.check(1, 12, content_with(bad, pid=2), "train", seen) is None
    # wrong shape
    bad = good_arrays(s)
    bad["head.weight"] = np.zeros((3, 3), np.float32)
    assert s.gate.check(1, 13, content_with(bad, pid=3), "train", seen) is None
    # missing key
    bad = good_arrays(s)
    del bad["head.bias"]
    assert s.gate.check(1, 14, content_with(bad, pid=4), "train", seen) is None
    # bad num-examples
    assert s.gate.check(1, 15, content_with(good_arrays(s), n=-3, pid=5), "train", seen) is None
    reasons = [f["reason"] for f in s.failures]
    assert reasons[0] == "duplicate reply from the same node"
    assert "non-finite" in reasons[1] and "head.bias" in reasons[1]
    assert "'head.weight' has shape" in reasons[2]
    assert "missing ['head.bias']" in reasons[3]
    assert "num-examples" in reasons[4]


def test_a_rejected_reply_does_not_touch_the_global_model():
    s = strategy("fedavg")
    before = {k: v.copy() for k, v in s.global_state.items()}
    seen: set[int] = set()
    bad = {
        k: np.full(shape, np.nan, s.initial_state[k].dtype)
        if s.initial_state[k].dtype.kind == "f"
        else np.zeros(shape, s.initial_state[k].dtype)
        for k, shape in reply_shapes(s).items()
    }
    good = {k: np.ones(shape, s.initial_state[k].dtype) for k, shape in reply_shapes(s).items()}
    ups = [
        u
        for u in (
            s.gate.check(1, 1, content_with(bad, pid=1), "train", seen),
            s.gate.check(1, 2, content_with(good, pid=2), "train", seen),
        )
        if u
    ]
    assert len(ups) == 1
    s.aggregate(1, ups)
    assert all(np.isfinite(v).all() for v in s.global_state.values())
    np.testing.assert_allclose(s.global_state["head.weight"], 1.0)
    assert not np.allclose(before["head.weight"], 1.0)
