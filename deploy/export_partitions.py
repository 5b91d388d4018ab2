"""Write partitions of the embedded data as per-node ``data-path`` files (``.npz``), e.g. to rehearse a deployment
where every SuperNode holds its own data file instead of a partition of the embedded data set.

    python -m deploy.export_partitions --out nodes/ --num-partitions 3 [--run-config "dataset='digits' alpha=0.3"]

writes ``nodes/node-0.npz`` ... ``nodes/node-2.npz`` with arrays ``x``, ``y`` (train + validation) and
``x_test``, ``y_test``; start SuperNode i with ``--node-config "partition-id=i data-path='<abs path>/node-i.npz'"``.
A real data holder writes the same four arrays (or only ``x``, ``y``) from its own data, in the run's dataset shape.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flwr.common.config import parse_config_args

from task.config import parse_settings
from task.data import export_client_file


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for node-<i>.npz")
    ap.add_argument("--num-partitions", type=int, required=True)
    ap.add_argument(
        "--run-config", default="", help="run-config overrides that decide the data (dataset, partition, ...)"
    )
    args = ap.parse_args(argv)
    cfg = parse_config_args([args.run_config]) if args.run_config else {}
    settings = parse_settings(cfg)
    for i in range(args.num_partitions):
        path = export_client_file(settings.data, i, args.num_partitions, Path(args.out) / f"node-{i}.npz")
        print(f"{path}  (partition {i} of {args.num_partitions}, dataset {settings.data.dataset})")


if __name__ == "__main__":
    main()
