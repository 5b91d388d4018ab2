"""The check of what a method declares it sends and receives (:mod:`strategies.disclosure`) against what its
messages carried, and the declarations as docs/privacy.md's table.

:func:`mismatches` compares a message recording (:mod:`task.recording`, run-config ``record-messages``) with a
method's declaration: a record, an array, a shape, a dtype or a metric that is not declared, or a required one that
is missing, is reported.  :func:`disagreements` compares the server's recording with the clients'.  :func:`table`
renders every method's declaration (``python -m server_app.disclosure``); tests/privacy checks the docs against it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from strategies.replies import BASE, EVALUATE, PER_CLIENT, TRAIN, Arrays, Clients, Dim, Disclosure, Part
from task.models import ModelInfo

# ---------------------------------------------------------------------- checking a recording
#: the directions in which a recording's lines carry what leaves a client (its reply) and what reaches it
OUT = ("sent", "pulled")
IN = ("received", "pushed")


def _fits(n: int, declared: int | Dim, clients: int | None) -> bool:
    if isinstance(declared, Clients) and clients is not None:
        declared = declared.within(clients)
    return (n in declared) if isinstance(declared, Dim) else n == declared


def _shape_fits(shape: list[int], declared: tuple[int | Dim, ...], clients: int | None = None) -> bool:
    return len(shape) == len(declared) and all(_fits(n, d, clients) for n, d in zip(shape, declared, strict=True))


def _check_lengths(where: str, present: Iterable[str], lengths: Mapping[str, int], part: Part, clients: int | None):
    """The recorded list lengths of a record's entries against the declared ones."""
    problems = []
    for key in sorted(lengths):
        if key not in part.lengths:
            problems.append(f"{where} entry {key!r} is a list of {lengths[key]} values, declared a single value")
        elif not _fits(lengths[key], part.lengths[key], clients):
            problems.append(f"{where} entry {key!r} is a list of {lengths[key]} values, declared {part.lengths[key]!r}")
    scalars = sorted(set(part.lengths) & set(present) - set(lengths))
    problems += [f"{where} entry {k!r} is a single value, declared a list of {part.lengths[k]!r}" for k in scalars]
    return problems


def _check_records(
    where: str, content: Mapping[str, Any], parts: Mapping[str, Part], clients: int | None = None
) -> list[str]:
    problems = []
    seen: dict[str, str] = {}
    for kind in ("arrays", "metrics", "configs"):
        for name, value in content.get(kind, {}).items():
            seen[name] = kind
            part = parts.get(name)
            if part is None:
                problems.append(f"{where}: record {name!r} ({kind}) is not declared")
                continue
            if (kind == "arrays") != (part.arrays is not None):
                problems.append(f"{where}: record {name!r} is {kind}, declared as {part.kind}")
                continue
            if part.arrays is not None:
                problems += _check_arrays(f"{where}: record {name!r}", value, part.arrays, clients)
            else:
                assert part.entries is not None
                extra = sorted(set(value) - set(part.entries))
                missing = sorted(k for k, req in part.entries.items() if req and k not in value)
                if extra:
                    problems.append(f"{where}: record {name!r} has undeclared entries {extra}")
                if missing:
                    problems.append(f"{where}: record {name!r} lacks required entries {missing}")
                lengths = content.get("lengths", {}).get(name, {})
                problems += _check_lengths(f"{where}: record {name!r}", value, lengths, part, clients)
    for name, part in parts.items():
        if part.required and name not in seen:
            problems.append(f"{where}: required record {name!r} is missing")
    return problems


