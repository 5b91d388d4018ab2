"""What the base does to a personalized model before it scores and saves it: the model's own BatchNorm statistics
under differential privacy (:func:`own_norm_statistics`, docs/privacy.md) and the model file written on the node
(run-config ``save-model``: ``ClientMethod.model_file``, a :class:`PersonalModelFile`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from task.config import Settings
from task.export import model_manifest, read_manifest, save_model
from task.train import norm_statistics


def own_norm_statistics(model: nn.Module, settings: Settings, x_train: torch.Tensor) -> None:
    """Under differential privacy, the model's BatchNorm statistics recomputed on this client's training split
    before it is scored (and saved): central DP never sends them (they stay home), local DP's releases carry
    them noised (without noise they are the clients' own, and kept as they are)."""
    if settings.dp_mode == "central" or (settings.dp_mode == "local" and settings.dp_noise_multiplier > 0):
        norm_statistics(model, x_train)


class PersonalModelFile:
    """The personalized model of one client as a file on its node (safetensors + manifest): :meth:`save`."""

    def __init__(self, node_config: Mapping[str, Any], settings: Settings, partition_id: int) -> None:
        self.node_config = node_config
        self.settings = settings
        self.partition_id = partition_id

    def save(
        self, model: nn.Module, metrics: Mapping[str, Any], config: Mapping[str, Any], server_round: int
    ) -> Path | None:
        """Write ``model`` to node config ``model-dir``, else the folder the message's ``config`` names; with
        ``save-best`` only when it beats the model saved before."""
        base = str(self.node_config.get("model-dir", config.get("model-dir", "")))
        if not base:
            return None
        path = Path(base).expanduser() / f"client-{self.partition_id}"
        if config.get("save-best") and path.with_suffix(".json").is_file():
            try:
                if read_manifest(path).get("personal-acc", -1.0) >= metrics["personal-acc"]:
                    return None
            except (ValueError, json.JSONDecodeError):
                pass  # an unreadable manifest is replaced
        manifest = model_manifest(
            self.settings,
            client=self.partition_id,
            round=int(config.get("evaluate-round", server_round)),
            **{"personal-acc": metrics["personal-acc"], "personal-loss": metrics["personal-loss"]},
        )
        return save_model(path, model.state_dict(), manifest)
