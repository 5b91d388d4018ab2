"""What pFedLIA's client must do (pfedlia.md §2.4, §2.5, §2.8), with the data splits chosen by the test.

The lazy-influence row is Eq. 1 on the client's *validation* split: a client whose validation split holds
other digits than its training split must find the peer trained on its validation digits helpful.
"""

import re

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict, UserConfig

from server_app.app import build_strategy
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.params import record_to_numpy, to_record
from task.train import evaluate
from tests.client_kit import client, client_data, digits_of, numpy_state, trained_state

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]
STRICT_P2P: UserConfig = {"lia-mode": "p2p", "p2p-require-positive": True}


# ------------------------------------------------------------------------------------------ client handlers
@pytest.fixture(scope="module")
def lazy_models():
    """theta_0 (the common initial model) and two lazy models: one fitted to digits 0-4, one to 5-9."""
    c = client("pfedlia", client_data(LOW))
    theta0 = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    model = c.reset_model()
    low = trained_state(model, *digits_of(LOW, 30, 0))
    high = trained_state(model, *digits_of(HIGH, 30, 0))
    return theta0, low, high


def lia_content(theta0, lazies, self_index=None):
    stacked = {k: np.stack([numpy_state(s)[k] for s in lazies]) for k in theta0}
    content = RecordDict({"arrays": to_record(numpy_state(theta0)), "lazy": to_record(stacked)})
    if self_index is not None:
        ids = ConfigRecord({"node-ids": list(range(100, 100 + len(lazies))), "self-index": self_index})
        content["lazy-nodes"] = ids  # the record's name differs between versions: send both
        content["lazy-clients"] = ConfigRecord(dict(ids))
    return content


def loss_of(c, state, x, y):
    model = c.reset_model()
    model.load_state_dict(state)
    return evaluate(model, x, y)[0]


def test_influence_row_is_scored_on_the_validation_split(lazy_models):
    theta0, low, high = lazy_models
    data = client_data(LOW, val_classes=HIGH)  # trains on 0-4, validates on 5-9
    c = client("pfedlia", data, **{"lia-mode": "central"})
    row = np.array(c.query("lia", lia_content(theta0, [low, high], self_index=0))["metrics"]["lia-row"])
    assert row[1] > 0 > row[0]  # the 5-9 model helps this client's validation split; the 0-4 model does not
    n = len(data.y_val)
    expected = [
        n * (loss_of(c, theta0, data.x_val, data.y_val) - loss_of(c, s, data.x_val, data.y_val)) for s in (low, high)
    ]
    np.testing.assert_allclose(row, expected, rtol=1e-4)
    mean = client("pfedlia", data, **{"lia-reduction": "mean"}).query("lia", lia_content(theta0, [low, high], 0))
    np.testing.assert_allclose(mean["metrics"]["lia-row"], np.array(expected) / n, rtol=1e-4)


def test_influence_row_is_measured_from_the_warm_up_model_it_is_sent(lazy_models):
    _theta0, low, high = lazy_models
    data = client_data(LOW)
    c = client("pfedlia", data)
    row = np.array(c.query("lia", lia_content(low, [low, high], self_index=0))["metrics"]["lia-row"])
    assert row[0] == pytest.approx(0.0, abs=1e-4)  # theta_0 = the low model itself: no loss drop
    assert row[1] < 0


def test_an_empty_validation_split_is_a_clear_error(lazy_models):
    theta0, low, high = lazy_models
    data = client_data(LOW)
    data.x_val, data.y_val = data.x_val[:0], data.y_val[:0]
    with pytest.raises(ValueError, match="val-fraction"):
        client("pfedlia", data).query("lia", lia_content(theta0, [low, high], 0))


