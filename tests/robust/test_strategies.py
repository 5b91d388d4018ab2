"""The run's aggregation rule reaches every average a method builds from client models (the FedAvg family's global
model, every cluster, tier and centre, FedCAC's global and customized models, Client2Vec's index-weighted model,
FedC2I's forwarded models), and the default leaves each method's own average exactly as it was."""

import numpy as np
import pytest

from strategies.base import PersonalizedStrategy
from strategies.client2vec import Client2VecStrategy
from strategies.fedc2i import FedC2IStrategy
from strategies.gate import Reply
from strategies.outcome import RoundLog
from strategies.robust import RobustAveraging
from task.config import parse_settings
from task.params import to_record, weighted_average
from tests.in_process import run_in_process
from tests.strategy_harness import build_as, drive


def replies(strategy, values):
    out = []
    for client, value in enumerate(values):
        arrays = {k: (np.asarray(v) + value).astype(np.asarray(v).dtype) for k, v in strategy.global_state.items()}
        out.append(Reply(100 + client, client, 10 * (client + 1), {}, {"arrays": arrays}))
    return out


def test_the_default_mean_is_the_methods_own_weighted_average_and_records_nothing():
    strategy = build_as(PersonalizedStrategy, parse_settings({"method": "fedavg"}))
    strategy.history.append(RoundLog(1))
    updates = replies(strategy, [0.0, 0.5, 3.0])
    expected = weighted_average([u.arrays for u in updates], [u.num_examples for u in updates])
    strategy.aggregate(1, updates)
    assert all(np.array_equal(strategy.global_state[k], expected[k]) for k in expected)
    assert "robust" not in strategy.history[-1].extra


@pytest.mark.parametrize("cap,weights", [(1.0, [1 / 3, 1 / 3, 1 / 3]), (0.0, [10 / 60, 20 / 60, 30 / 60])])
def test_a_rule_replaces_the_mean_and_records_what_it_kept_and_with_which_weights(cap, weights):
    """Multi-Krum keeps the three models near each other and averages them uniformly (weight-cap 1, the default), or
    with the clients' sizes (weight-cap 0)."""
    keys = {"aggregator": "multi-krum", "byzantine-share": 0.25, "krum-select": 3, "weight-cap": cap}
    strategy = build_as(PersonalizedStrategy, parse_settings({"method": "fedavg", **keys}))
    strategy.history.append(RoundLog(1))
    start = {k: np.array(v) for k, v in strategy.global_state.items()}
    strategy.aggregate(1, replies(strategy, [0.0, 0.01, 0.02, 40.0]))
    [entry] = strategy.history[-1].extra["robust"]
    assert entry == {
        "group": "global",
        "rule": "multi-krum",
        "clients": [0, 1, 2, 3],
        "selected": [0, 1, 2],
        "weights": pytest.approx(weights, abs=1e-6),
    }
    k = "head.bias"
    expected = start[k] + np.array(weights) @ np.array([0.0, 0.01, 0.02])
    assert np.allclose(strategy.global_state[k], expected, atol=1e-6)


#: (method, rule, the groups each round's average is recorded under) for every method that averages client models
CALL_SITES = [
    ("fedavg", "median", {"global"}),
    ("fedprox", "bulyan", {"global"}),
    ("fedper", "norm-bound", {"global"}),
    ("lgfedavg", "trimmed-mean", {"global"}),
    ("fedbn", "multi-krum", {"global"}),
    ("ditto", "fltrust", {"global"}),
    ("cfl", "multi-krum", {"cluster 0"}),
    ("ifca", "norm-bound", {"cluster 0", "cluster 1"}),
    ("pifl", "fltrust", {"tier 0", "tier 1"}),
    ("fedsoft", "median", {"centre 0", "centre 1"}),
    ("fedcac", "multi-krum", {"global", "custom 0", "custom 1", "custom 2"}),
    ("pfedlia", "norm-bound", {"global", "cluster 0"}),
    ("fedc2i", "norm-bound", {"client 0", "client 1", "client 2"}),
    ("fedc2i", "multi-krum", {"peers of 0", "peers of 1", "peers of 2", "peers of a newcomer"}),
    ("client2vec", "multi-krum", {"global"}),
]
#: keys a call site needs besides the rule: Client2Vec keeps its index weights only with a cap above uniform
CALL_SITE_KEYS = {"client2vec": {"weight-cap": 2.0}}


