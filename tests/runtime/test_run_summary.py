"""What every run's summary says beyond the mean: the spread of the final personalized accuracy over clients (its
standard deviation, the worst client and the 10th percentile), in summary.json and on the summary line."""

from __future__ import annotations

import json

import numpy as np

from server_app.app import build_strategy
from server_app.results import ResultsWriter
from task.config import parse_settings
from tests.runtime.test_clustering_outcome import drive


def summarise(strategy):
    writer = ResultsWriter(strategy.settings, run_id=1)
    line = writer.write(strategy.results(), 1.0)
    return line, json.loads((writer.folder / "summary.json").read_text())


#: the personalized accuracy each of the 4 clients reports in the last round
LAST = {0: 0.5, 1: 0.95, 2: 0.8, 3: 0.7}


def _accuracies(server_round, phase, client, metrics):
    if phase == "evaluate":
        metrics["personal-acc"] = LAST[client] if server_round == 2 else 0.1


def test_the_summary_gives_the_spread_of_the_final_personalized_accuracy_over_clients(tmp_path):
    strategy = drive({"method": "fedavg", "results-dir": str(tmp_path)}, rounds=2, edit=_accuracies)
    line, summary = summarise(strategy)
    values = np.array(list(LAST.values()))
    assert summary["personal-acc"] == np.mean(values)
    assert summary["personal-acc-std"] == np.std(values)
    assert summary["personal-acc-min"] == 0.5
    assert summary["personal-acc-p10"] == np.percentile(values, 10)
    assert summary["personal-acc-min"] <= summary["personal-acc-p10"] <= summary["personal-acc"]
    spread = (
        f"personalized acc {values.mean():.4f} (over clients: std {values.std():.4f}, worst 0.5000, "
        f"10th percentile {np.percentile(values, 10):.4f}), global acc "
    )
    assert spread in line


def test_a_run_without_an_evaluation_has_no_spread_and_says_so_plainly(tmp_path):
    never = build_strategy(parse_settings({"method": "fedavg", "model": "mlp", "results-dir": str(tmp_path)}))
    line, summary = summarise(never)
    assert summary["personal-acc-std"] is None and summary["personal-acc-min"] is None
    assert "personalized acc n/a, global acc n/a" in line and "over clients" not in line
