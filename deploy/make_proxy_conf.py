#!/usr/bin/env python3
"""Write the nginx configuration that puts a proxy in front of the SuperLink: the data holders' listener
forwards the Fleet routes only, the operator's listener the Control routes only (to the operator's addresses).

    python -m deploy.make_proxy_conf --superlink 127.0.0.1:9091 --fleet 10.0.0.5:9092 \\
        --control 10.0.0.5:9093 --operator 10.0.0.20 --certs /etc/pflower/certs > /etc/nginx/conf.d/pflower.conf

prints the site (server blocks) for Debian's nginx. ``--standalone DIR`` writes ``DIR/nginx.conf`` (a main
configuration: foreground, own pid file and logs) and ``DIR/pflower.conf`` instead, for ``nginx -c DIR/nginx.conf``
(the compose demo's proxies use it). The template is ``deploy/nginx/pflower.conf.in``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.pflower_deploy.proxy import ProxyPlan, render_site, write_standalone


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--superlink",
        default="127.0.0.1:9091",
        help="HOST:PORT the SuperLink listens on (flower-superlink --host/--port; default 127.0.0.1:9091)",
    )
    ap.add_argument(
        "--superlink-name",
        default="localhost",
        help="DNS name in the SuperLink's certificate the proxy verifies (default localhost)",
    )
    ap.add_argument(
        "--fleet",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="listener for the data holders' SuperNodes (repeatable)",
    )
    ap.add_argument(
        "--control",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="listener for the operator's flwr CLI (repeatable; without it, no Control routes at all)",
    )
    ap.add_argument(
        "--operator",
        action="append",
        default=[],
        metavar="ADDR[/BITS]|all",
        help="address or network allowed on the control listener (repeatable); 'all' only where "
        "the control listener's network reaches nobody but the operator",
    )
    ap.add_argument(
        "--certs",
        required=True,
        metavar="DIR",
        help="folder with ca.crt, server.pem and server.key (deploy/make_certs.sh)",
    )
    ap.add_argument(
        "--no-file-check",
        action="store_true",
        help="the certificate paths are on another machine or inside a container: do not check them",
    )
    ap.add_argument("--standalone", metavar="DIR", help="write DIR/nginx.conf + DIR/pflower.conf (see above)")
    ap.add_argument("--site-path", help="with --standalone: where pflower.conf is seen by nginx (container path)")
    ap.add_argument(
        "--logs",
        default="/var/log/nginx",
        help="with --standalone: folder for access.log / error.log, or 'stdio' for stdout/stderr",
    )
    args = ap.parse_args(argv)
    certs = Path(args.certs) if args.no_file_check else Path(args.certs).resolve()
    try:
        plan = ProxyPlan(
            superlink=args.superlink,
            fleet=args.fleet,
            control=args.control,
            operators=args.operator,
            cert=certs / "server.pem",
            key=certs / "server.key",
            ca=certs / "ca.crt",
            superlink_name=args.superlink_name,
            check_files=not args.no_file_check,
        )
    except ValueError as exc:
        ap.error(str(exc))
    if not args.standalone:
        sys.stdout.write(render_site(plan))
        return 0
    stdio = args.logs == "stdio"
    conf = write_standalone(
        plan,
        Path(args.standalone),
        pid="/tmp/nginx.pid",
        temp="/tmp",
        error_log="stderr" if stdio else f"{args.logs}/error.log",
        access_log="/dev/stdout" if stdio else f"{args.logs}/access.log",
        site_path=args.site_path,
        root=True,
    )
    print(f"{conf} and {conf.parent / 'pflower.conf'} written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
