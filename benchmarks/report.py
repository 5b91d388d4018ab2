"""Rebuild ``benchmarks/RESULTS.md`` (and the figures beside it) from the committed raw records.

    python -m benchmarks.report            # rewrite benchmarks/RESULTS.md and its figures (benchmarks/*.png)
    python -m benchmarks.report --check    # exit 1 if RESULTS.md or a figure differs from what the records give

It also rewrites the generated blocks of ``docs/choosing-a-method.md`` (``reporting/choosing.py``) and of
``docs/robustness.md`` (``reporting/robustness.py``); ``--check`` checks them too.

The tables are rendered by the package ``benchmarks/reporting/``: the table of ``benchmarks/X.py`` by
``benchmarks/reporting/X.py``; how to add one is in ``reporting/__init__.py``.  Benchmark scripts print their own
section after their runs with ``benchmarks.reporting.print_section``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.records import BENCHMARKS, RAW
from benchmarks.reporting import build, build_figures, stale_figures
from benchmarks.reporting.choosing import PAGE, build_page
from benchmarks.reporting.figures import draw
from benchmarks.reporting.robustness import PAGE as ROBUSTNESS_PAGE
from benchmarks.reporting.robustness import build_page as build_robustness_page

RESULTS = BENCHMARKS / "RESULTS.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw-dir", default=str(RAW))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--page", default=str(PAGE), help="the page whose generated block to rewrite or check")
    ap.add_argument(
        "--robustness-page",
        default=str(ROBUSTNESS_PAGE),
        help="the robustness page (docs/robustness.md) whose generated block to rewrite or check",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 if a file differs from what the records give")
    args = ap.parse_args()
    raw = Path(args.raw_dir)
    text = build(raw)
    out, page = Path(args.out), Path(args.page)
    page_text = build_page(raw, page)
    robustness_page = Path(args.robustness_page)
    robustness_text = build_robustness_page(raw, robustness_page)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from the raw records; run python -m benchmarks.report'}")
        stale = stale_figures(raw, out.parent)
        for name in stale:
            print(f"{out.parent / name}: missing or drawn from other data; run python -m benchmarks.report")
        pages_same = True
        for path, expected in ((page, page_text), (robustness_page, robustness_text)):
            page_same = path.read_text() == expected
            pages_same = pages_same and page_same
            print(
                f"{path}: "
                f"{'up to date' if page_same else 'differs from the raw records; run python -m benchmarks.report'}"
            )
        sys.exit(0 if same and not stale and pages_same else 1)
    out.write_text(text)
    page.write_text(page_text)
    robustness_page.write_text(robustness_text)
    drawn = [draw(fig, out.parent) for fig in build_figures(raw)]
    print(f"wrote {out}, {page}, {robustness_page}{''.join(f', {p.name}' for p in drawn)} from {args.raw_dir}")


if __name__ == "__main__":
    main()
