"""Helpers for calling a method's client handlers directly (no Flower runtime) on hand-chosen data.

``client(method, data, ctx, **run_config)`` builds the method's client class with a hand-built Context and then
swaps in ``data`` (a ClientData), so a test decides exactly what the training, validation and test splits
hold, e.g. a validation split that disagrees with the training split.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context, RecordDict, UserConfigValue

from task.config import parse_settings
from task.data import ClientData, load_centralized
from task.methods import METHODS, load_object
from task.train import train

BASE_CFG: dict[str, bool | float | int | str] = {
    "model": "mlp",
    "partition": "iid",
    "momentum": 0.0,
    "batch-size": 16,
    "lr": 0.1,
    "local-epochs": 1,
}


def digits_of(classes, n_per_class=20, offset=0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) tensors: ``n_per_class`` digits of each class in ``classes``, starting at the ``offset``-th."""
    d = load_centralized("digits")
    idx = np.concatenate([np.flatnonzero(d.y == c)[offset : offset + n_per_class] for c in classes])
    return torch.from_numpy(d.x[idx]), torch.from_numpy(d.y[idx])


def client_data(train_classes, val_classes=None, test_classes=None, n=20) -> ClientData:
    """Disjoint samples: training from the first ``n`` of each class, validation / test from later ones."""
    x_tr, y_tr = digits_of(train_classes, n, 0)
    x_va, y_va = digits_of(val_classes if val_classes is not None else train_classes, n, 60)
    x_te, y_te = digits_of(test_classes if test_classes is not None else train_classes, n, 120)
    return ClientData(x_tr, y_tr, x_va, y_va, x_te, y_te, num_classes=10)


def context(method, pid=0, n=4, **cfg) -> Context:
    return Context(
        run_id=1,
        node_id=100 + pid,
        node_config={"partition-id": pid, "num-partitions": n},
        state=RecordDict(),
        run_config={**BASE_CFG, "method": method, **cfg},
    )


def users_context(method: str, node_config: dict | None = None, **run_config: UserConfigValue) -> Context:
    """Partition 0 of 4 (``node_config`` adds to it) with ``run_config`` over the user's defaults, the run of
    ``flwr run . --run-config "method='X'"`` (the cnn with BatchNorm, SGD with momentum), not the kit's BASE_CFG."""
    return Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": 4, **(node_config or {})},
        state=RecordDict(),
        run_config={"method": method, **run_config},
    )


def users_client(method: str, node_config: dict | None = None, **run_config: UserConfigValue):
    """The client of :func:`users_context`, on its own partition of the embedded data."""
    ctx = users_context(method, node_config, **run_config)
    return load_object(METHODS[method].client)(ctx, parse_settings(ctx.run_config))


def node_contexts(cfg, n: int) -> list[Context]:
    """A fresh Context per node of an ``n``-node federation (node ids 10, 11, ...), each with exactly ``cfg`` as
    its run config: what Flower gives the ClientApps of one run, for tests that drive a strategy and its clients
    without the runtime."""
    return [
        Context(
            run_id=1,
            node_id=10 + i,
            node_config={"partition-id": i, "num-partitions": n},
            state=RecordDict(),
            run_config=cfg,
        )
        for i in range(n)
    ]


def client(method: str, data: ClientData | None = None, ctx: Context | None = None, /, **cfg: UserConfigValue):
    """The client; with ``ctx`` its node state is kept (later rounds of the same node), ``cfg`` still applies.

    ``data`` and ``ctx`` are positional so that every keyword is a run-config key (``**{"local-epochs": 2}``)."""
    if ctx is None:
        ctx = context(method, **cfg)
    elif cfg:
        ctx = Context(
            run_id=ctx.run_id,
            node_id=ctx.node_id,
            node_config=ctx.node_config,
            state=ctx.state,
            run_config={**ctx.run_config, **cfg},
        )
    c = load_object(METHODS[method].client)(ctx, parse_settings(ctx.run_config))
    if data is not None:
        c.data = data
    return c


def trained_state(model, x, y, epochs=15, lr=0.1, seed=0):
    """A copy of ``model``'s state after plain SGD on (x, y): a model that fits that data."""
    import copy

    m = copy.deepcopy(model)
    train(m, x, y, epochs=epochs, batch_size=16, lr=lr, momentum=0.0, seed=seed)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def numpy_state(state):
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


def distinct_states(client, k=3, seed=0, spread=0.3) -> list[dict[str, torch.Tensor]]:
    """k distinct states of a client's network, as peers' models it could receive (own first): float tensors
    moved apart (noise of std ``spread`` times one plus their mean magnitude), BatchNorm statistics rescaled and
    the integer ``num_batches_tracked`` different per model."""
    g = torch.Generator().manual_seed(seed)
    base = client.reset_model().state_dict()
    states = []
    for i in range(k):
        s = {}
        for name, v in base.items():
            if not v.is_floating_point():
                s[name] = torch.full_like(v, 5 + 3 * i)
            elif name.endswith("running_var"):
                s[name] = v * (0.5 + torch.rand(v.shape, generator=g))
            else:
                s[name] = v + spread * torch.randn(v.shape, generator=g) * (1 + v.abs().mean())
        states.append(s)
    return states


def declare(method, content: RecordDict) -> RecordDict:
    """``content`` with the noise multiplier and clip bound a DP run's server declares in every message
    (``dp-noise-multiplier``, ``dp-clip``; strategies/privacy.py: ``ServerPrivacy.declared``), here those of the
    client's own settings, as a server without a target epsilon declares them; the client's privacy step noises with
    (local) or checks (central) exactly these."""
    from flwr.app import ConfigRecord

    from task.privacy import clip_bound

    settings = method.settings
    config = content.config_records.get("config") or ConfigRecord()
    config["dp-noise-multiplier"] = float(settings.dp_noise_multiplier)
    config["dp-clip"] = clip_bound(settings.dp_clip)
    content["config"] = config
    return content
