"""A clustering method that ends with one cluster says so: the summary line and summary.json name the clusters,
and one cluster is spelt out ("1 cluster: the run was FedAvg (...)") instead of passing for personalization.
pFedLIA's and the Oracle's cases are in tests/pfedlia/test_summary.py."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from flwr.app import MetricRecord

from server_app.app import build_strategy
from server_app.results import ResultsWriter
from task.config import parse_settings
from tests.strategy_harness import ReplayGrid, outgoing_messages, phase_of, reply_message, run_round, valid_content

NODES = [1003, 7, 42, 555]
CLIENT_OF = {n: i for i, n in enumerate(NODES)}


def drive(cfg: dict, rounds: int = 2, edit=None):
    """Run a strategy over scripted valid replies; ``edit(round, phase, client, metrics)`` may change a reply's
    metrics."""
    strategy = build_strategy(
        parse_settings({"model": "mlp", "min-nodes": 4, "local-epochs": 1, "num-server-rounds": rounds, **cfg})
    )

    def respond(msg):
        node, phase = msg.metadata.dst_node_id, phase_of(msg)
        server_round = int(msg.content["config"]["server-round"])
        seed = zlib.crc32(f"{server_round}/{phase}/{node}".encode())
        content = valid_content(strategy.reply_spec(phase, node), CLIENT_OF[node], seed)
        if edit is not None:
            metrics = dict(content.metric_records["metrics"])
            edit(server_round, phase, CLIENT_OF[node], metrics)
            content["metrics"] = MetricRecord(metrics)
        return [reply_message(node, content)]

    grid = ReplayGrid(NODES, respond)
    with outgoing_messages():
        for r in range(1, rounds + 1):
            run_round(strategy, grid, r)
    assert strategy.failures == []
    return strategy


def summarise(strategy, aborted=None):
    """(summary line, summary.json) as the ServerApp writes them at the end of a run."""
    writer = ResultsWriter(strategy.settings, run_id=1)
    line = writer.write(strategy.results(), 1.0, aborted=aborted)
    return line, json.loads((writer.folder / "summary.json").read_text())


def test_cfl_that_never_split_says_the_run_was_fedavg(tmp_path):
    strategy = drive({"method": "cfl", "cfl-min-rounds": 1, "results-dir": str(tmp_path)})
    line, summary = summarise(strategy)
    assert line.startswith(
        "pflower cfl on digits/dirichlet: 2 rounds, 4 clients, 1 cluster: the run was FedAvg (no cluster split: "
    )
    assert summary["clusters"] == 1 and summary["clustering"] == (
        "1 cluster: the run was FedAvg (no cluster split: no round from cfl-min-rounds on had a mean update norm "
        "below cfl-eps1 and a client's above cfl-eps2; rounds.json lists the norms)"
    )


def test_cfl_that_split_names_its_clusters_and_does_not_claim_fedavg(tmp_path):
    always = {"method": "cfl", "cfl-min-rounds": 1, "cfl-eps1": 1e9, "cfl-eps2": 0.0, "results-dir": str(tmp_path)}
    strategy = drive(always)
    clusters = len(set(strategy.cluster_of.values()))
    assert clusters >= 2
    line, summary = summarise(strategy)
    assert line.startswith(f"pflower cfl on digits/dirichlet: 2 rounds, 4 clients, {clusters} clusters, personal")
    assert summary["clusters"] == clusters and summary["clustering"] == f"{clusters} clusters"
    assert "FedAvg" not in line


def _ifca_choice(choose):
    def edit(server_round, phase, client, metrics):
        if phase == "train":
            metrics["cluster"] = choose(server_round, client)

    return edit


def test_ifca_where_every_client_always_chose_one_cluster_model_says_the_run_was_fedavg(tmp_path):
    cfg = {"method": "ifca", "tiers": 3, "results-dir": str(tmp_path)}
    line, summary = summarise(drive(cfg, edit=_ifca_choice(lambda r, c: 2)))
    assert "4 clients, 1 cluster: the run was FedAvg (every client chose cluster model 2 in every round), " in line
    assert summary["clusters"] == 1


def test_ifca_names_the_cluster_models_chosen_in_the_last_round(tmp_path):
    cfg = {"method": "ifca", "tiers": 3, "results-dir": str(tmp_path)}
    merged = drive(cfg, rounds=3, edit=_ifca_choice(lambda r, c: c % 2 if r == 1 else 1))  # two, then one
    _, summary = summarise(merged)
    assert summary["clusters"] == 1
    assert summary["clustering"] == "1 cluster: every client chose cluster model 1 in the last round"
    split = drive(cfg, rounds=3, edit=_ifca_choice(lambda r, c: 1 if r < 3 else c % 2))  # one, then two
    _, summary = summarise(split)
    assert summary["clusters"] == 2 and summary["clustering"] == "2 clusters"


def _fedsoft_weights(weights):
    def edit(server_round, phase, client, metrics):
        if phase == "fedsoft_u":
            metrics["fedsoft-u"] = weights(client)

    return edit


def test_fedsoft_where_every_client_favours_one_centre_says_so(tmp_path):
    cfg = {"method": "fedsoft", "fedsoft-clients-per-cluster": 2, "results-dir": str(tmp_path)}
    one = drive(cfg, edit=_fedsoft_weights(lambda c: [0.2, 0.8]))
    line, summary = summarise(one)
    assert "4 clients, 1 cluster: every client's importance weights favour centre 1 (last estimate), " in line
    assert summary["clusters"] == 1
    two = drive(cfg, edit=_fedsoft_weights(lambda c: [0.9, 0.1] if c % 2 else [0.3, 0.7]))
    assert summarise(two)[1]["clustering"] == "2 clusters"


def test_a_method_that_does_not_cluster_and_a_run_without_rounds_say_nothing_of_clusters(tmp_path):
    strategy = drive({"method": "fedavg", "results-dir": str(tmp_path)})
    line, summary = summarise(strategy)
    assert line.startswith("pflower fedavg on digits/dirichlet: 2 rounds, 4 clients, personalized acc ")
    assert "clusters" not in summary and "clustering" not in summary
    never = build_strategy(parse_settings({"method": "cfl", "model": "mlp", "results-dir": str(tmp_path)}))
    line, summary = summarise(never, aborted="gave up waiting for nodes")
    assert line.startswith("pflower cfl on digits/dirichlet: 0 rounds, 0 clients, personalized acc n/a")
    assert "clusters" not in summary and summary["aborted"] == "gave up waiting for nodes"


# ------------------------------------------------------------------------------------ the clustering methods' artefacts
def artefact(summary: dict, name: str) -> dict:
    """A method's artefact in the results folder the run's summary names."""
    return json.loads((Path(summary["results"]) / name).read_text())


def test_cfl_writes_each_split_and_every_clients_cluster_to_cfl_clusters_json(tmp_path):
    always = {"method": "cfl", "cfl-min-rounds": 1, "cfl-eps1": 1e9, "cfl-eps2": 0.0, "results-dir": str(tmp_path)}
    strategy = drive(always)
    _, summary = summarise(strategy)
    info = artefact(summary, "cfl_clusters.json")
    assert set(info) == {"splits", "assignment"}
    # every client by its id, in the cluster the strategy sends it the model of
    assert info["assignment"] == {str(c): strategy.cluster_of[c] for c in CLIENT_OF.values()}
    assert len(set(info["assignment"].values())) == summary["clusters"] >= 2
    # one entry per split: the round, the cluster split and the new one, and both halves' sizes
    assert len(info["splits"]) == summary["clusters"] - 1
    for split in info["splits"]:
        assert split["round"] in (1, 2) and split["new-cluster"] in info["assignment"].values()
        assert min(split["sizes"]) >= 1


def test_ifca_writes_each_rounds_choices_and_tier_table_to_ifca_clusters_json(tmp_path):
    two_source = {"partition": "two-source", "mixture": "10:90"}
    cfg = {"method": "ifca", "tiers": 2, "results-dir": str(tmp_path), **two_source}
    strategy = drive(cfg, rounds=2, edit=_ifca_choice(lambda r, c: (c + r) % 2))
    _, summary = summarise(strategy)
    info = artefact(summary, "ifca_clusters.json")
    tables = "tier-table (accuracy of each cluster model on the source A / B holdouts)"
    assert set(info) == {"choices", tables}
    # each round by its number: every client's chosen cluster model, by client id
    assert info["choices"] == {str(r): {str(c): (c + r) % 2 for c in CLIENT_OF.values()} for r in (1, 2)}
    # each round's table: one row per cluster model, its accuracy on each source's holdout
    assert set(info[tables]) == {"1", "2"}
    for table in info[tables].values():
        assert len(table) == 2 and all(0.0 <= acc <= 1.0 for row in table for acc in row.values())
