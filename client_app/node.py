"""What a client learns of its node before any message is handled: its partition, its device and threads, and its
data (the node's own file, else its partition of the run's data set), or the reason it refuses the run."""

from __future__ import annotations

from typing import NamedTuple

import torch
from flwr.app import Context

from task.config import Settings
from task.data import ClientData, load_client_data, load_local_file
from task.data.capacity import client_refusal, run_refusal
from task.data.clients import default_cache_dir
from task.train import resolve_device


class Node(NamedTuple):
    partition_id: int
    num_partitions: int  # node config ``num-partitions`` (0 where the node gives none: it has its own data file)
    device: torch.device
    data: ClientData


def open_node(context: Context, settings: Settings) -> Node:
    """The node config's partition, device (node config ``device``, else the run's) and torch threads (set here),
    and the node's data, scored on the validation split where the run selects settings.

    A client with nothing to train on or to be scored on refuses the run, saying why (the server, which cannot see
    a deployed node's partition, learns it from the refusals; in simulation it refused the run before)."""
    node_cfg = context.node_config
    data_path = str(node_cfg.get("data-path", ""))
    if "partition-id" not in node_cfg or ("num-partitions" not in node_cfg and not data_path):
        raise ValueError(
            "node config needs 'partition-id' and either 'num-partitions' (a partition of the embedded data; "
            'set by the simulation, or --node-config "partition-id=0 num-partitions=3" on a SuperNode) or '
            "'data-path' (the node's own .npz file: --node-config \"partition-id=0 data-path='/data/me.npz'\")"
        )
    partition_id = int(node_cfg["partition-id"])
    num_partitions = int(node_cfg.get("num-partitions", 0))
    device = resolve_device(str(node_cfg.get("device", settings.device)))
    threads = int(node_cfg.get("num-threads", settings.client_threads))
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    scored = settings.evaluate_split
    if data_path:
        data = load_local_file(data_path, settings.data, partition_id)
    else:  # node config cache-dir: where the node keeps its splits ("" = rebuild them in every process)
        cache = str(node_cfg.get("cache-dir", default_cache_dir()))
        try:
            data = load_client_data(settings.data, partition_id, num_partitions, cache or None)
        except ValueError as err:  # a partition that cannot be drawn: every client gives the run's reason
            if (why := run_refusal(settings.data, num_partitions, scored)) is not None:
                raise ValueError(why) from err
            raise
    if scored == "validation":  # selecting settings: the test split is not even kept
        data = data.scored_on_validation()
    partitions = 0 if data_path else num_partitions  # a node with its own file holds no partition
    if why := client_refusal(data, settings.data, partition_id, partitions, scored):
        raise ValueError(why)
    return Node(partition_id, num_partitions, device, data)
