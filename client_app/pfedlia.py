"""pFedLIA client (pfedlia.md §2.4, §2.5): FedAvg-style training of the model it is sent, lazy training of
the warm-up model, and its row of the lazy-influence matrix (plus its beneficial peers, peer-to-peer).

Under ``dp-mode='local'`` every model that leaves the client is a local release around the model the message
brought (``release_reference``): a train reply's around the server's (cluster) average it started from, the lazy
model (``query.lazy``, shown to every peer) around the warm-up model theta_0.  The client keeps nothing at home: its
personalized model is the (cluster) model the server sends, as without DP, and its influence row scores every lazy
model as its peers see it, its own release included (docs/privacy.md, "Local DP in pFedLIA").

See docs/methods/pfedlia.md; its last section says where each section number cited here is explained."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.base import SAME_AS_PERSONAL, ClientMethod, MetricValue, load_shared
from client_app.pfedlia_math import beneficial_peers, lazy_influence_row
from task.methods.pfedlia import PFedLIAOptions
from task.params import model_to_record, record_to_numpy, stacked_tensors
from task.train import batched_losses, evaluate


class PFedLIAClient(ClientMethod):
    options: PFedLIAOptions  # the run-config keys of this method, typed
    released_queries: ClassVar[tuple[str, ...]] = ("lazy",)  # the lazy model is shown to every peer

    def _extra(self) -> dict:
        planted = self.data.meta.get("planted-cluster")
        return {"planted-cluster": int(planted)} if planted is not None else {}

    def train(self, content: RecordDict) -> RecordDict:
        model = self.reset_model()
        load_shared(model, content)
        metrics = self.fit(model)
        _, acc = self.test(model)
        return self.reply(
            {**self.base_metrics(), **metrics, "trained-acc": acc, **self._extra()}, model_to_record(model)
        )

    def global_model(self, content: RecordDict, personal: torch.nn.Module):
        """During the warm-up every client has the one global model (the config says which state the evaluated
        model is from: a train message's evaluation is of the previous round's model)."""
        key = "evaluated-clustered" if self.config.get("evaluate") else "clustered"
        return None if bool(self.config.get(key, True)) else SAME_AS_PERSONAL

    def release_reference(self, content: RecordDict) -> dict[str, np.ndarray]:
        """The model the message brought (``arrays``): a train message's (cluster) average, which the server built
        from releases only, or the lazy query's warm-up model theta_0 (docs/privacy.md, "Local DP in pFedLIA")."""
        rec = self.message_arrays(content)
        if rec is None:
            raise ValueError("local DP releases pFedLIA's model against the model the message brought: it had none")
        return record_to_numpy(rec)

    def query(self, name: str, content: RecordDict) -> RecordDict:
        if name == "identify":  # the Oracle baseline learns the planted group from it (simulation data only)
            return self.reply({**self.base_metrics(), **self._extra()})
        if name == "lazy":
            return self.lazy(content)
        if name == "lia":
            return self.influence_row(content)
        return super().query(name, content)

    def lazy(self, content: RecordDict) -> RecordDict:
        """Train a copy of the warm-up model for ``lazy-epochs`` epochs (not to convergence) and return it."""
        model = self.reset_model()
        load_shared(model, content)
        self.fit(model, epochs=self.options.lazy_epochs, phase="method")
        return self.reply(self.base_metrics(), model_to_record(model))

    def influence_row(self, content: RecordDict) -> RecordDict:
        """Eq. 1 on this client's validation split for every lazy model (one vmapped evaluation)."""
        if len(self.data.y_val) == 0:
            raise ValueError("pFedLIA scores on the validation split: set run-config 'val-fraction' > 0")
        model = self.reset_model()
        load_shared(model, content)
        with self.timed("method"):
            x, y = self.data.x_val.to(self.device), self.data.y_val.to(self.device)
            loss0, _ = evaluate(model, x, y)
            stacked = stacked_tensors(content.array_records["lazy"], self.device)
            losses = batched_losses(model, stacked, x, y)
            row = lazy_influence_row(loss0, losses, len(y), self.options.reduction)
            lazy_clients = content.config_records.get("lazy-clients")
            self_index = lazy_clients.get("self-index", -1) if lazy_clients else -1
            if isinstance(self_index, bool) or not isinstance(self_index, int):  # a bool is no index
                raise ValueError(
                    f"the influence query's 'lazy-clients' needs an integer 'self-index', got {self_index!r}"
                )
            extra: dict[str, MetricValue] = {}
            if self.options.mode == "p2p":
                positive = self.options.p2p_require_positive
                if self_index < 0:  # a late joiner: not among the lazy models; compare against all of them
                    peers = beneficial_peers(
                        np.append(row, -np.inf), len(row), seed=self.seed, require_positive=positive
                    )[:-1]
                else:
                    peers = beneficial_peers(row, self_index, seed=self.seed, require_positive=positive)
                extra["beneficial"] = [int(p) for p in peers]
        # the metrics after the timed block, so that they carry its time-method
        return self.reply({**self.base_metrics(), "lia-row": [float(v) for v in row], **extra})
