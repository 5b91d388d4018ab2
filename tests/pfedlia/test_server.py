"""What pFedLIA's server must do (pfedlia.md §2.5, §2.6, §2.8): refuse a warm-up as long as the run, then, through
its own round loop against scripted clients, warm up with FedAvg, collect the lazy models and the influence rows,
cluster them (central) or group the beneficial sets (peer-to-peer), run FedAvg per cluster and place late joiners."""

import json
from typing import Any

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from server_app.app import build_strategy
from strategies.persistence import checkpoint_state, resume
from strategies.pfedlia import PFedLIAStrategy
from strategies.pfedlia_artifacts import write_artifacts
from strategies.replies import Numbers
from task.config import parse_settings
from task.params import record_to_numpy, to_record
from tests.strategy_harness import (
    ReplayGrid,
    build_as,
    outgoing_messages,
    phase_of,
    reply_message,
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


# ------------------------------------------------------------------------------------------ the strategy
# A scripted federation: the server's round loop (tests/strategy_harness.py) against clients whose replies the test
# chooses, so every model the strategy should hold or send is known in closed form.  Client ids are not 0..N-1 and
# node ids differ from them, so an index into the lazy list, a client id and a node id cannot be confused.


CLIENTS = [3, 8, 11, 20, 25, 31]
PLANTED = {3: 0, 8: 1, 11: 0, 20: 1, 25: 0, 31: 1}  # two planted groups of three
EXAMPLES = {3: 2, 8: 3, 11: 5, 20: 7, 25: 11, 31: 13}
NODE = {c: 9000 - 17 * i for i, c in enumerate(CLIENTS)}  # node ids in the opposite order of the client ids


def trained_value(rnd, c):
    """Every array of client c's round-rnd train reply holds this one number."""
    return float(100 * rnd + c)


def lazy_value(c):
    return float(1000 + c)


def influence(i, j):
    """I(i, j): positive within a planted group, negative across (a little client-specific spread)."""
    return (6.0 if PLANTED[i] == PLANTED[j] else -6.0) + 0.01 * ((i * 7 + j) % 5)


class Federation:
    """Runs the strategy over scripted clients; records every message sent (round, phase, client, content)."""

    def __init__(
        self,
        method="pfedlia",
        rounds=3,
        silent=(),
        beneficial=None,
        planted=True,
        influence=influence,
        clients=CLIENTS,
        identify_planted=False,
        **cfg,
    ):
        self.strategy = build_as(
            PFedLIAStrategy,
            parse_settings(
                {
                    "dataset": "digits",
                    "model": "mlp",
                    "min-nodes": 1,
                    "num-server-rounds": rounds,
                    "local-epochs": 1,
                    "method": method,
                    "warmup-rounds": 1,
                    "optics-min-samples": 2,
                    **({"partition": "planted-clusters"} if method == "oracle" else {}),
                    **cfg,
                }
            ),
        )
        self.silent = set(silent)  # (round, phase, client) that send nothing
        self.beneficial = beneficial or (
            lambda i, lazy_ids: [k for k, j in enumerate(lazy_ids) if PLANTED[j] == PLANTED[i] and j != i]
        )
        self.planted = planted
        self.identify_planted = identify_planted  # identify replies carry the planted group (as the client's do)
        self.influence = influence
        self.sent = []
        self.present = {r: list(clients) for r in range(1, rounds + 1)}

    def respond(self, msg):
        client = {n: c for c, n in NODE.items()}[msg.metadata.dst_node_id]
        phase, rnd = phase_of(msg), int(msg.content["config"]["server-round"])
        self.sent.append((rnd, phase, client, msg.content))
        if (rnd, phase, client) in self.silent:
            return []
        content = valid_content(
            self.strategy.reply_spec(phase, msg.metadata.dst_node_id), client, seed=rnd * 100 + client
        )
        metrics: dict[str, Any] = dict(content.metric_records["metrics"])
        metrics["num-examples"] = EXAMPLES[client]
        metrics.pop("planted-cluster", None)
        if phase == "identify" and self.identify_planted:
            metrics["planted-cluster"] = PLANTED[client]
        if phase == "train":
            if self.planted:
                metrics["planted-cluster"] = PLANTED[client]
            content["arrays"] = to_record(
                {
                    k: np.full_like(v, trained_value(rnd, client))
                    for k, v in record_to_numpy(content.array_records["arrays"]).items()
                }
            )
        elif phase == "lazy":
            content["arrays"] = to_record(
                {
                    k: np.full_like(v, lazy_value(client))
                    for k, v in record_to_numpy(content.array_records["arrays"]).items()
                }
            )
        elif phase == "lia":
            lazy_ids = list(msg.content["lazy-clients"]["client-ids"])
            metrics["lia-row"] = [self.influence(client, j) for j in lazy_ids]
            if "beneficial" in metrics:
                metrics["beneficial"] = list(self.beneficial(client, lazy_ids))
        content["metrics"] = MetricRecord(metrics)
        return [reply_message(msg.metadata.dst_node_id, content)]

    def run(self):
        s = self.strategy
        with outgoing_messages():
            for r in range(1, s.settings.num_rounds + 1):
                grid = ReplayGrid([NODE[c] for c in self.present[r]], self.respond)
                run_round(s, grid, r)
        return self

    def messages(self, rnd, phase):
        return {c: content for r, p, c, content in self.sent if r == rnd and p == phase}

    def payload(self, rnd, phase, client, record="arrays"):
        return record_to_numpy(self.messages(rnd, phase)[client][record])


def fedavg(clients, rnd):
    """FedAvg of the scripted train replies: sum n_j v_j / sum n_j (pfedlia.md §2.6)."""
    n = np.array([EXAMPLES[c] for c in clients], float)
    return float(n @ [trained_value(rnd, c) for c in clients] / n.sum())


def assert_holds(state, value):
    for k, v in state.items():
        np.testing.assert_allclose(v, np.full(v.shape, value, np.float32), rtol=1e-6, err_msg=k)


def same_partition(labels: dict, groups: dict) -> bool:
    return all((labels[a] == labels[b]) == (groups[a] == groups[b]) for a in labels for b in labels)


@pytest.fixture  # per test, not per module: mutmut maps the code a fixture runs to the test that first uses it
def central():
    return Federation().run()


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


# peer-to-peer: client 3 finds only client 11 beneficial (not its whole planted group), everyone else its group
def _p2p_beneficial(i, lazy_ids):
    if i == 3:
        return [lazy_ids.index(11)]
    return [k for k, j in enumerate(lazy_ids) if PLANTED[j] == PLANTED[i] and j != i]


P2P_SETS = {c: sorted({c} | {j for j in CLIENTS if PLANTED[j] == PLANTED[c]}) for c in CLIENTS}
P2P_SETS[3] = [3, 11]


@pytest.fixture  # per test (see central)
def p2p():
    return Federation(**{"lia-mode": "p2p"}, beneficial=_p2p_beneficial).run()


def test_p2p_sets_are_the_clients_beneficial_peers_by_client_id_plus_itself(p2p):
    """pfedlia.md §2.5 peer-to-peer: S_i = the peers client i reports (indices into the lazy list, mapped to client ids)
    plus i itself; identical sets share one group label (pfedlia.md §2.6)."""
    s = p2p.strategy
    assert s.sets == P2P_SETS
    groups: dict[tuple[int, ...], int] = {}
    for c in CLIENTS:
        groups.setdefault(tuple(P2P_SETS[c]), len(groups))
    assert same_partition(s.assignment, {c: groups[tuple(P2P_SETS[c])] for c in CLIENTS})
    assert len(set(s.assignment.values())) == 3 and s.matrix_clients == CLIENTS


def test_p2p_personal_model_is_fedavg_over_the_trained_members_of_its_set(p2p):
    """pfedlia.md §2.6 p2p: theta_i <- sum_{j in S_i cap P_t} n_j theta_j / sum n_j; the next round sends client i its
    own."""
    s = p2p.strategy
    theta0 = fedavg(CLIENTS, 1)
    for c in CLIENTS:
        assert_holds(p2p.payload(2, "train", c), theta0)
        assert_holds(p2p.payload(3, "train", c), fedavg(P2P_SETS[c], 2))
        assert_holds(s.personal[c], fedavg(P2P_SETS[c], 3))
    assert s.server_models() == {} and not s.has_global_model


def test_p2p_clustering_reports_how_many_sets_equal_the_planted_groups(p2p):
    info = p2p.strategy.history[1].extra["clustering"]
    assert info["mode"] == "p2p" and info["clusters"] == 3 and info["ari"] < 1.0
    assert info["p2p-exact-fraction"] == pytest.approx(5 / 6)  # all but client 3


def test_p2p_lia_replies_may_carry_only_indices_of_lazy_models():
    fed = Federation(**{"lia-mode": "p2p"})
    s = fed.strategy
    s.lazy_clients = CLIENTS[:4]
    rule = s.reply_spec("lia", NODE[CLIENTS[0]]).metrics
    row, peers = rule["lia-row"], rule["beneficial"]
    assert isinstance(row, Numbers) and isinstance(peers, Numbers)  # both are lists
    assert row.length == 4
    assert peers.maximum == 3 and peers.max_length == 4 and peers.distinct
    assert "beneficial" not in Federation().strategy.reply_spec("lia", NODE[CLIENTS[0]]).metrics


def test_p2p_personal_model_of_a_client_whose_set_did_not_train_stays():
    """pfedlia.md §2.6: a client with S_i cap P_t empty keeps its personal model."""
    fed = Federation(
        **{"lia-mode": "p2p"}, beneficial=_p2p_beneficial, silent={(3, "train", 3), (3, "train", 11)}
    ).run()
    s = fed.strategy
    assert_holds(s.personal[3], fedavg([3, 11], 2))
    assert_holds(s.personal[25], fedavg([25], 3))  # its set {3, 11, 25}: only 25 trained


def test_p2p_late_joiner_gets_its_own_set_and_theta_0():
    """pfedlia.md §2.8 p2p: a newcomer's set is its own 2-means set over the stored lazy models (plus itself); it starts
    from theta_0 and then averages over its set like everyone."""
    late = 20
    fed = Federation(**{"lia-mode": "p2p"}, silent={(2, "lazy", late)}).run()
    s = fed.strategy
    lazy_ids = [c for c in CLIENTS if c != late]
    assert s.lazy_clients == lazy_ids and late not in s.matrix_clients
    assert fed.messages(3, "lia")[late]["lazy-clients"]["self-index"] == -1
    assert s.sets[late] == sorted({late} | {j for j in lazy_ids if PLANTED[j] == PLANTED[late]})
    assert_holds(fed.payload(3, "train", late), fedavg(CLIENTS, 1))  # theta_0 in the round it joins
    assert_holds(s.personal[late], fedavg(s.sets[late], 3))
    assert s.assignment[late] not in {s.assignment[c] for c in lazy_ids}


def test_oracle_clusters_by_the_planted_groups_without_any_lazy_round():
    """Oracle baseline (docs "Oracle and CFL"): the same warm-up and per-cluster FedAvg, clusters = the planted
    groups the clients report; no query.lazy / query.lia is sent."""
    late = 31
    fed = Federation(method="oracle", silent={(1, "train", late)}).run()
    s = fed.strategy
    assert not [p for _, p, _, _ in fed.sent if p in ("lazy", "lia")]
    assert s.assignment == PLANTED  # the client missing in the warm-up joins its group when it reports it
    for g in (0, 1):
        members = [c for c in CLIENTS if PLANTED[c] == g]
        assert_holds(s.cluster_models[g], fedavg(members, 3))
        for c in members:  # round 2 already averaged the latecomer in
            assert_holds(fed.payload(3, "train", c), fedavg(members, 2))
    info = s.history[1].extra["clustering"]
    assert info["mode"] == "oracle" and info["clusters"] == 2 and info["ari"] == 1.0 and "clients-asked" not in info


def test_oracle_asks_a_client_that_has_not_trained_for_its_group_and_sends_it_its_clusters_model():
    """Oracle (the upper bound of clustering): every connected client is in its planted group from the clustering
    round on, also one that has not trained yet (with client sampling, many have not): the server asks it
    (query.identify) and sends it its group's model, never theta_0 again."""
    late = 31
    fed = Federation(method="oracle", identify_planted=True, silent={(1, "train", late), (2, "train", late)}).run()
    s = fed.strategy
    assert [(r, c) for r, p, c, _ in fed.sent if p == "identify"] == [(2, late)]
    assert s.assignment == PLANTED
    members = [c for c in CLIENTS if PLANTED[c] == PLANTED[late] and c != late]
    assert_holds(fed.payload(3, "train", late), fedavg(members, 2))


def test_oracle_node_connecting_after_the_clustering_round_founds_its_group_if_nobody_else_is_in_it():
    """A node that connects after the clustering round is asked for its group before it trains; when nobody is in
    that group yet, the group's model starts from theta_0 and is then its FedAvg like every other cluster model."""
    late, first = 31, [3, 11, 25]  # 31 is the only client of planted group 1 here
    fed = Federation(method="oracle", clients=[*first, late], identify_planted=True)
    fed.present = {1: first, 2: first, 3: [*first, late]}
    fed.run()
    s = fed.strategy
    assert [(r, c) for r, p, c, _ in fed.sent if p == "identify"] == [(3, late)]
    assert s.assignment == {c: PLANTED[c] for c in [*first, late]}
    assert_holds(fed.payload(3, "train", late), fedavg(first, 1))  # theta_0
    models = s.server_models()
    assert sorted(models) == ["cluster-0", "cluster-1"]
    assert_holds(models["cluster-1"], fedavg([late], 3))
    assert_holds(models["cluster-0"], fedavg(first, 3))


def test_oracle_client_that_does_not_say_its_group_when_asked_joins_it_with_its_first_train_reply():
    """A node that connects late and does not answer the identify query with its group is sent theta_0; its train
    reply says its group, which it joins (here founds) at once: its update is that group's model."""
    late, first = 31, [3, 11, 25]
    fed = Federation(method="oracle", clients=[*first, late])
    fed.present = {1: first, 2: first, 3: [*first, late]}
    fed.run()
    s = fed.strategy
    assert s.assignment == {c: PLANTED[c] for c in [*first, late]}
    models = s.server_models()
    assert sorted(models) == ["cluster-0", "cluster-1"]
    assert_holds(models["cluster-1"], fedavg([late], 3))


def test_oracle_learns_every_group_from_the_identify_replies_of_a_sampled_run():
    """With client sampling the server asks every node who it is in round 1; the Oracle takes the planted groups
    from those replies, so clients never drawn in the warm-up are in their group at the clustering round
    without another query."""
    fed = Federation(method="oracle", rounds=2, identify_planted=True, **{"fraction-train": 0.34}).run()
    s = fed.strategy
    warmup = {c for r, p, c, _ in fed.sent if p == "train" and r == 1}
    assert len(warmup) == 2 and {r for r, p, _, _ in fed.sent if p == "identify"} == {1}
    assert s.assignment == PLANTED and s.planted == PLANTED


def test_oracle_without_planted_groups_is_refused():
    fed = Federation(method="oracle", planted=False)
    with pytest.raises(ValueError, match="needs planted clusters"):
        fed.run()


def test_cluster_quality_is_left_out_without_planted_groups():
    fed = Federation(planted=False).run()
    info = fed.strategy.history[1].extra["clustering"]
    assert "ari" not in info and info["clusters"] == 2 and fed.strategy.planted == {}


def _figure_of(strategy, folder, monkeypatch):
    """write_artifacts with plt.close kept from closing the figure, which is returned for inspection."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    write_artifacts(strategy, folder)
    return kept[-1] if kept else None


def test_artifacts_hold_the_clustering_and_the_influence_matrix_in_cluster_order(central, tmp_path, monkeypatch):
    """docs "Artefacts": pfedlia_clusters.json (clustering, assignment, planted groups), pfedlia_influence.json
    (rows = scoring clients, columns = lazy models) and a heatmap of the matrix ordered by cluster."""
    s = central.strategy
    fig = _figure_of(s, tmp_path, monkeypatch)
    clusters = json.loads((tmp_path / "pfedlia_clusters.json").read_text())
    assert clusters["clustering"] == json.loads(json.dumps(s.clustering))
    assert clusters["assignment"] == {str(c): s.assignment[c] for c in CLIENTS}
    assert clusters["planted"] == {str(c): PLANTED[c] for c in CLIENTS} and "beneficial-sets" not in clusters
    infl = json.loads((tmp_path / "pfedlia_influence.json").read_text())
    assert infl["rows (scoring client)"] == CLIENTS and infl["columns (lazy model of client)"] == CLIENTS
    np.testing.assert_allclose(infl["matrix"], s.matrix)
    from PIL import Image

    with Image.open(tmp_path / "pfedlia_influence.png") as img:
        assert img.size == (600, 500)
    ax = fig.axes[0]
    order = sorted(CLIENTS, key=lambda c: (s.assignment[c], c))
    shown = np.asarray(ax.images[0].get_array())
    np.testing.assert_allclose(shown, [[influence(i, j) for j in order] for i in order])
    lim = np.abs(s.matrix).max()
    assert ax.images[0].get_clim() == (-lim, lim) and ax.images[0].get_cmap().name == "RdBu"
    # one horizontal and one vertical line between the two clusters
    boundary = sum(1 for c in CLIENTS if s.assignment[c] == s.assignment[order[0]]) - 0.5
    lines = [(tuple(ln.get_xdata()), tuple(ln.get_ydata())) for ln in ax.lines]
    assert sorted(lines) == sorted([((0, 1), (boundary, boundary)), ((boundary, boundary), (0, 1))])
    assert all(ln.get_color() == "k" and ln.get_linewidth() == 0.6 for ln in ax.lines)
    assert "ARI 1.0" in ax.get_title() and ax.get_title().startswith("lazy influence (rows: scoring client)")
    assert ax.get_xlabel() == "lazy model of client" and ax.get_ylabel() == "client"
    assert len(fig.axes) == 2  # the colour bar


def test_p2p_artifacts_list_the_beneficial_sets(p2p, tmp_path, monkeypatch):
    _figure_of(p2p.strategy, tmp_path, monkeypatch)
    clusters = json.loads((tmp_path / "pfedlia_clusters.json").read_text())
    assert clusters["beneficial-sets"] == {str(c): P2P_SETS[c] for c in CLIENTS}


def test_p2p_late_joiner_is_listed_with_minus_one_after_the_sets_of_the_clustering_round(tmp_path, monkeypatch):
    """docs "Artefacts": in p2p the assignment numbers the distinct sets of the clustering round 0, 1, ...; a late
    joiner, whose set is formed after them, is listed with -1."""
    late = 20
    fed = Federation(**{"lia-mode": "p2p"}, silent={(2, "lazy", late)}).run()
    _figure_of(fed.strategy, tmp_path, monkeypatch)
    assignment = json.loads((tmp_path / "pfedlia_clusters.json").read_text())["assignment"]
    assert assignment[str(late)] == -1
    others = {assignment[str(c)] for c in CLIENTS if c != late}
    assert others == set(range(len(others)))
    assert (
        json.loads((tmp_path / "pfedlia_clusters.json").read_text())["beneficial-sets"][str(late)]
        == fed.strategy.sets[late]
    )


def test_heatmap_colours_are_symmetric_around_zero_when_the_largest_magnitude_is_negative(tmp_path, monkeypatch):
    """The influence heatmap's diverging colour scale is centred on 0: [-L, L] with L the largest |I|, also when
    that largest value is a negative one (here every cross-group score is -9, the within-group ones 2)."""
    fed = Federation(influence=lambda i, j: 2.0 if PLANTED[i] == PLANTED[j] else -9.0).run()
    ax = _figure_of(fed.strategy, tmp_path, monkeypatch).axes[0]
    assert ax.images[0].get_clim() == (-9.0, 9.0)


def test_heatmap_of_an_all_zero_matrix_still_has_a_colour_scale(tmp_path, monkeypatch):
    """Nobody helps or hurts anybody: the matrix is all zeros and the scale falls back to [-1, 1] (not [0, 0])."""
    fed = Federation(influence=lambda i, j: 0.0, **{"optics-min-samples": 2}).run()
    ax = _figure_of(fed.strategy, tmp_path, monkeypatch).axes[0]
    assert ax.images[0].get_clim() == (-1.0, 1.0)


def test_heatmap_separates_a_cluster_of_one_first_row_and_says_ari_n_a_without_planted_groups(tmp_path, monkeypatch):
    """The heatmap draws a line between every two neighbouring rows of different clusters, also after the first row
    (here client 3, whose beneficial set is itself alone, is cluster 0 on its own); without planted groups the
    title says the ARI is not available."""

    def beneficial(i, lazy_ids):
        if i == 3:
            return []
        return [k for k, j in enumerate(lazy_ids) if PLANTED[j] == PLANTED[i] and j not in (i, 3)]

    fed = Federation(**{"lia-mode": "p2p"}, beneficial=beneficial, planted=False).run()
    s = fed.strategy
    assert s.assignment[3] == 0 and sorted(s.assignment.values()).count(0) == 1
    ax = _figure_of(s, tmp_path, monkeypatch).axes[0]
    horizontal = sorted(ln.get_ydata()[0] for ln in ax.lines if tuple(ln.get_xdata()) == (0, 1))
    order = sorted(CLIENTS, key=lambda c: (s.assignment[c], c))
    labels = [s.assignment[c] for c in order]
    assert horizontal == [k - 0.5 for k in range(1, len(labels)) if labels[k] != labels[k - 1]]
    assert horizontal[0] == 0.5
    assert ax.get_title().endswith("; ARI n/a")


def test_heatmap_of_two_clients_has_whole_number_ticks_and_a_colour_bar_of_its_image(tmp_path, monkeypatch):
    """Rows and columns are clients: both axes tick at whole numbers only (matplotlib would put half-way ticks on a
    2 x 2 heatmap); the colour bar belongs to the heatmap's image."""
    fed = Federation(clients=[3, 8]).run()
    fig = _figure_of(fed.strategy, tmp_path, monkeypatch)
    ax = fig.axes[0]
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, sorted(ax.get_ylim()))):
        inside = [t for t in axis.get_ticklocs() if lo <= t <= hi]
        assert inside and all(float(t).is_integer() for t in inside), inside
    assert ax.images[0].colorbar is not None and ax.images[0].colorbar.ax is fig.axes[1]


