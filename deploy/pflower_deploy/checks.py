"""What the local cluster verifies, each check adding one entry to the report:

- ``unregistered_check``: a SuperNode whose key was never registered is refused;
- ``holder_check``: a data holder cannot submit a run or register a key from its namespace, against any
  address it can reach, and plain HTTP is refused on every listener that crosses a namespace;
- ``check_results``: the run's facts, read from its results folder (summary.json, rounds.json, failures.json);
  with ``--refused-by``, that the nodes named refused every message (their privacy floor) and only they failed.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from . import REPO
from .credentials import make_key, write_connections
from .netns import holder_link, in_ns
from .processes import ClusterError


class Cluster(Protocol):
    """What the checks read of a running cluster (``cluster.Cluster``, which calls them; declared here so that the
    checks import nothing of the cluster back)."""

    args: Any  # the command line (nodes, rounds, netns, kill, refused_by, startup_timeout)
    work: Path
    certs: Path
    keys: Path
    report: dict[str, Any]
    proxied: bool
    superlink_port: int
    superlink: Any  # processes.Proc, None before it starts
    unregistered: Any  # processes.Proc, None unless the unregistered-node check runs
    nginx: Any  # proxy.Nginx, when proxied
    operator: Any  # netns.Link, when the operator has a namespace
    node_ids: dict[int, int]

    def event(self, what: str, **info: Any) -> None: ...
    def fleet_address(self, k: int) -> str: ...
    def control_address(self) -> str: ...
    def flwr(self, *argv: str, timeout: float = 120.0, link: Any = None, home: Path | None = None) -> Any: ...
    def list_nodes(self) -> list[dict[str, Any]]: ...
    def list_runs(self) -> list[dict[str, Any]]: ...


ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
PROBES = Path(__file__).resolve().parent / "probes.py"


def unregistered_check(c: Cluster) -> None:
    """The SuperNode with the unregistered key must be refused: it exits with an auth error, the SuperLink
    logs the refused activation, and ``flwr supernode list`` shows only the registered nodes."""
    proc, superlink = c.unregistered, c.superlink
    if proc is None or superlink is None:
        raise ClusterError("the unregistered-node check needs the SuperLink and the unregistered SuperNode running")
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(timeout=c.args.startup_timeout)
    exited = proc.popen.poll()
    log = proc.log.read_text(errors="replace")
    sl_log = ANSI_RE.sub("", superlink.log.read_text(errors="replace"))
    listed = c.list_nodes()
    listed_ids = {int(n["node-id"]) for n in listed}
    online = sorted(int(n["node-id"]) for n in listed if n.get("status") == "online")
    node_refused = "Failed to activate SuperNode" in log or "Failed to initialize the connection" in log
    link_refused = "No SuperNode found with the given public key" in sl_log
    result = {
        "exit-code": exited,
        "supernode-log": " ".join(
            ln.strip()
            for ln in ANSI_RE.sub("", log).splitlines()
            if "Exit Code" in ln or "Failed to" in ln or "code: " in ln
        ),
        "superlink-log": " | ".join(
            f"{m.group(1)} ... {m.group(2)}"
            for m in re.finditer(r"(\[/v1/fleet/activate-node\]\[ApiError:\d+\]).*?(exception: [^\n]*)", sl_log)
        ),
        "listed-nodes": len(listed_ids),
        "online-nodes": len(online),
        "unknown-ids-listed": sorted(listed_ids - set(c.node_ids.values())),
    }
    result["refused"] = bool(
        exited not in (None, 0) and node_refused and link_refused and listed_ids == set(c.node_ids.values())
    )
    proc.stop()
    c.unregistered = None
    c.report["unregistered-check"] = result
    c.event("unregistered supernode " + ("refused" if result["refused"] else "NOT refused"), **result)
    if not result["refused"]:
        raise ClusterError(f"unregistered SuperNode was not refused: {result}\n{log[-2000:]}")


def cli_error(output: str) -> str:
    """The words of a failed ``flwr`` command (its error box, without the box drawing)."""
    text = ANSI_RE.sub("", output)
    lines = [re.sub(r"[│╭╮╰╯─]", "", ln).strip() for ln in text.splitlines()]
    return " ".join(ln for ln in lines if ln and not ln.startswith("Using SuperLink"))[:300]


def probe(c: Cluster, link: Any, *specs: str) -> dict[str, dict]:
    """Run probes.py in ``link``'s namespace (this host's for None); results by probe spec."""
    r = subprocess.run(
        in_ns(link, [sys.executable, str(PROBES), "--ca", str(c.certs / "ca.crt"), *specs]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if r.returncode != 0:
        raise ClusterError(f"probes failed: {r.stderr[-1000:]}")
    return {x.pop("probe"): x for x in json.loads(r.stdout)}


def holder_check(c: Cluster) -> None:
    """Data holder 0, from its own namespace, with the CA and a key pair of its own, tries what an attacker
    among the data holders would: ``flwr run`` and ``flwr supernode register`` against the proxy's fleet
    listener (the address it is given), the operator's control listener and the SuperLink's own port (both
    routed to through this host). All must fail, nothing may be registered or started, and the listeners must
    refuse plain HTTP."""
    if not (c.args.netns and c.proxied):
        raise ClusterError("--holder-check needs --netns and the proxy topology")
    holder = holder_link(0)
    targets = {
        "fleet-listener": c.fleet_address(0),
        "control-listener": c.control_address(),
        "superlink-port": f"{holder.host_ip}:{c.superlink_port}",
    }
    home = c.work / "holder-flwr"
    write_connections(home, targets, c.certs / "ca.crt")
    key = make_key(c.keys, "holder-own-key")
    attempts: dict[str, dict[str, Any]] = {}
    for name in targets:
        run = c.flwr("run", str(REPO), name, "--run-config", "num-server-rounds=1", link=holder, home=home)
        reg = c.flwr("supernode", "register", f"{key}.pub", name, link=holder, home=home)
        attempts[name] = {
            "run": {"exit": run.returncode, "error": cli_error(run.stdout + run.stderr)},
            "register": {"exit": reg.returncode, "error": cli_error(reg.stdout + reg.stderr)},
        }
    fleet, ctl = f"https://{c.fleet_address(0)}", f"https://{c.control_address()}"
    probes = probe(
        c,
        holder,
        f"https:POST:{fleet}/v1/control/start-run",
        f"https:POST:{fleet}/v1/control/register-node",
        f"https:POST:{fleet}/v1/runtime/acquire-task",
        f"https:POST:{ctl}/v1/control/start-run",
        f"http:POST:http://{c.fleet_address(0)}/v1/fleet/activate-node",
        f"tcp:{holder.host_ip}:{c.superlink_port}",
    )
    operator_plain = probe(c, c.operator, f"http:POST:http://{c.control_address()}/v1/control/list-runs")
    superlink_plain = probe(c, None, f"http:GET:http://127.0.0.1:{c.superlink_port}/health")
    listed = {int(n["node-id"]) for n in c.list_nodes()}
    runs = c.list_runs()
    if c.superlink is None or c.nginx is None:
        raise ClusterError("the holder check needs the SuperLink and the proxy running")
    sl_log = ANSI_RE.sub("", c.superlink.log.read_text(errors="replace"))
    holder_control_calls = [
        ln.strip()[-120:] for ln in sl_log.splitlines() if "/v1/control/" in ln and f"{holder.ns_ip}:" in ln
    ]
    proxy_log = c.nginx.access_log.read_text(errors="replace") if c.nginx.access_log.exists() else ""
    statuses = sorted(
        {
            f"{m.group(1)} {m.group(2)}"
            for m in re.finditer(
                rf"^{re.escape(holder.ns_ip)} .*?\"POST (/v1/(?:control|runtime)/[\w-]+) [^\"]*\" (\d+)",
                proxy_log,
                re.MULTILINE,
            )
        }
    )
    tls: dict[str, dict | str] = {
        "holder-plain-http": probes[f"http:POST:http://{c.fleet_address(0)}/v1/fleet/activate-node"],
        "operator-plain-http": next(iter(operator_plain.values())),
        "superlink-plain-http": next(iter(superlink_plain.values())),
        "proxy-to-superlink": "https, verified against the CA (proxy_ssl_verify on), 127.0.0.1 only",
    }
    result = {
        "from": holder.ns,
        "targets": targets,
        "attempts": attempts,
        "probes": probes,
        "proxy-statuses-for-holder": statuses,
        "superlink-control-calls-from-holder": holder_control_calls,
        "registered-nodes": len(listed),
        "unknown-ids-listed": sorted(listed - set(c.node_ids.values())),
        "runs-before-operator-run": len(runs),
        "tls": tls,
    }
    denied = {"404", "403", "unavailable"}
    failed = [
        f"{t} {what}"
        for t, a in attempts.items()
        for what, x in a.items()
        if x["exit"] == 0 or not any(d in x["error"].lower() for d in denied)
    ]
    problems = (failed and [f"these succeeded or failed for another reason: {failed}"]) or []
    wrong = {s: p for s, p in probes.items() if not _refused(s, p)}
    if wrong:
        problems.append(f"probes not refused: {wrong}")
    for hop, res in tls.items():
        if isinstance(res, dict) and res.get("status") not in (None, 400):
            problems.append(f"{hop}: plain HTTP got {res}")
    if listed != set(c.node_ids.values()) or runs or holder_control_calls:
        problems.append("something was registered or started, or reached the SuperLink's Control API")
    result["refused"] = not problems
    c.report["holder-check"] = result
    c.event(
        "data holder " + ("refused" if not problems else "NOT refused"),
        attempts={t: {w: f"exit {x['exit']}: {x['error'][:90]}" for w, x in a.items()} for t, a in attempts.items()},
        proxy_statuses=statuses,
    )
    if problems:
        raise ClusterError("holder check: " + "; ".join(problems))


def _refused(spec: str, result: dict) -> bool:
    """A probe from a data holder is refused: 404 (fleet listener), 403 (control listener), 400 (plain HTTP
    on a TLS port) or no connection at all (refused / unreachable)."""
    if spec.startswith("tcp:"):
        return not result.get("connected")
    return result.get("status") in (400, 403, 404) or result.get("error") in ("refused", "unreachable")


#: how a ClientApp refuses a run below its node's privacy floor (client_app/floor.py), in Flower's error reply
REFUSAL = "client_app.floor.RunRefused'>:<'this node refuses the run: "


def refusals(c: Cluster, failures: list[dict[str, Any]], replies: list[dict[str, Any]]) -> list[str]:
    """``--refused-by``: the refusing nodes failed every message with a refusal (each reason goes into the report's
    ``refusals``, by node), every other node replied to every train message, and nobody else failed."""
    refusing = {c.node_ids[k]: k for k in c.args.refused_by}
    by_node: dict[str, list[str]] = {}
    problems = []
    for f in failures:
        if f["node-id"] not in refusing:
            problems.append(f"node {f['node-id']} failed without refusing: {f['reason'][:200]}")
        elif REFUSAL not in f["reason"]:
            problems.append(f"node {f['node-id']} failed, but not with a refusal: {f['reason'][:200]}")
        else:
            reason = f["reason"].split(REFUSAL, 1)[1].removesuffix("'>")
            by_node.setdefault(f"node{refusing[f['node-id']]}", []).append(f"round {f['round']} {f['phase']}: {reason}")
    c.report["refusals"] = by_node
    rounds_refused = {
        k: {f["round"] for f in failures if f["node-id"] == node and REFUSAL in f["reason"]}
        for node, k in refusing.items()
    }
    every_round = set(range(1, c.args.rounds + 1))
    problems += [
        f"node{k} did not refuse in rounds {sorted(every_round - r)}"
        for k, r in rounds_refused.items()
        if r != every_round
    ]
    taking_part = c.args.nodes - len(refusing)
    if not all(r["train"] in (taking_part, None) for r in replies):  # None: under DP no count is written
        problems.append(f"expected {taking_part} train replies per round (the nodes that did not refuse)")
    return problems


def check_stopped(c: Cluster, folder: Path, after_round: int) -> None:
    """A run ``stop-after`` stopped after round ``after_round``, as asked: its checkpoint of that round is there to
    resume from (``resume-from`` with the same work directory), and no round after it ran."""
    latest = folder / "checkpoints" / "LATEST"
    found = latest.read_text().strip() if latest.is_file() else None
    c.report.update({"results": str(folder), "checkpoint": found})
    if found != f"round-{after_round:05d}":
        raise ClusterError(
            f"stop-after={after_round}: expected checkpoint round-{after_round:05d} in {folder}, found {found}"
        )


def check_results(c: Cluster, folder: Path) -> None:
    """The run's facts, from its results folder: rounds, replies per round, failures."""
    summary_path = folder / "summary.json"
    if not summary_path.exists():
        raise ClusterError(f"{summary_path} missing")
    summary = json.loads(summary_path.read_text())

    def read(name):
        return json.loads((folder / name).read_text()) if (folder / name).exists() else []

    failures, rounds = read("failures.json"), read("rounds.json")
    replies = [
        {
            "round": r["round"],
            "train": r.get("train", {}).get("num-replies"),
            "evaluate": r.get("evaluate", {}).get("num-replies"),
        }
        for r in rounds
    ]
    c.report.update(
        {
            "results": str(folder),
            "method": summary.get("method"),
            "outcome-of-run": summary.get("outcome"),
            "rounds": summary.get("rounds"),
            "clients": summary.get("clients"),
            "accuracy": summary.get("personal-acc"),
            "global-accuracy": summary.get("global-acc"),
            "failures": len(failures),
            "failure-reasons": sorted(
                {f"round {f['round']} {f['phase']} node {f['node-id']}: {f['reason'][:90]}" for f in failures}
            ),
            "replies-per-round": replies,
        }
    )
    problems = []
    if summary.get("rounds") != c.args.rounds:
        problems.append(f"summary rounds {summary.get('rounds')} != {c.args.rounds}")
    if c.args.refused_by:
        problems += refusals(c, failures, replies)
    elif not c.args.kill:  # under DP rounds.json holds no count of replies (None): then no failure says it
        if not all(r["train"] in (c.args.nodes, None) for r in replies) or failures:
            problems.append(f"expected {c.args.nodes} replies per round and no failures")
    else:
        kr = c.args.kill[1]
        fewer = any(x["round"] == kr and (x["train"] or 0) < c.args.nodes for x in replies)
        recorded = any(f["round"] == kr for f in failures)
        if not (fewer or recorded):
            problems.append(f"kill in round {kr} left no trace (no failure, no missing reply)")
        c.report["kill-observed"] = {"fewer-replies": fewer, "failure-recorded": recorded}
    c.report["problems"] = problems
    if problems:
        raise ClusterError("; ".join(problems))
