"""What the PI-FL server must do (pifl.md §2.3-§2.5): its own round loop, driven by tests/strategy_harness.py from
a parsed run config as the ServerApp builds it, and the per-source tier table it records (Tables 1-2)."""

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from server_app.app import build_strategy
from strategies.fedsoft import FedSoftStrategy
from strategies.fedsoft_artifacts import write_artifacts as write_fedsoft_artifacts
from strategies.persistence import checkpoint_state, resume
from strategies.pifl import PIFLStrategy
from strategies.pifl_artifacts import write_artifacts
from strategies.pifl_math import (
    LedgerError,
    TokenLedger,
)
from strategies.tier_tables import SourceHoldouts, TierTables, distinct_starting_models
from task.config import parse_settings
from task.data import partitioner_for
from task.methods.pifl import MICRO
from task.models import build_model
from task.params import load_record, record_to_numpy, to_record
from task.train import evaluate
from tests.strategy_harness import build_as, drive, phase_of, with_metrics

NODES = {901: 0, 17: 1, 4242: 2, 333: 3}  # node id -> partition id
NO_AUCTION = "the auction would decide nothing"


def pifl(**cfg):
    return build_strategy(
        parse_settings(
            {"method": "pifl", "dataset": "digits", "model": "mlp", "min-nodes": 4, "server-set-size": 50, **cfg}
        )
    )


def bid_for_tier_0(rnd, node, phase, content):
    return [with_metrics(content, bid=[0])] if phase == "bid" else None


def no_auction_warnings(caplog):
    return [r for r in caplog.records if NO_AUCTION in r.getMessage()]


def test_slots_that_hold_every_connected_client_are_reported_once(caplog):
    # pifl.md §2.4-§2.5: the slots of a tier are auctioned among its bidders; with slots-performance + slots-random
    # >= the connected clients every bidder wins every round, which the run must say (PIFLOptions.client_conflicts)
    strat = pifl(**{"slots-performance": 3, "slots-random": 1})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        drive(strat, NODES, 2, bid_for_tier_0)
        (warning,) = no_auction_warnings(caplog)  # at the first auction (round 2; round 1 is the free warm-up)
        drive(strat, NODES, [3], bid_for_tier_0)
    assert no_auction_warnings(caplog) == [warning]  # once
    assert warning.getMessage() == "[pifl] " + strat.options.client_conflicts(4)[0]
    assert (
        "slots-performance + slots-random = 4" in warning.getMessage() and "4 connected clients" in warning.getMessage()
    )
    assert sorted(strat.winners[0]) == [0, 1, 2, 3]  # indeed: every bidder won


def test_a_fifth_client_makes_the_auction_meaningful_and_losing_it_again_is_reported_again(caplog):
    strat = pifl(**{"slots-performance": 3, "slots-random": 1})
    five = {**NODES, 77: 4}
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        drive(strat, five, 2, bid_for_tier_0)
        assert no_auction_warnings(caplog) == [] and len(strat.winners[0]) == 4  # 4 slots, 5 bidders
        drive(strat, NODES, [3, 4], bid_for_tier_0)
    assert len(no_auction_warnings(caplog)) == 1


@pytest.mark.parametrize("slots", [(1, 1), (2, 1)])
def test_fewer_slots_than_clients_is_an_auction_and_not_reported(caplog, slots):
    strat = pifl(**{"slots-performance": slots[0], "slots-random": slots[1]})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        drive(strat, NODES, 3, bid_for_tier_0)
    assert no_auction_warnings(caplog) == []
    assert len(strat.winners[0]) == sum(slots)


# ------------------------------------------------------------------------------------------ the round as a whole
TIER_ACC = {0: [0.9, 0.2], 1: [0.7, 0.4], 2: [0.3, 0.8], 3: [0.5, 0.6]}  # client -> its accuracy of tiers 0, 1


def sent(grid, phase):
    """(round, client, content) of every message of ``phase`` the strategy sent."""
    out = []
    for m in grid.sent:
        kind = m.metadata.message_type
        if kind.split(".", 1)[-1] == phase:
            out.append((int(m.content["config"]["server-round"]), NODES[m.metadata.dst_node_id], m.content))
    return out


def tier_accuracies(rnd, node, phase, content):
    if phase == "evaluate":
        return [with_metrics(content, tier_acc=TIER_ACC[NODES[node]])]
    return None


def test_round_one_is_a_free_warm_up_on_a_random_partition_that_records_the_utility():
    # pifl.md §2.5 round 1 and §2.3 initial tiering: a random partition, up to slots per tier; nobody pays, nothing is
    # settled, but Omega and Acc^max are recorded (Acc_k = mean over the tier's winners of their a_ck)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 1, tier_accuracies)
    members = [c for k in (0, 1) for c in strat.winners[k]]
    assert sorted(members) == [0, 1, 2, 3] and all(len(strat.winners[k]) == 2 for k in (0, 1))
    assert strat.payers == {0: [], 1: []}
    assert strat.ledger.balances == dict.fromkeys(range(4), 100 * MICRO) and strat.ledger.pools == {0: 0, 1: 0}
    for k in (0, 1):
        entry = strat.ledger_log[0]["tiers"][k]
        assert entry["payments"] == {} and entry["refunds"] == {} and entry["rewards"] == {}
        assert entry["refund-ratio"] is None
        expected = np.mean([TIER_ACC[c][k] for c in strat.winners[k]])
        assert entry["utility"] == pytest.approx(expected) and strat.ledger.best_utility[k] == pytest.approx(expected)
        assert strat.counts[k] == dict.fromkeys(strat.winners[k], 1)
    assert strat.ledger_log[0]["total"] == 400 * MICRO


def test_from_round_two_winning_bidders_pay_into_their_tier_and_are_settled_on_its_utility():
    # pifl.md §2.4: winners that bid pay tau_p into P_k; then refund (none: the tier improved by over gamma) and rank
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "slot-price": 2.5})
    bids = {0: [0], 1: [0], 2: [0], 3: []}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "bid":
            return [with_metrics(content, bid=bids[c])]
        if phase == "evaluate":  # tier 0 is much better in round 2 than in round 1: no refund
            return [with_metrics(content, tier_acc=[0.2 if rnd == 1 else 0.9, 0.5])]
        return None

    grid = drive(strat, NODES, 2, answer)
    assert set(strat.winners[0]) <= {0, 1, 2} and len(strat.winners[0]) == 2 and strat.payers[0] == strat.winners[0]
    assert strat.winners[1] == [3] and strat.payers[1] == []  # drafted for free
    entry = strat.ledger_log[1]["tiers"][0]
    assert entry["payments"] == dict.fromkeys(strat.winners[0], 2500000) and entry["refund-ratio"] == 0.0
    assert entry["utility"] == pytest.approx(0.9)
    ranked = sorted(strat.winners[0], key=lambda c: -strat.scores[0][c])  # the better Shapley score gets 2/3
    assert [entry["rewards"][c] for c in ranked] == [3_333_333, 1_666_666] and entry["pool"] == 1
    for c in strat.winners[0]:
        assert strat.ledger.balances[c] == 100 * MICRO - 2_500_000 + entry["rewards"][c]
    assert strat.ledger.balances[3] == 100 * MICRO and strat.ledger.total() == 400 * MICRO
    # the bid query told every client its balance and the price, with all tiers
    for rnd, _client, content in sent(grid, "bid"):
        assert rnd == 2 and dict(content["ledger"]) == {"balance": 100 * MICRO, "price": 2_500_000}
        assert all(v.shape[0] == 2 for v in record_to_numpy(content["tiers"]).values())
    assert sorted(c for _, c, _ in sent(grid, "bid")) == [0, 1, 2, 3]


