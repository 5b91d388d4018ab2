"""The repository's code and docs never point to an issue tracker it does not contain (the word issue followed by a
number, also as a heading's anchor): a reader outside cannot follow such a reference, so the text says the rule or the
reason instead.  benchmarks/raw/ holds committed measurement records, data that is read, not prose, and is left out."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATTERN = re.compile(r"\bissue[ #_-]?#?[0-9]+", re.IGNORECASE)
DATA = "benchmarks/raw/"


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    out = []
    for name in names.decode().split("\0"):
        if not name or name.startswith(DATA):
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (images, archives)
        out.append(path)
    return out


def test_the_pattern_finds_what_it_must():
    n = "17"  # kept apart from the word so that this file does not match itself
    for text in (f"see issue {n}", f"(Issue #{n})", f"#speed-issue-{n}", f"issue{n}"):
        assert PATTERN.search(text), text
    for text in ("tissue 3", "an issue with 3 nodes", "issues"):
        assert not PATTERN.search(text), text


def test_no_tracker_reference_in_code_or_docs():
    files = tracked_text_files()
    assert any(p.name == "README.md" for p in files)  # the listing really reads the repository
    hits = []
    for path in files:
        text = path.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if PATTERN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "references to an issue tracker (say the rule or the reason instead):\n" + "\n".join(hits)
