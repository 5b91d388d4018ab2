"""PI-FL's per-source tier tables (the paper's Tables 1-2; pifl.md §4-§5; docs/methods/pifl.md
"Artefacts"): every tier model's accuracy on the source A and B holdouts, which hold only what no client of the run
trains on; strategies/tier_tables.py also makes the distinct starting models of IFCA and FedSoft (pifl.md §5)."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from strategies.pifl import PIFLStrategy
from strategies.tier_tables import SourceHoldouts, TierTables, distinct_starting_models
from task.data import partitioner_for
from task.models import build_model
from task.params import load_record
from task.train import evaluate
from tests.pifl.server_kit import NODES, two_source
from tests.strategy_harness import build_as, drive


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
