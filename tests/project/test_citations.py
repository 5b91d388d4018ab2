"""The code cites only documents that are in the repository: a method's docs page and its section numbers.

Comments and tests cite a method's page as ``fedcac.md §2.4`` (or ``client2vec.md A5``); every number cited
must be in that page's table "Section numbers cited in the code", which says where it is explained.  Nothing
cites notes or design documents kept outside the repository.  (``benchmarks/`` renders the papers' settings
with its own source labels and is checked with the report.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("fedcac", "fedc2i", "pfedlia", "pifl", "client2vec")
SOURCES = sorted(
    p
    for folder in ("client_app", "server_app", "strategies", "task", "tests", "deploy")
    for p in (ROOT / folder).rglob("*.py")
    if p.relative_to(ROOT).as_posix() != "tests/benchmarks/test_report.py"
)
DOCS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
NUMBERS = r"((?:(?:§[\d.]*\d|A\d+)(?:[-\u2013/]§?[\d.]*\d)?(?:,? (?:and |/ )?)?)+)"  # \u2013: an en dash
CITATION = re.compile(r"\b(" + "|".join(PAGES) + r")\.md\)? " + NUMBERS)


def cited_numbers() -> dict[str, dict[str, list[str]]]:
    """page -> number -> the files citing it."""
    out: dict[str, dict[str, list[str]]] = {page: {} for page in PAGES}
    for path in SOURCES:
        for match in CITATION.finditer(path.read_text()):
            for section, label in re.findall(r"§([\d.]*\d)|\b(A\d+)", match.group(2)):
                out[match.group(1)].setdefault(section or label, []).append(path.name)
    return out


def table_numbers(page: str) -> set[str]:
    text = (ROOT / "docs" / "methods" / f"{page}.md").read_text()
    table = text[text.index("## Section numbers cited in the code") :]
    numbers: set[str] = set()
    for label in re.findall(r"^\| ([^|]+) \|", table, re.MULTILINE):
        for low, high in re.findall(r"§([\d.]*\d)(?:-§([\d.]*\d))?", label):
            numbers.add(low)
            if high:  # §2.2-§2.5
                major, first, last = low.split(".")[0], int(low.split(".")[1]), int(high.split(".")[1])
                numbers.update(f"{major}.{k}" for k in range(first, last + 1))
        numbers.update(re.findall(r"\bA\d+", label))
    return numbers


@pytest.mark.parametrize("page", PAGES)
def test_every_section_number_the_code_cites_is_explained_on_the_methods_page(page):
    table = table_numbers(page)

    def explained(number: str) -> bool:  # §2 explains §2.4 too
        parts = number.split(".")
        return any(".".join(parts[:i]) in table for i in range(1, len(parts) + 1))

    missing = {n: files for n, files in cited_numbers()[page].items() if not explained(n)}
    assert not missing, f"docs/methods/{page}.md has no row for {missing}"


def test_nothing_cites_a_document_outside_the_repository():
    outside = re.compile(r"\b[Ss]pecs? (?:(?:" + "|".join(PAGES) + r")(?:\.md)? )?(?:§|A\d)|DESIGN\.md|shared/specs")
    found = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in SOURCES + DOCS
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if outside.search(line) and path.relative_to(ROOT).as_posix() != "tests/project/test_citations.py"
    ]
    assert not found, found
    assert sum(len(v) for page in cited_numbers().values() for v in page.values()) > 100  # the pattern finds them
