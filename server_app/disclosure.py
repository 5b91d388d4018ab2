"""``python -m server_app.disclosure``: the table of what every method declares it sends and receives
(:mod:`strategies.disclosure`), built with each method's default settings; docs/privacy.md holds it, and a test
checks that it is up to date."""

from __future__ import annotations

from typing import Any

from server_app.app import build_strategy
from strategies.disclosure import Disclosure, table
from task.config import parse_settings
from task.methods import METHODS
from task.models import ModelInfo

#: run-config values a method needs beyond the defaults to start at all (the Oracle reads planted groups)
NEEDS: dict[str, dict[str, Any]] = {"oracle": {"partition": "planted-clusters"}}


def declarations(method: str, **config: Any) -> tuple[dict[str, Disclosure], ModelInfo]:
    """(what ``method`` declares, the model it declares it for) under the defaults and ``config``."""
    strategy = build_strategy(parse_settings({"method": method, **NEEDS.get(method, {}), **config}))
    return strategy.disclosure(), strategy.model_info


def declared_table() -> str:
    built = {m: declarations(m) for m in METHODS}
    return table({m: d for m, (d, _) in built.items()}, {m: info for m, (_, info) in built.items()})


if __name__ == "__main__":
    print(declared_table())
