"""Client side of the baselines: Local, FedAvg, FedProx, FedPer, FedRep, FedRoD, Ditto, MOON.

Every train reply carries the shared arrays (``arrays``) and metrics with ``num-examples``,
``partition-id``, train loss/accuracy and ``trained-acc`` (the just-trained local model on the client's
test split, i.e. "after local training").  Every evaluate reply carries ``personal-acc`` (the client's
personalized model on its own test split) and, where the method has one, ``global-acc``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client_app.base import SAME_AS_PERSONAL, ClientMethod, load_shared
from client_app.ifca import lowest_loss_model
from task.methods.baselines import DittoOptions, FedProxOptions, FedRepOptions, MoonOptions
from task.models import SplitModel, parameters_of
from task.params import load_record, model_to_record
from task.train import proximal_term


class FedAvgClient(ClientMethod):
    """Train the received global model; personalized accuracy is the global model's own."""

    def extra_loss(self, model: nn.Module):
        return None

    def train(self, content: RecordDict) -> RecordDict:
        model = self.reset_model()
        load_shared(model, content)
        metrics = self.fit(model, extra_loss=self.extra_loss(model))
        _, trained_acc = self.test(model)
        return self.reply({**self.base_metrics(), **metrics, "trained-acc": trained_acc}, model_to_record(model))

    def global_model(self, content: RecordDict, personal: nn.Module):
        return SAME_AS_PERSONAL  # one model


class FedProxClient(FedAvgClient):
    """FedAvg plus ``proximal-mu``/2 ||w - w_global||^2 in the local objective."""

    options: FedProxOptions  # the run-config keys of this method, typed

    def extra_loss(self, model: nn.Module):
        reference = {k: p.detach().clone() for k, p in model.named_parameters()}
        return proximal_term(reference, self.options.proximal_mu)


class LocalClient(ClientMethod):
    """Separate training: the model lives in ``context.state['model']`` and never leaves the node."""

    keeps: ClassVar[Mapping[str, str]] = {"model": "the client's own model (it never leaves the node)"}

    def _model(self) -> nn.Module:
        model = self.reset_model()
        own = self.kept.load("model")
        if own is not None:
            load_record(model, own)
        return model

    def train(self, content: RecordDict) -> RecordDict:
        model = self._model()
        metrics = self.fit(model)
        self.kept.save("model", model.state_dict())
        _, acc = self.test(model)
        return self.reply({**self.base_metrics(), **metrics, "trained-acc": acc})

    def personal_model(self, content: RecordDict) -> nn.Module:
        return self._model()


class FedPerClient(ClientMethod):
    """Shared body from the server + this client's head (kept in ``context.state['head']``)."""

    keeps: ClassVar[Mapping[str, str]] = {"head": "the client's own classifier (the head keys)"}

    def _model(self, content: RecordDict) -> nn.Module:
        model = self.reset_model()
        load_shared(model, content)
        head = self.kept.load("head")
        if head is not None:
            load_record(model, head)
        return model

    def local_training(self, model: nn.Module) -> dict[str, float]:
        return self.fit(model)

    def train(self, content: RecordDict) -> RecordDict:
        model = self._model(content)
        metrics = self.local_training(model)
        self.kept.save("head", model.state_dict(), self.head_keys(model))
        _, acc = self.test(model)
        return self.reply(
            {**self.base_metrics(), **metrics, "trained-acc": acc}, model_to_record(model, self.body_keys(model))
        )

    def personal_model(self, content: RecordDict) -> nn.Module:
        return self._model(content)

    def head_epochs(self) -> int:
        """Epochs a newcomer fits its own head for: the run's ``local-epochs`` (FedRep: its ``head-epochs``)."""
        return self.settings.local_epochs

    def newcomer_model(self, content: RecordDict) -> nn.Module:
        """A newcomer has no head of its own: the global body under a head fitted on its training split with the body
        frozen, for :meth:`head_epochs` (from the common initial head; nothing is kept)."""
        model = self.reset_model()
        load_shared(model, content)
        self.fit(model, epochs=self.head_epochs(), params=parameters_of(model, self.head_keys(model)))
        return model


