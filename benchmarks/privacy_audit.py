"""An empirical privacy audit: a membership-inference attack on the models a run releases, round by round, beside
the epsilon the run claims (in the spirit of TensorFlow Privacy's privacy tests: the attacker's advantage, the
largest true-positive rate minus false-positive rate over its thresholds).

The attacker is a reader of the results folder, a peer or anyone the released models are handed to: it holds
the models the server saves every round (``save-every=1 save-history=true``: ``models/server/round-<k>/``) and
data of its own, and asks, for each example, whether it was in a client's training data.  Its score is the
example's loss under a reference model minus its loss under the released model (the loss threshold of Yeom et al.
2018, calibrated to each example's difficulty as Watson et al. 2022 do: the reference model has the run's
architecture, trained by the attacker on its public data).  Members are the clients' training examples,
non-members their held-out test examples (never trained on), as many of each from every client, drawn with a fixed
seed.  Before scoring, the attacker recomputes the BatchNorm statistics of the released model on public data of its
own (the clients' validation examples, which these methods do not train on), as docs/privacy.md asks of anyone who
uses a central-DP model; it does so for every run alike.  Beside the advantage the record keeps its chance level:
the 95th percentile of the same attack's advantage with the membership labels shuffled, below which
a measured advantage is noise of the sample.

- **central DP** (FedAvg, the default model): the global model of each round, the noised average the server
  releases; members are every training client's examples.
- **local DP** (FedC2I, the default model): each client's release of each round, as the server holds and forwards
  it to the peers (``client-<id>``); each client's examples are scored under its own release.
- **without DP**: FedAvg's global model, and FedC2I's releases without noise and clipping (each client's trained
  model, ``dp-noise-multiplier=0 dp-clip=0``).

Beside each round's advantage the record keeps the epsilon the run reports after that round and the bound it
implies for this attack.  An example's membership is a change of one client's data set: under central DP that is
a replace-one change of the client (the run's add-or-remove-one epsilon does not cover it by itself), accounted
here as the same releases under replace-one neighbours; under local DP the reported epsilon is already for a
replaced data set.  Any test between two neighbouring data sets of an (epsilon, delta)-DP mechanism has
TPR <= e^eps FPR + delta and 1 - FPR <= e^eps (1 - TPR) + delta, so its advantage is at most
(e^eps - 1 + 2 delta) / (e^eps + 1) (Kairouz, Oh & Viswanath 2015).

    python -m benchmarks.privacy_audit            # 5 runs (about 7 minutes on a quiet 2-core machine)
    python -m benchmarks.privacy_audit --dry-run  # the runs, run nothing
    python -m benchmarks.report                   # docs/privacy.md's generated table (reporting/privacy_audit.py)

One raw record per run, ``benchmarks/raw/privacy-audit/<mode>__<target>.json``: the run's record
(``benchmarks/running.py``) with ``audit``: per round the epsilon reported, the epsilon and advantage bound of an
example's membership, and the attack's advantage, chance level and AUC.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import write_record
from benchmarks.running import Bench, parser

GRID = "privacy-audit"
CLIENTS = 10  # the README's num-supernodes
#: what every run shares: few rounds and more local training on fewer examples than the defaults, so that a model
#: without DP can overfit its clients' data within the rounds (an attack needs something to find)
COMMON: dict[str, Any] = {
    "num-server-rounds": 5,
    "local-epochs": 5,
    "train-samples": 40,
    "seed": 0,
    "save-every": 1,
    "save-history": True,
}
#: (mode, target epsilon) -> the run config's own keys; "inf": without DP
#: FedC2I's "inf" is its local-DP run without noise and clipping: each release is the client's trained model
RUNS: dict[tuple[str, str], dict[str, Any]] = {
    ("central", "inf"): {"method": "fedavg"},
    ("central", "1"): {"method": "fedavg", "dp-mode": "central", "dp-target-epsilon": 1.0},
    ("central", "8"): {"method": "fedavg", "dp-mode": "central", "dp-target-epsilon": 8.0},
    ("local", "inf"): {"method": "fedc2i", "dp-mode": "local", "dp-noise-multiplier": 0.0, "dp-clip": 0.0},
    ("local", "8"): {"method": "fedc2i", "dp-mode": "local", "dp-target-epsilon": 8.0},
}
#: the attacker's reference model: the run's architecture trained on its public data (seeded)
REFERENCE_EPOCHS = 30
SEED = 0  # the attacker's draws of members and non-members


# --------------------------------------------------------------------------- the attack
def advantage(member_scores: np.ndarray, non_member_scores: np.ndarray) -> tuple[float, float]:
    """(the attacker's advantage, the AUC) of a threshold on ``scores`` (higher: more likely a member): the largest
    TPR - FPR over every threshold (TF Privacy's ``attacker_advantage``), and the area under the ROC curve."""
    from sklearn.metrics import roc_auc_score, roc_curve

    y = np.concatenate([np.ones(len(member_scores)), np.zeros(len(non_member_scores))])
    s = np.concatenate([member_scores, non_member_scores])
    fpr, tpr, _ = roc_curve(y, s)
    return float(np.max(tpr - fpr)), float(roc_auc_score(y, s))


def chance_level(member_scores: np.ndarray, non_member_scores: np.ndarray, draws: int = 200) -> float:
    """The advantage the same attack reaches by chance on these examples: the 95th percentile of its advantage
    with the membership labels shuffled (seeded), i.e. where a measured advantage stops being noise."""
    rng = np.random.default_rng(SEED)
    scores = np.concatenate([member_scores, non_member_scores])
    n = len(member_scores)
    shuffled = []
    for _ in range(draws):
        order = rng.permutation(len(scores))
        shuffled.append(advantage(scores[order[:n]], scores[order[n:]])[0])
    return float(np.percentile(shuffled, 95))


def advantage_bound(epsilon: float, delta: float) -> float:
    """The largest advantage any test has between two neighbouring data sets of an (epsilon, delta)-DP mechanism:
    (e^eps - 1 + 2 delta) / (e^eps + 1), at most 1."""
    if math.isinf(epsilon):
        return 1.0
    return min(1.0, (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1))


def losses(model_path: Path, x: Any, y: Any, public: Any) -> np.ndarray:
    """Each example's cross-entropy under the saved model, its BatchNorm statistics recomputed on ``public``."""
    import torch

    from task.export import load_model
    from task.train import norm_statistics

    net, _ = load_model(model_path)
    norm_statistics(net, public)
    net.eval()
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(net(x), y, reduction="none").numpy()


def reference_losses(run_config: dict[str, Any], public_x: Any, public_y: Any) -> Any:
    """The attacker's reference: the run's architecture trained on its public data (seeded); returns a function of
    (x, y) giving each example's loss under it."""
    import torch

    from task.config import parse_settings
    from task.models import build_model
    from task.train import train

    s = parse_settings(run_config)
    net = build_model(s.model, s.in_channels, s.image_size, s.num_classes, seed=SEED + 1)
    train(net, public_x, public_y, epochs=REFERENCE_EPOCHS, seed=SEED)
    net.eval()

    def loss(x: Any, y: Any) -> np.ndarray:
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(net(x), y, reduction="none").numpy()

    return loss


def client_splits(run_config: dict[str, Any], clients: int) -> list[Any]:
    from task.config import parse_settings
    from task.data.clients import load_client_data

    settings = parse_settings(run_config)
    return [load_client_data(settings.data, pid, clients) for pid in range(clients)]


def audit(folder: Path, run_config: dict[str, Any], clients: int) -> list[dict[str, Any]]:
    """Per round: the epsilon the run reported, the bound it gives an example's membership, and the attack's
    advantage, chance level and AUC on the models the server saved that round.  Each client contributes as many
    members (its training examples) as non-members (its test examples), drawn with a fixed seed, so that the two
    sets have the same clients' data distributions; the attacker's public data are the clients' validation
    examples (never trained on by these methods)."""
    import torch

    from task.privacy import Release, releases_bound

    data = client_splits(run_config, clients)
    public, public_y = torch.cat([d.x_val for d in data]), torch.cat([d.y_val for d in data])
    reference = reference_losses(run_config, public, public_y)
    rng = np.random.default_rng(SEED)
    picks = []
    for d in data:
        n = min(len(d.x_train), len(d.x_test))
        picks.append((rng.choice(len(d.x_train), n, replace=False), rng.choice(len(d.x_test), n, replace=False)))
    rounds = {r["round"]: r for r in json.loads((folder / "rounds.json").read_text())}
    delta = float(run_config.get("dp-delta", 1e-5))
    mode = run_config.get("dp-mode", "off")
    out = []
    for round_dir in sorted((folder / "models" / "server").glob("round-*")):
        k = int(round_dir.name.removeprefix("round-"))
        dp = rounds[k]["extra"].get("dp", {})
        reported = float(dp.get("epsilon", math.inf))
        if mode == "central":  # an example's membership: the client's data set replaced, same releases
            sigma = float(dp["noise-multiplier"])
            example = releases_bound([Release(sigma, "local", 1.0, int(dp["noised-rounds"]))], delta)[0].epsilon
        else:
            example = reported
        members, non_members = [], []
        for pid, (d, (im, inn)) in enumerate(zip(data, picks, strict=True)):
            # local DP: each client's examples under its own release; otherwise under the global model
            path = round_dir / (f"client-{pid}.safetensors" if mode == "local" else "global.safetensors")
            if not path.is_file():
                continue
            x_in, y_in, x_out, y_out = d.x_train[im], d.y_train[im], d.x_test[inn], d.y_test[inn]
            members.append(reference(x_in, y_in) - losses(path, x_in, y_in, public))
            non_members.append(reference(x_out, y_out) - losses(path, x_out, y_out, public))
        scores_in, scores_out = np.concatenate(members), np.concatenate(non_members)
        adv, auc = advantage(scores_in, scores_out)
        out.append(
            {
                "round": k,
                "epsilon": reported,
                "example-epsilon": example,
                "advantage-bound": advantage_bound(example, delta),
                "advantage": adv,
                "chance": chance_level(scores_in, scores_out),
                "auc": auc,
                "members": len(scores_in),
                "releases-attacked": len(members) if mode == "local" else 1,
            }
        )
    return out


# --------------------------------------------------------------------------- the runs
def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    ap.add_argument(
        "--attack-only",
        action="store_true",
        help="run no federation: attack again the run folders the records name (benchmarks/out/runs/)",
    )
    args = ap.parse_args(argv)
    plan = [({"mode": mode, "epsilon": target}, {**COMMON, **cfg}) for (mode, target), cfg in RUNS.items()]
    if args.dry_run:
        for cell, cfg in plan:
            print(cell, cfg)
        return
    if args.attack_only:
        from benchmarks.records import load_records
        from benchmarks.running import OUT

        for rec in load_records(GRID, args.raw_dir):
            if rec.get("run") and (OUT / "runs" / rec["run"]).is_dir():
                rec["audit"] = audit(OUT / "runs" / rec["run"], rec["run-config"], CLIENTS)
                write_record(rec, args.raw_dir)
        from benchmarks.reporting.privacy_audit import render_audit

        print(render_audit(Path(args.raw_dir)))
        return
    with Bench(GRID, raw_dir=args.raw_dir, total=len(plan)) as bench:
        for cell, cfg in plan:
            rec = bench.run(cell, cfg, CLIENTS)
            if rec.get("error") or not rec.get("run"):
                continue
            folder = bench.runs_dir / rec["run"]
            rec["audit"] = audit(folder, rec["run-config"], CLIENTS)
            write_record(rec, args.raw_dir)
            last = rec["audit"][-1]
            print(
                f"    {cell}: epsilon {last['epsilon']:.3g}, advantage {last['advantage']:.3f} "
                f"(chance {last['chance']:.3f}, bound {last['advantage-bound']:.3f})",
                flush=True,
            )
    from benchmarks.reporting.privacy_audit import render_audit

    print("\n" + render_audit(Path(args.raw_dir)))


if __name__ == "__main__":
    main()
