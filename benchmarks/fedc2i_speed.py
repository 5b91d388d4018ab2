"""FedC2I: cost of the influence phase next to local training, and download per client, for M clients.

Times (on one thread, as a simulated client runs) the client's influence phase of one round
(leave-one-out losses from the sum + one vmapped evaluation of the M candidates + the class-level
matrix + mixing) against one round of local training (2 epochs of Adam, batch 32, as in the paper; 1,000
training samples per client as in its Digit-5 split, ``--train-samples`` to change), and prints the bytes a
client downloads per round with all M models (the paper) and with k = 5 sampled peers (``c2i-peers=5``).
Not a federated run: it times the client's own code in-process.
One raw record per M goes to ``benchmarks/raw/fedc2i-speed/``; the table is ``python -m benchmarks.report``'s.

Reproduce: python -m benchmarks.fedc2i_speed [--model c2i-small] [--clients 5,20,50] [--train-samples 200]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from benchmarks.records import write_record
from benchmarks.reporting import print_section
from benchmarks.running import measurement_record, parser
from client_app.fedc2i_math import influence_matrix, influence_vector, mix_classifier, mix_states
from task.models import build_model, count_parameters, head_keys
from task.params import to_record
from task.train import train


def influence_round(model, stacked, x, y, heads, bodies):
    own = {k: v[0] for k, v in stacked.items()}
    lam, _ = influence_vector(model, stacked, {h: own[h] for h in heads}, x, y, 5.0, heads)
    body = mix_states(stacked, lam, bodies)
    with torch.no_grad():
        model.load_state_dict(own)
        feats = model.features(x)
        big, _ = influence_matrix(
            feats, y, own["head.weight"], own["head.bias"], stacked["head.weight"], stacked["head.bias"], 5.0
        )
        w, b = mix_classifier(stacked["head.weight"], stacked["head.bias"], big)
    model.load_state_dict({**own, **body, "head.weight": w, "head.bias": b})


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", default="c2i-small")
    ap.add_argument("--clients", default="5,20,50")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-samples", type=int, default=1000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n = args.train_samples
    x_train, y_train = torch.rand(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    x, y = x_train[:32], y_train[:32]
    print(f"model {args.model}; {n} training samples; one thread; median of {args.repeats}")
    print(
        "| M | influence phase (s) | local training, 2 epochs (s) | ratio | download all M (MB) | download k=5 (MB) |"
    )
    print("|---|---|---|---|---|---|")
    for m in (int(c) for c in args.clients.split(",")):
        models = [build_model(args.model, 1, 8, 10, seed=s) for s in range(m)]
        states = [mm.state_dict() for mm in models]
        stacked = {k: torch.stack([s[k] for s in states]) for k in states[0]}
        model = models[0]
        heads, bodies = head_keys(model), [k for k in states[0] if not k.startswith("head.")]
        infl, local = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            influence_round(model, stacked, x, y, heads, bodies)
            infl.append(time.perf_counter() - t)
            t = time.perf_counter()
            train(model, x_train, y_train, epochs=2, batch_size=32, lr=1e-3, optimizer="adam")
            local.append(time.perf_counter() - t)
        size_all = to_record({k: v.numpy() for k, v in stacked.items()}).count_bytes()
        size_k = to_record({k: v[: min(5, m)].numpy() for k, v in stacked.items()}).count_bytes()
        row: dict[str, Any] = {
            "M": m,
            "influence-s": float(np.median(infl)),
            "local-training-s": float(np.median(local)),
            "download-all-bytes": size_all,
            "download-k5-bytes": size_k,
            "parameters": count_parameters(model),
            "influence-s-repeats": infl,
            "local-training-s-repeats": local,
        }
        write_record(
            measurement_record("fedc2i-speed", {"model": args.model, "train-samples": n, "M": m}, row), args.raw_dir
        )
        print(
            f"| {m} | {row['influence-s']:.3f} | {row['local-training-s']:.3f} | "
            f"{row['influence-s'] / row['local-training-s']:.2f} | {size_all / 1e6:.2f} | {size_k / 1e6:.2f} |",
            flush=True,
        )
    print_section("fedc2i-speed", args.raw_dir)


if __name__ == "__main__":
    main()
