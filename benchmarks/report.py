"""Rebuild ``benchmarks/RESULTS.md`` (and the figures beside it) from the committed raw records.

    python -m benchmarks.report            # rewrite benchmarks/RESULTS.md and its figures (benchmarks/*.png)
    python -m benchmarks.report --check    # exit 1 if RESULTS.md, a figure or the page differs from what the records
                                           # give, or if a record's method code changed since the record's commit
    python -m benchmarks.report --check --allow-stale   # the same, stale records listed but not failing

The records must match the code (``reporting/freshness.py``): ``--check`` lists every record whose method's files or
the shared training code differ between the code it ran and the working tree, and fails on them unless
``--allow-stale``.  A record keeps the digests of the files it ran, so the check reads records and files only: no
run, no network, no repository history (CI runs it in a fresh clone, ``.ci/run``).  Records made before records kept
them are compared with ``git diff`` against their commit, which a shallow clone lacks (it gets a clear message).

It also rewrites the generated blocks of ``docs/choosing-a-method.md`` (``reporting/choosing.py``), of
``docs/robustness.md`` (``reporting/robustness.py``) and of ``docs/privacy.md`` (``reporting/privacy_audit.py``);
``--check`` checks them too.

The tables are rendered by the package ``benchmarks/reporting/``: the table of ``benchmarks/X.py`` by
``benchmarks/reporting/X.py``; how to add one is in ``reporting/__init__.py``.  Benchmark scripts print their own
section after their runs with ``benchmarks.reporting.print_section``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.records import BENCHMARKS, RAW
from benchmarks.reporting import build, build_figures, freshness, stale_figures
from benchmarks.reporting.choosing import PAGE, build_page
from benchmarks.reporting.figures import draw
from benchmarks.reporting.privacy_audit import PAGE as PRIVACY_PAGE
from benchmarks.reporting.privacy_audit import build_page as build_privacy_page
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
    ap.add_argument(
        "--privacy-page",
        default=str(PRIVACY_PAGE),
        help="the privacy page (docs/privacy.md) whose generated block (the audit) to rewrite or check",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 if a file differs from what the records give")
    ap.add_argument("--allow-stale", action="store_true", help="with --check: list stale records, do not fail on them")
    args = ap.parse_args()
    raw = Path(args.raw_dir)
    text = build(raw)
    out, page = Path(args.out), Path(args.page)
    page_text = build_page(raw, page)
    robustness_page = Path(args.robustness_page)
    robustness_text = build_robustness_page(raw, robustness_page)
    privacy_page = Path(args.privacy_page)
    privacy_text = build_privacy_page(raw, privacy_page)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from the raw records; run python -m benchmarks.report'}")
        stale = stale_figures(raw, out.parent)
        for name in stale:
            print(f"{out.parent / name}: missing or drawn from other data; run python -m benchmarks.report")
        pages_same = True
        pages = ((page, page_text), (robustness_page, robustness_text), (privacy_page, privacy_text))
        for path, expected in pages:
            page_same = path.read_text() == expected
            pages_same = pages_same and page_same
            print(
                f"{path}: "
                f"{'up to date' if page_same else 'differs from the raw records; run python -m benchmarks.report'}"
            )
        fresh = check_records(raw, args.allow_stale)
        sys.exit(0 if same and not stale and pages_same and fresh else 1)
    out.write_text(text)
    page.write_text(page_text)
    robustness_page.write_text(robustness_text)
    privacy_page.write_text(privacy_text)
    drawn = [draw(fig, out.parent) for fig in build_figures(raw)]
    print(
        f"wrote {out}, {page}, {robustness_page}, {privacy_page}{''.join(f', {p.name}' for p in drawn)} from "
        f"{args.raw_dir}"
    )


def check_records(raw: Path, allow_stale: bool = False, checker: freshness.Checker | None = None) -> bool:
    """Print the records whose method code changed since their commit; whether the check passes."""
    try:
        verdicts, skipped = freshness.check(sorted(Path(raw).glob("*/*.json")), checker)
    except freshness.HistoryMissing as err:
        print(f"records: cannot tell whether they match the code: {err}")
        return allow_stale
    stale = [v for v in verdicts if not v.fresh]
    print(
        f"records: {len(verdicts) - len(stale)} of {len(verdicts)} runs match today's code of their method "
        f"({skipped} in-process measurements not checked)"
    )
    for line in freshness.summary(verdicts):
        print(f"  stale: {line}")
    if stale and not allow_stale:
        print("stale records refused: run their benchmarks again (or pass --allow-stale to list them only)")
    return not stale or allow_stale


if __name__ == "__main__":
    main()
