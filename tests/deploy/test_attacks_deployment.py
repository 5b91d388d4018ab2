"""Attacks on Flower's deployment runtime (deploy/local_cluster.py, the loopback cluster: SuperLink and SuperNodes as
separate processes, TLS, node authentication): a data holder's ClientApp lies as the run config says, from its own
node config's partition id, and the server reports it as in a simulation (tests/robust/test_e2e.py runs every
attack kind there).  The default test run deploys the scaled sign-flip under Multi-Krum; every other attack kind,
each with the rule its simulation test pairs it with, is deployed with ``python -m pytest -m extended``.  Skips
where tests/deploy/test_local_cluster.py skips."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from task.attacks import AttackOptions, attackers

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deploy")]

TOOLS = ("flower-superlink", "flower-supernode", "flwr", "openssl", "ssh-keygen")
missing = [t for t in TOOLS if shutil.which(t) is None]
if missing:
    pytest.skip(f"deployment tests need {missing} on PATH", allow_module_level=True)

from tests.deploy.test_local_cluster import run_cluster  # noqa: E402
from tests.robust.test_e2e import RUNS  # noqa: E402

NODES, ROUNDS = 4, 2
DEFAULT = ("fedavg", "sign-flip", "multi-krum")


def params():
    return [pytest.param(*run, id="-".join(run), marks=() if run == DEFAULT else pytest.mark.extended) for run in RUNS]


@pytest.mark.parametrize("method,attack,rule", params())
def test_a_deployed_attack_names_its_attackers_and_reports_the_honest_clients(tmp_path, method, attack, rule):
    report = run_cluster(
        tmp_path,
        *("--nodes", str(NODES), "--rounds", str(ROUNDS), "--method", method),
        *("--run-config", f"attack='{attack}' aggregator='{rule}' eval-every={ROUNDS}"),
    )
    folder = Path(report["results"])
    summary = json.loads((folder / "summary.json").read_text())
    bad = attackers(AttackOptions(attack=attack), range(NODES))
    assert bad, "the default attack-share names at least one of the nodes"
    assert summary["attack"] == attack and summary["aggregator"] == rule and summary["attackers"] == bad
    assert summary["failures"] == 0 and summary["rounds"] == ROUNDS
    with (folder / "clients.csv").open() as fh:
        clients = {int(row["client"]): row for row in csv.DictReader(fh)}
    honest = [float(row["personal-acc"]) for c, row in clients.items() if c not in bad]
    assert len(honest) == NODES - len(bad) and summary["honest-personal-acc"] == pytest.approx(np.mean(honest))
    record = json.loads((folder / "robustness.json").read_text())
    assert record["attackers"] == bad and set(record["by-round"]) == {str(r) for r in range(1, ROUNDS + 1)}
    if attack == "sign-flip":  # ten times the flipped update is far from every honest model: Multi-Krum drops it
        assert record["rule"]["share-kept"]["attackers"] == 0.0 and summary["attackers-isolated"]["rule"] is True
