"""What a clustering or model-forwarding method's server sends a newcomer (strategies/newcomers.py): pFedLIA the
model of the cluster its scores of the stored lazy models point to (the late-joiner path, pfedlia.md §2.8, without
making it a member), the Oracle its planted group's model, CFL every cluster model, FedC2I the stored models it would
mix before its first training.  Scripted federations (tests/pfedlia/server_kit.py's, with a seventh client held out)
make every model the newcomer should get known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.cfl import CFLStrategy
from strategies.fedc2i import FedC2IStrategy
from strategies.newcomers import evaluate_newcomers
from task.config import parse_settings
from task.params import record_to_numpy
from tests.pfedlia import server_kit as lia
from tests.pfedlia.server_kit import CLIENTS, PLANTED, Federation, assert_holds, fedavg
from tests.strategy_harness import ReplayGrid, build_as, drive, outgoing_messages

NEWCOMER = 40  # held out: the largest client id, planted group 0


@pytest.fixture
def with_newcomer(monkeypatch):
    monkeypatch.setitem(lia.NODE, NEWCOMER, 7001)
    monkeypatch.setitem(lia.PLANTED, NEWCOMER, 0)
    monkeypatch.setitem(lia.EXAMPLES, NEWCOMER, 4)


def run_with_newcomer(method="pfedlia", rounds=3, **cfg):
    fed = Federation(method=method, rounds=rounds, clients=[*CLIENTS, NEWCOMER], **{"holdout-clients": 1}, **cfg)
    fed.run()
    with outgoing_messages():
        evaluate_newcomers(fed.strategy, ReplayGrid([lia.NODE[c] for c in [*CLIENTS, NEWCOMER]], fed.respond), rounds)
    return fed


def test_pfedlia_gives_a_newcomer_the_model_of_the_cluster_its_scores_point_to_without_adding_it(with_newcomer):
    fed = run_with_newcomer()
    s = fed.strategy
    assert NEWCOMER not in s.assignment and NEWCOMER not in s.lazy_clients and NEWCOMER not in s.matrix_clients
    assert {p for r, p, c, _ in fed.sent if c == NEWCOMER} == {"identify", "lia", "newcomer"}
    assert [r for r, p, c, _ in fed.sent if c == NEWCOMER and p == "lia"] == [3]  # scored only after the last round
    group = [c for c in CLIENTS if PLANTED[c] == PLANTED[NEWCOMER]]
    assert_holds(fed.payload(3, "newcomer", NEWCOMER), fedavg(group, 3))  # its group's cluster after the last round
    assert sorted(s.holdout.results) == [NEWCOMER]


def test_pfedlia_p2p_gives_a_newcomer_the_mean_of_its_beneficial_peers_models(with_newcomer):
    fed = run_with_newcomer(**{"lia-mode": "p2p"})
    s = fed.strategy
    peers = [c for c in CLIENTS if PLANTED[c] == PLANTED[NEWCOMER]]  # the scripted beneficial peers: its group
    expected = np.mean([fedavg(s.sets[c], 3) for c in peers])
    assert_holds(fed.payload(3, "newcomer", NEWCOMER), expected)
    assert NEWCOMER not in s.sets


def test_the_oracle_gives_a_newcomer_its_planted_groups_model(with_newcomer):
    fed = run_with_newcomer(method="oracle", identify_planted=True)
    s = fed.strategy
    group = [c for c in CLIENTS if PLANTED[c] == PLANTED[NEWCOMER]]
    assert_holds(fed.payload(3, "newcomer", NEWCOMER), fedavg(group, 3))
    assert NEWCOMER not in s.assignment


def test_pfedlia_that_never_clustered_gives_a_newcomer_the_global_model(with_newcomer):
    fed = run_with_newcomer(rounds=2, silent={(2, "lazy", c) for c in CLIENTS})  # no lazy model: no clustering
    assert not fed.strategy.clustered
    assert_holds(fed.payload(2, "newcomer", NEWCOMER), fedavg(CLIENTS, 2))


NODES = {1003: 0, 7: 1, 42: 2, 555: 3, 90: 4}


def test_cfl_gives_a_newcomer_every_cluster_model_to_choose_from():
    s = build_as(
        CFLStrategy, parse_settings({"method": "cfl", "model": "mlp", "holdout-clients": 1, "cfl-min-rounds": 1})
    )
    grid = drive(s, NODES, 2)
    s.models[1] = {k: v + 1 for k, v in s.models[0].items()}  # a second cluster
    with outgoing_messages():
        evaluate_newcomers(s, grid, 2)
    (sent,) = [m for m in grid.sent if m.metadata.message_type == "query.newcomer"]
    assert NODES[sent.metadata.dst_node_id] == 4
    tiers = record_to_numpy(sent.content["tiers"])
    for k in s.model_info.keys:
        np.testing.assert_array_equal(tiers[k], np.stack([s.models[0][k], s.models[1][k]]))


def test_fedc2i_gives_a_newcomer_the_initial_model_first_then_the_stored_models_with_their_ids():
    s = build_as(FedC2IStrategy, parse_settings({"method": "fedc2i", "model": "mlp", "holdout-clients": 1}))
    grid = drive(s, NODES, 2)
    with outgoing_messages():
        evaluate_newcomers(s, grid, 2)
    (sent,) = [m for m in grid.sent if m.metadata.message_type == "query.newcomer"]
    peers = record_to_numpy(sent.content["peers"])
    ids = list(sent.content["peer-clients"]["client-ids"])
    assert ids == [0, 1, 2, 3] and sorted(s.store) == [0, 1, 2, 3]
    assert list(sent.content["peer-clients"]["num-examples"]) == [s.sizes[c] for c in ids]
    for k in s.model_info.keys:
        np.testing.assert_array_equal(peers[k], np.stack([s.initial_state[k], *(s.store[c][k] for c in ids)]))


# A newcomer the late-joiner path cannot place gets theta_0 (pfedlia.md §2.8's start model), and one newcomer that
# cannot be placed does not keep the others from theirs.
THETA0 = fedavg(CLIENTS, 1)  # the model the warm-up round (warmup-rounds=1) ended with


def test_a_pfedlia_newcomer_whose_scores_never_came_gets_theta_0(with_newcomer):
    fed = run_with_newcomer(silent={(3, "lia", NEWCOMER)})
    assert_holds(fed.payload(3, "newcomer", NEWCOMER), THETA0)


@pytest.mark.parametrize("silent", [NEWCOMER, NEWCOMER + 5])
def test_a_newcomer_that_cannot_be_placed_does_not_keep_another_from_its_cluster(with_newcomer, monkeypatch, silent):
    other = NEWCOMER + 5  # held out too, planted group 1 (the first newcomer's is 0)
    monkeypatch.setitem(lia.NODE, other, 7002)
    monkeypatch.setitem(lia.PLANTED, other, 1)
    monkeypatch.setitem(lia.EXAMPLES, other, 6)
    fed = Federation(clients=[*CLIENTS, NEWCOMER, other], **{"holdout-clients": 2}, silent={(3, "lia", silent)})
    fed.run()
    with outgoing_messages():
        evaluate_newcomers(fed.strategy, ReplayGrid([lia.NODE[c] for c in [*CLIENTS, NEWCOMER, other]], fed.respond), 3)
    (placed,) = {NEWCOMER, other} - {silent}
    assert_holds(fed.payload(3, "newcomer", silent), THETA0)
    assert_holds(
        fed.payload(3, "newcomer", placed), fedavg([c for c in CLIENTS if PLANTED[c] == lia.PLANTED[placed]], 3)
    )


def test_a_pfedlia_p2p_newcomer_without_beneficial_peers_gets_theta_0(with_newcomer):
    fed = Federation(
        clients=[*CLIENTS, NEWCOMER],
        beneficial=lambda i, lazy_ids: (
            [] if i == NEWCOMER else [k for k, j in enumerate(lazy_ids) if PLANTED[j] == PLANTED[i] and j != i]
        ),
        **{"holdout-clients": 1, "lia-mode": "p2p"},
    )
    fed.run()
    with outgoing_messages():
        evaluate_newcomers(fed.strategy, ReplayGrid([lia.NODE[c] for c in [*CLIENTS, NEWCOMER]], fed.respond), 3)
    assert_holds(fed.payload(3, "newcomer", NEWCOMER), THETA0)


def test_the_oracles_newcomer_from_a_group_no_client_trained_in_gets_theta_0(with_newcomer, monkeypatch):
    monkeypatch.setitem(lia.PLANTED, NEWCOMER, 2)  # no training client is in planted group 2
    fed = run_with_newcomer(method="oracle", identify_planted=True)
    assert 2 not in fed.strategy.cluster_models
    assert_holds(fed.payload(3, "newcomer", NEWCOMER), THETA0)


def test_a_fedc2i_newcomer_gets_the_peers_its_train_message_would_carry():
    """With ``c2i-peers`` the peers are drawn per (seed, round, client): a newcomer's are those its own train message
    would carry in that round, drawn with its client id like every client's."""
    s = build_as(
        FedC2IStrategy, parse_settings({"method": "fedc2i", "model": "mlp", "holdout-clients": 1, "c2i-peers": 2})
    )
    grid = drive(s, NODES, 2)
    (newcomer,) = [n for n, c in NODES.items() if c == 4]
    for rnd in range(2, 10):
        got = s.newcomer_payloads(grid, rnd, [newcomer])[newcomer]["peer-clients"]["client-ids"]
        assert got == s.payload(newcomer, rnd, "train")["peer-clients"]["client-ids"], rnd
