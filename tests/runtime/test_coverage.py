"""A summary never hides how few clients it speaks for: every mean over clients in the summary line and summary.json
says over how many of the clients asked it is when that is fewer than all, and a mean over less than ``min-coverage``
of them ends the run as failed, with the reason (server_app/coverage.py).  A benchmark table never ranks such a run.
The run through Flower is tests/baselines/test_e2e.py's run with bad replies."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from benchmarks.records import ok
from server_app.app import build_strategy
from server_app.coverage import Covered, coverage, shortfall
from server_app.results import ResultsWriter
from strategies.history import progress_line
from strategies.outcome import RoundLog
from task.config import parse_settings
from tests.strategy_harness import ReplayGrid, outgoing_messages, phase_of, reply_message, run_round, valid_content

NODES = [1003, 7, 42, 555]
CLIENT_OF = {n: i for i, n in enumerate(NODES)}


def run(rejected: dict[str, set[int]], cfg: dict[str, Any], rounds: int = 2):
    """A fedavg run of 4 scripted clients whose last round's ``phase`` replies from the clients in
    ``rejected[phase]`` are errors (a client that crashed); (strategy, summary line, summary.json, its shortfall)."""
    settings = parse_settings(
        {"method": "fedavg", "model": "mlp", "min-nodes": 4, "num-server-rounds": rounds, "eval-every": 1, **cfg}
    )
    strategy = build_strategy(settings)

    def respond(msg):
        node, phase = msg.metadata.dst_node_id, phase_of(msg)
        server_round = int(msg.content["config"]["server-round"])
        if server_round == rounds and CLIENT_OF[node] in rejected.get(phase, set()):
            return [reply_message(node, error="injected crash")]
        seed = zlib.crc32(f"{server_round}/{phase}/{node}".encode())
        return [reply_message(node, valid_content(strategy.reply_spec(phase, node), CLIENT_OF[node], seed))]

    grid = ReplayGrid(NODES, respond)
    with outgoing_messages():
        for r in range(1, rounds + 1):
            run_round(strategy, grid, r)
    short = shortfall(coverage(strategy.history), settings.min_coverage)
    writer = ResultsWriter(settings, run_id=1)
    line = writer.write(strategy.results(), 1.0, aborted=short)
    return strategy, line, json.loads((writer.folder / "summary.json").read_text()), short


def test_a_run_every_client_answered_says_nothing_more_and_meets_its_coverage(tmp_path):
    _, line, summary, short = run({}, {"results-dir": str(tmp_path)})
    assert short is None and " of 4 clients" not in line and "ABORTED" not in line
    assert summary["coverage"] == {
        "covered": 4,
        "total": 4,
        "min-share": 0.5,
        "met": True,
        "by-mean": {"evaluation": {"covered": 4, "total": 4}, "training": {"covered": 4, "total": 4}},
    }


def test_means_over_fewer_clients_than_asked_say_so_beside_each_number(tmp_path):
    strategy, line, summary, short = run({"evaluate": {3}}, {"results-dir": str(tmp_path)})
    final = strategy.history[-1].evaluate
    assert short is None and "ABORTED" not in line  # 3 of 4 is above the default min-coverage of 0.5
    assert f"personalized acc {final['personal-acc']:.4f} over 3 of 4 clients (over clients: std " in line
    assert f"global acc {final['global-acc']:.4f} over 3 of 4 clients, " in line
    assert summary["coverage"]["covered"] == 3 and summary["coverage"]["total"] == 4 and summary["coverage"]["met"]
    assert summary["personal-acc"] == pytest.approx(final["personal-acc"])  # the number, over the 3 that replied
    # the progress line of the round says it too
    assert "personal-acc" in progress_line("fedavg", 2, 2, 2, 0.0, final, "") and " over 3 of 4 clients |" in (
        progress_line("fedavg", 2, 2, 2, 0.0, final, "")
    )


def test_a_final_evaluation_over_fewer_than_min_coverage_of_the_clients_fails_the_run_with_the_reason(tmp_path):
    _, line, summary, short = run({"evaluate": {1, 2, 3}}, {"results-dir": str(tmp_path)})
    assert short == (
        "the final evaluation (personalized and global accuracy and loss, their spread over clients) covers 1 of 4 "
        "clients: less than min-coverage=0.5 of the clients asked, too few for a mean over clients (failures.json says "
        "why each other client's reply was rejected)"
    )
    assert summary["aborted"] == short and summary["coverage"]["met"] is False
    assert summary["coverage"]["covered"] == 1 and summary["coverage"]["total"] == 4
    assert " over 1 of 4 clients (over clients: " in line and line.split(" -> ")[0].endswith(f"ABORTED: {short}")


def test_training_replies_from_too_few_clients_fail_the_run_too(tmp_path):
    _, _, summary, short = run({"train": {0, 1, 2}}, {"results-dir": str(tmp_path)})
    assert short is not None and short.startswith(
        "the last round's training (the accuracy after local training) covers 1 of 4 clients: less than min-coverage"
    )
    assert summary["coverage"]["by-mean"]["training"] == {"covered": 1, "total": 4}
    assert summary["coverage"]["by-mean"]["evaluation"] == {"covered": 4, "total": 4}


def test_min_coverage_is_the_share_a_run_asks_for(tmp_path):
    _, _, summary, short = run({"evaluate": {3}}, {"results-dir": str(tmp_path), "min-coverage": 0.8})
    assert short is not None and "covers 3 of 4 clients: less than min-coverage=0.8" in short
    assert summary["coverage"]["min-share"] == 0.8 and not summary["coverage"]["met"]
    _, _, _, short = run({"evaluate": {1, 2, 3}}, {"results-dir": str(tmp_path), "min-coverage": 0.0})
    assert short is None  # 0: any mean is reported, each with over how many clients it is


def test_the_newcomers_means_are_covered_by_the_held_out_clients_that_replied():
    last = RoundLog(
        3, evaluate={"num-replies": 4, "num-asked": 4}, extra={"newcomers": {"asked": [4, 5], "clients": [5]}}
    )
    assert coverage([RoundLog(1), last]) == {"evaluation": Covered(4, 4), "newcomers": Covered(1, 2)}
    assert shortfall(coverage([last]), 0.5) is None
    assert shortfall(coverage([last]), 0.6) == (
        "the newcomers' evaluation (held-out clients) covers 1 of 2 clients: less than min-coverage=0.6 of the "
        "clients asked, too few for a mean over clients (failures.json says why each other client's reply was rejected)"
    )


def test_a_benchmark_table_never_ranks_a_run_whose_means_covered_too_few_clients():
    def record(met):
        coverage_entry = None if met is None else {"covered": 1, "total": 4, "met": met}
        return {"cell": {"seed": 0}, "error": None, "summary": {"personal-acc": 1.0, "coverage": coverage_entry}}

    kept = ok([record(True), record(False), record(None)])  # None: a record from before coverage was reported
    assert [r["summary"]["coverage"] for r in kept] == [{"covered": 1, "total": 4, "met": True}, None]
