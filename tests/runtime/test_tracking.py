"""Runs you can watch (server_app/tracking.py): every round of the run's history as TensorBoard scalars in the run's
folder (and MLflow metrics when asked), written once the round is complete, read back with TensorBoard's own
reader; a resumed run shows its rounds once; runs under one folder are listed apart; a writer that fails leaves
the run going.  The end-to-end check against a real run's rounds.json is in tests/baselines/test_e2e.py and
tests/resume/test_e2e.py."""

from __future__ import annotations

import importlib.util
import json
import logging

import numpy as np
import pytest

from server_app import tracking
from server_app.app import build_strategy
from server_app.results import ResultsWriter, round_scalars
from server_app.tracking import MLFLOW_FILE, RoundWatchers, TensorBoardSink, check_installed, open_watchers
from strategies.outcome import RoundLog
from task.config import parse_settings
from tests.event_files import check_event_files_match_rounds_json, runs, scalars
from tests.strategy_harness import drive

NODES = {11: 0, 12: 1, 13: 2}


def settings(tmp_path, **cfg):
    return parse_settings({"model": "mlp", "min-nodes": 3, "results-dir": str(tmp_path), **cfg})


def history(rounds: int, shift: float = 0.0) -> list[RoundLog]:
    return [
        RoundLog(
            r,
            train={"train-loss": 1.0 / r + shift, "num-replies": 3},
            evaluate={"personal-acc": 0.5 + r / 10 + shift, "personal-acc-min": 0.25 + shift},
            extra={"comm": {"train-bytes-up": 1000 * r, "train-bytes-down": 3000 * r}, "seconds": 2.0 + r},
        )
        for r in range(1, rounds + 1)
    ]


def as_float32(rows: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(step, float(np.float32(v))) for step, v in points] for tag, points in rows.items()}


