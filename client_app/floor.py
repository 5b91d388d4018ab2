"""A data holder's own privacy floor: the least differential privacy its node takes part with.

A SuperNode sets it in its node config (``--node-config``), whatever run an operator submits:

- ``dp-min-noise-multiplier`` (a number >= 0): the smallest ``dp-noise-multiplier`` it accepts;
- ``dp-max-clip`` (a number > 0): the largest ``dp-clip`` it accepts (``dp-clip=0``, no clipping, is larger than
  any bound);
- ``dp-require`` (true / false): take part only in runs that give a guarantee at all: a ``dp-mode`` other than
  ``off``, noise (``dp-noise-multiplier`` > 0) and a clip bound (``dp-clip`` > 0).

A floor is a floor on differential privacy, so a node that sets any of them refuses a run without it
(``dp-mode='off'``: no noise, no clipping).  The ClientApp checks the run against its node's floor once, when it
first sees the run (:func:`admit`, before it loads any data), and refuses every message of a run that asks for
less by raising :class:`RunRefused`: Flower carries the message back to the server as an error reply, which the
server records in ``failures.json`` with the node config key and the value the run asked for.  The values the
client actually releases with are checked again where it releases (:meth:`Floor.check_release`).

What the node can check depends on the mode (docs/privacy.md, "A data holder's floor"): under ``local`` DP the
client clips and noises its own release, so the floor holds for every model it releases; under ``central`` DP the
client clips its own update but the server adds the noise, so the node can only hold the run to the noise it
declares.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from task.config import Settings, parse_settings
from task.privacy import clip_bound

MIN_NOISE, MAX_CLIP, REQUIRE = "dp-min-noise-multiplier", "dp-max-clip", "dp-require"
#: the node-config keys of the floor; any other ``dp-`` key is refused (a misspelt floor must not pass as none)
KEYS = (MIN_NOISE, MAX_CLIP, REQUIRE)


class NodeConfigError(ValueError):
    """A floor key of the node config with a value that cannot be used (the message says which and what is allowed)."""


class RunRefused(RuntimeError):
    """The run asks for less privacy than this node's floor (the message names the node config key and the
    run-config value)."""


def _number(key: str, value: Any, what: str) -> float:
    if isinstance(value, bool):
        number = math.nan
    elif isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = math.nan
    else:
        number = math.nan
    if not math.isfinite(number):
        raise NodeConfigError(
            f'node config {key}={value!r} must be {what}, e.g. --node-config "{key}=1.0" (leave it out: no bound)'
        )
    return number


def _shown(x: float) -> str:
    """``x`` short where that is exact (``1``, ``0.5``), else every digit (a value just below a bound must not
    print as the bound)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise NodeConfigError(f'node config {key}={value!r} must be true or false, e.g. --node-config "{key}=true"')


@dataclass(frozen=True)
class Floor:
    """The least noise multiplier, the largest clip bound and whether DP is required (no key set: no floor)."""

    min_noise_multiplier: float = 0.0
    max_clip: float = math.inf
    require: bool = False

    @property
    def is_set(self) -> bool:
        return self.require or self.min_noise_multiplier > 0 or math.isfinite(self.max_clip)

    def refusals(self, mode: str, noise_multiplier: float | None, clip: float) -> list[str]:
        """Why a run of DP ``mode`` with ``noise_multiplier`` (None: not known yet, the server calibrates it) and
        clip bound ``clip`` (``math.inf``: none) falls below this floor (empty: it does not).  Each reason names the
        node config key and the value asked for."""
        if not self.is_set:
            return []
        if mode == "off":
            asked = "the run asks for no differential privacy (dp-mode='off')"
            return [f"node config {setting} needs differential privacy, and {asked}" for setting in self.set_keys()]
        declared = "declares" if mode == "central" else "asks for"
        where = (
            " (dp-mode='central': the server adds that noise, which this node cannot see)"
            if mode == "central"
            else " (dp-mode='local')"
        )
        reasons = []
        if noise_multiplier is not None and noise_multiplier < self.min_noise_multiplier:
            reasons.append(
                f"node config {MIN_NOISE}={_shown(self.min_noise_multiplier)} is the least noise this node accepts, "
                f"and the run {declared} dp-noise-multiplier={_shown(noise_multiplier)}{where}"
            )
        if clip > self.max_clip:
            asked = "dp-clip=0 (no clipping)" if math.isinf(clip) else f"dp-clip={_shown(clip)}"
            reasons.append(
                f"node config {MAX_CLIP}={_shown(self.max_clip)} is the largest clip bound this node accepts, and "
                f"the run asks for {asked}"
            )
        if self.require and (noise_multiplier == 0 or math.isinf(clip)):
            asked = "dp-noise-multiplier=0 (no noise)" if noise_multiplier == 0 else "dp-clip=0 (no clipping)"
            reasons.append(f"node config {REQUIRE}=true needs a guarantee, and the run asks for {asked}{where}")
        return reasons

    def set_keys(self) -> list[str]:
        """The floor's keys that are set, as ``key=value``."""
        out = [f"{REQUIRE}=true"] if self.require else []
        if self.min_noise_multiplier > 0:
            out.append(f"{MIN_NOISE}={_shown(self.min_noise_multiplier)}")
        if math.isfinite(self.max_clip):
            out.append(f"{MAX_CLIP}={_shown(self.max_clip)}")
        return out

    def check_release(self, mode: str, noise_multiplier: float, clip: float) -> None:
        """Raise :class:`RunRefused` if a reply is about to leave with less than this floor (the values the
        client's privacy step uses, whatever the run config said)."""
        reasons = self.refusals(mode, noise_multiplier, clip)
        if reasons:
            raise RunRefused("this node refuses to send the reply: " + "; ".join(reasons))


