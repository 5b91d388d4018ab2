"""What the base does to a personalized model before it scores and saves it (:class:`ScoredModel`, a part of
``ClientMethod``): the model's own BatchNorm statistics under differential privacy (docs/privacy.md) and the model
file written on the node (run-config ``save-model``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from torch import nn

from task.config import Settings
from task.data import ClientData
from task.export import model_manifest, read_manifest, save_model
from task.train import norm_statistics


class ScoredModel:
    """``own_norm_statistics`` / ``save_personal_model`` of ``ClientMethod``."""

    context: Context
    config: dict[str, Any]
    settings: Settings
    partition_id: int
    server_round: int
    data: ClientData

    def own_norm_statistics(self, model: nn.Module) -> None:
        """Under differential privacy, the model's BatchNorm statistics recomputed on this client's training split
        before it is scored (and saved): central DP never sends them (they stay home), local DP's releases carry
        them noised (without noise they are the clients' own, and kept as they are)."""
        s = self.settings
        if s.dp_mode == "central" or (s.dp_mode == "local" and s.dp_noise_multiplier > 0):
            norm_statistics(model, self.data.x_train)

    def save_personal_model(self, model: nn.Module, metrics: Mapping[str, Any]) -> Path | None:
        """Write the personalized model (safetensors + manifest) to node config ``model-dir``, else the folder
        the server names; with ``save-best`` only when it beats the model saved before."""
        base = str(self.context.node_config.get("model-dir", self.config.get("model-dir", "")))
        if not base:
            return None
        path = Path(base).expanduser() / f"client-{self.partition_id}"
        if self.config.get("save-best") and path.with_suffix(".json").is_file():
            try:
                if read_manifest(path).get("personal-acc", -1.0) >= metrics["personal-acc"]:
                    return None
            except (ValueError, json.JSONDecodeError):
                pass  # an unreadable manifest is replaced
        manifest = model_manifest(
            self.settings,
            client=self.partition_id,
            round=int(self.config.get("evaluate-round", self.server_round)),
            **{"personal-acc": metrics["personal-acc"], "personal-loss": metrics["personal-loss"]},
        )
        return save_model(path, model.state_dict(), manifest)
