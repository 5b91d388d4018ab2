"""IFCA client: pick the cluster model with the lowest loss on the training split, train it, say which."""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from client_app.base import ClientMethod
from task.params import model_at, model_to_record, stacked_tensors
from task.train import evaluate


def cluster_losses(client: ClientMethod, content: RecordDict, x, y) -> list[float]:
    """The loss on ``(x, y)`` of each model the message stacks in ``tiers``, in their order."""
    stacked = stacked_tensors(content.array_records["tiers"], client.device)
    model = client.reset_model()
    losses = []
    for j in range(next(iter(stacked.values())).shape[0]):
        model.load_state_dict(model_at(stacked, j))
        losses.append(evaluate(model, x, y)[0])
    return losses


def lowest_loss(client: ClientMethod, content: RecordDict, x, y) -> int:
    """The index of the model the message stacks in ``tiers`` with the lowest loss on ``(x, y)``."""
    return int(torch.tensor(cluster_losses(client, content, x, y)).argmin())


def best_of(client: ClientMethod, content: RecordDict, x, y) -> tuple[torch.nn.Module, int]:
    """(the model of the ``tiers`` the message stacks with the lowest loss on ``(x, y)``, its index)."""
    best = lowest_loss(client, content, x, y)
    model = client.reset_model()
    model.load_state_dict(model_at(stacked_tensors(content.array_records["tiers"], client.device), best))
    return model, best


def choice_split(client: ClientMethod) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a client that does not train on the message chooses among cluster models: its validation split (its
    training split without one)."""
    d = client.data
    return (d.x_val, d.y_val) if len(d.y_val) else (d.x_train, d.y_train)


def lowest_loss_model(client: ClientMethod, content: RecordDict) -> torch.nn.Module:
    """Of the models the message stacks (``tiers``), the one with the lowest loss on the client's validation split
    (its training split without one)."""
    return best_of(client, content, *choice_split(client))[0]


class IFCAClient(ClientMethod):
    def train(self, content: RecordDict) -> RecordDict:
        with self.timed("method"):
            model, cluster = best_of(self, content, self.data.x_train, self.data.y_train)
        metrics = self.fit(model)
        return self.reply({**self.base_metrics(), **metrics, "cluster": cluster}, model_to_record(model))

    def personal_model(self, content: RecordDict) -> torch.nn.Module:
        """The cluster model with the lowest loss on the validation split (the training split without one)."""
        return lowest_loss_model(self, content)

    def evaluation_extras(self, content: RecordDict, personal: torch.nn.Module) -> dict:
        """Which cluster model is the personalized one."""
        return {"cluster": lowest_loss(self, content, *choice_split(self))}
