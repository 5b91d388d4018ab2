"""Run a committed benchmark record's exact run config again on today's code and compare the results.

Each raw record under ``benchmarks/raw/<grid>/`` holds the full run config of its run and the code commit it ran
on. This re-runs that config through Flower (``--engine``: the in-process engine by default, or ``flwr-run``, a
private simulation SuperLink) with the same number of SuperNodes and prints, metric by metric and round by round,
what changed. A refactor that keeps behaviour reproduces the record's numbers up to float noise: where the code now
sums in another order, or where this machine's CPU kernels differ from the recording machine's (another instruction
set gives floats that differ by about 1e-8, which methods with personal models amplify over the rounds: into a
personal loss that differs in its fourth or fifth digit, and for some runs into accuracies that differ by points, a
seed of FedCAC among them; a single seed's difference of a point or two can be this noise, which is why the tables
pair seeds and clients and give intervals). To tell a code change from the machine, run the record's commit
(``code.commit``) and today's code on one machine: a refactor that keeps behaviour gives them bit for bit.

    python -m benchmarks.reproduce baselines-clean/pathological__fedavg__0 fedcac/pathological__fedcac__0

Exit status 0 when every compared number agrees within ``--tolerance`` (default 1e-6), 1 otherwise.
Keys of the old run config that today's code no longer declares are reported and left out.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.records import run_config_defaults
from benchmarks.running import machine, parser
from server_app.engine import Engine
from server_app.runner import LocalSimulation

METRICS = ("personal-acc", "global-acc", "trained-acc", "personal-loss", "clients", "rounds", "failures")


def compare(record: dict, summary: dict, rounds: list[dict], tolerance: float) -> list[str]:
    """Differences between a record and a new run (empty: it reproduces)."""
    diffs = []
    old = record["summary"]
    for key in METRICS:
        a, b = old.get(key), summary.get(key)
        if a is None and b is None:
            continue
        if a is None or b is None or abs(float(a) - float(b)) > tolerance:
            diffs.append(f"{key}: recorded {a}, now {b}")
    for r_old, r_new in zip(record.get("rounds", []), rounds, strict=False):
        for key in ("personal-acc", "global-acc"):
            a, b = r_old.get(key), (r_new.get("evaluate") or {}).get(key)
            if a is not None and (b is None or abs(a - b) > max(tolerance, 1e-6)):
                diffs.append(f"round {r_old['round']} {key}: recorded {a}, now {b}")
    return diffs


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("records", nargs="+", help="<grid>/<cell> of benchmarks/raw (without .json)")
    ap.add_argument("--tolerance", type=float, default=1e-6)
    args = ap.parse_args()
    declared = run_config_defaults()
    failed = 0
    with LocalSimulation() if args.engine == "flwr-run" else Engine() as sim:
        for name in args.records:
            record = json.loads((Path(args.raw_dir) / f"{name}.json").read_text())
            old_cfg = record["run-config"]
            dropped = sorted(k for k in old_cfg if k not in declared)
            cfg = {k: v for k, v in old_cfg.items() if k in declared and k != "results-dir"}
            start = time.monotonic()
            summary = sim.run(cfg, num_supernodes=record["num-supernodes"], timeout=7200)
            rounds = json.loads((Path(summary["results"]) / "rounds.json").read_text())
            diffs = compare(record, summary, rounds, args.tolerance)
            code = (record.get("code") or {}).get("commit", "?")[:10]
            verdict = "reproduces" if not diffs else f"DIFFERS in {len(diffs)} numbers"
            print(
                f"{name} (recorded on {code}): {verdict} ({time.monotonic() - start:.0f} s)"
                + (f"; old keys left out: {dropped}" if dropped else "")
            )
            same = [
                r["round"]
                for r in record.get("rounds", [])
                if not any(d.startswith(f"round {r['round']} ") for d in diffs)
            ]
            first_diff = next((r["round"] for r in record.get("rounds", []) if r["round"] not in same), None)
            if first_diff is not None:
                # a drift that starts late and stays small is float noise (summation order, or another machine's
                # CPU kernels); a change of behaviour shows from round 1
                print(f"  rounds 1..{first_diff - 1} agree; first difference in round {first_diff}")
            then, now = record.get("machine", {}), machine()
            for key in ("cpu", "cpu-capability"):
                if then.get(key) != now[key]:
                    print(f"  {key}: recorded {then.get(key, 'not recorded')}, here {now[key]}")
            for d in diffs[:20]:
                print(f"  {d}")
            failed += bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