def test_p2p_client_reports_its_beneficial_peers_from_its_own_row(lazy_models):
    theta0, low, high = lazy_models
    lazies = [low, high, low, high]
    c = client("pfedlia", client_data(LOW), **{"lia-mode": "p2p"})
    metrics = c.query("lia", lia_content(theta0, lazies, self_index=0))["metrics"]
    assert list(metrics["beneficial"]) == [0, 2]
    # self at index 1 (a 5-9 model) with a 0-4 validation split: its own score does not put it in the top
    # group's company, but it is always a member
    metrics = c.query("lia", lia_content(theta0, lazies, self_index=1))["metrics"]
    assert list(metrics["beneficial"]) == [0, 1, 2]
    central = client("pfedlia", client_data(LOW), **{"lia-mode": "central"})
    assert "beneficial" not in central.query("lia", lia_content(theta0, lazies, 0))["metrics"]


def test_p2p_require_positive_is_read_from_the_run_config(lazy_models):
    theta0, low, _ = lazy_models
    # every lazy model equals theta_0 but one: scores [0, 0, 0, x>0]; self 0; top group {3}
    lazies = [theta0, theta0, theta0, low]
    for flag, expected in ((False, [0, 3]), (True, [0, 3])):
        cfg: UserConfig = {"lia-mode": "p2p", "p2p-require-positive": flag}
        c = client("pfedlia", client_data(LOW), **cfg)
        assert list(c.query("lia", lia_content(theta0, lazies, 0))["metrics"]["beneficial"]) == expected
    # a row whose top group is negative too: the plain 2-means keeps it, require-positive drops it
    high_val = client_data(LOW, val_classes=HIGH)
    c = client("pfedlia", high_val)
    slightly = trained_state(c.reset_model(), *digits_of(LOW, 30, 0), epochs=1, lr=0.02)
    lazies = [slightly, slightly, low, low]  # on a 5-9 validation split both hurt, the fitted one more
    plain = client("pfedlia", high_val, **{"lia-mode": "p2p"}).query("lia", lia_content(theta0, lazies, 3))
    row = plain["metrics"]["lia-row"]
    assert row[2] < row[0] < 0  # the case this test needs
    strict = client("pfedlia", high_val, **STRICT_P2P).query("lia", lia_content(theta0, lazies, 3))
    assert list(plain["metrics"]["beneficial"]) == [0, 1, 3]
    assert list(strict["metrics"]["beneficial"]) == [3]


def test_late_joiner_compares_against_every_stored_lazy_model(lazy_models):
    theta0, low, high = lazy_models
    c = client("pfedlia", client_data(LOW), **{"lia-mode": "p2p"})
    metrics = c.query("lia", lia_content(theta0, [high, low, high, low]))["metrics"]  # no self-index: newcomer
    assert list(metrics["beneficial"]) == [1, 3]
    assert len(metrics["lia-row"]) == 4


def test_a_late_joiner_keeps_only_positive_peers_under_require_positive(lazy_models):
    """p2p-require-positive holds for a newcomer's set too (pfedlia.md §2.5 2-means set, §2.8 late joiners):
    on a row where every stored lazy model hurts, the plain 2-means takes the least harmful, the strict set none."""
    theta0, low, _ = lazy_models
    high_val = client_data(LOW, val_classes=HIGH)
    slightly = trained_state(client("pfedlia", high_val).reset_model(), *digits_of(LOW, 30, 0), epochs=1, lr=0.02)
    lazies = [low, slightly, low, slightly]
    plain = client("pfedlia", high_val, **{"lia-mode": "p2p"}).query("lia", lia_content(theta0, lazies))["metrics"]
    assert max(plain["lia-row"]) < 0  # the case this test needs
    assert list(plain["beneficial"]) == [1, 3]
    strict = client("pfedlia", high_val, **STRICT_P2P).query("lia", lia_content(theta0, lazies))["metrics"]
    assert list(strict["beneficial"]) == []


