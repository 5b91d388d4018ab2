#!/usr/bin/env python3
"""Run pflower on Flower's deployment runtime on this machine: one SuperLink, N SuperNodes, TLS, node auth,
optionally behind the nginx proxy that gives data holders the Fleet API only.

What it does, in order (every process it starts is its own process group and is stopped by id at the end,
also on failure and on Ctrl-C; namespaces and veth links it made are deleted):

1. with ``--netns``: one network namespace per SuperNode (and one for the operator with the proxy);
2. makes a CA + server certificate (``deploy/make_certs.sh``) and N SuperNode key pairs (ECDSA P-384,
   ``deploy/make_node_keys.sh``) in a work directory;
3. starts ``flower-superlink`` in deployment mode with TLS, ``--enable-supernode-auth``, its own ``--database``
   and ``FLWR_HOME``, runtime dependency installation disabled (the app runs in this Python environment);
4. topology ``proxy`` (``--proxy``, the default with ``--netns``): the SuperLink listens on 127.0.0.1 only and
   nginx (``deploy/nginx/pflower.conf.in``) serves the Fleet routes on the data holders' addresses and the
   Control routes on the operator's address, to the operator only. Topology ``direct`` (``--no-proxy``, the
   default without ``--netns``): everything talks to the SuperLink's one port;
5. registers the N public keys as the operator (``flwr supernode register``), starts N ``flower-supernode``
   (own Runtime API port and ``FLWR_HOME``, ``partition-id=i``) and waits until all N are activated;
6. optionally: a SuperNode with an unregistered key must be refused (``--unregistered-check``); a data holder
   must fail to submit a run or register a key from its namespace (``--holder-check``, needs the proxy and
   ``--netns``);
   (with ``--node-config I:K=V`` more node config for SuperNode i, e.g. a data holder's privacy floor);
7. submits ``flwr run <repo> <connection> --stream`` as the operator, optionally kills SuperNode i when round r
   starts (``--kill-node i@r``) and starts it again (``--restart-node``);
8. checks the results folder the run printed (summary.json, rounds.json, failures.json; with ``--refused-by``
   that the nodes named refused every message and the others replied), prints one final
   JSON line and exits 0 if every check passed.

Exit status (as ``python -m server_app.job``'s): 0 the run completed and every check passed; 1 a check failed or a
process did not come up; 3 the run config was refused (checked with the ServerApp's own parser before anything
starts); 4 the run stopped after round k as asked (``--run-config "stop-after=k"``: its checkpoint is there, and
the last lines say how to resume it); 5 the privacy budget stopped the run (``dp-max-epsilon``; its checks passed);
130 interrupted.  The JSON line's ``outcome`` says the same in words.

Example::

    python -m deploy.local_cluster --nodes 3 --rounds 3
    python -m deploy.local_cluster --nodes 3 --rounds 4 --kill-node 2@2 --restart-node --unregistered-check
    python -m deploy.local_cluster --nodes 3 --rounds 2 --method fedc2i --run-config "dp-mode='local'" \
        --node-config 2:dp-min-noise-multiplier=2.0 --refused-by 2
    python -m deploy.local_cluster --nodes 2 --rounds 4 --workdir /tmp/lc --run-config "stop-after=2"
    python -m deploy.local_cluster --nodes 2 --rounds 4 --workdir /tmp/lc --run-config "resume-from='<folder>'"
    sudo python -m deploy.local_cluster --nodes 2 --rounds 2 --netns --holder-check
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from typing import Any

from deploy.pflower_deploy.cluster import Cluster
from deploy.pflower_deploy.netns import unavailable_reason
from deploy.pflower_deploy.processes import ClusterError, say, tail
from deploy.pflower_deploy.proxy import nginx_binary
from server_app.job import Exit, Refused


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=3, help="number of SuperNodes (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="num-server-rounds (default 3)")
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--run-config", default="", help="extra run-config pairs, e.g. \"local-epochs=2 model='mlp'\"")
    ap.add_argument(
        "--round-timeout",
        type=float,
        default=120.0,
        help="run-config round-timeout in s (default 120: a crashed node is declared offline by the "
        "SuperLink within 2 heartbeats = 60 s, and its missing reply becomes an error reply)",
    )
    ap.add_argument(
        "--node-config",
        metavar="I:K=V",
        action="append",
        default=[],
        help='more node config for SuperNode I, e.g. 1:"dp-min-noise-multiplier=2.0" (a data holder\'s privacy '
        "floor); repeatable",
    )
    ap.add_argument(
        "--refused-by",
        metavar="I",
        type=int,
        action="append",
        default=[],
        help="SuperNode I is expected to refuse the run (its node config's privacy floor): every failure must be its "
        "refusal, and every other node must reply in every round; repeatable",
    )
    ap.add_argument("--kill-node", metavar="I@R", help="kill SuperNode I once round R has started")
    ap.add_argument(
        "--kill-signal",
        choices=["KILL", "TERM"],
        default="KILL",
        help="KILL = crash (default); TERM = graceful leave (the node deactivates itself)",
    )
    ap.add_argument("--restart-node", action="store_true", help="start the killed SuperNode again (same key)")
    ap.add_argument(
        "--unregistered-check",
        action="store_true",
        help="start one extra SuperNode with an unregistered key and check it is refused",
    )
    ap.add_argument(
        "--netns",
        action="store_true",
        help="each SuperNode in its own network namespace, and the operator too with the proxy (root)",
    )
    ap.add_argument(
        "--proxy",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="nginx in front of a loopback-only SuperLink: Fleet routes for the data holders, Control "
        "routes for the operator (default: on with --netns, off without)",
    )
    ap.add_argument(
        "--holder-check",
        action="store_true",
        help="from data holder 0's namespace, try to submit a run and register a key against every "
        "address it can reach; passes if all are refused (needs --netns and the proxy)",
    )
    ap.add_argument(
        "--data-files",
        metavar="DIR",
        help="each SuperNode reads its own DIR/node-<i>.npz (node config data-path) instead of a "
        "partition of the embedded data; missing files are exported from the run's data first",
    )
    ap.add_argument(
        "--workdir",
        help="keep certificates, keys, logs, state here (default: a temp dir); each data "
        "holder keeps its models, state and cached split in <workdir>/holders/node<i>/",
    )
    ap.add_argument(
        "--task-poll-interval",
        type=float,
        default=0.1,
        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL in s for the SuperLink and SuperNodes (default 0.1; "
        "Flower's default 1.0 adds up to a second to every message)",
    )
    ap.add_argument("--results-dir", help="results-dir for the run (default: <workdir>/results)")
    ap.add_argument("--startup-timeout", type=float, default=90.0)
    ap.add_argument("--run-timeout", type=float, default=1200.0)
    ap.add_argument("--quiet", action="store_true", help="do not echo the run's log stream")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.rounds < 1:
        ap.error(f"--nodes {args.nodes} / --rounds {args.rounds}: both must be >= 1")
    if not 0.01 <= args.task_poll_interval <= 60:
        ap.error(f"--task-poll-interval {args.task_poll_interval:g}: must be in [0.01, 60] s (Flower's limits)")
    args.kill = None
    if args.kill_node:
        i, sep, r = args.kill_node.partition("@")
        if not (sep and i.isdigit() and r.isdigit()):
            ap.error(f"--kill-node {args.kill_node!r}: expected I@R, e.g. 1@2 (SuperNode 1 in round 2)")
        args.kill = (int(i), int(r))
        if args.nodes < 2 or not (0 <= args.kill[0] < args.nodes) or not (1 <= args.kill[1] <= args.rounds):
            ap.error(
                f"--kill-node {args.kill_node}: needs --nodes >= 2, 0 <= I < {args.nodes} and 1 <= R <= {args.rounds}"
            )
    args.extra_node_config = {}
    for spec in args.node_config:
        i, sep, pairs = spec.partition(":")
        if not (sep and i.isdigit() and 0 <= int(i) < args.nodes and "=" in pairs):
            ap.error(f"--node-config {spec!r}: expected I:K=V ..., e.g. 1:dp-max-clip=0.5, with 0 <= I < {args.nodes}")
        args.extra_node_config[int(i)] = f"{args.extra_node_config.get(int(i), '')} {pairs}".strip()
    if any(not 0 <= i < args.nodes for i in args.refused_by) or len(set(args.refused_by)) >= args.nodes:
        ap.error(f"--refused-by {args.refused_by}: each I in [0, {args.nodes}), and at least one node that takes part")
    if args.refused_by and args.kill_node:
        ap.error("--refused-by and --kill-node check the run's failures in different ways: use one of them")
    if args.restart_node and not args.kill:
        ap.error("--restart-node needs --kill-node")
    if args.proxy is None:
        args.proxy = args.netns
    if args.holder_check and not (args.netns and args.proxy):
        ap.error("--holder-check needs --netns and the proxy (a data holder's own namespace, a Fleet-only listener)")
    return args


def skip_reason(args: argparse.Namespace) -> str | None:
    """A prerequisite this machine lacks (root / ip netns for --netns, nginx for the proxy), or None."""
    if args.netns and (reason := unavailable_reason()):
        return f"--netns: {reason}"
    if args.proxy and nginx_binary() is None:
        return "the proxy topology needs nginx (Debian: apt-get install nginx-light); or run with --no-proxy"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if reason := skip_reason(args):
        print(json.dumps({"ok": None, "skipped": True, "reason": reason}))
        say(f"SKIPPED: {reason}")
        return 0

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    cluster = Cluster(args)
    code = Exit.FLOWER_ERROR
    try:
        cluster.run()
        code = Exit.STOPPED if cluster.stopped else Exit.COMPLETED
        if cluster.report.get("outcome-of-run") == "budget-exhausted":  # dp-max-epsilon stopped it: as the job's
            code = Exit.BUDGET_EXHAUSTED
    except Refused as exc:
        code = Exit.REFUSED
        cluster.report["error"] = f"the run config was refused: {exc}"
        say(f"REFUSED (nothing was started): {exc}")
    except KeyboardInterrupt:
        code = Exit.INTERRUPTED
        cluster.report["error"] = "interrupted"
        say("interrupted; stopping everything")
    except (ClusterError, subprocess.SubprocessError, OSError, ValueError) as exc:
        cluster.report["error"] = str(exc)[-3000:]
        say(f"FAILED: {exc}")
        for p in [cluster.superlink, cluster.nginx.proc if cluster.nginx else None, *cluster.nodes.values()]:
            if p is not None:
                say(f"--- last lines of {p.log}\n{tail(p.log, 15)}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish cleaning up even on a second Ctrl-C
        cluster.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cluster.report["seconds"] = round(time.monotonic() - cluster.t0, 1)
        cluster.report["events"] = cluster.events
        say(f"certificates, keys, logs and state are in {cluster.work} (not deleted)")
    cluster.report["outcome"] = OUTCOMES[code]
    if cluster.stopped is not None:
        k, folder = cluster.stopped
        say(
            f"stopped after round {k} as asked (stop-after={k}); continue it with the same --workdir and "
            f"--run-config \"resume-from='{folder}'\""
        )
    print(json.dumps(cluster.report), flush=True)
    return int(code)


#: the JSON report's ``outcome`` for each exit status
OUTCOMES = {
    Exit.COMPLETED: "completed",
    Exit.FLOWER_ERROR: "failed",
    Exit.REFUSED: "refused",
    Exit.STOPPED: "stopped as asked",
    Exit.BUDGET_EXHAUSTED: "privacy budget exhausted",
    Exit.INTERRUPTED: "interrupted",
}


if __name__ == "__main__":
    sys.exit(main())
