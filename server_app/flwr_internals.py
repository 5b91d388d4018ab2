"""Every flwr internal the in-process engine (:mod:`server_app.engine`) touches, in one place.

Flower's simulation runtime is a LinkState in memory, an ``InMemoryGrid`` the ServerApp talks to, and the vce loop
(``flwr.server.superlink.fleet.vce.vce_api.run_api``) that takes each message out of the LinkState, hands it to a
``Backend`` and stores the reply.  Its seam for how a ClientApp is run is the abstract ``Backend`` class; but the
public entry points (``flwr run``, ``flwr.simulation.run_simulation``) always build the Ray backend
(``vce_api.start_vce`` names ``RayBackend`` itself).  The engine therefore assembles the runtime from the same parts
``flwr.simulation.run_simulation._main_loop`` and ``start_vce`` use, with its own ``Backend``.  Those parts are
private to flwr: nothing else in pflower may import them, and :func:`check` (run by tests/engine/test_flwr_internals.py)
fails with the name of whatever a flwr upgrade moved or changed.

Pinned against flwr 1.41.0 (pyproject.toml pins it).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from flwr.clientapp.client_app import ClientAppException, LoadClientAppError
from flwr.common.config import flatten_dict, fuse_dicts, get_project_config, parse_config_args
from flwr.common.constant import (
    NUM_PARTITIONS_KEY,
    PARTITION_ID_KEY,
    RUN_ID_NUM_BYTES,
    SUPERLINK_NODE_ID,
    TASK_ID_NUM_BYTES,
)
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce.backend.backend import Backend, BackendConfig
from flwr.server.superlink.fleet.vce.metrics import VceMetrics
from flwr.server.superlink.fleet.vce.vce_api import _register_node_info_stores, _register_nodes, run_api
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
from flwr.simulation.run_simulation import run_serverapp_th
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_ref import load_app
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

__all__ = [
    "FLWR_IN_MEMORY_DB_NAME",
    "NOOP_FEDERATION_ID",
    "NUM_PARTITIONS_KEY",
    "PARTITION_ID_KEY",
    "RUN_ID_NUM_BYTES",
    "SUPERLINK_NODE_ID",
    "TASK_ID_NUM_BYTES",
    "Backend",
    "BackendConfig",
    "ClientAppException",
    "InMemoryGrid",
    "InMemoryLinkState",
    "LinkStateFactory",
    "LoadClientAppError",
    "NoOpFederationManager",
    "ObjectStoreFactory",
    "Run",
    "RunRecord",
    "Task",
    "TaskIdentity",
    "VceMetrics",
    "check",
    "flatten_dict",
    "fuse_dicts",
    "generate_rand_int_from_bytes",
    "get_project_config",
    "load_app",
    "parse_config_args",
    "register_node_contexts",
    "register_nodes",
    "run_api",
    "run_serverapp_th",
]

#: flwr's version these internals were read from
PINNED_FLWR = "1.41.0"

#: the parameters the engine passes, by name, to each internal function (and, for classes, the methods it calls)
_SIGNATURES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "vce_api.run_api": (
        run_api,
        ("app_fn", "backend_fn", "nodes_mapping", "state_factory", "node_info_stores", "f_stop", "metrics"),
    ),
    "vce_api._register_nodes": (_register_nodes, ("num_nodes", "state_factory")),
    "vce_api._register_node_info_stores": (_register_node_info_stores, ("nodes_mapping", "run", "app_dir")),
    "run_simulation.run_serverapp_th": (
        run_serverapp_th,
        (
            "server_app_attr",
            "server_app",
            "server_app_context",
            "grid",
            "app_dir",
            "f_stop",
            "exception_queue",
            "enable_tf_gpu_growth",
            "ctx_queue",
        ),
    ),
    "LinkStateFactory": (LinkStateFactory, ("database", "federation_manager", "objectstore_factory")),
    "InMemoryGrid": (InMemoryGrid, ("state_factory", "pull_interval")),
    "Run.create_empty": (Run.create_empty, ("run_id",)),
    "load_app": (load_app, ("module_attribute_str", "error_type", "project_dir")),
    "fuse_dicts": (fuse_dicts, ("main_dict", "override_dict")),
    "parse_config_args": (parse_config_args, ("config",)),
}

#: attributes the engine reads or sets on flwr objects
_ATTRIBUTES: dict[str, tuple[type, tuple[str, ...]]] = {
    "InMemoryLinkState": (InMemoryLinkState, ("run_ids", "task_store", "create_node", "get_message_ins")),
    "Backend": (Backend, ("build", "num_workers", "is_worker_idle", "process_message", "terminate")),
    "InMemoryGrid": (InMemoryGrid, ("set_run", "push_messages", "pull_messages", "send_and_receive")),
    "TaskIdentity": (TaskIdentity, ("task_id", "run_id", "node_id")),
}


def register_nodes(num_nodes: int, state_factory: LinkStateFactory) -> dict[int, int]:
    """Register ``num_nodes`` simulated SuperNodes in the LinkState: {node id: partition id}, as Flower's simulation
    does (random node ids, partitions 0 .. num_nodes - 1)."""
    return _register_nodes(num_nodes=num_nodes, state_factory=state_factory)


def register_node_contexts(nodes_mapping: dict[int, int], run: Run, app_dir: str) -> dict[int, Any]:
    """Each node's run-info store, with its Context registered as Flower's simulation registers it: node config
    ``partition-id`` / ``num-partitions``, the run config fused from the app's ``pyproject.toml`` and the run's
    overrides."""
    return _register_node_info_stores(nodes_mapping=nodes_mapping, run=run, app_dir=app_dir)


def check() -> list[str]:
    """What no longer matches the flwr this module was written against: one line per moved or changed internal,
    empty when everything the engine relies on is where it was."""
    import flwr

    problems: list[str] = []
    if flwr.__version__ != PINNED_FLWR:
        problems.append(
            f"flwr is {flwr.__version__}, server_app/flwr_internals.py was written against {PINNED_FLWR}: re-read "
            "flwr.simulation.run_simulation._main_loop and flwr.server.superlink.fleet.vce.vce_api, then update "
            "PINNED_FLWR"
        )
    for name, (func, params) in _SIGNATURES.items():
        try:
            have = set(inspect.signature(func).parameters)
        except (TypeError, ValueError) as err:
            problems.append(f"{name}: its signature cannot be read ({err})")
            continue
        missing = [p for p in params if p not in have]
        if missing:
            problems.append(f"{name} no longer takes {', '.join(missing)} (it takes {', '.join(sorted(have))})")
    for name, (cls, attrs) in _ATTRIBUTES.items():
        missing = [a for a in attrs if not _has(cls, a)]
        if missing:
            problems.append(f"{name} has no {', '.join(missing)}")
    return problems


def _has(cls: type, name: str) -> bool:
    """Whether ``cls`` has ``name``: a class attribute, a property of its metaclass, or an attribute its ``__init__``
    sets (looked up without running any of them)."""
    for owner in (cls, type(cls)):
        try:
            inspect.getattr_static(owner, name)
        except AttributeError:
            continue
        return True
    return name in _init_attributes(cls)


def _init_attributes(cls: type) -> set[str]:
    """The ``self.<name> =`` assignments in the ``__init__`` of ``cls`` and its bases (attributes that exist only on
    instances)."""
    found: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            source = inspect.getsource(init)
        except (OSError, TypeError):
            continue
        found |= set(re.findall(r"self\.(\w+)\s*(?::[^=]*)?=", source))
    return found