def test_lazy_training_starts_from_the_sent_model_and_runs_lazy_epochs_on_the_training_split(lazy_models):
    theta0, low, _high = lazy_models
    data = client_data(HIGH)
    none = client("pfedlia", data, **{"lazy-epochs": 1, "lr": 0.0}).query(
        "lazy", RecordDict({"arrays": to_record(numpy_state(low))})
    )
    for k, v in record_to_numpy(none["arrays"]).items():
        np.testing.assert_array_equal(v, low[k].numpy())  # a step size of 0: the sent model itself
    c = client("pfedlia", data, **{"lazy-epochs": 4, "local-epochs": 0})
    lazy = {
        k: torch.from_numpy(v)
        for k, v in record_to_numpy(
            c.query("lazy", RecordDict({"arrays": to_record(numpy_state(theta0))}))["arrays"]
        ).items()
    }
    assert loss_of(c, lazy, data.x_train, data.y_train) < 0.7 * loss_of(c, theta0, data.x_train, data.y_train)
    with pytest.raises(ValueError, match="no-such-query"):
        c.query("no-such-query", RecordDict())


def test_the_client_also_answers_identify():
    """Every method's client answers query.identify (task.methods.all_queries) besides its own lazy / lia."""
    data = client_data(LOW)
    reply = client("pfedlia", data).query("identify", RecordDict())["metrics"]
    assert reply["partition-id"] == 0 and reply["num-examples"] == len(data.y_train)
    assert "planted-cluster" not in reply
    data.meta["planted-cluster"] = 2  # planted data: the Oracle baseline learns the group from identify
    reply = client("pfedlia", data).query("identify", RecordDict())["metrics"]
    assert reply["planted-cluster"] == 2 and reply["partition-id"] == 0 and reply["num-examples"] == len(data.y_train)


def test_train_trains_the_sent_model_and_reports_the_planted_cluster(lazy_models):
    theta0, _low, _high = lazy_models
    data = client_data(HIGH)
    data.meta["planted-cluster"] = 3
    c = client("pfedlia", data, **{"local-epochs": 3})
    reply = c.train(RecordDict({"arrays": to_record(numpy_state(theta0))}))
    metrics = reply["metrics"]
    trained = {k: torch.from_numpy(v) for k, v in record_to_numpy(reply["arrays"]).items()}
    assert metrics["num-examples"] == len(data.y_train) and metrics["planted-cluster"] == 3
    assert loss_of(c, trained, data.x_train, data.y_train) < loss_of(c, theta0, data.x_train, data.y_train)
    model = c.reset_model()
    model.load_state_dict(trained)
    assert metrics["trained-acc"] == pytest.approx(evaluate(model, data.x_test, data.y_test)[1])
    assert (
        "planted-cluster"
        not in client("pfedlia", client_data(HIGH)).train(RecordDict({"arrays": to_record(numpy_state(theta0))}))[
            "metrics"
        ]
    )


def test_evaluate_scores_the_sent_model_and_calls_it_global_only_during_warm_up(lazy_models):
    _theta0, low, _high = lazy_models
    data = client_data(LOW)
    c = client("pfedlia", data)
    model = c.reset_model()
    model.load_state_dict(low)
    loss, acc = evaluate(model, data.x_test, data.y_test)
    warm = c.evaluate(RecordDict({"arrays": to_record(numpy_state(low)), "config": ConfigRecord({"clustered": False})}))
    assert warm["metrics"]["personal-acc"] == pytest.approx(acc) and warm["metrics"]["global-acc"] == pytest.approx(acc)
    assert warm["metrics"]["personal-loss"] == pytest.approx(loss) and warm["metrics"]["global-loss"] == pytest.approx(
        loss
    )
    clustered = c.evaluate(
        RecordDict({"arrays": to_record(numpy_state(low)), "config": ConfigRecord({"clustered": True})})
    )
    assert clustered["metrics"]["personal-acc"] == pytest.approx(acc) and "global-acc" not in clustered["metrics"]
    assert "global-acc" not in c.evaluate(RecordDict({"arrays": to_record(numpy_state(low))}))["metrics"]


