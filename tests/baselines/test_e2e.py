"""End-to-end Flower runs on the engine (Flower's simulation runtime in the test process, held to flwr run by
tests/engine/test_equality.py): two rounds of every baseline."""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.event_files import check_event_files_match_rounds_json

pytestmark = pytest.mark.slow

# FedProx, FedPer, FedRep and FedRoD differ from FedAvg only inside the client (what it trains and keeps,
# pinned by tests/baselines/test_client.py); their two-round Flower runs (about 18 s each on 2 cores) run with
# `-m extended` to keep the default command inside CI's 20 minutes
_EXTENDED = pytest.mark.extended
BASELINES = [
    "local",
    "fedavg",
    pytest.param("fedprox", marks=_EXTENDED),
    pytest.param("fedper", marks=_EXTENDED),
    pytest.param("fedrep", marks=_EXTENDED),
    pytest.param("fedrod", marks=_EXTENDED),
    "ditto",
    "cfl",
    "fedbn",  # the default model (cnn) has two BatchNorm layers, which stay on the clients
]

#: the baselines with one model shared by every client (FedRoD: its generic head; Ditto: the global model it
#: regularises towards)
GLOBAL_MODEL = {"fedavg", "fedprox", "fedrod", "ditto"}


@pytest.mark.parametrize("method", BASELINES)
def test_two_rounds(engine, method):
    extra = {"cfl-min-rounds": 1} if method == "cfl" else {}  # a split may come in a two-round run
    summary = engine.run({"method": method, "num-server-rounds": 2, "min-nodes": 4, **extra}, num_supernodes=4)
    assert summary["rounds"] == 2 and summary["clients"] == 4 and summary["failures"] == 0
    assert 0.3 < summary["personal-acc"] <= 1.0  # far above chance (0.1) after two rounds on digits
    folder = Path(summary["results"])
    for name in ("config.json", "rounds.json", "rounds.csv", "clients.csv", "accuracy.png", "summary.json"):
        assert (folder / name).exists(), name
    rounds = json.loads((folder / "rounds.json").read_text())
    assert [r["round"] for r in rounds] == [1, 2]
    # TensorBoard's curves are rounds.json's numbers (tensorboard --logdir <results-dir>)
    watched = check_event_files_match_rounds_json(folder)
    assert [step for step, _ in watched["eval/personal-acc-min"]] == [1, 2]  # the worst client, round by round
    comm = rounds[0]["extra"]["comm"]
    # one message per client in round 1: its evaluation rode on round 2's train messages ...
    assert comm["train-bytes-up"] > 0 and "evaluate-bytes-up" not in comm and "evaluate-bytes-down" not in comm
    assert rounds[0]["evaluate"]["num-replies"] == 4 and 0.1 < rounds[0]["evaluate"]["personal-acc"] <= 1.0
    # ... and the last round, which has no next round, keeps its own evaluate phase
    assert rounds[-1]["extra"]["comm"]["evaluate-bytes-up"] > 0 and rounds[-1]["evaluate"]["num-replies"] == 4
    timing = rounds[0]["extra"]["message-timing"]["train"]  # where the messages' time went
    assert timing["messages"] == 4 and timing["total"] >= timing["work"] > 0
    if method != "local":
        assert comm["train-bytes-down"] > 4 * 4 * 30_000  # four clients, >= 30k float32 parameters each
    # a shared global model is scored too, where the method has one (Local, FedPer, FedRep, CFL, FedBN have none)
    assert ("global-acc" in rounds[-1]["evaluate"]) == (method in GLOBAL_MODEL)
    if method == "fedbn":  # each client's saved personalized model: the same averaged layers, its own BatchNorm
        saved = [load_file(str(p)) for p in sorted((folder / "models" / "clients").glob("client-*.safetensors"))]
        assert len(saved) == 4 and not (folder / "models" / "server").exists()
        bn = [k for k in saved[0] if k.startswith(("conv.1.", "conv.4."))]
        assert len(bn) == 10 and len(saved[0]) == 16
        for other in saved[1:]:
            assert all(np.array_equal(saved[0][k], other[k]) for k in saved[0] if k not in bn)
            assert not np.allclose(saved[0]["conv.1.running_mean"], other["conv.1.running_mean"])
    if method == "cfl":  # the summary names the clusters CFL ended with (one: the run was FedAvg)
        assignment = json.loads((folder / "cfl_clusters.json").read_text())["assignment"]
        clusters = len(set(assignment.values()))
        assert summary["clusters"] == clusters and (clusters == 1) == summary["clustering"].startswith("1 cluster:")
        assert f", 4 clients, {summary['clustering']}, personalized acc" in summary["log"]
    else:
        assert "clusters" not in summary


