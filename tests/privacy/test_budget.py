"""A privacy budget on the server's round loop (strategies/privacy.py: ServerPrivacy), driven without clients:
``dp-target-epsilon`` calibrates the noise before round 1 for the nodes that connected; ``dp-max-epsilon`` stops the
run before a round that would exceed it, with its checkpoint written and the reason in the summary; adaptive clipping
moves the clip bound by the noised count alone; a resumed local-DP run charges the releases of the rounds it
repeats."""

from __future__ import annotations

import itertools
import json
import logging

import numpy as np
import pytest
from flwr.app import RecordDict, UserConfigValue
from flwr.serverapp.exception import PrivacyBudgetExhausted

from server_app.app import build_strategy
from server_app.job import Exit, outcome
from server_app.results import ResultsWriter
from strategies.exchange import RunAborted
from strategies.persistence import read_checkpoint
from strategies.pfedlia import PFedLIAStrategy
from strategies.privacy import journaled_local_releases
from task.checkpoint import load_checkpoint
from task.config import parse_settings
from task.params import to_record
from task.privacy import calibrate_central, calibrate_local, central_epsilon, local_epsilon, next_clip
from tests.strategy_harness import build_as, drive

NODES = {21: 0, 22: 1, 23: 2, 24: 3}


def run_config(**over):
    return {"method": "fedavg", "model": "mlp", "dp-mode": "central", "min-nodes": 4, "num-server-rounds": 3, **over}


def test_a_target_epsilon_calibrates_the_noise_before_round_one_for_the_connected_nodes(caplog):
    strategy = build_strategy(parse_settings(run_config(**{"dp-target-epsilon": 4.0, "dp-noise-multiplier": 9.0})))
    with caplog.at_level(logging.INFO, logger="flwr.pflower"):
        drive(strategy, NODES, 3)
    dp = [r.extra["dp"] for r in strategy.history]
    sigma = calibrate_central(4.0, 1e-5, 3)
    assert all(d["noise-multiplier"] == sigma for d in dp)  # dp-noise-multiplier is replaced, not used
    assert 3.99 <= dp[-1]["epsilon"] <= 4.0  # the planned rounds spend the target, no more
    assert dp[0]["noise-std"] == pytest.approx(sigma * 1.0 / 4)
    said = f"[dp] noise multiplier {sigma:.4g}: epsilon 4 at delta 1e-05 after 3 rounds of every one of 4 clients"
    assert said in [r.getMessage() for r in caplog.records]


def test_the_run_stops_before_a_round_that_would_exceed_the_maximum_with_its_checkpoint_and_reason(tmp_path):
    two, three = (central_epsilon(1.0, r, 1e-5) for r in (2, 3))
    maximum = two  # a round that reaches the maximum exactly runs; the next one would exceed it
    cfg = run_config(**{"dp-max-epsilon": maximum, "num-server-rounds": 5, "checkpoint-every": 4})
    cfg["results-dir"] = str(tmp_path)
    settings = parse_settings(cfg)
    strategy = build_strategy(settings)
    writer = ResultsWriter(settings, run_id=3)
    strategy.results_dir = writer.folder
    with pytest.raises(PrivacyBudgetExhausted) as err:
        drive(strategy, NODES, 5)
    reason = str(err.value)
    assert reason.startswith(f"round 3 would take epsilon to {three:.4g} (delta 1e-05), above dp-max-epsilon=")
    assert "the run stops after round 2" in reason and f"resume-from='{writer.folder}'" in reason
    assert [r.server_round for r in strategy.history] == [1, 2]  # nothing of round 3 was logged ...
    done, _, _ = load_checkpoint(writer.folder / "checkpoints")
    assert done == 2  # ... and round 2's checkpoint was written, though checkpoint-every is 4, to resume from
    _, saved = read_checkpoint(writer.folder, parse_settings({**cfg, "resume-from": str(writer.folder)}))
    assert [r["server_round"] for r in saved["base"]["history"]] == [1, 2]
    line = writer.write(strategy.results(), 1.0, stopped=reason)
    summary = json.loads((writer.folder / "summary.json").read_text())
    assert summary["stopped"] == reason and summary["epsilon"] == pytest.approx(two) and two <= maximum
    assert f", STOPPED: {reason}" in line and "ABORTED" not in line
    # what python -m server_app.job (and the sweep's runner) read from it: the budget stop, exit 5
    assert summary["outcome"] == "budget-exhausted"
    assert outcome(0, line, summary) == (Exit.BUDGET_EXHAUSTED, f"privacy budget exhausted: {reason}")