def test_a_run_that_never_clustered_writes_an_empty_clustering_and_no_matrix(tmp_path, monkeypatch):
    """Nobody answered the lazy query in the last round, so the clustering never happened: pfedlia_clusters.json
    says so (empty clustering and assignment, the planted groups as reported) and there is no influence matrix."""
    fed = Federation(rounds=2, silent={(2, "lazy", c) for c in CLIENTS}).run()
    assert _figure_of(fed.strategy, tmp_path, monkeypatch) is None
    clusters = json.loads((tmp_path / "pfedlia_clusters.json").read_text())
    assert clusters == {"clustering": {}, "assignment": {}, "planted": {str(c): PLANTED[c] for c in CLIENTS}}
    assert not (tmp_path / "pfedlia_influence.json").exists() and not (tmp_path / "pfedlia_influence.png").exists()


def test_oracle_artifacts_have_no_influence_matrix(tmp_path, monkeypatch):
    fed = Federation(method="oracle").run()
    assert _figure_of(fed.strategy, tmp_path, monkeypatch) is None
    assert (tmp_path / "pfedlia_clusters.json").exists() and not (tmp_path / "pfedlia_influence.json").exists()
    assert not (tmp_path / "pfedlia_influence.png").exists()


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
    """pfedlia.md §2.7 (issue 14 §2): the row has one bounded score per lazy model, of either sign; p2p's beneficial
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


def test_a_single_client_is_its_own_cluster_and_its_bytes_are_per_client(tmp_path, monkeypatch):
    fed = Federation(rounds=2, clients=[8]).run()
    s = fed.strategy
    info, comm = s.clustering, s.history[1].extra["comm"]
    assert s.assignment == {8: 0} and info["clusters"] == 1 and info["clients-asked"] == 1
    assert info["bytes-down-per-client"] == comm["lazy-bytes-down"] + comm["lia-bytes-down"]
    assert info["bytes-up-per-client"] == comm["lazy-bytes-up"] + comm["lia-bytes-up"]
    _figure_of(s, tmp_path, monkeypatch)  # a 1 x 1 influence matrix is still written and drawn
    assert json.loads((tmp_path / "pfedlia_influence.json").read_text())["matrix"] == [[influence(8, 8)]]
    assert (tmp_path / "pfedlia_influence.png").exists()


def test_oracle_without_planted_groups_says_which_partitions_have_them():
    fed = Federation(method="oracle", planted=False)
    with pytest.raises(
        ValueError,
        match=r"^lia-mode 'oracle' needs planted clusters \(partition 'planted-clusters\*'\); "
        r"no client reported one$",
    ):
        fed.run()


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


# ---------------------------------------------------------------------------------------------- the run's summary
def _summary(fed):
    """(summary line, summary.json) as the ServerApp writes them at the end of the run."""
    from server_app.results import ResultsWriter

    writer = ResultsWriter(fed.strategy.settings, run_id=1)
    line = writer.write(fed.strategy, 1.0)
    return line, json.loads((writer.folder / "summary.json").read_text())


@pytest.mark.parametrize("method,mode", [("pfedlia", "central"), ("pfedlia", "p2p"), ("oracle", "central")])
def test_the_summary_names_the_clusters_found(method, mode, tmp_path):
    fed = Federation(method=method, **{"lia-mode": mode, "results-dir": str(tmp_path)}).run()
    line, summary = _summary(fed)
    assert line.startswith(f"pflower {method} on digits/") and ": 3 rounds, 6 clients, 2 clusters, personal" in line
    assert summary["clusters"] == 2 and summary["clustering"] == "2 clusters"


def test_the_oracle_on_one_planted_group_says_the_run_was_fedavg(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "PLANTED", dict.fromkeys(CLIENTS, 0))
    fed = Federation(method="oracle", **{"results-dir": str(tmp_path)}).run()
    _, summary = _summary(fed)
    assert summary["clusters"] == 1 and summary["clustering"] == "1 cluster: the run was FedAvg (one planted group)"
    for c in CLIENTS:
        assert_holds(fed.payload(3, "train", c), fedavg(CLIENTS, 2))


def test_central_mode_that_finds_one_cluster_says_the_run_was_fedavg(tmp_path):
    fed = Federation(influence=lambda i, j: 1.0, **{"results-dir": str(tmp_path)}).run()  # no structure at all
    line, summary = _summary(fed)
    said = "1 cluster: the run was FedAvg (OPTICS put every client in one cluster)"
    assert f": 3 rounds, 6 clients, {said}, personalized acc" in line
    assert summary["clusters"] == 1 and summary["clustering"] == said
    for c in CLIENTS:  # and it was: every client trained round 2's FedAvg of everyone in round 3
        assert_holds(fed.payload(3, "train", c), fedavg(CLIENTS, 2))


def test_p2p_mode_where_every_beneficial_set_is_everyone_says_the_run_was_fedavg(tmp_path):
    def everyone(i, lazy_ids):
        return [k for k, j in enumerate(lazy_ids) if j != i]

    def nearly(i, lazy_ids):  # client 3's set lacks client 31
        return [k for k, j in enumerate(lazy_ids) if j != i and (i, j) != (3, 31)]

    fed = Federation(beneficial=everyone, **{"lia-mode": "p2p", "results-dir": str(tmp_path)}).run()
    _, summary = _summary(fed)
    said = "1 cluster: the run was FedAvg (every client's beneficial set is every client)"
    assert summary["clusters"] == 1 and summary["clustering"] == said
    for c in CLIENTS:
        assert_holds(fed.payload(3, "train", c), fedavg(CLIENTS, 2))
    fed = Federation(beneficial=nearly, **{"lia-mode": "p2p", "results-dir": str(tmp_path)}).run()
    assert _summary(fed)[1]["clustering"] == "2 clusters"  # two distinct sets


def test_a_run_whose_clustering_round_never_completed_says_it_was_fedavg(tmp_path):
    fed = Federation(rounds=2, silent={(2, "lazy", c) for c in CLIENTS}, **{"results-dir": str(tmp_path)}).run()
    _, summary = _summary(fed)
    assert not fed.strategy.clustered
    assert (
        summary["clusters"] == 1
        and summary["clustering"] == "1 cluster: the run was FedAvg (no clustering round completed)"
    )


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
    resume(resumed, checkpoint_state(s), 2)
    assert_holds(resumed.start_model(), fedavg(CLIENTS, 1))  # restored without a clustering round