@pytest.mark.parametrize("method,rule,groups", CALL_SITES)
def test_every_average_of_client_models_goes_through_the_runs_rule(tmp_path, method, rule, groups):
    keys = {"record-messages": False, **CALL_SITE_KEYS.get(method, {})}
    strategy, _, _, _ = run_in_process(method, tmp_path, aggregator=rule, **keys)
    recorded = [{e["group"] for e in r.extra.get("robust", [])} for r in strategy.history]
    seen = set().union(*recorded)
    assert seen <= groups | {g for g in seen if g.startswith(("cluster ", "tier ", "centre "))}
    assert {g.split(" ")[0] for g in seen} == {g.split(" ")[0] for g in groups}, recorded
    assert all(e["rule"] == rule for r in strategy.history for e in r.extra.get("robust", []))
    assert all(recorded), f"a round averaged without the rule: {recorded}"
    assert not strategy.failures


def test_the_federated_dsa_ign_average_goes_through_the_runs_rule_as_its_own_group(tmp_path):
    """Client2Vec's federated DSA-IGN rounds average the nodes' IGN updates with the run's rule too, recorded as
    the ``dsa-ign`` group over the clients that sent them, apart from the model's ``global`` average."""
    config = {"c2v-ign-mode": "federated", "c2v-ign-fraction": 0.5, "c2v-ign-epochs": 2, "record-messages": False}
    strategy, _, _, _ = run_in_process("client2vec", tmp_path, aggregator="multi-krum", **{**config, "weight-cap": 0.0})
    entries = [e for r in strategy.history for e in r.extra.get("robust", [])]
    ign = [e for e in entries if e["group"] == "dsa-ign"]
    assert ign and {e["group"] for e in entries} == {"dsa-ign", "global"}
    assert all(e["rule"] == "multi-krum" and e["clients"] == sorted(e["clients"]) and e["clients"] for e in ign)
    assert set().union(*(e["clients"] for e in ign)) <= set(range(strategy.settings.min_nodes))
    assert not strategy.failures


class Averaging(RobustAveraging):
    """The rule's part on its own: the run's settings, a history with one round, no client known yet."""

    def __init__(self, **keys):
        super().__init__(parse_settings({"method": "fedavg", **keys}), [RoundLog(1)], {})

    @property
    def entries(self):
        return self.history[-1].extra.get("robust", [])


def test_averaging_rows_uses_the_methods_weights_and_the_model_sent_and_records_the_rule_by_client_id():
    rows = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0], [90.0, 90.0]])
    krum = Averaging(aggregator="multi-krum", **{"byzantine-share": 0.25, "krum-select": 3, "weight-cap": 0.0})
    out = krum.average_rows(rows, np.array([1.0, 2.0, 1.0, 1.0]), [7, 8, 9, 10], group="cluster 1")
    assert np.allclose(out, (rows[0] + 2 * rows[1] + rows[2]) / 4)
    assert krum.entries == [
        {
            "group": "cluster 1",
            "rule": "multi-krum",
            "clients": [7, 8, 9, 10],
            "selected": [7, 8, 9],
            "weights": [0.25, 0.5, 0.25],
        }
    ]
    bound = Averaging(aggregator="norm-bound", **{"norm-bound": 2.0})
    reference = np.array([1.0, 1.0])
    out = bound.average_rows(rows[:2], None, [4, 5], reference=reference)
    assert np.allclose(out, reference + (np.array([-1.0, -1.0]) + np.array([0.0, -1.0])) / 2)
    [entry] = bound.entries
    assert entry["clipped"] == [] and entry["update-norms"] == [round(2**0.5, 6), 1.0] and entry["bound"] == 2.0


