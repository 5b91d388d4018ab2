"""Run-config options declared once: key, type, default, allowed range or values, one line of help.

An option set is a frozen dataclass whose fields are made with :func:`option`; :meth:`OptionSet.parse` reads
it from a run config (the ServerApp and every ClientApp call the same code), converts each value to the
field's type and checks it, and every error names the key, what it got and what is allowed.  A field made with
:func:`part` holds another option set read from the same run config (the run's ``Settings`` holds its data
settings, aggregation rule and attack so), and :func:`declared_in` binds a field to a key another set declares
(one key, one declaration, read into two places).  Cross-key rules that make a method's defining step impossible
(a warm-up as long as the run, ...) live in :meth:`OptionSet.conflicts`.  ``pyproject.toml``'s
``[tool.flwr.app.config]`` must list exactly the declared keys with the declared defaults and types
(tests/config/test_options.py).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

T = TypeVar("T", bound="OptionSet")


@dataclass(frozen=True)
class Option:
    """One run-config key: the value's type comes from the default (bool, int, float or str)."""

    key: str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    #: old spellings still accepted (with a deprecation warning): old value -> the choice it now is
    aliases: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def kind(self) -> type:
        return type(self.default)

    def allowed(self) -> str:
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        if self.kind is bool:
            return "true or false"
        what = "an integer" if self.kind is int else ("a number" if self.kind is float else "a string")
        if self.minimum is not None and self.maximum is not None:
            return f"{what} in [{self.minimum:g}, {self.maximum:g}]"
        if self.minimum is not None:
            return f"{what} >= {self.minimum:g}"
        if self.maximum is not None:
            return f"{what} <= {self.maximum:g}"
        return what

    def field(self) -> Any:
        """A dataclass field bound to this option (its default is the option's)."""
        return dataclasses.field(default=self.default, metadata={"option": self})

    def convert(self, value: Any, warn: bool = True) -> Any:
        """``value`` as this option's type, or ValueError naming the key, the value and what is allowed.  A
        deprecated spelling (:attr:`aliases`) becomes its new name, with a ``FutureWarning`` unless ``warn`` is
        false."""
        if isinstance(value, str) and value in self.aliases:
            if warn:
                warnings.warn(
                    f"run-config key {self.key!r}: {value!r} is deprecated, use {self.aliases[value]!r}",
                    FutureWarning,
                    stacklevel=2,
                )
            value = self.aliases[value]
        bad = ValueError(f"run-config key {self.key!r} must be {self.allowed()}, got {value!r} ({self.help})")
        kind = self.kind
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise bad
        if kind is str:
            if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
                raise bad
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value) or (kind is int and float(value) != int(value)):
            raise bad
        value = kind(value)
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            raise bad
        return value


def option(
    key: str,
    default: Any,
    description: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Any:
    """A dataclass field bound to run-config ``key``."""
    opt = Option(key, default, description, minimum, maximum, choices, dict(aliases or {}))
    if choices is not None and not set(opt.aliases.values()) <= set(choices):
        raise ValueError(f"aliases of {key!r} must name allowed values {list(choices)}, got {opt.aliases}")
    opt.convert(default)  # a declaration whose default breaks its own rule is a bug
    return opt.field()


def declared_in(cls: type[OptionSet], key: str) -> Any:
    """A dataclass field bound to the option ``key`` that ``cls`` declares: one declaration, read into a field of
    ``cls`` and into this one."""
    return cls.declared()[key].field()


def part(cls: type[T]) -> Any:
    """A dataclass field holding the option set ``cls``, parsed from the same run config as the set it is in (its
    keys are that set's keys too)."""
    return dataclasses.field(default_factory=cls, metadata={"part": cls})


class ConfigConflict(ValueError):
    """Settings that each are valid but together make a method's defining step impossible or meaningless."""


@dataclass(frozen=True)
class OptionSet:
    """Base of every option set: parse, declared keys, cross-key conflicts."""

    @classmethod
    def declared(cls) -> dict[str, Option]:
        """key -> Option, in declaration order, with the keys of each :func:`part` where the part is.  A key bound
        to two different declarations is a bug, refused here."""
        out: dict[str, Option] = {}
        for f in dataclasses.fields(cls):
            if "part" in f.metadata:
                found = f.metadata["part"].declared()
            elif "option" in f.metadata:
                found = {f.metadata["option"].key: f.metadata["option"]}
            else:
                continue
            for key, opt in found.items():
                if out.setdefault(key, opt) is not opt:
                    raise TypeError(f"{cls.__name__}: run-config key {key!r} is declared twice")
        return out

    @classmethod
    def parse(cls, cfg: Mapping[str, Any], fixed: Mapping[str, Any] | None = None) -> Self:
        """The set read from the run config ``cfg``, ``fixed`` values (a method's) in place of their keys'."""
        return cls.build(cls.read(cfg, fixed))

    @classmethod
    def read(cls, cfg: Mapping[str, Any], fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Field name -> value, for every field bound to a key (a part's value: a dict of its own), each converted
        and checked, and nothing built yet: a bad value is refused before any check across keys (a set's own, in
        its ``__post_init__``) could speak of it."""
        values: dict[str, Any] = {}
        fixed = dict(fixed or {})
        for f in dataclasses.fields(cls):
            if "part" in f.metadata:
                values[f.name] = f.metadata["part"].read(cfg, fixed)
                continue
            opt = f.metadata.get("option")
            if opt is None:
                continue
            if opt.key in fixed:
                value = opt.convert(fixed[opt.key])
                # Flower passes every key of pyproject.toml, so the declared default stands for "not set"
                given = opt.convert(cfg[opt.key]) if opt.key in cfg else opt.default
                if given not in (value, opt.default):
                    raise ConfigConflict(
                        f"run-config key {opt.key!r} is {cfg[opt.key]!r}, but this method fixes it to {value!r}"
                    )
            else:
                value = opt.convert(cfg.get(opt.key, opt.default))
            values[f.name] = value
        return values

    @classmethod
    def build(cls, values: Mapping[str, Any]) -> Self:
        """The set from :meth:`read`'s ``values`` (and any field not bound to a key given with them)."""
        parts = {f.name: f.metadata["part"] for f in dataclasses.fields(cls) if "part" in f.metadata}
        return cls(**{name: parts[name].build(v) if name in parts else v for name, v in values.items()})

    def conflicts(self, settings: Any) -> list[str]:
        """Why these options cannot work with the rest of the run's settings (none by default)."""
        return []
