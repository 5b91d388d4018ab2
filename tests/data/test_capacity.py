"""How many clients a run's data can serve, known before round 1 (task/data/capacity.py): a client count whose some
client would get no training or no test example, or whose partition cannot be drawn, is refused with how many
clients lack what, how many can be served and, where one does, which held-out fraction serves them all.  Every count
and client here is checked by the clients' own code (``split_indices``, the ClientApp), not by the check's."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from task.config import client_conflicts, parse_settings
from task.data import DataSettings, load_centralized, split_indices
from task.data.capacity import capacity_problem, larger_fraction
from task.data.partitioners import build_partitioner, index_table, partition_members
from task.data.sources import load_labels
from tests.client_kit import users_client


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    """A passed check is remembered under $PFLOWER_CACHE_DIR: each test starts with none remembered."""
    monkeypatch.setenv("PFLOWER_CACHE_DIR", str(tmp_path / "cache"))
    capacity_problem.cache_clear()


def lacking(settings: DataSettings, clients: int, split: str = "test") -> list[int]:
    """The clients whose own splits (as each client makes them) hold no training or no ``split`` example; a client
    whose share cannot be drawn raises, as it would on the client."""
    out = []
    for pid in range(clients):
        where = split_indices(settings, pid, clients)
        if not len(where.train) or not len(where.test if split == "test" else where.val):
            out.append(pid)
    return out


def served(settings: DataSettings, clients: int, split: str = "test") -> bool:
    try:
        return not lacking(settings, clients, split)
    except ValueError:  # the partition cannot be drawn at this size
        return False


def at_most(problem: str) -> int:
    found = re.search(r"It can serve at most (\d+) clients: use at most \1 clients \(num-supernodes", problem)
    assert found, problem
    return int(found.group(1))


def test_800_iid_clients_on_digits_are_refused_with_how_many_lack_a_test_example_and_how_many_can_be_served():
    iid = DataSettings(partition="iid")  # the user's defaults otherwise
    problem = capacity_problem(iid, 800)
    assert problem is not None
    missing = lacking(iid, 800)
    assert 0 < len(missing) < 800
    assert problem.startswith("800 clients are too many for dataset 'digits' (1,797 samples) with partition 'iid': ")
    assert f"{len(missing)} of the 800 clients would get no test example (test-fraction=0.2 " in problem
    assert "a client needs 3 samples of one label for one" in problem  # round(0.2 x 3) = 1, round(0.2 x 2) = 0
    most = at_most(problem)
    assert served(iid, most) and not served(iid, most + 1)  # the count it names serves, one more does not
    assert capacity_problem(iid, most) is None


def test_800_dirichlet_clients_on_digits_are_refused_at_once_because_no_draw_gives_each_a_share():
    dirichlet = DataSettings()  # partition 'dirichlet', alpha 0.5: the user's defaults
    with pytest.raises(ValueError, match="every draw of flwr-datasets' Dirichlet partitioner left some client"):
        split_indices(dirichlet, 0, 800)  # what each of the 800 clients would find, after its own retries
    problem = capacity_problem(dirichlet, 800)
    assert problem is not None and problem.startswith(
        "800 clients are too many for dataset 'digits' (1,797 samples) with partition 'dirichlet' (alpha=0.5): every "
        "draw of flwr-datasets' Dirichlet partitioner left some client without a sample. It can serve at most "
    )
    most = at_most(problem)
    assert served(dirichlet, most) and not served(dirichlet, most + 1)


def test_the_held_out_fraction_that_serves_every_client_is_named_where_one_does():
    iid = DataSettings(partition="iid")
    clients = 150
    assert not served(iid, clients)
    problem = capacity_problem(iid, clients)
    assert problem is not None
    larger = larger_fraction(iid, clients)
    assert larger is not None and larger > 0.2
    assert f"; or hold out more of each client's data: test-fraction={larger:g} gives every client a test example" in (
        problem
    )
    assert served(dataclasses.replace(iid, test_fraction=larger), clients)
    below = round(larger - 0.05, 2)
    assert below <= 0.2 or not served(dataclasses.replace(iid, test_fraction=below), clients)


def test_no_held_out_fraction_is_named_where_none_serves():
    """800 iid clients hold about two samples each: no test-fraction gives each a test example."""
    problem = capacity_problem(DataSettings(partition="iid"), 800)
    assert problem is not None and "hold out more" not in problem
    assert not served(DataSettings(partition="iid", test_fraction=0.85, val_fraction=0.0), 800)


def test_a_test_fraction_of_0_serves_no_client_and_the_fraction_that_does_is_named():
    none_held = DataSettings(partition="iid", test_fraction=0.0)
    problem = capacity_problem(none_held, 10)
    assert problem is not None
    assert "10 of the 10 clients would get no test example (test-fraction=0 holds none out)" in problem
    assert "It cannot serve even one client: hold out more of each client's data: test-fraction=0.05 " in problem
    assert served(dataclasses.replace(none_held, test_fraction=0.05), 10)


def test_a_run_scored_on_validation_splits_needs_a_validation_example_in_every_client():
    few = DataSettings(partition="iid", val_fraction=0.05)
    assert served(few, 60)  # every client has a test example ...
    assert not served(few, 60, "validation")  # ... but not a validation one
    assert capacity_problem(few, 60) is None
    problem = capacity_problem(few, 60, "validation")
    assert problem is not None and "would get no validation example (val-fraction=0.05 " in problem
    assert served(few, at_most(problem), "validation")


def test_the_defaults_a_user_gets_pass_and_the_passed_check_is_remembered_for_the_next_run(tmp_path):
    assert capacity_problem(DataSettings(), 10) is None
    remembered = list((tmp_path / "cache" / "capacity").iterdir())
    assert len(remembered) == 1 and remembered[0].name.startswith("digits-10-")
    capacity_problem(DataSettings(partition="iid"), 800)  # a refusal is not remembered: it is found again
    assert list((tmp_path / "cache" / "capacity").iterdir()) == remembered


def test_the_run_config_check_adds_held_out_clients_that_leave_none_to_train():
    settings = parse_settings({"holdout-clients": 4, "partition": "iid"})
    (problem,) = client_conflicts(settings, 4)
    assert problem == (
        "holdout-clients=4 holds out every one of the 4 clients: none would train; use holdout-clients < 4 or more "
        "clients"
    )
    assert client_conflicts(settings, 5) == []


def test_a_local_copy_is_checked_from_its_label_column(tmp_path):
    """A user's data-dir copy on the server's machine: its labels alone (no image decoded) draw the same partition
    as the clients' whole copy."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 90)
    split = {"image": [np.zeros((28, 28), np.uint8)] * 45, "label": labels[:45].tolist()}
    rest = {"image": [np.zeros((28, 28), np.uint8)] * 45, "label": labels[45:].tolist()}
    DatasetDict({"train": Dataset.from_dict(split), "test": Dataset.from_dict(rest)}).save_to_disk(tmp_path / "m")
    copy = DataSettings(dataset="mnist", partition="iid", data_dir=str(tmp_path / "m"))
    np.testing.assert_array_equal(load_labels("mnist", copy.data_dir).y, load_centralized("mnist", copy.data_dir).y)
    assert capacity_problem(copy, 3) is None and served(copy, 3)
    problem = capacity_problem(copy, 30)
    assert problem is not None and "dataset 'mnist' (90 samples)" in problem
    assert served(copy, at_most(problem)) and not served(copy, 30)


