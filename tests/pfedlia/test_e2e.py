"""pFedLIA end to end through Flower on planted clusters (5 clusters x 2 labels, 10 clients, seeded)."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL = {
    "num-server-rounds": 7,
    "warmup-rounds": 5,
    "lazy-epochs": 10,
    "partition": "planted-clusters",
    "num-clusters": 5,
    "min-nodes": 10,
    "model": "mlp",
    "momentum": 0.0,
    "batch-size": 16,
    "local-epochs": 2,
    "val-fraction": 0.25,
    "optics-min-samples": 2,
    "seed": 0,
}


def _sets(folder: Path) -> dict:
    return json.loads((folder / "pfedlia_clusters.json").read_text())["beneficial-sets"]


@pytest.mark.extended  # about 110 s on 2 cores; the summary's clusters through Flower are also checked by CFL's
# two-round run in tests/baselines/test_e2e.py and by the planted-groups runs below
def test_pfedlia_at_its_defaults_says_how_many_clusters_it_found(engine):
    """What a new user runs (``method='pfedlia'``, nothing else, 10 nodes): the summary says how many clusters
    the clustering round found, and spells out a single one (the run was then FedAvg)."""
    summary = engine.run({"method": "pfedlia"}, num_supernodes=10)
    groups = json.loads((Path(summary["results"]) / "pfedlia_clusters.json").read_text())["assignment"]
    clusters = len(set(groups.values()))
    assert summary["clusters"] == clusters and len(groups) == 10
    said = "1 cluster: the run was FedAvg (OPTICS put every client in one cluster)" if clusters == 1 else None
    assert summary["clustering"] == (said or f"{clusters} clusters")
    assert f"pflower pfedlia on digits/dirichlet: 10 rounds, 10 clients, {summary['clustering']}, " in summary["log"]


def test_oracle_at_its_defaults_is_refused_at_start_up_naming_the_data_it_needs(engine):
    """``method='oracle'`` on the default (Dirichlet) data stops before round 1 and says how to get planted groups;
    the ServerApp says so as soon as it starts, before Flower reports the failed run."""
    from server_app.runner import RunFailed

    with pytest.raises(RunFailed) as err:
        engine.run({"method": "oracle"}, num_supernodes=2, timeout=300)
    out = err.value.output
    said = "the run config was refused at start-up: method 'oracle' clusters the clients by their planted groups"
    assert said in out and "partition='planted-clusters'" in out
    assert "[ROUND 1" not in out
    assert out.index(said) < out.index("Simulation raised an exception")
    # Flower's report of the exception shows the ServerApp's frame only, not the parser's that found the problem
    assert "in parse_settings" not in out and "in main" in out
    # flwr run exits 0 here; `python -m server_app.job` reads the run as refused (exit 3)
    from server_app.job import Exit, outcome

    assert outcome(0, out)[0] == Exit.REFUSED


@pytest.mark.parametrize("mode", ["p2p", "central"])
def test_pfedlia_recovers_the_planted_groups(engine, mode):
    summary = engine.run({"method": "pfedlia", "lia-mode": mode, **SMALL}, num_supernodes=10)
    folder = Path(summary["results"])
    clusters = json.loads((folder / "pfedlia_clusters.json").read_text())["clustering"]
    assert clusters["round"] == 6 and summary["failures"] == 0
    if mode == "p2p":
        assert clusters["p2p-exact-fraction"] == 1.0 and clusters["ari"] == 1.0
    else:
        assert clusters["ari"] >= 0.9
    assert (folder / "pfedlia_influence.png").exists()
    groups = json.loads((folder / "pfedlia_clusters.json").read_text())["assignment"]
    found = len(set(groups.values())) if mode == "central" else len({tuple(s) for s in _sets(folder).values()})
    assert summary["clusters"] == found > 1 and summary["clustering"] == f"{found} clusters"
    assert f", 10 clients, {found} clusters, personalized acc" in summary["log"]
    rounds = json.loads((folder / "rounds.json").read_text())
    assert rounds[5]["extra"]["clustering"]["bytes-down-per-client"] > 0
    assert summary["personal-acc"] > 0.6


LM = {
    "dataset": "dialects",
    "partition": "planted-clusters",
    "num-clusters": 3,
    "num-server-rounds": 6,
    "min-nodes": 6,
    "warmup-rounds": 2,
    "lazy-epochs": 5,
    "local-epochs": 2,
    "optimizer": "adam",
    "lr": 0.003,
    "batch-size": 16,
    "val-fraction": 0.2,
    "dialect-sequences": 80,
    "seed": 0,
}


def test_pfedlia_p2p_groups_dialects_and_beats_fedavg_perplexity(engine):
    """Next-word prediction with a GPT-2-config model: p2p pFedLIA finds the dialects, lowers perplexity."""
    fedavg = engine.run({"method": "fedavg", **LM}, num_supernodes=6)
    lia = engine.run({"method": "pfedlia", "lia-mode": "p2p", **LM}, num_supernodes=6)
    clusters = json.loads((Path(lia["results"]) / "pfedlia_clusters.json").read_text())["clustering"]
    assert clusters["ari"] == 1.0 and clusters["p2p-exact-fraction"] == 1.0
    assert lia["personal-perplexity"] < fedavg["personal-perplexity"]
