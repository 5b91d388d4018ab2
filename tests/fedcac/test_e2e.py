"""FedCAC end to end through Flower: artefacts are written, and a client that drops out of a round is
left out of that round's overlap while the run goes on."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_fedcac_run_with_a_dropout_in_round_2(engine):
    summary = engine.run(
        {
            "method": "fedcac",
            "num-server-rounds": 3,
            "min-nodes": 4,
            "beta": 2,
            "partition": "pathological",
            "fault": "crash@2:2",
        },
        num_supernodes=4,
    )
    assert summary["rounds"] == 3 and 0.3 < summary["personal-acc"] <= 1.0
    folder = Path(summary["results"])
    rounds = json.loads((folder / "fedcac_rounds.json").read_text())
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert len(rounds[0]["collaborators"]) == 4 and len(rounds[1]["collaborators"]) == 3
    assert "2" not in rounds[1]["collaborators"]  # the dropped client's stale mask is not in round 2's overlap
    assert len(rounds[2]["collaborators"]) == 4 and rounds[2]["collaborators-max"] == 0  # t > beta
    failures = json.loads((folder / "failures.json").read_text())
    # one message per client and round: the crash of round 2 takes the client's round-2 train message and, with
    # it, its evaluation of round 1; round 2's evaluation rides on round 3's messages, where it answers again
    assert {(f["round"], f["phase"]) for f in failures} == {(2, "train")}
    evaluated = [r["evaluate"]["num-replies"] for r in json.loads((folder / "rounds.json").read_text())]
    assert evaluated == [3, 4, 4]
    comm = json.loads((folder / "fedcac_communication.json").read_text())
    assert comm["mask-to-model-ratio"] <= 1 / 32 + 1e-3
    for name in ("fedcac_overlap.png", "fedcac_collaborators.png", "fedcac_overlap.json", "accuracy.png"):
        assert (folder / name).exists(), name
