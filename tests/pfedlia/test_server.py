"""What pFedLIA's server must do in central mode (pfedlia.md §2.4-§2.8): refuse a warm-up as long as the
run, then, through its own round loop against scripted clients (tests/pfedlia/server_kit.py), warm up with FedAvg,
collect the lazy models and the influence rows, cluster them with OPTICS as the options say, run FedAvg per cluster,
place late joiners, log the clustering round and check what each reply may say.  Peer-to-peer mode is in
test_p2p.py, the Oracle in test_oracle.py, the artefacts in test_artifacts.py and the run's summary in
test_summary.py."""

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from server_app.app import build_strategy
from strategies.pfedlia import PFedLIAStrategy
from task.config import parse_settings
from tests.pfedlia.server_kit import (
    CLIENTS,
    NODE,
    PLANTED,
    Federation,
    assert_holds,
    fedavg,
    influence,
    lazy_value,
    same_partition,
)
from tests.strategy_harness import (
    ReplayGrid,
    build_as,
    outgoing_messages,
    run_round,
    valid_content,
)


@pytest.mark.parametrize("rounds", [2, 3, 4, 7])
def test_a_warm_up_as_long_as_the_run_is_refused_with_a_suggestion_that_is_accepted(rounds):
    """docs/methods/pfedlia.md "Options": warmup-rounds >= num-server-rounds would never reach the clustering
    round; the error suggests a warm-up that is shorter than the run, and that suggestion is a valid setting."""
    import re

    from task.config import parse_settings
    from task.options import ConfigConflict

    parse_settings({"method": "pfedlia", "num-server-rounds": rounds, "warmup-rounds": rounds - 1})
    with pytest.raises(ConfigConflict, match=f"warmup-rounds={rounds} is not shorter") as err:
        parse_settings({"method": "pfedlia", "num-server-rounds": rounds, "warmup-rounds": rounds})
    (suggested,) = re.findall(r"e\.g\. warmup-rounds=(\S+)", str(err.value))
    parse_settings({"method": "pfedlia", "num-server-rounds": rounds, "warmup-rounds": int(suggested)})
    assert 1 <= int(suggested) < rounds and suggested == str(int(suggested))


def test_warm_up_is_fedavg_and_the_clustering_round_starts_from_its_model(central):
    """pfedlia.md §2.8: rounds 1..W are FedAvg of everybody's model; round W + 1 first asks every client for a lazy
    model trained from theta_0 = the warm-up result (query.lazy), not before."""
    theta0 = fedavg(CLIENTS, 1)
    assert {r for r, p, _, _ in central.sent if p == "lazy"} == {2}
    assert set(central.messages(2, "lazy")) == set(CLIENTS)
    for c in CLIENTS:
        for k, v in central.payload(1, "train", c).items():
            np.testing.assert_array_equal(v, central.strategy.initial_state[k])  # round 1: the common initial model
        assert_holds(central.payload(2, "lazy", c), theta0)
        assert_holds(central.payload(2, "train", c), theta0)  # every cluster model starts as theta_0
    assert_holds(central.strategy.theta0, theta0)


def test_every_client_scores_all_lazy_models_in_client_order_against_theta_0(central):
    """pfedlia.md §2.4 / §2.7: query.lia carries theta_0, the lazy models stacked in client-id order, their ids and the
    receiver's own index among them (the diagonal of the matrix)."""
    theta0 = fedavg(CLIENTS, 1)
    assert set(central.messages(2, "lia")) == set(CLIENTS)
    for c in CLIENTS:
        assert_holds(central.payload(2, "lia", c), theta0)
        for k, v in central.payload(2, "lia", c, "lazy").items():
            assert v.shape == (len(CLIENTS), *central.strategy.model_info.shapes[k])
            np.testing.assert_array_equal(
                v, np.stack([np.full(v.shape[1:], lazy_value(j), np.float32) for j in CLIENTS])
            )
        ids = central.messages(2, "lia")[c]["lazy-clients"]
        assert list(ids["client-ids"]) == CLIENTS and ids["self-index"] == CLIENTS.index(c)


