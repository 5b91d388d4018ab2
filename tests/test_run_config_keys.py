"""flwr rejects --run-config keys that pyproject.toml does not declare: every key the code reads must be there."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE_CONFIG_KEYS = {"num-threads", "partition-id", "num-partitions", "device", "data-path", "cache-dir"}


def test_every_run_config_key_read_by_the_code_is_declared():
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    used = set()
    patterns = [r'(?:cfg|settings)\.(?:get|require)\("([a-z0-9-]+)"', r'_num\(cfg, "([a-z0-9-]+)"',
                r'_fraction\(cfg, "([a-z0-9-]+)"',
                r'_(?:flag|choice|number)\(settings, "([a-z0-9-]+)"']
    for folder in ("task", "strategies", "client_app", "server_app"):
        for path in (ROOT / folder).glob("*.py"):
            text = path.read_text()
            for pat in patterns:
                used |= set(re.findall(pat, text))
    assert used, "the scan found no keys: the patterns are out of date"
    assert used - NODE_CONFIG_KEYS <= declared, sorted(used - NODE_CONFIG_KEYS - declared)
