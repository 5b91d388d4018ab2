"""The client's half of central differential privacy (docs/privacy.md, task/privacy.py).

Under ``dp-mode='central'`` a train reply's ``arrays`` leave the client clipped: ``w_ref + clip(w - w_ref, C)``,
with ``w_ref`` the shared model the message brought (``arrays`` of the message), so what the server averages has
norm at most ``dp-clip`` around a model it sent itself.  Integer arrays (BatchNorm's ``num_batches_tracked``, which
counts the batches the client trained) stay home.  The noise is the server's (once, on the mean).
"""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from task.params import record_to_numpy, to_record
from task.privacy import PrivacyConfigError, clip_update, model_delta


def clipped_reply(reply: RecordDict, message: RecordDict, clip: float) -> RecordDict:
    """``reply`` with its ``arrays`` clipped to L2 distance ``clip`` from the message's ``arrays``, integer arrays
    left out; a reply without arrays is returned as it is."""
    if "arrays" not in reply.array_records:
        return reply
    if "arrays" not in message.array_records:
        raise PrivacyConfigError("central DP clips the reply against the model the message brought, but it had none")
    sent = record_to_numpy(reply.array_records["arrays"])
    reference = record_to_numpy(message.array_records["arrays"])
    floating = {k: v for k, v in sent.items() if np.issubdtype(v.dtype, np.floating)}
    change = clip_update(model_delta(floating, reference), clip)
    reply["arrays"] = to_record({k: (reference[k] + change[k]).astype(v.dtype) for k, v in floating.items()})
    return reply
