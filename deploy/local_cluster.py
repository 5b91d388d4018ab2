#!/usr/bin/env python3
"""Run pflower on Flower's deployment runtime on this machine: one SuperLink, N SuperNodes, TLS, node auth.

What it does, in order (every process it starts is its own process group and is stopped by id at the end,
also on failure and on Ctrl-C):

1. makes a CA + server certificate (``deploy/make_certs.sh``) and N SuperNode key pairs (ECDSA P-384,
   ``deploy/make_node_keys.sh``) in a work directory;
2. starts ``flower-superlink`` in deployment mode (no ``--simulation``) with TLS, ``--enable-supernode-auth``,
   its own ``--database`` file and ``FLWR_HOME``, runtime dependency installation disabled (the app runs in
   this Python environment), on a free port (Fleet, Control and Runtime APIs share one HTTPS port in 1.41);
3. writes ``$FLWR_HOME/config.toml`` with a ``[superlink.<name>]`` connection (address + root-certificates)
   and registers the N public keys with ``flwr supernode register <key.pub> <name>``;
4. starts N ``flower-supernode`` (``--root-certificates``, ``--auth-supernode-private-key``,
   ``--node-config "partition-id=i num-partitions=N"``, own Runtime API port, own ``FLWR_HOME``), optionally
   each in its own network namespace (``--netns``), and waits until all N are activated;
5. optionally starts one more SuperNode whose key was never registered and checks it is refused
   (``--unregistered-check``);
6. submits ``flwr run <repo> <name> --stream --run-config ...``, follows the log stream, optionally kills
   SuperNode i when round r starts (``--kill-node i@r``) and starts it again (``--restart-node``);
7. reads the results folder printed on the ``pflower ... -> <folder>`` line, checks ``summary.json``,
   prints one final JSON line and exits 0 if every check passed.

Standard library only. Example::

    python deploy/local_cluster.py --nodes 3 --rounds 3
    python deploy/local_cluster.py --nodes 3 --rounds 4 --kill-node 2@2 --restart-node --unregistered-check
    sudo python deploy/local_cluster.py --nodes 2 --rounds 2 --netns
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
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent
CONNECTION = "pflower-deploy"
ROUND_RE = re.compile(r"\[ROUND (\d+)/(\d+)\]")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
REJECT_RE = re.compile(r"round (\d+) (\w+): reply from node (\d+) rejected: (.*)")


def say(msg: str) -> None:
    print(f"[local_cluster {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no {path})"


def parse_json_out(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON in output: {text[-500:]}")
    return json.loads(text[start:])


class ClusterError(RuntimeError):
    pass


class Proc:
    """A child process in its own session/process group, with its output in a log file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path, cwd: Path,
                 pipe: bool = False) -> None:
        """``pipe``: stdout is a text pipe the caller reads (and copies to ``log`` itself)."""
        self.name, self.cmd, self.log = name, cmd, log
        out = subprocess.PIPE if pipe else open(log, "ab")
        self.popen = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      text=pipe or None, errors="replace" if pipe else None)
        if not pipe:
            out.close()
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds; also reaps the group's leftovers."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)  # children (superexec, clientapp/serverapp) left in the group
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class Cluster:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="pflower-deploy-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.home = self.work / "flwr-home"
        self.home.mkdir(exist_ok=True)
        self.certs = self.work / "certs"
        self.keys = self.work / "keys"
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.results = Path(args.results_dir).resolve() if args.results_dir else self.work / "results"
        self.port = free_port()
        self.superlink: Proc | None = None
        self.nodes: dict[int, Proc] = {}
        self.node_ids: dict[int, int] = {}
        self.run_proc: Proc | None = None
        self.unregistered: Proc | None = None
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.report: dict[str, Any] = {"ok": False, "nodes": args.nodes, "netns": bool(args.netns), "workdir": str(self.work)}

    # ------------------------------------------------------------------ helpers
    def event(self, what: str, **info: Any) -> None:
        e = {"t": round(time.monotonic() - self.t0, 1), "event": what, **info}
        self.events.append(e)
        say(what + (" " + json.dumps(info) if info else ""))

    def env(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(home)
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def flwr(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        exe = shutil.which("flwr") or "flwr"
        return subprocess.run([exe, *argv], env=self.env(self.home), cwd=self.work, capture_output=True, text=True,
                              timeout=timeout)

    def host_addr(self, k: int) -> str:
        """Address node k uses to reach the SuperLink."""
        return f"10.200.{k}.1" if self.args.netns else "127.0.0.1"

    # ------------------------------------------------------------------ set-up
    def make_credentials(self) -> None:
        names = ["localhost", "127.0.0.1"]
        if self.args.netns:
            names += [self.host_addr(k) for k in range(self.args.nodes + 1)]
        subprocess.run(["bash", str(DEPLOY / "make_certs.sh"), str(self.certs), ",".join(names)], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["bash", str(DEPLOY / "make_node_keys.sh"), str(self.keys), str(self.args.nodes)], check=True,
                       stdout=subprocess.DEVNULL)
        if self.args.unregistered_check:
            subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-C", "pflower-unregistered",
                            "-f", str(self.keys / "unregistered")], check=True)
        self.event("credentials", certs=str(self.certs), keys=str(self.keys), san=names)

    def setup_netns(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("--netns needs root (ip netns add / ip link add)")
        if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
            raise ClusterError("--netns needs a working `ip netns` (iproute2 and network-namespace support)")
        for k in range(self.args.nodes + (1 if self.args.unregistered_check else 0)):
            ns, host_if, node_if = f"pfl-node{k}", f"pfl-h{k}", f"pfl-n{k}"
            subprocess.run(["ip", "link", "del", host_if], capture_output=True)  # leftovers of an earlier run
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            cmds = [
                ["ip", "netns", "add", ns],
                ["ip", "link", "add", host_if, "type", "veth", "peer", "name", node_if],
                ["ip", "link", "set", node_if, "netns", ns],
                ["ip", "addr", "add", f"10.200.{k}.1/30", "dev", host_if],
                ["ip", "link", "set", host_if, "up"],
                ["ip", "netns", "exec", ns, "ip", "addr", "add", f"10.200.{k}.2/30", "dev", node_if],
                ["ip", "netns", "exec", ns, "ip", "link", "set", node_if, "up"],
                ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
            ]
            for i, c in enumerate(cmds):
                r = subprocess.run(c, capture_output=True, text=True)
                if r.returncode != 0:
                    raise ClusterError(f"{' '.join(c)} failed: {r.stderr.strip()}")
                if i == 0:
                    self.namespaces.append(ns)
                if i == 1:
                    self.links.append(host_if)
        self.event("netns", namespaces=self.namespaces)

    def start_superlink(self) -> None:
        host = "0.0.0.0" if self.args.netns else "127.0.0.1"
        cmd = [shutil.which("flower-superlink") or "flower-superlink",
               "--ssl-ca-certfile", str(self.certs / "ca.crt"), "--ssl-certfile", str(self.certs / "server.pem"),
               "--ssl-keyfile", str(self.certs / "server.key"), "--enable-supernode-auth",
               "--host", host, "--port", str(self.port), "--database", str(self.work / "superlink.db"),
               "--disable-runtime-dependency-installation"]
        self.superlink = Proc("superlink", cmd, self.env(self.home), self.logs / "superlink.log", self.work)
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        deadline = time.monotonic() + self.args.startup_timeout
        while time.monotonic() < deadline:
            if not self.superlink.alive():
                raise ClusterError(f"flower-superlink exited ({self.superlink.popen.returncode}):\n"
                                   + tail(self.superlink.log))
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/health", timeout=1, context=ctx) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise ClusterError("flower-superlink did not answer on /health in time:\n" + tail(self.superlink.log))
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{self.certs / "ca.crt"}"\n')
        self.event("superlink up", pid=self.superlink.pid, address=f"{host}:{self.port}", tls=True,
                   supernode_auth=True)

    def register(self) -> None:
        for k in range(self.args.nodes):
            r = self.flwr("supernode", "register", str(self.keys / f"node{k}.pub"), CONNECTION, "--name",
                          f"node{k}", "--format", "json")
            if r.returncode != 0:
                raise ClusterError(f"flwr supernode register node{k} failed:\n{r.stdout}\n{r.stderr}")
            self.node_ids[k] = int(parse_json_out(r.stdout)["node-id"])
        self.event("registered", node_ids={f"node{k}": str(v) for k, v in self.node_ids.items()})

    def node_config(self, part: int) -> str:
        """A partition of the embedded data, or with --data-files the node's own file (data-path)."""
        if self.args.data_files:
            return f"partition-id={part} data-path='{Path(self.args.data_files).resolve() / f'node-{part}.npz'}'"
        return f"partition-id={part} num-partitions={self.args.nodes}"

    def export_data_files(self) -> None:
        """--data-files: write node-<i>.npz (partition i of the run's data) for every node that has none."""
        folder = Path(self.args.data_files)
        if all((folder / f"node-{k}.npz").is_file() for k in range(self.args.nodes)):
            return
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "export_partitions.py"), "--out", str(folder),
               "--num-partitions", str(self.args.nodes), "--run-config", self.args.run_config]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ClusterError(f"exporting node data files failed:\n{r.stdout}\n{r.stderr}")
        self.event("data files", folder=str(folder.resolve()), nodes=self.args.nodes)

    def start_node(self, k: int, key: str | None = None, partition: int | None = None,
                   extra: list[str] | None = None) -> Proc:
        name = key or f"node{k}"
        home = self.work / "nodes" / name
        home.mkdir(parents=True, exist_ok=True)
        part = k if partition is None else partition
        cmd = [shutil.which("flower-supernode") or "flower-supernode",
               "--root-certificates", str(self.certs / "ca.crt"),
               "--superlink", f"{self.host_addr(k)}:{self.port}",
               "--auth-supernode-private-key", str(self.keys / name),
               "--node-config", self.node_config(part),
               "--port", str(free_port())] + (extra or [])
        if self.args.netns:
            cmd = ["ip", "netns", "exec", f"pfl-node{k}"] + cmd
        log = self.logs / f"{name}.log"
        proc = Proc(name, cmd, self.env(home), log, home)
        self.event("supernode started", name=name, pid=proc.pid, partition_id=part,
                   superlink=f"{self.host_addr(k)}:{self.port}", netns=f"pfl-node{k}" if self.args.netns else None)
        return proc

    def activated_id(self, proc: Proc, after: int = 0) -> int | None:
        """Node id from the "SuperNode ID: <id>" line the SuperNode logs once activated."""
        try:
            text = proc.log.read_bytes()[after:].decode(errors="replace")
        except OSError:
            return None
        m = re.search(r"SuperNode ID: (\d+)", text)
        return int(m.group(1)) if m else None

    def wait_activated(self, ks: list[int], offsets: dict[int, int] | None = None) -> None:
        deadline = time.monotonic() + self.args.startup_timeout
        pending = set(ks)
        while pending and time.monotonic() < deadline:
            for k in sorted(pending):
                proc = self.nodes[k]
                nid = self.activated_id(proc, (offsets or {}).get(k, 0))
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

    def start_unregistered(self) -> None:
        """Start a SuperNode with a key that was never registered (checked by :meth:`unregistered_check`)."""
        self.unregistered = self.start_node(self.args.nodes, key="unregistered", partition=0,
                                            extra=["--max-retries", "2", "--max-wait-time", "30"])

    def unregistered_check(self) -> None:
        """The SuperNode with the unregistered key must be refused: it exits with an auth error, the SuperLink
        logs the refused activation, and ``flwr supernode list`` shows only the registered nodes."""
        proc = self.unregistered
        try:
            proc.popen.wait(timeout=self.args.startup_timeout)
        except subprocess.TimeoutExpired:
            pass
        exited = proc.popen.poll()
        log = proc.log.read_text(errors="replace")
        sl_log = ANSI_RE.sub("", self.superlink.log.read_text(errors="replace"))
        listed = self.list_nodes()
        listed_ids = {int(n["node-id"]) for n in listed}
        online = sorted(int(n["node-id"]) for n in listed if n.get("status") == "online")
        node_refused = "Failed to activate SuperNode" in log or "Failed to initialize the connection" in log
        link_refused = "No SuperNode found with the given public key" in sl_log
        result = {
            "exit-code": exited,
            "supernode-log": " ".join(l.strip() for l in ANSI_RE.sub("", log).splitlines()
                                      if "Exit Code" in l or "Failed to" in l or "code: " in l),
            "superlink-log": " | ".join(f"{m.group(1)} ... {m.group(2)}" for m in re.finditer(
                r"(\[/v1/fleet/activate-node\]\[ApiError:\d+\]).*?(exception: [^\n]*)", sl_log)),
            "listed-nodes": len(listed_ids), "online-nodes": len(online),
            "unknown-ids-listed": sorted(listed_ids - set(self.node_ids.values())),
        }
        result["refused"] = bool(exited not in (None, 0) and node_refused and link_refused
                                 and listed_ids == set(self.node_ids.values()))
        proc.stop()
        self.unregistered = None
        self.report["unregistered-check"] = result
        self.event("unregistered supernode " + ("refused" if result["refused"] else "NOT refused"), **result)
        if not result["refused"]:
            raise ClusterError(f"unregistered SuperNode was not refused: {result}\n{log[-2000:]}")

    # ------------------------------------------------------------------ the run
    def run_config(self) -> str:
        a = self.args
        cfg: dict[str, str] = {
            "method": f"'{a.method}'",
            "num-server-rounds": str(a.rounds),
            "min-nodes": str(a.nodes - (1 if a.kill_node else 0)),
            "round-timeout": repr(float(a.round_timeout)),
            "results-dir": f"'{self.results}'",
        }
        for token in shlex.split(a.run_config or ""):
            key, sep, value = token.partition("=")
            if not sep:
                raise ClusterError(f"--run-config: expected key=value, got {token!r}")
            cfg[key.strip()] = value.strip()
        return " ".join(f"{k}={v}" for k, v in cfg.items())

    def submit_and_follow(self) -> Path:
        a = self.args
        kill = None
        if a.kill_node:
            i, _, r = a.kill_node.partition("@")
            kill = (int(i), int(r or 1))
            if not (0 <= kill[0] < a.nodes) or not (1 <= kill[1] <= a.rounds):
                raise ClusterError(f"--kill-node {a.kill_node}: need 0 <= i < {a.nodes} and 1 <= r <= {a.rounds}")
        run_config = self.run_config()
        exe = shutil.which("flwr") or "flwr"
        cmd = [exe, "run", str(REPO), CONNECTION, "--stream", "--run-config", run_config]
        self.event("flwr run", command=f'flwr run {REPO} {CONNECTION} --stream --run-config "{run_config}"')
        log_path = self.logs / "run.log"
        self.run_proc = Proc("flwr-run", cmd, self.env(self.home), log_path, REPO, pipe=True)
        proc = self.run_proc.popen
        lines: queue.Queue = queue.Queue()

        def reader() -> None:
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + a.run_timeout
        out: list[str] = []
        killed_at: float | None = None
        restarted = False
        log_offset = 0
        with open(log_path, "w") as logf:
            while True:
                try:
                    line = lines.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise ClusterError(f"run did not finish in {a.run_timeout} s")
                    continue
                if line is None:
                    break
                logf.write(line)
                logf.flush()
                out.append(line)
                if not a.quiet:
                    sys.stdout.write("    | " + line)
                    sys.stdout.flush()
                m = ROUND_RE.search(line)
                if kill and m and int(m.group(1)) == kill[1] and killed_at is None:
                    k = kill[0]
                    self.nodes[k].signal_group(signal.SIGKILL if a.kill_signal == "KILL" else signal.SIGTERM)
                    self.nodes[k].popen.wait(timeout=30)
                    killed_at = time.monotonic()
                    self.event("killed supernode", node=f"node{k}", node_id=str(self.node_ids[k]), round=kill[1],
                               signal=a.kill_signal, pid=self.nodes[k].pid)
                    continue
                if kill and a.restart_node and killed_at is not None and not restarted:
                    rej = REJECT_RE.search(line)
                    next_round = m is not None and int(m.group(1)) > kill[1]
                    # the missing reply comes back as an error reply created by the SuperLink ("Node
                    # Unavailable", src node 1 = the SuperLink) once the node missed its heartbeats
                    gone = rej is not None and int(rej.group(1)) == kill[1] and (
                        int(rej.group(3)) == self.node_ids[kill[0]] or "Unavailable" in rej.group(4))
                    if next_round or gone:
                        k = kill[0]
                        log_offset = len(self.nodes[k].log.read_bytes())
                        self.nodes[k] = self.start_node(k)
                        restarted = True
                        self.event("restarted supernode", node=f"node{k}", after=line.strip()[-120:])
        proc.wait(timeout=60)
        text = "".join(out)
        self.report["flwr-run-exit"] = proc.returncode
        if kill:
            self.report["killed"] = {"node": kill[0], "node-id": str(self.node_ids[kill[0]]), "round": kill[1],
                                     "signal": a.kill_signal, "done": killed_at is not None}
        if kill and a.restart_node:
            k = kill[0]
            nid = self.activated_id(self.nodes[k], log_offset) if restarted else None
            later = self.nodes[k].log.read_bytes()[log_offset:].decode(errors="replace") if restarted else ""
            self.report["restarted"] = {
                "node": k, "restarted": restarted, "rejoined-as": str(nid) if nid else None,
                "same-node-id": nid == self.node_ids[k],
                "messages-after-restart": len(re.findall(r"Receiving: \w+ message", later)),
            }
        summary_lines = [l for l in text.splitlines() if l.startswith("pflower ")]
        m = re.search(r"-> (\S+)\s*$", summary_lines[-1]) if summary_lines else None
        if proc.returncode != 0 or m is None:
            raise ClusterError(f"flwr run failed (exit {proc.returncode}); no 'pflower ... -> <folder>' line:\n"
                               + "".join(out[-40:]))
        self.report["summary-line"] = summary_lines[-1]
        return Path(m.group(1))

    def check_results(self, folder: Path) -> None:
        summary_path = folder / "summary.json"
        if not summary_path.exists():
            raise ClusterError(f"{summary_path} missing")
        summary = json.loads(summary_path.read_text())
        failures = json.loads((folder / "failures.json").read_text()) if (folder / "failures.json").exists() else []
        rounds = json.loads((folder / "rounds.json").read_text()) if (folder / "rounds.json").exists() else []
        self.report.update({
            "results": str(folder), "method": summary.get("method"), "rounds": summary.get("rounds"),
            "clients": summary.get("clients"), "accuracy": summary.get("personal-acc"),
            "global-accuracy": summary.get("global-acc"), "failures": len(failures),
            "failure-reasons": sorted({f"round {f['round']} {f['phase']} node {f['node-id']}: {f['reason'][:90]}"
                                       for f in failures}),
            "replies-per-round": [{"round": r["round"], "train": r.get("train", {}).get("num-replies"),
                                   "evaluate": r.get("evaluate", {}).get("num-replies")} for r in rounds],
        })
        problems = []
        if summary.get("rounds") != self.args.rounds:
            problems.append(f"summary rounds {summary.get('rounds')} != {self.args.rounds}")
        if not self.args.kill_node:
            full = all(r["train"] == self.args.nodes for r in self.report["replies-per-round"])
            if not full or failures:
                problems.append(f"expected {self.args.nodes} replies per round and no failures")
        else:
            _, _, r = self.args.kill_node.partition("@")
            kr = int(r or 1)
            fewer = any(x["round"] == kr and (x["train"] or 0) < self.args.nodes for x in self.report["replies-per-round"])
            if not (fewer or any(f["round"] == kr for f in failures)):
                problems.append(f"kill in round {kr} left no trace (no failure, no missing reply)")
            self.report["kill-observed"] = {"fewer-replies": fewer,
                                            "failure-recorded": any(f["round"] == kr for f in failures)}
        self.report["problems"] = problems
        if problems:
            raise ClusterError("; ".join(problems))

    # ------------------------------------------------------------------ all of it
    def run(self) -> None:
        if self.args.netns:
            self.setup_netns()
        self.make_credentials()
        self.start_superlink()
        self.register()
        if self.args.data_files:
            self.export_data_files()
        for k in range(self.args.nodes):
            self.nodes[k] = self.start_node(k)
        if self.args.unregistered_check:
            self.start_unregistered()
        self.wait_activated(list(range(self.args.nodes)))
        self.event("all SuperNodes activated",
                   nodes=[f"{n['node-id']}:{n['status']}" for n in self.list_nodes()])
        if self.args.unregistered_check:
            self.unregistered_check()
        folder = self.submit_and_follow()
        self.check_results(folder)
        if self.args.restart_node and self.args.kill_node:
            listed = {int(n["node-id"]): n["status"] for n in self.list_nodes()}
            k = int(self.args.kill_node.partition("@")[0])
            self.report["restarted"]["status-after-run"] = listed.get(self.node_ids[k])
        self.report["ok"] = True

    def stop(self) -> None:
        for p in [self.run_proc, self.unregistered, *self.nodes.values(), self.superlink]:
            if p is not None:
                p.stop()
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        left = [p.pid for p in [self.run_proc, *self.nodes.values(), self.superlink] if p is not None and p.alive()]
        if left:
            say(f"WARNING: processes still alive after stop: {left}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3, help="number of SuperNodes (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="num-server-rounds (default 3)")
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--run-config", default="", help="extra run-config pairs, e.g. \"local-epochs=2 model='mlp'\"")
    ap.add_argument("--round-timeout", type=float, default=120.0,
                    help="run-config round-timeout in s (default 120: a crashed node is declared offline by the "
                         "SuperLink within 2 heartbeats = 60 s, and its missing reply becomes an error reply)")
    ap.add_argument("--kill-node", metavar="I@R", help="kill SuperNode I once round R has started")
    ap.add_argument("--kill-signal", choices=["KILL", "TERM"], default="KILL",
                    help="KILL = crash (default); TERM = graceful leave (the node deactivates itself)")
    ap.add_argument("--restart-node", action="store_true", help="start the killed SuperNode again (same key)")
    ap.add_argument("--unregistered-check", action="store_true",
                    help="start one extra SuperNode with an unregistered key and check it is refused")
    ap.add_argument("--netns", action="store_true", help="each SuperNode in its own network namespace (root)")
    ap.add_argument("--data-files", metavar="DIR",
                    help="each SuperNode reads its own DIR/node-<i>.npz (node config data-path) instead of a "
                         "partition of the embedded data; missing files are exported from the run's data first")
    ap.add_argument("--workdir", help="keep certificates, keys, logs, state here (default: a temp dir)")
    ap.add_argument("--results-dir", help="results-dir for the run (default: <workdir>/results)")
    ap.add_argument("--startup-timeout", type=float, default=90.0)
    ap.add_argument("--run-timeout", type=float, default=1200.0)
    ap.add_argument("--quiet", action="store_true", help="do not echo the run's log stream")
    args = ap.parse_args(argv)
    if args.restart_node and not args.kill_node:
        ap.error("--restart-node needs --kill-node")
    if args.kill_node and args.nodes < 2:
        ap.error("--kill-node needs --nodes >= 2")

    if args.netns:
        probe = shutil.which("ip") and subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0
        if os.geteuid() != 0 or not probe:
            print(json.dumps({"ok": None, "skipped": True, "reason": "--netns needs root and a working `ip netns`"}))
            say("SKIPPED: --netns needs root and a working `ip netns` (iproute2, network namespaces)")
            return 0

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    cluster = Cluster(args)
    code = 1
    try:
        cluster.run()
        code = 0
    except KeyboardInterrupt:
        cluster.report["error"] = "interrupted"
        say("interrupted; stopping everything")
    except (ClusterError, subprocess.SubprocessError, OSError, ValueError) as exc:
        cluster.report["error"] = str(exc)[-3000:]
        say(f"FAILED: {exc}")
        for p in [cluster.superlink, *cluster.nodes.values()]:
            if p is not None:
                say(f"--- last lines of {p.log}\n{tail(p.log, 15)}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish cleaning up even on a second Ctrl-C
        cluster.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cluster.report["seconds"] = round(time.monotonic() - cluster.t0, 1)
        cluster.report["events"] = cluster.events
        say(f"certificates, keys, logs and state are in {cluster.work} (not deleted)")
    print(json.dumps(cluster.report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
