"""FedC2I end to end through Flower: influence vectors and the heatmap are written."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_fedc2i_run_writes_influence(engine):
    summary = engine.run(
        {"method": "fedc2i", "num-server-rounds": 3, "min-nodes": 4, "partition": "iid", "feature-shift": 4},
        num_supernodes=4,
    )
    assert summary["rounds"] == 3 and summary["failures"] == 0 and 0.3 < summary["personal-acc"] <= 1.0
    folder = Path(summary["results"])
    influence = json.loads((folder / "fedc2i_influence.json").read_text())
    assert set(influence) == {"1", "2", "3"}
    assert influence["1"] == {} or all(len(r) == 1 for r in influence["1"].values())
    rows = influence["3"]
    assert len(rows) == 4 and all(len(r) == 4 and abs(sum(r.values()) - 1) < 1e-4 for r in rows.values())
    assert (folder / "fedc2i_influence.png").exists()
    rounds = json.loads((folder / "rounds.json").read_text())
    assert rounds[2]["train"]["time-method"] > 0  # the influence phase is timed separately from training
