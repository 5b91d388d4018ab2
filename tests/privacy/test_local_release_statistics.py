"""Under local DP, what leaves a client is the clipped change plus Gaussian noise of the declared scale, and nothing
else: a statistical test on ``release - reference``, through the ClientApp's own handlers (FedC2I's train reply,
pFedLIA's train reply and lazy model) on the user's default model (the ``cnn`` with BatchNorm).

Training moves the model far further than ``dp-clip`` (checked), so the honest release minus its reference is
``C u + n``: ``u`` the direction of the un-noised change (the same client's release without clipping and noise, which
training reproduces exactly from the run's seed), ``C u`` the clipped change, and ``n`` noise that must be
``N(0, (sigma C)^2)`` in every coordinate.  The test checks that the residual ``release - reference - C u`` has mean 0,
the declared variance overall and in every array (chi-square bounds for that array's size), a Gaussian shape
(Kolmogorov-Smirnov), and that the release's component along ``u`` is ``C`` within the noise.  Every bound is a
quantile at a false-alarm probability of ``ALPHA`` over all the checks of one release, from the sample sizes, not a
typed tolerance.  The same checks on releases that leak (the un-noised model, the model unclipped with noise, the
clipped change without noise or with noise of another scale, one array carrying the trained model) must fail.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict
from scipy import stats

from task.params import record_to_numpy, stacked_record, to_record
from task.privacy import clip_bound, update_norm
from tests.client_kit import distinct_states, numpy_state, users_client
from tests.in_process import handled

#: the probability that an honest release fails the checks (all of them together)
ALPHA = 1e-6
CLIP = 0.02

Arrays = dict[str, np.ndarray]


def noise_problems(release: Arrays, reference: Arrays, trained: Arrays, sigma: float, clip: float) -> list[str]:
    """Why ``release`` is not ``reference + clip(trained - reference, clip) + N(0, (sigma clip)^2 I)`` (empty: it is
    consistent with it at false-alarm probability ALPHA).  ``trained`` moved further than ``clip`` from
    ``reference``, so the clipped change is ``clip`` times the unit direction of the change."""
    keys = sorted(release)
    change = {k: trained[k].astype(np.float64) - reference[k] for k in keys}
    norm = update_norm(change)
    assert norm > 10 * clip, f"the test needs a change far beyond the clip bound: {norm} vs {clip}"
    direction = {k: change[k] / norm for k in keys}
    released = {k: release[k].astype(np.float64) - reference[k] for k in keys}
    residual = {k: released[k] - clip * direction[k] for k in keys}
    std = sigma * clip
    flat = np.concatenate([residual[k].ravel() for k in keys])
    size = flat.size
    checks = 4 + len(keys)  # mean, variance, shape, the component along the change, and each array's variance
    level = ALPHA / checks
    z = stats.norm.isf(level / 2)
    problems = []
    mean = flat.mean()
    if abs(mean) > z * std / math.sqrt(size):
        problems.append(f"the noise has mean {mean:.3g}, beyond {z * std / math.sqrt(size):.3g}")
    problems += _variance("all arrays", flat, std, level)
    for k in keys:
        problems += _variance(repr(k), residual[k].ravel(), std, level)
    ks = stats.kstest(flat / std, "norm")
    if ks.pvalue < level:
        problems.append(f"the noise is not Gaussian of std {std:.3g} (Kolmogorov-Smirnov p = {ks.pvalue:.3g})")
    along = sum(float(np.sum(released[k] * direction[k])) for k in keys)
    if abs(along - clip) > z * std:
        problems.append(f"the release moves {along:.4g} along the change, not the clip bound {clip} +- {z * std:.3g}")
    return problems


def _variance(where: str, values: np.ndarray, std: float, level: float) -> list[str]:
    """``sum(x^2) / std^2`` of ``n`` independent N(0, std^2) values is chi-square with n degrees of freedom."""
    n = values.size
    statistic = float(np.sum(np.square(values))) / std**2
    low, high = stats.chi2.ppf(level / 2, n), stats.chi2.isf(level / 2, n)
    if not low <= statistic <= high:
        return [f"{where}: the noise has std {math.sqrt(statistic / n) * std:.4g}, not {std:.4g} (n = {n})"]
    return []


# ---------------------------------------------------------------------------------------------- through the ClientApp
#: fewer training samples per client than the user's default, for speed: the mechanism does not depend on them
SHRUNK = {"train-samples": 40}


def _context(method: str, **run_config: Any) -> Context:
    ctx = users_client(method, {"cache-dir": ""}, **SHRUNK, **run_config).context
    return Context(
        run_id=1, node_id=ctx.node_id, node_config=ctx.node_config, state=RecordDict(), run_config=ctx.run_config
    )


def leaves(method: str, kind: str, content: RecordDict, declared: float | None = None, **run_config: Any) -> Arrays:
    """The arrays of the reply the ClientApp's handler for ``kind`` sends for ``content`` (a fresh node), the message
    declaring the noise multiplier ``declared`` (default: the run config's, as a server without a target declares
    it) and the run's clip bound."""
    context = _context(method, **{"dp-mode": "local", **run_config})
    content = copy.deepcopy(content)
    sigma = float(run_config.get("dp-noise-multiplier", 1.0)) if declared is None else declared
    config = content.config_records["config"]
    config["dp-noise-multiplier"] = sigma
    config["dp-clip"] = clip_bound(float(run_config.get("dp-clip", 1.0)))
    return record_to_numpy(handled(kind, content, context).array_records["arrays"])


