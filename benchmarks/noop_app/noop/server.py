"""The ServerApp: every round a train message to every node (and an evaluate message in the last round, as
pflower sends), each carrying ``payload-shapes`` float32 arrays (or one of ``payload-floats``); writes the seconds
of each round to ``results-file``."""

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def _phase(grid: Grid, nodes: list[int], kind: str, server_round: int, shapes: list[list[int]]) -> int:
    msgs = []
    for nid in nodes:
        content = RecordDict({"config": ConfigRecord({"server-round": server_round})})
        if shapes:
            content["arrays"] = ArrayRecord([np.zeros(s, dtype=np.float32) for s in shapes])
        msgs.append(Message(content=content, message_type=kind, dst_node_id=nid))
    replies = list(grid.send_and_receive(msgs, timeout=600))
    return sum(1 for r in replies if not r.has_error())


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds, floats = int(cfg["num-server-rounds"]), int(cfg["payload-floats"])
    # the arrays of every message: payload-shapes (JSON list of shapes) or one array of payload-floats
    shapes = json.loads(str(cfg["payload-shapes"])) if cfg["payload-shapes"] else ([[floats]] if floats else [])
    start = time.monotonic()
    nodes: list[int] = []
    while len(nodes) < int(cfg["min-nodes"]) and time.monotonic() - start < 300:
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.1)
    seconds: list[dict[str, float]] = []
    out = {"nodes": len(nodes), "rounds": seconds, "wait-for-nodes": time.monotonic() - start}
    for r in range(1, rounds + 1):
        t0 = time.monotonic()
        ok = _phase(grid, nodes, MessageType.TRAIN, r, shapes)
        if r == rounds and cfg["evaluate-last"]:
            ok += _phase(grid, nodes, MessageType.EVALUATE, r, shapes)
        seconds.append({"round": r, "seconds": time.monotonic() - t0, "replies": ok})
    if cfg["results-file"]:
        with Path(str(cfg["results-file"])).open("w") as fh:
            json.dump(out, fh)
    print(
        f"noop: {rounds} rounds, {len(nodes)} nodes, median "
        f"{sorted(x['seconds'] for x in seconds)[rounds // 2]:.3f} s per round"
    )
