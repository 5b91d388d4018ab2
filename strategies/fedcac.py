"""FedCAC strategy (fedcac.md §2.5-§2.7, §7): mask overlap, rising threshold, per-client customized models.

Each round the server receives every participant's trainable parameters and its bit-packed critical mask,
computes the overlap matrix over this round's participants (a client that dropped out keeps its stale
mask out of it), the threshold (Eq. 7), the collaborator sets (Eq. 8), the global average w_bar (Eq. 9)
and each participant's customized model u_i (Eq. 10).  Each node then receives ``global`` (w_bar) and
its own ``custom`` (u_i) and mixes them with its mask (Eq. 11) on the client.  BatchNorm running
statistics never leave the clients (fedcac.md §2.4 default).

See docs/methods/fedcac.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from flwr.app import RecordDict

from strategies.api import (
    ACCURACY,
    INT_LIMIT,
    Arrays,
    Disclosure,
    Numbers,
    PersonalizedStrategy,
    Reply,
    ReplySpec,
    Tensor,
)
from strategies.fedcac_math import (
    collaborator_label_similarity,
    collaborators,
    customized_models,
    global_average,
    mask_overlap,
    off_diagonal,
    overlap_threshold,
)
from task.methods.fedcac import FedCACOptions, packed_length, unpack_masks
from task.params import to_record


class FedCACStrategy(PersonalizedStrategy):
    options: FedCACOptions  # the run-config keys of this method, typed

    def __init__(self, settings, initial_state, model_info):
        super().__init__(settings, initial_state, model_info)
        self.param_keys = list(model_info.parameter_keys)  # BN statistics never leave the clients
        self.param_shapes = {k: model_info.shapes[k] for k in self.param_keys}
        self.beta = self.options.beta
        # u_i of the last aggregation, keyed by client id, and the round it was computed in: a client only
        # ever receives a customized model computed in the round just before (fedcac.md §6.11)
        self.custom: dict[int, dict[str, np.ndarray]] = {}
        self.custom_round = 0
        # the overlap matrices fedcac_overlap.json / .png show: the first round's, round beta's (the last
        # round up to beta) and the last round's
        self.overlaps: dict[int, dict[str, Any]] = {}
        self.max_mask_bytes = 0  # the largest packed mask received (fedcac_communication.json)

    def state(self) -> dict[str, Any]:
        return {
            "custom": self.custom,
            "custom-round": self.custom_round,
            "overlaps": self.overlaps,
            "max-mask-bytes": self.max_mask_bytes,
        }

    def restore(self, state) -> None:
        self.custom, self.custom_round = state["custom"], state["custom-round"]
        self.overlaps, self.max_mask_bytes = state["overlaps"], state["max-mask-bytes"]

    def shared_keys(self) -> list[str]:
        return list(self.param_keys)

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        spec = super().reply_spec(phase, node_id)
        if phase == "evaluate":  # the model right after the last local training, before aggregation (fedcac.md §6.9)
            return spec.with_metrics(**{"before-agg-acc": replace(ACCURACY, required=False)})
        if phase != "train":
            return spec
        spec = spec.with_records(mask=Arrays({"bits": Tensor((packed_length(self.param_shapes),), "uint8")}))
        if self.options.diagnostics:
            spec = spec.with_metrics(
                **{"label-histogram": Numbers(int, 0, INT_LIMIT, length=self.settings.num_classes)}
            )
        return spec

    def disclosure(self) -> dict[str, Disclosure]:
        """Out: the trainable parameters (BatchNorm statistics stay home) and the critical mask (with
        ``fedcac-diagnostics``, the label histogram too).  In: the average, and the client's customized model:
        the average over the collaborators its mask's overlap chose."""
        receives = {
            "config": self.config_part(),
            "global": self.model_part("the average of the participants' trainable parameters"),
            "custom": self.model_part(
                "its customized model: the average over the collaborators its mask chose", required=False
            ),
        }
        what = {"arrays": "its trained parameters", "mask": "its critical-parameter mask, one bit per parameter"}
        out = super().disclosure()
        out["train"] = Disclosure(self.sends("train", what), receives, "which parameters its data makes sensitive")
        out["evaluate"] = Disclosure(self.sends("evaluate"), receives, out["evaluate"].reveals)
        return out

    def fresh_custom(self, node_id: int, server_round: int) -> dict[str, np.ndarray] | None:
        """u_i for the client behind ``node_id`` if it was computed in round ``server_round`` (else None)."""
        client = self.client(node_id)
        return self.custom.get(client) if client is not None and self.custom_round == server_round else None

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        """``global`` (w_bar) and this client's ``custom`` (u_i) when the aggregation just before the message
        computed it: round r - 1's for round r's train message, round r's for its evaluate message."""
        payload = RecordDict({"global": self.exchange.record_of(self.global_state)})
        custom = self.fresh_custom(node_id, server_round - 1 if phase == "train" else server_round)
        if custom is not None:
            payload["custom"] = to_record(custom)
        return payload

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        rows, masks = [], []
        for u in updates:
            bits = u.records["mask"]["bits"]
            flat = unpack_masks(bits, self.param_shapes)  # the length was checked against the spec
            masks.append(np.concatenate([flat[k].ravel() for k in self.param_keys]))
            rows.append(np.concatenate([u.arrays[k].ravel().astype(np.float32) for k in self.param_keys]))
            self.max_mask_bytes = max(self.max_mask_bytes, int(bits.nbytes))
        params, mask_matrix = np.stack(rows), np.stack(masks)
        overlap = mask_overlap(mask_matrix)
        threshold = overlap_threshold(overlap, server_round, self.beta)
        collab = collaborators(overlap, threshold, server_round, self.beta, self.options.strict_beta_cutoff)
        weights = (
            np.array([u.num_examples for u in updates], float) if self.options.weighting == "num-examples" else None
        )
        pids = [u.client for u in updates]
        if self.settings.robust.aggregator == "mean":  # Eq. 9 and Eq. 10
            wbar, custom = global_average(params, weights), customized_models(params, collab)
        else:  # the run's robust rule over all participants, and over each client and its collaborators
            wbar = self.robust.average_rows(params, weights, pids).astype(params.dtype)
            custom = np.stack(
                [
                    self.robust.average_rows(
                        params[[i, *c]], None, [pids[j] for j in (i, *c)], group=f"custom {pids[i]}"
                    )
                    for i, c in enumerate(collab)
                ]
            ).astype(params.dtype)
        self.global_state = self._unflatten(wbar)
        self.custom = {u.client: self._unflatten(custom[i]) for i, u in enumerate(updates)}
        self.custom_round = server_round
        off = off_diagonal(overlap)
        sizes = np.array([len(c) for c in collab])
        diag: dict[str, Any] = {
            "threshold": float(threshold),
            "overlap-mean": float(off.mean()) if off.size else 0.0,
            "overlap-max": float(off.max()) if off.size else 0.0,
            "overlap-min": float(off.min()) if off.size else 0.0,
            "collaborators-mean": float(sizes.mean()),
            "collaborators-min": int(sizes.min()),
            "collaborators-max": int(sizes.max()),
            "collaborators": {int(pid): [int(pids[j]) for j in c] for pid, c in zip(pids, collab, strict=True)},
            "mask-fraction": float(mask_matrix.mean()),
        }
        hist = [u.metrics.get("label-histogram") for u in updates]
        if all(h is not None for h in hist):
            collab_sim, all_sim = collaborator_label_similarity(collab, np.array(hist, float))
            diag["collaborator-label-similarity"] = collab_sim
            diag["all-pairs-label-similarity"] = all_sim
        self.keep_overlap(server_round, {"partition-ids": pids, "overlap": overlap.round(4).tolist()})
        return {"fedcac": diag}

    def keep_overlap(self, server_round: int, entry: dict[str, Any]) -> None:
        """Keep round ``server_round``'s overlap matrix if the artefacts may show it: the first round's, the last
        round's up to ``beta`` and the latest round's (at most three, whatever the run's length)."""
        self.overlaps[server_round] = entry
        rounds = sorted(self.overlaps)
        shown = {rounds[0], rounds[-1], *[r for r in rounds if r <= self.beta][-1:]}
        self.overlaps = {r: self.overlaps[r] for r in rounds if r in shown}

    def _unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        out, pos = {}, 0
        for k in self.param_keys:
            size = int(np.prod(self.param_shapes[k]))
            out[k] = flat[pos : pos + size].reshape(self.param_shapes[k]).astype(np.float32)
            pos += size
        return out
