"""The commands the documentation shows, read from the files themselves, so that an edit to an example is what the
tests run (tests/project/test_readme_examples.py; the loopback deployment's in tests/deploy/test_local_cluster.py).

A command is a line of a fenced ``bash`` block (indented blocks too), continuation lines joined, comment lines and
blank lines left out, or a ``$ `` line of an output block (a transcript).  ``fast`` turns a command into the form
the suite runs: fewer rounds, nothing else changed."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from flwr.common.config import parse_config_args

from server_app.runner import run_config_arg

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass(frozen=True)
class Command:
    text: str  # as written, continuation lines joined
    file: str  # relative to the repository root
    line: int  # where it starts (1-based)
    block: int  # which block of the file (0-based, counting every fenced block)
    comments: tuple[str, ...] = ()  # the comment lines right after it in the block (what it prints, as shown)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def commands(path: Path, start: str | None = None, end: str | None = None) -> list[Command]:
    """Every command in ``path`` (between the headings ``start`` and ``end`` when given).  A comment line that
    starts ``#   `` right after a command shows what that command prints."""
    lines = path.read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith(start)) if start else 0
    last = next((i for i, ln in enumerate(lines) if end and i > first and ln.startswith(end)), len(lines))
    found: list[Command] = []
    block, fence, lang, i, after_command = -1, None, "", first, False
    while i < last:
        m = FENCE.match(lines[i])
        if m and fence is None:
            fence, lang, block, after_command = m.group(1), m.group(2), block + 1, False
        elif m and m.group(1) == fence:
            fence = None
        elif fence is not None:
            text, start_line = lines[i][len(fence) :], i
            if lang == "bash" and text.startswith("#   ") and after_command:
                c = found[-1]
                found[-1] = Command(c.text, c.file, c.line, c.block, (*c.comments, text[1:].strip()))
            elif lang == "bash" and text.strip() and not text.startswith("#"):
                while text.endswith("\\"):
                    i += 1
                    text = text[:-1].rstrip() + " " + lines[i][len(fence) :].strip()
                found.append(Command(text.strip(), str(path.relative_to(ROOT)), start_line + 1, block))
            elif lang != "bash" and text.startswith("$ "):
                found.append(Command(text[2:].strip(), str(path.relative_to(ROOT)), start_line + 1, block))
            after_command = (
                bool(found) and found[-1].block == block and (after_command or found[-1].line == start_line + 1)
            )
            if not text.strip() or (text.startswith("#") and not text.startswith("#   ")):
                after_command = False
        i += 1
    return found


def readme_commands() -> list[Command]:
    return commands(ROOT / "README.md")


def local_deployment_commands() -> list[Command]:
    """deploy/README.md's one-machine section (``python -m deploy.local_cluster``), up to the compose demo."""
    return commands(ROOT / "deploy" / "README.md", "## One machine", "## Docker")


def option(tokens: list[str], flag: str) -> str | None:
    return tokens[tokens.index(flag) + 1] if flag in tokens else None


def fast_run_config(run_config: str | None) -> str:
    """A ``--run-config`` value in the suite's form: the fewest rounds that still show what the example shows (one;
    two where a run stops after one and resumes), pFedLIA's warm-up inside them; every other key as written."""
    cfg = parse_config_args([run_config]) if run_config else {}
    stops = "stop-after" in cfg or "resume-from" in cfg
    cfg["num-server-rounds"] = 2 if stops or cfg.get("method") in ("pfedlia", "oracle") else 1
    if "stop-after" in cfg:
        cfg["stop-after"] = 1
    if cfg.get("method") in ("pfedlia", "oracle"):
        cfg["warmup-rounds"] = 1
    return run_config_arg(cfg)


def fast(command: str) -> str:
    """``command`` (a ``flwr run`` or ``python -m server_app.job``) with its run config in :func:`fast_run_config`'s
    form; environment assignments before it are kept."""
    tokens = shlex.split(command, comments=True)
    if "--run-config" in tokens:
        i = tokens.index("--run-config") + 1
        tokens[i] = fast_run_config(tokens[i])
    else:
        tokens += ["--run-config", fast_run_config(None)]
    return shlex.join(tokens)


def loopback_example() -> list[Command]:
    """The README's loopback deployment example: the ``python -m deploy.local_cluster`` commands (a run stopped by
    ``stop-after``, then its continuation) and the ``task.predict`` of a holder's model that follows them."""
    found = readme_commands()
    first = next(i for i, c in enumerate(found) if c.text.startswith("python -m deploy.local_cluster"))
    block = [c for c in found[first:] if c.block == found[first].block]
    return block[: next(i for i, c in enumerate(block) if c.text.startswith("python -m task.predict")) + 1]
