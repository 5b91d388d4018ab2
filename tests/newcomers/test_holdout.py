"""Held-out clients (run-config ``holdout-clients``): which clients are held out, that they never take part in
training in a sampled, resumed or late-joined federation, and what the server does with what they reply as
newcomers after the last round (strategies/newcomers.py), through the strategy's own round loop (``start``)."""

from __future__ import annotations

import csv
import json
import zlib

import numpy as np
import pytest
from flwr.app import MetricRecord

from server_app.app import build_strategy
from server_app.results import ResultsWriter
from strategies.exchange import RunAborted
from strategies.newcomers import Holdout, evaluate_newcomers
from task.config import parse_settings
from task.params import record_to_numpy, to_record
from tests.strategy_harness import (
    ReplayGrid,
    outgoing_messages,
    phase_of,
    reply_message,
    run_round,
    valid_content,
)

#: client id -> node id: node ids in another order than the client ids
NODE_OF = {c: 5000 - 37 * c for c in range(6)}


class Federation:
    """A strategy's whole run (``start``: the rounds, then the newcomers) against scripted clients; every message
    each client received is kept as (round, message type, content)."""

    def __init__(self, rounds=3, present=tuple(range(6)), answer=None, **cfg):
        self.strategy = build_strategy(
            parse_settings({"method": "fedavg", "model": "mlp", "min-nodes": 1, "num-server-rounds": rounds, **cfg})
        )
        self.rounds, self.answer = rounds, answer
        self.grid = ReplayGrid([NODE_OF[c] for c in present], self.respond)
        self.received: dict[int, list[tuple[int, str, object]]] = {c: [] for c in NODE_OF}

    def respond(self, msg):
        client = {n: c for c, n in NODE_OF.items()}[msg.metadata.dst_node_id]
        phase, rnd = phase_of(msg), int(msg.content["config"]["server-round"])
        self.received[client].append((rnd, msg.metadata.message_type, msg.content))
        spec = self.strategy.reply_spec(phase, msg.metadata.dst_node_id)
        content = valid_content(spec, client, zlib.crc32(f"{rnd}/{phase}/{client}".encode()))
        if self.answer is not None:
            metrics = dict(content.metric_records["metrics"])
            self.answer(rnd, phase, client, metrics)
            content["metrics"] = MetricRecord(metrics)
        return [reply_message(msg.metadata.dst_node_id, content)]

    def run(self):
        with outgoing_messages():
            self.strategy.start(
                grid=self.grid, initial_arrays=to_record(self.strategy.global_state), num_rounds=self.rounds
            )
        return self

    def types(self, client):
        return [kind for _, kind, _ in self.received[client]]


# ---------------------------------------------------------------------------------------------- who is held out
def test_the_largest_client_ids_at_the_start_are_held_out_and_nobody_when_the_count_is_zero():
    holdout = Holdout(2)
    assert holdout.training([10, 11, 12, 13, 14], {10: 0, 11: 3, 12: 1, 13: 4, 14: 2}) == [10, 12, 14]
    assert holdout.first == 3 and holdout.held_out(3) and holdout.held_out(9) and not holdout.held_out(2)
    assert holdout.newcomers([10, 11, 13, 99], {10: 0, 11: 3, 13: 4}) == [11, 13]
    nobody = Holdout(0)
    assert nobody.training([5, 6, 7], {5: 0}) == [5, 6, 7] and nobody.first == -1 and not nobody.held_out(100)


def test_a_node_that_never_said_who_it_is_does_not_train_while_clients_are_held_out():
    """A node whose client id is unknown (its identify reply failed) may be a held-out client: it is left out."""
    holdout = Holdout(1)
    assert holdout.training([1, 2, 3, 4], {1: 0, 2: 1, 4: 2}) == [1, 2]
    assert holdout.first == 2  # the largest of the clients known at the start


def test_the_clients_held_out_are_fixed_by_the_first_round_whoever_connects_later():
    holdout = Holdout(1)
    holdout.training([1, 2, 3], {1: 0, 2: 1, 3: 4})
    # client 3 connects after the start: below the held-out ids, it trains; client 7 above them is held out too
    assert holdout.training([1, 2, 3, 4, 5], {1: 0, 2: 1, 3: 4, 4: 3, 5: 7}) == [1, 2, 4]
    assert holdout.first == 4


