"""Central DP against the adversaries docs/privacy.md names, in the runs that are not the tidy default: each test
plays an attack a reader of the results or a client can run, and finds nothing.

- A client knows the run config, seed included: under DP it still cannot tell who was drawn into a cohort
  (amplification by sampling assumes it cannot); without DP the seed repeats the cohorts, as it always did.
- A resumed run repeats the rounds after its checkpoint.  If a repeated round released a different noisy view of its
  mean (same noise, another cohort), four clients in the first release and three in the repeat would give away the
  fourth client's update as ``4 r1 - 3 r2``.
- A reader of the results folder, the checkpoints and the logs must find no statistic of the clients' updates that
  was not noised (the largest update norm used to be in rounds.json).
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from server_app.app import build_strategy
from server_app.results import ResultsWriter
from strategies.exchange import RunAborted
from strategies.persistence import read_checkpoint
from task.config import parse_settings
from task.params import to_record
from tests.strategy_harness import drive

# ---------------------------------------------------------------------------------------------- secret cohorts
POPULATION = {100 + i: i for i in range(20)}
COHORT_RUN = {"method": "fedavg", "model": "mlp", "fraction-train": 0.25, "min-nodes": 20, "num-server-rounds": 3}


def cohorts(cfg: dict) -> list[list[int]]:
    """The clients each round of a run with ``cfg`` trained, as the run drew them."""
    strategy = build_strategy(parse_settings(cfg))
    grid = drive(strategy, POPULATION, 3)
    drawn: dict[int, list[int]] = {}
    for m in grid.sent:
        if m.metadata.message_type == "train":
            drawn.setdefault(int(m.content["config"]["server-round"]), []).append(POPULATION[m.metadata.dst_node_id])
    return [sorted(drawn[r]) for r in sorted(drawn)]


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_under_dp_the_cohorts_cannot_be_computed_from_the_run_config(sampling):
    cfg = {**COHORT_RUN, "dp-mode": "central", "seed": 3, "dp-sampling": sampling}
    run = cohorts(cfg)
    if sampling == "fixed":
        assert [len(c) for c in run] == [5, 5, 5]
    # the adversary runs the same code with the same run config (every client receives it): another draw
    replayed = cohorts(cfg)
    assert replayed != run  # 3 rounds of 20 clients: the same draw by chance has probability below 1e-12


def test_under_dp_each_client_is_drawn_by_the_operating_systems_csprng(monkeypatch):
    """Under DP the draw is the operating system's CSPRNG itself (``secrets.SystemRandom``): what it returns decides
    who is in the round, and nothing of it lives in the process (no seed, no state a checkpoint could keep).  With
    the OS answering all zeros every client is drawn, all ones none (Poisson sampling, the default)."""
    import random

    strategy = build_strategy(parse_settings({**COHORT_RUN, "dp-mode": "central"}))
    assert isinstance(strategy.rng, random.SystemRandom) and strategy.checkpoint.state()["base"]["rng"] is None
    drawn = []
    for byte, server_round in ((b"\x00", 1), (b"\xff", 2)):
        monkeypatch.setattr(random, "_urandom", lambda n, byte=byte: byte * n)
        grid = drive(strategy, POPULATION, [server_round])
        drawn.append(sum(m.metadata.message_type == "train" for m in grid.sent))
    assert drawn == [20, 0]
    assert strategy.history[-1].extra["dp"]["noised-rounds"] == 2  # nobody drawn: the round still releases noise


def test_without_dp_the_cohorts_repeat_from_the_seed():
    cfg = {**COHORT_RUN, "seed": 3}
    assert cohorts(cfg) == cohorts(cfg)
    assert cohorts({**cfg, "seed": 4}) != cohorts(cfg)


# ---------------------------------------------------------------------------------------------- resume
NODES = {11: 0, 12: 1, 13: 2, 14: 3}  # client 3 (node 14) is the one the adversary wants
CLIP = 1.0


def central(**over):
    cfg = {"method": "fedavg", "model": "mlp", "dp-mode": "central", "dp-clip": CLIP, "min-nodes": 3}
    return parse_settings({**cfg, "num-server-rounds": 4, "checkpoint-every": 2, **over})


def updates_of(shapes: dict[str, tuple[int, ...]]) -> dict[int, dict[str, np.ndarray]]:
    """Each client's update, within the clip bound (so clipping leaves it as it is): known to the adversary for
    clients 0-2 (it controls them), secret for client 3."""
    out = {}
    for client in range(4):
        rng = np.random.default_rng(100 + client)
        update = {k: rng.normal(size=s) for k, s in shapes.items()}
        norm = math.sqrt(sum(float(np.sum(v**2)) for v in update.values()))
        out[client] = {k: (v * 0.8 / norm).astype(np.float32) for k, v in update.items()}
    return out


def answering_with(strategy, updates):
    """Replies whose model is the round's global model plus the client's update."""

    def answer(server_round, node, phase, content):
        if phase == "train":
            client = int(content["metrics"]["partition-id"])
            keys = strategy.released_keys()
            content["arrays"] = to_record({k: strategy.global_state[k] + updates[client][k] for k in keys})

    return answer


def test_a_resumed_round_releases_nothing_that_reconstructs_one_clients_update(tmp_path):
    """Rounds 1-2 and a checkpoint; round 3 releases r1 from all four clients (it goes out with round 4's train
    messages); the run crashes in round 4, before its checkpoint.  Resumed from round 2, round 3 runs again without
    client 3: its release r2 must be r1 again, so that ``4 r1 - 3 r2`` is r1, not client 3's update."""
    settings = central()
    first = build_strategy(settings)
    first.results_dir = tmp_path
    keys = first.released_keys()
    updates = updates_of({k: first.global_state[k].shape for k in keys})
    drive(first, NODES, [1, 2], answering_with(first, updates))
    reference = {k: first.global_state[k].copy() for k in keys}
    drive(first, NODES, [3], answering_with(first, updates))
    r1 = {k: first.global_state[k].copy() for k in keys}

    done, saved = read_checkpoint(tmp_path, central(**{"resume-from": str(tmp_path)}))
    assert done == 2  # checkpoint-every 2: round 3's release is not in the checkpoint
    resumed = build_strategy(central(**{"resume-from": str(tmp_path)}))
    resumed.checkpoint.resume(saved, done)
    resumed.results_dir = tmp_path
    for k in keys:
        np.testing.assert_array_equal(resumed.global_state[k], reference[k])
    three = {n: c for n, c in NODES.items() if c != 3}
    drive(resumed, three, [3], answering_with(resumed, updates))
    r2 = {k: resumed.global_state[k] for k in keys}

    reconstruction = np.concatenate([(4 * (r1[k] - reference[k]) - 3 * (r2[k] - reference[k])).ravel() for k in keys])
    secret = np.concatenate([updates[3][k].ravel() for k in keys])
    assert np.linalg.norm(reconstruction - secret) > 10 * np.linalg.norm(secret)  # the noise, not the update
    for k in keys:  # the repeat is the very release that may have left: nothing new to compare it with
        np.testing.assert_array_equal(r2[k], r1[k])
    dp = resumed.history[-1].extra["dp"]
    assert dp["replayed"] and dp["noised-rounds"] == 3  # the repeat is the one release of round 3, charged once


