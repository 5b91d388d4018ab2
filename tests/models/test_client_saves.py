"""A client saves its personalized model where the node says, else where the server's message says, when the message
asks (``save-model``); with ``save-best`` only a model better than the one saved before replaces it (README:
"models come out per client")."""

import json

import pytest
from flwr.app import ConfigRecord, RecordDict

from server_app.app import build_strategy
from task.config import parse_settings
from task.export import read_manifest
from tests.client_kit import client, context
from tests.in_process import NODES, run_in_process


def evaluate_message(strategy, rnd: int, **config) -> RecordDict:
    content = strategy.payload(1, rnd, "evaluate")
    content["config"] = ConfigRecord({"server-round": rnd, **config})
    return content


def fedavg_node():
    """A FedAvg strategy and one of its clients (partition 0), at the kit's settings."""
    ctx = context("fedavg")
    return build_strategy(parse_settings(ctx.run_config)), client("fedavg", None, ctx)


@pytest.mark.parametrize("node_dir", [False, True])
def test_a_client_saves_its_model_and_manifest_where_the_node_or_else_the_server_says(tmp_path, node_dir):
    ctx = context("fedavg")
    if node_dir:  # the node's own folder wins over the server's suggestion
        ctx.node_config["model-dir"] = str(tmp_path / "node")
    strategy = build_strategy(parse_settings(ctx.run_config))
    c = client("fedavg", None, ctx)
    reply = c.evaluate(evaluate_message(strategy, 3, **{"save-model": True, "model-dir": str(tmp_path / "server")}))
    folder = tmp_path / ("node" if node_dir else "server")
    assert sorted(p.name for p in folder.iterdir()) == ["client-0.json", "client-0.safetensors"]
    manifest = read_manifest(folder / "client-0")
    assert manifest["personal-acc"] == reply["metrics"]["personal-acc"]
    assert manifest["personal-loss"] == reply["metrics"]["personal-loss"]
    assert manifest["round"] == 3 and manifest["client"] == 0


def test_nothing_is_saved_unless_the_message_asks_or_without_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    strategy, c = fedavg_node()
    c.evaluate(evaluate_message(strategy, 1, **{"model-dir": str(tmp_path / "server")}))  # not asked
    c.evaluate(evaluate_message(strategy, 1, **{"save-model": True}))  # asked, but no folder anywhere
    assert list(tmp_path.rglob("*.safetensors")) == []


def test_with_save_best_only_a_better_model_replaces_the_saved_one(tmp_path):
    strategy, c = fedavg_node()
    ask = {"save-model": True, "model-dir": str(tmp_path), "save-best": True}
    c.evaluate(evaluate_message(strategy, 1, **ask))
    manifest_file = tmp_path / "client-0.json"
    better_before = {**json.loads(manifest_file.read_text()), "personal-acc": 2.0}  # no model can beat it
    manifest_file.write_text(json.dumps(better_before))
    c.evaluate(evaluate_message(strategy, 2, **ask))
    assert read_manifest(tmp_path / "client-0")["round"] == 1  # kept
    worse_before = {**better_before, "personal-acc": -1.0}  # any model beats it
    manifest_file.write_text(json.dumps(worse_before))
    c.evaluate(evaluate_message(strategy, 2, **ask))
    assert read_manifest(tmp_path / "client-0")["round"] == 2  # replaced
    manifest_file.write_text("not json")  # an unreadable manifest is replaced
    c.evaluate(evaluate_message(strategy, 3, **ask))
    assert read_manifest(tmp_path / "client-0")["round"] == 3


def test_an_equally_good_model_does_not_replace_the_saved_one_and_a_manifest_without_accuracy_does(tmp_path):
    strategy, c = fedavg_node()
    ask = {"save-model": True, "model-dir": str(tmp_path), "save-best": True}
    c.evaluate(evaluate_message(strategy, 1, **ask))
    c.evaluate(evaluate_message(strategy, 2, **ask))  # the same model again: as good, not better
    assert read_manifest(tmp_path / "client-0")["round"] == 1
    manifest_file = tmp_path / "client-0.json"
    manifest_file.write_text(
        json.dumps({k: v for k, v in json.loads(manifest_file.read_text()).items() if k != "personal-acc"})
    )
    c.evaluate(evaluate_message(strategy, 3, **ask))
    assert read_manifest(tmp_path / "client-0")["round"] == 3


def test_without_save_best_every_asked_save_replaces_the_model_and_names_the_round_it_evaluates(tmp_path):
    strategy, c = fedavg_node()
    c.evaluate(evaluate_message(strategy, 1, **{"save-model": True, "model-dir": str(tmp_path)}))
    manifest_file = tmp_path / "client-0.json"
    manifest_file.write_text(json.dumps({**json.loads(manifest_file.read_text()), "personal-acc": 2.0}))
    # a train message of round 4 that carries round 3's evaluation: the model is round 3's
    ask = {"save-model": True, "model-dir": str(tmp_path), "evaluate": True, "evaluate-round": 3}
    c.evaluate(evaluate_message(strategy, 4, **ask))
    assert read_manifest(tmp_path / "client-0")["round"] == 3


def test_a_run_with_the_users_defaults_leaves_each_client_its_model_of_the_last_round(tmp_path):
    """save-models is on by default: the last round's evaluate messages ask every client to save its model."""
    strategy, _, _, _ = run_in_process("fedavg", tmp_path)
    folder = strategy.results_dir / "models" / "clients"
    assert sorted(p.name for p in folder.glob("*.safetensors")) == [f"client-{i}.safetensors" for i in range(NODES)]
    assert {read_manifest(folder / f"client-{i}")["round"] for i in range(NODES)} == {strategy.settings.num_rounds}
