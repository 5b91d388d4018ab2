"""Data sets, partitioners and per-client splits.

Everything is offline by default: the embedded data set is scikit-learn's bundled handwritten digits
(1,797 real 8x8 images).  Real data sets go through Hugging Face ``datasets`` (or torchvision) and also
read a local copy (``data-dir``: a folder written by ``Dataset.save_to_disk`` or a torchvision root).

The package is split by concern:

- :mod:`task.data.catalogue` - the data sets, partition / mixture / domain names;
- :mod:`task.data.sources` - whole data sets in memory (digits, synthetic concept shift, real copies);
- :mod:`task.data.partitioners` - flwr-datasets partitioners (quantity skew crossed with label skew on its inner
  Dirichlet) and ours (planted clusters, two-source);
- :mod:`task.data.domains` - feature-shift transforms;
- :mod:`task.data.clients` - data settings, a client's splits and their on-disk cache;
- :mod:`task.data.files` - a deployed node's own ``.npz`` data file.

Importing this package is light (numpy and torch): ``datasets`` and ``flwr_datasets`` load only when a
partition is built (names from :mod:`task.data.partitioners` resolve on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

from task.data.catalogue import DATASETS, DOMAINS, MIXTURES, PARTITIONS, DatasetInfo, dataset_info, synth_concept
from task.data.clients import (
    ClientData,
    DataSettings,
    SplitIndices,
    load_client_data,
    partition_indices,
    split_indices,
    stratified_split,
)
from task.data.domains import apply_domain, domain_of
from task.data.files import export_client_file, load_local_file
from task.data.sources import Centralized, load_centralized

_LAZY = dict.fromkeys(
    (
        "PlantedClusterPartitioner",
        "TwoSourcePartitioner",
        "build_partitioner",
        "index_table",
        "partitioner_for",
        "source_shares",
    ),
    "task.data.partitioners",
)


def __getattr__(name: str) -> Any:  # PEP 562: the partitioners (and datasets / flwr-datasets) on first use
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DATASETS",
    "DOMAINS",
    "MIXTURES",
    "PARTITIONS",
    "Centralized",
    "ClientData",
    "DataSettings",
    "DatasetInfo",
    "PlantedClusterPartitioner",
    "SplitIndices",
    "TwoSourcePartitioner",
    "apply_domain",
    "build_partitioner",
    "dataset_info",
    "domain_of",
    "export_client_file",
    "index_table",
    "load_centralized",
    "load_client_data",
    "load_local_file",
    "partition_indices",
    "partitioner_for",
    "source_shares",
    "split_indices",
    "stratified_split",
    "synth_concept",
]
