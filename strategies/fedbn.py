"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization"): every client keeps its normalisation layers (BatchNorm weight, bias, running mean and variance
and ``num_batches_tracked``; the model registry's ``norm_keys``), and the server averages everything else by
training examples, as FedAvg does.

The server holds no model that a client uses as it is (every client puts its own normalisation layers into the
average), so there is no global accuracy; the client side is ``client_app/fedbn.py``.  See docs/methods/fedbn.md.
"""

from __future__ import annotations

from strategies.api import PersonalizedStrategy


class FedBNStrategy(PersonalizedStrategy):
    """Aggregates and sends every key but the normalisation layers': ``w <- sum_i n_i w_i / sum_i n_i`` over the
    round's valid replies (the base's example-weighted average of the shared keys).  Nothing of its own to
    checkpoint: the base saves the average."""

    has_global_model = False

    def shared_keys(self) -> list[str]:
        local = set(self.model_info.norm_keys)
        return [k for k in self.model_info.keys if k not in local]
