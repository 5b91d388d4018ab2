import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def simulation():
    """A private SuperLink in simulation mode for end-to-end runs, stopped by pid at the end."""
    from server_app.runner import LocalSimulation

    with LocalSimulation() as sim:
        yield sim
