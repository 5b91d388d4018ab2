"""A hostile reply never changes a strategy's state.

Every strategy is driven through its own round loop - configure/aggregate of train and evaluate and every
``query.*`` phase it sends - over a :class:`ReplayGrid` whose replies are made from the strategy's own
reply specs.  Hypothesis picks one reply of the run and one way to break it (NaN, inf, huge, negative, out
of range, wrong length or type, missing key or record, wrong shape or dtype, a repeated element, a
duplicate reply, a partition id that belongs to another node).  The run with that reply must end in
exactly the state of the same run in which that node never answered (or, for a duplicate, answered once).
"""

from __future__ import annotations

import copy
import functools
import itertools
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from flwr.app import MetricRecord, RecordDict, UserConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_app.app import build_strategy
from task.config import parse_settings
from task.methods import METHODS
from tests.strategy_harness import (
    ReplayGrid,
    assert_same_state,
    corruptions,
    outgoing_messages,
    phase_of,
    reply_message,
    run_round,
    snapshot,
    valid_content,
)

NODES = [1003, 7, 42, 555]  # Flower's node ids are arbitrary; clients are their partition ids
CLIENT_OF = {n: i for i, n in enumerate(NODES)}
COMMON: UserConfig = {"dataset": "digits", "model": "mlp", "min-nodes": 4, "local-epochs": 1}

# (method, extra run config, rounds): every method, with settings that reach its defining phases quickly
SCENARIOS: dict[str, tuple[str, UserConfig, int]] = {
    "local": ("local", {}, 2),
    "fedavg": ("fedavg", {"fraction-train": 0.5}, 2),
    "fedprox": ("fedprox", {}, 1),
    "fedper": ("fedper", {}, 2),
    "fedrep": ("fedrep", {}, 1),
    "lgfedavg": ("lgfedavg", {}, 2),
    "fedbn": ("fedbn", {"model": "cnn"}, 2),  # the mlp has no normalisation layer
    "fedrod": ("fedrod", {}, 1),
    "ditto": ("ditto", {}, 1),
    "moon": ("moon", {}, 1),
    "fedcac": ("fedcac", {"beta": 2, "fedcac-diagnostics": True}, 3),
    "fedc2i": ("fedc2i", {}, 3),
    "fedc2i-peers": ("fedc2i", {"c2i-peers": 2, "c2i-variant": "class-level-averaged-extractor"}, 3),
    "pfedlia": ("pfedlia", {"warmup-rounds": 1, "optics-min-samples": 2}, 3),
    "pfedlia-p2p": ("pfedlia", {"warmup-rounds": 1, "lia-mode": "p2p"}, 3),
    "oracle": ("oracle", {"warmup-rounds": 1, "partition": "planted-clusters"}, 3),
    "cfl": ("cfl", {"cfl-min-rounds": 1, "cfl-eps1": 1e9, "cfl-eps2": 0.0}, 3),
    "pifl": (  # the ledger's price and refund rules off their defaults: a resume keeps them
        "pifl",
        {
            "slots-performance": 1,
            "slots-random": 1,
            "server-set-size": 50,
            "slot-price": 2.5,
            "max-refund": 0.5,
            "full-use-gain": 0.2,
        },
        3,
    ),
    "pifl-ni": ("pifl-ni", {"slots-performance": 1, "slots-random": 0, "server-set-size": 50, "eval-every": 2}, 3),
    "ifca": ("ifca", {}, 2),
    "fedsoft": ("fedsoft", {"fedsoft-clients-per-cluster": 2, "fedsoft-estimate-every": 1}, 2),
    "client2vec": (  # Eq. 1's temperature, H's decay and Eq. 3's temperature off their defaults: a resume keeps them
        "client2vec",
        {
            "fraction-train": 0.5,
            "c2v-ign-epochs": 1,
            "c2v-ign-upload": 4,
            "c2v-tau": 0.3,
            "c2v-gamma": 0.2,
            "c2v-lambda1": 0.5,
        },
        2,
    ),
    "client2vec-federated": (
        "client2vec",
        {"c2v-ign-mode": "federated", "c2v-ign-fraction": 0.5, "c2v-ign-epochs": 2, "c2v-local": False},
        2,
    ),
}


def test_every_method_has_a_scenario():
    assert {m for m, _, _ in SCENARIOS.values()} == set(METHODS)


def run(name: str, tamper=None):
    """Run a scenario; ``tamper(i, node, phase, content) -> list of reply contents or None`` edits reply i."""
    method, extra, rounds = SCENARIOS[name]  # the last round has an evaluate phase, earlier ones ride on train
    strategy = build_strategy(parse_settings({**COMMON, "method": method, "num-server-rounds": rounds, **extra}))
    counter = itertools.count()
    seen: dict[tuple[int, str, int], int] = {}
    log = []

    def respond(msg):
        i, node, phase = next(counter), msg.metadata.dst_node_id, phase_of(msg)
        server_round = int(msg.content["config"]["server-round"])
        occurrence = seen[(server_round, phase, node)] = seen.get((server_round, phase, node), -1) + 1
        spec = strategy.reply_spec(phase, node)
        seed = zlib.crc32(f"{name}/{server_round}/{phase}/{node}/{occurrence}".encode())
        content = valid_content(spec, CLIENT_OF[node], seed)
        log.append((i, node, phase, spec, content))
        contents = [content] if tamper is None else tamper(i, node, phase, spec, content)
        return [reply_message(node, c) for c in contents]

    grid = ReplayGrid(NODES, respond)
    with outgoing_messages():
        for r in range(1, rounds + 1):
            run_round(strategy, grid, r)
    return strategy, log


