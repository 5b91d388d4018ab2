"""This machine's pip configuration, carried into the compose demo's image builds.

``pip config list`` gives what pip uses here: its configuration files (global, user, site, ``PIP_CONFIG_FILE``)
and the ``PIP_*`` environment variables, one ``section.key='value'`` a line (``:env:.key`` for a variable).

- ``chroot FILE``: build_local_base.sh installs the dependencies in a debootstrap tree. FILE gets one pip.conf
  with all of it (a variable overrides the files' value, as in pip), and the local paths it names (``file://``
  indexes, find-links folders, constraint files, certificates) are printed, one a line, for the script to
  bind-mount read-only at the same place in the tree. A summary line goes to stderr.
- ``build-args``: the Dockerfile's ``pip install`` (on Flower's published images) runs in ``docker build``, which
  sees no host path: only the remote indexes pass, as ``PFLOWER_PIP_INDEX_URL=...`` lines for the compose file's
  build arguments. A URL with a user or password is left out: a build argument is kept in the image's history.
  What is left out is said on stderr.

Standard library only (the scripts run it with the host's python3).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

# the options whose values are indexes, folders or files (whitespace-separated lists where pip allows several)
PATH_KEYS = ("index-url", "extra-index-url", "find-links", "constraint", "requirement", "cert", "client-cert")
INDEX_KEYS = ("index-url", "extra-index-url")
# the remote-index options a `docker build` can use, and the build argument (compose file) each goes to
BUILD_ARGS = {
    "index-url": "PFLOWER_PIP_INDEX_URL",
    "extra-index-url": "PFLOWER_PIP_EXTRA_INDEX_URL",
    "trusted-host": "PFLOWER_PIP_TRUSTED_HOST",
}
_LINE = re.compile(r"^(?P<section>[^.\s]+|:env:)\.(?P<key>[^=\s]+)=(?P<value>.*)$")


def parse(listing: str) -> dict[str, dict[str, str]]:
    """``pip config list``'s lines as {section: {key: value}}; the environment's values (``:env:``) go to
    ``global`` and override that key in every section, as a ``PIP_*`` variable does for every command."""
    files: dict[str, dict[str, str]] = {}
    env: dict[str, str] = {}
    for raw in listing.splitlines():
        if not raw.strip():
            continue
        m = _LINE.match(raw.strip())
        if m is None:
            raise ValueError(f"unexpected line in `pip config list`: {raw!r} (expected section.key='value')")
        value = ast.literal_eval(m["value"])
        if not isinstance(value, str):
            raise ValueError(f"unexpected value in `pip config list`: {raw!r}")
        if m["section"] == ":env:":
            env[m["key"]] = value
        else:
            files.setdefault(m["section"], {})[m["key"]] = value
    for key, value in env.items():
        for options in files.values():
            options.pop(key, None)
        files.setdefault("global", {})[key] = value
    return files


def render(config: dict[str, dict[str, str]]) -> str:
    """One pip.conf with every section, ``global`` first."""
    out = []
    for section in sorted(config, key=lambda s: (s != "global", s)):
        out.append(f"[{section}]")
        out += [f"{key} = {value}" for key, value in config[section].items()]
        out.append("")
    return "\n".join(out)


def _local_path(token: str) -> Path | None:
    if token.startswith("file:"):
        return Path(unquote(urlsplit(token).path))
    if token.startswith("/"):
        return Path(token)
    return None


def local_paths(config: dict[str, dict[str, str]]) -> list[Path]:
    """The host paths the configuration names, for bind mounts: a ``file://`` index's folder ``.../simple``
    becomes its parent (the index's pages link to ``../../files/...`` beside it)."""
    found: list[Path] = []
    for options in config.values():
        for key in PATH_KEYS:
            for token in options.get(key, "").split():
                path = _local_path(token)
                if path is None:
                    continue
                if key in INDEX_KEYS and path.name == "simple":
                    path = path.parent
                if path not in found:
                    found.append(path)
    return found


def masked(value: str) -> str:
    """A value for a log line: the user and password in a URL replaced by ***."""
    return re.sub(r"://[^/@\s]+@", "://***@", value)


def build_args(config: dict[str, dict[str, str]]) -> tuple[dict[str, str], list[str]]:
    """The build arguments for the Dockerfile's ``pip install`` (remote indexes only, from ``global`` and
    ``install``, the latter winning) and what was left out, with why."""
    merged = {**config.get("global", {}), **config.get("install", {})}
    args: dict[str, str] = {}
    left_out: list[str] = []
    for key, arg in BUILD_ARGS.items():
        kept = []
        for token in merged.get(key, "").split():
            if key in INDEX_KEYS and _local_path(token) is not None:
                left_out.append(f"{key} {token} (a local path: a docker build cannot see it)")
            elif key in INDEX_KEYS and urlsplit(token).username is not None:
                left_out.append(f"{key} {masked(token)} (a password in a build argument stays in the image's history)")
            else:
                kept.append(token)
        if kept:
            args[arg] = " ".join(kept)
    left_out += [
        f"{key} {masked(merged[key])} (local files: a docker build cannot see them)"
        for key in ("find-links", "constraint", "cert")
        if key in merged
    ]
    return args, left_out


def pip_config_list(python: str = sys.executable) -> str:
    done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"pipconf: `{python} -m pip config list` failed: {done.stderr.strip()}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listing", help="read this file instead of running `pip config list` (tests)")
    sub = ap.add_subparsers(dest="command", required=True)
    chroot = sub.add_parser("chroot", help="write one pip.conf to FILE, print the local paths to bind")
    chroot.add_argument("file", type=Path)
    sub.add_parser("build-args", help="print NAME=value lines for the compose file's pip build arguments")
    args = ap.parse_args(argv)
    config = parse(Path(args.listing).read_text() if args.listing else pip_config_list())
    if args.command == "chroot":
        args.file.write_text(render(config))
        paths = local_paths(config)
        shown = "; ".join(f"{k}={masked(v)}" for opts in config.values() for k, v in opts.items()) or "none"
        print(f"pip configuration carried in (`pip config list`): {shown}", file=sys.stderr)
        print("\n".join(str(p) for p in paths))
        return 0
    build, left_out = build_args(config)
    print("\n".join(f"{name}={value}" for name, value in build.items()))
    for item in left_out:
        print(f"pipconf: not passed to the image build: {item}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
