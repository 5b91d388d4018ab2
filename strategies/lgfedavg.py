"""LG-FedAvg (Liang et al., 2020, "Think locally, act globally"): every client keeps its own representation
layers (the body: every key not under ``head.``, BatchNorm statistics included) and shares only the global
layers on top of them (the head), which the server averages by training examples.  The mirror image of
FedPer, which shares the body and keeps the head.

The server holds no model every client uses (only the global head), so there is no global accuracy; the
client side is ``client_app/lgfedavg.py``.  See docs/methods/lgfedavg.md.
"""

from __future__ import annotations

from strategies.api import PersonalizedStrategy


class LGFedAvgStrategy(PersonalizedStrategy):
    """Aggregates and sends only the head: ``theta_g <- sum_i n_i theta_g,i / sum_i n_i`` over the round's
    valid replies (the base's example-weighted average of the shared keys)."""

    has_global_model = False

    def shared_keys(self) -> list[str]:
        return self.model_info.head_keys