def test_a_client_that_cannot_pay_has_its_bid_refused_and_is_not_charged():
    # pifl.md §2.2: a client with b_c < tau_p may not bid (the server does not trust the client on this)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 1)
    strat.ledger.balances[0] -= 100 * MICRO - (MICRO - 1)  # client 0 keeps one micro-token less than the price
    strat.ledger.pools[1] += 100 * MICRO - (MICRO - 1)
    drive(
        strat,
        NODES,
        [2],
        lambda rnd, node, phase, content: [with_metrics(content, bid=[0])] if phase == "bid" else None,
    )
    assert [(f["phase"], f.get("client")) for f in strat.failures] == [("bid", 0)]
    assert 0 not in strat.winners[0] and 0 not in strat.payers[0] and strat.ledger.balances[0] >= MICRO - 1
    assert sorted(strat.winners[0]) == sorted(strat.payers[0]) and set(strat.winners[0]) <= {1, 2, 3}
    strat.ledger.check()


def test_a_winner_trains_its_own_tiers_model_and_every_client_evaluates_every_tier():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    grid = drive(
        strat,
        NODES,
        2,
        lambda rnd, node, phase, content: [with_metrics(content, bid=[NODES[node] % 2])] if phase == "bid" else None,
    )
    train = [(r, c, content) for r, c, content in sent(grid, "train") if r == 2]
    assert sorted(c for _, c, _ in train) == [0, 1, 2, 3]
    for _, c, content in train:
        assert content["tier"]["tier"] == c % 2 == strat.tier_of[c]
    evaluated = [(r, c, content) for r, c, content in sent(grid, "evaluate") if r == 2]
    assert sorted(c for _, c, _ in evaluated) == [0, 1, 2, 3]
    for _, _, content in evaluated:
        tiers = record_to_numpy(content["tiers"])
        for key, value in tiers.items():
            assert value.shape[0] == 2
            for k in (0, 1):
                np.testing.assert_array_equal(value[k], strat.tiers[k][key])
    assert sorted(strat.server_models()) == ["tier-0", "tier-1"]


SIZES = {0: 10, 1: 30, 2: 20, 3: 40}


def train_one_round_with_offsets(strat, seed, scale):
    """Round 1 in which client c answers its train message with the round's starting model plus its own random
    offset and SIZES[c] examples; returns (starting model, SIZES, offsets)."""
    base = {k: v.copy() for k, v in strat.tiers[0].items()}
    rng = np.random.default_rng(seed)
    offset = {c: {k: rng.normal(scale=scale, size=v.shape).astype(v.dtype) for k, v in base.items()} for c in range(4)}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "train":
            out = with_metrics(content, num_examples=SIZES[c])
            out["arrays"] = to_record({k: v + offset[c][k] for k, v in base.items()})
            return [out]
        return None

    drive(strat, NODES, 1, answer)
    return base, SIZES, offset


def test_each_tier_is_the_example_weighted_average_of_its_winners_and_they_are_scored():
    # pifl.md §2.7: lambda = n_c / sum n, M_k = sum lambda_c W_c over zeta_k; psi_kc for every winner (they sum to 0)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    base, sizes, offset = train_one_round_with_offsets(strat, seed=0, scale=0.5)
    for k in (0, 1):
        group = strat.winners[k]
        lam = np.array([sizes[c] for c in group], float) / sum(sizes[c] for c in group)
        for key, v in strat.tiers[k].items():
            expected = base[key] + sum(w * offset[c][key].astype(float) for w, c in zip(lam, group, strict=True))
            np.testing.assert_allclose(v, expected, rtol=1e-5, atol=1e-5)
        assert sorted(strat.scores[k]) == sorted(group)
        psi = np.array([strat.scores[k][c] for c in group])
        assert abs(psi.sum()) <= 1e-3 * np.abs(psi).max() and np.abs(psi).max() > 0  # sum to 0 (float32 models)
    assert strat.history[-1].extra.get("pifl", {}).get("tier-sizes", {0: 2, 1: 2}) == {0: 2, 1: 2}


def test_a_tier_whose_winners_all_failed_keeps_its_model():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    before = {k: {key: v.copy() for key, v in strat.tiers[k].items()} for k in (0, 1)}
    failed = set()

    def answer(rnd, node, phase, content):
        if phase == "train" and NODES[node] in strat.winners[1]:
            failed.add(NODES[node])
            return []
        return None

    drive(strat, NODES, 1, answer)
    assert failed == set(strat.winners[1])
    for key, v in before[1].items():
        np.testing.assert_array_equal(strat.tiers[1][key], v)
    assert strat.scores[1] == {} and strat.ledger_log[0]["tiers"][1]["delivered"] == []
    assert strat.ledger_log[0]["tiers"][1]["utility"] is None


def test_a_tier_whose_winners_all_failed_does_not_stop_the_next_tier_from_being_aggregated():
    # pifl.md §2.7: per-tier FedAvg and Profiler scores for every tier that got updates, whatever happened to the others
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    before = {k: {key: v.copy() for key, v in strat.tiers[k].items()} for k in (0, 1)}

    def answer(rnd, node, phase, content):
        if phase == "train" and NODES[node] in strat.winners[0]:
            return []
        return None

    drive(strat, NODES, 1, answer)
    assert strat.scores[0] == {} and sorted(strat.scores[1]) == strat.winners[1]
    assert all(np.array_equal(strat.tiers[0][key], v) for key, v in before[0].items())
    assert not all(np.array_equal(strat.tiers[1][key], v) for key, v in before[1].items())


def test_the_utility_counts_only_the_tiers_winners_that_delivered():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    failed: dict[int, bool] = {}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "train" and not failed and c in strat.winners[0]:
            failed[c] = True
            return []
        return tier_accuracies(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    (lost,) = failed
    delivered = [c for c in strat.winners[0] if c != lost]
    assert strat.ledger_log[0]["tiers"][0]["utility"] == pytest.approx(np.mean([TIER_ACC[c][0] for c in delivered]))


def test_a_late_joiner_gets_the_initial_tokens_and_the_ledger_stays_conserved():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "initial-tokens": 7.0})
    drive(strat, NODES, 2)
    drive(strat, {**NODES, 55: 4}, [3])
    assert strat.ledger.balances[4] >= 0 and strat.ledger.supply == 5 * 7 * MICRO == strat.ledger.total()
    assert strat.ledger_log[-1]["total"] == 35 * MICRO