@functools.cache
def clean(name: str):
    strategy, log = run(name)
    return snapshot(strategy), log, len(strategy.failures)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_valid_replies_are_all_accepted_and_runs_are_reproducible(name):
    state, log, failures = clean(name)
    assert failures == 0
    assert len({phase for _, _, phase, _, _ in log}) >= 2  # train and evaluate at least
    again, _ = run(name)
    assert_same_state(state, snapshot(again))


def _hostile_cases(log):
    """(reply index, description, how the reply is replaced, how it is replaced in the reference run)."""
    # how: a Corruption's apply, or "duplicate"; reference: "once" (the reply counted once) or None (never sent)
    cases: list[tuple[int, str, Callable[[RecordDict], RecordDict] | str, str | None]] = []
    heard: list[int] = []
    for i, node, phase, spec, content in log:
        cases.extend((i, f"{phase} from node {node}: {c.what}", c.apply, None) for c in corruptions(spec, content))
        cases.append((i, f"{phase} from node {node}: sent twice", "duplicate", "once"))
        for other in [n for n in heard if n != node][:1]:  # a partition id the server already knows as another's

            def clash(content: RecordDict, other: int = other) -> RecordDict:
                out = copy.deepcopy(content)
                m: dict[str, Any] = dict(out.metric_records["metrics"])
                m["partition-id"] = CLIENT_OF[other]
                out["metrics"] = MetricRecord(m)
                return out

            cases.append((i, f"{phase} from node {node}: claims node {other}'s partition id", clash, None))
        heard.append(node)
    return cases


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.integers(0, 2**31 - 1))
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_hostile_reply_leaves_the_state_as_if_the_node_had_not_answered(name, pick):
    _, log, _ = clean(name)
    cases = _hostile_cases(log)
    target, what, bad, reference = cases[pick % len(cases)]

    def tampered(i, node, phase, spec, content):
        if i != target:
            return [content]
        if bad == "duplicate":
            return [content, content]
        return [bad(content)]

    def absent(i, node, phase, spec, content):
        if i != target:
            return [content]
        return [content] if reference == "once" else []

    hostile, _ = run(name, tampered)
    expected, _ = run(name, absent)
    try:
        assert_same_state(snapshot(expected), snapshot(hostile))
    except AssertionError as err:
        raise AssertionError(f"{what}: {err}") from None
    assert any(f["round"] >= 1 for f in hostile.failures), what


def test_a_real_client_whose_bid_names_no_tier_is_refused_in_the_round_of_the_fault_and_the_run_goes_on(tmp_path):
    """The ``fault`` run config reaches the ClientApp's query handler: PI-FL's client 1 bids for a tier that does
    not exist in round 3 (``badbid@1:3``); the gate refuses that bid, naming it, and only that one: client 1's bid
    of round 2 (the first with tiers to bid for) and every other client's are taken, and the three rounds finish."""
    from tests.in_process import NODE_IDS, run_in_process

    strategy, server, _, _ = run_in_process("pifl", tmp_path, fault="badbid@1:3", **{"num-server-rounds": 3})
    bid_rounds = {line["round"] for line in server if line["type"] == "query.bid" and line["direction"] == "pushed"}
    assert bid_rounds == {2, 3}
    refused = [f for f in strategy.gate.failures if f["phase"] == "bid"]
    assert [(f["round"], NODE_IDS[f["node-id"]]) for f in refused] == [(3, 1)]
    assert "metric 'bid'" in refused[0]["reason"]
    assert len(strategy.history) == 3


def test_a_real_client_that_crashes_in_one_round_is_left_out_of_that_round_only(tmp_path):
    """``crash@1:2``: client 1's handlers raise in round 2 only (an error reply); the gate records each of its
    failed messages of round 2, naming the crash, and the run finishes with client 1 back in the other round."""
    from tests.in_process import NODE_IDS, run_in_process

    strategy, server, _, _ = run_in_process("fedavg", tmp_path, fault="crash@1:2")
    failed = {(f["round"], NODE_IDS[f["node-id"]]) for f in strategy.gate.failures}
    assert failed == {(2, 1)}
    assert all("injected crash on partition 1" in f["reason"] for f in strategy.gate.failures)
    pulled = {(line["round"], NODE_IDS[line["node"]]) for line in server if line["direction"] == "pulled"}
    assert (1, 1) in pulled and (2, 1) not in pulled
    assert len(strategy.history) == 2
