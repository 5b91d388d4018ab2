"""``python -m server_app.disclosure [--write docs/privacy.md]``: the table of what every method declares it
sends and receives (:mod:`strategies.disclosure`, rendered by :func:`strategies.disclosure_check.table`), built with
each method's default settings; docs/privacy.md holds it, and a test checks that it is up to date."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from server_app.app import build_strategy
from strategies.disclosure_check import table
from strategies.replies import Disclosure
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


BEGIN, END = "<!-- disclosure-table:begin -->", "<!-- disclosure-table:end -->"


def write_into(path: Path) -> None:
    """Replace the table between the markers in ``path`` (docs/privacy.md) with the current declarations'."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{declared_table()}\n{END}{rest.split(END, 1)[1]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write_into(Path(sys.argv[2]))
    elif len(sys.argv) == 1:
        print(declared_table())
    else:
        raise SystemExit("usage: python -m server_app.disclosure [--write docs/privacy.md]")