def test_the_ledger_artefact_holds_every_round(tmp_path):
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 2, tier_accuracies)
    write_artifacts(strat, tmp_path)
    data = json.loads((tmp_path / "pifl_ledger.json").read_text())
    assert data["micro-tokens-per-token"] == MICRO and [r["round"] for r in data["rounds"]] == [1, 2]
    assert data["rounds"][1]["total"] == 400 * MICRO and sorted(data["rounds"][1]["tiers"]) == ["0", "1"]
    assert (tmp_path / "pifl_ledger.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------ the per-source tier table
# PI-FL's Tables 1-2 (pifl.md §4-§5; docs/methods/pifl.md "Artefacts"): every tier model's accuracy on the source A
# and B holdouts; strategies/tier_tables.py also makes the distinct starting models of IFCA and FedSoft (pifl.md §5).


def two_source(**cfg):
    return parse_settings(
        {
            "method": "pifl",
            "dataset": "digits",
            "model": "mlp",
            "partition": "two-source",
            "mixture": "10:90",
            "min-nodes": 4,
            **cfg,
        }
    )


def unused_rows(settings, num_partitions):
    """{source: set of sample rows (bytes)} that none of the ``num_partitions`` clients holds."""
    part, data = partitioner_for(settings.data, num_partitions)
    used = np.concatenate([np.asarray(part.load_partition(i)["idx"]) for i in range(num_partitions)])
    rest = np.setdiff1d(np.arange(len(data.y)), used)
    source = part.source_of_labels(data.y, settings.num_classes)
    return {name: {data.x[i].tobytes() for i in rest[source[rest] == s]} for name, s in (("A", 0), ("B", 1))}


def rows(x):
    return {r.tobytes() for r in x.numpy()}


def probe_models(settings, k=3):
    """k differently seeded models: their accuracies tell one holdout set from another."""
    return [
        {
            name: v.detach().numpy().copy()
            for name, v in build_model(
                "mlp", settings.in_channels, settings.image_size, settings.num_classes, seed=seed
            )
            .state_dict()
            .items()
        }
        for seed in range(k)
    ]


def expected_table(settings, num_partitions, models):
    """Each model's accuracy on the samples of source A and of source B that none of the ``num_partitions`` clients
    holds, computed here from the partition (what the tier table must show; digits' holdouts are below the cap)."""
    part, data = partitioner_for(settings.data, num_partitions)
    used = np.concatenate([np.asarray(part.load_partition(i)["idx"]) for i in range(num_partitions)])
    rest = np.setdiff1d(np.arange(len(data.y)), used)
    source = part.source_of_labels(data.y, settings.num_classes)
    model = build_model("mlp", settings.in_channels, settings.image_size, settings.num_classes)
    out = []
    for state in models:
        load_record(model, state)
        row = {}
        for name, s in (("A", 0), ("B", 1)):
            idx = rest[source[rest] == s]
            row[name] = evaluate(model, torch.from_numpy(data.x[idx]), torch.from_numpy(data.y[idx]))[1]
        out.append(row)
    return out


def assert_table(table, expected):
    assert len(table) == len(expected)
    for row, exp in zip(table, expected, strict=False):
        assert row == pytest.approx(exp, abs=1e-12)


@pytest.mark.parametrize("n", [5, 9])
def test_each_source_holdout_is_every_sample_of_that_source_no_client_trains_on(n):
    settings = two_source()
    holdouts = SourceHoldouts(settings, n)
    expected = unused_rows(settings, n)
    assert sorted(holdouts.sets) == ["A", "B"]
    for name, (x, y) in holdouts.sets.items():
        assert rows(x) == expected[name] and len(y) == len(x) == len(expected[name])
        labels = set(y.tolist())
        assert labels <= ({0, 1, 2, 3, 4} if name == "A" else {5, 6, 7, 8, 9})  # digits: source A = labels 0-4


def test_a_holdout_holds_no_copy_of_an_image_a_client_trains_on():
    """With ``data-copies`` the holdouts are originals no client holds, never a jittered copy of a trained one."""
    from task.data import load_client_data

    settings = two_source(**{"data-copies": 3})
    holdouts = SourceHoldouts(settings, 5)
    _, data = partitioner_for(settings.data, 5)
    trained = set().union(*(rows(load_client_data(settings.data, i, 5).x_train) for i in range(5)))
    held = set().union(*(rows(x) for x, _ in holdouts.sets.values()))
    assert held and held <= {r.tobytes() for r in data.x[: data.originals]}
    originals_of_trained = {
        data.x[i % data.originals].tobytes() for i in range(len(data.y)) if data.x[i].tobytes() in trained
    }
    assert not held & (trained | originals_of_trained)


def test_a_holdout_is_capped_at_max_per_source_samples_of_its_source():
    settings = two_source()
    expected = unused_rows(settings, 5)
    holdouts = SourceHoldouts(settings, 5, max_per_source=30)
    for name, (x, _) in holdouts.sets.items():
        assert len(x) == 30 and rows(x) <= expected[name]
    again = SourceHoldouts(settings, 5, max_per_source=30)  # reproducible: the same capped holdouts in every run
    assert {n: rows(x) for n, (x, _) in again.sets.items()} == {n: rows(x) for n, (x, _) in holdouts.sets.items()}


def test_partitions_without_two_sources_have_no_table():
    for cfg in ({"partition": "iid"}, {"partition": "dirichlet"}):
        holdouts = SourceHoldouts(two_source(**cfg), 4)
        assert holdouts.sets == {} and holdouts.table([{}]) == []


def test_a_server_without_the_data_set_skips_the_tables_and_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="flwr.pflower"):
        holdouts = SourceHoldouts(two_source(), 10_000)  # more clients than samples: the partitioner refuses
    assert holdouts.sets == {} and holdouts.table([{}]) == []
    (record,) = [r for r in caplog.records if "per-source holdouts" in r.getMessage()]
    assert record.getMessage().startswith("no per-source holdouts (num-partitions=10000 is too many for dataset")
    assert record.getMessage().endswith("); tier tables skipped")


def test_the_table_gives_every_models_accuracy_on_each_source_holdout():
    settings = two_source()
    holdouts = SourceHoldouts(settings, 5)
    model = build_model("mlp", settings.in_channels, settings.image_size, settings.num_classes)
    states = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = build_model("mlp", settings.in_channels, settings.image_size, settings.num_classes)
        states.append({k: v.detach().numpy().copy() for k, v in m.state_dict().items()})
    table = holdouts.table(states)
    assert len(table) == 2
    for state, row in zip(states, table, strict=True):
        load_record(model, state)
        assert row == {name: pytest.approx(evaluate(model, x, y)[1]) for name, (x, y) in holdouts.sets.items()}
    assert table[0] != table[1]


def fake_strategy(settings, client_ids):
    return SimpleNamespace(
        settings=settings, client_of={100 + c: c for c in client_ids}, history=[SimpleNamespace(extra={})]
    )


@pytest.mark.parametrize("client_ids,min_nodes,n", [([0, 1, 8], 4, 9), ([0, 1, 2], 5, 5), ([4, 0], 2, 5)])
def test_the_holdouts_leave_out_the_data_of_every_client_of_the_run(client_ids, min_nodes, n):
    # the server knows the clients it heard from and min-nodes; the partition is over at least that many clients
    settings = two_source(**{"min-nodes": min_nodes})
    strategy = fake_strategy(settings, client_ids)
    tables = TierTables()
    models = probe_models(settings)
    table = tables.record(strategy, 3, models)
    # the table is each model's accuracy on what none of the n clients holds ...
    assert_table(table, expected_table(settings, n, models))
    # ... and the probe models tell that from the holdouts of any other client count a server might have used
    for other in {len(client_ids), min_nodes, max(client_ids) + 1, n + 1} - {n}:
        assert table != expected_table(settings, other, models)
    assert tables.by_round == {3: table} and strategy.history[-1].extra["tier-table"] == table
    assert len(table) == 3 and all(sorted(row) == ["A", "B"] for row in table)


def test_a_run_without_sources_records_no_table_and_a_restored_one_rebuilds_its_holdouts():
    settings = two_source(partition="iid")
    strategy = fake_strategy(settings, [0, 1])
    tables = TierTables()
    assert tables.record(strategy, 1, [{}]) == [] and tables.by_round == {} and strategy.history[-1].extra == {}
    restored = TierTables()  # as a strategy's restore() leaves it: only by_round comes from the checkpoint
    restored.by_round = {1: [{"A": 0.5, "B": 0.5}]}
    settings = two_source()
    state = {
        k: v.detach().numpy().copy()
        for k, v in build_model("mlp", settings.in_channels, settings.image_size, settings.num_classes)
        .state_dict()
        .items()
    }
    assert len(restored.record(fake_strategy(settings, [0, 1, 2, 3]), 2, [state, state])) == 2


