"""FedCAC's options and its wire format: the bit-packed critical masks clients send (docs/methods/fedcac.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from task.options import OptionSet, option


@dataclass(frozen=True)
class FedCACOptions(OptionSet):
    tau: float = option(
        "tau", 0.5, "share of each tensor's parameters that are critical (Eq. 6)", minimum=0.0, maximum=1.0
    )
    beta: int = option(
        "beta", 15, "round at which the collaboration threshold reaches the largest overlap (Eq. 7)", minimum=1
    )
    strict_beta_cutoff: bool = option(
        "strict-beta-cutoff", True, "no collaborators at all after round beta (also when every overlap is equal)"
    )
    weighting: str = option(
        "fedcac-weighting",
        "uniform",
        "weights of the global average w_bar (Eq. 9)",
        choices=("uniform", "num-examples"),
    )
    diagnostics: bool = option(
        "fedcac-diagnostics",
        False,
        "clients send label histograms for the collaborator "
        "label-similarity diagnostic (leaks labels: simulation only)",
    )


def _on_cpu(mask: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    return mask.cpu() if isinstance(mask, torch.Tensor) else mask


def pack_masks(masks: Mapping[str, torch.Tensor | np.ndarray], keys: list[str]) -> np.ndarray:
    """Concatenate the masks in ``keys`` order and pack them 8 per byte (``np.packbits``): n/8 bytes."""
    flat = [np.asarray(_on_cpu(masks[k]), dtype=bool).ravel() for k in keys]
    return np.packbits(np.concatenate(flat) if flat else np.zeros(0, bool))


def packed_length(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Bytes of the packed masks of tensors with these shapes."""
    return (sum(int(np.prod(s)) for s in shapes.values()) + 7) // 8


def unpack_masks(packed: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_masks` for the given ordered ``shapes``; raises on a wrong length."""
    sizes = [int(np.prod(s)) for s in shapes.values()]
    total = sum(sizes)
    packed = np.asarray(packed)
    if packed.dtype != np.uint8 or packed.ndim != 1 or len(packed) != (total + 7) // 8:
        raise ValueError(
            f"packed mask must be uint8 of length {(total + 7) // 8} for {total} parameters, "
            f"got {packed.dtype} of shape {packed.shape}"
        )
    bits = np.unpackbits(packed, count=total).astype(bool)
    out, pos = {}, 0
    for (name, shape), size in zip(shapes.items(), sizes, strict=True):
        out[name] = bits[pos : pos + size].reshape(shape)
        pos += size
    return out
