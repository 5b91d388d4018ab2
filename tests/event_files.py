"""A run's TensorBoard event files read back with TensorBoard's own reader, as ``tensorboard --logdir`` reads
them, and compared with the run's ``rounds.json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the event files of ``folder`` (one run): tag -> [(round, value), ...] as TensorBoard
    shows it (after the purges a resumed run asks for)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def runs(logdir: Path) -> set[str]:
    """The runs ``tensorboard --logdir logdir`` lists (folders holding event files, relative to ``logdir``)."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    return set(EventMultiplexer().AddRunsFromDirectory(str(logdir)).Runs())


def expected_from_rounds_json(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """What the event files must hold, read from ``rounds.json`` directly (not through the code that writes them):
    every number of a round's train and evaluate records and of its bytes, its seconds and its epsilon."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in json.loads((folder / "rounds.json").read_text()):
        extra = r["extra"]
        values = {f"train/{k}": v for k, v in r["train"].items()}
        values.update({f"eval/{k}": v for k, v in r["evaluate"].items()})
        values.update({f"comm/{k}": v for k, v in extra.get("comm", {}).items()})
        if extra.get("comm"):
            values["comm/bytes-up"] = sum(v for k, v in extra["comm"].items() if k.endswith("-up"))
            values["comm/bytes-down"] = sum(v for k, v in extra["comm"].items() if k.endswith("-down"))
        values["time/seconds"] = extra["seconds"]
        if "dp" in extra:
            values["dp/epsilon"] = extra["dp"]["epsilon"]
        for tag, value in values.items():
            out.setdefault(tag, []).append((r["round"], float(np.float32(value))))  # TensorBoard keeps float32
    return out


def check_event_files_match_rounds_json(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every number ``rounds.json`` has for a round is in the event files under its tag at that round's step, once,
    with the same value (as float32); returns what the event files hold."""
    written = scalars(folder)
    expected = expected_from_rounds_json(folder)
    assert expected, f"{folder}/rounds.json has no rounds"
    for tag, points in expected.items():
        assert written.get(tag) == points, (tag, written.get(tag), points)
    return written
