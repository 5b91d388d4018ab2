"""A run the data cannot serve is refused by the ServerApp at start-up, through ``flwr run``, before round 1: the
user's default job scaled to 800 simulated clients (digits, Dirichlet) is refused in the ServerApp's first seconds,
with how many clients the data can serve, instead of every client retrying the Dirichlet draw for minutes.
tests/data/test_capacity.py checks the reasons and counts; this checks that a simulation meets them first."""

import pytest

from server_app.job import Exit, outcome
from server_app.runner import RunFailed, refusal

pytestmark = pytest.mark.slow


def test_800_simulated_clients_with_the_users_defaults_are_refused_at_start_up(simulation):
    with pytest.raises(RunFailed) as err:
        simulation.run({"num-server-rounds": 3}, num_supernodes=800, timeout=600)
    out = err.value.output
    reason = refusal(out)
    assert reason is not None, out[-3000:]
    assert reason.startswith("800 clients are too many for dataset 'digits' (1,797 samples) with partition 'dirichlet'")
    assert "It can serve at most" in reason
    assert "[ROUND 1/3]" not in out and "Dirichlet partition: lowering the minimum" not in out  # no client ran
    assert outcome(0, out)[0] == Exit.REFUSED