def test_a_client_that_finds_its_own_split_empty_refuses_with_the_runs_reason():
    """In deployment the server cannot see a node's partition: a client of 800 without a test example refuses with
    the reason the server gives in simulation, the same words on every such client; one with both splits runs."""
    iid = DataSettings(partition="iid")
    missing = set(lacking(iid, 800))
    empty, fine = min(missing), min(set(range(800)) - missing)
    with pytest.raises(ValueError, match=r"^800 clients are too many") as err:
        users_client("fedavg", {"partition-id": empty, "num-partitions": 800}, partition="iid")
    assert str(err.value) == capacity_problem(iid, 800)
    client = users_client("fedavg", {"partition-id": fine, "num-partitions": 800}, partition="iid")
    assert len(client.data.y_test) > 0


def test_a_node_with_its_own_file_that_gives_no_test_example_says_so(tmp_path):
    d = load_centralized("digits")
    two = np.flatnonzero(d.y == 1)[:1].tolist() + np.flatnonzero(d.y == 2)[:1].tolist()
    np.savez(tmp_path / "mine.npz", x=d.x[two], y=d.y[two])
    with pytest.raises(ValueError, match=r"^client 0 has no test example") as err:
        users_client("fedavg", {"partition-id": 0, "data-path": str(tmp_path / "mine.npz")})
    assert str(err.value) == (
        "client 0 has no test example (2 training, 0 test examples): give it more data, or a larger test-fraction"
    )


@pytest.mark.parametrize(
    "partition, clients",
    [
        ("iid", 7),
        ("iid", 800),
        ("dirichlet", 12),
        ("quantity-dirichlet", 9),
        ("pathological", 10),
        ("planted-clusters-noisy", 10),
        ("two-source", 6),
    ],
)
def test_the_check_reads_every_clients_share_as_load_partition_gives_it(partition, clients):
    part = build_partitioner(partition, clients, seed=3)
    part.dataset = index_table(load_centralized("digits").y)
    members = partition_members(part)
    assert len(members) == clients
    for pid, idx in enumerate(members):
        np.testing.assert_array_equal(idx, np.asarray(part.load_partition(pid)["idx"]))


def test_dialect_lines_too_few_to_hold_one_out_are_refused_with_the_run_config():
    from task.data import load_client_data
    from task.options import ConfigConflict

    few = {"dataset": "dialects", "partition": "iid", "dialect-sequences": 4, "test-fraction": 0.1}
    with pytest.raises(ConfigConflict, match=r"test-fraction=0.1 of dialect-sequences=4 lines holds out no line"):
        parse_settings(few)
    assert (
        len(
            load_client_data(
                DataSettings(dataset="dialects", partition="iid", dialect_sequences=4, test_fraction=0.1), 0, 2
            ).y_test
        )
        == 0
    )
    parse_settings({**few, "test-fraction": 0.2})
