"""What a machine can reach: HTTP(S) requests and TCP connects, run as a script inside a network namespace
(``ip netns exec <ns> python probes.py --ca CA PROBE ...``); prints one JSON list, one result per probe.

A probe is ``KIND:METHOD:URL`` for HTTP (``https:POST:https://10.200.0.1:9093/v1/control/start-run``; ``http``
sends plain HTTP to what may be a TLS port) or ``tcp:HOST:PORT``. A result holds the HTTP status, or
``connected`` / the error (``refused``, ``unreachable``, ``timeout``, ``no such name``, or the exception's words).
Standard library only: it runs with this interpreter in any namespace.
"""

from __future__ import annotations

import argparse
import errno
import http.client
import json
import re
import socket
import ssl
import sys
from urllib.parse import urlsplit


def _error(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, socket.gaierror):
        return "no such name"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timeout"
    if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return "unreachable"
    return f"{type(exc).__name__}: {exc}"


def http_probe(method: str, url: str, ca: str | None, timeout: float = 5.0) -> dict:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"probe URL {url!r} names no host")
    if parts.scheme == "https":
        ctx = ssl.create_default_context(cafile=ca)
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout, context=ctx
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(
            method,
            parts.path or "/",
            body=b"" if method == "POST" else None,
            headers={"content-type": "application/protobuf"},
        )
        resp = conn.getresponse()
        body = resp.read(300).decode(errors="replace")
        title = re.search(r"<title>(.*?)</title>", body)  # nginx's error pages
        return {"status": resp.status, "body": (title.group(1) if title else body.strip())[:120]}
    except OSError as exc:
        return {"error": _error(exc)}
    finally:
        conn.close()


def tcp_probe(host: str, port: int, timeout: float = 5.0) -> dict:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return {"connected": True}
    except OSError as exc:
        return {"error": _error(exc)}


def run(probes: list[str], ca: str | None, timeout: float = 5.0) -> list[dict]:
    results = []
    for spec in probes:
        kind, _, rest = spec.partition(":")
        if kind in ("http", "https"):
            method, _, url = rest.partition(":")
            results.append({"probe": spec, **http_probe(method, url, ca, timeout)})
        elif kind == "tcp":
            host, _, port = rest.rpartition(":")
            results.append({"probe": spec, **tcp_probe(host, int(port), timeout)})
        else:
            raise SystemExit(f"probe {spec!r}: expected https:METHOD:URL, http:METHOD:URL or tcp:HOST:PORT")
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ca", help="CA certificate that verifies the HTTPS servers")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per probe (default 5)")
    ap.add_argument("probes", nargs="+")
    args = ap.parse_args(argv)
    json.dump(run(args.probes, args.ca, args.timeout), sys.stdout)


if __name__ == "__main__":
    main()
