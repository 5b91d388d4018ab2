"""The message recorder's common part: what one message carried, as a JSON line (run-config ``record-messages``).

Both halves of the app record with it: the ClientApp through a Flower mod (every message a node receives and
every reply it sends, :mod:`client_app.app`) and the ServerApp through a wrapper of its ``Grid`` (every message
pushed and every reply pulled, :mod:`server_app.recorder`).  A line holds the message's type, round and node,
and its records described, never their values: per array its key, shape and dtype; per metric or config record
the names of its entries, and the length of every entry that is a list.  That is enough to audit *what kind* of
data left a node ("what did my node send"), and how much of it: a list metric that grows from a few scores to a
vector as long as the model is seen.  It is what :mod:`strategies.disclosure_check` compares with each method's
declaration.

Where the lines go: the server's into ``<results folder>/messages-server.jsonl``; a client's into its own state
folder, ``<state-dir>/<run-key>/client-<partition-id>/messages.jsonl`` (node config ``state-dir`` wins over the
folder the server suggests), so in deployment a node's recording stays on that node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import RecordDict

#: file names of the recordings
SERVER_FILE = "messages-server.jsonl"
CLIENT_FILE = "messages.jsonl"

#: directions: what the client received / sent; what the server pushed / pulled
RECEIVED, SENT = "received", "sent"
PUSHED, PULLED = "pushed", "pulled"


def describe_content(content: RecordDict) -> dict[str, Any]:
    """The records of a message without their values: ``arrays`` {record: {key: [shape, dtype]}},
    ``metrics`` / ``configs`` {record: sorted entry names}, and ``lengths`` {record: {entry: length}} for the
    metric and config entries that are lists (records without one are left out)."""
    records: dict[str, Mapping[str, Any]] = {**content.metric_records, **content.config_records}
    lengths = {
        name: {key: len(value) for key, value in sorted(record.items()) if isinstance(value, list)}
        for name, record in sorted(records.items())
    }
    return {
        "arrays": {
            name: {key: [list(arr.shape), str(arr.dtype)] for key, arr in record.items()}
            for name, record in sorted(content.array_records.items())
        },
        "metrics": {name: sorted(record) for name, record in sorted(content.metric_records.items())},
        "configs": {name: sorted(record) for name, record in sorted(content.config_records.items())},
        "lengths": {name: entries for name, entries in lengths.items() if entries},
    }


def message_round(content: RecordDict) -> int | None:
    """The ``server-round`` the message's (or its reply's) config names, if any."""
    config = content.config_records.get("config")
    value = config.get("server-round") if config is not None else None
    return int(value) if isinstance(value, int) else None


def entry(direction: str, message_type: str, node: int, server_round: int | None, content: RecordDict) -> dict:
    """One recorded message.  ``node`` is the client's node (the receiver of a pushed message, the sender of a
    pulled reply, the recording node itself on the client)."""
    return {
        "direction": direction,
        "type": message_type,
        "node": int(node),
        "round": server_round,
        "content": describe_content(content),
    }


def append(path: Path, entries: Iterable[Mapping[str, Any]]) -> None:
    """Append ``entries`` to ``path`` as JSON lines (the folder is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for e in entries:
            f.write(json.dumps(e, sort_keys=True) + "\n")


def read(path: Path) -> list[dict[str, Any]]:
    """The entries of a recording (an absent file: none); a line that is not a JSON object is an error."""
    if not path.is_file():
        return []
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(value).__name__}")
        out.append(value)
    return out


def client_file(state_dir: str, run_key: str, partition_id: int) -> Path | None:
    """Where a client's recording goes: its state folder (see the module docstring); None without one."""
    if not state_dir or not run_key:
        return None
    return Path(state_dir).expanduser() / run_key / f"client-{partition_id}" / CLIENT_FILE


def read_run(folder: Path) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """A simulated run's recordings: the server's, and each client's by partition id (in simulation the clients'
    state folders are under the results folder, ``client-state/<run-key>/client-<id>/``)."""
    server = read(folder / SERVER_FILE)
    clients = {
        int(path.parent.name.removeprefix("client-")): read(path)
        for path in sorted((folder / "client-state").glob(f"*/client-*/{CLIENT_FILE}"))
    }
    return server, clients
