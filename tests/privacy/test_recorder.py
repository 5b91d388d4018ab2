"""Runs through Flower with the message recorder on (run-config ``record-messages``): what the server pushed and pulled
is what the clients recorded receiving and sending, and all of it matches the method's declaration (``disclosure()``
in its strategy) exactly, list lengths included, so a change that makes a method send or forward more fails here.
The runs use the defaults a user gets from ``flwr run . --run-config "method='X'"`` (the ``cnn`` with BatchNorm, the
method's default options), shrunk in nodes, rounds and training samples only, plus the options named."""

from pathlib import Path
from typing import Any

import pytest

from server_app.disclosure import NEEDS, declarations
from strategies.disclosure_check import disagreements, mismatches
from task.methods import METHODS
from task.recording import read_run
from tests.in_process import NODES, OTHER_MODE, SETTINGS, SHRUNK

pytestmark = pytest.mark.slow

#: Every method's declaration is checked against its real clients' messages in one process, fast, with its defaults
#: and with the options and federations that change what travels (both DP modes, a sampled cohort, a late joiner, a
#: resumed run: tests/privacy/test_declared_in_process.py).  What only a Flower run adds is the wiring: the recording
#: mod as a Flower mod, the Grid wrapper around Flower's Grid, Flower's transport (arrays, lists and configs through
#: its serialisation) and the clients' state folders; none of it depends on the method.  A Flower run of this size
#: costs 15-35 s here (up to a minute on a loaded machine), so three runs cover the wiring by default, each with
#: options that make its messages as varied as they get: FedC2I under local DP with a bounded peer set (stacked peer
#: models, peer ids as lists, released models without counters), pFedLIA under local DP peer-to-peer (two queries, a
#: released lazy model, influence rows and beneficial sets as lists) and FedAvg under central DP with a sampled
#: cohort.  Every method with its defaults runs through Flower with ``-m extended``.
DEFAULT_RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedc2i-local-dp-peers": ("fedc2i", {"dp-mode": "local", "c2i-peers": 2}),
    "pfedlia-local-dp-p2p": ("pfedlia", {"dp-mode": "local", "lia-mode": "p2p"}),
    "fedavg-central-dp-sampled": ("fedavg", {"dp-mode": "central", "fraction-train": 0.67}),
}


def _runs():
    defaults = [pytest.param(m, {}, marks=pytest.mark.extended, id=m) for m in METHODS]
    return [pytest.param(m, options, id=name) for name, (m, options) in DEFAULT_RUNS.items()] + defaults


@pytest.mark.parametrize("method, options", _runs())
def test_what_each_party_sends_and_receives_is_what_the_method_declares(engine, method, options):
    options = {**SHRUNK, **NEEDS.get(method, {}), **SETTINGS.get(method, {}), **options}
    summary = engine.run({"method": method, **options}, num_supernodes=NODES)
    assert summary["rounds"] == 2 and summary["failures"] == 0
    server, clients = read_run(Path(summary["results"]))
    assert sorted(clients) == list(range(NODES))  # every node recorded, on its own
    on_clients = [line for lines in clients.values() for line in lines]
    assert disagreements(server, on_clients) == []
    declared, _ = declarations(method, **options)
    assert mismatches(declared, server, clients=NODES) == []
    used = {line["type"] for line in server}
    assert {line["round"] for line in server} == {1, 2} and "train" in used
    unused_queries = {q for q in METHODS[method].queries if f"query.{q}" not in used}
    assert unused_queries == OTHER_MODE.get(method, set())  # every phase of the method ran and was checked
    if "fraction-train" in options:  # the cohort was sampled: a round trained fewer than every node
        trained = [{line["node"] for line in server if line["type"] == "train" and line["round"] == r} for r in (1, 2)]
        assert min(len(nodes) for nodes in trained) < NODES