# ------------------------------------------------------------------------------------------ IFCA / FedSoft starts
def test_cluster_models_start_as_the_common_model_plus_small_seeded_noise_except_the_first():
    rng = np.random.default_rng(0)
    state: dict[str, np.ndarray] = {
        "w": rng.normal(size=(200, 50)).astype(np.float32),
        "b": np.zeros(50, np.float64),
        "steps": np.array([7, 8], np.int64),
    }
    models = distinct_starting_models(state, 3, seed=4)
    assert len(models) == 3
    for key, value in state.items():
        np.testing.assert_array_equal(models[0][key], value)  # copy 0 is the common model itself
    for m in models:
        assert {k: v.dtype for k, v in m.items()} == {k: v.dtype for k, v in state.items()}
        np.testing.assert_array_equal(m["steps"], state["steps"])  # integers are not perturbed
    for j in (1, 2):
        noise = models[j]["w"].astype(np.float64) - state["w"]
        assert 0.008 < noise.std() < 0.012 and abs(noise.mean()) < 0.002  # std 0.01
        assert 0.005 < (models[j]["b"] - state["b"]).std() < 0.015
    assert not np.array_equal(models[1]["w"], models[2]["w"])  # the copies diverge from each other too
    again = distinct_starting_models(state, 3, seed=4)
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(models, again, strict=True) for k in state)  # reproducible
    other = distinct_starting_models(state, 3, seed=5)
    assert not np.array_equal(other[1]["w"], models[1]["w"])
    assert len(distinct_starting_models(state, 1, seed=0)) == 1


def test_every_rounds_table_uses_the_same_holdouts_even_when_more_clients_show_up():
    # the tables of successive rounds must be comparable (a tier's specialisation is read across rounds), so the
    # holdouts are fixed when first built; a later client with a higher id does not re-draw them
    settings = two_source()
    tables = TierTables()
    models = probe_models(settings)
    first = tables.record(fake_strategy(settings, [0, 1, 2, 3, 4]), 1, models)
    assert_table(first, expected_table(settings, 5, models))
    second = tables.record(fake_strategy(settings, [0, 1, 2, 3, 4, 8]), 2, models)
    assert second == first  # the same models, the same holdouts: the same table
    assert second != expected_table(settings, 9, models)  # re-drawn for nine clients, it would differ


@pytest.mark.parametrize("min_nodes", [1, 5])
def test_a_round_in_which_no_client_was_heard_from_still_gets_a_table_over_min_nodes_clients(min_nodes):
    settings = two_source(**{"min-nodes": min_nodes, "tiers": 1})
    tables = TierTables()
    models = probe_models(settings)
    table = tables.record(fake_strategy(settings, []), 1, models)
    assert_table(table, expected_table(settings, min_nodes, models))
    assert table != expected_table(settings, min_nodes + 1, models)


def test_a_holdout_holds_at_most_1000_samples_of_its_source_by_default():
    # pifl.md §4: 1000-sample per-source holdouts for the tier tables (SynthConcept with one client leaves 2750
    # unused samples of source A and 754 of source B)
    settings = two_source(dataset="synth-concept", **{"min-nodes": 1, "tiers": 1})
    holdouts = SourceHoldouts(settings, 1)
    expected = unused_rows(settings, 1)
    assert (
        len(expected["A"]) > 1000
        and len(holdouts.sets["A"][0]) == 1000
        and rows(holdouts.sets["A"][0]) <= expected["A"]
    )
    assert rows(holdouts.sets["B"][0]) == expected["B"]


# ------------------------------------------------------------------------------------------ the round's ledger log
SHARE_A = {0: 0.1, 1: 0.3, 2: 0.6, 3: 0.9}  # each client's share of source A (two-source partitions)
TIER0_LEVEL = {1: 0.5, 2: 0.55, 3: 0.5, 4: 0.6}  # tier 0's accuracy by round: gains below and above gamma, a loss


def ledger_acc(rnd, c, k):
    """Client c's accuracy of tier k after round rnd."""
    return TIER0_LEVEL[rnd] + 0.02 * c if k == 0 else TIER_ACC[c][k]


def ledger_round_answer(rnd, node, phase, content):
    c = NODES[node]
    if phase == "bid":
        return [with_metrics(content, bid=[0] if c < 3 else [1])]
    if phase == "train":
        return [with_metrics(content, source_a_share=SHARE_A[c])]
    if phase == "evaluate":
        return [with_metrics(content, tier_acc=[ledger_acc(rnd, c, k) for k in (0, 1)])]
    return None


def test_every_rounds_ledger_entry_is_the_settlement_of_spec_2_4_and_adds_up_to_the_balances():
    # pifl.md §2.4 per tier and round r >= 2: payers pay tau_p into P_k; theta = eta_R (gamma - min(gamma, delta)) /
    # gamma
    # with delta the relative gain of Acc_k (mean a_ck over the tier's winners) over its best so far; floor(theta P_k)
    # refunded in equal shares; the rest paid by reverse rank (n - pos) / beta; the log entry says all of it
    eta, gamma, price = 0.5, 0.25, 2 * MICRO
    strat = pifl(
        **{"slots-performance": 1, "slots-random": 1, "max-refund": eta, "full-use-gain": gamma, "slot-price": 2.0}
    )
    grid = drive(strat, NODES, 4, ledger_round_answer)
    log = strat.ledger_log
    assert [e["round"] for e in log] == [1, 2, 3, 4]
    # the bid query of round r tells every client its own balance after round r - 1, and the price (pifl.md §7)
    bids = sent(grid, "bid")
    assert sorted((r, c) for r, c, _ in bids) == [(r, c) for r in (2, 3, 4) for c in range(4)]
    for r, c, content in bids:
        assert dict(content["ledger"]) == {"balance": log[r - 2]["balances"][c], "price": price}
    assert len({content["ledger"]["balance"] for r, c, content in bids if r == 4}) > 1  # balances differ by then
    # a winner is sent its own tier's model: the one every client evaluated at the end of the previous round
    evaluated = {r: record_to_numpy(content["tiers"]) for r, c, content in sent(grid, "evaluate") if c == 0}
    for r, c, content in sent(grid, "train"):
        if r > 1:
            k = content["tier"]["tier"]
            assert c in log[r - 1]["tiers"][k]["members"]
            for key, v in record_to_numpy(content["arrays"]).items():
                np.testing.assert_array_equal(v, evaluated[r - 1][key][k])
    best = {k: np.mean([ledger_acc(1, c, k) for c in log[0]["tiers"][k]["members"]]) for k in (0, 1)}
    ratios = []
    balances, pools = dict.fromkeys(range(4), 100 * MICRO), {0: 0, 1: 0}
    for e in log[1:]:
        for k in (0, 1):
            t = e["tiers"][k]
            members = t["members"]
            assert members == sorted(members) and t["payers"] == members and t["delivered"] == members
            assert set(members) <= ({0, 1, 2} if k == 0 else {3}) and len(members) == (2 if k == 0 else 1)
            utility = np.mean([ledger_acc(e["round"], c, k) for c in members])
            assert t["utility"] == pytest.approx(utility)
            gain = max(0.0, (utility - best[k]) / best[k])
            ratio = eta * (gamma - min(gamma, gain)) / gamma
            assert t["refund-ratio"] == pytest.approx(ratio)
            ratios.append(ratio)
            best[k] = max(best[k], utility)
            assert t["payments"] == dict.fromkeys(members, price)
            pool = pools[k] + price * len(members)
            share = int(np.floor(ratio * pool + 1e-6)) // len(members)
            assert t["refunds"] == dict.fromkeys(members, share)
            rest = pool - share * len(members)
            n = len(members)
            assert sorted(t["rewards"].values(), reverse=True) == [
                (n - p) * rest // (n * (n + 1) // 2) for p in range(n)
            ]
            pools[k] = rest - sum(t["rewards"].values())
            assert t["pool"] == pools[k] and 0 <= t["pool"] < n  # only rounding dust stays
            for c in members:
                balances[c] += t["refunds"][c] + t["rewards"][c] - price
            assert t["source-a-share"] == pytest.approx(np.mean([SHARE_A[c] for c in members]))
        assert e["balances"] == balances and e["total"] == 400 * MICRO == sum(balances.values()) + sum(pools.values())
    assert strat.ledger.balances == balances and strat.ledger.pools == pools
    assert any(0 < r < eta for r in ratios) and eta in ratios  # a partial refund and a full one were exercised
    # Omega_kc (pifl.md §2.3) counts every round client c won a slot of tier k; each round's history names the tier
    # sizes
    for k in (0, 1):
        tally: dict[int, int] = {}
        for e in log:
            for c in e["tiers"][k]["members"]:
                tally[c] = tally.get(c, 0) + 1
        assert strat.counts[k] == tally
    assert [h.extra["pifl"] for h in strat.history] == [
        {"tier-sizes": {k: len(e["tiers"][k]["members"]) for k in (0, 1)}} for e in log
    ]
    assert log[0]["tiers"][0]["source-a-share"] == pytest.approx(
        np.mean([SHARE_A[c] for c in log[0]["tiers"][0]["members"]])
    )