def test_central_mode_clusters_the_influence_rows_and_runs_fedavg_per_cluster(central):
    """pfedlia.md §2.5 central (OPTICS on the rows) and §2.6: each cluster's model is the example-weighted mean of its
    members' updates; the next round sends every client its own cluster's model."""
    s = central.strategy
    np.testing.assert_allclose(s.matrix, [[influence(i, j) for j in CLIENTS] for i in CLIENTS])
    assert s.matrix_clients == CLIENTS == s.lazy_clients
    assert set(s.assignment) == set(CLIENTS) and same_partition(s.assignment, PLANTED)
    assert len(set(s.assignment.values())) == 2
    for c in CLIENTS:
        members = [m for m in CLIENTS if PLANTED[m] == PLANTED[c]]
        assert_holds(central.payload(3, "train", c), fedavg(members, 2))
    for label in set(s.assignment.values()):
        members = [m for m in CLIENTS if s.assignment[m] == label]
        assert_holds(s.cluster_models[label], fedavg(members, 3))
    assert not s.has_global_model
    models = s.server_models()
    assert set(models) == {f"cluster-{k}" for k in s.cluster_models}
    for k, m in s.cluster_models.items():
        assert models[f"cluster-{k}"] is m


def test_the_clustering_round_is_logged_with_its_cost_and_quality(central):
    """docs "Artefacts": the clustering round, mode, number of clusters, clients asked, bytes per client (lazy
    and lia phases, down and up) and the ARI against the planted groups."""
    s = central.strategy
    info = s.history[1].extra["clustering"]
    comm = s.history[1].extra["comm"]
    assert info["round"] == 2 and info["mode"] == "central" and info["clusters"] == 2
    assert info["clients-asked"] == len(CLIENTS) and info["ari"] == 1.0 and "p2p-exact-fraction" not in info
    assert info["bytes-down-per-client"] == (comm["lazy-bytes-down"] + comm["lia-bytes-down"]) / len(CLIENTS)
    assert info["bytes-up-per-client"] == (comm["lazy-bytes-up"] + comm["lia-bytes-up"]) / len(CLIENTS)
    assert comm["lazy-bytes-up"] > 0 and comm["lia-bytes-up"] > 0 and info["seconds"] >= 0
    assert "clustering" not in s.history[0].extra and "clustering" not in s.history[2].extra


def test_messages_say_whether_the_round_and_the_evaluated_model_are_clustered(central):
    """docs "Evaluation": `clustered` describes the round being trained; `evaluated-clustered` the round whose
    evaluation rides on the message (round W's model is from before the clustering)."""
    cfg = {r: central.messages(r, "train")[CLIENTS[0]]["config"] for r in (1, 2, 3)}
    assert [cfg[r]["clustered"] for r in (1, 2, 3)] == [False, True, True]
    assert "evaluated-clustered" not in cfg[1]
    assert cfg[2]["evaluated-clustered"] is False and cfg[3]["evaluated-clustered"] is True
    assert central.messages(2, "lia")[CLIENTS[0]]["config"]["clustered"] is False


def test_the_server_holds_the_global_model_only_during_the_warm_up():
    fed = Federation(rounds=2)
    s = fed.strategy
    assert s.has_global_model and set(s.server_models()) == {"global"}
    assert s.model_for(NODE[CLIENTS[0]]) is s.global_state


def test_a_cluster_without_a_trained_member_keeps_its_model():
    """pfedlia.md §2.6: clusters with no sampled (here: no replying) member keep their model."""
    group1 = [c for c in CLIENTS if PLANTED[c] == 1]
    fed = Federation(rounds=3, silent={(3, "train", c) for c in group1}).run()
    s = fed.strategy
    label1 = s.assignment[group1[0]]
    assert_holds(s.cluster_models[label1], fedavg(group1, 2))
    assert_holds(s.cluster_models[1 - label1], fedavg([c for c in CLIENTS if c not in group1], 3))