def test_averaging_rows_under_the_mean_is_the_weighted_mean_and_records_nothing():
    mean = Averaging()
    out = mean.average_rows(np.array([[0.0], [4.0]]), np.array([3.0, 1.0]), [0, 1])
    assert np.allclose(out, [1.0]) and mean.entries == []


def test_bounded_models_are_recorded_with_their_distance_the_bound_and_whether_they_were_clipped():
    reference = {"w": np.zeros(2)}
    over = Averaging(aggregator="norm-bound", **{"norm-bound": 1.0})
    out = over.bound_models({6: {"w": np.array([1 / 3, 1.0])}}, {6: reference})
    assert np.allclose(np.linalg.norm(out[6]["w"]), 1.0)
    distance = float(np.hypot(1 / 3, 1.0))
    assert over.entries == [
        {
            "group": "client 6",
            "rule": "norm-bound",
            "clients": [6],
            "clipped": [6],
            "update-norms": [round(distance, 6)],
            "bound": 1.0,
        }
    ]
    at = Averaging(aggregator="norm-bound", **{"norm-bound": 5.0})
    at.bound_models({2: {"w": np.array([3.0, 4.0])}, 3: {"w": np.array([0.3, 0.4])}}, {2: reference, 3: reference})
    assert [e["clipped"] for e in at.entries] == [[], []] and at.entries[1]["update-norms"] == [0.5]


def test_the_default_bound_of_forwarded_models_is_the_median_of_the_rounds_distances():
    reference = {"w": np.zeros(1)}
    median = Averaging(aggregator="norm-bound")
    models = {c: {"w": np.array([d])} for c, d in ((0, 1.0), (1, 2.0), (2, 50.0))}
    out = median.bound_models(models, dict.fromkeys(models, reference))
    assert [float(out[c]["w"][0]) for c in models] == [1.0, 2.0, 2.0]
    assert {e["bound"] for e in median.entries} == {2.0} and [e["clipped"] for e in median.entries] == [[], [], [2]]


def test_a_model_is_kept_unchanged_without_norm_bounding():
    keep = Averaging(aggregator="median")
    model = {"w": np.array([30.0, 40.0])}
    out = keep.bound_models({1: model}, {1: {"w": np.zeros(2)}})
    assert np.array_equal(out[1]["w"], model["w"]) and out[1]["w"] is not model["w"] and keep.entries == []


def test_under_an_attack_each_average_records_its_liars_and_whether_the_rule_assumes_that_many():
    """The run config says which clients attack: an average of ten with partitions 1, 4 and 8 lying is inside
    Multi-Krum's assumption at byzantine-share 0.3 (f = 3, n >= 2f + 3) and outside Bulyan's (f lowered to 1)."""
    rows = np.random.default_rng(0).normal(size=(10, 3))
    for rule, tolerated, outside in (("multi-krum", 3, False), ("bulyan", 1, True), ("median", 4, False)):
        averaging = Averaging(aggregator=rule, attack="sign-flip", **{"attack-share": 0.3})
        averaging.average_rows(rows, None, list(range(10)))
        [entry] = averaging.entries
        assert (entry["liars"], entry["tolerated"], entry["outside-assumption"]) == (3, tolerated, outside)
    late = Averaging(aggregator="median", attack="sign-flip", **{"attack-share": 0.3, "attack-start": 2})
    late.average_rows(rows, None, list(range(10)))
    assert late.entries[0]["liars"] == 0  # before attack-start every attacker is honest
    fixed = Averaging(aggregator="norm-bound", attack="sign-flip", **{"norm-bound": 1.0})
    fixed.average_rows(rows, None, list(range(10)), reference=np.zeros(3))
    assert "tolerated" not in fixed.entries[0] and fixed.entries[0]["liars"] == 3


