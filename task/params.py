"""Parameter (de)serialisation between torch state dicts and Flower ``ArrayRecord`` s, and checks of replies."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn


def state_to_numpy(state: Mapping[str, torch.Tensor], keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    names = list(state) if keys is None else list(keys)
    return {k: state[k].detach().cpu().numpy() for k in names}


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array of the same shape.  ``np.ascontiguousarray`` alone returns at least one
    dimension, so a 0-d array (BatchNorm's ``num_batches_tracked``) would come back with shape (1,) from every
    file written through it and no longer load into the model."""
    return np.ascontiguousarray(a).reshape(np.shape(a))


def to_record(state: Mapping[str, torch.Tensor | np.ndarray], keys: Iterable[str] | None = None) -> ArrayRecord:
    """ArrayRecord of ``state`` (torch or numpy values), restricted to ``keys`` in that order."""
    names = list(state) if keys is None else list(keys)
    out = {}
    for k in names:
        v = state[k]
        arr = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        out[k] = Array(contiguous(arr))
    return ArrayRecord(out)


def model_to_record(model: nn.Module, keys: Iterable[str] | None = None) -> ArrayRecord:
    return to_record(model.state_dict(), keys)


def record_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: record[k].numpy() for k in record}


def load_record(model: nn.Module, record: ArrayRecord | Mapping[str, np.ndarray], strict_keys: bool = False) -> None:
    """Copy the arrays in ``record`` into ``model`` (only the keys present unless ``strict_keys``).

    Raises ValueError naming the key on an unknown name or a shape mismatch.
    """
    arrays = record_to_numpy(record) if isinstance(record, ArrayRecord) else dict(record)
    state = model.state_dict()
    missing = set(state) - set(arrays)
    if strict_keys and missing:
        raise ValueError(f"record lacks {len(missing)} model keys, e.g. {sorted(missing)[:3]}")
    with torch.no_grad():
        for k, v in arrays.items():
            if k not in state:
                raise ValueError(f"record key {k!r} is not a parameter of the model")
            if tuple(state[k].shape) != tuple(v.shape):
                raise ValueError(f"shape mismatch for {k!r}: model {tuple(state[k].shape)}, record {tuple(v.shape)}")
            state[k].copy_(torch.as_tensor(v, dtype=state[k].dtype))


def reference_shapes(record: ArrayRecord | Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    if isinstance(record, ArrayRecord):
        return {k: tuple(record[k].shape) for k in record}
    return {k: tuple(np.shape(v)) for k, v in record.items()}


def check_arrays(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why ``arrays`` cannot be aggregated against ``expected`` shapes, or None when it can.

    Checks the key set, every shape, and that floating values are finite (NaN / inf are rejected).
    """
    if set(arrays) != set(expected):
        extra, missing = sorted(set(arrays) - set(expected)), sorted(set(expected) - set(arrays))
        return f"keys differ from the model's (unexpected {extra[:3]}, missing {missing[:3]})"
    for k, shape in expected.items():
        if tuple(arrays[k].shape) != tuple(shape):
            return f"shape of {k!r} is {tuple(arrays[k].shape)}, expected {tuple(shape)}"
        if np.issubdtype(arrays[k].dtype, np.floating) and not np.isfinite(arrays[k]).all():
            return f"non-finite values (NaN/inf) in {k!r}"
    return None


def weighted_average(states: list[Mapping[str, np.ndarray]], weights: Iterable[float]) -> dict[str, np.ndarray]:
    """Weighted mean of same-keyed arrays; weights are normalised (they must be non-negative, sum > 0).

    Integer arrays (e.g. BatchNorm's ``num_batches_tracked``) are averaged and cast back.
    """
    w = np.asarray(list(weights), dtype=np.float64)
    if len(states) == 0 or len(states) != len(w):
        raise ValueError(f"need one weight per state, got {len(states)} states and {len(w)} weights")
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {w.tolist()}")
    w = w / w.sum()
    out = {}
    for k in states[0]:
        stacked = np.stack([np.asarray(s[k], dtype=np.float64) for s in states])
        avg = np.tensordot(w, stacked, axes=1)
        dtype = np.asarray(states[0][k]).dtype
        out[k] = (np.rint(avg) if np.issubdtype(dtype, np.integer) else avg).astype(dtype)
    return out


# ---------------------------------------------------------------------------------------------- several models
def stack_states(
    states: Sequence[Mapping[str, np.ndarray]], keys: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """Several models with the same keys as one state: each array gains a leading model dimension."""
    names = list(states[0]) if keys is None else list(keys)
    return {k: np.stack([np.asarray(s[k]) for s in states]) for k in names}


def stacked_record(states: Sequence[Mapping[str, np.ndarray]], keys: Iterable[str] | None = None) -> ArrayRecord:
    """The wire format of several models in one message (tiers, cluster centres, peers, lazy models)."""
    return to_record(stack_states(states, keys))


def stacked_tensors(record: ArrayRecord, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """Inverse of :func:`stacked_record` on the receiving side: name -> tensor with a leading model dimension."""
    return {
        k: torch.from_numpy(v).to(device) if device is not None else torch.from_numpy(v)
        for k, v in record_to_numpy(record).items()
    }


def model_at(stacked: Mapping[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """Model ``i`` of stacked models."""
    return {k: v[i] for k, v in stacked.items()}