def test_clients_missing_from_the_clustering_round_join_the_cluster_their_row_favours():
    """pfedlia.md §2.8 late joiners: a client without a lazy model (column) or without a row is assigned when it next
    shows up, by its row over the stored lazy models (mean score per cluster); it then trains that cluster."""
    late_lazy, late_row = CLIENTS[2], CLIENTS[3]  # planted groups 0 and 1
    fed = Federation(rounds=3, silent={(2, "lazy", late_lazy), (2, "lia", late_row)}).run()
    s = fed.strategy
    lazy_ids = [c for c in CLIENTS if c != late_lazy]
    assert s.lazy_clients == lazy_ids
    assert s.matrix_clients == [c for c in lazy_ids if c != late_row]
    np.testing.assert_allclose(s.matrix, [[influence(i, j) for j in lazy_ids] for i in s.matrix_clients])
    assert s.history[1].extra["clustering"]["clients-asked"] == len(CLIENTS)
    assert set(fed.messages(2, "lia")) == set(lazy_ids)  # only clients whose lazy model arrived are asked
    # round 3: both latecomers are asked for a row over the stored lazy models (they are not among them / have no row)
    asked = fed.messages(3, "lia")
    assert set(asked) == {late_lazy, late_row}
    assert asked[late_lazy]["lazy-clients"]["self-index"] == -1
    assert asked[late_row]["lazy-clients"]["self-index"] == lazy_ids.index(late_row)
    for c in (late_lazy, late_row):
        for v in fed.payload(3, "lia", c, "lazy").values():
            np.testing.assert_array_equal(v.reshape(len(lazy_ids), -1)[:, 0], [lazy_value(j) for j in lazy_ids])
    assert same_partition(s.assignment, PLANTED) and set(s.assignment) == set(CLIENTS)
    for c in (late_lazy, late_row):
        members = [m for m in s.matrix_clients if PLANTED[m] == PLANTED[c]]
        assert_holds(fed.payload(3, "train", c), fedavg(members, 2))


def test_a_late_joiner_compares_clusters_by_its_scores_of_their_members_only():
    """pfedlia.md §2.8: the newcomer's row covers every stored lazy model, but the cluster means are taken over the
    columns of the clustered clients, matched by client id (a lazy model whose owner has no row is left out)."""
    late_lazy, late_row = CLIENTS[0], CLIENTS[1]
    fed = Federation(rounds=3, silent={(2, "lazy", late_lazy), (2, "lia", late_row)}).run()
    s = fed.strategy
    assert s.assignment[late_lazy] == s.assignment[CLIENTS[2]] and s.assignment[late_row] == s.assignment[CLIENTS[3]]


@pytest.mark.parametrize("rounds, half", [(2, 1), (4, 2), (7, 3), (10, 5)])
def test_the_suggested_warm_up_is_half_the_run(rounds, half):
    """The start-up error suggests half the run as warm-up (at least one round), so that as many rounds are left
    for the clustered phase as the warm-up takes."""
    from task.config import parse_settings
    from task.options import ConfigConflict

    with pytest.raises(ConfigConflict, match=f"e\\.g\\. warmup-rounds={half}$"):
        parse_settings({"method": "pfedlia", "num-server-rounds": rounds, "warmup-rounds": rounds})


def test_cluster_quality_is_left_out_without_planted_groups():
    fed = Federation(planted=False).run()
    info = fed.strategy.history[1].extra["clustering"]
    assert "ari" not in info and info["clusters"] == 2 and fed.strategy.planted == {}


