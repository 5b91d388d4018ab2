"""Which clients attack, and which settings are refused at start-up with their reason: an aggregation rule a method
has no use for, a rule that would break central DP's accounting, an attack a method or data set cannot carry."""

import itertools
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server_app.disclosure import NEEDS
from task.attacks import SIDE_CHANNELS, AttackOptions, attackers, attacking, is_attacker
from task.config import parse_settings
from task.methods import METHODS
from task.options import ConfigConflict
from task.robust import ROBUST_RULES


def settings(method: str, **cfg):
    return parse_settings({"method": method, **NEEDS.get(method, {}), **cfg})


# ---------------------------------------------------------------------------------------------- who attacks
@given(st.floats(0.0, 1.0), st.integers(1, 300))
def test_any_first_n_clients_hold_the_rounded_share_of_attackers_spread_evenly(share, n):
    chosen = [p for p in range(n) if is_attacker(p, share)]
    assert len(chosen) == math.floor(n * share + 0.5 + 1e-9)
    # spread evenly: between two consecutive attackers there are about 1 / share clients, never a run of them
    if share <= 0.5:
        assert all(b - a >= 2 for a, b in itertools.pairwise(chosen))


def test_the_attackers_come_from_the_run_config_and_the_partition_id_alone():
    options = AttackOptions(attack="sign-flip", attack_share=0.3, attack_start=3)
    assert attackers(options, range(10)) == [1, 4, 8]
    assert attackers(options, [8, 4, 2]) == [4, 8]  # the same partitions whatever order or cohort the server saw
    assert attackers(AttackOptions(attack="none", attack_share=0.3), range(10)) == []
    assert not attacking(options, 4, 2) and attacking(options, 4, 3) and not attacking(options, 5, 9)


# ---------------------------------------------------------------------------------------------- aggregation rules
REFUSED = {("local", rule) for rule in ROBUST_RULES}  # no model leaves a Local client
# FedC2I forwards models and averages none: a rule that would replace each client's own influence-weighted mix
REFUSED |= {("fedc2i", rule) for rule in ("median", "trimmed-mean", "bulyan", "fltrust")}
# no common model the server sent to measure an update against
REFUSED |= {(m, rule) for m in ("fedcac", "fedsoft") for rule in ("norm-bound", "fltrust")}
# FLTrust's server trains a whole model on its root data set: not where only part of the model is averaged
REFUSED |= {(m, "fltrust") for m in ("fedper", "fedrep", "lgfedavg", "fedbn")}
# Client2Vec's index-weighted aggregation (on by default) has no rule at weight-cap 1 (uniform) that keeps its weights
REFUSED |= {("client2vec", rule) for rule in ROBUST_RULES}


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("rule", ROBUST_RULES)
def test_every_rule_works_for_every_method_that_averages_models_and_is_refused_with_its_reason_elsewhere(method, rule):
    if (method, rule) in REFUSED:
        with pytest.raises(ConfigConflict, match=rf"aggregator='{rule}' cannot be used with method '{method}': "):
            settings(method, aggregator=rule)
    else:
        assert settings(method, aggregator=rule).robust.aggregator == rule


def test_the_refusals_that_depend_on_a_methods_own_settings():
    for rule in ("norm-bound", "fltrust"):
        with pytest.raises(ConfigConflict, match="lia-mode='p2p'"):
            settings("pfedlia", aggregator=rule, **{"lia-mode": "p2p"})
    assert settings("pfedlia", aggregator="median", **{"lia-mode": "p2p"}).robust.aggregator == "median"
    assert settings("client2vec", aggregator="median", **{"c2v-aggregation": False}).robust.aggregator == "median"
    # Client2Vec keeps its index weights under a rule that weighs: uncapped, or capped above uniform
    for cap in (0.0, 2.0):
        assert settings("client2vec", aggregator="multi-krum", **{"weight-cap": cap}).robust.weight_cap == cap


def test_a_weight_cap_no_average_can_meet_is_refused():
    with pytest.raises(ConfigConflict, match=r"weight-cap=0.5 is impossible: an average of m models cannot give"):
        settings("fedavg", aggregator="multi-krum", **{"weight-cap": 0.5})


