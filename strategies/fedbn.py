"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization"): every client keeps its normalisation layers (BatchNorm weight, bias, running mean and variance
and ``num_batches_tracked``; see ``task.models.norm_keys``), and the server averages everything else by training
examples, as FedAvg does.

The server holds no model that a client uses as it is (every client puts its own normalisation layers into the
average), so there is no global accuracy; the client side is ``client_app/fedbn.py``.  See docs/methods/fedbn.md.
"""

from __future__ import annotations

from strategies.base import PersonalizedStrategy
from task.models import model_norm_keys


class FedBNStrategy(PersonalizedStrategy):
    """Aggregates and sends every key but the normalisation layers': ``w <- sum_i n_i w_i / sum_i n_i`` over the
    round's valid replies (the base's example-weighted average of the shared keys)."""

    has_global_model = False
    #: the normalisation-layer keys follow from the settings: not part of a checkpoint
    transient = PersonalizedStrategy.transient | {"norm_keys"}

    def __init__(self, settings, initial_state, body, head):
        super().__init__(settings, initial_state, body, head)
        s = settings
        self.norm_keys = list(model_norm_keys(s.model, s.in_channels, s.image_size, s.num_classes))

    def shared_keys(self) -> list[str]:
        local = set(self.norm_keys)
        return [k for k in self.all_keys if k not in local]
