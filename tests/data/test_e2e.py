"""Unequal clients under partial participation through Flower's runtime (the engine, held to flwr run by
tests/engine/test_equality.py): partition 'quantity-dirichlet' with a third of the clients drawn per round; Local
trains every client in every round, FedAvg the drawn third."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


# FedAvg's draw is the base's (tests/runtime); its Flower run (about 50 s on 2 cores) runs with `-m extended`
@pytest.mark.parametrize("method,trained", [("local", 6), pytest.param("fedavg", 2, marks=pytest.mark.extended)])
def test_unequal_clients_with_a_third_drawn_per_round(engine, method, trained):
    cfg = {"method": method, "partition": "quantity-dirichlet", "fraction-train": 0.34}
    summary = engine.run({**cfg, "num-server-rounds": 2, "min-nodes": 6}, num_supernodes=6)
    folder = Path(summary["results"])
    assert summary["failures"] == 0 and summary["partition"] == "quantity-dirichlet"
    rounds = json.loads((folder / "rounds.json").read_text())
    assert [r["train"]["num-replies"] for r in rounds] == [trained, trained]
    with (folder / "clients.csv").open() as fh:
        sizes = [float(r["num-examples"]) for r in csv.DictReader(fh)]
    assert len(sizes) == 6 and max(sizes) > 2 * min(sizes)  # lognormal(0, 1) sizes: far from equal
    assert 0.1 < summary["personal-acc"] <= 1.0