@pytest.mark.parametrize("count,clients", [(3, 3), (4, 3), (1, 1)])
def test_holding_out_every_client_at_the_start_stops_the_run_saying_why(count, clients):
    with pytest.raises(
        RunAborted,
        match=rf"holdout-clients={count} holds out every one of the {clients} clients connected at the start "
        rf"\(partition ids \[.*\]\): none would train; use holdout-clients < {clients} or start more nodes$",
    ):
        Holdout(count).training(range(clients), {i: i for i in range(clients)})


def test_while_no_client_is_known_nobody_trains_and_nobody_is_held_out_yet():
    holdout = Holdout(1)
    assert holdout.training([1, 2], {}) == [] and holdout.first == -1
    assert holdout.training([1, 2], {1: 0, 2: 5}) == [1] and holdout.first == 5


def test_a_negative_holdout_count_is_refused_at_start_up():
    with pytest.raises(ValueError, match=r"'holdout-clients' must be an integer >= 0, got -1"):
        parse_settings({"holdout-clients": -1})


# ---------------------------------------------------------------------------------------------- never take part
@pytest.mark.parametrize(
    "cfg",
    [{}, {"fraction-train": 0.5, "fraction-evaluate": 0.5, "seed": 3}, {"method": "local", "fraction-train": 0.3}],
    ids=["everyone", "sampled", "local-sampled"],
)
def test_held_out_clients_are_asked_who_they_are_and_then_only_as_newcomers_after_the_last_round(cfg):
    fed = Federation(rounds=4, **{"holdout-clients": 2, **cfg}).run()
    assert fed.strategy.holdout.first == 4
    for c in (4, 5):
        assert fed.types(c) == ["query.identify", "query.newcomer"]
        assert [rnd for rnd, kind, _ in fed.received[c] if kind == "query.newcomer"] == [4]
    trained = set()
    for c in range(4):
        assert "query.newcomer" not in fed.types(c)
        trained |= {rnd for rnd, kind, _ in fed.received[c] if kind == "train"}
    assert trained == {1, 2, 3, 4}
    assert all(r.train["num-replies"] <= 4 for r in fed.strategy.history)
    assert sorted(fed.strategy.holdout.results) == [4, 5]


def test_a_newcomer_gets_the_global_model_the_run_ended_with():
    fed = Federation(rounds=3, **{"holdout-clients": 1}).run()
    (content,) = [content for _, kind, content in fed.received[5] if kind == "query.newcomer"]
    sent = record_to_numpy(content["arrays"])
    assert sorted(sent) == sorted(fed.strategy.global_state)
    for k, v in fed.strategy.global_state.items():
        np.testing.assert_array_equal(sent[k], v)
    assert not np.array_equal(sent["head.weight"], fed.strategy.initial_state["head.weight"])  # it was trained


def test_a_node_that_connects_after_the_start_with_a_larger_id_is_a_newcomer_and_one_with_a_smaller_id_trains():
    fed = Federation(rounds=3, present=(0, 1, 2, 4), **{"holdout-clients": 1})
    fed.grid.nodes = [NODE_OF[c] for c in (0, 1, 2, 4)]
    with outgoing_messages():  # round 1 with the clients present at the start, then two more connect
        run_round(fed.strategy, fed.grid, 1)
        fed.grid.nodes = [NODE_OF[c] for c in range(6)]
        for r in (2, 3):
            run_round(fed.strategy, fed.grid, r)
        evaluate_newcomers(fed.strategy, fed.grid, 3)
    assert fed.strategy.holdout.first == 4
    assert "train" in fed.types(3) and "query.newcomer" not in fed.types(3)
    assert sorted(fed.strategy.holdout.results) == [4, 5] and "train" not in fed.types(5)


def test_a_held_out_node_that_connects_only_after_the_last_round_is_still_scored_as_a_newcomer():
    fed = Federation(rounds=2, present=(0, 1, 2, 3, 4), **{"holdout-clients": 1})
    with outgoing_messages():
        for r in (1, 2):
            run_round(fed.strategy, fed.grid, r)
        fed.grid.nodes = [NODE_OF[c] for c in range(6)]  # client 5 shows up now, never asked who it is before
        evaluate_newcomers(fed.strategy, fed.grid, 2)
    assert fed.types(5) == ["query.identify", "query.newcomer"]
    assert [rnd for rnd, _, _ in fed.received[5]] == [2, 2]
    assert sorted(fed.strategy.holdout.results) == [4, 5]


