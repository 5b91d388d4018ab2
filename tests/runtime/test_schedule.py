"""The evaluation schedule (strategies/schedule.py): which rounds are evaluated, which evaluations ride on the
next round's train messages, when models are saved, what each message's config says about it, and how the
progress line describes a round without accuracies."""

from __future__ import annotations

import pytest

from strategies.schedule import EvaluationSchedule
from task.config import parse_settings


def schedule(cfg: dict | None = None, evaluate_in_train: bool = True) -> EvaluationSchedule:
    return EvaluationSchedule(parse_settings({"num-server-rounds": 6, **(cfg or {})}), evaluate_in_train)


def test_every_eval_every_rounds_and_the_last_are_evaluated():
    s = schedule({"eval-every": 4})
    assert [r for r in range(1, 7) if s.evaluates(r)] == [4, 6]
    assert [r for r in range(1, 7) if schedule().evaluates(r)] == [1, 2, 3, 4, 5, 6]
    s.last_round = 9  # a strategy's start may move the last round
    assert [r for r in range(1, 10) if s.evaluates(r)] == [4, 8, 9]


def test_an_evaluation_rides_on_the_next_train_messages_only_where_every_client_trains_and_is_evaluated():
    s = schedule({"eval-every": 2})
    assert [r for r in range(1, 7) if s.rides_on_next_train(r)] == [2, 4]  # never the last round
    assert [r for r in range(1, 7) if s.has_evaluate_phase(r)] == [6]
    for other in (
        schedule(evaluate_in_train=False),
        schedule({"fraction-train": 0.5}),
        schedule({"fraction-evaluate": 0.5}),
    ):
        assert not any(other.rides_on_next_train(r) for r in range(1, 7))
        assert all(other.has_evaluate_phase(r) for r in range(1, 7))


@pytest.mark.parametrize(
    "cfg,saved",
    [
        ({}, [6]),
        ({"save-every": 4}, [4, 6]),
        ({"save-best": True, "eval-every": 2}, [2, 4, 6]),
        ({"save-models": False, "save-every": 2, "save-best": True}, []),
    ],
)
def test_models_are_saved_after_the_last_round_every_save_every_and_with_save_best_after_every_evaluation(cfg, saved):
    s = schedule(cfg)
    assert [r for r in range(1, 7) if s.saves_models(r)] == saved


def test_a_deferred_evaluation_goes_with_the_next_round_only():
    s = schedule({"save-best": True})
    assert s.start_round() == 0 and s.config(1, "train") == {}
    s.defer(1)
    assert s.start_round() == 1 and s.pending == 0
    assert s.config(2, "train") == {"evaluate": True, "evaluate-round": 1, "save-model": True, "save-best": True}
    assert s.config(2, "bid") == {}  # a query evaluates nothing
    assert s.start_round() == 0 and s.config(3, "train") == {}  # taken once


def test_an_evaluate_message_says_to_save_when_its_round_saves():
    s = schedule({"save-every": 3})
    assert s.config(3, "evaluate") == {"save-model": True, "save-best": False}
    assert s.config(2, "evaluate") == {} and s.config(3, "train") == {}
    s.fused = 3  # round 4's train messages carry round 3's evaluation: saved as round 3's model
    assert s.config(4, "train") == {"evaluate": True, "evaluate-round": 3, "save-model": True, "save-best": False}


def test_the_progress_line_says_how_a_round_without_accuracies_was_evaluated():
    fused, apart = schedule({"eval-every": 2}), schedule({"eval-every": 2}, evaluate_in_train=False)
    assert [fused.how_evaluated(r) for r in (1, 2, 6)] == [
        "not evaluated this round",
        "evaluated with the next round's train messages",
        "no evaluation replies",  # the last round has its own evaluate phase: nobody answered it
    ]
    assert apart.how_evaluated(2) == "no evaluation replies" and apart.how_evaluated(3) == "not evaluated this round"


@pytest.mark.parametrize("save", [True, False])
def test_the_server_writes_its_models_only_after_the_rounds_its_schedule_saves(tmp_path, save):
    """The server's models go to models/server/ after a round that saves (save-every 2: rounds 2 and the last, 3);
    with save-models off it writes none, though it still writes its checkpoints."""
    import json

    from server_app.app import build_strategy
    from tests.strategy_harness import drive

    cfg = {"model": "mlp", "min-nodes": 2, "num-server-rounds": 3, "save-every": 2, "checkpoint-every": 1}
    strategy = build_strategy(parse_settings({**cfg, "save-models": save}))
    strategy.results_dir = tmp_path
    written = []
    for server_round in (1, 2, 3):
        drive(strategy, {51: 0, 52: 1}, [server_round])
        manifests = sorted((tmp_path / "models" / "server").rglob("*.json"))
        written.append(sorted({json.loads(m.read_text())["round"] for m in manifests}))
    assert written == ([[], [2], [3]] if save else [[], [], []])
    assert (tmp_path / "checkpoints").is_dir()