@pytest.mark.parametrize("rule", ROBUST_RULES)
def test_central_dp_allows_only_the_mean_its_noise_is_calibrated_to(rule):
    with pytest.raises(ConfigConflict, match=r"dp-mode='central'.*epsilon reported would not hold"):
        settings("fedavg", aggregator=rule, **{"dp-mode": "central"})
    # local DP: every rule is a post-processing of noised releases
    assert settings("pfedlia", aggregator=rule, **{"dp-mode": "local"}).robust.aggregator == rule


# ---------------------------------------------------------------------------------------------- attacks
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_side_channel_lie_is_accepted_exactly_for_the_methods_with_a_side_channel(method):
    if method in SIDE_CHANNELS:
        assert settings(method, attack="side-channel").attacks.attack == "side-channel"
    else:
        with pytest.raises(ConfigConflict, match=f"method '{method}' has none of here"):
            settings(method, attack="side-channel")


@pytest.mark.parametrize(
    "cfg,reason",
    [
        ({"method": "local", "attack": "sign-flip"}, "method 'local' sends none"),
        ({"method": "local", "attack": "free-rider"}, "method 'local' sends none"),
        ({"attack": "backdoor", "backdoor-target": 10}, "backdoor-target=10 is not a class of dataset 'digits'"),
        (
            {"attack": "label-flip", "dataset": "dialects", "partition": "iid"},
            "dataset 'dialects' is next-word prediction",
        ),
        ({"attack": "noise", "attack-start": 11}, "attack-start=11 is after the last round"),
        (
            {
                "method": "client2vec",
                "attack": "side-channel",
                "c2v-sampling": False,
                "c2v-aggregation": False,
                "c2v-local": False,
            },
            "no index is collected",
        ),
    ],
)
def test_an_attack_a_run_cannot_carry_is_refused_at_start_up(cfg, reason):
    with pytest.raises(ConfigConflict, match=reason):
        parse_settings(cfg)


def test_label_flip_and_backdoor_run_on_the_clients_own_data_whatever_the_method():
    for method in ("local", "fedavg", "fedc2i", "pifl"):
        for kind in ("label-flip", "backdoor"):
            assert settings(method, attack=kind).attacks.attack == kind


def test_bad_attack_and_rule_values_name_their_key():
    for cfg, key in (
        ({"attack": "poison"}, "attack"),
        ({"attack-share": 1.5}, "attack-share"),
        ({"aggregator": "krum"}, "aggregator"),
        ({"trim-fraction": 0.5}, "trim-fraction"),
        ({"byzantine-share": 0.5}, "byzantine-share"),
        ({"norm-bound": -1.0}, "norm-bound"),
    ):
        with pytest.raises(ValueError, match=f"run-config key '{key}'"):
            parse_settings(cfg)


# ---------------------------------------------------------------------------------------------- docs/robustness.md
DOC = Path(__file__).resolve().parents[2] / "docs" / "robustness.md"


def _table(heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after ``heading`` in docs/robustness.md, as cells."""
    lines = DOC.read_text().split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        block.append([cell.strip() for cell in line.strip("|").split("|")])
    return block[2:]  # after the header and its rule


def test_the_docs_table_of_refused_rules_is_the_codes():
    documented: set[tuple[str, str]] = set()
    for methods, _, refused in _table("## Where each method averages, and what it refuses"):
        for method in re.findall(r"`([a-z0-9-]+)`", methods):
            named = set(re.findall(r"`([a-z-]+)`", refused.split(":")[0])) & set(ROBUST_RULES)
            documented |= {(method, rule) for rule in (ROBUST_RULES if "every rule" in refused else named)}
    conditional = {("pfedlia", "norm-bound"), ("pfedlia", "fltrust")}  # with lia-mode='p2p', the row says
    assert {m for m, _ in documented} <= set(METHODS)
    assert documented - conditional == REFUSED
    assert sorted(METHODS) == sorted(
        {
            m
            for row in _table("## Where each method averages, and what it refuses")
            for m in re.findall(r"`([a-z0-9-]+)`", row[0])
        }
    )


def test_the_docs_examples_of_who_attacks_are_the_codes():
    for clients, *shares in _table("## Which clients attack"):
        for share, listed in zip((0.1, 0.3), shares, strict=True):
            chosen = attackers(AttackOptions(attack="noise", attack_share=share), range(int(clients)))
            assert chosen == ([] if listed == "none" else [int(p) for p in listed.split(", ")])
