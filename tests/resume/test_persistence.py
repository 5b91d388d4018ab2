"""Persistence (strategies/persistence.py): when checkpoints are written, what a resumed run must agree on, the
crash ``stop-after`` simulates, the server's saved models, and a strategy's state written and put back."""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from server_app.app import build_strategy
from strategies.base import PersonalizedStrategy
from strategies.outcome import RoundLog
from strategies.persistence import (
    RESUMABLE_CHANGES,
    SimulatedCrash,
    checkpoint_due,
    checkpoint_meta,
    read_checkpoint,
    save_server_models,
    stop_if_asked,
    write_checkpoint,
)
from task.checkpoint import CheckpointError, save_checkpoint, to_tree
from task.config import parse_settings
from task.export import read_manifest

BASE = {"method": "fedc2i", "model": "mlp", "num-server-rounds": 5}


def settings(**over):
    return parse_settings({**BASE, **over})


@pytest.mark.parametrize("every,due", [(1, [1, 2, 3, 4, 5]), (2, [2, 4, 5]), (0, [])])
def test_a_checkpoint_is_due_every_checkpoint_every_rounds_and_after_the_last(every, due):
    s = settings(**{"checkpoint-every": every})
    assert [r for r in range(1, 6) if checkpoint_due(s, r, 5)] == due
    assert checkpoint_due(s, 7, 7) == bool(every)  # the last round the strategy's start was given


