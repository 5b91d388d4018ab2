"""FedBN client (Li et al., ICLR 2021): the client's own normalisation layers (BatchNorm weight, bias and running
statistics, kept in ``context.state['norm']``) inside the averaged rest of the model the server sends.  Local
training updates both on the client's own loss; everything but the normalisation layers goes back to the server.

See docs/methods/fedbn.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from flwr.app import RecordDict
from torch import nn

from client_app.base import ClientMethod
from task.models import norm_keys, parameters_of
from task.params import load_record, model_to_record, record_to_numpy


class FedBNClient(ClientMethod):
    """The averaged layers + this client's own normalisation layers; the personalized model is exactly that."""

    keeps: ClassVar[Mapping[str, str]] = {
        "norm": "the client's normalisation layers (weight, bias and running statistics of every BatchNorm)"
    }

    def _model(self, content: RecordDict) -> nn.Module:
        """The model this client starts a round from: the layers in the message (the common initial ones when the
        message has none) with its stored normalisation layers (the common initial ones before its first round)."""
        model = self.reset_model()
        rec = self.message_arrays(content)
        if rec is not None and len(rec):
            sent = record_to_numpy(rec)
            local = sorted(set(sent) & set(norm_keys(model)))
            if local:
                raise ValueError(
                    f"FedBN keeps the normalisation layers on the client, but the server sent {local[:3]}; only the "
                    "other layers may come from the server"
                )
            load_record(model, sent)
        own = self.kept.load("norm")
        if own is not None:
            load_record(model, own)
        return model

    def train(self, content: RecordDict) -> RecordDict:
        model = self._model(content)
        metrics = self.fit(model)  # every layer, the normalisation layers included, on this client's own loss
        local = norm_keys(model)
        self.kept.save("norm", model.state_dict(), local)
        _, trained_acc = self.test(model)
        shared = [k for k in model.state_dict() if k not in set(local)]
        return self.reply(
            {**self.base_metrics(), **metrics, "trained-acc": trained_acc}, model_to_record(model, shared)
        )

    def personal_model(self, content: RecordDict) -> nn.Module:
        """The averaged layers of the message (an evaluate message, or the next round's train message: the same
        layers) with this client's own normalisation layers."""
        return self._model(content)

    def newcomer_model(self, content: RecordDict) -> nn.Module:
        """A newcomer has no normalisation layers of its own: the averaged layers with normalisation layers fitted on
        its training split (weight and bias trained, statistics its data's) with every other layer frozen, for
        ``local-epochs`` (from the common initial ones; nothing is kept)."""
        model = self._model(content)
        self.fit(model, params=parameters_of(model, norm_keys(model)))
        return model
