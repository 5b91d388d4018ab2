"""A resume folder that does not fit the run fails at once, with the reason, and touches nothing.

The ServerApp's own check (``server_app.app.resume_point``) on a checkpoint written by a real strategy; one
case also goes through Flower end to end (tests/resume/test_e2e.py).
"""

import json
from pathlib import Path

import pytest

from server_app.app import build_strategy, resume_point
from strategies.outcome import RoundLog
from strategies.persistence import write_checkpoint
from task.checkpoint import FORMAT_VERSION, CheckpointError
from task.config import parse_settings

BASE = {"method": "fedavg", "model": "mlp", "num-server-rounds": 4, "min-nodes": 2}


def checkpointed(tmp_path: Path, rounds_done: int = 2, **over) -> Path:
    """A results folder whose strategy checkpointed after ``rounds_done`` rounds."""
    folder = tmp_path / "run"
    settings = parse_settings({**BASE, **over})
    strategy = build_strategy(settings)
    for r in range(1, rounds_done + 1):
        strategy.history.append(RoundLog(r))
        write_checkpoint(folder, r, strategy.checkpoint.state(), settings)
    return folder


def files(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file())


def attempt(folder: Path, **over):
    settings = parse_settings({**BASE, **over, "resume-from": str(folder)})
    return resume_point(settings, build_strategy(settings))


def test_a_fitting_folder_resumes_after_its_last_round(tmp_path):
    folder = checkpointed(tmp_path)
    assert attempt(folder) == (folder, 2)
    # what may change: more rounds, the time limit, saving
    assert attempt(folder, **{"num-server-rounds": 9, "round-timeout": 30.0, "save-every": 2}) == (folder, 2)
    # and how long to wait for the nodes, and for how many: the resumed run may have other nodes
    assert attempt(folder, **{"min-nodes": 5, "node-wait-timeout": 0.0}) == (folder, 2)


@pytest.mark.parametrize(
    "over,reason",
    [
        ({"method": "fedprox"}, "is a fedavg run of model mlp on digits; this run is fedprox / mlp / digits"),
        ({"model": "cnn"}, "this run is fedavg / cnn / digits"),
        ({"dataset": "synth-concept"}, "/ synth-concept"),
        ({"lr": 0.01}, "run-config keys ['lr'] differ from the interrupted run"),
        ({"seed": 1, "partition": "iid"}, "run-config keys ['partition', 'seed'] differ"),
        ({"num-server-rounds": 2}, "the run already finished its 2 rounds; raise num-server-rounds above 2"),
    ],
)
def test_a_folder_of_another_run_is_refused_with_the_reason(tmp_path, over, reason):
    folder = checkpointed(tmp_path)
    before = files(folder)
    with pytest.raises(CheckpointError) as err:
        attempt(folder, **over)
    assert reason in str(err.value)
    assert files(folder) == before


def test_missing_truncated_and_newer_checkpoints_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no such results folder"):
        attempt(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError):
        attempt(tmp_path / "empty")
    folder = checkpointed(tmp_path)
    latest = folder / "checkpoints" / (folder / "checkpoints" / "LATEST").read_text().strip()
    manifest = next(p for p in latest.iterdir() if p.suffix == ".json")
    meta = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**meta, "format-version": FORMAT_VERSION + 1}))
    with pytest.raises(CheckpointError, match="newer"):
        attempt(folder)
    manifest.write_text(json.dumps(meta))
    arrays = next(p for p in latest.iterdir() if p.suffix == ".safetensors")
    arrays.write_bytes(arrays.read_bytes()[: arrays.stat().st_size // 2])
    before = files(folder)
    with pytest.raises(CheckpointError):
        attempt(folder)
    assert files(folder) == before


def test_a_resumed_strategy_asks_every_node_who_it_is_once_before_its_first_round(tmp_path):
    """Node ids change between runs: after a resume the server identifies every node before the first round (so
    each client is sent its own state), and only then."""
    from flwr.app import ConfigRecord

    from server_app.app import build_strategy
    from task.checkpoint import load_checkpoint
    from tests.strategy_harness import (
        ReplayGrid,
        outgoing_messages,
        phase_of,
        reply_message,
        run_round,
        shared_arrays,
        valid_content,
    )

    settings = parse_settings({"model": "mlp", "min-nodes": 2, "num-server-rounds": 4})

    def federation(strategy, client_of):
        def respond(msg):
            node = msg.metadata.dst_node_id
            content = valid_content(strategy.reply_spec(phase_of(msg), node), client_of[node], 1)
            return [reply_message(node, content)]

        return ReplayGrid(client_of, respond)

    first = build_strategy(settings)
    first.results_dir = tmp_path
    with outgoing_messages():
        run_round(first, federation(first, {11: 0, 12: 1}), 1)
    resumed = build_strategy(settings)
    done, state, _ = load_checkpoint(tmp_path / "checkpoints")
    resumed.checkpoint.resume(state, done)
    grid = federation(resumed, {21: 1, 22: 0, 23: 2})  # the same clients on new nodes, and a newcomer later
    grid.nodes = [21, 22]
    with outgoing_messages():
        for r in (2, 3):
            replies = grid.send_and_receive(resumed.configure_train(r, shared_arrays(resumed), ConfigRecord(), grid))
            resumed.aggregate_train(r, replies)
            grid.nodes = [21, 22, 23]
    sent = [(int(m.content["config"]["server-round"]), phase_of(m), m.metadata.dst_node_id) for m in grid.sent]
    assert sent[:2] == [(2, "identify", 21), (2, "identify", 22)]
    assert resumed.client_of == {21: 1, 22: 0, 23: 2}  # the newcomer told it with its train reply
    assert [s for s in sent if s[1] == "identify"] == sent[:2]  # only before the first round it runs
