"""Predict with a saved model: ``python -m task.predict MODEL DATA.npz [--split auto|test|train] [--out preds.npy]``.

MODEL is a saved model (``<name>.safetensors`` with its ``<name>.json`` manifest: a client's personalized model
or a server-side model written by a run); DATA is an ``.npz`` in the deployed-node format: ``x`` (and ``y``), the
data a node trains on, and optionally ``x_test`` / ``y_test``, its held-out data (``deploy/export_partitions.py``
writes all four).  By default the held-out arrays are scored where the file has them, since a model scored on the
data it trained on says little; ``--split train`` scores ``x`` / ``y`` instead.  Prints one JSON line: the model,
the file, which arrays were scored (``arrays``, ``held-out``), the number of samples and, with labels, the accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from task.export import predict_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m task.predict", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a saved model: <name>.safetensors (its <name>.json manifest beside it)")
    ap.add_argument("data", help=".npz with x (and y), optionally x_test / y_test, in the run's dataset shape")
    ap.add_argument(
        "--split",
        choices=["auto", "test", "train"],
        default="auto",
        help="auto (default): x_test / y_test where the file has them, else x / y; test: x_test / y_test "
        "(an error without them); train: x / y, the data a node trains on",
    )
    ap.add_argument("--out", help="write the predicted labels here (.npy), in the order of the arrays scored")
    args = ap.parse_args(argv)
    try:
        result = predict_file(args.model, args.data, split=args.split)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        np.save(args.out, result["predictions"])
    if not result["held-out"]:
        print(
            f"note: scored {result['arrays']} of {args.data}"
            + (" as asked" if args.split == "train" else " (the file has no x_test)")
            + ": if the model trained on them, the accuracy is not a held-out one",
            file=sys.stderr,
        )
    print(json.dumps({k: v for k, v in result.items() if k != "predictions"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
