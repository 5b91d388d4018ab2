"""Options are declared once (task/options.py; task/config.py's Settings and the parts it holds; task/methods):
pyproject.toml's run config holds exactly the declared keys with the declared defaults and types (flwr rejects
--run-config keys pyproject.toml does not declare, and passes a run every key it does), a key several option sets
read is one declaration, each key's value reaches the settings field bound to it, and bad values name their key."""

import dataclasses
import json
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from task.config import Settings, parse_settings, run_config_keys
from task.methods import METHODS, OPTION_SETS
from task.models import MODELS
from task.options import ConfigConflict, Option, OptionSet, option

ROOT = Path(__file__).resolve().parents[2]


def declared() -> dict[str, list[Option]]:
    out: dict[str, list[Option]] = {}
    classes: tuple[type[OptionSet], ...] = (Settings, *OPTION_SETS)
    for cls in classes:
        for key, opt in cls.declared().items():
            out.setdefault(key, []).append(opt)
    return out


def toml_line(opt: Option) -> str:
    value = opt.default
    shown = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
    return f"{opt.key} = {shown}"


def test_pyproject_holds_exactly_the_declared_keys_defaults_and_types():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    keys = {key: opts[0] for key, opts in declared().items()}
    missing = [toml_line(keys[k]) for k in keys if k not in config]
    assert not missing, "pyproject.toml's [tool.flwr.app.config] lacks declared keys; add:\n" + "\n".join(missing)
    assert set(config) <= set(keys), f"pyproject.toml holds keys nothing declares: {sorted(set(config) - set(keys))}"
    wrong = [
        f"{toml_line(opt)}  (pyproject.toml has {key} = {config[key]!r})"
        for key, opt in keys.items()
        if type(config[key]) is not opt.kind or config[key] != opt.default
    ]
    assert not wrong, "pyproject.toml's defaults differ from the declared ones; declared:\n" + "\n".join(wrong)
    # the parser knows exactly these keys (it refuses any other, as Flower does) and takes the defaults Flower passes
    assert run_config_keys() == set(keys)
    parse_settings(config)


def test_every_key_is_declared_once_with_its_help():
    """A key that several option sets read (Settings and its data settings: ``seed``; methods that share keys by
    inheriting a class) is one declaration, not copies that could drift apart."""
    for key, opts in declared().items():
        assert all(o is opts[0] for o in opts), f"{key!r} is declared more than once"
        assert opts[0].help, key

    @dataclasses.dataclass(frozen=True)
    class Twice(OptionSet):
        count: int = option("count", 3, "how many")
        again: int = option("count", 3, "how many")

    with pytest.raises(TypeError, match="'count' is declared twice"):
        Twice.declared()


def bound_fields(obj: Any) -> list[tuple[Any, str, Option]]:
    """(object, field name, option) of every field of ``obj`` and of its parts that is bound to a key."""
    out = []
    for f in dataclasses.fields(obj):
        if "part" in f.metadata:
            out += bound_fields(getattr(obj, f.name))
        elif "option" in f.metadata:
            out.append((obj, f.name, f.metadata["option"]))
    return out


#: free-text keys, a few values each: the parser takes any string for them but the model's name
TEXT = {"model": ["auto", *MODELS], "lm-pretrained": [""], "data-dir": [""]}


def good_value(opt: Option) -> st.SearchStrategy[Any]:
    if opt.choices is not None:
        return st.sampled_from(opt.choices)
    if opt.kind is bool:
        return st.booleans()
    if opt.kind is str:
        return st.sampled_from(TEXT.get(opt.key, [opt.default, "something"]))
    low = opt.minimum if opt.minimum is not None else -5
    high = opt.maximum if opt.maximum is not None else low + 40
    if opt.kind is int:
        return st.integers(int(low), int(high))
    return st.floats(low, high, allow_nan=False)


