"""Waiting for ``min-nodes``: the wait says at intervals who is connected and who is awaited, and gives up after
``node-wait-timeout`` seconds with an error naming min-nodes, what connected and what to do; the run then ends
(summary.json says it aborted and why) instead of hanging."""

from __future__ import annotations

import json
import logging

import pytest

from strategies.exchange import NodeWaitTimeout, RunAborted, wait_for_nodes
from task.config import describe_options, parse_settings


class FakeClock:
    """``clock()`` and ``sleep(s)`` of a wait that takes no real time."""

    def __init__(self) -> None:
        self.now = 1000.0  # a monotonic clock starts anywhere

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ArrivingNodes:
    """A grid whose ``get_node_ids`` lists the nodes that have connected by the clock's time."""

    def __init__(self, clock: FakeClock, arrivals: dict[int, float]) -> None:
        self.clock, self.arrivals, self.start = clock, arrivals, clock.now

    def get_node_ids(self) -> list[int]:
        return [n for n, t in self.arrivals.items() if t <= self.clock.now - self.start]


def waits(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for nodes")]


def wait(grid, clock, minimum, **kw):
    return wait_for_nodes(grid, minimum, clock=clock, sleep=clock.sleep, **kw)


def test_returns_the_nodes_once_min_nodes_are_connected_without_a_word_before_the_first_interval(caplog):
    clock = FakeClock()
    grid = ArrivingNodes(clock, {7: 0.0, 3: 2.0, 9: 4.0, 1: 30.0})
    with caplog.at_level(logging.INFO, logger="flwr.pflower"):
        assert wait(grid, clock, 3, timeout=600.0) == [3, 7, 9]
    assert clock.now == 1004.0 and waits(caplog) == []  # it looks every half second


def test_the_wait_warns_at_intervals_who_is_connected_and_gives_up_after_the_timeout(caplog):
    clock = FakeClock()
    grid = ArrivingNodes(clock, {11: 0.0, 12: 0.0})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"), pytest.raises(NodeWaitTimeout) as err:
        wait(grid, clock, 5, timeout=60.0)  # reports every 10 s by default
    assert clock.now == 1060.0  # at the stated time, not later
    assert waits(caplog) == [  # every 10 s
        f"waiting for nodes: 2 connected, min-nodes=5 required ({t} s waited, giving up after 60 s (node-wait-timeout))"
        for t in (10, 20, 30, 40, 50)
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.getMessage().startswith("waiting"))
    assert str(err.value) == (
        "gave up waiting for nodes after 60 s (node-wait-timeout): 2 connected, min-nodes=5 required. Start more "
        'SuperNodes (simulation: --federation-config "num-supernodes=N" with N >= 5), lower min-nodes to the nodes '
        "you have, or raise node-wait-timeout (0: wait without limit)"
    )
    assert isinstance(err.value, RunAborted)  # the ServerApp writes the results and stops (server_app/app.py)


def test_a_short_timeout_is_still_reported_a_few_times_before_the_run_gives_up(caplog):
    clock = FakeClock()
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"), pytest.raises(NodeWaitTimeout):
        wait(ArrivingNodes(clock, {1: 0.0}), clock, 2, timeout=8.0, poll=0.25)
    assert [line.split("(")[1].split(" s waited")[0] for line in waits(caplog)] == ["2", "4", "6"]  # a quarter


def test_the_wait_gives_up_at_the_stated_second_between_two_reports():
    clock = FakeClock()
    with pytest.raises(NodeWaitTimeout, match=r"^gave up waiting for nodes after 45 s "):
        wait(ArrivingNodes(clock, {1: 0.0}), clock, 2, timeout=45.0)  # reports at 10, ..., 40 s
    assert clock.now == 1045.0


def test_the_wait_names_the_partition_ids_seen_earlier_whose_nodes_are_gone(caplog):
    clock = FakeClock()
    known = {0: 101, 1: 102, 2: 103, 5: 106}  # client id -> its node id
    grid = ArrivingNodes(clock, {101: 0.0, 106: 0.0, 999: 0.0})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"), pytest.raises(NodeWaitTimeout) as err:
        wait(grid, clock, 4, timeout=20.0, known=known)
    expected = "3 connected, min-nodes=4 required; partition ids seen earlier in this run whose nodes are not connected"
    assert f"{expected}: [1, 2]" in str(err.value)
    assert waits(caplog) and all(f"{expected}: [1, 2]" in line for line in waits(caplog))


def test_without_a_timeout_the_wait_goes_on_and_says_so(caplog):
    clock = FakeClock()
    grid = ArrivingNodes(clock, {1: 0.0, 2: 5000.0})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        assert wait(grid, clock, 2, report_every=1000.0) == [1, 2]  # no timeout given: no limit
    assert waits(caplog) == [
        f"waiting for nodes: 1 connected, min-nodes=2 required ({t} s waited, no time limit)"
        for t in (1000, 2000, 3000, 4000)
    ]


def test_node_wait_timeout_is_a_run_option_listed_with_its_default():
    assert parse_settings({}).node_wait_timeout == 600.0
    assert parse_settings({"node-wait-timeout": 0}).node_wait_timeout == 0.0
    with pytest.raises(ValueError, match=r"'node-wait-timeout' must be a number >= 0, got -1"):
        parse_settings({"node-wait-timeout": -1})
    row = next(line for line in describe_options().splitlines() if line.startswith("| `node-wait-timeout` |"))
    assert "`600.0`" in row and "min-nodes" in row


def test_a_strategy_that_never_gets_min_nodes_stops_after_node_wait_timeout_without_logging_a_round():
    from flwr.app import ArrayRecord

    from server_app.app import build_strategy
    from tests.strategy_harness import ReplayGrid

    settings = parse_settings({"model": "mlp", "min-nodes": 3, "node-wait-timeout": 0.2})
    strategy = build_strategy(settings)
    grid = ReplayGrid([5, 6], respond=lambda m: pytest.fail("nothing may be sent before min-nodes connect"))
    with pytest.raises(NodeWaitTimeout, match=r"after 0.2 s \(node-wait-timeout\): 2 connected, min-nodes=3"):
        strategy.start(grid, ArrayRecord(), num_rounds=2, timeout=5)
    assert strategy.history == [] and grid.sent == []


def test_a_strategy_whose_nodes_left_mid_run_names_the_partition_ids_it_lost():
    from flwr.app import ConfigRecord

    from server_app.app import build_strategy
    from tests.strategy_harness import (
        ReplayGrid,
        outgoing_messages,
        phase_of,
        reply_message,
        shared_arrays,
        valid_content,
    )

    settings = parse_settings({"model": "mlp", "min-nodes": 4, "node-wait-timeout": 0.2})
    strategy = build_strategy(settings)
    client_of = {1003: 0, 7: 1, 42: 2, 555: 3}

    def respond(msg):
        node = msg.metadata.dst_node_id
        return [reply_message(node, valid_content(strategy.reply_spec(phase_of(msg), node), client_of[node], 1))]

    grid = ReplayGrid(client_of, respond)
    with outgoing_messages():
        strategy.aggregate_train(
            1, grid.send_and_receive(strategy.configure_train(1, shared_arrays(strategy), ConfigRecord(), grid))
        )
    grid.nodes = [1003, 555]  # the nodes of clients 1 and 2 are gone
    with pytest.raises(NodeWaitTimeout) as err:
        strategy.loop.available_nodes(grid)
    said = (
        "2 connected, min-nodes=4 required; partition ids seen earlier in this run whose nodes are not connected: "
        "[1, 2]"
    )
    assert f"after 0.2 s (node-wait-timeout): {said}." in str(err.value)


@pytest.mark.slow
def test_a_run_whose_min_nodes_never_connect_ends_and_says_why(simulation):
    """The run ends (summary.json: aborted, and why; a non-zero exit) instead of waiting forever; the output of
    ``flwr run --stream`` shows the wait at intervals."""
    from server_app.runner import RunFailed, results_folder_from_output

    with pytest.raises(RunFailed) as err:
        simulation.run({"min-nodes": 3, "node-wait-timeout": 8.0}, num_supernodes=2, timeout=300)
    out = err.value.output
    assert "waiting for nodes: 2 connected, min-nodes=3 required" in out
    assert "gave up waiting for nodes after 8 s (node-wait-timeout): 2 connected, min-nodes=3 required" in out
    folder = results_folder_from_output(out)
    assert folder is not None, f"the output names no results folder:\n{out}"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 0 and "min-nodes=3" in summary["aborted"] and "num-supernodes" in summary["aborted"]