@pytest.mark.parametrize("mode", ["central", "p2p"])
def test_a_client_without_a_cluster_or_set_trains_theta_0(mode):
    """Until a client has a cluster (central) or a set (p2p) - here a newcomer whose row never arrives - it is
    sent theta_0, the common starting point of every cluster, and it changes nobody's model."""
    late = 25
    fed = Federation(rounds=3, silent={(2, "lazy", late), (3, "lia", late)}, **{"lia-mode": mode}).run()
    s = fed.strategy
    assert late not in s.assignment and late not in s.sets
    assert_holds(fed.payload(3, "train", late), fedavg(CLIENTS, 1))
    assert fed.messages(3, "lia").keys() == {late}
    if mode == "central":
        for label, model in s.cluster_models.items():
            assert_holds(model, fedavg([c for c in CLIENTS if s.assignment.get(c) == label], 3))
    else:
        for c, members in s.sets.items():
            assert late not in members
            assert_holds(s.personal[c], fedavg(members, 3))


def _accepts(strategy, phase, client, content):
    return strategy.gate.check(2, NODE[client], content, phase, set()) is not None


def _metrics_reply(client, **metrics):
    return RecordDict({"metrics": MetricRecord({"partition-id": client, "num-examples": 5, **metrics})})


def test_a_lia_reply_is_a_finite_row_over_the_lazy_models_and_distinct_indices_into_them():
    """pfedlia.md §2.7: the row has one bounded score per lazy model, of either sign; p2p's beneficial
    peers are distinct indices into the lazy list (at most all of them); anything else is rejected."""
    from strategies.replies import VALUE_LIMIT

    s = Federation(**{"lia-mode": "p2p"}).strategy
    s.lazy_clients = [3, 8, 11, 20]
    ok_row = [-5.0, 0.5, 1e3, -1e3]
    good: list[dict[str, list[int]]] = [{"beneficial": []}, {"beneficial": [0, 3]}, {"beneficial": [0, 1, 2, 3]}]
    for extra in good:
        assert _accepts(s, "lia", 3, _metrics_reply(3, **{"lia-row": ok_row}, **extra)), extra
    assert _accepts(
        s, "lia", 3, _metrics_reply(3, **{"lia-row": [-VALUE_LIMIT, VALUE_LIMIT, 0.0, 0.0]}, beneficial=[1])
    )
    bad_rows = [
        ok_row[:3],
        [*ok_row, 1.0],
        [-2 * VALUE_LIMIT, 0.0, 0.0, 0.0],
        [2 * VALUE_LIMIT, 0.0, 0.0, 0.0],
        [float("nan"), 0.0, 0.0, 0.0],
    ]
    for row in bad_rows:
        assert not _accepts(s, "lia", 3, _metrics_reply(3, **{"lia-row": row}, beneficial=[0])), row
    assert not _accepts(s, "lia", 3, _metrics_reply(3, beneficial=[0]))
    assert not _accepts(s, "lia", 3, _metrics_reply(3, **{"lia-row": ok_row}))  # p2p: the set is required
    for peers in ([4], [-1], [1, 1], [0, 1, 2, 3, 0], [0.5]):
        assert not _accepts(s, "lia", 3, _metrics_reply(3, **{"lia-row": ok_row}, beneficial=peers)), peers
    s.lazy_clients = [3]  # a single lazy model: index 0 only
    assert _accepts(s, "lia", 3, _metrics_reply(3, **{"lia-row": [1.0]}, beneficial=[0]))
    assert not _accepts(s, "lia", 3, _metrics_reply(3, **{"lia-row": [1.0]}, beneficial=[1]))


