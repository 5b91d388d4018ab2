"""Which method runs with which DP mode is decided at start-up: a method without a guarantee refuses any
``dp-mode`` but ``off`` with its reason, and impossible DP settings are refused before round 1 (docs/privacy.md)."""

import re
from pathlib import Path

import pytest
from flwr.app import UserConfigValue

from strategies.privacy import ServerPrivacy
from task.config import parse_settings
from task.methods import METHODS
from task.options import ConfigConflict
from task.privacy import calibrate_local

CENTRAL = sorted(m for m, spec in METHODS.items() if "central" in spec.privacy.modes)
LOCAL = sorted(m for m, spec in METHODS.items() if "local" in spec.privacy.modes)
NO_GUARANTEE = sorted(m for m, spec in METHODS.items() if not spec.privacy.modes)


def test_the_fedavg_family_supports_central_dp_the_methods_that_show_single_models_local_dp():
    assert sorted(["fedavg", "fedprox", "moon", "ditto", "fedrod", "fedper", "fedrep", "lgfedavg", "fedbn"]) == CENTRAL
    assert LOCAL == ["fedc2i", "oracle", "pfedlia"]
    assert "client2vec" in NO_GUARANTEE and "local" in NO_GUARANTEE and "cfl" in NO_GUARANTEE


@pytest.mark.parametrize("method", sorted(set(METHODS) - set(CENTRAL)))
def test_a_method_without_central_dp_refuses_it_with_its_reason(method):
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": method, "dp-mode": "central", **_runnable(method)})
    reason = f"dp-mode='central' is not available for method {method!r}: {METHODS[method].privacy.why_not}"
    assert reason in str(err.value)


def test_pfedlia_refuses_central_dp_because_the_server_clusters_on_un_noised_influence_rows():
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": "pfedlia", "dp-mode": "central"})
    message = str(err.value)
    assert "dp-mode='central' is not available for method 'pfedlia'" in message
    assert "clusters on un-noised lazy-influence rows" in message and "only local DP (dp-mode='local'" in message


@pytest.mark.parametrize("method", NO_GUARANTEE)
def test_a_method_without_a_guarantee_refuses_dp_with_its_reason(method):
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": method, "dp-mode": "central", **_runnable(method)})
    message = str(err.value)
    assert f"dp-mode='central' is not available for method {method!r}" in message
    assert METHODS[method].privacy.why_not in message
    assert message.endswith(
        "(docs/privacy.md lists which method supports which mode; dp-mode='off' runs without differential privacy)"
    )


@pytest.mark.parametrize("method", CENTRAL)
def test_central_dp_starts_for_the_methods_that_declare_it(method):
    settings = parse_settings({"method": method, "dp-mode": "central"})
    assert settings.dp_mode == "central" and settings.dp_clip == 1.0 and settings.dp_delta == 1e-5


@pytest.mark.parametrize("method", sorted(set(METHODS) - set(LOCAL)))
def test_a_method_without_local_dp_refuses_it_with_its_reason(method):
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": method, "dp-mode": "local", **_runnable(method)})
    reason = f"dp-mode='local' is not available for method {method!r}: {METHODS[method].privacy.why_not}"
    assert reason in str(err.value)


def test_fedc2i_refuses_central_dp_because_it_forwards_single_clients_models():
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": "fedc2i", "dp-mode": "central"})
    assert "dp-mode='central' is not available for method 'fedc2i': the server never averages" in str(err.value)
    assert "only local DP (dp-mode='local'" in str(err.value)


@pytest.mark.parametrize("method", LOCAL)
def test_local_dp_starts_for_the_methods_that_declare_it(method):
    settings = parse_settings({"method": method, "dp-mode": "local", **_runnable(method)})
    assert settings.dp_mode == "local" and settings.dp_noise_multiplier == 1.0


