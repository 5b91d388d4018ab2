"""The state a client method keeps between rounds: ``ClientMethod.kept``, a :class:`KeptState`.

A method declares what it keeps in ``ClientMethod.keeps`` (name -> what it is), next to its logic;
``self.kept.save(name, ...)`` / ``self.kept.load(name)`` refuse any other name.  Kept state lives in
``context.state`` and, when the node has a state folder (node config ``state-dir``, else the one the server names),
on disk, one file per round, so a restarted SuperNode or a resumed run picks up where it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context

from task.params import contiguous, record_to_numpy, to_record


class KeptState:
    """What a node keeps between rounds, in memory and on disk: :meth:`load` and :meth:`save`.

    ``owner`` (the method's class name) and ``keeps`` (its declaration) make the refusal of an undeclared name
    say whose declaration it is; ``keep_rounds`` is how many rounds of files stay on disk.  The message being
    handled says where the files go and which round it is: :meth:`begin` takes its config."""

    def __init__(
        self, context: Context, owner: str, keeps: Mapping[str, str], partition_id: int, keep_rounds: int
    ) -> None:
        self.context = context
        self.owner = owner
        self.keeps = keeps
        self.partition_id = partition_id
        self.keep_rounds = keep_rounds
        self.config: Mapping[str, Any] = {}  # the current message's config (state-dir, run-key, server-round)

    def begin(self, config: Mapping[str, Any]) -> None:
        """The config of the message being handled: its ``state-dir``, ``run-key`` and ``server-round``."""
        self.config = config

    def _folder(self) -> Path | None:
        """``<state-dir>/<run-key>/client-<id>``: node config ``state-dir`` wins over the server's suggestion."""
        base = str(self.context.node_config.get("state-dir", self.config.get("state-dir", "")))
        key = str(self.config.get("run-key", ""))
        return Path(base).expanduser() / key / f"client-{self.partition_id}" if base and key else None

    def _declared(self, name: str) -> None:
        if name not in self.keeps:
            raise ValueError(
                f"{self.owner} keeps {sorted(self.keeps) or 'nothing'} between rounds, not {name!r}: "
                "declare it in its 'keeps'"
            )

    @staticmethod
    def _files(folder: Path, name: str) -> dict[int, Path]:
        """``round -> file`` of the state saved under ``name`` in ``folder`` (``<name>.round-<r>.safetensors``)."""
        files = {}
        for path in folder.glob(f"{name}.round-*.safetensors"):
            tag = path.name[len(name) + len(".round-") : -len(".safetensors")]
            if tag.isdigit():
                files[int(tag)] = path
        return files

    def load(self, name: str) -> dict[str, np.ndarray] | None:
        """Arrays this node saved under ``name`` (``context.state``, else the node's state folder), or None.

        On disk, state is kept per round, and a message of round r reads the newest state saved before round r:
        after a crash in the middle of round r (clients already trained and saved round r's state) the run
        resumes from the server's checkpoint of an earlier round, and its clients must continue from the state
        that matches that checkpoint, not from the round that was lost."""
        self._declared(name)
        if name in self.context.state.array_records:
            return record_to_numpy(self.context.state.array_records[name])
        folder = self._folder()
        if folder is None or not folder.is_dir():
            return None
        current = int(self.config.get("server-round", 0))
        earlier = {r: p for r, p in self._files(folder, name).items() if not current or r < current}
        if not earlier:
            return None
        from safetensors.numpy import load_file

        arrays = load_file(str(earlier[max(earlier)]))
        self.context.state[name] = to_record(arrays)
        return arrays

    def save(self, name: str, state: Mapping[str, Any], keys: Iterable[str] | None = None) -> None:
        """Keep ``state`` (restricted to ``keys``) for the next rounds, in ``context.state`` and on disk (one file
        per round, written atomically).  The newest ``keep_rounds`` rounds are kept (the base keeps
        ``checkpoint-every + 1``: the server resumes from its last checkpoint, at most ``checkpoint-every`` rounds
        back)."""
        self._declared(name)
        record = to_record(state, keys)
        self.context.state[name] = record
        folder = self._folder()
        if folder is not None:
            from safetensors.numpy import save_file

            folder.mkdir(parents=True, exist_ok=True)
            current = int(self.config.get("server-round", 0))
            fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
            os.close(fd)
            tmp = Path(tmp_name)
            try:
                save_file({k: contiguous(v) for k, v in record_to_numpy(record).items()}, tmp_name)
                tmp.replace(folder / f"{name}.round-{current:05d}.safetensors")  # a crash leaves earlier rounds
            finally:
                tmp.unlink(missing_ok=True)
            files = self._files(folder, name)
            for r in sorted(files)[: -self.keep_rounds]:
                files[r].unlink(missing_ok=True)