def test_no_message_of_a_round_over_the_budget_leaves_the_server():
    maximum = (central_epsilon(1.0, 1, 1e-5) + central_epsilon(1.0, 2, 1e-5)) / 2
    strategy = build_strategy(parse_settings(run_config(**{"dp-max-epsilon": maximum})))
    grid = drive(strategy, NODES, 1)
    before = len(grid.sent)
    with pytest.raises(PrivacyBudgetExhausted):
        drive(strategy, NODES, [2])
    assert {int(m.content["config"]["server-round"]) for m in grid.sent[:before]} == {1}
    assert strategy.rounds_done == 1


def test_a_local_dp_run_stops_before_the_release_that_would_exceed_the_maximum():
    maximum = (local_epsilon(1.0, 2, 1e-5) + local_epsilon(1.0, 3, 1e-5)) / 2
    cfg = {"method": "fedc2i", "model": "mlp", "dp-mode": "local", "min-nodes": 4, "num-server-rounds": 4}
    strategy = build_strategy(parse_settings({**cfg, "dp-max-epsilon": maximum}))
    with pytest.raises(PrivacyBudgetExhausted, match=r"^round 3 would take epsilon to"):
        drive(strategy, NODES, 4)
    assert [r.extra["dp"]["releases"] for r in strategy.history] == [1, 2]


def test_pfedlias_clustering_round_counts_its_lazy_release_in_the_budget():
    """Round 2 is the clustering round: two releases (the lazy model and the train reply) take a client to three;
    a maximum between two and three releases stops the run before it, not after the lazy models left."""
    maximum = (local_epsilon(1.0, 2, 1e-5) + local_epsilon(1.0, 3, 1e-5)) / 2
    cfg = {"method": "pfedlia", "model": "mlp", "dp-mode": "local", "min-nodes": 4, "num-server-rounds": 3}
    strategy = build_as(PFedLIAStrategy, parse_settings({**cfg, "warmup-rounds": 1, "dp-max-epsilon": maximum}))
    with pytest.raises(PrivacyBudgetExhausted, match=r"^round 2 would take epsilon to"):
        drive(strategy, NODES, 3)
    assert strategy.lazy_queries == 0  # no lazy model was asked for


# ---------------------------------------------------------------------------------------------- adaptive clipping
def small_updates(strategy, norm=0.05):
    """Every client's update has norm ``norm`` (below the clip bound): the unclipped share is 1 before its noise."""

    def answer(server_round, node, phase, content):
        if phase == "train":
            keys = strategy.released_keys()
            size = sum(strategy.global_state[k].size for k in keys)
            step = np.float32(norm / np.sqrt(size))
            content["arrays"] = to_record({k: strategy.global_state[k] + step for k in keys})

    return answer


def test_adaptive_clipping_moves_the_bound_by_the_noised_count_and_never_above_dp_clip():
    cfg = run_config(**{"dp-adaptive-clip": True, "dp-clip-count-stddev": 0.6, "num-server-rounds": 4, "dp-clip": 0.8})
    strategy = build_strategy(parse_settings(cfg))
    drive(strategy, NODES, 4, small_updates(strategy))
    dp = [r.extra["dp"] for r in strategy.history]
    assert dp[0]["clip"] == 0.8  # it starts at dp-clip
    for before, after in itertools.pairwise(dp):  # each bound follows from the previous round's noised share
        assert after["clip"] == pytest.approx(min(next_clip(before["clip"], before["unclipped-share"], 0.5, 0.2), 0.8))
    assert strategy.privacy.clip == pytest.approx(
        min(next_clip(dp[-1]["clip"], dp[-1]["unclipped-share"], 0.5, 0.2), 0.8)
    )
    # the count took its share of the round's budget: the update's noise is above sigma's, epsilon is sigma's
    assert all(d["noise-std"] > 1.0 * d["clip"] / 4 for d in dp)
    assert dp[-1]["epsilon"] == pytest.approx(central_epsilon(1.0, 4, 1e-5))


