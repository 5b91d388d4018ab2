"""Every method resumed from its checkpoint ends in the state of the run that was never interrupted.

Each method's strategy is driven through its own round loop (tests/strategy_harness.py) for all rounds, and
again for the first k rounds only (writing its checkpoint after each, as a run does); a third strategy, built
fresh from the same settings, resumes from that checkpoint and runs the remaining rounds with other node ids
(Flower gives a resumed run new ones).  Replies depend only on (round, phase, client), so the resumed run must
end with the same checkpointed state - the base's part and the method's declared ``state()`` - and write the
same artefacts.  What a method forgets to declare makes its resumed run drift from the uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server_app.app import build_strategy
from strategies.persistence import read_checkpoint
from task.config import parse_settings
from tests.runtime.test_hostile_replies import COMMON, SCENARIOS
from tests.strategy_harness import assert_same_state, drive, snapshot

NODES = {1003: 0, 7: 1, 42: 2, 555: 3}
NEW_NODES = {9: 2, 70001: 0, 31: 3, 12: 1}  # the same clients behind other node ids, in another order


def measured(key) -> bool:
    """What two equal runs cannot share: times, memory, message timing, and bytes (a resumed run first asks
    every node who it is, which the uninterrupted run did not need)."""
    k = str(key)
    return any(w in k for w in ("seconds", "rss", "timing", "bytes", "time-"))


def comparable(tree):
    if isinstance(tree, dict):
        return {k: comparable(v) for k, v in tree.items() if not measured(k)}
    if isinstance(tree, list):
        return [comparable(v) for v in tree]
    return tree


def artefacts(strategy, folder: Path) -> dict[str, object]:
    folder.mkdir()
    strategy.results().write_artifacts(folder)
    return {p.name: comparable(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))}


def as_a_client_would(server_round, node, phase, content):
    """The harness draws every reply's values at random per (round, phase, client); what is a property of the
    client (its planted group) a real client reports the same in every reply, including the identify replies a
    resumed run asks for."""
    metrics = content["metrics"]
    if "planted-cluster" in metrics:
        metrics["planted-cluster"] = int(metrics["partition-id"]) % 2


def settings_of(name: str, rounds: int):
    method, extra, _ = SCENARIOS[name]
    return parse_settings({**COMMON, "method": method, "num-server-rounds": rounds, **extra})


CASES = [
    (name, rounds, k)
    for name, (_, _, scenario_rounds) in sorted(SCENARIOS.items())
    for rounds in [max(scenario_rounds, 2)]
    for k in range(1, rounds)
]


@pytest.mark.parametrize("name,rounds,stop_after", CASES)
def test_a_resumed_method_ends_in_the_state_of_the_uninterrupted_run(name, rounds, stop_after, tmp_path):
    settings = settings_of(name, rounds)
    whole = build_strategy(settings)
    whole.results_dir = tmp_path / "a"  # folder names of one length: the messages' configs name them
    drive(whole, NODES, rounds, as_a_client_would)

    interrupted = build_strategy(settings)
    interrupted.results_dir = tmp_path / "b"
    drive(interrupted, NODES, stop_after, as_a_client_would)
    done, saved = read_checkpoint(tmp_path / "b", settings)
    assert done == stop_after

    resumed = build_strategy(settings)
    resumed.checkpoint.resume(saved, done)
    resumed.results_dir = tmp_path / "b"
    drive(resumed, NEW_NODES, range(stop_after + 1, rounds + 1), as_a_client_would)

    assert [r.server_round for r in resumed.history] == list(range(1, rounds + 1))
    assert resumed.failures == [] and whole.failures == []
    assert_same_state(snapshot(comparable(whole.checkpoint.state())), snapshot(comparable(resumed.checkpoint.state())))
    assert artefacts(resumed, tmp_path / "resumed") == artefacts(whole, tmp_path / "whole")