def test_the_meta_holds_every_key_but_the_resumable_ones_as_the_options_read_them():
    meta = checkpoint_meta(settings(**{"lr": 1, "num-server-rounds": 9}))
    assert meta["method"] == "fedc2i" and meta["model"] == "mlp" and meta["dataset"] == "digits"
    assert not set(meta["run-config"]) & RESUMABLE_CHANGES
    assert meta["run-config"]["lr"] == 1.0 and isinstance(meta["run-config"]["lr"], float)
    assert {"gamma", "c2i-variant", "seed"} <= set(meta["run-config"])  # the method's own keys too
    with pytest.warns(FutureWarning):
        old = settings(**{"c2i-variant": "Lambda-only"})
    new = settings(**{"c2i-variant": "class-level-averaged-extractor"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the spelling was warned about once, when the run config was read
        assert checkpoint_meta(old) == checkpoint_meta(new)  # a deprecated spelling is the same run


def test_a_written_checkpoint_reads_back_and_a_foreign_or_finished_one_is_refused(tmp_path):
    state = {"base": {"rng-draws": [1, 2]}, "method": {"store": {0: np.arange(3.0)}}}
    assert write_checkpoint(tmp_path, 2, state, settings()) >= 0
    done, back = read_checkpoint(tmp_path, settings(**{"resume-from": str(tmp_path)}))
    assert done == 2 and back["base"] == state["base"]
    np.testing.assert_array_equal(back["method"]["store"][0], np.arange(3.0))
    folder = re.escape(repr(str(tmp_path)))  # each refusal names the folder
    with pytest.raises(CheckpointError, match=rf"resume-from {folder} is a fedc2i run of model mlp on digits; this"):
        read_checkpoint(tmp_path, settings(method="fedavg"))
    with pytest.raises(CheckpointError, match=rf"{folder}: run-config keys \['gamma'\] differ"):
        read_checkpoint(tmp_path, settings(gamma=1.0))
    with pytest.raises(CheckpointError, match=rf"{folder}: the run already finished its 2 rounds"):
        read_checkpoint(tmp_path, settings(**{"num-server-rounds": 2}))
    write_checkpoint(tmp_path, 3, {"something": 1}, settings())
    with pytest.raises(CheckpointError, match=rf"checkpoint of {folder} holds no strategy state"):
        read_checkpoint(tmp_path, settings())
    with pytest.raises(CheckpointError, match="no such results folder"):
        read_checkpoint(tmp_path / "missing", settings())


def test_writing_a_checkpoint_reports_the_seconds_it_took(tmp_path):
    start = time.perf_counter()
    seconds = write_checkpoint(tmp_path, 1, {"base": {}, "method": {"w": np.zeros(1000)}}, settings())
    assert 0 <= seconds <= time.perf_counter() - start


def test_a_checkpoint_from_before_an_option_existed_resumes_however_the_option_is_set(tmp_path):
    meta = checkpoint_meta(settings())
    del meta["run-config"]["gamma"]  # written by a version that did not know the key
    save_checkpoint(tmp_path / "checkpoints", 2, *to_tree({"base": {}, "method": {}}), meta)
    for gamma in (0.5, 2.0):
        assert read_checkpoint(tmp_path, settings(gamma=gamma))[0] == 2
    del meta["run-config"]  # nor any run-config key
    save_checkpoint(tmp_path / "checkpoints", 3, *to_tree({"base": {}, "method": {}}), meta)
    assert read_checkpoint(tmp_path, settings(gamma=2.0))[0] == 3


def test_stop_after_crashes_after_its_round_but_never_after_the_last():
    s = settings(**{"stop-after": 3})
    stop_if_asked(s, 2, 5, None)
    with pytest.raises(SimulatedCrash, match="resume-from='/runs/x'"):
        stop_if_asked(s, 3, 5, Path("/runs/x"))
    stop_if_asked(s, 3, 3, None)  # the run ends there anyway
    stop_if_asked(settings(), 3, 5, None)


def test_the_server_models_are_saved_with_their_manifest(tmp_path):
    models = {"global": {"w": np.ones((2, 2), np.float32)}, "cluster-1": {"w": np.zeros((2, 2), np.float32)}}
    save_server_models(tmp_path, settings(), 4, models)
    for name, state in models.items():
        path = tmp_path / "models" / "server" / name
        np.testing.assert_array_equal(load_file(str(path.with_suffix(".safetensors")))["w"], state["w"])
        manifest = read_manifest(path)
        assert manifest["round"] == 4 and manifest["server-model"] == name and manifest["method"] == "fedc2i"


def test_with_save_history_every_saved_rounds_models_are_kept_beside_the_latest(tmp_path):
    """save-history: the models of every round the server saves stay under models/server/round-<k>/ (an audit of the
    releases over the rounds reads them); the latest is where it always is.  Without it, only the latest."""
    for history, folder in ((True, tmp_path / "kept"), (False, tmp_path / "latest")):
        for server_round, value in ((1, 1.0), (2, 2.0)):
            models = {"global": {"w": np.full((2, 2), value, np.float32)}}
            save_server_models(folder, settings(**{"save-history": history}), server_round, models)
        server = folder / "models" / "server"
        assert load_file(str(server / "global.safetensors"))["w"][0, 0] == 2.0
        rounds = sorted(p.name for p in server.glob("round-*"))
        assert rounds == (["round-00001", "round-00002"] if history else [])
        for k in range(1, 3) if history else ():
            kept = server / f"round-{k:05d}" / "global"
            assert load_file(str(kept.with_suffix(".safetensors")))["w"][0, 0] == float(k)
            assert read_manifest(kept)["round"] == k


class Counting(PersonalizedStrategy):
    """A method with state of its own: how many evaluations it saw."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen = 0

    def state(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def restore(self, state) -> None:
        self.seen = state["seen"]


def counting(**over) -> Counting:
    s = parse_settings({"method": "fedavg", "model": "mlp", "num-server-rounds": 6, **over})
    like = build_strategy(s)
    return Counting(s, like.initial_state, like.model_info)


def midway() -> Counting:
    """A strategy after three rounds: history, a failure, evaluations, a used generator, an evaluation waiting for
    the next round's train messages, an aggregated global model, state of the method."""
    s = counting()
    s.history = [RoundLog(r, train={"train-loss": 1.0 / r}, extra={"seconds": r}) for r in (1, 2, 3)]
    s.gate.client_of[70] = 4
    s.gate.reject(3, 70, "train", "error reply: out of memory")
    s.client_eval = {4: {"personal-acc": 0.5}, 1: {"personal-acc": 0.75}}
    s.rng.random()
    s.schedule.defer(3)
    s.global_state = {k: v + 1 for k, v in s.global_state.items()}
    s.seen = 5
    return s


def test_a_checkpointed_strategy_is_put_back_as_it_was_and_continues_after_its_round(tmp_path):
    s = midway()
    write_checkpoint(tmp_path, 3, s.checkpoint.state(), s.settings)
    done, saved = read_checkpoint(tmp_path, counting(**{"resume-from": str(tmp_path)}).settings)
    back = counting()
    back.checkpoint.resume(saved, done)
    assert back.rounds_done == 3 and back.identify_everyone  # node ids change between runs: ask them all again
    assert [asdict(r) for r in back.history] == [asdict(r) for r in s.history]
    assert back.failures == s.failures and back.client_eval == s.client_eval and back.seen == 5
    assert back.schedule.pending == 3 and back.rng.random() == s.rng.random()
    assert back.global_state.keys() == s.global_state.keys()
    for k, v in s.global_state.items():
        np.testing.assert_array_equal(back.global_state[k], v)
    back.gate.reject(4, 71, "train", "no reply within 1 s (round-timeout)")
    assert [f["round"] for f in back.failures] == [3, 4]  # the run's failures go on in the same list
    assert back.client_of == {}  # who each node is is not saved: the nodes are new


def test_a_resumed_dp_strategy_draws_from_the_os_csprng_and_keeps_what_dp_kept_across_rounds(tmp_path):
    """Under DP the cohorts come from the operating system's CSPRNG: no state of it is in the checkpoint (one that
    were could be read back and the draws replayed), and a resumed run draws afresh; the calibrated noise multiplier,
    the adapted clip bound and the ledger of releases made come back."""
    import random

    dp = {"dp-mode": "central", "dp-target-epsilon": 8.0, "dp-adaptive-clip": True}
    s = counting(**dp)
    s.history = [RoundLog(1)]
    assert isinstance(s.rng, random.SystemRandom)
    made = {"id": "x", "round": 1, "mode": "central", "noise-multiplier": 1.7, "sampling": "all", "rate": 1.0}
    s.privacy.noise_multiplier, s.privacy.clip, s.privacy.count_stddev, s.privacy.ledger = (
        1.7,
        0.4,
        0.2,
        [{**made, "count": 1}],
    )
    fresh = counting(**dp)
    assert fresh.privacy.noise_multiplier is None  # calibrated at the first round, for the population it draws from
    state = s.checkpoint.state()
    assert state["base"]["rng"] is None
    write_checkpoint(tmp_path, 1, state, s.settings)
    done, saved = read_checkpoint(tmp_path, counting(**dp, **{"resume-from": str(tmp_path)}).settings)
    fresh.checkpoint.resume(saved, done)
    assert isinstance(fresh.rng, random.SystemRandom)
    assert (
        fresh.privacy.state()
        == s.privacy.state()
        == {
            "noise-multiplier": 1.7,
            "clip": 0.4,
            "count-stddev": 0.2,
            "ledger": [{**made, "count": 1}],
        }
    )
    assert fresh.privacy.resumed_after == 1


@pytest.mark.parametrize("with_folder", [True, False])
def test_after_a_round_models_and_checkpoints_are_written_when_due_and_stop_after_stops(tmp_path, with_folder):
    s = counting(**{"checkpoint-every": 2, "save-every": 4, "stop-after": 4})
    s.results_dir = tmp_path / "run" if with_folder else None
    for r in range(1, 5):
        s.history.append(RoundLog(r))
        if r < 4:
            s.checkpoint.after_round(r)
            continue
        with pytest.raises(SimulatedCrash, match=re.escape("stop-after=4") + ".*" + re.escape(f"='{s.results_dir}'")):
            s.checkpoint.after_round(r)
    if not with_folder:
        assert not any(tmp_path.iterdir()) and all("checkpoint-seconds" not in r.extra for r in s.history)
        return
    run = tmp_path / "run"
    due = [r.server_round for r in s.history if "checkpoint-seconds" in r.extra]
    assert due == [2, 4] and all(r.extra["checkpoint-seconds"] >= 0 for r in s.history if r.server_round in due)
    done, saved = read_checkpoint(run, counting(**{"resume-from": str(run)}).settings)
    assert done == 4 and len(saved["base"]["history"]) == 4  # the crash came after the round's checkpoint
    manifest = read_manifest(run / "models" / "server" / "global")
    assert manifest["round"] == 4  # save-every 4: round 4's model, not round 2's


def test_the_last_round_the_loop_was_given_is_checkpointed_too(tmp_path):
    s = counting(**{"checkpoint-every": 2, "num-server-rounds": 3})
    s.results_dir = tmp_path
    s.schedule.last_round = 5  # start's num_rounds: the run's last round
    for r in range(1, 6):
        s.history.append(RoundLog(r))
        s.checkpoint.after_round(r)
    assert [r.server_round for r in s.history if "checkpoint-seconds" in r.extra] == [2, 4, 5]


def test_a_checkpoint_that_holds_the_generator_itself_still_resumes(tmp_path):
    """Checkpoints written before the base gave its parts' state as plain data held the cohort generator object, and
    no holdout; they still resume, drawing on from where the run stopped."""
    s = midway()
    state = s.checkpoint.state()
    state["base"]["rng"] = s.rng  # the older format: the generator itself
    del state["base"]["holdout-first"]
    write_checkpoint(tmp_path, 3, state, s.settings)
    done, saved = read_checkpoint(tmp_path, counting(**{"resume-from": str(tmp_path)}).settings)
    back = counting()
    back.checkpoint.resume(saved, done)
    assert back.rng.random() == s.rng.random() and back.holdout.first == -1
    assert back.checkpoint.state()["base"]["rng"] == s.checkpoint.state()["base"]["rng"]