def test_a_count_noise_that_would_spend_the_whole_round_stops_the_run_with_the_keys_to_change():
    cfg = run_config(**{"dp-adaptive-clip": True})  # the default count noise: a cohort of 4 / 20 = 0.2 < sigma / 2
    strategy = build_strategy(parse_settings(cfg))
    with pytest.raises(
        RunAborted, match=r"dp-clip-count-stddev, 0.2\) above half of the noise multiplier .*cohort of 4"
    ):
        drive(strategy, NODES, 1)


# ---------------------------------------------------------------------------------------------- local DP, resumed
LOCAL = {"method": "fedc2i", "model": "mlp", "dp-mode": "local", "min-nodes": 4, "num-server-rounds": 6}


def resumed_from(folder, run=LOCAL):
    """A strategy resumed from the last checkpoint in ``folder`` (local DP, checkpoint-every 2), as the ServerApp
    builds one."""
    cfg = {**run, "checkpoint-every": 2, "resume-from": str(folder)}
    done, saved = read_checkpoint(folder, parse_settings(cfg))
    strategy = build_strategy(parse_settings(cfg))
    strategy.checkpoint.resume(saved, done)
    strategy.results_dir = folder
    return strategy


def test_a_resumed_local_dp_run_charges_the_releases_of_the_rounds_it_repeats(tmp_path):
    """Rounds 1-3 ran, the checkpoint is of round 2 (checkpoint-every 2): round 3's releases left the clients and
    leave again, with fresh noise, when the resumed run repeats round 3.  Every client's epsilon counts both; a
    second crash in round 5 charges round 5's releases on top."""
    first = build_strategy(parse_settings({**LOCAL, "checkpoint-every": 2}))
    first.results_dir = tmp_path
    drive(first, NODES, 3)
    resumed = resumed_from(tmp_path)
    drive(resumed, NODES, [3, 4])
    dp = [r.extra["dp"] for r in resumed.history]
    assert [d["releases"] for d in dp] == [1, 2, 4, 5] and [d["charged"] for d in dp] == [0, 0, 1, 1]
    assert dp[-1]["epsilon"] == pytest.approx(local_epsilon(1.0, 5, 1e-5))
    # what a second resume charges from: the most releases a client may have made by round 4's end
    assert journaled_local_releases(tmp_path) == 5
    drive(resumed, NODES, [5])  # its releases leave, then the run crashes before round 6's checkpoint
    again = resumed_from(tmp_path)
    drive(again, NODES, [5])
    assert [r.extra["dp"]["releases"] for r in again.history][-2:] == [5, 7]
    assert again.history[-1].extra["dp"]["charged"] == 2


def test_a_resumed_pfedlia_run_charges_the_releases_of_the_round_it_repeats(tmp_path):
    """pFedLIA accounts its own rounds (the lazy release beside the train ones): a resume that repeats round 3 charges
    its release on top, as for every method."""
    run = {**LOCAL, "method": "pfedlia", "warmup-rounds": 1}
    first = build_strategy(parse_settings({**run, "checkpoint-every": 2}))
    first.results_dir = tmp_path
    drive(first, NODES, 3)
    uninterrupted = first.history[-1].extra["dp"]["releases"]
    resumed = resumed_from(tmp_path, run)
    drive(resumed, NODES, [3])
    dp = resumed.history[-1].extra["dp"]
    assert dp["charged"] == 1 and dp["releases"] == uninterrupted + 1
    assert dp["epsilon"] == pytest.approx(local_epsilon(1.0, uninterrupted + 1, 1e-5))


def test_a_run_resumed_right_after_its_checkpoint_charges_nothing(tmp_path):
    first = build_strategy(parse_settings({**LOCAL, "checkpoint-every": 2}))
    first.results_dir = tmp_path
    drive(first, NODES, 2)  # stopped right after round 2's checkpoint: no release of round 3 left
    resumed = resumed_from(tmp_path)
    drive(resumed, NODES, [3])
    assert [(r.extra["dp"]["releases"], r.extra["dp"]["charged"]) for r in resumed.history] == [(1, 0), (2, 0), (3, 0)]


def test_a_maximum_below_the_first_round_stops_before_anything_leaves_and_writes_no_checkpoint(tmp_path):
    cfg = run_config(**{"dp-max-epsilon": central_epsilon(1.0, 1, 1e-5) / 2, "results-dir": str(tmp_path)})
    strategy = build_strategy(parse_settings(cfg))
    strategy.results_dir = tmp_path / "run"
    with pytest.raises(PrivacyBudgetExhausted) as err:
        drive(strategy, NODES, 1)
    assert str(err.value).endswith("the run stops after round 0")  # nothing to resume from
    assert not strategy.history and not (tmp_path / "run" / "checkpoints").exists()


