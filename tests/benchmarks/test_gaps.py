"""The tables of the methods' docs that ``benchmarks/gaps.py`` generates (FedC2I, PI-FL, FedSoft: why a method trails
FedAvg or Local, measured) are what the committed records give: a table typed or edited by hand fails here."""

from __future__ import annotations

from benchmarks.records import RAW
from benchmarks.reporting import gaps


def test_the_docs_gap_tables_are_generated_from_the_committed_records():
    assert gaps.rewrite_docs(RAW, check=True), (
        "a <!-- gaps:... --> table in docs/methods/ differs from what benchmarks/raw/defaults-gaps/ gives: run "
        "`python -m benchmarks.gaps --report` and commit the result"
    )


def test_a_table_without_its_records_says_which_runs_are_missing(tmp_path):
    text = gaps.render("fedc2i-small", tmp_path)
    assert text.startswith("(no records yet for ") and "fedc2i 25 samples local-epochs=2" in text
