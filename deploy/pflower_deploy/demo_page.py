"""deploy/docker/README.md's sample output, made from a real run of the compose demo and checked against one.

The record is two raw logs in deploy/docker/demo-run/: ``build.log`` (what ``build_local_base.sh`` printed) and
``demo.log`` (what ``run_demo.sh`` printed). The README's block between the two ``demo-transcript`` markers is
rendered from them: the machine and the times, then the lines of the two logs a reader follows (the scripts' own
lines and the run's log stream; the image build's and compose's own output is left out, shown as ``...``).

- ``update BUILD_LOG DEMO_LOG``: copy the two logs of a run into the record and render the README's block.
- ``check``: the README's block is what the record renders (no stale or hand-edited sample output).
- ``check BUILD_LOG DEMO_LOG``: also, the logs of the run just made have the record's shape: the same shown lines
  in the same order, where numbers, ids, addresses and the machine may differ (Flower's WARNING lines, which a
  loaded machine adds, and the output left out are set aside). .ci/run's demo stage runs it after the demo.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from . import DEPLOY

DOCKER = DEPLOY / "docker"
RECORD = DOCKER / "demo-run"
README = DOCKER / "README.md"
BEGIN = (
    "<!-- demo-transcript: rendered by python -m deploy.pflower_deploy.demo_page from deploy/docker/demo-run/; "
    "do not edit -->"
)
END = "<!-- end of demo-transcript -->"

# the lines a reader follows; every other line is the image build's or compose's own output
_BUILD_KEEP = re.compile(r"^(\[|built |pip configuration carried in|removed the previous )")
_DEMO_KEEP = re.compile(
    r"^(compose: |machine: |== |refused: |isolation: |node\d+: |SuperNodes online|runs on the SuperLink|"
    r"summary\.json: |pflower |compose logs kept|Using SuperLink|Successfully started run|"
    r"Successfully installed pflower|(INFO|WARNING|ERROR) :|\s+\d+ s  )"
)
# lines whose text after the prefix is this machine's own (versions, hardware, configuration): compared by prefix
_MACHINE_PREFIX = re.compile(r"^(compose|machine|pip configuration carried in \(`pip config list`\)): ")


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Flower colours its log levels, also into a pipe


def kept(lines: list[str], keep: re.Pattern[str]) -> list[str]:
    """The lines ``keep`` matches (without terminal colours), each run of other lines replaced by one ``...``."""
    out: list[str] = []
    for line in (_COLOUR.sub("", raw).rstrip() for raw in lines):
        if keep.match(line):
            out.append(line)
        elif not out or out[-1] != "...":
            out.append("...")
    return out


def shape(line: str) -> str:
    """A line with what differs between runs and machines replaced: spacing, numbers, ids and hashes by N, temporary
    folders' random names by *, a machine's own details dropped, and a probe's list of addresses reduced to its
    claim (how many addresses a host has differs)."""
    line = re.sub(r"\s+", " ", line).strip()  # a number's width shifts the columns
    if m := _MACHINE_PREFIX.match(line):
        return m.group(0)
    if line.startswith("isolation: ") and "): " in line:
        line = line.rsplit("): ", 1)[0] + ")"
    line = re.sub(r"(/tmp/pflower-[a-z-]+)\.\w+", r"\1.*", line)  # mktemp's names (pflower-proxy-base.XXXXXX)
    line = re.sub(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{6,}\b", "N", line)
    return re.sub(r"\d+(\.\d+)?", "N", line)


def shapes(lines: list[str]) -> list[str]:
    """The shapes of the shown lines, without Flower's warnings (a loaded machine adds them, with lines of their
    own) and without the ``...`` that stand for the output left out."""
    return [shape(line) for line in lines if line != "..." and not line.startswith("WARNING :")]


def _value(pattern: str, text: str) -> str:
    m = re.search(pattern, text, re.MULTILINE)
    return m.group(1) if m else "?"


def render(build_log: str, demo_log: str) -> str:
    """The README's block (markers included) for a run's two logs."""
    build = kept(build_log.splitlines(), _BUILD_KEEP)
    demo = kept(demo_log.splitlines(), _DEMO_KEEP)
    machine = _value(r"^machine: (.*)$", demo_log)
    compose = _value(r"^compose: (.*)$", demo_log)
    base = _value(r"^built pflower-base:local in (\d+) s", build_log)
    proxy = _value(r"^built pflower-proxy-base:local in (\d+) s", build_log)
    total = _value(r"^== demo finished in (\d+) s", demo_log)
    run = _value(r"^\s+(\d+) s  flwr run ", demo_log)
    return "\n".join(
        [
            BEGIN,
            "",
            f"Recorded on {machine}; {compose}.",
            (
                f"Times of this run: the base images {base} s and {proxy} s (build_local_base.sh, before the "
                f"demo), the demo {total} s, of which {run} s for `flwr run`. Times depend on the machine and its "
                "load; the lines do not, and CI checks them against its own run (numbers aside)."
            ),
            "",
            "```",
            "$ deploy/docker/build_local_base.sh",
            *build,
            "",
            "$ PFLOWER_BASE=pflower-base:local deploy/docker/run_demo.sh",
            *demo,
            "```",
            "",
            END,
        ]
    )


def block_of(page: str) -> str:
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise SystemExit(f"demo_page: {README} must hold one block between\n  {BEGIN}\nand\n  {END}")
    return page[page.index(BEGIN) : page.index(END) + len(END)]


def record() -> tuple[str, str]:
    return (RECORD / "build.log").read_text(), (RECORD / "demo.log").read_text()


def shape_diff(recorded: list[str], fresh: list[str], what: str) -> list[str]:
    """The differing lines between the record's shape and a fresh run's, as a unified diff (empty: same shape)."""
    return list(
        difflib.unified_diff(
            shapes(recorded), shapes(fresh), f"{what} (the page's record)", f"{what} (this run)", lineterm="", n=1
        )
    )


def check(build_log: Path | None, demo_log: Path | None, page: str | None = None) -> list[str]:
    """What does not hold, in words (empty: the page matches)."""
    page = README.read_text() if page is None else page
    recorded_build, recorded_demo = record()
    problems = []
    if block_of(page) != render(recorded_build, recorded_demo):
        problems.append(
            f"{README.relative_to(DEPLOY.parent)}'s sample output is not what deploy/docker/demo-run/ renders: "
            "run python -m deploy.pflower_deploy.demo_page update with a run's two logs (or without edits: render)"
        )
    for path, recorded, keep, what in (
        (build_log, recorded_build, _BUILD_KEEP, "build_local_base.sh"),
        (demo_log, recorded_demo, _DEMO_KEEP, "run_demo.sh"),
    ):
        if path is None:
            continue
        diff = shape_diff(kept(recorded.splitlines(), keep), kept(path.read_text().splitlines(), keep), what)
        if diff:
            problems.append(
                f"{what} printed lines the page does not show (or left out some it shows); regenerate the page with "
                "python -m deploy.pflower_deploy.demo_page update BUILD_LOG DEMO_LOG:\n" + "\n".join(diff)
            )
    return problems


def write_block(page: str, block: str) -> str:
    old = block_of(page)
    return page.replace(old, block)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("update", help="take a run's two logs as the record and render the README's block")
    up.add_argument("build_log", type=Path)
    up.add_argument("demo_log", type=Path)
    sub.add_parser("render", help="render the README's block from the record as it is")
    ck = sub.add_parser("check", help="the README's block is the record's; with two logs, their shape is too")
    ck.add_argument("build_log", type=Path, nargs="?")
    ck.add_argument("demo_log", type=Path, nargs="?")
    args = ap.parse_args(argv)
    if args.command == "check":
        if (args.build_log is None) != (args.demo_log is None):
            ap.error("check takes both logs (build, then demo) or neither")
        problems = check(args.build_log, args.demo_log)
        for problem in problems:
            print(f"demo_page: {problem}", file=sys.stderr)
        if not problems:
            print(
                "demo_page: deploy/docker/README.md's sample output is the record's"
                + (", and this run has its shape" if args.demo_log else "")
            )
        return 1 if problems else 0
    if args.command == "update":
        RECORD.mkdir(exist_ok=True)
        for source, name in ((args.build_log, "build.log"), (args.demo_log, "demo.log")):
            (RECORD / name).write_text(source.read_text())
    README.write_text(write_block(README.read_text(), render(*record())))
    where = DEPLOY.parent
    print(f"demo_page: rendered {README.relative_to(where)}'s sample output from {RECORD.relative_to(where)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
