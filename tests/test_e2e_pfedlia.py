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


@pytest.mark.parametrize("mode", ["p2p", "central"])
def test_pfedlia_recovers_the_planted_groups(simulation, mode):
    summary = simulation.run({"method": "pfedlia", "lia-mode": mode, **SMALL}, num_supernodes=10)
    folder = Path(summary["results"])
    clusters = json.loads((folder / "pfedlia_clusters.json").read_text())["clustering"]
    assert clusters["round"] == 6 and summary["failures"] == 0
    if mode == "p2p":
        assert clusters["p2p-exact-fraction"] == 1.0 and clusters["ari"] == 1.0
    else:
        assert clusters["ari"] >= 0.9
    assert (folder / "pfedlia_influence.png").exists()
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


def test_pfedlia_p2p_groups_dialects_and_beats_fedavg_perplexity(simulation):
    """Next-word prediction with a GPT-2-config model: p2p pFedLIA finds the dialects, lowers perplexity."""
    fedavg = simulation.run({"method": "fedavg", **LM}, num_supernodes=6)
    lia = simulation.run({"method": "pfedlia", "lia-mode": "p2p", **LM}, num_supernodes=6)
    clusters = json.loads((Path(lia["results"]) / "pfedlia_clusters.json").read_text())["clustering"]
    assert clusters["ari"] == 1.0 and clusters["p2p-exact-fraction"] == 1.0
    assert lia["personal-perplexity"] < fedavg["personal-perplexity"]
