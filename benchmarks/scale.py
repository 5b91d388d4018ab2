"""Speed and scale of every method through Flower's simulation runtime.

Four parts; each writes one raw record per run (or kernel) to ``benchmarks/raw/scale-<part>/`` and prints the
table ``python -m benchmarks.report`` builds from them:

``overhead``  every method on digits at 10 and 50 clients: seconds per round split into local training,
              method-specific client work (influence, masks, bids, index), server work and the rest
              (Flower messaging, scheduling, process dispatch); bytes down/up per client per round; peak
              memory of the server and of the largest client process; and the ratio of a whole round to
              the pure local training it contains.  The floor is sum(client training) / workers, since
              the simulation runs ``workers`` clients at a time (one per core with client-resources-num-cpus=1).
``floor``     FedAvg at 10 clients on a workload where one client's local training takes about a second:
              the round against its local training (target: within 1.5x).
``scale``     FedAvg, FedCAC and FedC2I (c2i-peers=5) at 10, 100 and 1,000 clients (softmax model, a few
              samples each, every client trains every round): seconds per round and memory.
``kernels``   the server-side work that is quadratic in clients, timed at 1,000 clients in-process:
              FedCAC's mask overlap and customized models, Client2Vec's similarity and sampling,
              pFedLIA's OPTICS on a 1,000 x 1,000 influence matrix.

Reproduce: python -m benchmarks.scale overhead floor scale kernels     (all; about an hour on 2 cores)
           python -m benchmarks.scale kernels                           (seconds)
Per-round numbers (computed by report.py from the records) are medians over the rounds after the first (which
pays for process start-up) that have no evaluation phase (overhead: 4 rounds, evaluation in the last; pFedLIA 5,
its clustering round included).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.records import write_record
from benchmarks.reporting import print_section
from benchmarks.running import Bench, measurement_record, parser, split

METHODS: dict[str, dict[str, Any]] = {
    "local": {},
    "fedavg": {},
    "fedprox": {},
    "fedper": {},
    "fedrep": {},
    "fedrod": {},
    "ditto": {},
    "fedcac": {},
    "fedc2i": {"c2i-peers": 5},
    "pfedlia": {"warmup-rounds": 1, "lazy-epochs": 2},
    "cfl": {},
    "pifl": {"slots-performance": 2},
    "ifca": {},
    "fedsoft": {"fedsoft-clients-per-cluster": 3},
    "client2vec": {"c2v-encoder": "synthetic", "c2v-ign-epochs": 2, "fraction-train": 0.5},
    "moon": {},
}


def part_overhead(args) -> None:
    base: dict[str, Any] = {
        "dataset": "digits",
        "partition": "dirichlet",
        "num-server-rounds": 4,
        "eval-every": 4,
        "local-epochs": 2,
        "val-fraction": 0.2,
        "model": "cnn",
    }
    methods = split(args.methods)
    with Bench("scale-overhead", raw_dir=args.raw_dir, total=2 * len(methods)) as bench:
        for n in (10, 50):
            for m in methods:
                cfg = {**base, "method": m, **METHODS[m]}
                if m == "pfedlia":  # warm-up round 1, clustering round 2, clustered rounds 3-5
                    cfg["num-server-rounds"] = cfg["eval-every"] = 5
                bench.run({"method": m, "clients": n}, cfg, n)


def part_floor(args) -> None:
    """FedAvg at 10 clients where one client's training takes about a second."""
    with Bench("scale-floor", raw_dir=args.raw_dir, total=1) as bench:
        cfg = {
            "method": "fedavg",
            "dataset": "digits",
            "partition": "iid",
            "model": "cnn",
            "data-copies": 4,
            "local-epochs": args.floor_epochs,
            "num-server-rounds": 6,
            "eval-every": 6,
        }
        bench.run({"method": "fedavg", "clients": 10, "local-epochs": args.floor_epochs}, cfg, 10)


def part_scale(args) -> None:
    sizes = [int(x) for x in split(args.sizes)]
    chosen = split(args.scale_methods)
    runs = [x for x in (("fedavg", {}), ("fedcac", {}), ("fedc2i", {"c2i-peers": 5})) if x[0] in chosen]
    with Bench("scale-scale", raw_dir=args.raw_dir, total=len(runs) * len(sizes), timeout=7200) as bench:
        for m, extra in runs:
            for n in sizes:
                copies = max(1, int(np.ceil(n * 12 / 1797)))  # ~12 samples per client
                cfg = {
                    "method": m,
                    "dataset": "digits",
                    "partition": "iid",
                    "model": "softmax",
                    "data-copies": copies,
                    "local-epochs": 1,
                    "num-server-rounds": 3,
                    "eval-every": 3,
                    "test-fraction": 0.2,
                    "val-fraction": 0.0,
                    "round-timeout": 7200.0,
                    **extra,
                }
                bench.run({"method": m, "clients": n}, cfg, n)


def part_kernels(args) -> None:
    import torch

    from strategies.client2vec_math import C2VServerState
    from strategies.fedcac_math import customized_models, mask_overlap
    from task.models import build_model

    torch.set_num_threads(1)
    m = 1000
    rng = np.random.default_rng(0)
    n_params = sum(p.numel() for p in build_model("cnn", 1, 8, 10).parameters())
    masks = rng.random((m, n_params)) < 0.5

    def timed(kernel, fn, repeat=3):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        write_record(
            measurement_record(
                "scale-kernels",
                {"kernel": kernel, "clients": m},
                {"seconds": min(times), "repeats": times, "parameters": n_params},
            ),
            args.raw_dir,
        )
        print(f"  {kernel}: {min(times):.3f} s", flush=True)

    timed("FedCAC mask overlap", lambda: mask_overlap(masks))
    params = rng.standard_normal((m, n_params)).astype(np.float32)
    collab = [np.sort(rng.choice(m, 50, replace=False)) for _ in range(m)]
    timed("FedCAC customized models (50 collaborators each)", lambda: customized_models(params, collab))
    bf, bl = rng.standard_normal((m, 512)), rng.standard_normal((m, 512))
    timed("Client2Vec index similarity + 20 sampling rounds", lambda: _c2v(C2VServerState, bf, bl, m))
    from sklearn.cluster import OPTICS

    infl = rng.standard_normal((m, m))
    timed("pFedLIA OPTICS on the influence matrix", lambda: OPTICS(min_samples=5).fit(infl), repeat=1)


def _c2v(cls, bf, bl, m):
    st = cls(bf, bl, np.full(m, 10.0), tau=0.5)
    for t in range(1, 21):
        st.observe(st.sample(t, m // 10, True))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("parts", nargs="+", choices=["overhead", "floor", "scale", "kernels"])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--scale-methods", default="fedavg,fedcac,fedc2i")
    ap.add_argument("--floor-epochs", type=int, default=16)
    args = ap.parse_args()
    for part in args.parts:
        globals()[f"part_{part}"](args)
    print_section(f"scale-{args.parts[0]}", args.raw_dir)  # one section shows every part


if __name__ == "__main__":
    main()
