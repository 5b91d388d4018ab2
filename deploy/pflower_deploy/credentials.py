"""Certificates, SuperNode keys and ``flwr`` connection files, made with the scripts a user runs by hand
(``deploy/make_certs.sh``, ``deploy/make_node_keys.sh``) so that the local cluster exercises them too."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from . import DEPLOY


def make_certs(folder: Path, names: list[str]) -> None:
    """A CA and one server certificate whose subjectAltName lists ``names`` (host names and IPs)."""
    subprocess.run(
        ["bash", str(DEPLOY / "make_certs.sh"), str(folder), ",".join(names)], check=True, stdout=subprocess.DEVNULL
    )


def make_node_keys(folder: Path, count: int) -> None:
    """``folder/node0`` ... ``node<count-1>`` (+ ``.pub``): ECDSA P-384 in OpenSSH format."""
    subprocess.run(
        ["bash", str(DEPLOY / "make_node_keys.sh"), str(folder), str(count)], check=True, stdout=subprocess.DEVNULL
    )


def make_key(folder: Path, name: str) -> Path:
    """One more key pair ``folder/name`` (e.g. a key nobody registers); returns the private key's path."""
    path = folder / name
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-C", f"pflower-{name}", "-f", str(path)],
            check=True,
        )
    return path


def write_connections(flwr_home: Path, connections: dict[str, str], ca: Path) -> None:
    """``flwr_home/config.toml`` with one TLS connection per name -> address (the first is the default)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    text = f'[superlink]\ndefault = "{next(iter(connections))}"\n'
    for name, address in connections.items():
        text += f'\n[superlink.{name}]\naddress = "{address}"\nroot-certificates = "{ca.resolve()}"\n'
    (flwr_home / "config.toml").write_text(text)


def parse_json_out(text: str) -> Any:
    """The JSON object a ``flwr ... --format json`` command printed (after any log lines)."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON in output: {text[-500:]}")
    return json.loads(text[start:])
