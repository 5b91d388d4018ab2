"""The engine gives what ``flwr run`` gives: every method at its defaults, and the untidy cases (differential privacy,
a run stopped and resumed, an attack under a robust rule, a client that fails, newcomers), each run once through
``flwr run`` on a private SuperLink (Flower's Ray backend, clients in their own processes) and once on the engine
(Flower's simulation runtime in this process), compared file by file with only timings, memory, run ids and node ids
set aside (tests/engine/compare.py).

These are the only end-to-end runs of every method through ``flwr run`` in the default test command; the method-level
end-to-end tests run on the engine, which this file holds to Flower's runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server_app.disclosure import NEEDS
from server_app.runner import RunFailed, stopped_after
from task.methods import METHODS
from tests.engine.compare import assert_same_results, differences, results, scrub
from tests.in_process import NODES, SETTINGS

pytestmark = pytest.mark.slow

#: the defaults a user gets (``--run-config "method='X'"``), two rounds on three nodes; what a method needs to reach
#: its defining phases in two rounds (pFedLIA's clustering round, CFL's splits, the Oracle's planted groups)
SHRUNK = {"num-server-rounds": 2, "min-nodes": NODES}


def method_config(method: str) -> dict[str, Any]:
    return {"method": method, **SHRUNK, **NEEDS.get(method, {}), **SETTINGS.get(method, {})}


def both(simulation, engine, config: dict[str, Any], nodes: int = NODES) -> tuple[Path, Path]:
    """The results folders of ``config`` run through ``flwr run`` and on the engine, side by side in one folder (the
    messages carry the folder's path: its length counts in the bytes sent)."""
    config = {"results-dir": str(Path(engine.home) / "side-by-side"), **config}
    by_flwr = Path(simulation.run(config, num_supernodes=nodes)["results"])
    by_engine = Path(engine.run(config, num_supernodes=nodes)["results"])
    return by_flwr, by_engine


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_gives_the_same_results_on_both_runtimes(simulation, engine, method):
    by_flwr, by_engine = both(simulation, engine, method_config(method))
    assert_same_results(by_flwr, by_engine)


def test_an_attack_under_a_robust_rule_gives_the_same_results(simulation, engine):
    config = {**method_config("fedavg"), "attack": "sign-flip", "attack-share": 0.25, "aggregator": "median"}
    by_flwr, by_engine = both(simulation, engine, config, nodes=4)
    assert_same_results(by_flwr, by_engine)
    assert results(by_flwr)["summary.json"]["attackers"]  # the attack ran


def test_a_failing_client_gives_the_same_results(simulation, engine):
    # client 1 crashes in every round, client 2 sends NaN in round 1: both rejected, the run goes on
    config = {**method_config("fedavg"), "fault": "crash@1,nan@2:1", "min-nodes": 4}
    by_flwr, by_engine = both(simulation, engine, config, nodes=4)
    assert_same_results(by_flwr, by_engine)
    assert results(by_flwr)["summary.json"]["failures"] >= 3


def test_newcomers_give_the_same_results(simulation, engine):
    config = {**method_config("ifca"), "holdout-clients": 1, "min-nodes": 4}
    by_flwr, by_engine = both(simulation, engine, config, nodes=4)
    assert_same_results(by_flwr, by_engine)
    assert results(by_flwr)["summary.json"]["newcomers"] == 1


def _stop_then_resume(runtime, config: dict[str, Any], folder: Path) -> Path:
    """Stop ``config`` after round 1 and resume it, its results under ``folder`` (both runtimes the same folder: the
    messages carry its path, whose length counts in the bytes sent)."""
    config = {"results-dir": str(folder), **config}
    with pytest.raises(RunFailed) as stop:
        runtime.run({**config, "stop-after": 1}, num_supernodes=NODES)
    stopped = stopped_after(stop.value.output)
    assert stopped is not None and stopped[0] == 1, stop.value.output[-2000:]
    return Path(runtime.run({**config, "resume-from": str(stopped[1])}, num_supernodes=NODES)["results"])


def test_a_run_stopped_and_resumed_gives_the_same_results(simulation, engine):
    config = {**method_config("fedcac"), "num-server-rounds": 3}
    folder = Path(engine.home) / "side-by-side"
    assert_same_results(_stop_then_resume(simulation, config, folder), _stop_then_resume(engine, config, folder))


def shape(value: Any) -> Any:
    """A JSON value's structure: the same keys and lengths, every leaf replaced by its type's name."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__


#: what a DP run's noise does not touch: the privacy accounting, and who took part
DP_SUMMARY = (
    "rounds",
    "clients",
    "failures",
    "dp-mode",
    "epsilon",
    "delta",
    "dp-neighbours",
    "dp-accountant",
    "dp-noise-multiplier",
)


@pytest.mark.parametrize("mode, method", [("central", "fedavg"), ("local", "fedc2i")])  # FedC2I takes local DP
def test_differential_privacy_accounts_the_same_on_both_runtimes(simulation, engine, mode, method):
    """Equality cannot hold for the models: DP noise is drawn from the operating system's CSPRNG, never from the run's
    seed (docs/privacy.md), so two runs of one config differ on any runtime.  What can be compared is: the same files
    with the same structure, and the same privacy accounting round by round (epsilon, delta, noise multiplier, clip)
    and the same participation."""
    config = {**method_config(method), "dp-mode": mode, "dp-noise-multiplier": 1.0, "dp-clip": 1.0}
    by_flwr, by_engine = both(simulation, engine, config)
    a, b = results(by_flwr), results(by_engine)
    assert not differences(shape(a), shape(b))
    assert {k: a["summary.json"].get(k) for k in DP_SUMMARY} == {k: b["summary.json"].get(k) for k in DP_SUMMARY}
    assert a["summary.json"]["epsilon"] > 0
    dp_a = [scrub(r["extra"].get("dp")) for r in a["rounds.json"]]
    dp_b = [scrub(r["extra"].get("dp")) for r in b["rounds.json"]]
    assert dp_a == dp_b and all(dp_a)
    assert [r["train"].get("num-replies") for r in a["rounds.json"]] == [
        r["train"].get("num-replies") for r in b["rounds.json"]
    ]