@st.composite
def run_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A method and values within their declared ranges for a random third of every run's keys and its own."""
    method = draw(st.sampled_from(sorted(METHODS)))
    keys = {**Settings.declared(), **METHODS[method].options.declared()}
    chosen = draw(st.lists(st.sampled_from(sorted(set(keys) - {"method"})), max_size=len(keys) // 3, unique=True))
    return {"method": method, **{key: draw(good_value(keys[key])) for key in chosen}}


@settings(max_examples=150, deadline=None)
@given(run_configs())
def test_each_value_reaches_the_field_bound_to_its_key(cfg):
    """Whatever the settings a run config parses to, every field bound to a key holds that key's value (or its
    default), in Settings, in each part (the data, the aggregation rule, the attack) and in the method's options;
    ``seed`` reaches both the run's and the data's.  ``model`` names the network 'auto' and the data resolve to."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = parse_settings(cfg)
        except ValueError:  # values that each are valid but not together: refused, nothing to hold
            return
    fields = bound_fields(got) + bound_fields(got.options)
    assert {opt.key for _, _, opt in fields} == set(cfg) | set(Settings.declared()) | set(type(got.options).declared())
    assert sum(opt.key == "seed" for _, _, opt in fields) == 2
    fixed = METHODS[got.method].fixed
    for obj, name, opt in fields:
        held = getattr(obj, name)
        want = fixed.get(opt.key, opt.convert(cfg.get(opt.key, opt.default)))
        if opt.key == "model" and want == "auto":
            assert held in MODELS or held.startswith("gpt2:"), held
        else:
            assert held == want and type(held) is type(want), (opt.key, held, want)


#: the data a method needs beyond the default (digits, Dirichlet): it is refused at start-up without it
NEEDS = {"oracle": {"partition": "planted-clusters"}}


def test_every_method_parses_its_defaults_and_server_and_client_read_the_same_options():
    for method, spec in METHODS.items():
        settings = parse_settings({"method": method, "num-server-rounds": 10, "min-nodes": 4, **NEEDS.get(method, {})})
        assert isinstance(settings.options, spec.options)
        for key, value in spec.fixed.items():
            opt = spec.options.declared()[key]
            name = next(f.name for f in dataclasses.fields(spec.options) if f.metadata.get("option") is opt)
            assert getattr(settings.options, name) == value


def test_a_method_on_data_it_cannot_use_is_refused_at_start_up_naming_the_data_it_needs():
    """What a new user types first (``method='X'`` and nothing else) either parses or says which data to set."""
    for method in METHODS:
        if method not in NEEDS:
            parse_settings({"method": method})
            continue
        with pytest.raises(ConfigConflict) as err:
            parse_settings({"method": method})
        for key, value in NEEDS[method].items():
            assert f"{key}={value!r}" in str(err.value), (method, str(err.value))


@dataclasses.dataclass(frozen=True)
class Example(OptionSet):
    count: int = option("count", 3, "how many", minimum=1, maximum=9)
    share: float = option("share", 0.5, "a share", minimum=0.0, maximum=1.0)
    flag: bool = option("flag", True, "a switch")
    mode: str = option("mode", "a", "the mode", choices=("a", "b", "c"))


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"count": 0}, r"'count' must be an integer in \[1, 9\], got 0 \(how many\)"),
        ({"count": 2.5}, r"'count' must be an integer"),
        ({"count": True}, r"'count' must be an integer"),
        ({"count": "3"}, r"'count' must be an integer"),
        ({"share": float("nan")}, r"'share' must be a number in"),
        ({"share": 1.5}, r"'share' must be a number in \[0, 1\]"),
        ({"flag": 1}, r"'flag' must be true or false"),
        ({"flag": "yes"}, r"'flag' must be true or false"),
        ({"mode": "d"}, r"'mode' must be one of \['a', 'b', 'c'\]"),
    ],
)
def test_a_bad_value_names_its_key_what_it_got_and_what_is_allowed(cfg, message):
    with pytest.raises(ValueError, match=message):
        Example.parse(cfg)


def test_values_convert_and_fixed_values_win():
    got = Example.parse({"count": 4.0, "share": 1, "flag": "False"})
    assert (got.count, got.share, got.flag, got.mode) == (4, 1.0, False, "a")
    assert type(got.count) is int and type(got.share) is float
    assert Example.parse({}, fixed={"mode": "b"}).mode == "b"
    # Flower's run config holds every key with its default: the default means "not set", and the fixed value wins
    assert Example.parse({"mode": "a"}, fixed={"mode": "b"}).mode == "b"
    with pytest.raises(ConfigConflict, match="'mode' is 'c', but this method fixes it to 'b'"):
        Example.parse({"mode": "c"}, fixed={"mode": "b"})
    with pytest.raises(ValueError, match="run-config key 'bad' must be an integer >= 1, got 0"):
        option("bad", 0, "a default outside its own range", minimum=1)


def test_the_client_answers_identify_and_every_query_phase_of_every_method():
    from task.methods import all_queries

    queries = all_queries()
    assert "identify" in queries
    for method, spec in METHODS.items():
        assert set(spec.queries) <= queries, method
    assert {"lazy", "lia", "bid", "c2v_index"} <= queries  # pFedLIA, PI-FL and Client2Vec phases


def test_an_unknown_method_is_refused_naming_the_key_the_value_and_every_method():
    """The run-config key ``method`` selects the method (DESIGN); a typo must say what is allowed."""
    from task.methods import method_spec

    assert method_spec("client2vec") is METHODS["client2vec"]
    with pytest.raises(ValueError, match="unknown method 'fedavgg'") as err:
        method_spec("fedavgg")
    message = str(err.value)
    assert "'fedavgg'" in message and "'method'" in message
    assert all(repr(m) in message for m in METHODS)


def test_python_m_task_config_lists_every_key_flower_accepts_as_the_readme_says():
    """Flower refuses a key pyproject.toml does not declare with a bare "Invalid run configuration"; the README
    says so next to the run command and points to ``python -m task.config``, which lists every valid key."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "task.config"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    listed = {line.split("`")[1] for line in out.splitlines() if line.startswith("| `")}
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert listed == set(config)
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Running a method") : readme.index("| key | default |")]
    assert "flwr run" in section and "Invalid run configuration" in section and "python -m task.config" in section


def test_the_readme_shows_the_refusals_word_for_word():
    """The README's "Options" paragraph names two run configs and shows the last line of Flower's report of each
    (the exception the ServerApp raises, as Python prints it): they are what the parser says, word for word."""
    import re

    from flwr.common.config import parse_config_args

    readme = (ROOT / "README.md").read_text()
    found = re.search(r"\n([^\n]*\n[^\n]*\n[^\n]*From `flwr run \..*?)\n```\n(.*?)\n```", readme, re.DOTALL)
    assert found is not None, "the README's Options paragraph and its block of refusals"
    paragraph, shown = found.groups()
    configs = re.findall(r'--run-config "([^"]+)"', paragraph)
    lines = shown.splitlines()
    assert len(configs) == len(lines) == 2, (configs, lines)
    defaults = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    for config, line in zip(configs, lines, strict=True):
        name, _, message = line.partition(": ")
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$") as err:
            parse_settings({**defaults, **parse_config_args([config])})
        kind = type(err.value)
        assert name == (
            kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        )
