"""FedSoft's artefact: the importance weights, selections and tier tables per round (``fedsoft_clusters.json``)."""

from __future__ import annotations

import json
from pathlib import Path

from strategies.fedsoft import FedSoftStrategy


def write_artifacts(strategy: FedSoftStrategy, folder: Path) -> None:
    (folder / "fedsoft_clusters.json").write_text(
        json.dumps(
            {
                "importance": {str(r): v for r, v in strategy.u_log.items()},
                "selected": {str(r): v for r, v in strategy.selection_log.items()},
                "tier-table (accuracy of each centre on the source A / B holdouts)": {
                    str(r): t for r, t in strategy.tier_tables.by_round.items()
                },
            },
            indent=1,
        )
    )