def test_a_maximum_below_one_is_a_maximum_too():
    cfg = run_config(**{"dp-noise-multiplier": 8.0, "dp-max-epsilon": central_epsilon(8.0, 1, 1e-5) / 2})
    assert cfg["dp-max-epsilon"] < 1
    strategy = build_strategy(parse_settings(cfg))
    with pytest.raises(PrivacyBudgetExhausted, match=r"^round 1 would take epsilon to"):
        drive(strategy, NODES, 1)


def test_adaptive_clipping_never_raises_the_bound_above_dp_clip():
    cfg = run_config(**{"dp-adaptive-clip": True, "dp-clip-count-stddev": 0.6, "dp-clip": 0.8})
    strategy = build_strategy(parse_settings(cfg))
    drive(strategy, NODES, 3, small_updates(strategy, norm=5.0))  # every update clipped: the bound wants to grow
    assert [r.extra["dp"]["clip"] for r in strategy.history] == [0.8, 0.8, 0.8] and strategy.privacy.clip == 0.8


def test_the_release_journal_keeps_every_whole_line_and_skips_one_a_crash_cut_short(tmp_path):
    """The journal's ledger is appended one line per release, flushed to the disk before the release can leave: a
    crash in the middle of a line leaves the lines before it whole, and the cut line (its release never left) is
    skipped, not read as a release or as an error."""
    from strategies.privacy import JOURNAL, LEDGER, journal_entry, journaled_entries, journaled_local_releases

    assert journaled_local_releases(tmp_path) == 0  # no journal yet: nothing journaled
    first = {"id": "a", "round": 1, "mode": "local", "noise-multiplier": 1.0, "sampling": "local", "rate": 1.0}
    journal_entry(tmp_path, {**first, "count": 1})
    journal_entry(tmp_path, {**first, "id": "b", "round": 2, "count": 2})
    with (tmp_path / JOURNAL / LEDGER).open("a") as fh:
        fh.write('{"id": "c", "round": 3, "mode": "lo')
    assert [e["id"] for e in journaled_entries(tmp_path)] == ["a", "b"]
    assert journaled_local_releases(tmp_path) == 3


def test_before_its_first_round_a_local_dp_run_journals_that_rounds_releases_only(tmp_path):
    """Nothing was released before round 1: the journal then holds round 1's releases (one model per client for
    FedC2I), and the budget is checked on that count."""
    from strategies.privacy import journaled_local_releases
    from tests.strategy_harness import strategy

    config: dict[str, UserConfigValue] = {"dp-mode": "local", "min-nodes": 4}
    s = strategy("fedc2i", **config)
    s.results_dir = tmp_path
    s.privacy.before_round(s, 1, 4)
    s.privacy.journal_local(s, 1)
    assert journaled_local_releases(tmp_path) == s.local_releases(1) == 1


# ---------------------------------------------------------------------------------------------- forecast and account
LOCAL_RUNS: dict[str, dict[str, UserConfigValue]] = {
    "fedc2i": {},
    "pfedlia": {"warmup-rounds": 1},  # round 2 clusters: the lazy model leaves beside the train reply
    "oracle": {"warmup-rounds": 1, "partition": "planted-clusters"},  # clusters by the planted groups: no lazy model
}


@pytest.mark.parametrize("method", sorted(LOCAL_RUNS))
def test_the_releases_the_budget_check_counts_before_a_round_are_those_the_round_then_accounts(tmp_path, method):
    """Before each local-DP round the server checks the budget against the releases a client will have made by its
    end (and journals that count for a resume); after the round it reports every client's epsilon over the releases
    made.  The two counts must agree in every round (warm-up, clustering, after): a forecast below the account would
    let a round exceed dp-max-epsilon, one above would stop a run early."""
    cfg = {"model": "mlp", "dp-mode": "local", "min-nodes": 4, "num-server-rounds": 4, **LOCAL_RUNS[method]}
    strategy = build_strategy(parse_settings({"method": method, **cfg}))
    strategy.results_dir = tmp_path
    forecast = []
    for server_round in range(1, 5):
        drive(strategy, NODES, [server_round])
        forecast.append(journaled_local_releases(tmp_path))
    accounted = [r.extra["dp"] for r in strategy.history]
    assert forecast == [d["releases"] for d in accounted]
    assert [d["clients"] for d in accounted] == [len(NODES)] * 4  # the valid train releases each round received
    if method == "pfedlia":  # the clustering round's lazy release is counted, once
        assert [b - a for a, b in itertools.pairwise([0, *forecast])] == [1, 2, 1, 1]


