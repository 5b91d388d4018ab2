"""The README's differential-privacy examples (and docs/privacy.md's copy of them) are complete commands a user can
paste: ``--stream``, ten nodes with one CPU each, a run config the app accepts; what the README says each costs and
gives is what its committed record (benchmarks/dp_examples.py, the command run as written) reports, and better than
chance."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(
    0, str(next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists()) / "benchmarks")
)

from benchmarks import dp_examples
from task.config import parse_settings

ROOT = Path(dp_examples.README).parent

EXAMPLES = dp_examples.examples()
RECORDS = dp_examples.records()


def test_the_readme_shows_one_dp_example_per_mode_and_docs_privacy_the_same_commands():
    assert {ex["run-config"]["dp-mode"] for ex in EXAMPLES} == {"central", "local"} and len(EXAMPLES) == 3
    assert [ex["command"] for ex in dp_examples.examples(ROOT / "docs" / "privacy.md")] == [
        ex["command"] for ex in EXAMPLES
    ]


@pytest.mark.parametrize("example", EXAMPLES, ids=[ex["run-config"]["method"] for ex in EXAMPLES])
def test_every_example_is_a_complete_command_the_app_accepts(example):
    assert example["stream"]
    assert example["federation"] == {"num-supernodes": 10, "client-resources-num-cpus": 1}
    settings = parse_settings(example["run-config"])
    assert settings.dp_mode != "off" and settings.dp_target_epsilon > 0  # a budget, not a bare noise multiplier


@pytest.mark.parametrize("example", EXAMPLES, ids=[ex["run-config"]["method"] for ex in EXAMPLES])
def test_what_the_readme_says_an_example_gives_is_its_records(example):
    method = example["run-config"]["method"]
    record = RECORDS[method]
    assert record["error"] is None and record["failures"]["count"] == 0
    assert {k: record["run-config"][k] for k in example["run-config"]} == example["run-config"]
    assert record["num-supernodes"] == example["federation"]["num-supernodes"]
    summary, target = record["summary"], example["run-config"]["dp-target-epsilon"]
    assert 0.99 * target <= summary["epsilon"] <= target
    assert summary["personal-acc"] > 0.2  # ten classes: chance is 0.1
    line = dp_examples.result_line(record)
    for doc in ("README.md", "docs/privacy.md"):
        assert line in (ROOT / doc).read_text(), f"{doc} does not say: {line}"
