"""FedCAC strategy (spec fedcac §2.5-§2.7, §7): mask overlap, rising threshold, per-client customized models.

Each round the server receives every participant's trainable parameters and its bit-packed critical mask,
computes the overlap matrix over this round's participants (a client that dropped out keeps its stale
mask out of it), the threshold (Eq. 7), the collaborator sets (Eq. 8), the global average w_bar (Eq. 9)
and each participant's customized model u_i (Eq. 10).  Each node then receives ``global`` (w_bar) and
its own ``custom`` (u_i) and mixes them with its mask (Eq. 11) on the client.  BatchNorm running
statistics never leave the clients (spec §2.4 default).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import RecordDict

from client_app.fedcac_math import unpack_masks
from strategies.base import ClientUpdate, PersonalizedStrategy
from strategies.fedcac_math import (
    collaborator_label_similarity, collaborators, customized_models, global_average, mask_overlap, off_diagonal,
    overlap_threshold,
)
from task.models import build_model
from task.params import record_to_numpy, to_record


class FedCACStrategy(PersonalizedStrategy):
    name = "fedcac"

    def __init__(self, settings, initial_state, body, head):
        model = build_model(settings.model, settings.in_channels, settings.image_size, settings.num_classes)
        self.param_keys = [n for n, _ in model.named_parameters()]
        super().__init__(settings, initial_state, body, head)
        self.tau = settings.require("tau", float, minimum=0.0, maximum=1.0) if "tau" in settings.raw else 0.5
        beta = settings.get("beta", 15)
        if isinstance(beta, bool) or float(beta) != int(beta) or int(beta) < 1:
            raise ValueError(f"run-config key 'beta' must be an integer >= 1, got {beta!r}")
        self.beta = int(beta)
        self.strict_cutoff = bool(settings.get("strict-beta-cutoff", True))
        weighting = str(settings.get("fedcac-weighting", "uniform"))
        if weighting not in ("uniform", "num-examples"):
            raise ValueError(f"run-config key 'fedcac-weighting' must be 'uniform' or 'num-examples', got {weighting!r}")
        self.weighting = weighting
        self.param_shapes = {k: self.shapes[k] for k in self.param_keys}
        self.custom: dict[int, dict[str, np.ndarray]] = {}
        self.overlaps: dict[int, dict[str, Any]] = {}
        self.mask_bytes: list[int] = []

    def shared_keys(self) -> list[str]:
        return list(self.param_keys)

    def expected_reply_shapes(self, node_id: int) -> dict[str, tuple[int, ...]]:
        return dict(self.param_shapes)

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        payload = RecordDict({"global": to_record(self.global_state)})
        if node_id in self.custom:
            payload["custom"] = to_record(self.custom[node_id])
        return payload

    def _mask_of(self, server_round: int, update: ClientUpdate) -> np.ndarray | None:
        content = update.content
        if "mask" not in content.array_records or "bits" not in content.array_records["mask"]:
            self.record_failure(server_round, update.node_id, "train", "reply has no packed 'mask' record")
            return None
        bits = record_to_numpy(content.array_records["mask"])["bits"]
        try:
            masks = unpack_masks(bits, self.param_shapes)
        except ValueError as err:
            self.record_failure(server_round, update.node_id, "train", f"bad mask: {err}")
            return None
        self.mask_bytes.append(int(bits.nbytes))
        return np.concatenate([masks[k].ravel() for k in self.param_keys])

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Any]:
        rows, masks, kept = [], [], []
        for u in updates:
            m = self._mask_of(server_round, u)
            if m is None:
                continue
            rows.append(np.concatenate([u.arrays[k].ravel().astype(np.float32) for k in self.param_keys]))
            masks.append(m)
            kept.append(u)
        if not kept:
            return {"fedcac": "no valid replies"}
        params, mask_matrix = np.stack(rows), np.stack(masks)
        overlap = mask_overlap(mask_matrix)
        threshold = overlap_threshold(overlap, server_round, self.beta)
        collab = collaborators(overlap, threshold, server_round, self.beta, self.strict_cutoff)
        weights = np.array([u.num_examples for u in kept], float) if self.weighting == "num-examples" else None
        wbar = global_average(params, weights)
        custom = customized_models(params, collab)
        self.global_state = self._unflatten(wbar)
        for i, u in enumerate(kept):
            self.custom[u.node_id] = self._unflatten(custom[i])
        off = off_diagonal(overlap)
        sizes = np.array([len(c) for c in collab])
        pids = [u.partition_id for u in kept]
        diag: dict[str, Any] = {
            "threshold": float(threshold), "overlap-mean": float(off.mean()) if off.size else 0.0,
            "overlap-max": float(off.max()) if off.size else 0.0, "overlap-min": float(off.min()) if off.size else 0.0,
            "collaborators-mean": float(sizes.mean()), "collaborators-min": int(sizes.min()),
            "collaborators-max": int(sizes.max()),
            "collaborators": {int(pid): [int(pids[j]) for j in c] for pid, c in zip(pids, collab)},
            "mask-fraction": float(mask_matrix.mean()),
        }
        hist = [u.metrics.get("label-histogram") for u in kept]
        if all(isinstance(h, list) and h for h in hist):
            collab_sim, all_sim = collaborator_label_similarity(collab, np.array(hist, float))
            diag["collaborator-label-similarity"] = collab_sim
            diag["all-pairs-label-similarity"] = all_sim
        self.overlaps[server_round] = {"partition-ids": pids, "overlap": overlap.round(4).tolist()}
        return {"fedcac": diag}

    def _unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        out, pos = {}, 0
        for k in self.param_keys:
            size = int(np.prod(self.param_shapes[k]))
            out[k] = flat[pos : pos + size].reshape(self.param_shapes[k]).astype(np.float32)
            pos += size
        return out

    def write_artifacts(self, folder: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        per_round = [{"round": r.server_round, **r.extra.get("fedcac", {})} for r in self.history
                     if isinstance(r.extra.get("fedcac"), dict)]
        (folder / "fedcac_rounds.json").write_text(json.dumps(per_round, indent=1))
        n_params = sum(int(np.prod(s)) for s in self.param_shapes.values())
        (folder / "fedcac_communication.json").write_text(json.dumps({
            "parameters": n_params, "float32-model-bytes": 4 * n_params,
            "packed-mask-bytes": max(self.mask_bytes) if self.mask_bytes else None,
            "mask-to-model-ratio": (max(self.mask_bytes) / (4 * n_params)) if self.mask_bytes else None,
        }, indent=1))
        if not self.overlaps:
            return
        rounds = sorted(self.overlaps)
        chosen = sorted({rounds[0], min(self.beta, rounds[-1]), rounds[-1]})
        (folder / "fedcac_overlap.json").write_text(json.dumps({r: self.overlaps[r] for r in chosen}))
        fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 3.8), squeeze=False)
        for ax, r in zip(axes[0], chosen):
            entry = self.overlaps[r]
            order = np.argsort(entry["partition-ids"])
            mat = np.array(entry["overlap"])[np.ix_(order, order)]
            im = ax.imshow(mat, vmin=0, vmax=1, cmap="viridis")
            ax.set_title(f"mask overlap, round {r}")
            ax.set_xlabel("client")
            ax.set_ylabel("client")
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        fig.savefig(folder / "fedcac_overlap.png", dpi=100)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = [d["round"] for d in per_round]
        ax.plot(xs, [d["collaborators-mean"] for d in per_round], marker="o", label="mean |C_i|")
        ax2 = ax.twinx()
        ax2.plot(xs, [d["threshold"] for d in per_round], color="tab:red", ls="--", label="threshold")
        ax2.plot(xs, [d["overlap-mean"] for d in per_round], color="tab:gray", ls=":", label="mean overlap")
        ax.axvline(self.beta, color="k", lw=0.8)
        ax.set_xlabel("round")
        ax.set_ylabel("collaborators per client")
        ax2.set_ylabel("overlap")
        fig.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / "fedcac_collaborators.png", dpi=100)
        plt.close(fig)
