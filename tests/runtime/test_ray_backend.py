"""The Ray backend settings the README documents: joining an existing Ray cluster.  (Client resources, one CPU per
client as the README's commands ask: tests/project/test_readme_examples.py runs those commands.)"""

import os
from pathlib import Path

import pytest

from tests.ray_head import ray_head

pytestmark = pytest.mark.slow

SMALL = {"method": "fedavg", "num-server-rounds": 1, "min-nodes": 3, "model": "softmax"}


@pytest.mark.extended  # starts its own Ray cluster (python -m pytest -m extended)
def test_existing_ray_cluster_via_ray_address(tmp_path):
    from server_app.runner import LocalSimulation

    with ray_head() as (address, ray_dir):
        old = os.environ.get("RAY_ADDRESS")
        os.environ["RAY_ADDRESS"] = address
        try:
            with LocalSimulation(workdir=tmp_path / "flwr") as sim:
                summary = sim.run(SMALL, num_supernodes=3)
            assert summary["rounds"] == 1
            # the simulation's actors ran as workers of the external cluster: their logs are in its session folder
            workers = list(Path(ray_dir).glob("session_*/logs/worker-*"))
            assert workers, sorted(str(p) for p in Path(ray_dir).rglob("*"))[:20]
        finally:
            if old is None:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = old
