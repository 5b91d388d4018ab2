"""Network namespaces that stand in for other machines: one per data holder and one for the operator, each
joined to this host (the SuperLink host) by its own veth pair. Only addresses in 10.200.0.0/16 (data holder k:
host side 10.200.k.1, namespace 10.200.k.2) and 10.201.0.0/30 (operator) are used, all on links made here.

Every namespace gets a default route through its veth pair, so a process in it can address *every* address
of the SuperLink host, as a machine on a routed network could: what it reaches is decided by what listens
where (and the proxy's rules), not by missing routes."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from .processes import ClusterError

OPERATOR = "pfl-op"


@dataclass(frozen=True)
class Link:
    ns: str
    host_if: str
    ns_if: str
    host_ip: str  # this host's address on the link (what the namespace connects to)
    ns_ip: str  # the namespace's own address (the source address the host sees)


def holder_link(k: int) -> Link:
    return Link(f"pfl-node{k}", f"pfl-h{k}", f"pfl-n{k}", f"10.200.{k}.1", f"10.200.{k}.2")


def operator_link() -> Link:
    return Link(OPERATOR, "pfl-hop", "pfl-nop", "10.201.0.1", "10.201.0.2")


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add / ip link add); this process is not root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip` on PATH"
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode != 0:
        return "`ip netns list` failed: no network-namespace support here"
    return None


def in_ns(link: Link | None, cmd: list[str]) -> list[str]:
    """``cmd`` run inside the link's namespace (unchanged for ``None``: this host's namespace)."""
    return cmd if link is None else ["ip", "netns", "exec", link.ns, *cmd]


class Namespaces:
    """Creates namespaces + veth pairs and deletes exactly those again."""

    def __init__(self) -> None:
        self.made: list[Link] = []

    def add(self, link: Link) -> Link:
        subprocess.run(
            ["ip", "link", "del", link.host_if], capture_output=True, check=False
        )  # leftovers of an earlier run
        subprocess.run(["ip", "netns", "del", link.ns], capture_output=True, check=False)
        steps = [
            ["ip", "netns", "add", link.ns],
            ["ip", "link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if],
            ["ip", "link", "set", link.ns_if, "netns", link.ns],
            ["ip", "addr", "add", f"{link.host_ip}/30", "dev", link.host_if],
            ["ip", "link", "set", link.host_if, "up"],
            in_ns(link, ["ip", "addr", "add", f"{link.ns_ip}/30", "dev", link.ns_if]),
            in_ns(link, ["ip", "link", "set", link.ns_if, "up"]),
            in_ns(link, ["ip", "link", "set", "lo", "up"]),
            in_ns(link, ["ip", "route", "add", "default", "via", link.host_ip]),
        ]
        for i, step in enumerate(steps):
            r = subprocess.run(step, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise ClusterError(f"{' '.join(step)} failed: {r.stderr.strip()}")
            if i == 0:
                self.made.append(link)
        return link

    def delete_all(self) -> None:
        for link in self.made:
            subprocess.run(["ip", "link", "del", link.host_if], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", link.ns], capture_output=True, check=False)
        self.made = []