def test_the_ledger_artefact_is_the_round_log_and_its_plot_an_image(tmp_path):
    # docs/methods/pifl.md "Artefacts": pifl_ledger.json holds every round's entry as logged (balances, per-tier
    # settlement, membership share of source A); pifl_ledger.png plots balances and membership
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 3, ledger_round_answer)
    write_artifacts(strat, tmp_path)
    data = json.loads((tmp_path / "pifl_ledger.json").read_text())
    assert data == json.loads(json.dumps({"micro-tokens-per-token": MICRO, "rounds": strat.ledger_log}))
    assert [r["round"] for r in data["rounds"]] == [1, 2, 3]
    assert data["rounds"][2]["balances"] == {str(c): b for c, b in strat.ledger.balances.items()}
    from PIL import Image

    with Image.open(tmp_path / "pifl_ledger.png") as img:
        assert img.format == "PNG" and img.size == (1100, 400)  # two panels, 11 x 4 inches at 100 dpi


def test_the_ledger_plot_draws_every_clients_balance_and_every_tiers_membership_per_round(tmp_path, monkeypatch):
    """pifl_ledger.png (docs "Artefacts"): left, one line per client of the last round, its balance in tokens over
    the rounds (a gap before a late joiner joined); right, one line per tier, its members' mean share of source A,
    on [0, 1]; the two panels side by side."""
    import strategies.pifl_artifacts as module
    from tests.strategy_harness import kept_figures

    figures = kept_figures(monkeypatch, module)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 2, ledger_round_answer)
    late = max(NODES.values()) + 1  # a fifth client connects in round 3

    def answer(rnd, node, phase, content):
        if node in NODES:
            return ledger_round_answer(rnd, node, phase, content)
        return {
            "bid": [with_metrics(content, bid=[1])],
            "train": [with_metrics(content, source_a_share=0.5)],
            "evaluate": [with_metrics(content, tier_acc=[0.5, 0.5])],
        }.get(phase)

    drive(strat, {**NODES, 55: late}, [3], answer)
    write_artifacts(strat, tmp_path)
    (fig,) = figures
    ax1, ax2 = fig.axes
    assert (
        ax1.get_position().y0 == pytest.approx(ax2.get_position().y0) and ax1.get_position().x1 < ax2.get_position().x0
    )
    log = strat.ledger_log
    clients = sorted(log[-1]["balances"])
    assert late in clients and len(ax1.lines) == len(clients)
    for line, c in zip(ax1.lines, clients, strict=True):
        assert list(line.get_xdata()) == [1, 2, 3]
        expected = [e["balances"][c] / MICRO if c in e["balances"] else np.nan for e in log]
        np.testing.assert_allclose(line.get_ydata(), expected)
    assert np.isnan(ax1.lines[clients.index(late)].get_ydata()[:2]).all()
    assert (
        ax1.get_title() == "token balance per client" and ax1.get_ylabel() == "tokens" and ax1.get_xlabel() == "round"
    )
    assert all(line.get_linewidth() == 0.8 for line in ax1.lines)  # thin: one line per client
    assert ax2.get_title() == "tier membership: mean share of source A" and ax2.get_xlabel() == "round"
    assert [ln.get_label() for ln in ax2.lines] == ["tier 0", "tier 1"] and ax2.get_ylim() == (0, 1)
    for k, line in enumerate(ax2.lines):
        shares = [e["tiers"][k]["source-a-share"] for e in log]
        assert list(line.get_xdata()) == [1, 2, 3] and line.get_marker() == "o"
        np.testing.assert_allclose(line.get_ydata(), [np.nan if v is None else v for v in shares])
    assert any(np.isfinite(line.get_ydata()).any() for line in ax2.lines)


def test_a_run_without_rounds_writes_an_empty_ledger_and_no_plot(tmp_path):
    strat = pifl()
    write_artifacts(strat, tmp_path)
    assert json.loads((tmp_path / "pifl_ledger.json").read_text()) == {"micro-tokens-per-token": MICRO, "rounds": []}
    assert not (tmp_path / "pifl_ledger.png").exists()


# ------------------------------------------------------------------------------------- the Profiler on the server set
def test_the_server_set_is_an_iid_sample_of_server_set_size_distinct_samples_of_the_data_set():
    # pifl.md §2.1: the Profiler holds a small IID server test set (server-set-size samples), the same in every round
    from task.data import load_centralized

    strat = pifl(**{"server-set-size": 40})
    x, y = strat.server_set()
    data = load_centralized("digits")
    assert len(x) == len(y) == 40 and len({r.tobytes() for r in x.numpy()}) == 40
    index = {r.tobytes(): i for i, r in enumerate(data.x)}
    picked = [index[r.tobytes()] for r in x.numpy()]  # every row is a row of the data set, with its own label
    assert y.tolist() == data.y[picked].tolist()
    assert len(set(y.tolist())) >= 8  # IID: (nearly) every class, not the first rows of one class
    assert strat.server_set()[0] is x  # built once
    again = pifl(**{"server-set-size": 40}).server_set()[0]
    torch.testing.assert_close(again, x)  # reproducible


