"""Rebuild ``benchmarks/RESULTS.md`` (and the figures beside it) from the committed raw records.

    python benchmarks/report.py            # rewrite benchmarks/RESULTS.md
    python benchmarks/report.py --check    # exit 1 if RESULTS.md differs from what the records give

The tables are rendered by the package ``benchmarks/reporting/``: the table of ``benchmarks/X.py`` by
``benchmarks/reporting/X.py``; how to add one is in ``reporting/__init__.py``.  Benchmark scripts
``import report`` (this folder is on their ``sys.path``) to print their own section after their runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import RAW
from reporting import build, render_grid

RESULTS = HERE / "RESULTS.md"
__all__ = ["RESULTS", "build", "main", "render_grid"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw-dir", default=str(RAW))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--check", action="store_true", help="exit 1 if the file differs from what the records give")
    args = ap.parse_args()
    text = build(Path(args.raw_dir))
    out = Path(args.out)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from the raw records; run python benchmarks/report.py'}")
        sys.exit(0 if same else 1)
    out.write_text(text)
    print(f"wrote {out} from {args.raw_dir}")


if __name__ == "__main__":
    main()
