"""IFCA's artefact: each round's cluster-model choices and tier tables (``ifca_clusters.json``)."""

from __future__ import annotations

import json
from pathlib import Path

from strategies.ifca import IFCAStrategy


def write_artifacts(strategy: IFCAStrategy, folder: Path) -> None:
    (folder / "ifca_clusters.json").write_text(
        json.dumps(
            {
                "choices": {str(r): c for r, c in strategy.choices.items()},
                "tier-table (accuracy of each cluster model on the source A / B holdouts)": {
                    str(r): t for r, t in strategy.tier_tables.by_round.items()
                },
            },
            indent=1,
        )
    )