def test_fedc2i_under_local_dp_refuses_the_ablation_that_weights_peers_by_their_sizes():
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": "fedc2i", "dp-mode": "local", "c2i-variant": "class-level-averaged-extractor"})
    message = str(err.value)
    assert "training-set sizes, which local DP does not forward to peers" in message
    assert message.endswith(": use another c2i-variant, one of ['full', 'client-level', 'class-level-own-extractor']")
    for variant in ("full", "client-level", "class-level-own-extractor"):
        assert repr(variant) in message
        assert parse_settings({"method": "fedc2i", "dp-mode": "local", "c2i-variant": variant}).dp_mode == "local"


@pytest.mark.parametrize(
    "extra,match",
    [
        ({"dp-clip": 0.0}, r"^dp-noise-multiplier=1.0 needs a clip bound dp-clip > 0 .*: noise on unbounded updates"),
        ({"dp-delta": 0.0}, "dp-delta must be strictly between 0 and 1"),
        ({"dp-delta": 1.0}, "dp-delta must be strictly between 0 and 1"),
    ],
)
def test_impossible_dp_settings_are_refused_at_start_up(extra, match):
    with pytest.raises(ConfigConflict, match=match):
        parse_settings({"method": "fedavg", "dp-mode": "central", **extra})


@pytest.mark.parametrize(
    "extra,match",
    [
        (
            {"dp-target-epsilon": 8.0, "dp-max-epsilon": 4.0},
            r"^dp-target-epsilon=8 exceeds dp-max-epsilon=4: the run would stop before its last round",
        ),
        ({"dp-target-epsilon": 4.0, "dp-clip": 0.0}, r"^dp-target-epsilon needs a clip bound dp-clip > 0"),
        (
            {"dp-target-epsilon": 0.5, "dp-clip": 0.0, "dp-noise-multiplier": 0.0},
            r"^dp-target-epsilon needs a clip bound dp-clip > 0",
        ),
        ({"dp-target-epsilon": 0.8, "dp-max-epsilon": 0.5}, r"^dp-target-epsilon=0.8 exceeds dp-max-epsilon=0.5"),
        (
            {"dp-adaptive-clip": True, "dp-clip": 0.0, "dp-noise-multiplier": 0.0},
            r"^dp-adaptive-clip starts from dp-clip and never exceeds it: dp-clip must be > 0$",
        ),
    ],
)
def test_a_budget_or_adaptive_clipping_that_cannot_work_is_refused_at_start_up(extra, match):
    with pytest.raises(ConfigConflict, match=match):
        parse_settings({"method": "fedavg", "dp-mode": "central", **extra})


def test_a_target_equal_to_the_maximum_is_allowed_and_a_target_below_one_is_calibrated_by_the_server():
    assert parse_settings({"dp-mode": "central", "dp-target-epsilon": 4.0, "dp-max-epsilon": 4.0}).dp_max_epsilon == 4.0
    s = parse_settings({"dp-mode": "central", "dp-target-epsilon": 0.5})
    assert ServerPrivacy(s).noise_multiplier is None  # calibrated at round 1, not dp-noise-multiplier


def test_budget_keys_without_dp_and_adaptive_clipping_under_local_dp_are_refused():
    with pytest.raises(ConfigConflict, match=r"^dp-max-epsilon: only with dp-mode='central' or 'local'"):
        parse_settings({"dp-max-epsilon": 0.5})  # a maximum below one is a maximum too
    with pytest.raises(
        ConfigConflict, match=r"^dp-target-epsilon, dp-max-epsilon, dp-adaptive-clip: only with dp-mode"
    ):
        parse_settings({"dp-target-epsilon": 4.0, "dp-max-epsilon": 5.0, "dp-adaptive-clip": True})
    with pytest.raises(ConfigConflict) as local:
        parse_settings({"method": "fedc2i", "dp-mode": "local", "dp-adaptive-clip": True})
    assert str(local.value) == (
        "dp-adaptive-clip adapts the server's clip bound, so it needs dp-mode='central' (under local DP each client "
        "clips to dp-clip before its model leaves)"
    )
    assert parse_settings({"method": "fedavg", "dp-mode": "central", "dp-adaptive-clip": True}).dp_adaptive_clip