class FedRepClient(FedPerClient):
    """FedRep: ``head-epochs`` on the head with the body frozen, then ``local-epochs`` on the body."""

    options: FedRepOptions  # the run-config keys of this method, typed

    def local_training(self, model: nn.Module) -> dict[str, float]:
        head_params = [p for n, p in model.named_parameters() if n.startswith("head.")]
        body_params = [p for n, p in model.named_parameters() if not n.startswith("head.")]
        self.fit(model, epochs=self.options.head_epochs, params=head_params)
        return self.fit(model, params=body_params)

    def head_epochs(self) -> int:
        return self.options.head_epochs


def balanced_softmax_loss(class_counts: torch.Tensor):
    """FedRoD's balanced softmax: cross-entropy on logits shifted by the log of the local label counts."""
    log_prior = torch.log(class_counts.float().clamp_min(1e-8))

    def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits + log_prior.to(logits.device), y)

    return loss


class _RoDModel(nn.Module):
    """Generic model + personal head; ``forward`` gives generic logits and remembers the features."""

    def __init__(self, base: SplitModel, num_classes: int) -> None:
        super().__init__()
        self.base = base
        self.phead = nn.Linear(base.feature_dim, num_classes).to(next(base.parameters()).device)
        nn.init.zeros_(self.phead.weight)
        nn.init.zeros_(self.phead.bias)
        self.last_features: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.base.features(x)
        self.last_features = z
        return self.base.head(z)

    def personalized(self, x: torch.Tensor) -> torch.Tensor:
        z = self.base.features(x)
        return self.base.head(z) + self.phead(z)


class FedRoDClient(ClientMethod):
    """FedRoD: body + generic head trained with balanced softmax and shared; personal head trained with CE on
    generic + personal logits (gradients only into the personal head), kept in ``context.state['phead']``."""

    keeps: ClassVar[Mapping[str, str]] = {"phead": "the personal head's weight and bias"}

    def _model(self, content: RecordDict) -> _RoDModel:
        rod = _RoDModel(self.reset_model(), self.settings.num_classes)
        load_shared(rod.base, content)
        own = self.kept.load("phead")
        if own is not None:
            rod.phead.load_state_dict({k: torch.from_numpy(v) for k, v in own.items()})
        return rod

    def train(self, content: RecordDict) -> RecordDict:
        rod = self._model(content)
        counts = torch.from_numpy(np.bincount(self.data.y_train.numpy(), minlength=self.settings.num_classes))

        def personal_head_loss(model: nn.Module, x, y, logits):
            if rod.last_features is None:
                raise RuntimeError("FedRoD's personal-head loss runs before a forward pass recorded the features")
            z = rod.last_features.detach()
            return nn.functional.cross_entropy(logits.detach() + rod.phead(z), y)

        metrics = self.fit(
            rod, forward=rod.forward, loss_fn=balanced_softmax_loss(counts), extra_loss=personal_head_loss
        )
        self.kept.save("phead", rod.phead.state_dict())
        _, acc = self.test(rod, forward=rod.personalized)
        return self.reply({**self.base_metrics(), **metrics, "trained-acc": acc}, model_to_record(rod.base))

    def personal_model(self, content: RecordDict) -> nn.Module:
        """The generic model with the personal head folded into its head: head(z) + phead(z) = (W + P) z + (b + c),
        so the personalized model is one plain network (and is saved as one)."""
        rod = self._model(content)
        with torch.no_grad():
            rod.base.head.weight.add_(rod.phead.weight)
            rod.base.head.bias.add_(rod.phead.bias)
        return rod.base

    def global_model(self, content: RecordDict, personal: nn.Module) -> nn.Module | None:
        return self._model(content).base  # the generic model (balanced softmax head)