def test_the_server_set_is_drawn_from_the_runs_own_data_noise_and_local_copy_included(tmp_path):
    """The server's set is a sample of the data the clients hold: with noise-std the same noisy pixels, with a
    local copy of a real data set (data-dir; no hub at run time) rows of that copy."""
    from datasets import Dataset, DatasetDict, Image
    from PIL import Image as PILImage

    from task.data import load_centralized

    def rows_of(data, x):
        index = {r.tobytes(): i for i, r in enumerate(data.x)}
        return [index.get(r.tobytes()) for r in x.numpy()]

    x, y = pifl(**{"server-set-size": 30, "noise-std": 0.7}).server_set()
    noisy = load_centralized("digits", noise_std=0.7)
    assert None not in rows_of(noisy, x) and None in rows_of(load_centralized("digits"), x)

    rng = np.random.default_rng(0)

    def split(n):
        imgs = [PILImage.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8), "L") for _ in range(n)]
        return Dataset.from_dict({"image": imgs, "label": (np.arange(n) % 10).tolist()}).cast_column("image", Image())

    DatasetDict({"train": split(60), "test": split(20)}).save_to_disk(tmp_path / "mnist")
    x, y = pifl(**{"dataset": "mnist", "data-dir": str(tmp_path / "mnist"), "server-set-size": 30}).server_set()
    local = load_centralized("mnist", str(tmp_path / "mnist"))
    picked = rows_of(local, x)
    assert len(x) == 30 and None not in picked and y.tolist() == local.y[picked].tolist()


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient after a backward pass, in double precision."""
    out = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient from the loss"
        out[name] = p.grad.double()
    return out


def test_each_winners_score_is_the_first_order_shapley_estimate_at_its_new_tier_model():
    # pifl.md §2.3 / App. A: psi_kc = -lambda_c (W_c - W_M)^T g, g the mean cross-entropy gradient of the new tier model
    # W_M on the server set; computed for every tier of the round (each with its own gradient)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "server-set-size": 60})
    base, sizes, offset = train_one_round_with_offsets(strat, seed=1, scale=0.3)
    x, y = strat.server_set()
    st = strat.settings
    model = build_model("mlp", st.in_channels, st.image_size, st.num_classes)
    for k in (0, 1):
        load_record(model, strat.tiers[k])
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grad = gradients(model)
        group = strat.winners[k]
        lam = {c: sizes[c] / sum(sizes[g] for g in group) for c in group}
        for c in group:
            diff = sum(
                float(
                    (
                        (
                            torch.from_numpy(base[n] + offset[c][n]).double()
                            - torch.from_numpy(strat.tiers[k][n]).double()
                        )
                        * grad[n]
                    ).sum()
                )
                for n in grad
            )
            assert strat.scores[k][c] == pytest.approx(-lam[c] * diff, rel=1e-3, abs=1e-7)


# ------------------------------------------------------------------------------------------ what a reply may say
@pytest.mark.parametrize("bad", [[2], [-1], [0, 1], [0.5], [1, 1]])
def test_a_bid_for_no_tier_of_the_run_or_for_more_than_max_bids_tiers_is_refused(bad):
    # pifl.md §2.2: B_c holds tier ids 0..K-1, at most max-bids (1) of them; anything else is rejected, the client sits
    # the round out and pays nothing, and the others are scheduled as usual
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})

    def answer(rnd, node, phase, content):
        if phase == "bid":
            return [with_metrics(content, bid=bad if NODES[node] == 0 else [1])]
        return None

    drive(strat, NODES, 2, answer)
    assert [(f["round"], f["phase"], f["client"]) for f in strat.failures] == [(2, "bid", 0)]
    assert "bid" in strat.failures[0]["reason"]
    assert 0 not in strat.tier_of and strat.ledger_log[1]["balances"][0] == 100 * MICRO
    assert set(strat.winners[1]) <= {1, 2, 3} and len(strat.winners[1]) == 2 and strat.winners[0] == []


def test_a_valid_bid_for_the_last_tier_or_for_none_is_accepted():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "tiers": 3})
    bids = {0: [2], 1: [], 2: [0], 3: [1]}
    drive(
        strat,
        NODES,
        2,
        lambda rnd, node, phase, content: [with_metrics(content, bid=bids[NODES[node]])] if phase == "bid" else None,
    )
    assert strat.failures == []
    assert strat.winners == {0: [2], 1: [3], 2: [0]} and strat.payers == strat.winners  # client 1 bid for none


def test_the_source_share_is_optional_in_train_and_evaluate_replies_but_checked_when_given():
    # source-a-share only exists on two-source partitions: a reply without it is valid; one outside [0, 1] is not
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase in ("train", "evaluate"):
            metrics = dict(content["metrics"])
            if c == 3:
                metrics["source-a-share"] = 1.5
            else:
                metrics.pop("source-a-share", None)
            out = with_metrics(content)
            out["metrics"] = type(content["metrics"])(metrics)
            return [out]
        return None

    drive(strat, NODES, 1, answer)
    assert sorted((f["phase"], f["client"]) for f in strat.failures) == [("evaluate", 3), ("train", 3)]
    assert all("source-a-share" in f["reason"] for f in strat.failures)
    assert strat.source_share == {} and strat.client_eval.get(3) is None and strat.client_eval.get(0) is not None
    # no client said its share: the membership share of source A is unknown (None, null in the JSON), not NaN
    assert [t["source-a-share"] for t in strat.ledger_log[0]["tiers"].values()] == [None, None]


def test_a_tier_drafted_after_round_one_is_settled_and_keeps_its_best_utility():
    # pifl.md §2.5: a tier nobody bid for drafts non-bidders for free; from round 2 on it is still settled (pifl.md
    # pifl.md §2.4):
    # its refund ratio comes from its utility gain and Acc^max_k stays the best of all rounds (here round 1's)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "max-refund": 0.4})

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "bid":
            return [with_metrics(content, bid=[0] if c < 2 else [])]
        if phase == "evaluate":
            return [with_metrics(content, tier_acc=[0.5, 0.8 if rnd == 1 else 0.6])]
        return None

    drive(strat, NODES, 2, answer)
    assert sorted(strat.winners[1]) == [2, 3] and strat.payers[1] == []
    entry = strat.ledger_log[1]["tiers"][1]
    assert entry["utility"] == pytest.approx(0.6) and entry["refund-ratio"] == pytest.approx(0.4)  # no gain: eta_R
    assert entry["payments"] == {} and entry["refunds"] == {} and entry["rewards"] == {2: 0, 3: 0}
    assert strat.ledger.best_utility[1] == pytest.approx(0.8)


def test_the_utility_is_the_mean_over_the_winners_whose_evaluation_arrived():
    # pifl.md §2.4 step 2: Acc_k is the mean a_ck over the tier's winners; one whose evaluate reply was lost is left out
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    lost: list[int] = []

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "evaluate" and not lost and c in strat.winners[0]:
            lost.append(c)
            return []
        return tier_accuracies(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    others = [c for c in strat.winners[0] if c not in lost]
    entry = strat.ledger_log[0]["tiers"][0]
    assert entry["delivered"] == strat.winners[0] and len(others) == 1
    assert entry["utility"] == pytest.approx(TIER_ACC[others[0]][0])


def test_a_two_source_run_logs_each_rounds_tier_table_with_its_ledger_entry():
    # pifl.md's tier tables (the paper's Tables 1-2): every round, each tier model's accuracy on the source A and B
    # holdouts
    strat = build_as(PIFLStrategy, two_source(**{"slots-performance": 1, "slots-random": 1, "server-set-size": 50}))
    drive(strat, NODES, 2)
    for e in strat.ledger_log:
        table = e["tier-table"]
        assert table == strat.tier_tables.by_round[e["round"]] and len(table) == 2
        assert strat.history[e["round"] - 1].extra["tier-table"] == table
    # each tier model's accuracy on what none of the run's clients holds (four clients: min-nodes and NODES)
    assert_table(
        strat.ledger_log[-1]["tier-table"], expected_table(strat.settings, 4, [strat.tiers[0], strat.tiers[1]])
    )


def test_a_round_in_which_every_training_failed_settles_nobody_and_keeps_the_payments_in_the_pools():
    # pifl.md §2.4 as the strategy resolves it: winners whose training did not arrive are neither refunded nor
    # rewarded; when no train reply arrives at all the tiers keep their models and the pools keep the payments
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})

    def answer(rnd, node, phase, content):
        if phase == "bid":
            return [with_metrics(content, bid=[NODES[node] % 2])]
        if rnd == 2 and phase == "train":
            return []
        return tier_accuracies(rnd, node, phase, content)

    drive(strat, NODES, 2, answer)
    entry = strat.ledger_log[1]
    for k in (0, 1):
        t = entry["tiers"][k]
        assert t["payers"] == strat.winners[k] and len(t["payers"]) == 2 and t["delivered"] == []
        assert t["refunds"] == {} and t["rewards"] == {} and t["utility"] is None
        assert t["pool"] == strat.ledger_log[0]["tiers"][k]["pool"] + 2 * strat.price
    assert entry["total"] == 400 * MICRO


# ------------------------------------------------------------------------------------------ FedSoft's centres
SOFT_U = {0: [0.9, 0.1], 1: [0.5, 0.5], 2: [0.2, 0.8], 3: [0.7, 0.3]}  # client -> importance weights u_ks
SOFT_N = {0: 10, 1: 100, 2: 30, 3: 60}  # client -> training examples n_k: u_ks n_k differs between any two clients


def fedsoft_answers(rnd, node, phase, content):
    c = NODES[node]
    if phase == "fedsoft_u":
        return [with_metrics(content, fedsoft_u=SOFT_U[c], num_examples=SOFT_N[c])]
    if phase == "train":  # every array of client c's model holds c + 1
        out = with_metrics(content, num_examples=SOFT_N[c])
        out["arrays"] = to_record({k: np.full_like(v.numpy(), c + 1) for k, v in content["arrays"].items()})
        return [out]
    return None


def test_a_fedsoft_centre_is_the_plain_mean_of_the_clients_drawn_for_it():
    # FedSoft (Ruan & Joe-Wong, Algorithm 1; pifl.md §5): the server draws the clients of centre s with probability
    # proportional to u_ks n_k and sets c_s to the plain 1/K mean of their models; weighting them by u_ks n_k once more
    # would count the importance twice (here it would pull every centre towards client 1, the largest)
    strat = build_as(
        FedSoftStrategy,
        parse_settings(
            {
                "method": "fedsoft",
                "dataset": "digits",
                "model": "mlp",
                "min-nodes": 4,
                "tiers": 2,
                "fedsoft-clients-per-cluster": 2,
                "fedsoft-estimate-every": 1,
            }
        ),
    )
    for rnd in (1, 2, 3):
        drive(strat, NODES, [rnd], fedsoft_answers)
        assert {s: len(m) for s, m in strat.selected.items()} == {0: 2, 1: 2}
        assert strat.history[-1].extra["fedsoft"] == {"selected": {0: 2, 1: 2}}  # the round's log: drawn per centre
        for s, members in strat.selected.items():
            expected = np.mean([c + 1 for c in members])
            for key, value in strat.models[s].items():
                if np.issubdtype(value.dtype, np.floating):
                    np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=f"round {rnd} centre {s} {key}")


def fedsoft(**cfg):
    settings = {"method": "fedsoft", "dataset": "digits", "model": "mlp", "min-nodes": 4, "tiers": 2, **cfg}
    return build_as(FedSoftStrategy, parse_settings(settings))


def test_fedsoft_estimates_every_few_rounds_and_whenever_a_client_has_no_estimate_and_writes_each_estimate(tmp_path):
    """Clients send their importance weights in round 1 and every ``fedsoft-estimate-every`` rounds after it, and
    also in any round where a client has never sent one (its first reply failed, or it joined late); a client whose
    later estimate fails keeps its last one.  fedsoft_clusters.json keeps each estimate, rounded to 4 decimals,
    under the round that made it."""
    u = {0: [0.123456, 0.876544], 1: [0.5, 0.5], 2: [0.25, 0.75], 3: [0.654321, 0.345679]}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "fedsoft_u":
            if rnd in (1, 4) and c == 3:  # client 3 does not answer round 1's estimate, nor round 4's
                return []
            return [with_metrics(content, fedsoft_u=u[c], num_examples=SOFT_N[c])]
        return fedsoft_answers(rnd, node, phase, content)

    strat = fedsoft(**{"fedsoft-estimate-every": 3, "fedsoft-clients-per-cluster": 2})
    grid = drive(strat, NODES, 8, answer)
    asked = sorted({int(m.content["config"]["server-round"]) for m in grid.sent if phase_of(m) == "fedsoft_u"})
    assert asked == [1, 2, 4, 7]  # every 3 rounds from round 1, and round 2 for client 3, which had none
    write_fedsoft_artifacts(strat, tmp_path)
    importance = json.loads((tmp_path / "fedsoft_clusters.json").read_text())["importance"]
    assert sorted(importance) == ["1", "2", "4", "7"]
    assert importance["1"] == {str(c): [round(x, 4) for x in u[c]] for c in range(3)}  # client 3 had none yet
    assert importance["2"] == importance["4"] == {str(c): [round(x, 4) for x in u[c]] for c in range(4)}


def test_fedsoft_draws_each_centres_clients_in_proportion_to_importance_times_size():
    """Centre s draws its clients with probability u_ks n_k / sum_j u_js n_j, without replacement, among the clients
    with a positive weight only, at most ``fedsoft-clients-per-cluster``; a centre no client weighs is not drawn,
    and the centres after it still are."""
    strat = fedsoft(**{"tiers": 3, "fedsoft-clients-per-cluster": 1})
    u = {0: [0.0, 0.9, 0.1], 1: [0.0, 0.5, 0.5], 2: [0.0, 0.2, 0.8], 3: [0.0, 0.7, 0.3]}

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u":
            return [with_metrics(content, fedsoft_u=u[NODES[node]], num_examples=SOFT_N[NODES[node]])]
        return fedsoft_answers(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    draws = 4000
    counts = {s: np.zeros(4) for s in (1, 2)}
    for _ in range(draws):
        strat.sample(2, list(NODES))
        assert sorted(strat.selected) == [1, 2]  # centre 0: every client weighs it 0
        for s in (1, 2):
            counts[s][strat.selected[s]] += 1
    for s in (1, 2):
        weight = np.array([u[c][s] * SOFT_N[c] for c in range(4)])
        expected = weight / weight.sum()
        spread = np.sqrt(expected * (1 - expected) / draws)
        assert np.all(np.abs(counts[s] / draws - expected) < 4 * spread + 1e-9), (s, counts[s] / draws, expected)


def test_fedsoft_draws_distinct_clients_and_only_those_that_weigh_the_centre():
    strat = fedsoft(**{"tiers": 3, "fedsoft-clients-per-cluster": 3})
    # centre 0 is weighed by client 1 alone, which holds one example (u n = 0.5, below 1, still counts); centre 1 by
    # clients 0 and 1; centre 2 by three clients
    u = {0: [0.0, 0.5, 0.5], 1: [0.5, 0.5, 0.0], 2: [0.0, 0.0, 1.0], 3: [0.0, 0.0, 1.0]}
    sizes = {0: 10, 1: 1, 2: 30, 3: 60}

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u":
            return [with_metrics(content, fedsoft_u=u[NODES[node]], num_examples=sizes[NODES[node]])]
        return fedsoft_answers(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    for _ in range(200):  # whatever the draw: each weighing client once, nobody else
        strat.sample(2, list(NODES))
        assert strat.selected == {0: [1], 1: [0, 1], 2: [0, 2, 3]}


def test_fedsoft_does_not_draw_a_client_without_an_estimate():
    # with fraction-train below 1 every node is asked which client it is first, so client 3 is known to the
    # server when its estimate does not come
    strat = fedsoft(**{"fedsoft-clients-per-cluster": 4, "fraction-train": 0.75})

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u" and NODES[node] == 3:
            return []
        return fedsoft_answers(rnd, node, phase, content)

    grid = drive(strat, NODES, 1, answer)
    assert [phase_of(m) for m in grid.sent[:4]] == ["identify"] * 4
    assert 3 not in strat.u
    assert all(3 not in members for members in strat.selection_log[1].values())
    assert sorted({c for members in strat.selection_log[1].values() for c in members}) == [0, 1, 2]


def test_fedsoft_sends_each_client_its_own_importance_weights_and_uniform_ones_before_it_has_any():
    strat = fedsoft(**{"fedsoft-clients-per-cluster": 4, "fedsoft-estimate-every": 5})

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u" and NODES[node] == 3 and rnd == 1:
            return []  # client 3 has no estimate in round 1
        return fedsoft_answers(rnd, node, phase, content)

    grid = drive(strat, NODES, 1, answer)
    sent = {
        NODES[m.metadata.dst_node_id]: list(m.content["fedsoft"]["u"]) for m in grid.sent if phase_of(m) == "evaluate"
    }
    assert sent == {0: SOFT_U[0], 1: SOFT_U[1], 2: SOFT_U[2], 3: [0.5, 0.5]}


@pytest.mark.parametrize("bad", [[0.6, 0.6], [0.3, 0.3], [1.5, -0.5]])
def test_fedsoft_refuses_importance_weights_that_are_not_a_distribution_over_the_centres(bad):
    strat = fedsoft(**{"fedsoft-clients-per-cluster": 4})

    def answer(rnd, node, phase, content):
        if phase == "fedsoft_u" and NODES[node] == 2:
            return [with_metrics(content, fedsoft_u=bad, num_examples=SOFT_N[2])]
        return fedsoft_answers(rnd, node, phase, content)

    drive(strat, NODES, 1, answer)
    assert sorted(strat.u) == [0, 1, 3]  # client 2's estimate was refused


def test_fedsoft_on_two_source_data_writes_each_rounds_table_of_its_centres(tmp_path):
    """On two-source data fedsoft_clusters.json holds, per round, each centre's accuracy on the source A and B
    holdouts (PI-FL's Tables 1-2 for its baseline), the same table the round's history shows."""
    strat = build_as(FedSoftStrategy, two_source(method="fedsoft", tiers=2, **{"fedsoft-clients-per-cluster": 2}))
    drive(strat, NODES, 2, fedsoft_answers)
    write_fedsoft_artifacts(strat, tmp_path)
    written = json.loads((tmp_path / "fedsoft_clusters.json").read_text())
    tables = written["tier-table (accuracy of each centre on the source A / B holdouts)"]
    assert sorted(tables) == ["1", "2"]
    expected = SourceHoldouts(strat.settings, len(NODES)).table(strat.models)
    assert tables["2"] == expected == strat.history[-1].extra["tier-table"]
    assert len(expected) == 2
    assert written["selected"] == {
        str(r): {str(s): v for s, v in sel.items()} for r, sel in strat.selection_log.items()
    }


# ---------------------------------------------------------------- bids, replies and refunds through the round loop
# (one performance and one random slot per tier)
def pifl_one_slot(**cfg):
    return build_strategy(
        parse_settings(
            {
                "method": "pifl",
                "dataset": "digits",
                "model": "mlp",
                "min-nodes": 4,
                "slots-performance": 1,
                "slots-random": 1,
                "server-set-size": 50,
                **cfg,
            }
        )
    )


@pytest.mark.parametrize("seed", range(8))
def test_a_bidder_is_only_placed_in_the_tier_it_bid_for(seed):
    # round 2: clients 0, 1, 2 bid for tier 1, client 3 bids for nothing; tier 0 has no bidder
    strat = pifl_one_slot(seed=seed)
    bids = {0: [1], 1: [1], 2: [1], 3: []}

    def answer(rnd, node, phase, content):
        return [with_metrics(content, bid=bids[NODES[node]])] if phase == "bid" else None

    drive(strat, NODES, 2, answer, seed=seed)
    assert strat.winners[1] and set(strat.winners[1]) <= {0, 1, 2} and len(strat.winners[1]) == 2  # min(slots, bidders)
    assert strat.winners[0] == [3] and strat.payers[0] == []  # drafted from the non-bidders only, for free
    assert strat.payers[1] == strat.winners[1]


def test_a_reply_with_a_broken_tier_accuracy_is_rejected_and_sets_no_best_utility():
    for bad in ([float("nan"), 0.5], [0.5, 1e6], [0.5], [0.5, -0.1]):
        strat = pifl_one_slot()

        def answer(rnd, node, phase, content, bad=bad):
            if phase == "evaluate" and NODES[node] == 0:
                return [with_metrics(content, tier_acc=bad)]
            return None

        drive(strat, NODES, 1, answer)
        assert strat.client_eval.get(0) is None  # nothing of client 0's evaluation is recorded
        assert [(f["client"], f["phase"]) for f in strat.failures if "tier-acc" in f["reason"]] == [(0, "evaluate")], (
            bad
        )
        assert all(u is None or 0.0 <= u <= 1.0 for u in strat.ledger.best_utility.values())


def test_a_round_without_evaluation_refunds_nothing():
    strat = pifl_one_slot(**{"eval-every": 2, "bid-threshold": 0.0})
    drive(
        strat, NODES, 3, lambda rnd, node, phase, content: [with_metrics(content, bid=[0])] if phase == "bid" else None
    )
    by_round = {e["round"]: e for e in strat.ledger_log}
    tier = by_round[3]["tiers"][0]  # round 3 is not evaluated (eval-every 2, 4 rounds would evaluate in 4)
    assert tier["payers"] and tier["utility"] is None and tier["refund-ratio"] == 0.0
    assert all(v == 0 for v in tier["refunds"].values())
    assert sum(tier["rewards"].values()) + tier["pool"] >= len(tier["payers"]) * strat.price - 3


def test_a_winner_whose_training_failed_gets_no_refund_and_no_reward():
    strat = pifl_one_slot()
    failed: dict[int, bool] = {}

    def answer(rnd, node, phase, content):
        if phase == "bid":
            return [with_metrics(content, bid=[0])]
        if rnd == 2 and phase == "train" and not failed:
            failed[NODES[node]] = True  # the first winner to train in round 2 crashes
            return []
        return None

    drive(strat, NODES, 2, answer)
    (loser,) = failed
    entry = strat.ledger_log[-1]["tiers"][0]
    assert loser in entry["payers"] and loser not in entry["delivered"]
    assert loser not in entry["refunds"] and loser not in entry["rewards"]
    assert set(entry["rewards"]) == set(entry["delivered"]) and entry["delivered"]
    strat.ledger.check()


def test_a_late_joiner_brings_its_own_tokens_and_joins_only_once():
    ledger = TokenLedger([0, 1], num_tiers=2, initial=100 * MICRO, price=MICRO)
    ledger.charge(0, [0])
    ledger.add_client(7, 40 * MICRO)
    assert ledger.balances[7] == 40 * MICRO and ledger.supply == 240 * MICRO
    ledger.check()  # conserved: the supply grew by exactly the newcomer's tokens
    with pytest.raises(LedgerError, match="client 7 is already in the ledger"):
        ledger.add_client(7, 10 * MICRO)
    assert ledger.balances[7] == 40 * MICRO and ledger.supply == 240 * MICRO


# ---------------------------------------------------------------- the ledger exists from the first round on
def test_the_ledger_used_before_the_first_round_opened_it_is_an_error_that_says_when_it_exists():
    """The ledger is opened when round 1 starts (or restored by a resume); a use before that must fail loudly
    instead of settling on a ledger that is not there, and say when the ledger exists."""
    strat = pifl()
    for too_early in (strat.open_ledger, lambda: strat.on_round_end(1)):
        with pytest.raises(RuntimeError) as err:
            too_early()
        message = str(err.value)
        assert "ledger" in message and "before the first round opened it" in message  # what was wrong
        assert "once round 1 has started" in message and "resume" in message  # when it is there
    drive(strat, NODES, 1)
    opened = strat.open_ledger()
    assert opened is strat.ledger and sorted(opened.balances) == sorted(NODES.values())
    resumed = pifl()
    resume(resumed, checkpoint_state(strat), 1)
    assert resumed.open_ledger().balances == opened.balances  # restored without a round
