"""The base round loop (strategies/base.py) over scripted valid replies: a round's evaluation rides on the next
round's train messages only when it is due, the train messages say which round they evaluate, and the server's
own time per round is measured."""

from __future__ import annotations

import inspect
import logging
import re
import time

import numpy as np
from flwr.app import MetricRecord
from flwr.serverapp.strategy import Strategy

from server_app.app import build_strategy
from strategies.exchange import content_bytes
from task.config import parse_settings
from task.params import to_record
from tests.strategy_harness import (
    ReplayGrid,
    drive,
    outgoing_messages,
    phase_of,
    reply_message,
    run_round,
    valid_content,
)

CLIENT_OF = {1003: 0, 7: 1, 42: 2}


def test_an_evaluation_rides_on_the_next_rounds_train_messages_only_when_it_is_due():
    strategy = build_strategy(parse_settings({"model": "mlp", "min-nodes": 3, "num-server-rounds": 4, "eval-every": 2}))

    def respond(msg):
        node = msg.metadata.dst_node_id
        return [reply_message(node, valid_content(strategy.reply_spec(phase_of(msg), node), CLIENT_OF[node], 1))]

    grid = ReplayGrid(CLIENT_OF, respond)
    start = time.perf_counter()
    with outgoing_messages():
        for r in range(1, 5):
            run_round(strategy, grid, r)
    elapsed = time.perf_counter() - start
    configs: dict[tuple[int, str], list[dict]] = {}
    for m in grid.sent:
        cfg = m.content["config"]
        configs.setdefault((int(cfg["server-round"]), phase_of(m)), []).append(dict(cfg))
    assert sorted(configs) == [(1, "train"), (2, "train"), (3, "train"), (4, "evaluate"), (4, "train")]
    for (rnd, phase), cfgs in configs.items():
        assert len(cfgs) == 3 and all(c["phase"] == phase for c in cfgs)
        asks = {(c.get("evaluate"), c.get("evaluate-round")) for c in cfgs}
        assert asks == ({(True, 2)} if (rnd, phase) == (3, "train") else {(None, None)}), (rnd, phase)
    evaluated = [r.server_round for r in strategy.history if "personal-acc" in r.evaluate]
    assert evaluated == [2, 4]  # round 2 by round 3's train replies, the last round by its own phase
    for log in strategy.history:
        assert 0 < log.extra["server-seconds"] < elapsed


def test_start_takes_flowers_default_rounds_and_time_out_and_says_what_it_runs(caplog):
    """``PersonalizedStrategy.start`` honours Flower's ``Strategy.start`` contract: called without ``num_rounds``
    and ``timeout`` it runs Flower's default number of rounds and waits Flower's default time for replies; its log
    names the method, the data, the model and the rounds it runs."""
    defaults = {k: p.default for k, p in inspect.signature(Strategy.start).parameters.items()}
    strategy = build_strategy(parse_settings({"model": "mlp", "min-nodes": 3}))

    def respond(msg):
        node = msg.metadata.dst_node_id
        return [reply_message(node, valid_content(strategy.reply_spec(phase_of(msg), node), CLIENT_OF[node], 1))]

    seen: list[int] = []

    def evaluate_fn(server_round, arrays):  # on the initial model (round 0), then on each round's aggregate
        seen.append(server_round)
        current = to_record(strategy.global_state)
        for key in current:
            np.testing.assert_array_equal(arrays[key].numpy(), current[key].numpy(), err_msg=f"round {server_round}")
        return MetricRecord({"round": float(server_round)})

    with outgoing_messages(), caplog.at_level(logging.INFO):
        result = strategy.start(
            grid=ReplayGrid(CLIENT_OF, respond),
            initial_arrays=to_record(strategy.global_state),
            evaluate_fn=evaluate_fn,
        )
    rounds = defaults["num_rounds"]
    assert len(strategy.history) == rounds
    assert strategy.exchange.timeout == defaults["timeout"]
    assert seen == list(range(rounds + 1))
    assert dict(result.evaluate_metrics_serverapp) == {r: MetricRecord({"round": float(r)}) for r in seen}
    final = to_record(strategy.global_state)  # the Result carries the last aggregated model, not the initial one
    assert sorted(result.arrays) == sorted(final)
    for key in final:
        np.testing.assert_array_equal(result.arrays[key].numpy(), final[key].numpy())
    messages = [r.getMessage() for r in caplog.records]
    assert f"[fedavg] rounds 1..{rounds}" in messages
    assert [m for m in messages if m.startswith("[ROUND ")] == [f"[ROUND {r}/{rounds}]" for r in range(1, rounds + 1)]
    assert any(m.startswith("fedavg on digits (dirichlet), model mlp, ") for m in messages)