def test_a_train_reply_may_name_its_planted_cluster_a_lazy_reply_carries_the_whole_model():
    s = Federation().strategy
    spec = s.reply_spec("train", NODE[3])
    base = valid_content(spec, 3, seed=5)
    metrics, arrays = base.metric_records["metrics"], base.array_records["arrays"]

    def with_planted(value):
        return RecordDict({"metrics": MetricRecord({**metrics, "planted-cluster": value}), "arrays": arrays})

    plain = RecordDict(
        {"metrics": MetricRecord({k: v for k, v in metrics.items() if k != "planted-cluster"}), "arrays": arrays}
    )
    assert _accepts(s, "train", 3, plain) and _accepts(s, "train", 3, with_planted(0))
    assert _accepts(s, "train", 3, with_planted(7))
    for bad in (-1, 1.5, 2**62):
        assert not _accepts(s, "train", 3, with_planted(bad)), bad
    lazy = valid_content(s.reply_spec("lazy", NODE[3]), 3, seed=6)
    assert set(lazy["arrays"].keys()) == set(s.initial_state) and _accepts(s, "lazy", 3, lazy)
    assert not _accepts(s, "lazy", 3, _metrics_reply(3))
    assert set(s.reply_spec("train", NODE[3]).metrics) > {"planted-cluster"}


def _by_sign_only(i, j):  # who helps whom is clear; the magnitudes differ by two orders between rows
    scale = {3: 1.0, 8: 80.0, 11: 0.5, 20: 120.0, 25: 2.0, 31: 40.0}[i]
    return scale * (1.0 if PLANTED[i] == PLANTED[j] else -1.0)


def _offset_rows(i, j):  # the same pattern on rows shifted by very different offsets
    return {3: 0.0, 8: 0.0, 11: 300.0, 20: 300.0, 25: 600.0, 31: 600.0}[i] + (5.0 if PLANTED[i] == PLANTED[j] else 0.0)


def _one_outlier(i, j):  # client 31 scores like nobody else: an OPTICS noise point
    if i == 31:
        return {3: 30.0, 8: -40.0, 11: 25.0, 20: 60.0, 25: -10.0, 31: 0.0}[j]
    return 6.0 if PLANTED[i] == PLANTED[j] else -6.0


@pytest.mark.parametrize(
    "option, influence_of, expected",
    [
        ({"lia-score": "sign"}, _by_sign_only, {c: PLANTED[c] for c in CLIENTS}),
        ({"lia-score": "raw"}, _by_sign_only, dict.fromkeys(CLIENTS, 0)),
        ({"lia-row-standardize": True}, _offset_rows, {c: PLANTED[c] for c in CLIENTS}),
        ({"lia-row-standardize": False}, _offset_rows, {3: 0, 8: 0, 11: 1, 20: 1, 25: 2, 31: 2}),
        ({"lia-noise": "singleton"}, _one_outlier, {**{c: PLANTED[c] for c in CLIENTS}, 31: 2}),
        ({"lia-noise": "nearest"}, _one_outlier, {**{c: PLANTED[c] for c in CLIENTS}, 31: 0}),
        ({"optics-min-samples": 5}, influence, dict.fromkeys(CLIENTS, 0)),
    ],
)
def test_the_clustering_options_reach_optics(option, influence_of, expected):
    """docs "Options": lia-score (raw rows or their signs), lia-row-standardize, lia-noise and optics-min-samples
    change the server's OPTICS clustering of the influence rows (pfedlia.md §2.5)."""
    s = Federation(rounds=2, influence=influence_of, **option).run().strategy
    assert same_partition(s.assignment, expected) and len(set(s.assignment.values())) == len(set(expected.values()))


def test_the_clustering_round_is_logged(caplog):
    """The server log names the clustering round, its mode, the number of clusters, the ARI and its duration."""
    import logging
    import re

    with caplog.at_level(logging.INFO, logger="flwr.pflower"):
        Federation(rounds=2).run()

    lines = [r.getMessage() for r in caplog.records if "clustering round" in r.getMessage()]
    assert len(lines) == 1 and re.fullmatch(
        r"\[pfedlia\] clustering round 2 \(central\): 2 clusters, ARI 1\.0, \d+\.\d s", lines[0]
    ), lines