def test_a_train_message_evaluates_the_previous_round_and_calls_it_global_only_if_it_was_before_clustering(lazy_models):
    """docs/methods/pfedlia.md "Evaluation": a round evaluated inside the next round's train message is the model
    the client starts that round from; `evaluated-clustered` (not `clustered`, which describes the round being
    trained) says whether that model is from before the clustering, i.e. the one global model."""
    _theta0, low, _ = lazy_models
    data = client_data(LOW)
    c = client("pfedlia", data)
    model = c.reset_model()
    model.load_state_dict(low)
    loss, acc = evaluate(model, data.x_test, data.y_test)
    for before in (True, False):  # the round W + 1 message (clustered) carrying round W's evaluation, and later
        msg = RecordDict(
            {
                "arrays": to_record(numpy_state(low)),
                "config": ConfigRecord(
                    {
                        "server-round": 6,
                        "clustered": True,
                        "evaluate": True,
                        "evaluate-round": 5,
                        "evaluated-clustered": not before,
                    }
                ),
            }
        )
        c.begin(msg)
        ev = c.evaluation(msg)
        assert ev["personal-acc"] == pytest.approx(acc) and ev["personal-loss"] == pytest.approx(loss)
        assert ("global-acc" in ev) == before
        if before:
            assert ev["global-acc"] == pytest.approx(acc) and ev["global-loss"] == pytest.approx(loss)


def test_lazy_training_and_influence_scoring_are_reported_as_method_time(lazy_models):
    """docs/adding-a-method.md: method-specific client work is timed as `method` (time-method), not as local
    training, so the clustering round's cost shows up as pFedLIA's own."""
    theta0, low, high = lazy_models
    c = client("pfedlia", client_data(LOW), **{"lazy-epochs": 1})
    lazy = c.query("lazy", RecordDict({"arrays": to_record(numpy_state(theta0))}))["metrics"]
    assert {k for k in lazy if k.startswith("time-")} == {"time-method"} and lazy["time-method"] > 0
    c = client("pfedlia", client_data(LOW))
    row = c.query("lia", lia_content(theta0, [low, high], self_index=0))["metrics"]
    assert {k for k in row if k.startswith("time-")} == {"time-method"} and row["time-method"] > 0


def test_an_empty_validation_split_error_names_the_cause_and_the_fix(lazy_models):
    """docs "Options": pFedLIA needs val-fraction > 0; the client's error says exactly that (it reaches the user
    through the server's failure log)."""
    theta0, low, high = lazy_models
    data = client_data(LOW)
    data.x_val, data.y_val = data.x_val[:0], data.y_val[:0]
    with pytest.raises(
        ValueError, match=r"^pFedLIA scores on the validation split: set run-config 'val-fraction' > 0$"
    ):
        client("pfedlia", data).query("lia", lia_content(theta0, [low, high], 0))


def test_a_lazy_client_list_without_a_self_index_means_a_newcomer(lazy_models):
    """pfedlia.md §2.8: a client that is not among the lazy models (no self-index in `lazy-clients`) compares itself
    with every one of them, exactly as when the record is missing altogether."""
    theta0, low, high = lazy_models
    lazies = [low, high, high, low]  # were it lazy model 1 (or any listed one), it would count itself in
    c = client("pfedlia", client_data(LOW), **{"lia-mode": "p2p"})
    without = c.query("lia", lia_content(theta0, lazies))["metrics"]
    content = lia_content(theta0, lazies)
    content["lazy-clients"] = ConfigRecord({"client-ids": [100, 101, 102, 103]})
    listed = c.query("lia", content)["metrics"]
    assert list(listed["beneficial"]) == list(without["beneficial"]) == [0, 3]
    np.testing.assert_allclose(listed["lia-row"], without["lia-row"])


CFG = {
    "method": "pfedlia",
    "partition": "planted-clusters",
    "num-clusters": 2,
    "model": "mlp",
    "momentum": 0.0,
    "batch-size": 16,
    "val-fraction": 0.25,
    "lazy-epochs": 10,
    "lia-mode": "p2p",
}


