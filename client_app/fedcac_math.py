"""FedCAC client-side math (fedcac.md §2.3, §2.4, §2.7): sensitivity, critical masks, Eq. 11 (the packed
wire format of the masks is in task/methods/fedcac.py).

Pure torch / numpy, no Flower.  A "layer" is one trainable tensor (one entry of ``named_parameters()``);
BatchNorm running statistics are not scored and stay local (fedcac.md §2.4 "recommended default").

See docs/methods/fedcac.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch


def parameter_sensitivity(
    before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Eq. 5: ``s = |(theta_after - theta_before) * theta_after|``, element-wise, per trainable tensor.

    The paper's "·" is a Hadamard product; the sign of the change does not matter.
    """
    out = {}
    for name, theta in after.items():
        if name not in before:
            raise ValueError(f"no start-of-round value for parameter {name!r}")
        out[name] = ((theta - before[name]) * theta).abs()
    return out


def critical_masks(sensitivity: Mapping[str, torch.Tensor], tau: float) -> dict[str, torch.Tensor]:
    """Eq. 6: per tensor, exactly ``floor(tau * n_l)`` ones at the largest sensitivities (exact top-k).

    Top-k by index (fedcac.md §2.4 recommendation) gives exactly k ones even with ties; ``tau`` in [0, 1].
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"run-config key 'tau' must be in [0, 1], got {tau}")
    masks = {}
    for name, s in sensitivity.items():
        flat = s.detach().flatten()
        k = int(np.floor(tau * flat.numel() + 1e-9))
        m = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
        if k > 0:
            m[torch.topk(flat, k, sorted=False).indices] = True
        masks[name] = m.view_as(s)
    return masks


def merge_customized(
    own: Mapping[str, torch.Tensor],
    customized: Mapping[str, torch.Tensor] | None,
    global_avg: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor | np.ndarray],
) -> dict[str, torch.Tensor]:
    """Eq. 11: ``w = u * M + w_bar * (1 - M)`` per trainable tensor.

    ``customized`` is ``u_i`` (critical parameters averaged over the client and its collaborators); when
    the server has none for this client (absent last round, fedcac.md §6.11) the client's own critical values
    are kept.  Idempotent: it does not depend on the client's current non-critical values.
    """
    out = {}
    for name, wbar in global_avg.items():
        m = masks[name]
        m = torch.as_tensor(np.asarray(m) if not isinstance(m, torch.Tensor) else m, device=wbar.device).bool()
        u = (customized[name] if customized is not None else own[name]).to(wbar.device)
        out[name] = torch.where(m, u, wbar)
    return out
