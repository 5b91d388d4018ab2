"""What a run reports under an attack or a robust rule (strategies/attack_report.py): the honest clients' accuracy
with the attackers' own left out, the backdoor's success on honest clients, and whether the method's mechanism or
the rule isolated the attackers, in rounds.json, robustness.json and summary.json."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from server_app.app import build_strategy
from server_app.results import ResultsWriter, robustness_entries
from strategies.attack_report import (
    grouping,
    honest_metrics,
    mechanism,
    report,
    rule_outcome,
    with_attack_metrics,
)
from strategies.gate import parse_reply
from strategies.outcome import RoundLog
from strategies.persistence import read_checkpoint
from strategies.replies import EVALUATE, InvalidReply
from task.config import parse_settings
from tests.in_process import NODES, run_in_process
from tests.strategy_harness import drive

ATTACKER = 1  # at the default attack-share 0.3 of 3 or 4 partitions


def reply(client, **metrics):
    return SimpleNamespace(client=client, num_examples=10, metrics=metrics)


def test_the_honest_means_leave_the_attackers_own_accuracy_out():
    settings = parse_settings({"attack": "backdoor"})
    updates = [
        reply(0, **{"personal-acc": 0.8, "backdoor-success": 0.1}),
        reply(1, **{"personal-acc": 0.2, "backdoor-success": 1.0}),  # the attacker
        reply(2, **{"personal-acc": 0.6}),  # no test input of another class than the target
        reply(3, **{"personal-acc": 0.7, "backdoor-success": 0.3}),
    ]
    got = honest_metrics(settings, updates)
    assert got["honest-personal-acc"] == pytest.approx(0.7) and got["attackers-personal-acc"] == pytest.approx(0.2)
    assert got["backdoor-success"] == pytest.approx(0.2) and got["honest-replies"] == 3
    assert honest_metrics(parse_settings({}), updates) == {}


def test_backdoor_success_is_declared_in_an_evaluation_only_under_a_backdoor():
    evaluation = {"partition-id": 0, "num-examples": 5, "personal-acc": 0.5, "personal-loss": 1.0}
    spec = with_attack_metrics(EVALUATE, parse_settings({"attack": "backdoor"}))
    metrics, _ = parse_reply(content({**evaluation, "backdoor-success": 0.25}), spec)
    assert metrics["backdoor-success"] == 0.25
    assert "backdoor-success" not in parse_reply(content(evaluation), spec)[0]  # optional
    with pytest.raises(InvalidReply, match="'backdoor-success' must be in"):
        parse_reply(content({**evaluation, "backdoor-success": 1.5}), spec)
    assert with_attack_metrics(EVALUATE, parse_settings({"attack": "sign-flip"})) == EVALUATE


def content(metrics):
    return RecordDict({"metrics": MetricRecord(metrics)})


def test_a_grouping_isolates_the_attackers_when_no_honest_client_shares_their_group():
    assert grouping({0: 0, 1: 1, 2: 0, 3: 1}, {1, 3})["isolated"] is True
    shared = grouping({0: 0, 1: 1, 2: 1, 3: 0}, {1})
    assert shared["isolated"] is False and shared["honest-with-an-attacker"] == 1 and shared["of-attackers"] == {"1": 1}
    assert grouping({0: 0, 2: 0}, {1})["isolated"] is False  # an attacker in no group was not isolated by it


def test_fedcacs_report_counts_the_honest_clients_that_chose_an_attacker_each_round():
    history = [RoundLog(1, extra={"fedcac": {"collaborators": {0: [1], 1: [0, 2], 2: [1, 0]}}}), RoundLog(2)]
    strategy = SimpleNamespace(name="fedcac", history=history)
    report = mechanism(strategy, {1})["collaborators"]
    assert report["by-round"] == {"1": {"honest-choosing-an-attacker": 2, "times-attackers-chosen": 2}}
    assert report["isolated"] is False


def test_fedc2is_report_compares_the_weight_honest_clients_gave_attackers_and_honest_peers():
    influence = {3: {0: {0: 0.5, 1: 0.1, 2: 0.4}, 1: {1: 1.0, 0: 0.0, 2: 0.0}, 2: {2: 0.6, 0: 0.3, 1: 0.1}}}
    report = mechanism(SimpleNamespace(name="fedc2i", influence=influence), {1})["influence"]
    assert report["mean-weight-by-round"]["3"] == {"to-an-attacker": pytest.approx(0.1), "to-an-honest-peer": 0.35}


def test_the_rule_report_gives_the_share_of_attackers_and_honest_models_kept_and_clipped():
    history = [
        RoundLog(1, extra={"robust": [{"group": "global", "clients": [0, 1, 2], "selected": [0, 2]}]}),
        RoundLog(2, extra={"robust": [{"group": "global", "clients": [0, 1, 2], "selected": [0, 1]}]}),
    ]
    out = rule_outcome(history, {1})
    assert out["share-kept"] == {"attackers": 0.5, "honest": 0.75} and out["isolated"] is False
    clipped = [RoundLog(1, extra={"robust": [{"clients": [0, 1], "clipped": [1], "update-norms": [1, 9]}]})]
    assert rule_outcome(clipped, {1})["share-clipped"] == {"attackers": 1.0, "honest": 0.0}
    assert rule_outcome([RoundLog(1)], {1}) == {}


def test_the_rule_report_gives_fltrusts_mean_trust_and_the_averages_outside_the_rules_assumption():
    history = [
        RoundLog(
            1,
            extra={
                "robust": [
                    {
                        "clients": [0, 1, 2],
                        "trust": [0.8, 0.0, 0.6],
                        "liars": 1,
                        "tolerated": 1,
                        "outside-assumption": False,
                    }
                ]
            },
        ),
        RoundLog(
            2,
            extra={
                "robust": [
                    {"clients": [0, 1], "trust": [1.0, 0.2], "liars": 1, "tolerated": 0, "outside-assumption": True}
                ]
            },
        ),
    ]
    out = rule_outcome(history, {1})
    assert out["mean-trust"] == {"attackers": pytest.approx(0.1), "honest": pytest.approx(0.8)}
    assert out["outside-assumption"] == {"averages": 1, "of": 2, "most-liars": 1}
    record = {"attack": "sign-flip", "aggregator": "bulyan", "attackers": [1], "mechanism": {}, "rule": out}
    assert robustness_entries(record, {})["outside-assumption"] == 1


def written(strategy):
    """(summary.json, robustness.json or None, rounds.json) as the ServerApp writes them at the end of the run."""
    writer = ResultsWriter(strategy.settings, run_id=1)
    writer.write(strategy.results(), 1.0)
    folder = writer.folder
    robustness = folder / "robustness.json"
    record = json.loads(robustness.read_text()) if robustness.exists() else None
    return json.loads((folder / "summary.json").read_text()), record, json.loads((folder / "rounds.json").read_text())


def run(tmp_path, name, **config):
    (tmp_path / name).mkdir()
    extra = {"record-messages": False, "results-dir": str(tmp_path / name), **config}
    return run_in_process("fedavg", tmp_path / name, **extra)[0]


def test_a_backdoored_run_reports_the_honest_clients_accuracy_and_the_backdoors_success(tmp_path):
    strategy = run(tmp_path, "backdoor", attack="backdoor")
    summary, record, rounds = written(strategy)
    honest = [m["personal-acc"] for c, m in strategy.client_eval.items() if c != ATTACKER]
    assert summary["attackers"] == [ATTACKER] == record["attackers"] and record["clients"] == list(range(NODES))
    assert summary["honest-personal-acc"] == pytest.approx(np.mean(honest))
    assert summary["attackers-personal-acc"] == pytest.approx(strategy.client_eval[ATTACKER]["personal-acc"])
    successes = [m["backdoor-success"] for c, m in strategy.client_eval.items() if c != ATTACKER]
    assert summary["backdoor-success"] == pytest.approx(np.mean(successes)) and 0 <= summary["backdoor-success"] <= 1
    assert set(record["by-round"]) == {"1", "2"}
    assert all("honest-personal-acc" in r["evaluate"] and "backdoor-success" in r["evaluate"] for r in rounds)


def test_a_run_without_attack_or_rule_reports_nothing_more_and_a_rule_alone_reports_what_it_did(tmp_path):
    summary, record, _ = written(run(tmp_path, "plain"))
    assert record is None and "attackers" not in summary and "aggregator" not in summary
    summary, record, _ = written(run(tmp_path, "ruled", aggregator="norm-bound"))
    assert summary["aggregator"] == "norm-bound" and summary["attackers"] == [] and record["attack"] == "none"
    assert record["rule"]["models-offered"] == {"attackers": 0, "honest": 2 * NODES}


@pytest.mark.parametrize("method,rule", [("fedavg", "multi-krum"), ("cfl", "norm-bound"), ("fedcac", "median")])
def test_a_resumed_run_reports_what_the_uninterrupted_run_reports(tmp_path, method, rule):
    """What the rule kept or clipped, the honest means and the mechanism's verdicts, rounds before the checkpoint
    included, whatever node ids the resumed run's clients have (replies drawn per round, phase and client)."""
    own = {"cfl": {"cfl-min-rounds": 1}, "fedcac": {"beta": 2}}.get(method, {})
    config = {"method": method, "model": "mlp", "min-nodes": 4, "num-server-rounds": 3, "attack": "sign-flip"}
    settings = parse_settings({**config, "aggregator": rule, **own})
    nodes, others = {1003: 0, 7: 1, 42: 2, 555: 3}, {9: 2, 70001: 0, 31: 3, 12: 1}
    whole = build_strategy(settings)
    whole.results_dir = tmp_path / "a"
    drive(whole, nodes, 3)
    interrupted = build_strategy(settings)
    interrupted.results_dir = tmp_path / "b"
    drive(interrupted, nodes, 1)
    done, saved = read_checkpoint(tmp_path / "b", settings)
    resumed = build_strategy(settings)
    resumed.checkpoint.resume(saved, done)
    resumed.results_dir = tmp_path / "b"
    drive(resumed, others, range(2, 4))
    expected = report(whole)
    assert expected["attackers"] == [1] and expected["rule"]["models-offered"]["attackers"] >= 3
    assert report(resumed) == expected
