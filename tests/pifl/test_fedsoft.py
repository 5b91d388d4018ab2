"""What FedSoft's server must do (Ruan & Joe-Wong, Algorithm 1; pifl.md §5), PI-FL's soft-clustering
baseline: when clients estimate their importance weights, how each centre's clients are drawn, each centre as the
plain mean of them, and fedsoft_clusters.json."""

import json

import numpy as np
import pytest

from strategies.fedsoft import FedSoftStrategy
from strategies.fedsoft_artifacts import write_artifacts as write_fedsoft_artifacts
from strategies.tier_tables import SourceHoldouts
from task.config import parse_settings
from task.params import to_record
from tests.pifl.server_kit import NODES, two_source
from tests.strategy_harness import build_as, drive, phase_of, with_metrics

SOFT_U = {0: [0.9, 0.1], 1: [0.5, 0.5], 2: [0.2, 0.8], 3: [0.7, 0.3]}  # client -> importance weights u_ks


SOFT_N = {0: 10, 1: 100, 2: 30, 3: 60}  # client -> training examples n_k: u_ks n_k differs between any two clients


def fedsoft_answers(rnd, node, phase, content):
    c = NODES[node]
    if phase == "fedsoft_u":
        return [with_metrics(content, fedsoft_u=SOFT_U[c], num_examples=SOFT_N[c])]
    if phase == "train":  # every array of client c's model holds c + 1
        out = with_metrics(content, num_examples=SOFT_N[c])
        out["arrays"] = to_record({k: np.full_like(v.numpy(), c + 1) for k, v in content["arrays"].items()})
        return [out]
    return None


def test_a_fedsoft_centre_is_the_plain_mean_of_the_clients_drawn_for_it():
    # FedSoft (Ruan & Joe-Wong, Algorithm 1; pifl.md §5): the server draws the clients of centre s with probability
    # proportional to u_ks n_k and sets c_s to the plain 1/K mean of their models; weighting them by u_ks n_k once more
    # would count the importance twice (here it would pull every centre towards client 1, the largest)
    strat = build_as(
        FedSoftStrategy,
        parse_settings(
            {
                "method": "fedsoft",
                "dataset": "digits",
                "model": "mlp",
                "min-nodes": 4,
                "tiers": 2,
                "fedsoft-clients-per-cluster": 2,
                "fedsoft-estimate-every": 1,
            }
        ),
    )
    for rnd in (1, 2, 3):
        drive(strat, NODES, [rnd], fedsoft_answers)
        assert {s: len(m) for s, m in strat.selected.items()} == {0: 2, 1: 2}
        assert strat.history[-1].extra["fedsoft"] == {"selected": {0: 2, 1: 2}}  # the round's log: drawn per centre
        for s, members in strat.selected.items():
            expected = np.mean([c + 1 for c in members])
            for key, value in strat.models[s].items():
                if np.issubdtype(value.dtype, np.floating):
                    np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=f"round {rnd} centre {s} {key}")


def fedsoft(**cfg):
    settings = {"method": "fedsoft", "dataset": "digits", "model": "mlp", "min-nodes": 4, "tiers": 2, **cfg}
    return build_as(FedSoftStrategy, parse_settings(settings))


def test_fedsoft_estimates_every_few_rounds_and_whenever_a_client_has_no_estimate_and_writes_each_estimate(tmp_path):
    """Clients send their importance weights in round 1 and every ``fedsoft-estimate-every`` rounds after it, and
    also in any round where a client has never sent one (its first reply failed, or it joined late); a client whose
    later estimate fails keeps its last one.  fedsoft_clusters.json keeps each estimate, rounded to 4 decimals,
    under the round that made it."""
    u = {0: [0.123456, 0.876544], 1: [0.5, 0.5], 2: [0.25, 0.75], 3: [0.654321, 0.345679]}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "fedsoft_u":
            if rnd in (1, 4) and c == 3:  # client 3 does not answer round 1's estimate, nor round 4's
                return []
            return [with_metrics(content, fedsoft_u=u[c], num_examples=SOFT_N[c])]
        return fedsoft_answers(rnd, node, phase, content)

    strat = fedsoft(**{"fedsoft-estimate-every": 3, "fedsoft-clients-per-cluster": 2})
    grid = drive(strat, NODES, 8, answer)
    asked = sorted({int(m.content["config"]["server-round"]) for m in grid.sent if phase_of(m) == "fedsoft_u"})
    assert asked == [1, 2, 4, 7]  # every 3 rounds from round 1, and round 2 for client 3, which had none
    write_fedsoft_artifacts(strat, tmp_path)
    importance = json.loads((tmp_path / "fedsoft_clusters.json").read_text())["importance"]
    assert sorted(importance) == ["1", "2", "4", "7"]
    assert importance["1"] == {str(c): [round(x, 4) for x in u[c]] for c in range(3)}  # client 3 had none yet
    assert importance["2"] == importance["4"] == {str(c): [round(x, 4) for x in u[c]] for c in range(4)}


