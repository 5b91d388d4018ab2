"""Where a message's time goes: from the server pushing it to the server pulling its reply.

Every reply carries a ``timing`` record (``client_app/app.py``: unix seconds at which the client's process
started, its app module's imports began and ended, and the handler began, finished its set-up and ended).
With the moment the server pushed the message and the moment it pulled the reply, one message splits into:

``dispatch``  push -> the handler's process starts: the SuperLink, the SuperNode's pull (an idle SuperNode
              asks every 3 s), the SuperExec's task poll and the process spawn.  When the process was already
              running (simulation: long-lived workers) there is no start-up: push -> handler start.
``start-up``  process start -> pflower's app module starts importing (interpreter, flwr, FAB and context);
``imports``   pflower's app module and what it imports (torch, the method's client);
``handoff``   app loaded -> handler called (Flower reads the message and context);
``setup``     settings, the node's data, the client object;
``work``      the handler's own work: model, evaluation, local training, method work, the reply's content
              (``time-train`` / ``time-method`` of the reply say how much of it is training and method work);
``return``    handler end -> the server has the reply (serialisation, push, SuperLink, the server's pull).

The stamps come from the client's clock and the push/pull times from the server's: the split is exact on one
machine (simulation, loopback deployment) and off by the clock skew between machines otherwise.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

COMPONENTS = ("dispatch", "start-up", "imports", "handoff", "setup", "work", "return", "total")
#: a process that started up to this long before the push still counts as started for the message (the
#: clocks of /proc are coarse: 10 ms ticks)
FRESH_SLACK = 0.05


def breakdown(pushed: float | None, stamps: Mapping[str, float], pulled: float | None) -> dict[str, float]:
    """One message's seconds per component (only those the stamps allow)."""
    out: dict[str, float] = {}
    start, end = stamps.get("handler-start"), stamps.get("handler-end")
    if start is None or end is None:
        return out
    proc = stamps.get("process-start")
    fresh = proc is not None and pushed is not None and proc >= pushed - FRESH_SLACK  # started for this message
    if fresh and "app-import" in stamps and "app-ready" in stamps:
        assert proc is not None and pushed is not None  # (what fresh says, for the type checker)
        out["dispatch"] = proc - pushed
        out["start-up"] = stamps["app-import"] - proc
        out["imports"] = stamps["app-ready"] - stamps["app-import"]
        out["handoff"] = start - stamps["app-ready"]
    elif pushed is not None:
        out["dispatch"] = start - pushed
    setup = stamps.get("setup-done")
    if setup is not None:
        out["setup"] = setup - start
        out["work"] = end - setup
    else:
        out["work"] = end - start
    if pulled is not None:
        out["return"] = pulled - end
        if pushed is not None:
            out["total"] = pulled - pushed
    return out


def summarize(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Median seconds of each component over a phase's messages, and how many messages had it."""
    rows = list(rows)
    out: dict[str, float] = {"messages": float(len(rows))}
    for c in COMPONENTS:
        vals = [r[c] for r in rows if c in r]
        if vals:
            out[c] = statistics.median(vals)
    if rows:
        out["fresh-processes"] = float(sum(1 for r in rows if "start-up" in r))
        # the clients' own time (set-up and work) summed over the phase's messages: the pure compute a round
        # contains, against which the rest (dispatch, start-up, imports, return) is overhead
        out["handler-sum"] = sum(r.get("setup", 0.0) + r.get("work", 0.0) for r in rows)
    return out
