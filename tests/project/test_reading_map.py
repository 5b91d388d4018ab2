"""docs/adding-a-method.md's reading map names files that exist, and the size it states for the shared part of the
reading list is what those files hold (within a tenth), so the map does not drift from the code it maps; and that
shared part stays short: at most four files and a thousand lines besides a method's own (PFLlib's whole FedCAC, its
own files and the two bases, is four files and 791 lines)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-a-method.md"


def reading_map() -> str:
    text = DOC.read_text()
    start = text.index("## Reading map")
    return text[start : text.index("\n## ", start + 1)]


def test_every_file_the_reading_map_names_exists():
    named = re.findall(r"`((?:strategies|client_app|task|server_app|docs)/[\w/]+\.(?:py|md))`", reading_map())
    assert len(named) > 10
    missing = [p for p in named if not (ROOT / p).is_file()]
    assert not missing, missing


#: the most a newcomer reads besides a method's own files, in files and in lines
MOST_FILES, MOST_LINES = 4, 1000


def shared_reading_list(section: str) -> list[str]:
    """The files of the map's items 2 on (each opens with its file)."""
    return re.findall(r"^\d\. `([\w/]+\.py)`", section, flags=re.MULTILINE)


def test_the_shared_reading_list_is_at_most_four_files_and_a_thousand_lines():
    items = shared_reading_list(reading_map())
    lines = {p: len((ROOT / p).read_text().splitlines()) for p in items}
    assert len(items) <= MOST_FILES, f"{len(items)} shared files to read: {items}"
    assert sum(lines.values()) <= MOST_LINES, f"the shared reading list holds {sum(lines.values())} lines: {lines}"


def test_the_shared_reading_list_is_as_long_as_the_map_says():
    section = reading_map()
    items = shared_reading_list(section)
    assert items[0] == "strategies/api.py" and "client_app/base.py" in items
    said = re.search(r"are about ([\d,]+) lines", section)
    assert said is not None, "the map states how long the shared reading list is"
    stated = int(said.group(1).replace(",", ""))
    actual = sum(len((ROOT / p).read_text().splitlines()) for p in items)
    assert abs(actual - stated) <= stated / 10, f"the shared reading list holds {actual} lines, the map says {stated}"