def _fedc2i() -> tuple[RecordDict, Arrays]:
    """A FedC2I train message (the client's own previous release first, then two peers) and its reference."""
    states = [numpy_state(s) for s in distinct_states(users_client("fedc2i"), 3, seed=1, spread=0.1)]
    content = RecordDict(
        {
            "peers": stacked_record(states),
            "peer-clients": ConfigRecord({"client-ids": [1, 2]}),
            "config": ConfigRecord({"server-round": 2}),
        }
    )
    return content, states[0]


def _pfedlia() -> tuple[RecordDict, Arrays]:
    """A pFedLIA message bringing a model (the warm-up model, or the client's cluster model), its reference."""
    (state,) = [numpy_state(s) for s in distinct_states(users_client("pfedlia"), 1, seed=2, spread=0.1)]
    return RecordDict({"arrays": to_record(state), "config": ConfigRecord({"server-round": 2})}), state


CASES = {
    "fedc2i-train": ("fedc2i", "train", _fedc2i),
    "pfedlia-train": ("pfedlia", "train", _pfedlia),
    "pfedlia-lazy": ("pfedlia", "query.lazy", _pfedlia),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request) -> dict[str, Any]:
    """One release path: the message, its reference, and the un-noised trained model (the release without clipping
    and noise: training repeats exactly from the run's seed)."""
    method, kind, build = CASES[request.param]
    content, reference = build()
    trained = leaves(method, kind, content, **{"dp-clip": 0.0, "dp-noise-multiplier": 0.0})
    floating = {k for k, v in reference.items() if np.issubdtype(v.dtype, np.floating)}
    assert set(trained) == floating  # integer buffers stay home
    return {"method": method, "kind": kind, "content": content, "reference": reference, "trained": trained}


@pytest.mark.parametrize("sigma", [0.1, 1.0])
def test_what_leaves_is_the_clipped_change_plus_noise_of_the_declared_scale(case, sigma):
    release = leaves(case["method"], case["kind"], case["content"], **{"dp-clip": CLIP, "dp-noise-multiplier": sigma})
    assert sorted(release) == sorted(case["trained"])
    assert noise_problems(release, case["reference"], case["trained"], sigma, CLIP) == []


def test_the_noise_is_the_scale_the_message_declares_whatever_the_run_config_says(case):
    """The server calibrates the noise multiplier (dp-target-epsilon) and a resumed run keeps it: a client noises
    with what the round's message declares, not with what it would compute from the run config (which, resumed with
    more rounds, would calibrate less noise)."""
    run = {"dp-clip": CLIP, "dp-noise-multiplier": 5.0, "dp-target-epsilon": 50.0}
    release = leaves(case["method"], case["kind"], case["content"], declared=0.1, **run)
    assert noise_problems(release, case["reference"], case["trained"], 0.1, CLIP) == []
    assert noise_problems(release, case["reference"], case["trained"], 5.0, CLIP)


def _leaks(reference: Arrays, trained: Arrays, sigma: float, rng: np.random.Generator) -> dict[str, Arrays]:
    """Releases a broken privacy step could send in the same keys, shapes and dtypes."""
    keys = sorted(trained)
    change = {k: trained[k].astype(np.float64) - reference[k] for k in keys}
    clipped = {k: v * CLIP / update_norm(change) for k, v in change.items()}

    def noise(scale: float) -> Mapping[str, np.ndarray]:
        return {k: rng.normal(0.0, scale * sigma * CLIP, np.shape(trained[k])) for k in keys}

    def made(step: Mapping[str, np.ndarray], extra: Mapping[str, np.ndarray]) -> Arrays:
        return {k: (reference[k] + step[k] + extra[k]).astype(trained[k].dtype) for k in keys}

    honest = made(clipped, noise(1.0))
    head = max(keys, key=lambda k: (k.endswith("weight"), keys.index(k)))  # the last weight: the classifier's
    return {
        "the un-noised model": dict(trained),
        "the model with noise, unclipped": made(change, noise(1.0)),
        "the clipped change without noise": made(clipped, noise(0.0)),
        "noise of half the scale": made(clipped, noise(0.5)),
        "noise added twice": made(clipped, noise(math.sqrt(2))),
        "one array carrying the trained model": {**honest, head: trained[head]},
    }


@pytest.mark.parametrize("sigma", [0.1, 1.0])
def test_a_release_that_leaks_inside_the_same_keys_fails_the_same_checks(case, sigma):
    rng = np.random.default_rng(0)
    for name, release in _leaks(case["reference"], case["trained"], sigma, rng).items():
        assert noise_problems(release, case["reference"], case["trained"], sigma, CLIP), name
