"""PI-FL client (pifl.md §2.2): scores every tier model, bids, trains the tier it won, and builds its
one-shot personalized model from the tier models weighted by their accuracy on its own goal data; that
model never leaves the client.

See docs/methods/pifl.md; its last section says where each section number cited here is explained."""

from __future__ import annotations

import random

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.base import ClientMethod, load_shared
from task.methods.pifl import PIFLOptions, bid_policy, mixture_weights, personal_weights
from task.params import model_at, model_to_record, stacked_tensors
from task.train import evaluate


class PIFLClient(ClientMethod):
    options: PIFLOptions  # the run-config keys of this method, typed

    def _tiers(self, content: RecordDict) -> dict[str, torch.Tensor]:
        return stacked_tensors(content.array_records["tiers"], self.device)

    def _tier_accuracies(self, tiers: dict[str, torch.Tensor], x, y) -> list[float]:
        num = next(iter(tiers.values())).shape[0]
        model = self.reset_model()
        accs = []
        for t in range(num):
            model.load_state_dict(model_at(tiers, t))
            accs.append(evaluate(model, x, y)[1])
        return accs

    def _extra(self) -> dict:
        share = self.data.meta.get("source-a-share")
        return {"source-a-share": float(share)} if share is not None else {}

    def query(self, name: str, content: RecordDict) -> RecordDict:
        if name != "bid":
            return super().query(name, content)
        with self.timed("method"):
            accs = self._tier_accuracies(self._tiers(content), self.data.x_val, self.data.y_val)
            ledger = content.config_records.get("ledger")
            balance, price = (ledger.get("balance", 0), ledger.get("price", 1)) if ledger else (0, 1)
            if (
                isinstance(balance, bool)  # a bool is no amount
                or isinstance(price, bool)
                or not isinstance(balance, int)
                or not isinstance(price, int)
            ):
                raise ValueError(f"the bid query's 'ledger' needs integer 'balance' and 'price', got {ledger}")
            if self.options.incentive:
                bid = bid_policy(accs, balance, price, self.options.bid_threshold, self.options.max_bids)
            else:  # PI-FL(NI): one tier uniformly at random
                rng = random.Random(self.seed * 31 + self.server_round)
                bid = [rng.randrange(len(accs))] if balance >= price else []
        return self.reply({**self.base_metrics(), "tier-acc": accs, "bid": bid})

    def train(self, content: RecordDict) -> RecordDict:
        model = self.reset_model()
        load_shared(model, content)
        metrics = self.fit(model)
        return self.reply({**self.base_metrics(), **metrics, **self._extra()}, model_to_record(model))

    def goal_splits(self) -> tuple[tuple, tuple]:
        """(calibration, held-out) goal data (pifl.md §2.2 step 3).  The held-out part is the test split every method
        is scored on, except on a node's own data file:

        - two-source partitions: the goal set's calibration half and its held-out half (the test split);
        - a node's own data file (node config ``data-path``): its test data may follow another distribution than
          its training data, so it is halved, the first half calibrates;
        - every other partition of the embedded data: the test split follows the client's own distribution, so the
          validation split is goal data too; it calibrates, and the whole test split is scored, as for every
          other method (halving it would score PI-FL on half the data the others are scored on).
        """
        d = self.data
        if d.x_calib is not None:
            return (d.x_calib, d.y_calib), (d.x_test, d.y_test)
        if "data-path" in d.meta:
            half = len(d.y_test) // 2
            return (d.x_test[:half], d.y_test[:half]), (d.x_test[half:], d.y_test[half:])
        return (d.x_val, d.y_val), (d.x_test, d.y_test)

    def test_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.goal_splits()[1]

    def personal_model(self, content: RecordDict) -> torch.nn.Module:
        """The one-shot personalized model (Eq. 4): the tier models weighted by :meth:`personal_mixture`; it never
        leaves the client."""
        tiers = self._tiers(content)
        return self._mixed(tiers, self.personal_mixture(tiers))

    def personal_mixture(self, tiers: dict[str, torch.Tensor]) -> np.ndarray:
        """The personalized model's weights over the tier models: their accuracy on the calibration part of this
        client's goal data (goal_splits).  With ``pifl-personal='choose'`` the client keeps its single most accurate
        tier instead where that tier scores higher than the mixture on the same calibration data
        (:func:`task.methods.pifl.personal_weights`)."""
        calibration = self.goal_splits()[0]
        with self.timed("method"):
            accuracies = self._tier_accuracies(tiers, *calibration)
            weights = mixture_weights(accuracies)
            if self.options.personal == "choose":
                return personal_weights(accuracies, evaluate(self._mixed(tiers, weights), *calibration)[1])
        return weights

    def _mixed(self, tiers: dict[str, torch.Tensor], weights: np.ndarray) -> torch.nn.Module:
        """sum_k weights_k * tier_k for floating-point entries; integer buffers (BatchNorm's counters) from tier 0."""
        w = torch.from_numpy(np.asarray(weights)).float()
        model = self.reset_model()
        model.load_state_dict(
            {
                k: (torch.tensordot(w.to(v.dtype), v, dims=1) if v.is_floating_point() else v[0])
                for k, v in tiers.items()
            }
        )
        return model

    def evaluation_extras(self, content: RecordDict, personal: torch.nn.Module) -> dict:
        """Every tier's accuracy on the validation split (the tiers' utility, for the settlement) and on the
        held-out goal data, and the mixture's weights."""
        tiers = self._tiers(content)
        return {
            "tier-acc": self._tier_accuracies(tiers, self.data.x_val, self.data.y_val),
            "tier-goal-acc": self._tier_accuracies(tiers, *self.goal_splits()[1]),
            "mixture-weights": [float(w) for w in self.personal_mixture(tiers)],
            **self._extra(),
        }