def planted_client(pid, n=4, **extra):
    cfg = {**CFG, **extra}
    ctx = Context(
        run_id=1,
        node_id=100 + pid,
        node_config={"partition-id": pid, "num-partitions": n},
        state=RecordDict(),
        run_config=cfg,
    )
    return load_object(METHODS["pfedlia"].client)(ctx, parse_settings(cfg))


def test_influence_row_sign_same_labels_positive_disjoint_labels_negative():
    # planted clusters of 2: clients 0, 2 hold digits 0-4; clients 1, 3 hold digits 5-9
    theta0 = build_strategy(parse_settings(CFG)).global_state
    lazy = {}
    for pid in range(4):
        reply = planted_client(pid).query("lazy", RecordDict({"arrays": to_record(theta0)}))
        lazy[pid] = record_to_numpy(reply["arrays"])
    stacked = {k: np.stack([lazy[p][k] for p in range(4)]) for k in theta0}
    content = RecordDict(
        {
            "arrays": to_record(theta0),
            "lazy": to_record(stacked),
            "lazy-nodes": ConfigRecord({"node-ids": [100, 101, 102, 103], "self-index": 0}),
        }
    )
    reply = planted_client(0).query("lia", content)
    row = np.array(reply["metrics"]["lia-row"])
    assert row[2] > 0 and row[0] > 0  # a peer trained on my labels (and I myself) help
    assert row[1] < 0 and row[3] < 0  # disjoint-label peers hurt
    assert list(reply["metrics"]["beneficial"]) == [0, 2]


@pytest.mark.parametrize("bad", [1.5, "0", [0], True])
def test_an_influence_query_whose_self_index_is_not_an_integer_is_refused_naming_the_key(lazy_models, bad):
    """The server names the receiver's own lazy model by an integer index (-1: none); anything else is a malformed
    message, refused with the key and what arrived instead of being truncated into someone else's index."""
    theta0, low, high = lazy_models
    c = client("pfedlia", client_data(LOW), **{"lia-mode": "p2p"})
    c.query("lia", lia_content(theta0, [low, high], 0))  # the well-formed message is answered
    allowed = "'lazy-clients' needs an integer 'self-index'"
    with pytest.raises(ValueError, match=re.escape(allowed)) as err:
        c.query("lia", lia_content(theta0, [low, high], bad))
    assert repr(bad) in str(err.value)  # what arrived


@pytest.mark.parametrize("self_index", [0, None])  # a member of the lazy list, and a newcomer
def test_p2p_peers_are_those_of_the_clients_own_seed(lazy_models, monkeypatch, self_index):
    """2-means may split a row differently from different initialisations (about one random row in twenty): a
    client's beneficial peers are those its own seed gives, so that a run repeated with the same seed forms the same
    sets, and another seed may not."""
    import client_app.pfedlia as module
    from client_app.pfedlia_math import beneficial_peers

    theta0, low, high = lazy_models
    seeded: UserConfig = {"lia-mode": "p2p", "seed": 3}
    c = client("pfedlia", client_data(LOW), **seeded)

    def peers(row, seed):
        if self_index is not None:
            return list(beneficial_peers(row, self_index, seed=seed))
        return list(beneficial_peers(np.append(row, -np.inf), len(row), seed=seed)[:-1])

    rng = np.random.default_rng(0)
    for _ in range(2000):  # a row whose split by the client's seed is not that of seed 0 and is given by few seeds
        row = rng.normal(size=12)
        own = peers(row, c.seed)
        if own != peers(row, 0) and sum(peers(row, s) == own for s in range(1, 11)) <= 3:
            break
    else:
        pytest.fail("no row of 2,000 is split differently by different seeds: this test needs another search")
    monkeypatch.setattr(module, "lazy_influence_row", lambda *args: row)
    for _ in range(3):
        metrics = c.query("lia", lia_content(theta0, [low, high, low, high], self_index))["metrics"]
        assert list(metrics["beneficial"]) == own