def test_fedc2i_bounds_a_forwarded_model_by_the_distance_from_that_clients_previous_one():
    """FedC2I forwards each client's own model: under norm-bound the model it keeps is within the bound of what that
    client sent before (its previous stored model), so a client that moves steadily is never clipped back towards
    the initial model."""
    nodes = {31: 0, 32: 1, 33: 2}
    settings = {"method": "fedc2i", "model": "mlp", "min-nodes": 3, "aggregator": "norm-bound", "norm-bound": 5.0}
    strategy = build_as(FedC2IStrategy, parse_settings(settings))
    start = {k: v.copy() for k, v in strategy.initial_state.items()}
    step = {k: np.full_like(v, 4.0 / np.sqrt(sum(w.size for w in start.values()))) for k, v in start.items()}  # norm 4

    def steady(server_round, node, phase, content):  # each round 4 further from the initial model, in one direction
        if phase == "train":
            content["arrays"] = to_record({k: start[k] + server_round * step[k] for k in start})

    drive(strategy, nodes, 2, answer=steady)
    for client in nodes.values():
        kept = strategy.store[client]
        distance = np.sqrt(sum(float(np.sum((kept[k] - start[k]) ** 2)) for k in start))
        assert distance == pytest.approx(8.0, rel=1e-4)  # round 2's model as sent: 4 from round 1's, 8 from the start


def test_client2vec_bounds_each_average_by_the_distance_from_the_model_it_sent():
    """norm-bound clips a client's model by its distance from the model the server sent it: for Client2Vec's model
    and for its federated DSA-IGN.  Clients that send back exactly what they got are never clipped, however small
    the bound (a distance from anything else, e.g. zero, would clip every one)."""
    from task.params import state_to_numpy

    settings = {
        "method": "client2vec",
        "model": "mlp",
        "min-nodes": 3,
        "aggregator": "norm-bound",
        "norm-bound": 1e-6,
        "weight-cap": 0.0,
        "c2v-ign-mode": "federated",
        "c2v-ign-fraction": 1.0,
        "c2v-ign-epochs": 2,
    }
    strategy = build_as(Client2VecStrategy, parse_settings(settings))

    def unchanged(server_round, node, phase, content):
        if phase == "train":
            content["arrays"] = to_record(strategy.global_state)
        elif phase == "c2v_ign":
            content["arrays"] = to_record(state_to_numpy(strategy.ign.state_dict()))

    drive(strategy, {41: 0, 42: 1, 43: 2}, 2, answer=unchanged)
    entries = [e for r in strategy.history for e in r.extra.get("robust", [])]
    assert {e["group"] for e in entries} == {"global", "dsa-ign"}
    assert all(e["clipped"] == [] and max(e["update-norms"]) <= 1e-6 for e in entries), entries


@pytest.mark.parametrize("cap", [0.0, 1.0])
def test_fedcacs_global_average_under_a_rule_weighs_the_sizes_as_far_as_the_weight_cap_lets(cap):
    """fedcac-weighting='num-examples' weighs Eq. 9's global average by the clients' sizes; under a robust rule
    (here multi-krum keeping every client, so the rule is its weighted mean) the sizes still weigh it with
    weight-cap 0, and not at all with weight-cap 1 (a size is self-reported)."""
    from strategies.fedcac import FedCACStrategy

    nodes = {61: 0, 62: 1, 63: 2}
    shift, sizes = {0: 0.0, 1: 1.0, 2: 4.0}, {0: 10, 1: 10, 2: 80}
    settings = {
        "method": "fedcac",
        "model": "mlp",
        "min-nodes": 3,
        "fedcac-weighting": "num-examples",
        "aggregator": "multi-krum",
        "krum-select": 3,
        "weight-cap": cap,
    }
    strategy = build_as(FedCACStrategy, parse_settings(settings))
    start = {k: v.copy() for k, v in strategy.global_state.items()}

    def shifted(server_round, node, phase, content):
        if phase == "train":
            client = nodes[node]
            content["arrays"] = to_record({k: start[k] + np.float32(shift[client]) for k in content["arrays"]})
            content["metrics"]["num-examples"] = sizes[client]

    drive(strategy, nodes, [1], answer=shifted)
    weighted = sum(sizes[c] * shift[c] for c in shift) / sum(sizes.values()) if cap == 0 else 5 / 3
    key = strategy.param_keys[0]
    np.testing.assert_allclose(strategy.global_state[key], start[key] + weighted, atol=1e-4)