def test_bad_replies_are_rejected_the_run_goes_on_and_fails_where_its_means_speak_for_too_few_clients(engine):
    """Three of four clients send bad train replies (NaN, a wrong shape, a crash): each is rejected and every round
    runs with the one good update; at the end the accuracy after local training speaks for 1 of the 4 clients, less
    than min-coverage (0.5), so the run ends as failed (exit 5 from python -m server_app.job), and the evaluation of 3
    of the 4 says so beside each accuracy."""
    from server_app.job import Exit, outcome
    from server_app.runner import RunFailed, results_folder_from_output

    with pytest.raises(RunFailed, match="the run stopped early: the last round's training") as err:
        engine.run(
            {"method": "fedavg", "num-server-rounds": 2, "min-nodes": 4, "fault": "nan@1,shape@2,crash@3"},
            num_supernodes=4,
        )
    folder = results_folder_from_output(err.value.output)
    assert folder is not None
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["aborted"].startswith(
        "the last round's training (the accuracy after local training) covers 1 of 4 clients: less than "
        "min-coverage=0.5 of the clients asked"
    )
    assert summary["coverage"]["by-mean"] == {
        "evaluation": {"covered": 3, "total": 4},
        "training": {"covered": 1, "total": 4},
    }
    assert f"personalized acc {summary['personal-acc']:.4f} over 3 of 4 clients (" in err.value.output
    assert outcome(0, err.value.output, summary)[0] == Exit.ABORTED
    failures = json.loads((folder / "failures.json").read_text())
    reasons: dict[tuple[int, str], list[str]] = {(f["round"], f["phase"]): [] for f in failures}
    for f in failures:
        reasons[(f["round"], f["phase"])].append(f["reason"])
    for rnd in (1, 2):
        train = " | ".join(reasons[(rnd, "train")])
        assert "non-finite" in train and "has shape" in train and "injected crash" in train
    # round 1's evaluation rode on round 2's train messages (rejected with them); round 2 has its own phase
    assert (1, "evaluate") not in reasons and "injected crash" in " ".join(reasons[(2, "evaluate")])
    assert summary["failures"] == 7  # 3 train rejections per round + 1 evaluate rejection in the last round
    assert 0.3 < summary["personal-acc"] <= 1.0  # the healthy client's model kept learning


def test_unknown_method_fails_with_a_clear_message(engine):
    from server_app.runner import RunFailed

    with pytest.raises(RunFailed, match=r"run-config key 'method' must be one of \[.*\], got 'nosuch'"):
        engine.run({"method": "nosuch", "num-server-rounds": 1}, num_supernodes=2, timeout=300)


def test_a_run_whose_every_reply_fails_the_same_way_stops_with_that_reason(engine, tmp_path):
    # the server cannot see the clients' disks: every client fails on the missing data-dir in round 1, and the
    # run stops there with that reason and a non-zero exit instead of running nine empty rounds
    from server_app.runner import RunFailed

    with pytest.raises(RunFailed) as err:
        engine.run(
            {
                "method": "fedavg",
                "dataset": "mnist",
                "partition": "iid",
                "num-server-rounds": 10,
                "min-nodes": 2,
                "data-dir": str(tmp_path / "no-such-mnist"),
            },
            num_supernodes=2,
            timeout=600,
        )
    text = err.value.output
    assert "round 1: every train reply failed for the same reason" in text and "does not exist" in text
    from server_app.runner import results_folder_from_output

    folder = results_folder_from_output(err.value.output)
    assert folder is not None, err.value.output
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 1 and "does not exist" in summary["aborted"]
    # flwr run exits 0 here; `python -m server_app.job` reads the run as aborted (exit 5)
    from server_app.job import Exit, outcome

    assert outcome(0, text, summary)[0] == outcome(0, text)[0] == Exit.ABORTED
