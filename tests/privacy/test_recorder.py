"""Every method runs through Flower with the message recorder on (run-config ``record-messages``): what the server
pushed and pulled is what the clients recorded receiving and sending, and all of it matches the method's
declaration (``disclosure()`` in its strategy) exactly, so a change that makes a method send or forward more fails
here.  The runs use the defaults a user gets from ``flwr run . --run-config "method='X'"`` (the ``cnn`` with
BatchNorm, the method's default options), shrunk in nodes, rounds and training samples only."""

from pathlib import Path

import pytest

from server_app.disclosure import NEEDS, declarations
from strategies.disclosure_check import disagreements, mismatches
from task.methods import METHODS
from task.recording import read_run
from tests.in_process import NODES, OTHER_MODE, SETTINGS, SHRUNK

pytestmark = pytest.mark.slow

#: Every method's declaration is checked against its real clients' messages in one process, fast
#: (tests/privacy/test_declared_in_process.py); what only a Flower run adds is the wiring: the recording mod as a
#: Flower mod, the Grid wrapper around Flower's Grid, Flower's transport and the clients' state folders.  Two methods
#: check it by default: FedC2I (every client receives its peers' whole models, stacked) and pFedLIA (train, evaluate
#: and two queries, a lazy model and influence rows).  A Flower run of this size costs 15-35 s here, so the others
#: run with ``-m extended``.
DEFAULT_RUN = ("fedc2i", "pfedlia")


def _methods():
    return [pytest.param(m, marks=() if m in DEFAULT_RUN else pytest.mark.extended) for m in METHODS]


@pytest.mark.parametrize("method", _methods())
def test_what_each_party_sends_and_receives_is_what_the_method_declares(simulation, method):
    options = {**SHRUNK, **NEEDS.get(method, {}), **SETTINGS.get(method, {})}
    summary = simulation.run({"method": method, **options}, num_supernodes=NODES)
    assert summary["rounds"] == 2 and summary["failures"] == 0
    server, clients = read_run(Path(summary["results"]))
    assert sorted(clients) == list(range(NODES))  # every node recorded, on its own
    on_clients = [line for lines in clients.values() for line in lines]
    assert disagreements(server, on_clients) == []
    declared, _ = declarations(method, **options)
    assert mismatches(declared, server) == []
    used = {line["type"] for line in server}
    assert {line["round"] for line in server} == {1, 2} and "train" in used
    unused_queries = {q for q in METHODS[method].queries if f"query.{q}" not in used}
    assert unused_queries == OTHER_MODE.get(method, set())  # every phase of the method ran and was checked
