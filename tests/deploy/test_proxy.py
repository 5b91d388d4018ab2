"""The nginx proxy in front of the SuperLink (deploy/nginx/pflower.conf.in), against a stand-in SuperLink.

A small HTTPS server plays the SuperLink (it records what reaches it), nginx runs the rendered configuration
on loopback: the fleet listener must pass the Fleet routes with the node-authentication headers unchanged
and nothing else; the control listener must pass the Control routes to the operator's address only. Seconds,
no root; skipped where nginx or openssl is missing. The same configuration in front of a real SuperLink, with
namespaces, is tested in tests/deploy/test_local_cluster.py.
"""

from __future__ import annotations

import http.client
import shutil
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from deploy.pflower_deploy.processes import wait_healthy
from deploy.pflower_deploy.proxy import Nginx, ProxyPlan, nginx_binary
from server_app.runner import free_port

ROOT = Path(__file__).resolve().parents[2]
#: the script, run as the guide runs it (from the repository root: its cwd in every call below)
MAKE_PROXY_CONF = [sys.executable, "-m", "deploy.make_proxy_conf"]

if nginx_binary() is None or shutil.which("openssl") is None:
    pytest.skip("the proxy tests need nginx (Debian: apt-get install nginx-light) and openssl", allow_module_level=True)

OPERATOR = "127.0.0.2"  # the operator's source address (all of 127.0.0.0/8 is loopback on Linux)
AUTH_HEADERS = {
    "flwr-public-key": "cHVibGljLWtleQ==",
    "flwr-signature": "c2lnbmF0dXJl",
    "flwr-timestamp": "2026-11-23T12:00:00.000000+00:00",
}


