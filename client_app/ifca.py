"""IFCA client: pick the cluster model with the lowest loss on the training split, train it, say which."""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from client_app.base import ClientMethod
from task.params import model_to_record, record_to_numpy
from task.train import evaluate


class IFCAClient(ClientMethod):
    def _best(self, content: RecordDict, x, y) -> tuple[torch.nn.Module, int]:
        stacked = {k: torch.from_numpy(v) for k, v in record_to_numpy(content.array_records["tiers"]).items()}
        model = self.fresh_model()
        losses = []
        for j in range(next(iter(stacked.values())).shape[0]):
            model.load_state_dict({k: v[j] for k, v in stacked.items()})
            losses.append(evaluate(model, x, y)[0])
        best = int(torch.tensor(losses).argmin())
        model.load_state_dict({k: v[best] for k, v in stacked.items()})
        return model, best

    def train(self, content: RecordDict) -> RecordDict:
        with self.timed("method"):
            model, cluster = self._best(content, self.data.x_train, self.data.y_train)
        metrics = self.fit(model)
        return self.reply({**self.base_metrics(), **metrics, "cluster": cluster}, model_to_record(model))

    def evaluate(self, content: RecordDict) -> RecordDict:
        x, y = (self.data.x_val, self.data.y_val) if len(self.data.y_val) else (self.data.x_train, self.data.y_train)
        model, cluster = self._best(content, x, y)
        loss, acc = self.test(model)
        return self.reply({**self.base_metrics(), "personal-acc": acc, "personal-loss": loss, "cluster": cluster})