def node_floor(node_config: Mapping[str, Any]) -> Floor:
    """The floor a node config sets (:class:`NodeConfigError` for a bad value or an unknown ``dp-`` key)."""
    unknown = sorted(k for k in node_config if str(k).startswith("dp-") and k not in KEYS)
    if unknown:
        raise NodeConfigError(
            f"node config {unknown} {'is not a key' if len(unknown) == 1 else 'are not keys'} pflower knows; a data "
            f"holder's privacy floor is set with {', '.join(KEYS)}"
        )
    floor = Floor(
        min_noise_multiplier=_number(MIN_NOISE, node_config.get(MIN_NOISE, 0.0), "a number >= 0"),
        max_clip=_number(MAX_CLIP, node_config[MAX_CLIP], "a number > 0") if MAX_CLIP in node_config else math.inf,
        require=_flag(REQUIRE, node_config.get(REQUIRE, False)),
    )
    if floor.min_noise_multiplier < 0:
        raise NodeConfigError(f"node config {MIN_NOISE}={node_config[MIN_NOISE]!r} must be a number >= 0")
    if floor.max_clip <= 0:
        raise NodeConfigError(f"node config {MAX_CLIP}={node_config[MAX_CLIP]!r} must be a number > 0")
    return floor


def run_refusals(settings: Settings, floor: Floor) -> list[str]:
    """Why the run of ``settings`` falls below ``floor`` (empty: the node takes part).  With ``dp-target-epsilon``
    the server calibrates the noise multiplier itself (``dp-noise-multiplier`` is not used), so only what the run
    config fixes is checked here; every round's declared noise is checked as its messages arrive
    (:func:`check_declared`)."""
    noise = None if settings.dp_target_epsilon > 0 else settings.dp_noise_multiplier
    return floor.refusals(settings.dp_mode, noise, clip_bound(settings.dp_clip))


@functools.lru_cache(maxsize=16)
def _verdict(run_items: tuple, floor_items: tuple) -> str | None:
    reasons = run_refusals(parse_settings(dict(run_items)), node_floor(dict(floor_items)))
    return "this node refuses the run: " + "; ".join(reasons) if reasons else None


@functools.lru_cache(maxsize=64)
def _declared_verdict(run_items: tuple, floor_items: tuple, noise_multiplier: float, clip: float) -> str | None:
    floor = node_floor(dict(floor_items))
    if not floor.is_set:
        return None
    settings = parse_settings(dict(run_items))
    reasons = floor.refusals(settings.dp_mode, noise_multiplier, max(clip, clip_bound(settings.dp_clip)))
    return "; ".join(reasons) if reasons else None


def check_declared(run_config: Mapping[str, Any], node_config: Mapping[str, Any], message_config: Any) -> None:
    """Raise :class:`RunRefused` when a message declares a round's noise multiplier or clip bound
    (``dp-noise-multiplier``, ``dp-clip`` in its config: what the server will apply under central DP, what this
    client must under local DP) below the node's floor; the run config's own values may not be those (a target
    epsilon, a resumed run's kept multiplier).  A message that declares nothing passes (it releases nothing)."""
    if message_config is None or "dp-noise-multiplier" not in message_config:
        return
    floor_items = tuple(sorted((k, v) for k, v in node_config.items() if str(k).startswith("dp-")))
    noise, clip = float(message_config["dp-noise-multiplier"]), float(message_config.get("dp-clip", 0.0))
    verdict = _declared_verdict(tuple(sorted(run_config.items())), floor_items, noise, clip)
    if verdict is not None:
        server_round = message_config.get("server-round", "?")
        raise RunRefused(f"this node refuses round {server_round}: {verdict}")


def admit(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> None:
    """Raise :class:`RunRefused` (or :class:`NodeConfigError`) unless the node's floor admits the run; decided once
    per run and node floor (cached), so every later message of the run is refused the same way."""
    floor_items = tuple(sorted((k, v) for k, v in node_config.items() if str(k).startswith("dp-")))
    verdict = _verdict(tuple(sorted(run_config.items())), floor_items)
    if verdict is not None:
        raise RunRefused(verdict)
