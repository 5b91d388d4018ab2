"""The whole deployment on one machine: SuperLink, optional nginx proxy, N SuperNodes, one run.

Topologies (``Cluster.proxied``):
- ``proxy`` (the default with ``--netns``): the SuperLink listens on 127.0.0.1 only; nginx exposes the Fleet
  routes on the data holders' addresses and the Control routes on the operator's address, to the operator
  only. With ``--netns`` every data holder and the operator are network namespaces of their own.
- ``direct``: SuperNodes and ``flwr`` talk to the SuperLink's one port (Fleet, Control and Runtime APIs).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from server_app.job import check_run_config
from server_app.runner import free_port, results_folder_from_output, stopped_after, summary_line

from . import REPO, checks
from .credentials import make_certs, make_key, make_node_keys, parse_json_out, write_connections
from .netns import Link, Namespaces, holder_link, in_ns, operator_link
from .processes import ClusterError, Proc, say, tail, wait_healthy
from .proxy import Nginx, ProxyPlan

CONNECTION = "pflower-deploy"
ROUND_RE = re.compile(r"\[ROUND (\d+)/(\d+)\]")
REJECT_RE = re.compile(r"round (\d+) (\w+): reply from node (\d+) rejected: (.*)")


class Cluster:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="pflower-deploy-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.home = self.work / "flwr-home"  # the operator's FLWR_HOME
        self.certs, self.keys, self.logs = self.work / "certs", self.work / "keys", self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        earlier = [f for f in self.logs.iterdir() if f.is_file()]
        if earlier:  # a work directory used again: keep the last cluster's logs apart (they are read for node ids)
            keep = self.logs / "earlier" / time.strftime("%Y%m%d-%H%M%S")
            keep.mkdir(parents=True, exist_ok=True)
            for f in earlier:
                f.rename(keep / f.name)
        self.results = Path(args.results_dir).resolve() if args.results_dir else self.work / "results"
        self.proxied = bool(args.proxy)
        self.superlink_port = free_port()
        self.fleet_port = free_port() if self.proxied else self.superlink_port
        self.control_port = free_port() if self.proxied else self.superlink_port
        self.operator: Link | None = operator_link() if (args.netns and self.proxied) else None
        self.netns = Namespaces()
        self.nginx: Nginx | None = None
        self.superlink: Proc | None = None
        self.nodes: dict[int, Proc] = {}
        self.node_ids: dict[int, int] = {}
        self.run_proc: Proc | None = None
        self.unregistered: Proc | None = None
        self.stopped: tuple[int, Path] | None = None  # (round, results folder) of a run stop-after stopped
        self.events: list[dict[str, Any]] = []
        self.report: dict[str, Any] = {
            "ok": False,
            "nodes": args.nodes,
            "netns": bool(args.netns),
            "topology": "proxy" if self.proxied else "direct",
            "workdir": str(self.work),
        }

    # ------------------------------------------------------------------ helpers
    def event(self, what: str, **info: Any) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 1), "event": what, **info})
        say(what + (" " + json.dumps(info) if info else ""))

    def env(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            FLWR_HOME=str(home),
            FLWR_DISABLE_UPDATE_CHECK="1",
            PYTHONUNBUFFERED="1",
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        )
        # how often the SuperExec (SuperLink: ServerApp; SuperNode: ClientApp) asks for a new task; Flower's
        # default 1 s is paid by every message
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = f"{self.args.task_poll_interval:g}"
        return env

    def holder(self, k: int) -> Link | None:
        """Data holder k's namespace (None without --netns: it shares this host's loopback)."""
        return holder_link(k) if self.args.netns else None

    def fleet_address(self, k: int) -> str:
        """Where data holder k's SuperNode connects: the proxy's fleet listener, or the SuperLink itself."""
        link = self.holder(k)
        return f"{link.host_ip if link else '127.0.0.1'}:{self.fleet_port}"

    def control_address(self) -> str:
        """Where the operator's ``flwr`` connects."""
        return f"{self.operator.host_ip if self.operator else '127.0.0.1'}:{self.control_port}"

    def flwr(
        self,
        *argv: str,
        timeout: float = 120.0,
        link: Link | None = None,
        home: Path | None = None,
    ) -> subprocess.CompletedProcess:
        """A ``flwr`` command as the operator (in its namespace, if it has one), or from ``link``'s namespace."""
        cmd = in_ns(link or self.operator, [shutil.which("flwr") or "flwr", *argv])
        return subprocess.run(
            cmd,
            env=self.env(home or self.home),
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def extra_node(self) -> int:
        """Index of the SuperNode with the unregistered key (after the N registered ones)."""
        return self.args.nodes

    # ------------------------------------------------------------------ set-up
    def setup_netns(self) -> None:
        for k in range(self.args.nodes + (1 if self.args.unregistered_check else 0)):
            self.netns.add(holder_link(k))
        if self.operator:
            self.netns.add(self.operator)
        self.event("netns", namespaces=[link.ns for link in self.netns.made])

    def make_credentials(self) -> None:
        names = ["localhost", "127.0.0.1"] + [link.host_ip for link in self.netns.made]
        make_certs(self.certs, names)
        make_node_keys(self.keys, self.args.nodes)
        if self.args.unregistered_check:
            make_key(self.keys, "unregistered")
        self.event("credentials", certs=str(self.certs), keys=str(self.keys), san=names)

    def start_superlink(self) -> None:
        # proxied: loopback only. Direct with --netns: every address (the namespaces reach it over their veth).
        host = "0.0.0.0" if (self.args.netns and not self.proxied) else "127.0.0.1"
        # a work directory used again (to resume a run): Flower's own state of the last cluster (the SuperLink's
        # registered keys and runs, the SuperNodes' homes with their node ids) is not needed - a run continues
        # from pflower's checkpoint and the holders' folders - and would clash with the new registration
        for old in self.work.glob("superlink.db*"):
            old.unlink()
        shutil.rmtree(self.work / "nodes", ignore_errors=True)
        cmd = [
            shutil.which("flower-superlink") or "flower-superlink",
            "--ssl-ca-certfile",
            str(self.certs / "ca.crt"),
            "--ssl-certfile",
            str(self.certs / "server.pem"),
            "--ssl-keyfile",
            str(self.certs / "server.key"),
            "--enable-supernode-auth",
            "--host",
            host,
            "--port",
            str(self.superlink_port),
            "--database",
            str(self.work / "superlink.db"),
            "--disable-runtime-dependency-installation",
        ]
        self.superlink = Proc("flower-superlink", cmd, self.env(self.home), self.logs / "superlink.log", self.work)
        wait_healthy(
            self.superlink,
            f"https://127.0.0.1:{self.superlink_port}/health",
            self.certs / "ca.crt",
            self.args.startup_timeout,
        )
        self.event(
            "superlink up",
            pid=self.superlink.pid,
            address=f"{host}:{self.superlink_port}",
            tls=True,
            supernode_auth=True,
        )

    def start_proxy(self) -> None:
        holders = range(self.args.nodes + (1 if self.args.unregistered_check else 0))
        plan = ProxyPlan(
            superlink=f"127.0.0.1:{self.superlink_port}",
            fleet=sorted({self.fleet_address(k) for k in holders}),
            control=[self.control_address()],
            operators=[self.operator.ns_ip if self.operator else "127.0.0.1"],
            cert=self.certs / "server.pem",
            key=self.certs / "server.key",
            ca=self.certs / "ca.crt",
        )
        self.nginx = Nginx(plan, self.work / "proxy", self.logs)
        proc = self.nginx.start(self.env(self.home))
        wait_healthy(proc, f"https://{plan.fleet[0]}/health", self.certs / "ca.crt", self.args.startup_timeout)
        self.event(
            "proxy up",
            pid=proc.pid,
            fleet=plan.fleet,
            control=plan.control,
            operators=plan.operators,
            superlink=plan.superlink,
            config=str(self.nginx.folder / "pflower.conf"),
        )
        self.report["addresses"] = {
            "superlink": plan.superlink,
            "fleet": plan.fleet,
            "control": plan.control,
            "operators": plan.operators,
        }

    def register(self) -> None:
        write_connections(self.home, {CONNECTION: self.control_address()}, self.certs / "ca.crt")
        for k in range(self.args.nodes):
            r = self.flwr(
                "supernode",
                "register",
                str(self.keys / f"node{k}.pub"),
                CONNECTION,
                "--name",
                f"node{k}",
                "--format",
                "json",
            )
            if r.returncode != 0:
                raise ClusterError(f"flwr supernode register node{k} failed:\n{r.stdout}\n{r.stderr}")
            out = parse_json_out(r.stdout)
            if "node-id" not in out:
                raise ClusterError(f"flwr supernode register node{k} gave no node id:\n{r.stdout}\n{r.stderr}")
            self.node_ids[k] = int(out["node-id"])
        self.event(
            "registered",
            node_ids={f"node{k}": str(v) for k, v in self.node_ids.items()},
            via=self.control_address(),
            operator_netns=self.operator.ns if self.operator else None,
        )

    def node_dir(self, part: int) -> Path:
        """What data holder ``part`` keeps on its own disk: its personalized models, the state its method keeps
        between rounds, its cached partition (kept across runs of the same work directory)."""
        return self.work / "holders" / f"node{part}"

    def node_config(self, part: int) -> str:
        """A partition of the embedded data, or with --data-files the node's own file (data-path); the node's
        own folders for models (model-dir), state between rounds (state-dir) and its cached split (cache-dir)."""
        own = self.node_dir(part)
        dirs = f"model-dir='{own / 'models'}' state-dir='{own / 'state'}' cache-dir='{own / 'cache'}'"
        extra = self.args.extra_node_config.get(part)
        if extra:  # --node-config: e.g. the data holder's privacy floor
            dirs += f" {extra}"
        if self.args.data_files:
            return (
                f"partition-id={part} data-path='{Path(self.args.data_files).resolve() / f'node-{part}.npz'}' " + dirs
            )
        return f"partition-id={part} num-partitions={self.args.nodes} {dirs}"

    def export_data_files(self) -> None:
        """--data-files: write node-<i>.npz (partition i of the run's data) for every node that has none; a file a
        data holder brought stays as it is."""
        folder = Path(self.args.data_files)
        missing = [k for k in range(self.args.nodes) if not (folder / f"node-{k}.npz").is_file()]
        if not missing:
            return
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".export-") as scratch:
            cmd = [
                sys.executable,
                "-m",
                "deploy.export_partitions",
                "--out",
                str(Path(scratch).resolve()),
                "--num-partitions",
                str(self.args.nodes),
                "--run-config",
                self.args.run_config,
            ]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
            if r.returncode != 0:
                raise ClusterError(f"exporting node data files failed:\n{r.stdout}\n{r.stderr}")
            for k in missing:
                (Path(scratch) / f"node-{k}.npz").replace(folder / f"node-{k}.npz")
        self.event("data files", folder=str(folder.resolve()), nodes=self.args.nodes, exported=missing)

    def start_node(
        self, k: int, key: str | None = None, partition: int | None = None, extra: list[str] | None = None
    ) -> Proc:
        name = key or f"node{k}"
        home = self.work / "nodes" / name
        home.mkdir(parents=True, exist_ok=True)
        part = k if partition is None else partition
        cmd = in_ns(
            self.holder(k),
            [
                shutil.which("flower-supernode") or "flower-supernode",
                "--root-certificates",
                str(self.certs / "ca.crt"),
                "--superlink",
                self.fleet_address(k),
                "--auth-supernode-private-key",
                str(self.keys / name),
                "--node-config",
                self.node_config(part),
                "--port",
                str(free_port()),
            ]
            + (extra or []),
        )
        proc = Proc(name, cmd, self.env(home), self.logs / f"{name}.log", home)
        link = self.holder(k)
        self.event(
            "supernode started",
            name=name,
            pid=proc.pid,
            partition_id=part,
            superlink=self.fleet_address(k),
            netns=link.ns if link else None,
        )
        return proc

    def activated_id(self, proc: Proc, after: int = 0) -> int | None:
        """Node id from the "SuperNode ID: <id>" line the SuperNode logs once activated (live progress)."""
        try:
            text = proc.log.read_bytes()[after:].decode(errors="replace")
        except OSError:
            return None
        m = re.search(r"SuperNode ID: (\d+)", text)
        return int(m.group(1)) if m else None

    def wait_activated(self, ks: list[int]) -> None:
        deadline = time.monotonic() + self.args.startup_timeout
        pending = set(ks)
        while pending and time.monotonic() < deadline:
            for k in sorted(pending):
                proc = self.nodes[k]
                nid = self.activated_id(proc)
                if nid is not None:
                    if nid != self.node_ids[k]:
                        raise ClusterError(f"node{k} activated as {nid}, registered as {self.node_ids[k]}")
                    pending.discard(k)
                elif not proc.alive():
                    raise ClusterError(f"node{k} exited ({proc.popen.returncode}):\n{tail(proc.log)}")
            time.sleep(0.5)
        if pending:
            raise ClusterError(f"SuperNodes {sorted(pending)} not activated in {self.args.startup_timeout} s")

    def list_nodes(self) -> list[dict[str, Any]]:
        r = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        if r.returncode != 0:
            raise ClusterError(f"flwr supernode list failed:\n{r.stdout}\n{r.stderr}")
        return parse_json_out(r.stdout).get("nodes", [])

    def list_runs(self) -> list[dict[str, Any]]:
        r = self.flwr("ls", CONNECTION, "--format", "json")
        if r.returncode != 0:
            raise ClusterError(f"flwr ls failed:\n{r.stdout}\n{r.stderr}")
        return parse_json_out(r.stdout).get("runs", [])

    def start_unregistered(self) -> None:
        """A SuperNode with a key that was never registered (checked by checks.unregistered_check)."""
        self.unregistered = self.start_node(
            self.extra_node(), key="unregistered", partition=0, extra=["--max-retries", "2", "--max-wait-time", "30"]
        )

    # ------------------------------------------------------------------ the run
    def run_config(self) -> str:
        a = self.args
        cfg: dict[str, str] = {
            "method": f"'{a.method}'",
            "num-server-rounds": str(a.rounds),
            "min-nodes": str(a.nodes - (1 if a.kill else 0)),
            "round-timeout": repr(float(a.round_timeout)),
            "results-dir": f"'{self.results}'",
        }
        for token in shlex.split(a.run_config or "", posix=False):  # keep the quotes of string values
            key, sep, value = token.partition("=")
            if not sep:
                raise ClusterError(f"--run-config: expected key=value, got {token!r}")
            cfg[key.strip()] = value.strip()
        return " ".join(f"{k}={v}" for k, v in cfg.items())

    def submit_and_follow(self) -> Path:
        """``flwr run --stream`` as the operator; the stream is watched only for live actions (kill at round R,
        restart once the loss is recorded); the facts about the run come from its results folder."""
        a = self.args
        run_config = self.run_config()
        cmd = in_ns(
            self.operator,
            [shutil.which("flwr") or "flwr", "run", str(REPO), CONNECTION, "--stream", "--run-config", run_config],
        )
        self.event(
            "flwr run",
            command=f'flwr run {REPO} {CONNECTION} --stream --run-config "{run_config}"',
            via=self.control_address(),
            operator_netns=self.operator.ns if self.operator else None,
        )
        log_path = self.logs / "run.log"
        self.run_proc = Proc("flwr-run", cmd, self.env(self.home), log_path, REPO, pipe=True)
        proc = self.run_proc.popen
        lines: queue.Queue = queue.Queue()
        stdout = proc.stdout
        assert stdout is not None  # Proc(pipe=True) pipes stdout

        def reader() -> None:
            for line in stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + a.run_timeout
        out: list[str] = []
        killed_at: float | None = None
        restarted = False
        log_offset = 0
        with log_path.open("w") as logf:
            while True:
                try:
                    line = lines.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise ClusterError(f"run did not finish in {a.run_timeout} s") from None
                    continue
                if line is None:
                    break
                logf.write(line)
                logf.flush()
                out.append(line)
                if not a.quiet:
                    sys.stdout.write("    | " + line)
                    sys.stdout.flush()
                if not a.kill:
                    continue
                k, kill_round = a.kill
                m = ROUND_RE.search(line)
                if m and int(m.group(1)) == kill_round and killed_at is None:
                    self.nodes[k].signal_group(signal.SIGKILL if a.kill_signal == "KILL" else signal.SIGTERM)
                    self.nodes[k].popen.wait(timeout=30)
                    killed_at = time.monotonic()
                    self.event(
                        "killed supernode",
                        node=f"node{k}",
                        node_id=str(self.node_ids[k]),
                        round=kill_round,
                        signal=a.kill_signal,
                        pid=self.nodes[k].pid,
                    )
                    continue
                if a.restart_node and killed_at is not None and not restarted:
                    rej = REJECT_RE.search(line)
                    next_round = m is not None and int(m.group(1)) > kill_round
                    # the missing reply comes back as an error reply created by the SuperLink ("Node
                    # Unavailable", src node 1 = the SuperLink) once the node missed its heartbeats
                    gone = (
                        rej is not None
                        and int(rej.group(1)) == kill_round
                        and (int(rej.group(3)) == self.node_ids[k] or "Unavailable" in rej.group(4))
                    )
                    if next_round or gone:
                        log_offset = len(self.nodes[k].log.read_bytes())
                        self.nodes[k] = self.start_node(k)
                        restarted = True
                        self.event("restarted supernode", node=f"node{k}", after=line.strip()[-120:])
        proc.wait(timeout=60)
        text = "".join(out)
        self.report["flwr-run-exit"] = proc.returncode
        if a.kill:
            k, kill_round = a.kill
            self.report["killed"] = {
                "node": k,
                "node-id": str(self.node_ids[k]),
                "round": kill_round,
                "signal": a.kill_signal,
                "done": killed_at is not None,
            }
            if a.restart_node:
                nid = self.activated_id(self.nodes[k], log_offset) if restarted else None
                later = self.nodes[k].log.read_bytes()[log_offset:].decode(errors="replace") if restarted else ""
                self.report["restarted"] = {
                    "node": k,
                    "restarted": restarted,
                    "rejoined-as": str(nid) if nid else None,
                    "same-node-id": nid == self.node_ids[k],
                    "messages-after-restart": len(re.findall(r"Receiving: \w+ message", later)),
                }
        folder = results_folder_from_output(text)
        self.stopped = stopped_after(text)
        if self.stopped is not None:  # stop-after: the ServerApp stopped after that round's checkpoint, as asked
            self.report["stopped-after"], self.report["resume-from"] = self.stopped[0], str(self.stopped[1])
            return self.stopped[1]
        if proc.returncode != 0 or folder is None:
            raise ClusterError(
                f"flwr run failed (exit {proc.returncode}); no 'pflower ... -> <folder>' line:\n" + "".join(out[-40:])
            )
        self.report["summary-line"] = summary_line(text)
        return folder

    # ------------------------------------------------------------------ all of it
    def run(self) -> None:
        # the run config, checked with the ServerApp's own parser before anything starts (raises Refused)
        check_run_config(str(REPO), [self.run_config()])
        if self.args.netns:
            self.setup_netns()
        self.make_credentials()
        self.start_superlink()
        if self.proxied:
            self.start_proxy()
        self.register()
        if self.args.data_files:
            self.export_data_files()
        for k in range(self.args.nodes):
            self.nodes[k] = self.start_node(k)
        if self.args.unregistered_check:
            self.start_unregistered()
        self.wait_activated(list(range(self.args.nodes)))
        self.event("all SuperNodes activated", nodes=[f"{n['node-id']}:{n['status']}" for n in self.list_nodes()])
        if self.args.unregistered_check:
            checks.unregistered_check(self)
        if self.args.holder_check:
            checks.holder_check(self)
        folder = self.submit_and_follow()
        if self.stopped is not None:
            checks.check_stopped(self, folder, self.stopped[0])
        else:
            checks.check_results(self, folder)
        if self.args.restart_node:
            listed = {int(n["node-id"]): n["status"] for n in self.list_nodes()}
            self.report["restarted"]["status-after-run"] = listed.get(self.node_ids[self.args.kill[0]])
        self.report["ok"] = True

    def stop(self) -> None:
        procs = [
            self.run_proc,
            self.unregistered,
            *self.nodes.values(),
            self.superlink,
            self.nginx.proc if self.nginx else None,
        ]
        for p in procs:
            if p is not None:
                p.stop()
        self.netns.delete_all()
        left = [p.pid for p in procs if p is not None and p.alive()]
        if left:
            say(f"WARNING: processes still alive after stop: {left}")