class DittoClient(ClientMethod):
    """Ditto: train the global model as FedAvg, and the personal model v (``context.state['personal']``) for
    ``ditto-epochs`` on loss + ``ditto-lambda``/2 ||v - w_global||^2."""

    options: DittoOptions  # the run-config keys of this method, typed

    keeps: ClassVar[Mapping[str, str]] = {"personal": "the personal model v (BatchNorm statistics included)"}

    def _personal(self, global_model: nn.Module) -> nn.Module:
        personal = _clone(global_model)
        own = self.kept.load("personal")
        if own is not None:
            load_record(personal, own)
        return personal

    def train(self, content: RecordDict) -> RecordDict:
        model = self.reset_model()
        load_shared(model, content)
        lam = self.options.ditto_lambda
        personal = self._personal(model)
        reference = {k: p.detach().clone() for k, p in model.named_parameters()}
        self.fit(personal, epochs=self.options.ditto_epochs, extra_loss=proximal_term(reference, lam))
        self.kept.save("personal", personal.state_dict())
        metrics = self.fit(model)
        _, acc = self.test(personal)
        return self.reply({**self.base_metrics(), **metrics, "trained-acc": acc}, model_to_record(model))

    def personal_model(self, content: RecordDict) -> nn.Module:
        model = self.reset_model()
        load_shared(model, content)
        return self._personal(model)  # a copy: the global model below reuses the process's network

    def global_model(self, content: RecordDict, personal: nn.Module) -> nn.Module | None:
        model = self.reset_model()
        load_shared(model, content)
        return model


def _clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


class ClusterModelClient(FedAvgClient):
    """Trains the model it is sent like FedAvg; that model is the client's cluster model (CFL), so it is
    reported as the personalized accuracy only."""

    def global_model(self, content: RecordDict, personal: nn.Module) -> nn.Module | None:
        return None

    def newcomer_model(self, content: RecordDict) -> nn.Module:
        """A newcomer belongs to no cluster yet: of the cluster models the message stacks (``tiers``), the one with the
        lowest loss on its validation split (its training split without one)."""
        return lowest_loss_model(self, content)


# ---------------------------------------------------------------------------------------------- MOON
def moon_loss(z: torch.Tensor, z_global: torch.Tensor, z_prev: torch.Tensor, temperature: float = 0.5) -> torch.Tensor:
    """MOON's model-contrastive loss: -log e^{cos(z,z_g)/T} / (e^{cos(z,z_g)/T} + e^{cos(z,z_prev)/T})."""
    pos = nn.functional.cosine_similarity(z, z_global.detach(), dim=1) / temperature
    neg = nn.functional.cosine_similarity(z, z_prev.detach(), dim=1) / temperature
    return (torch.logsumexp(torch.stack([pos, neg], 1), dim=1) - pos).mean()


def moon_term(model: SplitModel, feats: dict, previous: dict | None, mu: float, temperature: float):
    """``term(x, logits)``: mu times MOON's loss of this batch's features ``feats["z"]`` (set by the forward
    hook) against the round's global model (a frozen copy of ``model`` as it starts) and the client's previous
    local model (``previous``, its state; the global model when there is none yet)."""
    global_model = copy.deepcopy(model).eval()
    prev_model = copy.deepcopy(model).eval()
    if previous is not None:
        load_record(prev_model, previous)
    for p in list(global_model.parameters()) + list(prev_model.parameters()):
        p.requires_grad_(False)

    def term(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            zg, zp = global_model.features(x), prev_model.features(x)
        return mu * moon_loss(feats["z"], zg, zp, temperature)

    return term


class MoonClient(FedAvgClient):
    """MOON (Li et al.): FedAvg plus the model-contrastive loss; the last local model stays on the node
    (``context.state['moon-prev']``)."""

    options: MoonOptions  # the run-config keys of this method, typed

    keeps: ClassVar[Mapping[str, str]] = {
        "moon-prev": "the model after the client's last local training (MOON's negative)"
    }

    def train(self, content: RecordDict) -> RecordDict:
        model = self.reset_model()
        load_shared(model, content)
        feats: dict = {}

        def forward(x: torch.Tensor) -> torch.Tensor:
            feats["z"] = model.features(x)
            return model.head(feats["z"])

        term = moon_term(model, feats, self.kept.load("moon-prev"), self.options.moon_mu, self.options.moon_temperature)
        metrics = self.fit(model, forward=forward, extra_loss=lambda m, x, y, logits: term(x, logits))
        self.kept.save("moon-prev", model.state_dict())
        _, trained_acc = self.test(model)
        return self.reply({**self.base_metrics(), **metrics, "trained-acc": trained_acc}, model_to_record(model))
