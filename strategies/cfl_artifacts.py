"""CFL's artefact: its cluster splits and each client's cluster (``cfl_clusters.json``)."""

from __future__ import annotations

import json
from pathlib import Path

from strategies.cfl import CFLStrategy


def write_artifacts(strategy: CFLStrategy, folder: Path) -> None:
    (folder / "cfl_clusters.json").write_text(
        json.dumps(
            {"splits": strategy.splits, "assignment": {str(c): k for c, k in sorted(strategy.cluster_of.items())}},
            indent=1,
        )
    )
