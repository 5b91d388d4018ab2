"""FedC2I client (fedc2i.md §2.2, §2.5): leave-one-out influence on one batch, personalized mixing of the
received models, local training, reply with the trained model and the influence vector.

Under ``dp-mode='local'`` the reply's model is released against the client's own previous release, which the
server sends back first in ``peers`` (the common initial model in round 1): docs/privacy.md says why that reference.
The client keeps the model it trained at home (state ``model``): peers and the server see only its noised releases,
while its own next mixing and its personalized model use what it trained (its own data costs it no privacy).

See docs/methods/fedc2i.md; its last section says where each section number cited here is explained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.base import ClientMethod
from client_app.fedc2i_math import influence_matrix, influence_vector, mix_classifier, mix_states
from task.methods.fedc2i import FedC2IOptions
from task.models import SplitModel
from task.params import load_record, model_at, model_to_record, record_to_numpy, stacked_tensors


class FedC2IClient(ClientMethod):
    options: FedC2IOptions  # the run-config keys of this method, typed
    keeps: ClassVar[Mapping[str, str]] = {
        "model": "under dp-mode='local' only: the model this client trained last, before its noised release (its "
        "own in the next mixing and its personalized model; peers see only the release)"
    }

    def _home(self) -> dict[str, np.ndarray] | None:
        """Under local DP, the model this client trained last, kept at home; None otherwise (or before round 1)."""
        return self.kept.load("model") if self.settings.dp_mode == "local" else None

    def _personalized(self, model: SplitModel, stacked: dict[str, torch.Tensor], sizes: list[int]) -> list[float]:
        """Load the personalized model (Eqs. 5-10, variant per ``c2i-variant``) into ``model``; returns lambda.

        ``stacked`` holds the k models the server sent, this client's own first; ``sizes`` their clients'
        training-set sizes (the averaged-extractor ablation averages the extractors by size, fedc2i.md §6.18).
        """
        k = next(iter(stacked.values())).shape[0]
        own = {name: v[0] for name, v in stacked.items()}  # the receiver's own model comes first
        model.load_state_dict(own)
        if k == 1:
            return [1.0]
        gamma, variant = self.options.gamma, self.options.variant
        heads = self.head_keys(model)
        bodies = list(self.body_keys(model))
        gen = torch.Generator().manual_seed(self.seed + 104_729 * self.server_round)
        size = min(self.options.influence_batch_size, len(self.data.y_train))
        idx = torch.randperm(len(self.data.y_train), generator=gen)[:size]
        x, y = self.data.x_train[idx].to(self.device), self.data.y_train[idx].to(self.device)
        lam, _ = influence_vector(model, stacked, {h: own[h] for h in heads}, x, y, gamma, heads)
        if variant == "client-level":  # whole model mixed by the client-level weights (fedc2i.md §6.18)
            model.load_state_dict({**own, **mix_states(stacked, lam, list(stacked))})
            return lam.tolist()
        if variant == "full":
            body = mix_states(stacked, lam, bodies)
        elif variant == "class-level-averaged-extractor":  # "Lambda/g": the size-weighted FedAvg extractor (§6.18)
            w = torch.tensor(sizes, dtype=torch.float64)
            body = mix_states(stacked, w / w.sum(), bodies)
        else:  # "class-level-own-extractor" ("Lambda/l")
            body = {n: own[n] for n in bodies}
        # the extractor theta* for the class-level test (fedc2i.md §6.7): the client's own, except for the Lambda/g
        # ablation, which uses the current global theta
        if variant == "class-level-averaged-extractor":
            model.load_state_dict({**own, **body})
        with torch.no_grad():
            model.eval()
            feats = model.features(x)
            big_lambda, _ = influence_matrix(
                feats, y, own["head.weight"], own["head.bias"], stacked["head.weight"], stacked["head.bias"], gamma
            )
            w, b = mix_classifier(stacked["head.weight"], stacked["head.bias"], big_lambda)
        model.load_state_dict({**own, **body, "head.weight": w, "head.bias": b})
        return lam.tolist()

    def _mix_sent(self, model: SplitModel, content: RecordDict) -> list[float]:
        """Load into ``model`` the personalized mix of the models a message stacks in ``peers`` (its own first; under
        local DP the one it kept at home instead of its release); returns lambda (nothing sent: the model as it is)."""
        rec = self.message_arrays(content, "peers")
        if rec is None:
            return []
        stacked = stacked_tensors(rec, self.device)
        if (home := self._home()) is not None:  # its own un-noised model, not its release, is first
            stacked = {n: torch.cat([torch.as_tensor(home[n]).to(v)[None], v[1:]]) for n, v in stacked.items()}
        peers = content.config_records.get("peer-clients")
        peer_sizes = peers.get("num-examples", []) if peers else []
        if not isinstance(peer_sizes, list):
            raise ValueError(f"'peer-clients' needs a list 'num-examples', got {peer_sizes!r}")
        sizes = [self.data.num_train, *(int(n) for n in peer_sizes)]
        with self.timed("method"):
            return self._personalized(model, stacked, sizes)

    def train(self, content: RecordDict) -> RecordDict:
        model = self.reset_model()
        lam = self._mix_sent(model, content)
        metrics = self.fit(model)
        if self.settings.dp_mode == "local":
            self.kept.save("model", model.state_dict())
        _, acc = self.test(model)
        return self.reply(
            {**self.base_metrics(), **metrics, "trained-acc": acc, "influence": [float(v) for v in lam]},
            model_to_record(model),
        )

    def release_reference(self, content: RecordDict) -> dict[str, np.ndarray]:
        """The client's own previous release: the first of the models a train message stacks (docs/privacy.md).

        It is what the server stored from this client's last reply (its last noised release, or the common initial
        model before the first), so it depends on the client's data only through what the client already released.
        """
        peers = self.message_arrays(content, "peers")
        if peers is None:
            raise ValueError("local DP releases FedC2I's model against the client's own, first in 'peers': none came")
        return {k: v[0] for k, v in record_to_numpy(peers).items()}

    def newcomer_model(self, content: RecordDict) -> torch.nn.Module:
        """A newcomer computes what a client computes before its first training: the influence-weighted mix (Eqs. 5-10)
        of the stored models the message stacks in ``peers``, its own (the common initial model) first."""
        model = self.reset_model()
        self._mix_sent(model, content)
        return model

    def personal_model(self, content: RecordDict) -> torch.nn.Module:
        """This client's own latest model (fedc2i.md §6.12): under local DP the one it kept at home, else ``arrays``
        of an evaluate message, or the first of the models a train message stacks."""
        model = self.reset_model()
        rec = self.message_arrays(content)
        if (home := self._home()) is not None:
            model.load_state_dict({k: torch.as_tensor(v) for k, v in home.items()})
        elif rec is not None:
            load_record(model, rec)
        elif (peers := self.message_arrays(content, "peers")) is not None:
            model.load_state_dict(model_at(stacked_tensors(peers, self.device), 0))
        return model