def test_an_evaluation_that_draws_part_of_the_nodes_first_asks_the_unknown_ones_who_they_are():
    """With ``fraction-evaluate`` below 1 the evaluated clients are drawn by client id, so a node that never said
    which client it is (its train reply did not come) is asked (``query.identify``, in that round) before the draw;
    when every node is evaluated nobody is asked."""
    silent = 7  # client 1's node: no train reply in round 1

    def answer(rnd, node, phase, content):
        return [] if phase == "train" and node == silent else None

    for fraction, asked in ((0.5, True), (1.0, False)):
        strategy = build_strategy(
            parse_settings({"model": "mlp", "min-nodes": 3, "num-server-rounds": 1, "fraction-evaluate": fraction})
        )
        grid = drive(strategy, CLIENT_OF, 1, answer)
        phases = [(phase_of(m), m.metadata.dst_node_id, int(m.content["config"]["server-round"])) for m in grid.sent]
        identified = [p for p in phases if p[0] == "identify"]
        assert identified == ([("identify", silent, 1)] if asked else []), fraction
        if asked:  # after the train messages, before the evaluate messages
            first_evaluate = next(i for i, p in enumerate(phases) if p[0] == "evaluate")
            assert phases.index(identified[0]) < first_evaluate
            assert [p[0] for p in phases[:3]] == ["train"] * 3


def test_each_round_records_its_own_bytes_per_phase_and_its_wall_time():
    """rounds.json's ``comm`` of round r is the bytes of round r's messages and replies, per phase and direction,
    and its ``seconds`` the round's wall time."""
    strategy = build_strategy(parse_settings({"model": "mlp", "min-nodes": 3, "num-server-rounds": 2}))
    start = time.monotonic()
    grid = drive(strategy, CLIENT_OF, 2)
    elapsed = time.monotonic() - start
    for log in strategy.history:
        r = log.server_round
        down: dict[str, int] = {}
        for m in grid.sent:
            if int(m.content["config"]["server-round"]) == r:
                key = f"{phase_of(m)}-bytes-down"
                down[key] = down.get(key, 0) + content_bytes(m.content)
        comm = log.extra["comm"]
        assert {k: v for k, v in comm.items() if k.endswith("-down")} == down, r
        assert comm["train-bytes-up"] > 0
        assert 0 < log.extra["seconds"] < elapsed
    assert strategy.exchange.comm == {}  # a finished round's counters are handed over, not kept


def test_the_log_says_after_each_round_how_it_was_evaluated_and_when_a_late_evaluation_arrives(caplog):
    """After each round one progress line names the method and the round, with its accuracies or, without them,
    how the round was evaluated; a round evaluated with the next round's train replies gets its own line then."""
    strategy = build_strategy(parse_settings({"model": "mlp", "min-nodes": 3, "num-server-rounds": 4, "eval-every": 2}))

    def respond(msg):
        node = msg.metadata.dst_node_id
        return [reply_message(node, valid_content(strategy.reply_spec(phase_of(msg), node), CLIENT_OF[node], 1))]

    grid = ReplayGrid(CLIENT_OF, respond)
    with outgoing_messages(), caplog.at_level(logging.INFO, logger="flwr.pflower"):
        for r in range(1, 5):
            run_round(strategy, grid, r)
    messages = [m for m in caplog.messages if m.startswith("[fedavg] round ")]
    progress = [m for m in messages if " done: " in m]
    assert [m.split(" done: ")[0] for m in progress] == [f"[fedavg] round {r}/4" for r in range(1, 5)]
    said = [m.split(" done: ")[1].split(" | ")[0] for m in progress]
    assert said[0] == said[2] == "not evaluated this round"
    assert said[1] == "evaluated with the next round's train messages"
    acc = strategy.history[3].evaluate  # the last round's own evaluation: its accuracies
    assert said[3] == ", ".join(f"{k} {acc[k]:.4f}" for k in ("personal-acc", "global-acc") if k in acc)
    assert said[3].startswith("personal-acc ")
    assert all(re.search(r" \| \d+\.\d s/round, ETA \d+ s$", m) for m in progress)
    late = [m for m in messages if " evaluated (with round " in m]
    assert len(late) == 1 and late[0].startswith("[fedavg] round 2 evaluated (with round 3's train replies): ")


def test_a_round_without_any_train_reply_leaves_the_model_and_says_so(caplog):
    """When no train reply of a round arrives in time, the global model stays as it was and the log says so for
    that round only."""
    strategy = build_strategy(
        parse_settings({"model": "mlp", "min-nodes": 3, "num-server-rounds": 3, "round-timeout": 1})
    )

    def answer(rnd, node, phase, content):
        return [] if rnd == 2 and phase == "train" else None

    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        drive(strategy, CLIENT_OF, [1], answer)
        after_round_1 = to_record(strategy.global_state)
        drive(strategy, CLIENT_OF, [2], answer)
    for key in after_round_1:
        np.testing.assert_array_equal(to_record(strategy.global_state)[key].numpy(), after_round_1[key].numpy())
    said = [m for m in caplog.messages if "no valid train replies" in m]
    assert said == ["round 2: no valid train replies; state left unchanged"]


def test_every_message_names_the_runs_folders_for_client_state_and_saved_models(tmp_path):
    """A run with a results folder tells its clients where to keep their state (``client-state``) and their saved
    models (``models/clients``) under it, and the run's key (the folder's name)."""
    strategy = build_strategy(parse_settings({"model": "mlp", "min-nodes": 3}))
    assert "model-dir" not in strategy.round_config(1, "train")  # no results folder: nothing to suggest
    strategy.results_dir = tmp_path / "run-7"
    for phase in ("train", "evaluate"):
        cfg = strategy.round_config(2, phase)
        assert cfg["run-key"] == "run-7"
        assert cfg["state-dir"] == str(tmp_path / "run-7" / "client-state")
        assert cfg["model-dir"] == str(tmp_path / "run-7" / "models" / "clients")
