"""What pFedLIA's server must do in peer-to-peer mode (pfedlia.md §2.5, §2.6, §2.8): each client's set is
its beneficial peers plus itself, its personal model is FedAvg over the trained members of its set, and a late
joiner gets its own set and starts from theta_0."""

import pytest

from strategies.replies import Numbers
from tests.pfedlia.server_kit import (
    CLIENTS,
    NODE,
    P2P_SETS,
    PLANTED,
    Federation,
    assert_holds,
    fedavg,
    p2p_beneficial,
    same_partition,
)


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
    fed = Federation(**{"lia-mode": "p2p"}, beneficial=p2p_beneficial, silent={(3, "train", 3), (3, "train", 11)}).run()
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


def test_under_a_robust_rule_each_clients_set_is_averaged_as_its_own_group():
    """pfedlia.md §2.6 p2p with the run's rule (docs/robustness.md): every client's personal model is its set's
    average, recorded under the set it belongs to ("set of <client>"), apart from the warm-up's global average."""
    fed = Federation(**{"lia-mode": "p2p", "aggregator": "median"}, beneficial=p2p_beneficial).run()
    by_round = [{e["group"]: e["clients"] for e in r.extra.get("robust", [])} for r in fed.strategy.history]
    assert set(by_round[0]) == {"global"}  # the warm-up
    for groups in by_round[1:]:  # after clustering: one group per client, over its set's members
        assert groups == {f"set of {c}": P2P_SETS[c] for c in CLIENTS}
