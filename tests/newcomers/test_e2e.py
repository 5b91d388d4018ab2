"""Held-out clients through Flower's runtime (the engine, held to flwr run by tests/engine/test_equality.py): IFCA
at its defaults with the two largest partition ids held out."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_held_out_clients_never_train_and_are_scored_as_newcomers_at_the_end_at_ifcas_defaults(engine):
    summary = engine.run({"method": "ifca", "holdout-clients": 2, "min-nodes": 5}, num_supernodes=5)
    folder = Path(summary["results"])
    assert summary["failures"] == 0 and summary["clients"] == 3 and summary["rounds"] == 10
    assert summary["holdout-clients"] == 2 and summary["newcomers"] == 2
    rounds = json.loads((folder / "rounds.json").read_text())
    assert all(r["train"]["num-replies"] == 3 for r in rounds)  # the three trained clients, every round
    assert all(r["evaluate"]["num-replies"] == 3 for r in rounds if r["evaluate"])
    entry = rounds[-1]["extra"]["newcomers"]
    assert entry["clients"] == entry["asked"] == [3, 4]  # the last two partition ids
    with (folder / "clients.csv").open() as fh:
        rows = {int(r["client"]): r for r in csv.DictReader(fh)}
    assert sorted(rows) == list(range(5))
    assert all(rows[c]["newcomer-acc"] == "" and rows[c]["personal-acc"] != "" for c in range(3))
    assert all(rows[c]["personal-acc"] == "" for c in (3, 4))
    per_client = [float(rows[c]["newcomer-acc"]) for c in (3, 4)]
    assert summary["newcomer-acc"] == pytest.approx(sum(per_client) / 2)
    assert 0.3 < summary["newcomer-acc"] <= 1.0  # a cluster model of a trained federation, far above chance (0.1)
    assert 0.3 < summary["newcomer-finetuned-acc"] <= 1.0
    line = f"{summary['newcomers']} newcomers (held out): acc {summary['newcomer-acc']:.4f}, fine-tuned "
    assert line in summary["log"]
