"""The server half of the message recorder (run-config ``record-messages``; :mod:`task.recording`).

:class:`RecordingGrid` wraps the ``Grid`` Flower hands the ServerApp and passes every call through unchanged,
writing a line for every message pushed to a node and every reply pulled from one into the run's
``messages-server.jsonl``.  It relies only on ``flwr.serverapp.Grid``'s public, abstract interface.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from task import recording


class RecordingGrid(Grid):
    """``grid`` with every pushed message and every pulled reply recorded into ``path``."""

    def __init__(self, grid: Grid, path: Path) -> None:
        self.grid = grid
        self.path = path
        self._sent: dict[str, tuple[str, int | None]] = {}  # message id -> its type and round (for its reply)

    def set_run(self, run: Any) -> None:  # Flower's Run (its class lives in an internal module)
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(self.grid.push_messages(messages))
        lines: list[Mapping[str, Any]] = []
        for message, mid in zip(messages, ids, strict=True):
            meta = message.metadata
            server_round = recording.message_round(message.content)
            self._sent[mid] = (meta.message_type, server_round)
            lines.append(
                recording.entry(recording.PUSHED, meta.message_type, meta.dst_node_id, server_round, message.content)
            )
        recording.append(self.path, lines)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self.grid.pull_messages(message_ids))
        lines: list[Mapping[str, Any]] = []
        for reply in replies:
            if reply.has_error():
                continue
            meta = reply.metadata
            kind, server_round = self._sent.pop(meta.reply_to_message_id, ("unknown", None))
            lines.append(recording.entry(recording.PULLED, kind, meta.src_node_id, server_round, reply.content))
        if lines:
            recording.append(self.path, lines)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push, then pull until every reply is in or ``timeout`` seconds passed (as Flower's grids do), through
        this wrapper's recording ``push_messages`` and ``pull_messages``."""
        waiting = {mid for mid in self.push_messages(messages) if mid}
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while waiting and (deadline is None or time.monotonic() < deadline):
            got = list(self.pull_messages(waiting))
            replies += got
            waiting -= {r.metadata.reply_to_message_id for r in got}
            if waiting:
                time.sleep(0.1)
        return replies
