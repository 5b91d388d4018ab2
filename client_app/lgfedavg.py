"""LG-FedAvg client (Liang et al., 2020): the client's own local layers (the body, BatchNorm statistics
included, kept in ``context.state['body']``) under the global layers the server sends (the head).  Local
training updates both on the client's own loss; only the head goes back to the server.

See docs/methods/lgfedavg.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from flwr.app import RecordDict
from torch import nn

from client_app.base import ClientMethod
from task.models import parameters_of
from task.params import load_record, model_to_record, record_to_numpy


class LGFedAvgClient(ClientMethod):
    """Own body + the global head; the personalized model is exactly that pair."""

    keeps: ClassVar[Mapping[str, str]] = {
        "body": "the client's local layers (every key outside the head, BatchNorm statistics included)"
    }

    def _model(self, content: RecordDict) -> nn.Module:
        """The model this client starts a round from: its stored body (the common initial body before its first
        round) under the head in the message (the initial head when the message has none)."""
        model = self.reset_model()
        body = self.kept.load("body")
        if body is not None:
            load_record(model, body)
        rec = self.message_arrays(content)
        if rec is not None and len(rec):
            sent = record_to_numpy(rec)
            local = sorted(set(sent) - set(self.head_keys(model)))
            if local:
                raise ValueError(
                    f"LG-FedAvg keeps the local layers on the client, but the server sent {local[:3]}; "
                    "only the global (head) layers may come from the server"
                )
            load_record(model, sent)
        return model

    def train(self, content: RecordDict) -> RecordDict:
        model = self._model(content)
        metrics = self.fit(model)  # local and global layers together, on this client's own loss
        self.kept.save("body", model.state_dict(), self.body_keys(model))
        _, trained_acc = self.test(model)
        return self.reply(
            {**self.base_metrics(), **metrics, "trained-acc": trained_acc},
            model_to_record(model, self.head_keys(model)),
        )

    def personal_model(self, content: RecordDict) -> nn.Module:
        """This client's body under the global head of the message (an evaluate message, or the train message
        of the next round: the same head)."""
        return self._model(content)

    def newcomer_model(self, content: RecordDict) -> nn.Module:
        """A newcomer has no local layers of its own: the global head over a body fitted on its training split with
        the head frozen, for ``local-epochs`` (from the common initial body; nothing is kept)."""
        model = self._model(content)
        self.fit(model, params=parameters_of(model, self.body_keys(model)))
        return model
