"""What the Oracle baseline's server must do (docs/methods/pfedlia.md "Oracle and CFL"): pFedLIA's
warm-up and per-cluster FedAvg with the planted groups the clients report as clusters, no lazy round, and every
client in its group from the clustering round on, however late it connects."""

import pytest

from tests.pfedlia.server_kit import CLIENTS, PLANTED, Federation, assert_holds, fedavg


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
    assert info["bytes-down-per-client"] == info["bytes-up-per-client"] == 0  # no lazy or influence query


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


def test_oracle_without_planted_groups_says_which_partitions_have_them():
    fed = Federation(method="oracle", planted=False)
    with pytest.raises(
        ValueError,
        match=r"^lia-mode 'oracle' needs planted clusters \(partition 'planted-clusters\*'\); "
        r"no client reported one$",
    ):
        fed.run()
