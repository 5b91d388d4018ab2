"""Runs that survive a crash, and the models a run leaves behind (issue 15), end to end through Flower.

A run stopped after round k (``stop-after=k``: the ServerApp stops right after that round's checkpoint, as a
crash would) and resumed with ``resume-from`` ends exactly where the same run without the interruption
ends: the same per-round metrics and per-client results.  Flower gives the resumed run new node ids; the
strategy's state is keyed by partition id and each client's state is on disk.  Then each client's saved
personalized model is loaded from its files and scored on that client's test data in the deployed-node
format, giving the accuracy the run reported for that client.
"""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from server_app.runner import RunFailed, results_folder_from_output
from task.config import parse_settings
from task.data import load_client_data
from task.export import load_model, predict_file

pytestmark = pytest.mark.slow

CLIENTS = 3
SMALL = {"num-server-rounds": 3, "min-nodes": CLIENTS, "model": "mlp", "local-epochs": 1, "seed": 3}


def rounds(folder: Path) -> list[dict]:
    return [
        {
            "round": r["round"],
            "train": {k: v for k, v in r["train"].items() if "time" not in k and "rss" not in k},
            "evaluate": r["evaluate"],
        }
        for r in json.loads((folder / "rounds.json").read_text())
    ]


def clients(folder: Path) -> list[dict]:
    with open(folder / "clients.csv") as fh:
        return [{k: v for k, v in row.items() if "time" not in k and "rss" not in k} for row in csv.DictReader(fh)]


def without_measured(tree):
    """Without what two equal runs cannot share: seconds, and byte counts (each message's config names the run's
    results folder, whose name ends in Flower's run id, whose number of digits varies between runs)."""
    if isinstance(tree, dict):
        return {
            k: without_measured(v) for k, v in tree.items() if not any(w in k for w in ("bytes", "seconds", "time"))
        }
    if isinstance(tree, list):
        return [without_measured(v) for v in tree]
    return tree


def stop_and_resume(simulation, cfg: dict, stop_after: int) -> tuple[dict, Path, str]:
    with pytest.raises(RunFailed) as crash:
        simulation.run({**cfg, "stop-after": stop_after}, num_supernodes=CLIENTS)
    folder = results_folder_from_output(crash.value.output) or _folder_of_crashed(crash.value.output)
    assert (folder / "checkpoints" / "LATEST").read_text() == f"round-{stop_after:05d}"
    summary = simulation.run({**cfg, "resume-from": str(folder)}, num_supernodes=CLIENTS)
    assert Path(summary["results"]) == folder  # the resumed run writes into the same folder
    return summary, folder, summary["log"]


def _folder_of_crashed(output: str) -> Path:
    import re

    found = re.findall(r"resume-from='([^']+)'", output)
    assert found, output[-3000:]
    return Path(found[-1])


@pytest.mark.parametrize(
    "method,extra,stop_after",
    [
        ("fedavg", {}, 1),
        ("fedcac", {"beta": 2, "partition": "pathological"}, 2),
        (
            "pfedlia",
            {"warmup-rounds": 1, "partition": "planted-clusters", "num-clusters": 3, "optics-min-samples": 2},
            2,
        ),
        ("pifl", {"partition": "two-source", "slots-performance": 1, "slots-random": 1, "server-set-size": 100}, 2),
    ],
)
def test_a_stopped_and_resumed_run_ends_like_the_uninterrupted_one(simulation, method, extra, stop_after):
    cfg = {**SMALL, "method": method, **extra}
    reference = simulation.run(cfg, num_supernodes=CLIENTS)
    resumed, folder, log = stop_and_resume(simulation, cfg, stop_after)
    ref_folder = Path(reference["results"])
    for key in ("personal-acc", "global-acc", "trained-acc", "personal-loss", "clients", "failures", "rounds"):
        assert resumed[key] == reference[key], key
    assert rounds(folder) == rounds(ref_folder)
    assert clients(folder) == clients(ref_folder)
    resumes = json.loads((folder / "resumes.json").read_text())
    assert [r["after-round"] for r in resumes] == [stop_after]
    if method == "pfedlia":  # the clustering of round 2 is restored, not recomputed
        assert "clustering round" not in log
        assert without_measured(json.loads((folder / "pfedlia_clusters.json").read_text())) == without_measured(
            json.loads((ref_folder / "pfedlia_clusters.json").read_text())
        )
    if method == "pifl":  # tokens are conserved across the resume, round by round as without it
        ledger = json.loads((folder / "pifl_ledger.json").read_text())
        supply = CLIENTS * 100 * ledger["micro-tokens-per-token"]
        assert all(e["total"] == supply for e in ledger["rounds"])
        assert ledger == json.loads((ref_folder / "pifl_ledger.json").read_text())
    # every client's personalized model, from its files, scores on its own test data what the run reported
    settings = parse_settings(cfg)
    reported = {int(row["client"]): float(row["personal-acc"]) for row in clients(folder)}
    for client in range(CLIENTS):
        model_file = folder / "models" / "clients" / f"client-{client}.safetensors"
        _, manifest = load_model(model_file)
        assert manifest["method"] == method and manifest["round"] == SMALL["num-server-rounds"]
        assert manifest["personal-acc"] == pytest.approx(reported[client])
        data = load_client_data(settings.data, client, CLIENTS)
        np.savez(folder / f"test-{client}.npz", x=data.x_test.numpy(), y=data.y_test.numpy())
        assert predict_file(model_file, folder / f"test-{client}.npz")["accuracy"] == pytest.approx(reported[client])
    server_models = sorted(p.name for p in (folder / "models" / "server").glob("*.safetensors"))
    expected = {
        "fedavg": ["global.safetensors"],
        "fedcac": ["global.safetensors"],
        "pfedlia": [f"cluster-{k}.safetensors" for k in range(len(server_models))],
        "pifl": ["tier-0.safetensors", "tier-1.safetensors"],
    }[method]
    assert server_models == expected and server_models
    if method == "fedavg":
        # a folder that does not fit is refused through Flower at once, and the finished run's folder is left as
        # it was (every kind of misfit: tests/test_resume_point.py); the reference run serves as that folder
        before = sorted((p.name, p.stat().st_size) for p in ref_folder.rglob("*"))
        with pytest.raises(RunFailed) as err:
            simulation.run(
                {**cfg, "method": "fedprox", "resume-from": str(ref_folder)}, num_supernodes=CLIENTS, timeout=300
            )
        assert "is a fedavg run" in err.value.output.replace("\n", " ")
        assert sorted((p.name, p.stat().st_size) for p in ref_folder.rglob("*")) == before
