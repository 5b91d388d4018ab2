"""The empirical privacy audit (benchmarks/privacy_audit.py): the attack's advantage and its chance level are what
they say, the bound is the one (epsilon, delta)-DP gives any test, and docs/privacy.md's table is what the committed
records give."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import privacy_audit as audit
from benchmarks import records
from benchmarks.reporting import privacy_audit as report


def test_the_advantage_is_the_best_threshold_tpr_minus_fpr():
    assert audit.advantage(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == (1.0, 1.0)  # separated: every member found
    assert audit.advantage(np.array([1.0, 2.0]), np.array([1.0, 2.0]))[0] == pytest.approx(0.0)
    # one of four members above every non-member: a threshold between finds it without a false positive
    adv, auc = audit.advantage(np.array([9.0, 0.0, 0.1, 0.2]), np.array([0.5, 0.6, 0.7, 0.8]))
    assert adv == pytest.approx(0.25) and auc == pytest.approx(0.25)


def test_the_chance_level_is_what_the_attack_reaches_on_scores_that_carry_no_membership():
    rng = np.random.default_rng(1)
    n = 300
    level = audit.chance_level(rng.normal(size=n), rng.normal(size=n))
    # the largest TPR - FPR of a random ranking is a Kolmogorov-Smirnov statistic: its 95 % point is ~1.36 sqrt(2/n)
    assert 0.5 * 1.36 * math.sqrt(2 / n) < level < 1.5 * 1.36 * math.sqrt(2 / n)
    assert audit.advantage(rng.normal(1.0, 1.0, n), rng.normal(size=n))[0] > level  # a real shift is above it


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
def test_the_bound_is_reached_by_randomized_response_and_no_test_beats_it(epsilon):
    """Randomized response on one bit (the truth with probability e^eps / (1 + e^eps)) is (eps, 0)-DP and its best
    test has advantage (e^eps - 1) / (e^eps + 1): the bound is tight; delta adds at most delta to it."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    assert audit.advantage_bound(epsilon, 0.0) == pytest.approx(p - (1 - p))
    assert audit.advantage_bound(epsilon, 1e-5) - audit.advantage_bound(epsilon, 0.0) <= 1e-5
    assert audit.advantage_bound(math.inf, 1e-5) == 1.0 and audit.advantage_bound(0.0, 0.0) == 0.0


def test_docs_privacy_md_holds_the_audit_table_the_records_give():
    assert report.build_page(records.RAW) == report.PAGE.read_text(), (
        "docs/privacy.md's generated audit table differs from what benchmarks/raw/ gives: run "
        "`python -m benchmarks.report` and commit the result"
    )


def test_the_table_says_whether_each_run_stayed_within_its_bound_and_above_its_chance_level(tmp_path):
    def rec(mode, target, rounds):
        r = {
            "schema": records.SCHEMA,
            "grid": report.GRID,
            "cell": {"mode": mode, "epsilon": target},
            "command": "python -m benchmarks.privacy_audit",
            "run": "r",
            "num-supernodes": 10,
            "error": None,
            "code": {"commit": "abc", "dirty": False},
            "machine": {
                "cores": 2,
                "memory-gib": 24,
                "gpu": False,
                "python": "3.11",
                "flwr": "1.41.0",
                "torch": "2.14.1",
                "load-before": 1.0,
                "load-after": 1.0,
            },
            "run-config": {"method": "fedavg"},
            "summary": {},
            "rounds": [],
            "audit": rounds,
        }
        records.write_record(r, tmp_path)

    def round_(k, adv, chance, bound, eps=1.0):
        return {"round": k, "epsilon": eps, "example-epsilon": eps, "advantage-bound": bound, "advantage": adv} | {
            "chance": chance,
            "auc": 0.5,
            "members": 100,
            "releases-attacked": 1,
        }

    rec("central", "1", [round_(1, 0.05, 0.1, 0.4), round_(2, 0.2, 0.1, 0.5)])
    rec("central", "inf", [round_(1, 0.3, 0.1, 1.0, math.inf)])
    rec("local", "8", [round_(1, 0.95, 0.1, 0.9, 8.0)])  # an attack above what epsilon allows: said, not hidden
    text = report.render_audit(tmp_path)
    assert "FedC2I, local DP (each client's release), target ε 8: ABOVE its bound in round 1" in text
    assert "FedAvg, central DP, target ε 1: within its bound in every round, above its chance level in round 2" in text
    assert "FedAvg without DP: within its bound in every round, above its chance level in round 1" in text
    assert text.index("target ε 1") < text.index("FedAvg without DP")  # without DP after the DP runs