# ---------------------------------------------------------------------------------------------- the results
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")


def numbers_in(text: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(text)]


def test_nothing_a_dp_run_writes_holds_an_un_noised_statistic_of_the_updates(tmp_path, caplog):
    """Four clients with updates of known, distinct norms (all below the clip bound) over two rounds; every file of
    the results folder (rounds, summary, checkpoints, journal, server models) and every log line is searched for
    any of those norms, their mean and their largest, and every saved array for the un-noised mean."""
    settings = central(**{"results-dir": str(tmp_path), "num-server-rounds": 2, "checkpoint-every": 1})
    strategy = build_strategy(settings)
    writer = ResultsWriter(settings, run_id=7)
    strategy.results_dir = writer.folder
    keys = strategy.released_keys()
    updates = updates_of({k: strategy.global_state[k].shape for k in keys})
    scales = {0: 0.3137, 1: 0.4271, 2: 0.5519, 3: 0.6733}
    for c, s in scales.items():
        updates[c] = {k: v * np.float32(s / 0.8) for k, v in updates[c].items()}
    norms = [math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in updates[c].values())) for c in scales]
    secrets_ = [*norms, max(norms), float(np.mean(norms))]
    mean_update = {k: np.mean([updates[c][k] for c in scales], axis=0) for k in keys}
    with caplog.at_level(logging.DEBUG):
        before = {k: strategy.global_state[k].copy() for k in keys}
        drive(strategy, NODES, [1], answering_with(strategy, updates))
        un_noised = {k: before[k] + mean_update[k] for k in keys}
        drive(strategy, NODES, [2], answering_with(strategy, updates))
        writer.write(strategy.results(), 1.0)
    found = []
    texts = {"log": caplog.text}
    for path in writer.folder.rglob("*"):
        if path.suffix in (".json", ".csv", ".txt", ".jsonl"):
            texts[str(path)] = path.read_text()
        elif path.suffix == ".safetensors":
            for name, array in load_file(str(path)).items():
                if name in un_noised and np.allclose(array, un_noised[name], atol=1e-3):
                    found.append(f"{path}: {name} is the un-noised mean")
    assert any("rounds.json" in p for p in texts)
    for where, text in texts.items():
        for x in numbers_in(text):
            found += [f"{where}: {x}" for s in secrets_ if x == pytest.approx(s, rel=1e-6)]
    assert not found
    assert any("dp-journal" in p for p in texts)  # the journal was searched too
    rounds = json.loads((writer.folder / "rounds.json").read_text())
    assert all(k not in r["extra"]["dp"] for r in rounds for k in ("largest-update-norm", "update-norms"))
    assert all(Path(p).name != "largest-update-norm" for p in texts)


