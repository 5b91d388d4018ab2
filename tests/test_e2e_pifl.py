"""PI-FL end to end through Flower on two-source digits (10:90): conservation every round, hostile bids
rejected without touching balances, and tiers that specialise by source."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_pifl_tiers_specialise_and_tokens_are_conserved(simulation):
    summary = simulation.run({"method": "pifl", "num-server-rounds": 4, "partition": "two-source", "mixture": "10:90",
                              "min-nodes": 6, "slots-performance": 2, "slots-random": 1, "fault": "badbid@1"},
                             num_supernodes=6)
    folder = Path(summary["results"])
    ledger = json.loads((folder / "pifl_ledger.json").read_text())
    supply = 6 * 100 * ledger["micro-tokens-per-token"]
    for entry in ledger["rounds"]:
        assert entry["total"] == supply
        assert sum(entry["balances"].values()) + sum(t["pool"] for t in entry["tiers"].values()) == supply
        assert min(entry["balances"].values()) >= 0
        if entry["round"] > 1:
            for tier in entry["tiers"].values():
                assert "1" not in tier["payments"] and 1 not in tier["payments"]  # the hostile bidder never pays
    failures = json.loads((folder / "failures.json").read_text())
    assert {f["round"] for f in failures if f["phase"] == "bid"} == {2, 3, 4}
    assert all("unknown tier" in f["reason"] for f in failures)
    last = ledger["rounds"][-1]["tiers"]
    shares = sorted(t["source-a-share"] for t in last.values())
    assert shares[0] < 0.3 and shares[1] > 0.7  # one tier per source on 10:90
    assert summary["personal-acc"] > 0.6
    assert (folder / "pifl_ledger.png").exists()
