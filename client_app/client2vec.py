"""Client side of Client2Vec (client2vec.md §2.1-2.8, docs/methods/client2vec.md) on its base algorithm (FedAvg,
FedProx or MOON).

Queries of the one-off index phase:

- ``query.c2v_embed`` (Global mode): CLIP-encode the training split once (cached on disk) and upload one
  random batch of ``c2v-ign-upload`` (D, L) pairs;
- ``query.c2v_ign`` (Federated mode): ``c2v-ign-local-epochs`` of the DSA-IGN loss on all local pairs;
- ``query.c2v_index``: run the received DSA-IGN on all local embeddings and upload the index halves
  beta_f (mean U) and beta_l (mean label embedding).

``train`` is the base algorithm's local update (``c2v-base``), plus case study (iii) when the message
carries every client's feature index (``c2v``/``B_f``): the projection P and classifier h_P travel with
the model under ``c2v.*`` keys.  ``evaluate`` tests the global model (main head only).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client_app.base import SAME_AS_PERSONAL, ClientMethod
from client_app.baselines import moon_term
from client_app.client2vec_math import local_regulariser
from task.clip import DeferredEncoder, cached_embeddings, class_names
from task.dsa_ign import build_ign, client_index, train_dsa_ign
from task.methods.client2vec import AUX_PREFIX, Client2VecOptions, build_aux
from task.params import load_record, record_to_numpy, to_record
from task.train import proximal_term


class Client2VecClient(ClientMethod):
    """Base algorithm (``c2v-base``) + the Client2Vec queries; see module docstring."""

    keeps: ClassVar[Mapping[str, str]] = {
        "moon-prev": "c2v-base 'moon': the model after the client's last local training"
    }

    options: Client2VecOptions

    @property
    def opts(self) -> Client2VecOptions:
        return self.options

    # ------------------------------------------------------------------ index phase
    def embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """(D, L) of the training split: CLIP image embeddings and label-prompt embeddings, cached on disk (the
        encoder is only built on a cache miss)."""
        o = self.opts
        with self.timed("method"):
            encoder = DeferredEncoder(o.encoder, o.clip_model, o.clip_weights, o.normalize, int(self.settings.seed))
            names = class_names(self.settings.data.dataset, self.settings.num_classes)
            key = f"{self.settings.data!r}|{self.partition_id}/{self.num_partitions}"
            if "data-path" in self.data.meta:  # a node's own file: key on its path and modification time
                f = Path(self.data.meta["data-path"])
                key += f"|{f}|{f.stat().st_mtime_ns}"
            D, L, _ = cached_embeddings(encoder, key, self.data.x_train, self.data.y_train, names, o.cache_dir or None)
        return D, L

    def _ign(self, content: RecordDict):
        net = build_ign(self.opts.ign, int(self.settings.seed))
        rec = self.message_arrays(content, "ign")
        if rec is None:
            raise ValueError("the message carries no DSA-IGN weights ('ign' ArrayRecord)")
        load_record(net, rec, strict_keys=True)
        return net

    def query(self, name: str, content: RecordDict) -> RecordDict:
        if name == "c2v_embed":
            D, L = self.embeddings()
            rng = np.random.default_rng(self.seed)
            take = np.sort(rng.choice(len(D), size=min(self.opts.ign_upload, len(D)), replace=False))
            return self.reply(self.base_metrics(), to_record({"D": D[take], "L": L[take]}))
        if name == "c2v_ign":
            D, L = self.embeddings()
            net = self._ign(content)
            with self.timed("method"):
                hist = train_dsa_ign(
                    net,
                    D,
                    L,
                    epochs=self.opts.ign_local_epochs,
                    batch_size=self.opts.ign_batch,
                    lr=self.opts.ign_lr,
                    seed=self.seed + self.server_round,
                    orth_mode=self.opts.orth_mode,
                )
            return self.reply(
                {**self.base_metrics(), "ign-loss": hist[-1]["total"] if hist else 0.0}, to_record(net.state_dict())
            )
        if name == "c2v_index":
            D, L = self.embeddings()
            net = self._ign(content)
            with self.timed("method"):
                beta_f, beta_l = client_index(net, D, L)
            return self.reply(self.base_metrics(), to_record({"beta_f": beta_f, "beta_l": beta_l}))
        return super().query(name, content)

    # ------------------------------------------------------------------ federated training
    def _split_arrays(self, content: RecordDict) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        rec = self.message_arrays(content)
        arrays = record_to_numpy(rec) if rec is not None else {}
        model = {k: v for k, v in arrays.items() if not k.startswith(AUX_PREFIX)}
        aux = {k[len(AUX_PREFIX) :]: v for k, v in arrays.items() if k.startswith(AUX_PREFIX)}
        return model, aux

    def train(self, content: RecordDict) -> RecordDict:
        model = self.reset_model()
        model_arrays, aux_arrays = self._split_arrays(content)
        load_record(model, model_arrays)
        terms, feats = [], {}
        params = list(model.parameters())

        def forward(x: torch.Tensor) -> torch.Tensor:
            z = model.features(x)
            feats["z"] = z
            return model.head(z)

        if self.opts.base == "fedprox":
            prox = proximal_term({k: p.detach().clone() for k, p in model.named_parameters()}, self.opts.proximal_mu)
            # the proximal term reads no batch: there are no labels to give it here
            terms.append(lambda x, logits: prox(model, x, None, logits))  # type: ignore[arg-type]
        elif self.opts.base == "moon":
            terms.append(
                moon_term(model, feats, self.kept.load("moon-prev"), self.opts.moon_mu, self.opts.moon_temperature)
            )
        aux = None
        if "c2v" in content.array_records:
            beta = torch.as_tensor(content.array_records["c2v"]["B_f"].numpy(), dtype=torch.float32)
            aux = build_aux(model.feature_dim, beta.shape[1], self.settings.num_classes, int(self.settings.seed))
            if aux_arrays:
                load_record(aux, aux_arrays, strict_keys=True)
            params += list(aux.parameters())
            w, o = self.opts.local_weight, self.opts
            terms.append(
                lambda x, logits: (
                    w
                    * local_regulariser(
                        feats["z"],
                        logits,
                        aux,
                        beta,
                        normalize=o.orth_normalize,
                        mean_over_clients=o.orth_mean_over_clients,
                        detach_distill=o.dist_detach,
                    )
                )
            )

        def extra_loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor):
            return sum(t(x, logits) for t in terms)

        metrics = self.fit(model, forward=forward, params=params, extra_loss=extra_loss if terms else None)
        if self.opts.base == "moon":
            self.kept.save("moon-prev", model.state_dict())
        _, trained_acc = self.test(model)
        state: dict[str, Any] = dict(model.state_dict())
        if aux is not None:
            state.update(aux.state_with_prefix())
        return self.reply({**self.base_metrics(), **metrics, "trained-acc": trained_acc}, to_record(state))

    def personal_model(self, content: RecordDict) -> nn.Module:
        """The global model (main head; P and h_P only shape training)."""
        model = self.reset_model()
        load_record(model, self._split_arrays(content)[0])
        return model

    def global_model(self, content: RecordDict, personal: nn.Module):
        return SAME_AS_PERSONAL