def expected(rounds: list[RoundLog]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rounds:
        for tag, value in round_scalars(r).items():
            out.setdefault(tag, []).append((r.server_round, value))
    return as_float32(out)


def test_a_rounds_scalars_are_its_numbers_grouped_by_kind():
    r = RoundLog(
        3,
        train={"train-loss": 0.5, "num-replies": 4},
        evaluate={"personal-acc": 0.75, "personal-acc-min": 0.5, "num-replies": 4},
        extra={
            "comm": {"train-bytes-up": 100, "train-bytes-down": 300, "evaluate-bytes-up": 7, "evaluate-bytes-down": 9},
            "seconds": 1.5,
            "server-seconds": 0.25,
            "checkpoint-seconds": 0.125,
            "server-peak-rss-mb": 512.0,
            "dp": {"epsilon": 2.5, "delta": 1e-5, "neighbours": "add-or-remove-one"},
            "message-timing": {"train": {"messages": 4, "total": 3.0}},  # a table: in rounds.json, not a curve
            "cfl": {"clusters": 2},  # a method's own record: in rounds.json and its artefacts
            "flag": True,
        },
    )
    assert round_scalars(r) == {
        "train/train-loss": 0.5,
        "train/num-replies": 4.0,
        "eval/personal-acc": 0.75,
        "eval/personal-acc-min": 0.5,
        "eval/num-replies": 4.0,
        "comm/train-bytes-up": 100.0,
        "comm/train-bytes-down": 300.0,
        "comm/evaluate-bytes-up": 7.0,
        "comm/evaluate-bytes-down": 9.0,
        "comm/bytes-up": 107.0,
        "comm/bytes-down": 309.0,
        "time/seconds": 1.5,
        "time/server-seconds": 0.25,
        "time/checkpoint-seconds": 0.125,
        "memory/server-peak-rss-mb": 512.0,
        "dp/epsilon": 2.5,
    }
    assert round_scalars(RoundLog(1)) == {}  # a round that recorded nothing yet


def test_every_complete_round_is_written_once_while_the_run_goes_and_the_last_at_the_end(tmp_path):
    """In a run whose evaluations ride on the next round's train replies, round r is complete when round r + 1
    ends: the event files hold rounds 1 .. r - 1 after round r, each with its evaluation, and all rounds at the
    end; the run config is in the Text tab.  rounds.json then agrees with the event files, number for number."""
    s = settings(tmp_path, **{"method": "fedavg", "num-server-rounds": 3})
    strategy = build_strategy(s)
    folder = tmp_path / "run"
    watchers = open_watchers(s, folder, resumed=False)
    seen: list[dict] = []
    strategy.round_watchers += [watchers.update, lambda history: seen.append(scalars(folder))]
    drive(strategy, NODES, 3)
    assert [sorted({step for points in written.values() for step, _ in points}) for written in seen] == [
        [],
        [1],
        [1, 2],
    ]
    assert seen[1]["eval/personal-acc"] == [(1, pytest.approx(strategy.history[0].evaluate["personal-acc"]))]
    assert seen[2] == expected(strategy.history[:2])  # written when complete: nothing of them changed later
    watchers.finish(strategy.history, failed=False)
    assert scalars(folder) == expected(strategy.history)
    assert "eval/personal-acc-std" in scalars(folder) and "comm/bytes-down" in scalars(folder)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    text = EventAccumulator(str(folder)).Reload()
    assert "run-config/text_summary" in text.Tags()["tensors"]
    ResultsWriter(s, run_id=1, folder=folder).write(strategy.results(), 1.0)
    check_event_files_match_rounds_json(folder)


def test_a_resumed_run_shows_each_round_once_with_what_the_resumed_history_holds(tmp_path):
    """The interrupted process wrote rounds 1-2; the resumed one writes its history (rounds 1-4, restored from the
    checkpoint, so equal in a real run; different here to tell them apart): TensorBoard shows the resumed one's,
    each round once, although the older event file is still there."""
    s = settings(tmp_path)
    first = open_watchers(s, tmp_path / "run", resumed=False)
    first.finish(history(2), failed=True)
    resumed = open_watchers(s, tmp_path / "run", resumed=True)
    resumed.update(history(4, shift=1.0))
    resumed.finish(history(4, shift=1.0), failed=False)
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 2
    assert scalars(tmp_path / "run") == expected(history(4, shift=1.0))


def test_runs_in_one_results_folder_are_listed_as_runs_of_their_own(tmp_path):
    s = settings(tmp_path)
    for name, shift in (("a-fedavg-1", 0.0), ("b-fedavg-2", 0.5)):
        open_watchers(s, tmp_path / name, resumed=False).finish(history(2, shift), failed=False)
    assert runs(tmp_path) == {"a-fedavg-1", "b-fedavg-2"}
    assert scalars(tmp_path / "b-fedavg-2") == expected(history(2, 0.5)) != scalars(tmp_path / "a-fedavg-1")


class Failing:
    name = "Broken"

    def write(self, rows):
        raise OSError("disk full")

    def close(self, failed):
        raise AssertionError("a sink that failed is not closed")


def test_a_writer_that_fails_is_warned_about_and_the_run_goes_on(tmp_path, caplog):
    s = settings(tmp_path)
    (tmp_path / "not-a-folder").write_text("")
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        unopened = open_watchers(s, tmp_path / "not-a-folder", resumed=False)
        assert unopened.sinks == []
        unopened.update(history(2))
        unopened.finish(history(2), failed=False)
        assert "TensorBoard: not written (FileExistsError" in caplog.text
        watchers = RoundWatchers([Failing(), TensorBoardSink(tmp_path / "run", s, resumed=False)])
        watchers.update(history(3))
        assert "Broken: writing failed (OSError: disk full); the run goes on without it" in caplog.text
        watchers.finish(history(3), failed=False)
    assert scalars(tmp_path / "run") == expected(history(3))  # the other writer went on


def test_tensorboard_off_writes_no_event_files(tmp_path):
    s = settings(tmp_path, tensorboard=False)
    open_watchers(s, tmp_path / "run", resumed=False).finish(history(2), failed=False)
    assert not (tmp_path / "run").exists()


def test_mlflow_asked_for_where_it_is_not_installed_is_refused_saying_how_to_install_it(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    refusal = r"'mlflow' is true, but MLflow is not installed where the ServerApp runs: .*pip install -e '\.\[mlflow\]'"
    with pytest.raises(ValueError, match=refusal):
        check_installed(settings(tmp_path, mlflow=True))
    check_installed(settings(tmp_path))  # not asked for: nothing to check


@pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None,
    reason="MLflow is an optional extra (pip install -e '.[mlflow]'; the test extra has it)",
)
def test_mlflow_holds_the_run_config_and_every_round_and_a_resumed_run_continues_the_same_run(tmp_path):
    from mlflow.tracking import MlflowClient

    s = settings(tmp_path, tensorboard=False, mlflow=True, **{"num-server-rounds": 4})
    folder = tmp_path / "run"
    folder.mkdir()
    first = open_watchers(s, folder, resumed=False)
    first.update(history(2))
    first.finish(history(2), failed=True)  # the process stopped after round 2
    link = json.loads((folder / MLFLOW_FILE).read_text())
    assert link["tracking-uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}"  # the default store: in the results folder
    client = MlflowClient(link["tracking-uri"])
    assert client.get_run(link["run-id"]).info.status == "FAILED"
    resumed = open_watchers(s, folder, resumed=True)
    resumed.update(history(4))
    resumed.finish(history(4), failed=False)
    run = client.get_run(link["run-id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params == {k: str(v) for k, v in s.raw.items()}
    assert run.data.tags["pflower.results-folder"] == str(folder)
    for tag, points in expected(history(4)).items():  # each round once, the value as recorded (float64)
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        assert logged == [(r.server_round, round_scalars(r)[tag]) for r in history(4)], tag
        assert as_float32({tag: logged}) == {tag: points}
    assert len(client.search_runs([run.info.experiment_id])) == 1
