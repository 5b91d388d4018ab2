"""The reverse proxy in front of the SuperLink: nginx, configured from ``deploy/nginx/*.conf.in``.

The data holders' listener (``fleet``) forwards ``/v1/fleet/`` only; the operator's listener (``control``)
forwards ``/v1/control/`` only, and only to the operator's addresses; ``/v1/runtime/`` is forwarded by
neither. Both listeners terminate TLS with the SuperLink's certificate and open TLS again to the SuperLink on
loopback, verifying it against the CA under ``superlink_name`` (a DNS name in the certificate: nginx checks
DNS names, not IP addresses, in ``proxy_ssl_verify``).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import DEPLOY
from .processes import ClusterError, Proc

TEMPLATES = DEPLOY / "nginx"
_HOST = r"(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)"
_LISTEN = re.compile(rf"^({_HOST}):(\d{{1,5}})$")


def check_address(value: str, what: str) -> str:
    """``HOST:PORT`` (IPv4, [IPv6] or a host name; port 1-65535), else a ValueError naming ``what``."""
    m = _LISTEN.match(value.strip())
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(
            f"{what}: {value!r} is not HOST:PORT (e.g. 10.0.0.5:9093, 127.0.0.1:9091, "
            f"[::1]:9094, superlink:9091; port 1-65535)"
        )
    return value.strip()


def check_operator(value: str) -> str:
    """An address or network allowed on the control listener (``10.0.0.20``, ``10.0.0.0/24``) or ``all``."""
    if value.strip() == "all":
        return "all"
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError(
            f"operator address {value!r} is not an IP address or network (e.g. 10.0.0.20, "
            f"10.0.0.0/24, ::1) nor 'all' (only where the control listener's network is the "
            f"operator's alone)"
        ) from None


@dataclass
class ProxyPlan:
    """Where the SuperLink is, where each listener binds and who may use the control listener."""

    superlink: str  # HOST:PORT of the SuperLink (loopback on its host)
    fleet: list[str]  # HOST:PORT listeners for the data holders
    control: list[str]  # HOST:PORT listeners for the operator
    operators: list[str]  # addresses / networks allowed on the control listeners
    cert: Path
    key: Path
    ca: Path
    superlink_name: str = "localhost"  # DNS name in the SuperLink's certificate, checked by the proxy
    check_files: bool = field(default=True, repr=False)  # False: the paths are on another machine/container

    def __post_init__(self) -> None:
        self.superlink = check_address(self.superlink, "SuperLink address")
        self.fleet = [check_address(a, "fleet listener") for a in self.fleet]
        self.control = [check_address(a, "control listener") for a in self.control]
        self.operators = [check_operator(a) for a in self.operators]
        if not self.fleet and not self.control:
            raise ValueError("need a fleet listener (data holders) or a control listener (operator), or both")
        if self.control and not self.operators:
            raise ValueError("a control listener needs the operator's addresses (or 'all', see --operator)")
        both = sorted(set(self.fleet) & set(self.control))
        if both:
            raise ValueError(
                f"{both} would serve Fleet and Control routes on one socket: give the control "
                f"listener its own address or port"
            )
        if self.superlink in self.fleet + self.control:
            raise ValueError(f"the SuperLink's own address {self.superlink} cannot also be a proxy listener")
        if self.check_files:
            for path in (self.cert, self.key, self.ca):
                if not Path(path).is_file():
                    raise ValueError(
                        f"{path} is missing (need the CA certificate ca.crt and the server "
                        f"certificate server.pem / server.key from deploy/make_certs.sh)"
                    )


def _render(template: str, values: dict[str, str]) -> str:
    text = (TEMPLATES / template).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.findall(r"\{\{(\w+)\}\}", text)
    if left:
        raise ValueError(f"{template}: no value for {sorted(set(left))}")
    return text


FLEET_SECTION, CONTROL_SECTION = "# == Fleet listener", "# == Control listener"


def render_site(plan: ProxyPlan) -> str:
    """The upstream and a ``server`` block per listener kind that has addresses (both on a SuperLink host:
    what goes into ``/etc/nginx/conf.d/``; one each for the compose demo's two proxies)."""
    text = _render(
        "pflower.conf.in",
        {
            "superlink": plan.superlink,
            "superlink_name": plan.superlink_name,
            "cert": str(plan.cert),
            "key": str(plan.key),
            "ca": str(plan.ca),
            "fleet_listen": "\n".join(f"    listen {a} ssl;" for a in plan.fleet),
            "control_listen": "\n".join(f"    listen {a} ssl;" for a in plan.control),
            "operator_allow": "\n".join(f"    allow {a};" for a in plan.operators),
        },
    )
    head, rest = text.split(FLEET_SECTION, 1)
    fleet, control = rest.split(CONTROL_SECTION, 1)
    return head + (FLEET_SECTION + fleet if plan.fleet else "") + (CONTROL_SECTION + control if plan.control else "")


def worker_user() -> str:
    """The unprivileged user nginx's workers run as when the master runs as root (Debian: www-data)."""
    for name in ("www-data", "nginx", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return "nobody"


def write_standalone(
    plan: ProxyPlan,
    folder: Path,
    *,
    pid: str,
    error_log: str,
    access_log: str,
    temp: str,
    site_path: str | None = None,
    root: bool | None = None,
) -> Path:
    """``folder/pflower.conf`` (the site) and ``folder/nginx.conf`` (a main configuration that includes it);
    the paths may be the ones inside a container (``site_path``: where the site will be seen there)."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pflower.conf").write_text(render_site(plan))
    root = os.geteuid() == 0 if root is None else root
    main = _render(
        "standalone.conf.in",
        {
            "user": f"user {worker_user()};" if root else "# not root: the workers run as this user",
            "pid": pid,
            "error_log": error_log,
            "access_log": access_log,
            "temp": temp,
            "site": site_path or str(folder / "pflower.conf"),
        },
    )
    (folder / "nginx.conf").write_text(main)
    return folder / "nginx.conf"


def nginx_binary() -> str | None:
    """nginx on PATH, or Debian's /usr/sbin/nginx (not on a normal user's PATH)."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


class Nginx:
    """nginx in the foreground in its own process group, configured in ``folder``, logging to ``logs``."""

    def __init__(self, plan: ProxyPlan, folder: Path, logs: Path) -> None:
        self.plan, self.folder, self.log = plan, folder, logs / "proxy.log"
        self.error_log, self.access_log = logs / "proxy-error.log", logs / "proxy-access.log"
        self.conf = write_standalone(
            plan,
            folder,
            pid=str(folder / "nginx.pid"),
            error_log=str(self.error_log),
            access_log=str(self.access_log),
            temp=str(folder),
        )
        self.proc: Proc | None = None

    def command(self) -> list[str]:
        exe = nginx_binary()
        if exe is None:
            raise ClusterError("nginx is missing: apt-get install nginx-light (Debian), or start without the proxy")
        return [exe, "-p", str(self.folder), "-c", str(self.conf)]

    def check(self) -> None:
        """``nginx -t``: a configuration nginx refuses is an error here, with nginx's own words."""
        r = subprocess.run([*self.command(), "-t"], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise ClusterError(f"nginx -t rejected {self.conf}:\n{r.stderr.strip()}")

    def start(self, env: dict[str, str]) -> Proc:
        self.check()
        self.proc = Proc("nginx", self.command(), env, self.log, self.folder)
        return self.proc
