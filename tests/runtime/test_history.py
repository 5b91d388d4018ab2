"""The run's history (strategies/history.py): a round's metric means over its replies, plain and weighted by
training examples, the maxima of its timings, and the progress line logged after it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from strategies import history
from strategies.history import accuracies, evaluation_metrics, mean_metrics, progress_line, train_metrics


def reply(n: int, **metrics):
    return SimpleNamespace(num_examples=n, metrics={k.replace("_", "-"): v for k, v in metrics.items()})


def test_means_are_over_the_replies_that_carry_a_metric_plain_or_weighted_by_examples():
    replies = [reply(1, personal_acc=0.2, global_acc=0.9), reply(3, personal_acc=0.6), reply(0, personal_acc=1.0)]
    assert mean_metrics(replies, ["personal-acc", "global-acc", "absent"]) == pytest.approx(
        {"personal-acc": 0.6, "global-acc": 0.9}
    )
    assert mean_metrics(replies, ["personal-acc"], weighted=True) == pytest.approx({"personal-acc": 0.5})
    zero = [reply(0, personal_acc=0.2), reply(0, personal_acc=0.4)]  # no examples at all: the plain mean
    assert mean_metrics(zero, ["personal-acc"], weighted=True) == pytest.approx({"personal-acc": 0.3})
    assert mean_metrics([], ["personal-acc"]) == {}


def test_a_rounds_train_record_has_the_means_the_maxima_of_its_timings_and_its_reply_count():
    replies = [
        reply(10, train_loss=1.0, trained_acc=0.5, time_train=2.0, time_method=0.5, peak_rss_mb=300.0),
        reply(30, train_loss=3.0, trained_acc=0.7, time_train=4.0),
    ]
    got = train_metrics(replies)
    assert got == pytest.approx(
        {
            "train-loss": 2.0,
            "trained-acc": 0.6,
            "time-train": 3.0,
            "time-method": 0.5,
            "time-train-max": 4.0,
            "time-method-max": 0.5,
            "peak-rss-mb-max": 300.0,
            "num-replies": 2,
        }
    )
    assert train_metrics([]) == {"num-replies": 0}


def test_a_rounds_evaluation_record_has_plain_and_weighted_means():
    replies = [reply(1, personal_acc=0.2, personal_loss=2.0), reply(3, personal_acc=0.6, personal_loss=1.0)]
    got = evaluation_metrics(replies)
    assert got == pytest.approx(
        {
            "personal-acc": 0.4,
            "personal-loss": 1.5,
            "personal-acc-weighted": 0.5,
            "personal-loss-weighted": 1.25,
            "num-replies": 2,
        }
    )


def test_the_progress_line_gives_the_accuracies_or_how_the_round_was_evaluated_and_the_time_left(monkeypatch):
    monkeypatch.setattr(history.time, "monotonic", lambda: 130.0)
    assert accuracies({"global-acc": 0.25, "personal-acc": 0.5, "other": 1}) == "personal-acc 0.5000, global-acc 0.2500"
    line = progress_line("fedavg", 3, 10, 3, 100.0, {"personal-acc": 0.5}, "not evaluated")
    assert line == "[fedavg] round 3/10 done: personal-acc 0.5000 | 10.0 s/round, ETA 70 s"
    resumed = progress_line("fedavg", 8, 10, 2, 110.0, {}, "not evaluated this round")  # rounds 7-8 after a resume
    assert resumed == "[fedavg] round 8/10 done: not evaluated this round | 10.0 s/round, ETA 20 s"
    assert progress_line("x", 1, 1, 0, 130.0, {}, "-").endswith("0.0 s/round, ETA 0 s")  # no round yet: no division