def test_the_clustering_round_takes_the_time_it_is_logged_with():
    import time

    fed = Federation(rounds=2)
    start = time.monotonic()
    fed.run()
    seconds = fed.strategy.clustering["seconds"]
    assert 0 < seconds < time.monotonic() - start


@pytest.mark.parametrize("phase", ["lazy", "lia"])
def test_a_clustering_round_nobody_answers_moves_to_the_next_round(phase, caplog):
    """No lazy model (or, central, no influence row) in the clustering round: the run goes on as FedAvg and
    clusters in the next round, instead of failing on an empty stack; the log says so."""
    import logging

    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        fed = Federation(rounds=3, silent={(2, phase, c) for c in CLIENTS}).run()
    query = {"lazy": "the lazy-training query", "lia": "the influence query"}[phase]
    assert [r.getMessage() for r in caplog.records if "moves to the next round" in r.getMessage()] == [
        (
            f"[pfedlia] round 2: no client answered {query}; the clustering round moves to the next round "
            "(see failures.json)"
        )
    ]
    s = fed.strategy
    assert s.clustered and s.clustering["round"] == 3
    assert same_partition(s.assignment, PLANTED)
    assert "clustering" not in s.history[1].extra and s.history[2].extra["clustering"]["round"] == 3
    # round 2 stayed a warm-up round: the global model is the FedAvg of its train replies, and round 3 started
    # the lazy training from it
    assert_holds(fed.payload(3, "lazy", CLIENTS[0]), fedavg(CLIENTS, 2))


def test_bad_pfedlia_config():
    with pytest.raises(ValueError, match="lia-mode"):
        build_strategy(parse_settings({"method": "pfedlia", "lia-mode": "both"}))
    with pytest.raises(ValueError, match="warmup-rounds"):
        build_strategy(parse_settings({"method": "pfedlia", "warmup-rounds": 0}))


def test_theta_0_read_before_the_clustering_round_set_it_is_an_error_that_says_when_it_exists():
    """theta_0 (the warm-up's result) is set by the clustering round (or restored by a resume); reading it earlier
    must fail loudly instead of handing out a model that is not there, and say when it exists."""
    fed = Federation(rounds=2)  # warm-up-rounds 1: round 2 is the clustering round
    s = fed.strategy
    grid = ReplayGrid([NODE[c] for c in CLIENTS], fed.respond)
    with outgoing_messages():
        run_round(s, grid, 1)
        assert not s.clustered
        with pytest.raises(RuntimeError) as err:
            s.start_model()
        message = str(err.value)
        assert "theta_0" in message and "before the clustering round set it" in message  # what was wrong
        assert "first after the warm-up rounds" in message and "resume" in message  # when it is there
        run_round(s, grid, 2)
    assert s.clustered
    assert_holds(s.start_model(), fedavg(CLIENTS, 1))
    resumed = Federation(rounds=3).strategy
    resumed.checkpoint.resume(s.checkpoint.state(), 2)
    assert_holds(resumed.start_model(), fedavg(CLIENTS, 1))  # restored without a clustering round


def test_reading_theta_0_or_scoring_rows_too_early_is_a_clear_error():
    """theta_0 exists once the clustering round has started, the rows once lazy models were collected: a strategy
    asked for either before says which and when it exists, instead of sending a None model."""
    s = build_as(PFedLIAStrategy, parse_settings({"method": "pfedlia", "model": "mlp"}))
    with pytest.raises(RuntimeError) as theta0:
        s.start_model()
    assert str(theta0.value) == (
        "pFedLIA's theta_0 is read before the clustering round set it; it exists once the clustering round "
        "(the first after the warm-up rounds) has started or a resume has restored it"
    )
    with pytest.raises(RuntimeError) as rows:
        s._rows(ReplayGrid([], lambda m: []), 2, [])
    assert str(rows.value) == "pFedLIA scores influence rows before any lazy model was collected"
