"""Local differential privacy end to end through Flower (docs/privacy.md): FedC2I and pFedLIA with the defaults a
user gets plus ``dp-mode='local'`` release every client's model clipped and noised on the client, and report every
client's (epsilon, delta) round by round and in the summary; no noise and no clipping is the run without DP."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from task.privacy import local_epsilon
from tests.privacy.dp_run import reported_dp, same_accuracy_every_round

pytestmark = pytest.mark.slow


def test_fedc2i_with_the_defaults_and_local_dp(engine):
    summary = engine.run({"method": "fedc2i", "dp-mode": "local", "num-server-rounds": 2, "min-nodes": 4})
    expected = [local_epsilon(1.0, r, 1e-5) for r in (1, 2)]
    dp = reported_dp(summary, "local", "replace-one-data-set", expected)
    assert [d["releases"] for d in dp] == [1, 2]
    assert all(d["clients"] == 4 and d["noise-std"] == pytest.approx(1.0 * 1.0) for d in dp)


def test_pfedlia_with_the_defaults_and_local_dp(engine):
    """Round 1 is the warm-up, round 2 the clustering round: every client releases its lazy model and its train
    reply there, so after round 2 each has released three times."""
    summary = engine.run(
        {"method": "pfedlia", "dp-mode": "local", "num-server-rounds": 2, "warmup-rounds": 1, "min-nodes": 4}
    )
    expected = [local_epsilon(1.0, r, 1e-5) for r in (1, 3)]
    dp = reported_dp(summary, "local", "replace-one-data-set", expected)
    assert [d["releases"] for d in dp] == [1, 3]
    assert all(d["clients"] == 4 and d["noise-std"] == pytest.approx(1.0 * 1.0) for d in dp)
    rounds = json.loads((Path(summary["results"]) / "rounds.json").read_text())
    assert rounds[1]["extra"]["clustering"]["round"] == 2  # the clustering round ran, on the released lazy models


def client_models(summary):
    folder = Path(summary["results"]) / "models" / "clients"
    return {p.stem: load_file(str(p)) for p in sorted(folder.glob("client-*.safetensors"))}


def test_no_noise_and_no_clipping_is_the_run_without_dp(engine):
    base = {"method": "fedc2i", "num-server-rounds": 2, "min-nodes": 4}
    plain = engine.run(base)
    private = engine.run({**base, "dp-mode": "local", "dp-clip": 0.0, "dp-noise-multiplier": 0.0})
    assert private["epsilon"] == math.inf  # no noise: no guarantee, and the summary says so
    models = [client_models(s) for s in (plain, private)]
    assert sorted(models[0]) == sorted(models[1]) and len(models[0]) == 4
    for name, model in models[0].items():
        floating = [k for k, v in model.items() if np.issubdtype(v.dtype, np.floating)]
        assert len(floating) >= 10
        for k in floating:
            np.testing.assert_allclose(models[1][name][k], model[k], rtol=1e-4, atol=1e-5, err_msg=f"{name} {k}")
    same_accuracy_every_round(plain, private)
