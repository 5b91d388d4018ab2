"""Predict with a saved model: ``python -m task.predict MODEL DATA.npz [--out predictions.npy]``.

MODEL is a saved model (``<name>.safetensors`` with its ``<name>.json`` manifest: a client's personalized model
or a server-side model written by a run); DATA is an ``.npz`` in the deployed-node format (``x``; with ``y``
the accuracy is printed too).  Prints one JSON line: the model, the number of samples, the accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from task.export import predict_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a saved model: <name>.safetensors (its <name>.json manifest beside it)")
    ap.add_argument("data", help=".npz with x (and optionally y), in the run's dataset shape")
    ap.add_argument("--out", help="write the predicted labels here (.npy)")
    args = ap.parse_args(argv)
    try:
        result = predict_file(args.model, args.data)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        np.save(args.out, result["predictions"])
    print(json.dumps({k: v for k, v in result.items() if k != "predictions"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