def test_fedsoft_draws_each_centres_clients_in_proportion_to_importance_times_size():
    """Centre s draws its clients with probability u_ks n_k / sum_j u_js n_j, without replacement, among the clients
    with a positive weight only, at most ``fedsoft-clients-per-cluster``; a centre no client weighs is not drawn,
    and the centres after it still are."""
    strat = fedsoft(**{"tiers": 3, "fedsoft-clients-per-cluster": 1})
    u = {0: [0.0, 0.9, 0.1], 1: [0.0, 0.5, 0.5], 2: [0.0, 0.2, 0.8], 3: [0.0, 0.7, 0.3]}

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u":
            return [with_metrics(content, fedsoft_u=u[NODES[node]], num_examples=SOFT_N[NODES[node]])]
        return fedsoft_answers(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    draws = 4000
    counts = {s: np.zeros(4) for s in (1, 2)}
    for _ in range(draws):
        strat.sample(2, list(NODES))
        assert sorted(strat.selected) == [1, 2]  # centre 0: every client weighs it 0
        for s in (1, 2):
            counts[s][strat.selected[s]] += 1
    for s in (1, 2):
        weight = np.array([u[c][s] * SOFT_N[c] for c in range(4)])
        expected = weight / weight.sum()
        spread = np.sqrt(expected * (1 - expected) / draws)
        assert np.all(np.abs(counts[s] / draws - expected) < 4 * spread + 1e-9), (s, counts[s] / draws, expected)


def test_fedsoft_draws_distinct_clients_and_only_those_that_weigh_the_centre():
    strat = fedsoft(**{"tiers": 3, "fedsoft-clients-per-cluster": 3})
    # centre 0 is weighed by client 1 alone, which holds one example (u n = 0.5, below 1, still counts); centre 1 by
    # clients 0 and 1; centre 2 by three clients
    u = {0: [0.0, 0.5, 0.5], 1: [0.5, 0.5, 0.0], 2: [0.0, 0.0, 1.0], 3: [0.0, 0.0, 1.0]}
    sizes = {0: 10, 1: 1, 2: 30, 3: 60}

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u":
            return [with_metrics(content, fedsoft_u=u[NODES[node]], num_examples=sizes[NODES[node]])]
        return fedsoft_answers(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    for _ in range(200):  # whatever the draw: each weighing client once, nobody else
        strat.sample(2, list(NODES))
        assert strat.selected == {0: [1], 1: [0, 1], 2: [0, 2, 3]}


def test_fedsoft_does_not_draw_a_client_without_an_estimate():
    # with fraction-train below 1 every node is asked which client it is first, so client 3 is known to the
    # server when its estimate does not come
    strat = fedsoft(**{"fedsoft-clients-per-cluster": 4, "fraction-train": 0.75})

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u" and NODES[node] == 3:
            return []
        return fedsoft_answers(rnd, node, phase, content)

    grid = drive(strat, NODES, 1, answer)
    assert [phase_of(m) for m in grid.sent[:4]] == ["identify"] * 4
    assert 3 not in strat.u
    assert all(3 not in members for members in strat.selection_log[1].values())
    assert sorted({c for members in strat.selection_log[1].values() for c in members}) == [0, 1, 2]


def test_fedsoft_sends_each_client_its_own_importance_weights_and_uniform_ones_before_it_has_any():
    strat = fedsoft(**{"fedsoft-clients-per-cluster": 4, "fedsoft-estimate-every": 5})

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u" and NODES[node] == 3 and rnd == 1:
            return []  # client 3 has no estimate in round 1
        return fedsoft_answers(rnd, node, phase, content)

    grid = drive(strat, NODES, 1, answer)
    sent = {
        NODES[m.metadata.dst_node_id]: list(m.content["fedsoft"]["u"]) for m in grid.sent if phase_of(m) == "evaluate"
    }
    assert sent == {0: SOFT_U[0], 1: SOFT_U[1], 2: SOFT_U[2], 3: [0.5, 0.5]}


@pytest.mark.parametrize("bad", [[0.6, 0.6], [0.3, 0.3], [1.5, -0.5]])
def test_fedsoft_refuses_importance_weights_that_are_not_a_distribution_over_the_centres(bad):
    strat = fedsoft(**{"fedsoft-clients-per-cluster": 4})

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u" and NODES[node] == 2:
            return [with_metrics(content, fedsoft_u=bad, num_examples=SOFT_N[2])]
        return fedsoft_answers(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    assert sorted(strat.u) == [0, 1, 3]  # client 2's estimate was refused


def test_fedsoft_on_two_source_data_writes_each_rounds_table_of_its_centres(tmp_path):
    """On two-source data fedsoft_clusters.json holds, per round, each centre's accuracy on the source A and B
    holdouts (PI-FL's Tables 1-2 for its baseline), the same table the round's history shows."""
    strat = build_as(FedSoftStrategy, two_source(method="fedsoft", tiers=2, **{"fedsoft-clients-per-cluster": 2}))
    drive(strat, NODES, 2, fedsoft_answers)
    write_fedsoft_artifacts(strat, tmp_path)
    written = json.loads((tmp_path / "fedsoft_clusters.json").read_text())
    tables = written["tier-table (accuracy of each centre on the source A / B holdouts)"]
    assert sorted(tables) == ["1", "2"]
    expected = SourceHoldouts(strat.settings, len(NODES)).table(strat.models)
    assert tables["2"] == expected == strat.history[-1].extra["tier-table"]
    assert len(expected) == 2
    assert written["selected"] == {
        str(r): {str(s): v for s, v in sel.items()} for r, sel in strat.selection_log.items()
    }