class StandIn(BaseHTTPRequestHandler):
    """Answers 200 to everything and records (method, path, headers, body)."""

    seen: ClassVar[list[tuple[str, str, dict, bytes]]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0) or 0))
        StandIn.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    work = tmp_path_factory.mktemp("proxy")
    certs = work / "certs"
    subprocess.run(
        ["bash", str(ROOT / "deploy" / "make_certs.sh"), str(certs), "localhost,127.0.0.1"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    upstream = ThreadingHTTPServer(("127.0.0.1", free_port()), StandIn)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "server.pem", certs / "server.key")
    upstream.socket = ctx.wrap_socket(upstream.socket, server_side=True)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    plan = ProxyPlan(
        superlink=f"127.0.0.1:{upstream.server_address[1]}",
        fleet=[f"127.0.0.1:{free_port()}"],
        control=[f"127.0.0.1:{free_port()}"],
        operators=[OPERATOR],
        cert=certs / "server.pem",
        key=certs / "server.key",
        ca=certs / "ca.crt",
    )
    (work / "logs").mkdir()
    nginx = Nginx(plan, work / "nginx", work / "logs")
    proc = nginx.start({})
    try:
        wait_healthy(proc, f"https://{plan.fleet[0]}/health", certs / "ca.crt", 30)
        yield plan, certs
    finally:
        proc.stop()
        upstream.shutdown()


def request(
    plan_address: str,
    certs: Path,
    method: str,
    path: str,
    headers: dict | None = None,
    body: bytes = b"",
    source: str | None = None,
    tls: bool = True,
) -> int:
    """One raw request (the path is sent as written, unnormalised); returns the status."""
    host, port = plan_address.rsplit(":", 1)
    src = (source, 0) if source else None
    if tls:
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, int(port), context=ctx, timeout=10, source_address=src
        )
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=src)
    try:
        conn.request(method, path, body=body if method == "POST" else None, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def test_fleet_route_passes_with_auth_headers_and_body_unchanged(proxy):
    plan, certs = proxy
    StandIn.seen.clear()
    body = bytes(range(256)) * 40  # binary protobuf-like payload
    status = request(
        plan.fleet[0],
        certs,
        "POST",
        "/v1/fleet/activate-node",
        {**AUTH_HEADERS, "content-type": "application/protobuf"},
        body,
    )
    assert status == 200
    [(method, path, headers, got)] = StandIn.seen
    assert (method, path, got) == ("POST", "/v1/fleet/activate-node", body)
    assert {k: headers[k] for k in AUTH_HEADERS} == AUTH_HEADERS
    assert headers["x-forwarded-for"] == "127.0.0.1"  # the SuperLink's access log names the real client


@pytest.mark.parametrize(
    "method,path,expected",
    [
        ("POST", "/v1/control/start-run", 404),
        ("POST", "/v1/control/register-node", 404),
        ("POST", "/v1/runtime/acquire-task", 404),
        ("GET", "/docs", 404),
        ("POST", "/v1/fleet/../control/start-run", 404),
        ("POST", "/v1/fleet/%2e%2e/control/start-run", 404),
        ("POST", "/v1/fleet/..%2fcontrol/start-run", 404),
        ("POST", "//v1/control/start-run", 404),
        ("GET", "/v1/fleet/pull-messages", 403),  # Fleet routes are POST only
    ],
)
def test_fleet_listener_refuses_everything_else(proxy, method, path, expected):
    plan, certs = proxy
    StandIn.seen.clear()
    assert request(plan.fleet[0], certs, method, path) == expected
    assert not [p for _, p, _, _ in StandIn.seen if "control" in p or "runtime" in p or p == "/docs"]


def test_control_listener_serves_only_the_operator_and_only_control_routes(proxy):
    plan, certs = proxy
    StandIn.seen.clear()
    assert request(plan.control[0], certs, "POST", "/v1/control/start-run") == 403  # from 127.0.0.1
    assert not StandIn.seen
    assert request(plan.control[0], certs, "POST", "/v1/control/start-run", source=OPERATOR) == 200
    assert request(plan.control[0], certs, "POST", "/v1/fleet/activate-node", source=OPERATOR) == 404
    assert request(plan.control[0], certs, "POST", "/v1/runtime/acquire-task", source=OPERATOR) == 404
    assert [p for _, p, _, _ in StandIn.seen] == ["/v1/control/start-run"]


def test_plain_http_is_refused_on_both_listeners(proxy):
    plan, certs = proxy
    assert request(plan.fleet[0], certs, "POST", "/v1/fleet/activate-node", tls=False) == 400
    assert request(plan.control[0], certs, "POST", "/v1/control/start-run", source=OPERATOR, tls=False) == 400


@pytest.mark.parametrize(
    "args,message",
    [
        (["--fleet", "10.0.0.5", "--control", "10.0.0.5:9094", "--operator", "10.0.0.20"], "is not HOST:PORT"),
        (["--fleet", "10.0.0.5:9093", "--control", "10.0.0.5:9093", "--operator", "10.0.0.20"], "on one socket"),
        (
            ["--fleet", "10.0.0.5:9093", "--control", "10.0.0.5:9094", "--operator", "10.0.0.300"],
            "is not an IP address or network",
        ),
        (["--fleet", "10.0.0.5:9093", "--control", "10.0.0.5:9094"], "needs the operator's addresses"),
        (["--operator", "10.0.0.20"], "need a fleet listener"),
        (
            [
                "--fleet",
                "10.0.0.5:9093",
                "--control",
                "10.0.0.5:9094",
                "--operator",
                "10.0.0.20",
                "--superlink",
                "10.0.0.5:9093",
            ],
            "cannot also be a proxy listener",
        ),
    ],
)
def test_make_proxy_conf_names_what_is_wrong(tmp_path, args, message):
    r = subprocess.run(
        [*MAKE_PROXY_CONF, "--certs", str(tmp_path), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_make_proxy_conf_checks_the_certificates_exist(tmp_path):
    r = subprocess.run(
        [
            *MAKE_PROXY_CONF,
            "--certs",
            str(tmp_path),
            "--fleet",
            "0.0.0.0:9093",
            "--control",
            "10.0.0.5:9094",
            "--operator",
            "10.0.0.20",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 2 and "server.pem is missing" in r.stderr, r.stderr


def make_site(certs: Path, fleet: str, control: str) -> str:
    r = subprocess.run(
        [
            *MAKE_PROXY_CONF,
            "--superlink",
            "127.0.0.1:9091",
            "--fleet",
            fleet,
            "--control",
            control,
            "--operator",
            "10.0.0.20",
            "--certs",
            str(certs),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return r.stdout


def test_guide_site_serves_fleet_and_control_apart(proxy):
    # the command in deploy/README.md's multi-machine guide, with this test's certificates
    site = make_site(proxy[1], "0.0.0.0:9092", "10.0.0.5:9093")
    fleet, control = site.split("# == Control listener")
    assert "listen 0.0.0.0:9092 ssl;" in fleet and "location /v1/fleet/" in fleet
    assert "/v1/control/" not in fleet.split("server {", 1)[1]
    assert "listen 10.0.0.5:9093 ssl;" in control and "location /v1/control/" in control
    assert "allow 10.0.0.20/32;" in control and "deny all;" in control
    assert "/v1/runtime/" not in site.split("upstream", 1)[1]


def test_a_proxy_with_one_listener_kind_has_no_route_of_the_other(proxy):
    # the compose demo's two proxies: the data holders' has no Control server at all
    r = subprocess.run(
        [
            *MAKE_PROXY_CONF,
            "--fleet",
            "0.0.0.0:9093",
            "--certs",
            str(proxy[1]),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert "location /v1/fleet/" in r.stdout and "location /v1/control/" not in r.stdout
    assert r.stdout.count("server {") == 1


def test_rendered_site_is_accepted_by_nginx(proxy, tmp_path):
    # nginx -t binds the listeners: loopback addresses only
    (tmp_path / "site.conf").write_text(make_site(proxy[1], f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"))
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"pid {tmp_path}/nginx.pid; error_log stderr; events {{}} http {{ "
        f"client_body_temp_path {tmp_path}/b; proxy_temp_path {tmp_path}/p; fastcgi_temp_path {tmp_path}/f; "
        f"uwsgi_temp_path {tmp_path}/u; scgi_temp_path {tmp_path}/s; include {tmp_path}/site.conf; }}"
    )
    nginx = nginx_binary()
    assert nginx is not None  # the test is skipped without nginx
    t = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True, check=False)
    assert t.returncode == 0, t.stderr