def test_fltrusts_root_set_is_drawn_from_the_clients_training_splits_and_never_from_what_they_are_scored_on():
    from strategies.robust import root_data
    from task.data import load_client_data

    settings = parse_settings({"method": "fedavg", "aggregator": "fltrust", "fltrust-root-size": 60})
    x, y = root_data(settings, 4)
    assert len(x) == len(y) == 60 and torch_equal(root_data(settings, 4)[0], x)  # drawn the same every time
    clients = [load_client_data(settings.data, p, 4) for p in range(4)]

    def rows(t):
        return {bytes(np.ascontiguousarray(r.numpy())) for r in t}

    trained = set().union(*(rows(c.x_train) for c in clients))
    scored = set().union(*(rows(c.x_val) | rows(c.x_test) for c in clients))
    root = rows(x)
    assert root <= trained and not root & scored


def test_an_operators_root_file_is_the_root_set_and_a_bad_one_is_refused_with_what_it_needs(tmp_path):
    from strategies.robust import root_data

    path = tmp_path / "root.npz"
    np.savez(path, x=np.zeros((5, 1, 8, 8), np.float32), y=np.arange(5))
    settings = parse_settings({"method": "fedavg", "aggregator": "fltrust", "fltrust-root": str(path)})
    x, y = root_data(settings, 4)
    assert tuple(x.shape) == (5, 1, 8, 8) and y.tolist() == [0, 1, 2, 3, 4]
    np.savez(path, x=np.zeros((5, 1, 8, 8), np.float32))
    with pytest.raises(ValueError, match=r"must be an \.npz file with arrays 'x' and 'y'"):
        root_data(settings, 4)


def test_fltrust_trusts_an_update_the_server_would_make_and_not_its_opposite():
    """The server trains the model it sent on its root set: a client whose update is that very update gets trust 1, a
    client sending its opposite gets none, and the average moves by the server's update."""
    from strategies.robust import RootUpdate

    settings = parse_settings({"method": "fedavg", "model": "mlp", "aggregator": "fltrust"})
    averaging = Averaging(method="fedavg", model="mlp", aggregator="fltrust")
    strategy = build_as(PersonalizedStrategy, settings)
    sent = {k: np.array(v) for k, v in strategy.global_state.items()}
    server = RootUpdate(settings).trained(sent, 4, 1)
    twin = {k: np.array(v) for k, v in server.items()}
    opposite = {k: (2 * sent[k] - server[k]) if np.issubdtype(sent[k].dtype, np.floating) else sent[k] for k in sent}
    averaging.client_of = {1: 0, 2: 1, 3: 2, 4: 3}  # the gate's binding, as the strategy's part sees it
    out = averaging.average_models([twin, opposite], [1, 1], [0, 1], reference=sent)
    [entry] = averaging.entries
    assert entry["trust"] == [1.0, 0.0]
    assert all(np.allclose(out[k], server[k], atol=1e-6) for k in sent if np.issubdtype(sent[k].dtype, np.floating))


def torch_equal(a, b) -> bool:
    return bool((a == b).all())
