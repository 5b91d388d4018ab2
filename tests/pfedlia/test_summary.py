"""What the run's summary says about pFedLIA's clustering (the summary line and summary.json, as the
ServerApp writes them at the end of the run): the clusters found, and that a run with one cluster was FedAvg, and
why."""

import json

import pytest

from tests.pfedlia import server_kit
from tests.pfedlia.server_kit import CLIENTS, Federation, assert_holds, fedavg


def _summary(fed):
    """(summary line, summary.json) as the ServerApp writes them at the end of the run."""
    from server_app.results import ResultsWriter

    writer = ResultsWriter(fed.strategy.settings, run_id=1)
    line = writer.write(fed.strategy.results(), 1.0)
    return line, json.loads((writer.folder / "summary.json").read_text())


@pytest.mark.parametrize("method,mode", [("pfedlia", "central"), ("pfedlia", "p2p"), ("oracle", "central")])
def test_the_summary_names_the_clusters_found(method, mode, tmp_path):
    fed = Federation(method=method, **{"lia-mode": mode, "results-dir": str(tmp_path)}).run()
    line, summary = _summary(fed)
    assert line.startswith(f"pflower {method} on digits/") and ": 3 rounds, 6 clients, 2 clusters, personal" in line
    assert summary["clusters"] == 2 and summary["clustering"] == "2 clusters"


def test_the_oracle_on_one_planted_group_says_the_run_was_fedavg(tmp_path, monkeypatch):
    monkeypatch.setattr(server_kit, "PLANTED", dict.fromkeys(CLIENTS, 0))  # what the scripted clients report
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