def _check_arrays(where: str, arrays: Mapping[str, Any], declared: Arrays, clients: int | None = None) -> list[str]:
    problems = []
    extra = sorted(set(arrays) - set(declared.tensors))
    missing = sorted(set(declared.tensors) - set(arrays))
    if extra:
        problems.append(f"{where} has undeclared arrays {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    if missing:
        problems.append(f"{where} lacks declared arrays {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for key in sorted(set(arrays) & set(declared.tensors)):
        shape, dtype = arrays[key]
        tensor = declared.tensors[key]
        if not _shape_fits(list(shape), tensor.shape, clients):
            problems.append(f"{where}: array {key!r} has shape {tuple(shape)}, declared {tensor.shape}")
        if dtype != tensor.dtype:
            problems.append(f"{where}: array {key!r} has dtype {dtype}, declared {tensor.dtype}")
    return problems


def mismatches(
    declared: Mapping[str, Disclosure], recording: Iterable[Mapping[str, Any]], clients: int | None = None
) -> list[str]:
    """Every way the recorded messages differ from the declaration (empty: they match exactly).  With ``clients``,
    the number of clients of the federation, a count the declaration bounds by it (:class:`Clients`) is held to
    it."""
    problems = []
    for line in recording:
        where = f"{line['direction']} {line['type']} (round {line.get('round')}, node {line['node']})"
        disclosure = declared.get(line["type"])
        if disclosure is None:
            problems.append(f"{where}: message type {line['type']!r} is not declared")
            continue
        if line["direction"] in OUT:
            parts = disclosure.sends
        elif line["direction"] in IN:
            parts = disclosure.receives
        else:
            problems.append(f"{where}: unknown direction {line['direction']!r}")
            continue
        problems += _check_records(where, line["content"], parts, clients)
    return problems


def _key(line: Mapping[str, Any], directions: tuple[str, str]) -> tuple:
    return (
        directions.index(line["direction"]),
        line["type"],
        line["node"],
        json.dumps(line["content"], sort_keys=True),
    )


def disagreements(server: Iterable[Mapping[str, Any]], clients: Iterable[Mapping[str, Any]]) -> list[str]:
    """Messages the server pushed that no client recorded receiving, replies a client sent that the server did
    not pull, and the reverse (matched by direction, type, node and described content)."""
    theirs = Counter(_key(line, ("pushed", "pulled")) for line in server)
    ours = Counter(_key(line, ("received", "sent")) for line in clients)
    problems = []
    for key, n in (theirs - ours).items():
        problems.append(
            f"the server recorded {n} x {('pushed', 'pulled')[key[0]]} {key[1]} to/from node {key[2]} "
            "that no client recorded"
        )
    for key, n in (ours - theirs).items():
        problems.append(
            f"clients recorded {n} x {('received', 'sent')[key[0]]} {key[1]} at node {key[2]} "
            "that the server did not record"
        )
    return problems


# ---------------------------------------------------------------------- the declarations as a table (docs/privacy.md)
#: arrays a table cell lists one by one; more are summarised by what they are
SHOWN = 4


def _dims(shape: tuple[int | Dim, ...]) -> str:
    return (
        " x ".join("N" if d == PER_CLIENT else repr(d) if isinstance(d, Clients) else str(d) for d in shape) or "scalar"
    )


def key_set(keys: Iterable[str], info: ModelInfo) -> str | None:
    """The name of a set of state keys in terms of the model's key sets, or None if it is none of them."""
    keys = set(keys)
    names = {
        "the whole model": info.keys,
        "the trainable parameters": info.parameter_keys,
        "the body": info.body_keys,
        "the head": info.head_keys,
        "all but the normalisation layers": [k for k in info.keys if k not in set(info.norm_keys)],
    }
    return next((name for name, ks in names.items() if keys == set(ks)), None)


def describe_arrays(arrays: Arrays, info: ModelInfo, what: str) -> str:
    """An ArrayRecord in words: a model key set (stacked: how many of it), the whole model and more arrays, a
    few arrays by shape and dtype, or ``what`` and how many arrays."""
    tensors = arrays.tensors
    name = key_set(tensors, info)
    if name is not None and all(t.shape == tuple(info.shapes[k]) for k, t in tensors.items()):
        return name
    if name is not None and all(t.shape[1:] == tuple(info.shapes[k]) for k, t in tensors.items()):
        counts = {t.shape[0] for t in tensors.values()}
        if len(counts) == 1:
            count = counts.pop()
            return f"{'one per client (N)' if count == PER_CLIENT else count} x {name}"

    def shown(keys: Iterable[str]) -> str:
        return ", ".join(f"`{k}` {_dims(tensors[k].shape)} {tensors[k].dtype}" for k in keys)

    extras = [k for k in tensors if k not in info.shapes]
    if extras and set(info.keys) < set(tensors) and all(tensors[k].shape == tuple(info.shapes[k]) for k in info.keys):
        return f"the whole model and {shown(extras)}"
    return shown(tensors) if len(tensors) <= SHOWN else f"{what} ({len(tensors)} arrays)"


def _record(name: str, part: Part, info: ModelInfo, skip: Iterable[str] = ()) -> str:
    optional = "" if part.required else " (optional)"
    if part.arrays is not None:
        return f"`{name}`{optional}: {describe_arrays(part.arrays, info, part.what)}"
    shown = [k for k in part.entries or {} if k not in set(skip)]
    return f"`{name}`{optional}: {', '.join(f'`{k}`' for k in shown)}" if shown else ""


def table(declared: Mapping[str, Mapping[str, Disclosure]], info: Mapping[str, ModelInfo]) -> str:
    """The Markdown table of every method's declaration, one row per message type: what the client's reply
    carries (array records, and metrics beyond those every reply has), what that reply could tell about the
    client's data (the declaration's ``reveals``) and what the message brings that was derived from other
    clients."""
    common = set(BASE.metrics) | set(TRAIN.metrics) | set(EVALUATE.metrics)
    rows = [
        "| method | message | the client sends | which could tell | it receives, derived from other clients |",
        "|---|---|---|---|---|",
    ]
    for method, by_type in declared.items():
        for kind, d in by_type.items():
            sends = [
                _record(name, part, info[method], skip=common)
                for name, part in d.sends.items()
                if name not in ("timing", "evaluation")
            ]
            peers = [_record(name, part, info[method]) for name, part in d.receives.items() if part.from_peers]
            rows.append(
                f"| {method} | `{kind}` | {'; '.join(s for s in sends if s) or 'metrics only'} | {d.reveals} | "
                f"{'; '.join(peers) or 'nothing'} |"
            )
    return "\n".join(rows)
