"""The README's differential-privacy examples, run exactly as written, one raw record each.

The README's "Privacy" section shows three complete ``flwr run`` commands with what each costs (epsilon) and gives
(personalized accuracy).  This script reads those commands from README.md (every ``flwr run`` command whose run
config sets ``dp-mode``), runs each through Flower (a private simulation SuperLink, ``flwr run --stream`` with the
command's own ``--federation-config`` nodes and one CPU per client, as the command asks) and writes its record to
``benchmarks/raw/dp-examples/<method>.json`` (``benchmarks/records.py``'s schema).  The numbers in the README come
from these records; ``tests/benchmarks/test_dp_examples.py`` checks that they do.

    python -m benchmarks.dp_examples              # every example (about 10 minutes on a quiet 2-core machine)
    python -m benchmarks.dp_examples --dry-run    # the commands it read, run nothing
    python -m benchmarks.dp_examples --lines      # the README's result lines, from the records
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks.records import RAW
from benchmarks.running import Bench, parser

GRID = "dp-examples"
README = Path(__file__).resolve().parents[1] / "README.md"


def pairs(text: str) -> dict[str, Any]:
    """A ``--run-config`` / ``--federation-config`` text as ``flwr run`` reads it (Flower's own parser)."""
    from flwr.common.config import parse_config_args

    return dict(parse_config_args([text]))


def examples(readme: Path = README) -> list[dict[str, Any]]:
    """Every ``flwr run`` command of the README whose run config sets ``dp-mode``: its text, run config and
    federation config."""
    lines = readme.read_text().splitlines()
    joined, buffer = [], ""
    for line in lines:
        buffer += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            joined.append(buffer)
            buffer = ""
    out = []
    for command in joined:
        if not command.startswith("flwr run") or "dp-mode=" not in command:
            continue
        words = shlex.split(command)
        run_config = pairs(words[words.index("--run-config") + 1]) if "--run-config" in words else {}
        federation = pairs(words[words.index("--federation-config") + 1]) if "--federation-config" in words else {}
        out.append(
            {"command": command, "run-config": run_config, "federation": federation, "stream": "--stream" in words}
        )
    return out


def result_line(record: dict[str, Any]) -> str:
    """What a README example cost and gave, from its record (the line README.md and docs/privacy.md show)."""
    cfg, s = record["run-config"], record["summary"]
    return (
        f"- `{cfg['method']}`, {cfg['dp-mode']} DP: ({s['epsilon']:.3g}, {s['delta']:g})-DP after {s['rounds']} "
        f"rounds, personalized accuracy {s['personal-acc']:.3f}"
    )


def records(raw_dir: Path = RAW) -> dict[str, dict[str, Any]]:
    """method -> its example's record."""
    folder = raw_dir / GRID
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--dry-run", action="store_true", help="print the commands read from README.md, run nothing")
    ap.add_argument("--lines", action="store_true", help="print the README's result lines from the records")
    args = ap.parse_args(argv)
    if args.lines:
        for rec in records(Path(args.raw_dir)).values():
            print(result_line(rec))
        return 0
    found = examples()
    for ex in found:
        print(ex["command"])
    if args.dry_run or not found:
        return 0 if found else 1
    with Bench(GRID, raw_dir=args.raw_dir, total=len(found)) as bench:
        for ex in found:
            cfg, nodes = ex["run-config"], int(ex["federation"]["num-supernodes"])
            bench.run({"method": cfg["method"]}, cfg, nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