def test_under_local_dp_pfedlias_average_weighs_every_release_alike():
    """Training-set sizes are not noised, so under local DP the average is a post-processing of the releases alone:
    unweighted.  Without DP it is FedAvg, weighted by the sizes."""

    def averaged(dp_mode):
        cfg = {"method": "pfedlia", "model": "mlp", "min-nodes": 4, "num-server-rounds": 3, "warmup-rounds": 2}
        strategy = build_as(PFedLIAStrategy, parse_settings({**cfg, "dp-mode": dp_mode}))
        start = {k: v.copy() for k, v in strategy.global_state.items()}
        shift = {client: float(client + 1) for client in NODES.values()}  # client c moves every weight by c + 1
        sizes = {client: 10 * (client + 1) ** 2 for client in NODES.values()}

        def answer(server_round, node, phase, content):
            if phase == "train":
                client = NODES[node]
                keys = strategy.released_keys()
                content["arrays"] = to_record({k: start[k] + np.float32(shift[client]) for k in keys})
                content["metrics"]["num-examples"] = sizes[client]

        drive(strategy, NODES, [1], answer=answer)
        key = strategy.released_keys()[0]
        moved = float(np.mean(strategy.global_state[key] - start[key]))
        weighted = sum(sizes[c] * shift[c] for c in shift) / sum(sizes.values())
        return moved, float(np.mean(list(shift.values()))), weighted

    moved, mean, weighted = averaged("local")
    assert moved == pytest.approx(mean, abs=1e-4) and abs(mean - weighted) > 0.5
    moved, mean, weighted = averaged("off")
    assert moved == pytest.approx(weighted, abs=1e-4)


@pytest.mark.parametrize("method", ["fedc2i", "pfedlia"])
def test_a_local_dp_round_without_a_valid_reply_counts_with_no_client(method):
    """A client whose reply was rejected or never came may have released its model all the same: a round without a
    valid train reply counts one release more, and reports that no release reached the server (also as the run's
    first round, and after a round that had some)."""
    cfg = {"model": "mlp", "dp-mode": "local", "min-nodes": 4, "num-server-rounds": 4, "warmup-rounds": 3}
    strategy = build_strategy(parse_settings({"method": method, **cfg}))

    def nothing_valid_in_rounds_1_and_3(server_round, node, phase, content):
        if phase != "train" or server_round not in (1, 3):
            return None
        if node == min(NODES):
            return [RecordDict()]  # rejected: no metrics
        if node == max(NODES):
            del content["arrays"]  # rejected for another reason: no model
            return [content]
        return []  # never came

    drive(strategy, NODES, 3, answer=nothing_valid_in_rounds_1_and_3)
    dp = [r.extra["dp"] for r in strategy.history]
    assert [d["clients"] for d in dp] == [0, len(NODES), 0]
    assert [d["releases"] for d in dp] == [1, 2, 3]


# ---------------------------------------------------------------------------------------------- epsilon as made
def declared_noise(grid) -> dict[int, set[float]]:
    """Round -> the noise multipliers the round's train messages declared (what the clients noise with, local)."""
    out: dict[int, set[float]] = {}
    for m in grid.sent:
        if m.metadata.message_type == "train":
            config = m.content["config"]
            out.setdefault(int(config["server-round"]), set()).add(float(config["dp-noise-multiplier"]))
    return out


