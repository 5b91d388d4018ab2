"""The parse built from the declarations (task/config.py) against the one it replaces (tests/config/_old_parse.py,
task/config.py before each key was declared once), on random run configs: the same settings for every config
both accept, and the same refusal for every config both refuse.  Kept for the commit that switches; the next
one deletes the old parse and this test with it."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from task.config import Settings, parse_settings, run_config_keys
from task.methods import METHODS
from task.models import MODELS
from task.options import Option
from tests.config import _old_parse

#: free-text keys: a few values each (the default first); anything else is no more than a name to them
TEXT = {
    "model": ["auto", *MODELS, "gpt2:/nonexistent"],
    "device": ["auto", "cpu", "cuda:1"],
    "results-dir": ["results", "elsewhere"],
    "data-dir": ["", "/nonexistent/data"],
    "lm-pretrained": ["", "/nonexistent/gpt2"],
    "fault": ["", "nan@1", "crash@2,shape@3"],
    "resume-from": ["", "results/run-1"],
    "mlflow-tracking-uri": ["", "sqlite:///x.db"],
}


def good_value(opt: Option) -> st.SearchStrategy[Any]:
    if opt.choices is not None:
        return st.sampled_from([*opt.choices, *opt.aliases])
    if opt.kind is bool:
        return st.sampled_from([True, False, "true", "false", "True", "FALSE"])
    if opt.kind is str:
        return st.sampled_from(TEXT.get(opt.key, [opt.default, "something"]))
    low = opt.minimum if opt.minimum is not None else -5
    high = opt.maximum if opt.maximum is not None else low + 40
    if opt.kind is int:
        ints = st.integers(int(low), int(high))
        return st.one_of(ints, ints.map(float), st.just(opt.default))
    floats = st.floats(low, high, allow_nan=False, allow_infinity=False)
    return st.one_of(floats, st.integers(int(low) + (low % 1 > 0), int(high)), st.just(opt.default))


def bad_value(opt: Option) -> st.SearchStrategy[Any]:
    if opt.choices is not None:
        return st.sampled_from(["no-such-choice", 1, True])
    if opt.kind is bool:
        return st.sampled_from([1, "yes", 0.0])
    if opt.kind is str:
        return st.sampled_from([1, 2.5, False])
    wrong = ["text", True, float("nan"), float("inf")]
    if opt.minimum is not None:
        wrong.append(opt.minimum - 1)
    if opt.maximum is not None:
        wrong.append(opt.maximum + 1)
    if opt.kind is int:
        wrong.append(1.5)
    return st.sampled_from(wrong)


def declared() -> dict[str, Option]:
    out = dict(_old_parse.RunOptions.declared())
    for spec in METHODS.values():
        out.update(spec.options.declared())
    return out


@st.composite
def run_configs(draw: st.DrawFn, bad: bool = False) -> dict[str, Any]:
    keys = declared()
    method = draw(st.sampled_from(sorted(METHODS)))
    own = set(METHODS[method].options.declared())
    cfg: dict[str, Any] = {"method": method}
    for key, opt in keys.items():
        if key != "method" and draw(st.integers(0, 9)) < (5 if key in own else 2):
            cfg[key] = draw(good_value(opt))
    if bad:
        key = draw(st.sampled_from(sorted(keys)))
        cfg[key] = draw(bad_value(keys[key]))
    return cfg


def outcome(parse, cfg: dict[str, Any]) -> tuple[Any, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = parse(cfg)
        except Exception as err:  # noqa: BLE001 - the refusal itself is what is compared
            return ("refused", type(err).__name__, str(err))
    assert type(got) is Settings
    return (
        "parsed",
        got,
        hash(got),
        dataclasses.asdict(got),
        type(got.options),
        dataclasses.asdict(got.options),
        got.raw,
    )


def test_the_same_keys():
    assert run_config_keys() == _old_parse.run_config_keys()
    assert Settings.declared() == _old_parse.RunOptions.declared()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_configs())
def test_the_same_settings_for_every_config_of_valid_values(cfg):
    old, new = outcome(_old_parse.parse_settings, cfg), outcome(parse_settings, cfg)
    event(old[0])
    assert new == old


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_configs(bad=True))
def test_the_same_refusal_for_a_config_with_one_bad_value(cfg):
    old, new = outcome(_old_parse.parse_settings, cfg), outcome(parse_settings, cfg)
    event(old[0])
    assert new == old