def test_when_no_held_out_client_is_connected_at_the_end_the_last_round_says_so():
    fed = Federation(rounds=2, **{"holdout-clients": 2})
    with outgoing_messages():
        for r in (1, 2):
            run_round(fed.strategy, fed.grid, r)
        fed.grid.nodes = [NODE_OF[c] for c in range(4)]  # the held-out clients 4 and 5 are gone
        entry = evaluate_newcomers(fed.strategy, fed.grid, 2)
    assert entry == {"clients": [], "asked": [], "comm": {}} == fed.strategy.history[-1].extra["newcomers"]
    assert fed.strategy.holdout.results == {} and fed.strategy.holdout.means() == {}


def test_a_resumed_run_holds_out_the_clients_the_interrupted_one_did():
    fed = Federation(rounds=2, **{"holdout-clients": 2}).run()
    resumed = build_strategy(fed.strategy.settings)
    resumed.checkpoint.resume(fed.strategy.checkpoint.state(), 1)
    assert resumed.holdout.first == 4
    # even when the held-out clients are not connected when it resumes, it does not hold out others instead
    assert resumed.holdout.training([NODE_OF[c] for c in range(4)], {NODE_OF[c]: c for c in range(4)}) == [
        NODE_OF[c] for c in range(4)
    ]


# ---------------------------------------------------------------------------------------------- what they reply
SCORES = {4: (0.5, 0.75), 5: (0.25, 1.0)}


def newcomer_scores(rnd, phase, client, metrics):
    if phase == "newcomer":
        metrics["newcomer-acc"], metrics["newcomer-finetuned-acc"] = SCORES[client]


def test_the_newcomers_scores_go_into_the_summary_the_last_rounds_history_and_clients_csv(tmp_path):
    fed = Federation(rounds=2, answer=newcomer_scores, **{"holdout-clients": 2, "results-dir": str(tmp_path)}).run()
    writer = ResultsWriter(fed.strategy.settings, run_id=1)
    line = writer.write(fed.strategy.results(), 1.0)
    summary = json.loads((writer.folder / "summary.json").read_text())
    assert summary["holdout-clients"] == 2 and summary["newcomers"] == 2 and summary["clients"] == 4
    assert summary["newcomer-acc"] == pytest.approx(0.375)
    assert summary["newcomer-finetuned-acc"] == pytest.approx(0.875)
    assert ", 2 newcomers (held out): acc 0.3750, fine-tuned 0.8750, " in line
    entry = json.loads((writer.folder / "rounds.json").read_text())[-1]["extra"]["newcomers"]
    assert entry["clients"] == entry["asked"] == [4, 5] and entry["newcomer-acc"] == pytest.approx(0.375)
    assert entry["per-client"]["5"]["newcomer-finetuned-acc"] == 1.0 and entry["comm"]["newcomer-bytes-up"] > 0
    with (writer.folder / "clients.csv").open() as fh:
        rows = {int(r["client"]): r for r in csv.DictReader(fh)}
    assert sorted(rows) == list(range(6))
    assert [float(rows[c]["newcomer-acc"]) for c in (4, 5)] == [0.5, 0.25]
    assert rows[0]["newcomer-acc"] == "" and rows[4]["personal-acc"] == ""


def test_a_run_without_held_out_clients_says_nothing_of_newcomers(tmp_path):
    fed = Federation(rounds=1, **{"results-dir": str(tmp_path)}).run()
    writer = ResultsWriter(fed.strategy.settings, run_id=1)
    line = writer.write(fed.strategy.results(), 1.0)
    summary = json.loads((writer.folder / "summary.json").read_text())
    assert "newcomer-acc" not in summary and "newcomers" not in line
    assert all(kind != "query.newcomer" for c in NODE_OF for kind in fed.types(c))


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan")])
def test_a_newcomer_that_lies_about_its_accuracy_is_rejected_and_left_out_of_the_means(bad):
    def lying(rnd, phase, client, metrics):
        newcomer_scores(rnd, phase, client, metrics)
        if phase == "newcomer" and client == 5:
            metrics["newcomer-acc"] = bad

    fed = Federation(rounds=1, answer=lying, **{"holdout-clients": 2}).run()
    assert sorted(fed.strategy.holdout.results) == [4]
    assert fed.strategy.holdout.means()["newcomer-acc"] == 0.5
    (failure,) = fed.strategy.failures
    assert failure["phase"] == "newcomer" and failure["client"] == 5 and "newcomer-acc" in failure["reason"]
