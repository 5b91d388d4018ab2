"""The run's history (strategies/history.py): a round's metric means over its replies, plain and weighted by
training examples, the maxima of its timings, each client's last evaluation, what the server spent on a round,
and the lines logged about it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from strategies import history
from strategies.history import (
    accuracies,
    add_seconds,
    close_round,
    evaluation_metrics,
    late_evaluation_line,
    mean_metrics,
    note_timing,
    progress_line,
    record_evaluation,
    train_metrics,
)
from strategies.outcome import RoundLog


def reply(n: int, client: int = 0, **metrics):
    return SimpleNamespace(num_examples=n, client=client, metrics={k.replace("_", "-"): v for k, v in metrics.items()})


def test_means_are_over_the_replies_that_carry_a_metric_plain_or_weighted_by_examples():
    replies = [reply(1, personal_acc=0.2, global_acc=0.9), reply(3, personal_acc=0.6), reply(0, personal_acc=1.0)]
    assert mean_metrics(replies, ["personal-acc", "global-acc", "absent"]) == pytest.approx(
        {"personal-acc": 0.6, "global-acc": 0.9}
    )
    assert mean_metrics(replies, ["personal-acc"], weighted=True) == pytest.approx({"personal-acc": 0.5})
    zero = [reply(0, personal_acc=0.2), reply(0, personal_acc=0.4)]  # no examples at all: the plain mean
    assert mean_metrics(zero, ["personal-acc"], weighted=True) == pytest.approx({"personal-acc": 0.3})
    one = [reply(1, personal_acc=0.2), reply(0, personal_acc=0.6)]  # a single example in all: it alone counts
    assert mean_metrics(one, ["personal-acc"], weighted=True) == pytest.approx({"personal-acc": 0.2})
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
            "personal-acc-std": 0.2,
            "personal-acc-min": 0.2,
            "personal-acc-p10": 0.24,
            "personal-loss-std": 0.5,
            "personal-loss-max": 2.0,
            "personal-loss-p90": 1.9,
            "num-replies": 2,
        }
    )


def test_a_rounds_evaluation_record_has_the_spread_over_the_clients_that_carry_each_metric():
    """The worst client and the worst tenth of the clients: the lowest accuracies, the highest losses; whatever
    each client trained on (the spread is over clients, not examples)."""
    accs = [k / 10 for k in range(11)]  # eleven clients 0.0, 0.1, ..., 1.0: the tenth percentile is the second
    replies = [reply(100 - k, personal_acc=a, personal_loss=1 - a) for k, a in enumerate(accs)]
    replies[3].metrics["global-acc"] = 0.7  # one client scored a global model too: its own spread of one
    got = evaluation_metrics(replies)
    assert got["personal-acc-min"] == 0.0 and got["personal-acc-p10"] == pytest.approx(0.1)
    assert got["personal-loss-max"] == 1.0 and got["personal-loss-p90"] == pytest.approx(0.9)
    assert got["personal-acc-std"] == pytest.approx(got["personal-loss-std"]) == pytest.approx(0.1 * 10**0.5)
    assert (got["global-acc-std"], got["global-acc-min"], got["global-acc-p10"]) == (0.0, 0.7, 0.7)
    assert not any(k.startswith("global-loss") for k in got)  # no client sent it


def test_the_progress_line_gives_the_accuracies_or_how_the_round_was_evaluated_and_the_time_left(monkeypatch):
    monkeypatch.setattr(history.time, "monotonic", lambda: 130.0)
    assert accuracies({"global-acc": 0.25, "personal-acc": 0.5, "other": 1}) == "personal-acc 0.5000, global-acc 0.2500"
    line = progress_line("fedavg", 3, 10, 3, 100.0, {"personal-acc": 0.5}, "not evaluated")
    assert line == "[fedavg] round 3/10 done: personal-acc 0.5000 | 10.0 s/round, ETA 70 s"
    resumed = progress_line("fedavg", 8, 10, 2, 110.0, {}, "not evaluated this round")  # rounds 7-8 after a resume
    assert resumed == "[fedavg] round 8/10 done: not evaluated this round | 10.0 s/round, ETA 20 s"
    assert progress_line("x", 1, 1, 0, 130.0, {}, "-").endswith("0.0 s/round, ETA 0 s")  # no round yet: no division
    assert progress_line("x", 1, 4, 1, 118.0, {}, "-").endswith("12.0 s/round, ETA 36 s")  # the first round alone


def test_an_evaluation_goes_to_its_own_round_and_keeps_each_clients_last_numeric_metrics():
    rounds = [RoundLog(1), RoundLog(2)]
    client_eval = {7: {"personal-acc": 0.1}, 8: {"personal-acc": 0.3}}
    first = [reply(1, client=7, personal_acc=0.5, note="text"), reply(3, client=9, personal_acc=0.9, correct=3)]
    means = record_evaluation(rounds, client_eval, 1, first)  # round 1's evaluation, come with round 2's replies
    assert means == evaluation_metrics(first) and rounds[0].evaluate == means and rounds[1].evaluate == {}
    assert client_eval == {7: {"personal-acc": 0.5}, 8: {"personal-acc": 0.3}, 9: {"personal-acc": 0.9, "correct": 3.0}}
    assert isinstance(client_eval[9]["correct"], float)  # numbers kept as floats
    assert record_evaluation(rounds, client_eval, 2, []) == {"num-replies": 0} == rounds[1].evaluate
    assert set(client_eval) == {7, 8, 9}  # a round nobody answered forgets no one


def test_a_late_evaluation_is_logged_with_the_round_whose_train_replies_brought_it():
    line = late_evaluation_line("ditto", 4, {"personal-acc": 0.75, "num-replies": 2})
    assert line == "[ditto] round 4 evaluated (with round 5's train replies): personal-acc 0.7500"
    assert late_evaluation_line("ditto", 1, {"num-replies": 0}).endswith("train replies): no evaluation replies")


def test_server_seconds_add_up_in_the_round_in_progress_and_other_keys_apart():
    rounds = [RoundLog(1), RoundLog(2), RoundLog(3)]
    add_seconds(rounds, 0.25)
    add_seconds(rounds, 0.5)
    add_seconds(rounds, 2.0, key="index-seconds")
    assert rounds[-1].extra == {"server-seconds": 0.75, "index-seconds": 2.0}
    assert rounds[0].extra == rounds[1].extra == {}  # earlier rounds are closed
    add_seconds([], 1.0)  # before the first round there is nothing to add to


def test_message_timing_is_recorded_per_phase_in_the_round_in_progress():
    rounds = [RoundLog(1), RoundLog(2), RoundLog(3)]
    note_timing(rounds, "train", {"total": 1.5})
    note_timing(rounds, "identify", {"total": 0.5})
    note_timing(rounds, "evaluate", None)  # no reply carried stamps
    assert rounds[-1].extra == {"message-timing": {"train": {"total": 1.5}, "identify": {"total": 0.5}}}
    assert rounds[0].extra == rounds[1].extra == {}
    note_timing([], "train", {"total": 1.0})  # before the first round: nothing to record it in


def test_a_closed_round_has_its_bytes_seconds_and_the_servers_peak_memory_in_mb():
    def peak_mb() -> float:  # Linux reports ru_maxrss in KiB
        return history.resource.getrusage(history.resource.RUSAGE_SELF).ru_maxrss / 1024.0

    entry = RoundLog(3, extra={"server-seconds": 0.5})
    before = peak_mb()
    close_round(entry, {"train-bytes-down": 10, "train-bytes-up": 4}, 2.5)
    assert entry.extra["comm"] == {"train-bytes-down": 10, "train-bytes-up": 4} and entry.extra["seconds"] == 2.5
    assert entry.extra["server-seconds"] == 0.5  # what the round recorded before stays
    assert before <= entry.extra["server-peak-rss-mb"] <= peak_mb()
