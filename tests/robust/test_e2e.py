"""Every attack kind end to end through Flower (its simulation runtime on the in-process engine, which
tests/engine/test_equality.py holds to flwr run), each with one of the aggregation rules, at the user's defaults
otherwise (two rounds, four clients): the run finishes, names its attackers, reports the honest clients' accuracy
without the attackers' own, and what the rule did with them."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from task.attacks import AttackOptions, attackers

pytestmark = pytest.mark.slow

RUNS = [
    ("fedavg", "label-flip", "median"),
    ("fedavg", "sign-flip", "multi-krum"),
    ("fedavg", "noise", "trimmed-mean"),
    ("fedavg", "backdoor", "mean"),
    ("fedavg", "free-rider", "norm-bound"),
    ("fedcac", "side-channel", "median"),
    ("fedavg", "min-max", "bulyan"),
    ("ditto", "model-replacement", "fltrust"),
    ("ifca", "side-channel", "multi-krum"),
]
#: keys a run sets besides the method, attack and rule: the model-replacement run lies about its size too
KEYS = {"model-replacement": {"attack-num-examples": 2**31 - 1}}


@pytest.mark.parametrize("method,attack,rule", RUNS)
def test_an_attacked_run_reports_the_honest_clients_and_what_isolated_the_attackers(engine, method, attack, rule):
    config = {"method": method, "attack": attack, "aggregator": rule, "num-server-rounds": 2, "min-nodes": 4}
    config |= KEYS.get(attack, {})
    summary = engine.run(config, num_supernodes=4)
    folder = Path(summary["results"])
    bad = attackers(AttackOptions(attack=attack), range(4))  # the default attack-share: one of four clients
    assert summary["attack"] == attack and summary["aggregator"] == rule and summary["attackers"] == bad == [1]
    assert summary["failures"] == 0 and summary["rounds"] == 2
    with (folder / "clients.csv").open() as fh:
        clients = {int(row["client"]): row for row in csv.DictReader(fh)}
    honest = [float(row["personal-acc"]) for c, row in clients.items() if c not in bad]
    assert len(honest) == 3 and summary["honest-personal-acc"] == pytest.approx(np.mean(honest))
    assert summary["attackers-personal-acc"] == pytest.approx(float(clients[1]["personal-acc"]))
    record = json.loads((folder / "robustness.json").read_text())
    assert set(record["by-round"]) == {"1", "2"} and record["attackers"] == bad
    rounds = json.loads((folder / "rounds.json").read_text())
    entries = [e for r in rounds for e in r["extra"].get("robust", [])]
    if attack in ("backdoor", "model-replacement"):
        assert 0.0 <= summary["backdoor-success"] <= 1.0
        assert all("backdoor-success" in r["evaluate"] for r in rounds)
    if attack == "model-replacement":  # the size lie reached the server: the liar's claimed size is recorded
        assert record["claimed-examples"] == 2**31 - 1
    if rule == "fltrust":  # every update got a trust score in [0, 1]
        assert entries and all(len(e["trust"]) == len(e["clients"]) for e in entries)
        assert all(0.0 <= t <= 1.0 for e in entries for t in e["trust"])
    if rule == "bulyan":  # 4 models allow Bulyan no liar (n >= 4f + 3): the one attacker is outside its assumption
        assert all(e["liars"] == 1 and e["tolerated"] == 0 and e["outside-assumption"] for e in entries)
        assert summary["outside-assumption"] == len(entries)
    if method == "ifca" and attack == "side-channel":  # the attacker claims the cluster that fits it worst
        assert set(record["mechanism"]["clusters"]["of-attackers"]) == {"1"}
    if attack == "sign-flip":  # ten times the flipped update is far from every honest model: Multi-Krum drops it
        assert record["rule"]["share-kept"]["attackers"] == 0.0 and summary["attackers-isolated"]["rule"] is True
    if attack == "free-rider":  # the model it was sent, unchanged: an update of norm 0, never clipped
        assert all(dict(zip(e["clients"], e["update-norms"], strict=True))[1] == 0.0 for e in entries)
        assert record["rule"]["share-clipped"]["attackers"] == 0.0
    if method == "fedcac" and attack == "side-channel":  # an all-ones mask overlaps every client fully: not isolated
        assert summary["attackers-isolated"]["collaborators"] is False
    if rule != "mean":
        assert {e["rule"] for e in entries} == {rule}
