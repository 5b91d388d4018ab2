"""FedCAC client (fedcac.md §2.3, §2.4, §2.7, §7): train, score sensitivity, send the packed critical mask,
mix the server's global and customized models with the stored mask (Eq. 11).

State kept in ``context.state``: ``model`` (the post-training model, BN statistics included: they stay
local) and ``mask`` (the packed critical mask of the last round).

See docs/methods/fedcac.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import ClassVar

import torch
from flwr.app import RecordDict

from client_app.base import ClientMethod
from client_app.fedcac_math import critical_masks, merge_customized, parameter_sensitivity
from task.methods.fedcac import FedCACOptions, pack_masks, unpack_masks
from task.params import load_record, model_to_record, record_to_numpy, to_record
from task.train import evaluate, norm_statistics


class FedCACClient(ClientMethod):
    options: FedCACOptions  # the run-config keys of this method, typed

    keeps: ClassVar[Mapping[str, str]] = {
        "model": "the post-training model, BatchNorm statistics included (they never leave the client)",
        "mask": "the packed critical mask of the last local training (Eq. 6)",
    }

    def _params(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    def _mixed_model(self, content: RecordDict) -> torch.nn.Module:
        """The model to start a round from and to evaluate as personalized: the stored post-training model mixed with
        the server's global and customized models by the stored mask (the common initial model with the global
        parameters before the client's first training)."""
        model = self.reset_model()
        own = self.kept.load("model")
        global_rec = self.message_arrays(content, "global")
        if own is None:  # first contact: the common initial model with the current global parameters
            if global_rec is not None:
                load_record(model, global_rec)
            return model
        load_record(model, own)
        packed = self.kept.load("mask")
        if global_rec is None or packed is None:
            return model
        keys = [n for n, _ in model.named_parameters()]
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        masks = unpack_masks(packed["bits"], shapes)

        def to_t(rec):
            return {k: torch.from_numpy(v).to(self.device) for k, v in record_to_numpy(rec).items()}

        custom_rec = self.message_arrays(content, "custom")
        with self.timed("method"):
            mixed = merge_customized(
                self._params(model), to_t(custom_rec) if custom_rec is not None else None, to_t(global_rec), masks
            )
        load_record(model, {k: v.cpu().numpy() for k, v in mixed.items() if k in keys})
        return model

    def train(self, content: RecordDict) -> RecordDict:
        model = self._mixed_model(content)
        before = self._params(model)
        metrics = self.fit(model)
        with self.timed("method"):
            after = self._params(model)
            masks = critical_masks(parameter_sensitivity(before, after), self.options.tau)
            keys = list(after)
            packed = pack_masks(masks, keys)
        self.kept.save("model", model.state_dict())
        self.kept.save("mask", {"bits": packed})
        _, trained_acc = self.test(model)
        extra = {}
        if self.options.diagnostics:  # simulation-only diagnostic (leaks labels)
            extra["label-histogram"] = [int(c) for c in self.data.label_histogram()]
        return self.reply(
            {**self.base_metrics(), **metrics, "trained-acc": trained_acc, **extra},
            model_to_record(model, keys),
            mask=to_record({"bits": packed}),
        )

    def personal_model(self, content: RecordDict) -> torch.nn.Module:
        """Eq. 11: the server's global and customized models mixed with this client's critical mask."""
        return self._mixed_model(content)

    def global_model(self, content: RecordDict, personal: torch.nn.Module) -> torch.nn.Module | None:
        global_rec = self.message_arrays(content, "global")
        if global_rec is None:
            return None
        glob = copy.deepcopy(personal)  # w_bar with this client's BN statistics (they never leave it)
        load_record(glob, global_rec)
        return glob

    def newcomer_model(self, content: RecordDict) -> torch.nn.Module:
        """A newcomer has neither a critical mask nor BatchNorm statistics of its own (they never leave a client): the
        global model w_bar with the BatchNorm statistics of its own training split (nothing is kept)."""
        model = self.reset_model()
        global_rec = self.message_arrays(content, "global")
        if global_rec is not None:
            load_record(model, global_rec)
        norm_statistics(model, self.data.x_train)
        return model

    def evaluation_extras(self, content: RecordDict, personal: torch.nn.Module) -> dict:
        """The model right after last round's local training, before aggregation (fedcac.md §6.9 logs both): the
        stored post-training model (none before the client's first training)."""
        own = self.kept.load("model")
        if own is None:
            return {}
        trained = self.reset_model()  # called last: the personalized model (the same network) was scored already
        load_record(trained, own)
        return {"before-agg-acc": evaluate(trained, *self.test_split())[1]}
