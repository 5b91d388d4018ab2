"""The state a client method keeps between rounds (:class:`KeptState`, a part of ``ClientMethod``).

A method declares what it keeps in ``ClientMethod.keeps`` (name -> what it is), next to its logic;
:meth:`KeptState.save_state` / :meth:`KeptState.load_state` refuse any other name.  Kept state lives in
``context.state`` and, when the node has a state folder (node config ``state-dir``, else the one the server names),
on disk, one file per round, so a restarted SuperNode or a resumed run picks up where it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import Context

from task.config import Settings
from task.params import contiguous, record_to_numpy, to_record


class KeptState:
    """``load_state`` / ``save_state`` of ``ClientMethod``: what a node keeps between rounds, in memory and on disk."""

    keeps: ClassVar[Mapping[str, str]]
    context: Context
    config: dict[str, Any]
    settings: Settings
    partition_id: int

    def _state_dir(self) -> Path | None:
        """``<state-dir>/<run-key>/client-<id>``: node config ``state-dir`` wins over the server's suggestion."""
        config = getattr(self, "config", {})
        base = str(self.context.node_config.get("state-dir", config.get("state-dir", "")))
        key = str(config.get("run-key", ""))
        return Path(base).expanduser() / key / f"client-{self.partition_id}" if base and key else None

    def _kept(self, name: str) -> None:
        if name not in self.keeps:
            raise ValueError(
                f"{type(self).__name__} keeps {sorted(self.keeps) or 'nothing'} between rounds, not {name!r}: "
                "declare it in its 'keeps'"
            )

    def _state_files(self, folder: Path, name: str) -> dict[int, Path]:
        """``round -> file`` of the state saved under ``name`` in ``folder`` (``<name>.round-<r>.safetensors``)."""
        files = {}
        for path in folder.glob(f"{name}.round-*.safetensors"):
            tag = path.name[len(name) + len(".round-") : -len(".safetensors")]
            if tag.isdigit():
                files[int(tag)] = path
        return files

    def load_state(self, name: str) -> dict[str, np.ndarray] | None:
        """Arrays this node saved under ``name`` (``context.state``, else the node's state folder), or None.

        On disk, state is kept per round, and a message of round r reads the newest state saved before round r:
        after a crash in the middle of round r (clients already trained and saved round r's state) the run
        resumes from the server's checkpoint of an earlier round, and its clients must continue from the state
        that matches that checkpoint, not from the round that was lost."""
        self._kept(name)
        if name in self.context.state.array_records:
            return record_to_numpy(self.context.state.array_records[name])
        folder = self._state_dir()
        if folder is None or not folder.is_dir():
            return None
        current = int(self.config.get("server-round", 0))
        earlier = {r: p for r, p in self._state_files(folder, name).items() if not current or r < current}
        if not earlier:
            return None
        from safetensors.numpy import load_file

        arrays = load_file(str(earlier[max(earlier)]))
        self.context.state[name] = to_record(arrays)
        return arrays

    def save_state(self, name: str, state: Mapping[str, Any], keys: Iterable[str] | None = None) -> None:
        """Keep ``state`` (restricted to ``keys``) for the next rounds, in ``context.state`` and on disk (one file
        per round, written atomically).  The newest ``checkpoint-every + 1`` rounds are kept: the server resumes from
        its last checkpoint, at most ``checkpoint-every`` rounds back."""
        self._kept(name)
        record = to_record(state, keys)
        self.context.state[name] = record
        folder = self._state_dir()
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
            files = self._state_files(folder, name)
            for r in sorted(files)[: -(max(self.settings.checkpoint_every, 1) + 1)]:
                files[r].unlink(missing_ok=True)