def exact_local_epsilon(sigmas: list[float], delta: float = 1e-5) -> float:
    """The exact epsilon of local releases with these noise multipliers: Gaussian mechanisms of sensitivity 2C and
    noise sigma_i C compose to one of mu = sqrt(sum (2 / sigma_i)^2) (Dong, Roth & Su 2022), whose curve is Balle &
    Wang 2018's, Theorem 8."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    mu = float(np.sqrt(sum((2 / s) ** 2 for s in sigmas)))

    def excess(eps):
        return norm.cdf(mu / 2 - eps / mu) - np.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    return float(brentq(excess, 0.0, 300.0, xtol=1e-10))


def test_a_resumed_local_dp_run_with_more_rounds_keeps_its_noise_and_reports_at_least_the_releases_made(tmp_path):
    """dp-target-epsilon 50 over 2 rounds gives sigma 0.424; resumed with num-server-rounds 4, the clients used to
    recalibrate to 0.599 and the accountant charged all four releases at 0.599: epsilon went 30.6, 50.0, 40.6, 50.0,
    while the releases as made (0.424, 0.424, 0.599, 0.599) are at 67.5.  Now the server keeps sigma, declares it in
    every round, and the epsilon is that of the releases made: never falling, never below the exact value."""
    run = {**LOCAL, "dp-target-epsilon": 50.0, "num-server-rounds": 2, "checkpoint-every": 1}
    first = build_strategy(parse_settings(run))
    first.results_dir = tmp_path
    before = declared_noise(drive(first, NODES, 2))
    resumed = resumed_from(tmp_path, {**run, "num-server-rounds": 4})
    after = declared_noise(drive(resumed, NODES, [3, 4]))
    sigma = calibrate_local(50.0, 1e-5, 2)
    assert round(sigma, 3) == 0.424 and {**before, **after} == {r: {sigma} for r in (1, 2, 3, 4)}
    epsilons = [r.extra["dp"]["epsilon"] for r in resumed.history]
    assert epsilons == sorted(epsilons) and 49.9 <= epsilons[1] <= 50.0
    made = exact_local_epsilon([sigma] * 4)
    assert made <= epsilons[-1] <= made + 0.01
    recalibrated = [sigma, sigma] + [calibrate_local(50.0, 1e-5, 4)] * 2  # what the clients used to release with
    assert round(exact_local_epsilon(recalibrated), 1) == 67.5 and epsilons[-1] >= 67.5


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_with_held_out_clients_the_target_is_met_for_the_population_actually_sampled(sampling):
    """10 nodes, 3 held out, fraction-train 0.5, target 4: the calibration counted all 10 nodes (a cohort of 5 of
    10) while the rounds drew 4 of the 7 that train, and the run reported 4.349.  Now the calibration, the draw and
    the accountant use the 7; the planned rounds spend the target and no more."""
    nodes = {300 + i: i for i in range(10)}
    cfg = run_config(
        **{"dp-target-epsilon": 4.0, "holdout-clients": 3, "fraction-train": 0.5, "min-nodes": 10},
        **{"dp-sampling": sampling},
    )
    strategy = build_strategy(parse_settings(cfg))
    grid = drive(strategy, nodes, 3)
    dp = [r.extra["dp"] for r in strategy.history]
    assert all(d["population"] == 7 for d in dp)
    assert 3.99 <= dp[-1]["epsilon"] <= 4.0
    held_out = {n for n, c in nodes.items() if strategy.holdout.held_out(c)}
    trained = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"}
    assert len(held_out) == 3 and not trained & held_out
    if sampling == "fixed":
        assert all(d["cohort"] == 4 and d["rate"] == 4 / 7 for d in dp)


def test_a_local_dp_run_stopped_by_its_budget_and_resumed_is_charged_only_the_releases_made(tmp_path):
    """The journal used to be written before the budget check: a run stopped before round 4 had journaled round 4's
    releases, and its resume charged them (4 releases, 24.38 instead of 20.13 after 3 real rounds).  Now a round is
    journaled only once it passed the check, just before its first release leaves."""
    maximum = (local_epsilon(1.0, 3, 1e-5) + local_epsilon(1.0, 4, 1e-5)) / 2
    run = {**LOCAL, "checkpoint-every": 1, "dp-max-epsilon": maximum}
    first = build_strategy(parse_settings(run))
    first.results_dir = tmp_path
    with pytest.raises(PrivacyBudgetExhausted, match=r"^round 4 would take epsilon to"):
        drive(first, NODES, 6)
    assert journaled_local_releases(tmp_path) == 3
    resumed = resumed_from(tmp_path, {**run, "dp-max-epsilon": 100.0})  # a higher maximum, as the stop line says
    drive(resumed, NODES, [4])
    dp = resumed.history[-1].extra["dp"]
    assert dp["releases"] == 4 and dp["charged"] == 0
    assert dp["epsilon"] == pytest.approx(local_epsilon(1.0, 4, 1e-5))