@pytest.mark.parametrize("method,query_releases", [("fedc2i", 0), ("pfedlia", 1)])
def test_under_local_dp_a_target_epsilon_sets_the_noise_the_server_declares_to_every_client(method, query_releases):
    """Each client noises its own releases with what the round's messages declare: the server calibrates it before
    round 1, for the planned rounds plus the releases a method makes outside its train replies (pFedLIA's lazy
    model), and keeps it (a resumed run does not recalibrate); the run config's dp-noise-multiplier is not used."""
    from tests.strategy_harness import strategy

    cfg: dict[str, UserConfigValue] = {
        "dp-mode": "local",
        "dp-target-epsilon": 6.0,
        "num-server-rounds": 7,
        "dp-noise-multiplier": 9.0,
    }
    s = strategy(method, **cfg)
    assert s.privacy.noise_multiplier is None and s.round_config(1, "train").get("dp-noise-multiplier") is None
    s.privacy.before_round(s, 1, 4)
    sigma = calibrate_local(6.0, 1e-5, 7 + query_releases)
    assert s.privacy.noise_multiplier == sigma
    assert s.round_config(1, "train")["dp-noise-multiplier"] == sigma and s.round_config(1, "train")["dp-clip"] == 1.0


def test_no_noise_without_clipping_is_allowed_and_dp_off_ignores_the_dp_keys():
    assert parse_settings({"dp-mode": "central", "dp-clip": 0.0, "dp-noise-multiplier": 0.0}).dp_clip == 0.0
    assert parse_settings({"method": "fedcac", "dp-clip": 0.0}).dp_mode == "off"


def test_an_unknown_mode_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"dp-mode.*one of \['off', 'central', 'local'\]"):
        parse_settings({"dp-mode": "global"})


def test_docs_privacy_has_one_row_per_method_with_its_mode():
    """docs/privacy.md's table: a row for every value of ``method``, whose last column names the modes the
    registry declares (or says none)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "privacy.md").read_text()
    for method, spec in METHODS.items():
        row = next((line for line in text.splitlines() if re.match(rf"^\| `{re.escape(method)}`[ |,]", line)), None)
        row = row or next(line for line in text.splitlines() if re.match(rf"^\| `[a-z-]+`, `{method}` \|", line))
        last = row.rstrip(" |").rsplit("|", 1)[1]
        for mode in ("central", "local"):
            if mode in spec.privacy.modes:
                assert f"**{mode}**" in last, (method, last)
        if not spec.privacy.modes:
            assert last.strip().startswith("none"), (method, last)


def _runnable(method):
    """Settings a method needs to start at all (so that the DP refusal is what stops it)."""
    return {"partition": "planted-clusters"} if method == "oracle" else {}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_exactly_the_methods_with_local_dp_name_the_model_a_release_is_noised_around(method):
    """Local DP noises a reply's change from the method's release reference: a method that declares ``local``
    overrides the hook, and any other method's client refuses to name one, saying which method asked."""
    from flwr.app import ConfigRecord, RecordDict

    from client_app.base import ClientMethod
    from tests.client_kit import client

    # the default model (the kit's mlp has no normalisation layer, which FedBN refuses); the Oracle's planted
    # groups must fit the kit's few partitions
    cfg = {"model": "cnn", **_runnable(method), **({"num-clusters": 2} if method == "oracle" else {})}
    c = client(method, None, None, **cfg)
    overridden = type(c).release_reference is not ClientMethod.release_reference
    assert overridden == (method in LOCAL)
    if not overridden:
        with pytest.raises(NotImplementedError, match=rf"^method {method!r} names no reference for local differential"):
            c.release_reference(RecordDict({"config": ConfigRecord({"server-round": 1})}))
