"""FedSoft client: importance weights u (share of points each centre fits best) and the proximal update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.base import ClientMethod
from task.methods.pifl import FedSoftOptions
from task.params import load_record, model_at, model_to_record, stacked_tensors
from task.train import proximal_term

SIGMA = 1e-4  # FedSoft's smoother: every centre keeps a tiny share


def importance_weights(losses: np.ndarray, sigma: float = SIGMA) -> np.ndarray:
    """u_s = share of points whose lowest-loss centre is s, floored at sigma and renormalised.

    ``losses`` is (centres, points)."""
    k, n = losses.shape
    share = np.bincount(losses.argmin(0), minlength=k) / max(n, 1)
    u = np.maximum(share, sigma)
    return u / u.sum()


class FedSoftClient(ClientMethod):
    options: FedSoftOptions  # the run-config keys of this method, typed

    keeps: ClassVar[Mapping[str, str]] = {"model": "the client's own model, trained towards the centres it is close to"}

    def _centres(self, content: RecordDict) -> dict[str, torch.Tensor]:
        return stacked_tensors(content.array_records["tiers"], self.device)

    def _u(self, content: RecordDict, k: int) -> np.ndarray:
        soft = dict(content.config_records["fedsoft"]) if "fedsoft" in content.config_records else {}
        u = np.asarray(soft.get("u", np.full(k, 1.0 / k)), dtype=float)
        if u.shape != (k,) or (u < 0).any() or u.sum() <= 0:
            raise ValueError(f"importance weights must be {k} non-negative values, got {u.tolist()}")
        return u / u.sum()

    def _mixed(self, centres: dict[str, torch.Tensor], u: np.ndarray) -> dict[str, torch.Tensor]:
        w = torch.as_tensor(u, dtype=torch.float64)
        return {
            k: (torch.tensordot(w, v.double(), dims=1).to(v.dtype) if v.is_floating_point() else v[int(u.argmax())])
            for k, v in centres.items()
        }

    def query(self, name: str, content: RecordDict) -> RecordDict:
        if name != "fedsoft_u":
            return super().query(name, content)
        u = self._importance(self._centres(content))
        return self.reply({**self.base_metrics(), "fedsoft-u": [float(x) for x in u]})

    def _importance(self, centres: dict[str, torch.Tensor]) -> np.ndarray:
        """This client's importance weights over ``centres``: the share of its training points each fits best."""
        model = self.reset_model()
        model.eval()
        k = next(iter(centres.values())).shape[0]
        with self.timed("method"), torch.no_grad():
            losses = []
            for s in range(k):
                model.load_state_dict(model_at(centres, s))
                logits = model(self.data.x_train)
                losses.append(torch.nn.functional.cross_entropy(logits, self.data.y_train, reduction="none").numpy())
            return importance_weights(np.stack(losses))

    def _model(self, content: RecordDict) -> tuple[torch.nn.Module, dict[str, torch.Tensor], np.ndarray]:
        centres = self._centres(content)
        u = self._u(content, next(iter(centres.values())).shape[0])
        model = self.reset_model()
        own = self.kept.load("model")
        model.load_state_dict(self._mixed(centres, u)) if own is None else load_record(model, own)
        return model, centres, u

    def train(self, content: RecordDict) -> RecordDict:
        model, centres, u = self._model(content)
        lam = self.options.lam
        # lambda/2 sum_s u_s ||w - c_s||^2 = lambda/2 ||w - sum_s u_s c_s||^2 + const (sum_s u_s = 1)
        reference = {k: v for k, v in self._mixed(centres, u).items() if v.is_floating_point()}
        names = {n for n, _ in model.named_parameters()}
        metrics = self.fit(model, extra_loss=proximal_term({k: v for k, v in reference.items() if k in names}, lam))
        self.kept.save("model", model.state_dict())
        _, acc = self.test(model)
        return self.reply({**self.base_metrics(), **metrics, "trained-acc": acc}, model_to_record(model))

    def personal_model(self, content: RecordDict) -> torch.nn.Module:
        """This client's own model (the u-weighted mix of the centres before it first trains)."""
        return self._model(content)[0]

    def newcomer_model(self, content: RecordDict) -> torch.nn.Module:
        """What a client starts from before it first trains: the mix of the centres weighted by its own importance
        weights, estimated on its training split as ``query.fedsoft_u`` does (the server knows none for a newcomer)."""
        centres = self._centres(content)
        model = self.reset_model()
        model.load_state_dict(self._mixed(centres, self._importance(centres)))
        return model