def test_a_journaled_release_taken_against_another_model_is_refused_not_replaced(tmp_path):
    """A resumed run whose checkpoint does not lead to the journaled round (a journal of another run, a hand-edited
    checkpoint) would release a second, different view of that round: it stops instead."""
    first = build_strategy(central())
    first.results_dir = tmp_path
    drive(first, NODES, [1, 2, 3])  # checkpoint after round 2, round 3 journaled
    entry = tmp_path / "checkpoints" / "dp-journal" / "round-00003.json"
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "reference": "0" * 64}))
    done, saved = read_checkpoint(tmp_path, central(**{"resume-from": str(tmp_path)}))
    resumed = build_strategy(central(**{"resume-from": str(tmp_path)}))
    resumed.checkpoint.resume(saved, done)
    resumed.results_dir = tmp_path
    with pytest.raises(RunAborted, match=r"round 3's release in .* was taken against another model"):
        drive(resumed, NODES, [3])


def test_what_a_dp_run_publishes_holds_no_single_clients_value_only_means(tmp_path):
    """Every reply carries metrics in the clear: each client's accuracy, loss, timings, memory and number of
    examples.  Under DP the results folder (rounds, summary, clients.csv, the checkpoints) holds none of one client's
    values, nor an extreme or a spread over clients (the worst client is one client): only means, which
    ``dp-uncovered`` in summary.json names as not covered by epsilon."""
    settings = central(**{"results-dir": str(tmp_path), "num-server-rounds": 2, "checkpoint-every": 1})
    strategy = build_strategy(settings)
    writer = ResultsWriter(settings, run_id=8)
    strategy.results_dir = writer.folder
    keys = strategy.released_keys()
    updates = updates_of({k: strategy.global_state[k].shape for k in keys})
    per_client = {
        c: {
            "personal-acc": 0.6131 + 0.0417 * c,
            "global-acc": 0.5029 + 0.0313 * c,
            "personal-loss": 1.2345 + 0.1111 * c,
            "global-loss": 1.4321 + 0.0999 * c,
            "train-loss": 0.8765 + 0.0123 * c,
            "time-train": 3.4567 + 1.1 * c,
            "peak-rss-mb": 512.25 + 37.5 * c,
            "num-examples": 101 + 17 * c,
        }
        for c in NODES.values()
    }
    model = answering_with(strategy, updates)

    def answer(server_round, node, phase, content):
        model(server_round, node, phase, content)
        client = NODES[node]
        for name in ("metrics", "evaluation"):
            if name in content.metric_records:
                record = content[name]
                for k, v in per_client[client].items():
                    if k in record:
                        record[k] = v

    drive(strategy, NODES, 2, answer)
    writer.write(strategy.results(), 1.0)
    values = {f"client {c} {k}": float(v) for c, m in per_client.items() for k, v in m.items()}
    for k in per_client[0]:
        column = [float(m[k]) for m in per_client.values()]
        values |= {f"max {k}": max(column), f"min {k}": min(column), f"std {k}": float(np.std(column))}
    found = []
    for path in writer.folder.rglob("*"):
        if path.suffix in (".json", ".csv", ".txt", ".jsonl"):
            numbers = numbers_in(path.read_text())
            found += [f"{path.name}: {name}" for name, v in values.items() for x in numbers if x == pytest.approx(v)]
    assert not found
    assert not (writer.folder / "clients.csv").exists()
    rounds = json.loads((writer.folder / "rounds.json").read_text())
    # how many were in a training round is the cohort's size (Poisson sampling keeps it secret); the last round's
    # evaluation, a phase of its own over every node, keeps its counts for the coverage check
    assert all("num-replies" not in r["train"] and "num-asked" not in r["train"] for r in rounds)
    assert "num-replies" not in rounds[0]["evaluate"] and rounds[-1]["evaluate"]["num-replies"] == len(NODES)
    summary = json.loads((writer.folder / "summary.json").read_text())
    assert summary["personal-acc"] == pytest.approx(np.mean([m["personal-acc"] for m in per_client.values()]))
    assert "personal-acc" in summary["dp-uncovered"] and "personal-acc-min" not in summary
