"""Fault injection for testing failure handling end to end (run-config key ``fault``, empty = off).

``fault = "nan@1,shape@2,crash@3"``: the client with partition id 1 replies NaN arrays to train messages,
2 replies a wrongly shaped array, 3 raises in every handler (an error reply), and ``badbid@4`` makes client
4 bid for a tier that does not exist (PI-FL's ``query.bid``).  ``crash@3:2`` limits a fault to round 2 (a
client that drops out of one round).  The server must reject those replies with a logged reason and
finish the round with the rest.
"""

from __future__ import annotations

import numpy as np
from flwr.app import MetricRecord, RecordDict

from task.params import record_to_numpy, to_record

KINDS = ("nan", "shape", "crash", "badbid")


def parse_faults(spec: str, server_round: int | None = None) -> dict[int, str]:
    """partition id -> fault kind active in ``server_round`` (all rounds when the item names none)."""
    faults: dict[int, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        kind, _, target = item.partition("@")
        pid, _, rnd = target.partition(":")
        if kind not in KINDS or not pid.isdigit() or (rnd and not rnd.isdigit()):
            raise ValueError(
                f"run-config key 'fault': bad item {item!r}; use kind@partition-id[:round] with kind in {KINDS}"
            )
        if not rnd or server_round is None or int(rnd) == server_round:
            faults[int(pid)] = kind
    return faults


class InjectedFault(RuntimeError):
    pass


def before_handler(spec: str, partition_id: int, server_round: int) -> None:
    if spec and parse_faults(spec, server_round).get(partition_id) == "crash":
        raise InjectedFault(f"injected crash on partition {partition_id} (run-config 'fault')")


def corrupt_train_reply(spec: str, partition_id: int, server_round: int, content: RecordDict) -> RecordDict:
    kind = parse_faults(spec, server_round).get(partition_id) if spec else None
    if kind not in ("nan", "shape") or "arrays" not in content.array_records:
        return content
    arrays = record_to_numpy(content.array_records["arrays"])
    if not arrays:
        return content
    key = next(k for k, v in arrays.items() if np.issubdtype(v.dtype, np.floating))
    arrays[key] = (
        np.full_like(arrays[key], np.nan) if kind == "nan" else np.zeros((*arrays[key].shape, 2), arrays[key].dtype)
    )
    content["arrays"] = to_record(arrays)
    return content


def corrupt_query_reply(spec: str, partition_id: int, server_round: int, name: str, content: RecordDict) -> RecordDict:
    """``badbid``: a PI-FL bid naming a tier that does not exist."""
    if name != "bid" or not spec or parse_faults(spec, server_round).get(partition_id) != "badbid":
        return content
    metrics = dict(content.metric_records["metrics"])
    metrics["bid"] = [999]
    content["metrics"] = MetricRecord(metrics)
    return content
