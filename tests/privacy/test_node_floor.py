"""A data holder's own floor (node config ``dp-min-noise-multiplier``, ``dp-max-clip``, ``dp-require``): its ClientApp
refuses every message of a run that asks for less - less noise, a larger clip bound, no DP where DP is required - with
a reason that names the node config key and the value the run asked for, before it loads any data; a run at or above
the floor goes on as without one.  Bad floor values are refused naming the key and what is allowed."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

import client_app.app as client_app
from client_app.floor import Floor, NodeConfigError, RunRefused, node_floor
from client_app.privacy import private_reply
from task.config import parse_settings
from task.params import to_record
from tests.in_process import NODE_IDS, NODES, run_in_process

REFUSING = next(node for node, pid in NODE_IDS.items() if pid == 1)


def train_replies(clients: dict[int, list[dict]]) -> list[int]:
    """How many clients sent a train reply in each round, from their own recordings (under DP the server's rounds
    hold no count)."""
    rounds = sorted({r["round"] for recs in clients.values() for r in recs})
    sent = [
        {
            pid
            for pid, recs in clients.items()
            for r in recs
            if r["direction"] == "sent" and r["type"] == "train" and r["round"] == k
        }
        for k in rounds
    ]
    return [len(s) for s in sent]


FLOOR = {"dp-min-noise-multiplier": 1.0, "dp-max-clip": 1.0}


# ---------------------------------------------------------------------------------------------- the node config
@pytest.mark.parametrize(
    "config, expected",
    [
        ({}, Floor()),
        ({"dp-min-noise-multiplier": 2}, Floor(min_noise_multiplier=2.0)),  # --node-config "...=2" is an int
        ({"dp-min-noise-multiplier": "0.5"}, Floor(min_noise_multiplier=0.5)),  # quoted: a string
        ({"dp-max-clip": 0.25}, Floor(max_clip=0.25)),
        ({"dp-require": True}, Floor(require=True)),
        ({"dp-require": "TRUE"}, Floor(require=True)),
        ({"dp-require": "false", "partition-id": 0, "device": "cpu"}, Floor()),  # other node config is not its
    ],
)
def test_a_node_config_sets_its_floor_from_numbers_flags_or_their_spelling_as_strings(config, expected):
    assert node_floor(config) == expected


@pytest.mark.parametrize(
    "config, message",
    [
        ({"dp-min-noise-multiplier": "lots"}, "node config dp-min-noise-multiplier='lots' must be a number >= 0"),
        ({"dp-min-noise-multiplier": -1}, "node config dp-min-noise-multiplier=-1 must be a number >= 0"),
        ({"dp-min-noise-multiplier": True}, "node config dp-min-noise-multiplier=True must be a number >= 0"),
        ({"dp-min-noise-multiplier": math.nan}, "node config dp-min-noise-multiplier=nan must be a number >= 0"),
        ({"dp-max-clip": 0}, "node config dp-max-clip=0 must be a number > 0"),
        ({"dp-max-clip": "inf"}, "node config dp-max-clip='inf' must be a number > 0"),
        ({"dp-require": 1}, "node config dp-require=1 must be true or false"),
        ({"dp-require": "yes"}, "node config dp-require='yes' must be true or false"),
    ],
)
def test_a_bad_floor_value_is_refused_naming_the_key_the_value_and_what_is_allowed(config, message):
    with pytest.raises(NodeConfigError) as err:
        node_floor(config)
    assert str(err.value).startswith(message)


def test_a_misspelt_floor_key_is_refused_rather_than_taken_for_no_floor():
    with pytest.raises(NodeConfigError) as err:
        node_floor({"dp-min-noise": 2.0, "partition-id": 0})
    assert str(err.value) == (
        "node config ['dp-min-noise'] is not a key pflower knows; a data holder's privacy floor is set with "
        "dp-min-noise-multiplier, dp-max-clip, dp-require"
    )


# ---------------------------------------------------------------------------------------------- the verdict
@pytest.mark.parametrize("mode", ["local", "central"])
def test_a_run_at_or_above_the_floor_is_admitted(mode):
    floor = Floor(min_noise_multiplier=1.0, max_clip=1.0, require=True)
    assert floor.refusals(mode, 1.0, 1.0) == []  # exactly at the floor
    assert floor.refusals(mode, 3.0, 0.1) == []


def test_less_noise_than_the_floor_is_refused_naming_the_key_and_the_value_asked_for():
    (reason,) = Floor(min_noise_multiplier=1.5).refusals("local", 0.8, 1.0)
    assert reason == (
        "node config dp-min-noise-multiplier=1.5 is the least noise this node accepts, and the run asks for "
        "dp-noise-multiplier=0.8 (dp-mode='local')"
    )


def test_a_value_just_below_the_floor_is_shown_with_every_digit():
    (reason,) = Floor(min_noise_multiplier=1.0).refusals("local", 0.9999999, 1.0)
    assert "dp-min-noise-multiplier=1 is the least" in reason and "dp-noise-multiplier=0.9999999 (" in reason


def test_under_central_dp_the_refusal_says_the_noise_is_the_servers_as_declared():
    (reason,) = Floor(min_noise_multiplier=1.5).refusals("central", 0.8, 1.0)
    assert reason == (
        "node config dp-min-noise-multiplier=1.5 is the least noise this node accepts, and the run declares "
        "dp-noise-multiplier=0.8 (dp-mode='central': the server adds that noise, which this node cannot see)"
    )


@pytest.mark.parametrize("mode", ["local", "central"])
@pytest.mark.parametrize("clip, asked", [(2.5, "dp-clip=2.5"), (math.inf, "dp-clip=0 (no clipping)")])
def test_a_larger_clip_bound_than_the_floor_or_none_is_refused(mode, clip, asked):
    (reason,) = Floor(max_clip=2.0).refusals(mode, 1.0, clip)
    assert reason == (
        f"node config dp-max-clip=2 is the largest clip bound this node accepts, and the run asks for {asked}"
    )


@pytest.mark.parametrize("floor", [Floor(require=True), Floor(min_noise_multiplier=0.1), Floor(max_clip=10.0)])
def test_any_floor_refuses_a_run_without_dp(floor):
    (reason,) = floor.refusals("off", 0.0, math.inf)
    (setting,) = floor.set_keys()
    assert reason == (
        f"node config {setting} needs differential privacy, and the run asks for no differential privacy "
        "(dp-mode='off')"
    )
    assert Floor().refusals("off", 0.0, math.inf) == []  # no floor: any run


@pytest.mark.parametrize(
    "noise, clip, asked",
    [(0.0, 1.0, "dp-noise-multiplier=0 (no noise)"), (1.0, math.inf, "dp-clip=0 (no clipping)")],
)
def test_dp_required_refuses_dp_settings_that_give_no_guarantee(noise, clip, asked):
    (reason,) = Floor(require=True).refusals("local", noise, clip)
    assert reason == f"node config dp-require=true needs a guarantee, and the run asks for {asked} (dp-mode='local')"


def test_every_reason_is_given_at_once():
    floor = Floor(min_noise_multiplier=2.0, max_clip=0.5, require=True)
    assert [r.split(" is ")[0].split(" needs ")[0] for r in floor.refusals("local", 0.0, 1.0)] == [
        "node config dp-min-noise-multiplier=2",
        "node config dp-max-clip=0.5",
        "node config dp-require=true",
    ]
    assert [r.split(" needs ")[0] for r in floor.refusals("off", 0.0, math.inf)] == [
        "node config dp-require=true",
        "node config dp-min-noise-multiplier=2",
        "node config dp-max-clip=0.5",
    ]


# ---------------------------------------------------------------------------------------------- the ClientApp
def _message(kind: str = "train", server_round: int = 1) -> Any:
    content = RecordDict({"config": ConfigRecord({"server-round": server_round})})
    return SimpleNamespace(content=content, metadata=SimpleNamespace(message_type=kind))


def _context(node_config: dict, **run_config: Any) -> Context:
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config=run_config)


RUNS_BELOW = [
    ({"method": "fedc2i", "dp-mode": "local", "dp-noise-multiplier": 0.5}, "dp-min-noise-multiplier=1", "=0.5"),
    ({"method": "pfedlia", "dp-mode": "local", "dp-clip": 4.0}, "dp-max-clip=1", "dp-clip=4"),
    ({"method": "fedavg", "dp-mode": "central", "dp-noise-multiplier": 0.3}, "dp-min-noise-multiplier=1", "=0.3"),
    ({"method": "fedavg"}, "dp-min-noise-multiplier=1", "dp-mode='off'"),
]


@pytest.mark.parametrize("run, key, asked", RUNS_BELOW)
@pytest.mark.parametrize("kind", ["train", "evaluate", "query.identify"])
def test_the_clientapp_refuses_every_message_of_a_run_below_its_floor_before_loading_data(run, key, asked, kind):
    """The node config names no data at all: a handler that got as far as loading data would fail on that first;
    the refusal comes before, with the node config key and the value the run asked for."""
    context = _context(FLOOR, **run)
    handler = client_app.train if kind == "train" else client_app.evaluate
    if kind.startswith("query."):
        handler = client_app._query_handler("identify")
    with pytest.raises(RunRefused) as err:
        handler(_message(kind), context)
    assert str(err.value).startswith("this node refuses the run: node config ")
    assert key in str(err.value) and asked in str(err.value)


def test_in_a_federation_the_node_with_a_floor_refuses_and_the_others_train(tmp_path):
    """Real clients of a local-DP FedC2I run (tests/in_process.py): the node whose floor asks for more noise than the
    run refuses every message, the server records each refusal with the node config key and the value asked for,
    and the round goes on with the others."""
    floors = {1: {"dp-min-noise-multiplier": 2.0}}
    strategy, _, clients, _ = run_in_process("fedc2i", tmp_path, floors, **{"dp-mode": "local"})
    failed = strategy.gate.failures
    assert {(f["round"], f["node-id"]) for f in failed} >= {(1, REFUSING), (2, REFUSING)}
    assert {f["node-id"] for f in failed} == {REFUSING}
    assert all(
        "this node refuses the run: node config dp-min-noise-multiplier=2 is the least noise this node accepts, "
        "and the run asks for dp-noise-multiplier=1 (dp-mode='local')" in f["reason"]
        for f in failed
    )
    assert sorted(clients) == [0, 2]  # the refusing node never got as far as its handler's recording
    assert train_replies(clients) == [2, 2]


def test_a_run_that_meets_every_nodes_floor_is_served_as_without_one(tmp_path):
    floor = {"dp-min-noise-multiplier": 1.0, "dp-max-clip": 1.0, "dp-require": True}
    run = {"dp-mode": "central", "dp-noise-multiplier": 1.0, "dp-clip": 0.5}
    strategy, _, clients, _ = run_in_process("fedavg", tmp_path, dict.fromkeys(range(NODES), floor), **run)
    assert strategy.gate.failures == [] and sorted(clients) == list(range(NODES))
    assert train_replies(clients) == [NODES, NODES]


@pytest.mark.parametrize("method,mode", [("fedavg", "central"), ("fedc2i", "local")])
def test_a_node_refuses_every_round_whose_declared_noise_falls_short_also_under_a_target_epsilon(
    tmp_path, method, mode
):
    """With dp-target-epsilon the server calibrates the noise itself; the run config's dp-noise-multiplier says
    nothing.  Every round's messages declare the multiplier the server applies (central) or the client must (local),
    and a node whose floor is above it refuses the round, naming the declared value; a floor below it is served."""
    run = {"dp-mode": mode, "dp-target-epsilon": 1000.0, "dp-noise-multiplier": 5.0}
    floor = {"dp-min-noise-multiplier": 1.0, "dp-require": True}
    (tmp_path / "strict").mkdir()
    strategy, _, clients, _ = run_in_process(method, tmp_path / "strict", {1: floor}, **run)
    sigma = strategy.privacy.noise_multiplier
    assert sigma < 0.1  # epsilon 1,000 over two rounds: little noise
    failed = strategy.gate.failures
    assert {f["node-id"] for f in failed} == {REFUSING} and {f["round"] for f in failed} == {1, 2}
    where = "declares" if mode == "central" else "asks for"
    assert all(
        f"this node refuses round {f['round']}: node config dp-min-noise-multiplier=1 is the least noise this node "
        f"accepts, and the run {where} dp-noise-multiplier={sigma!r}" in f["reason"]
        for f in failed
    )
    assert train_replies(clients) == [NODES - 1, NODES - 1]
    lenient = {"dp-min-noise-multiplier": sigma / 2, "dp-require": True}
    (tmp_path / "lenient").mkdir()
    strategy, _, clients, _ = run_in_process(method, tmp_path / "lenient", {1: lenient}, **run)
    assert strategy.gate.failures == [] and train_replies(clients) == [NODES, NODES]


def test_a_bad_floor_value_fails_every_message_with_its_reason():
    with pytest.raises(NodeConfigError, match=r"node config dp-max-clip='big' must be a number > 0"):
        client_app.train(_message(), _context({"dp-max-clip": "big"}, method="fedavg"))


@pytest.mark.parametrize("name,mode", [("fedc2i", "local"), ("fedavg", "central")])
def test_nothing_leaves_with_less_than_the_floor_whatever_the_privacy_step_is_given(name, mode):
    """The privacy step checks the values it releases with against the node's floor, not only the run config the
    ClientApp admitted: a reply about to leave with less noise than the floor is refused, saying whose noise it is."""
    settings = parse_settings({"method": name, "dp-mode": mode, "dp-noise-multiplier": 0.5})
    method = SimpleNamespace(
        settings=settings,
        context=SimpleNamespace(node_config={"dp-min-noise-multiplier": 1.0}),
        release_reference=lambda content: {"w": np.zeros(3, np.float32)},
    )
    reply = RecordDict({"arrays": to_record({"w": np.ones(3, np.float32)})})
    declared = ConfigRecord({"server-round": 1, "dp-noise-multiplier": 0.5, "dp-clip": 1.0})  # what the round declares
    with pytest.raises(RunRefused) as refused:
        private_reply(method, reply, RecordDict({"config": declared}))
    where = (
        "declares dp-noise-multiplier=0.5 (dp-mode='central': the server adds that noise, which this node cannot see)"
        if mode == "central"
        else "asks for dp-noise-multiplier=0.5 (dp-mode='local')"
    )
    assert str(refused.value) == (
        "this node refuses to send the reply: node config dp-min-noise-multiplier=1 is the least noise this node "
        f"accepts, and the run {where}"
    )
