"""One results folder per run: config, per-round metrics (JSON + CSV), final per-client accuracies, failures,
communication, method artefacts and an accuracy-curve PNG, plus a one-line summary.  The writer takes what the run
produced as a value (:class:`strategies.outcome.RunResults`, from the strategy's ``results()``) and knows nothing of
the strategy.  :func:`round_scalars` is a round's numbers as ``rounds.csv``, TensorBoard and MLflow show them
(:mod:`server_app.tracking`)."""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from server_app.coverage import coverage, summary_entry
from strategies.outcome import BACKDOOR, NEWCOMER_METRICS, RoundLog, RunResults
from strategies.plots import integer_ticks, pyplot
from task.config import Settings

RESULTS_ENV = "PFLOWER_RESULTS_DIR"

#: the round's numbers kept in ``extra`` besides ``comm`` and ``dp``, and the group each is shown in
EXTRA_SCALARS = {
    "seconds": "time",
    "server-seconds": "time",
    "checkpoint-seconds": "time",
    "server-peak-rss-mb": "memory",
}


#: the spread of the final personalized accuracy over clients in ``summary.json`` and the summary line, under the names
#: :func:`strategies.history.spread_metrics` gives them in every evaluated round
FAIRNESS = ("personal-acc-std", "personal-acc-min", "personal-acc-p10")
#: the summary's means of what the clients report (un-noised under DP: ``dp-uncovered`` names those a summary has)
UNCOVERED = (
    "personal-acc",
    "global-acc",
    "trained-acc",
    "personal-loss",
    "global-loss",
    *NEWCOMER_METRICS,
    "personal-perplexity",
    "global-perplexity",
)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def round_scalars(r: RoundLog) -> dict[str, float]:
    """One round's numbers under the names TensorBoard groups them by (also ``rounds.csv``'s columns):
    ``train/<metric>`` and ``eval/<metric>`` (the means over the replies, the spread over clients, the reply
    counts), ``comm/<phase>-bytes-<up|down>`` and their sums ``comm/bytes-up`` / ``comm/bytes-down``,
    ``time/seconds`` (the round's wall clock), ``time/server-seconds``, ``time/checkpoint-seconds``,
    ``memory/server-peak-rss-mb`` and, under differential privacy, ``dp/epsilon`` after the round."""
    out = {f"train/{k}": float(v) for k, v in r.train.items() if _number(v)}
    out.update({f"eval/{k}": float(v) for k, v in r.evaluate.items() if _number(v)})
    comm = {k: v for k, v in r.extra.get("comm", {}).items() if _number(v)}
    out.update({f"comm/{k}": float(v) for k, v in comm.items()})
    if comm:
        out["comm/bytes-up"] = float(sum(v for k, v in comm.items() if k.endswith("-up")))
        out["comm/bytes-down"] = float(sum(v for k, v in comm.items() if k.endswith("-down")))
    out.update({f"{group}/{k}": float(r.extra[k]) for k, group in EXTRA_SCALARS.items() if _number(r.extra.get(k))})
    dp = r.extra.get("dp")
    if isinstance(dp, Mapping) and _number(dp.get("epsilon")):
        out["dp/epsilon"] = float(dp["epsilon"])
    return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(_jsonable(obj), indent=1))


def resolve_results_path(path: str) -> Path:
    """A results path as the ServerApp sees it: relative paths resolve against ``$PFLOWER_RESULTS_DIR`` when
    set, else the ServerApp's working directory."""
    p = Path(path).expanduser()
    if not p.is_absolute() and os.environ.get(RESULTS_ENV):
        p = Path(os.environ[RESULTS_ENV]) / p
    return p.resolve()


def clustering_line(outcome: tuple[int, str]) -> tuple[int, str]:
    """(clusters at the end, a plain sentence) of a clustering method's run, e.g. ``(1, "1 cluster: the run was
    FedAvg (...)")``, from its ``clustering_outcome()`` (pFedLIA, the Oracle, CFL, IFCA, FedSoft)."""
    clusters, single = outcome
    return clusters, (f"1 cluster: {single}" if clusters == 1 else f"{clusters} clusters")


def robustness_entries(record: Mapping[str, Any], final: Mapping[str, Any]) -> dict[str, Any]:
    """The headline of a robustness record (strategies/attack_report.py) for ``summary.json``: the attack and rule,
    the attackers, the last evaluation's honest means and backdoor success, and each verdict ``isolated`` the record
    holds."""
    if not record:
        return {}
    verdicts = {}
    for name, part in {**record["mechanism"], "rule": record["rule"]}.items():
        if isinstance(part, dict) and "isolated" in part:
            verdicts[name] = part["isolated"]
        elif isinstance(part, dict):  # one level down (PI-FL's last tiers)
            verdicts.update(
                {f"{name}/{k}": v["isolated"] for k, v in part.items() if isinstance(v, dict) and "isolated" in v}
            )
    out = {
        "attack": record["attack"],
        "aggregator": record["aggregator"],
        "attackers": record["attackers"],
        "attackers-isolated": verdicts,
    }
    outside = record["rule"].get("outside-assumption")
    if outside is not None:  # the averages in which more clients lied than the rule's guarantee allows
        out["outside-assumption"] = outside["averages"]
    for key in ("honest-personal-acc", "honest-global-acc", "attackers-personal-acc", BACKDOOR):
        if key in final:
            out[key] = final[key]
    return out


class ResultsWriter:
    """Creates ``<results-dir>/<time>-<method>-<run id>/``, or continues ``folder`` (a resumed run writes into
    the folder of the run it continues; each resumption is noted in ``resumes.json``)."""

    def __init__(self, settings: Settings, run_id: int, folder: Path | None = None, resumed_after: int = 0) -> None:
        self.settings = settings
        if folder is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.folder = resolve_results_path(settings.results_dir) / f"{stamp}-{settings.method}-{run_id}"
            self.folder.mkdir(parents=True, exist_ok=True)
            config = {
                "run-config": dict(settings.raw),
                "resolved": {k: v for k, v in asdict(settings).items() if k not in ("raw", "options")},
                "options": asdict(settings.options),
            }
            write_json(self.folder / "config.json", config)
        else:
            self.folder = folder
            resumes = json.loads((folder / "resumes.json").read_text()) if (folder / "resumes.json").is_file() else []
            resumes.append(
                {
                    "run-id": run_id,
                    "after-round": resumed_after,
                    "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "run-config": dict(settings.raw),
                }
            )
            write_json(folder / "resumes.json", resumes)

    def write(self, run: RunResults, seconds: float, aborted: str | None = None, stopped: str | None = None) -> str:
        """Every file of the folder from ``run``; returns the summary line."""

        def acc(v: object) -> str:
            return "n/a" if v is None else f"{v:.4f}"

        rows = [{"round": r.server_round, **round_scalars(r)} for r in run.history]
        write_json(
            self.folder / "rounds.json",
            [
                {"round": r.server_round, "train": r.train, "evaluate": r.evaluate, "extra": r.extra}
                for r in run.history
            ],
        )
        fields = sorted({k for row in rows for k in row}, key=lambda k: (k != "round", k))
        with (self.folder / "rounds.csv").open("w", newline="") as fh:
            rounds_csv = csv.DictWriter(fh, fieldnames=fields)
            rounds_csv.writeheader()
            rounds_csv.writerows(rows)
        # the trained clients' last evaluations, and each held-out client's newcomer scores (holdout-clients)
        clients = sorted(run.client_eval.items())
        newcomers = sorted(run.newcomers.items())
        private = self.settings.dp_mode != "off"
        if not private:  # under DP no single client's value is published: every row of clients.csv is one
            client_fields = sorted({k for _, m in clients + newcomers for k in m})
            with (self.folder / "clients.csv").open("w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["client", *client_fields])
                for pid, m in sorted(clients + newcomers):
                    w.writerow([pid, *(m.get(k, "") for k in client_fields)])
        write_json(self.folder / "failures.json", run.failures)
        run.write_artifacts(self.folder)
        self.plot(run.history)
        final = run.history[-1].evaluate if run.history else {}
        summary: dict[str, Any] = {
            "method": self.settings.method,
            "dataset": self.settings.data.dataset,
            "partition": self.settings.data.partition,
            "rounds": len(run.history),
            "personal-acc": final.get("personal-acc"),
            "global-acc": final.get("global-acc"),
            "trained-acc": run.history[-1].train.get("trained-acc") if run.history else None,
            # the spread of the final personalized accuracy over the evaluated clients (strategies.history's
            # spread_metrics): how unequal they are, the worst client, and the bound of the worst tenth (not under DP)
            **({} if private else {k: final.get(k) for k in FAIRNESS}),
            "personal-loss": final.get("personal-loss"),
            "global-loss": final.get("global-loss"),
            "clients": len(clients),
            "failures": len(run.failures),
            "seconds": round(seconds, 2),
            "results": str(self.folder),
        }
        # how many of the clients asked each mean speaks for (server_app/coverage.py), what a sweep must not rank
        covered = coverage(run.history)
        summary["coverage"] = summary_entry(covered, self.settings.min_coverage)
        if run.robustness:  # under an attack or a robust rule (docs/robustness.md)
            write_json(self.folder / "robustness.json", run.robustness)
            summary.update(robustness_entries(run.robustness, final))
        outcome = clustering_line(run.clustering) if run.clustering is not None else None
        if outcome is not None:
            summary["clusters"], summary["clustering"] = outcome
        held_out = ""
        if self.settings.holdout_clients:  # what the method gave the clients that never trained, before and after
            summary["holdout-clients"] = self.settings.holdout_clients  # fine-tuning (strategies/newcomers.py)
            summary["newcomers"] = len(run.newcomers)
            for key in NEWCOMER_METRICS:
                summary[key] = run.newcomer_means.get(key)
            asked = covered.get("newcomers")
            of = f" of {asked.total}" if asked is not None and asked.covered < asked.total else ""
            held_out = (
                f", {summary['newcomers']}{of} newcomers (held out): acc {acc(summary['newcomer-acc'])}, "
                f"fine-tuned {acc(summary['newcomer-finetuned-acc'])}"
            )
        privacy = ""
        spent = run.privacy
        if spent is not None:  # the (epsilon, delta) of every release made (0: none yet), from the release journal
            delta = self.settings.dp_delta
            summary.update({"dp-mode": self.settings.dp_mode, "epsilon": spent.epsilon, "delta": delta})
            summary["dp-neighbours"] = spent.neighbours
            summary["dp-accountant"] = spent.accountant
            summary["dp-noise-multiplier"] = spent.noise_multiplier
            if spent.sampling is not None:
                summary["dp-sampling"] = spent.sampling
            how = f" by the {spent.accountant.upper()} accountant" if spent.accountant != "none" else ""
            privacy = f", ({spent.epsilon:.3g}, {delta:g})-DP ({self.settings.dp_mode}){how}"
        if aborted:
            summary["aborted"] = aborted
        if stopped:
            summary["stopped"] = stopped
        # how the run ended, for scripts (python -m server_app.job and the sweep map it to their exit status)
        summary["outcome"] = "aborted" if aborted else "budget-exhausted" if stopped else "completed"
        if self.settings.data.dataset == "dialects":  # next-word prediction: perplexity = exp(token CE)
            for key in ("personal", "global"):
                loss = summary[f"{key}-loss"]
                if loss is not None:
                    summary[f"{key}-perplexity"] = float(np.exp(float(loss)))
        if private:  # what of this summary epsilon does not cover: the means of what the clients report, un-noised
            summary["dp-uncovered"] = [k for k in UNCOVERED if summary.get(k) is not None]
        write_json(self.folder / "summary.json", summary)

        clustering = f", {summary['clustering']}" if outcome is not None else ""
        evaluated = covered.get("evaluation")
        over = ""  # a mean over fewer clients than were asked says so, beside the number
        if evaluated is not None and evaluated.covered < evaluated.total:
            over = f" over {evaluated.covered} of {evaluated.total} clients"
        spread = ""
        if summary.get("personal-acc-std") is not None:
            spread = (
                f" (over clients: std {acc(summary['personal-acc-std'])}, worst {acc(summary['personal-acc-min'])}, "
                f"10th percentile {acc(summary['personal-acc-p10'])})"
            )
        return (
            f"pflower {summary['method']} on {summary['dataset']}/{summary['partition']}: "
            f"{summary['rounds']} rounds, {summary['clients']} clients{clustering}, personalized acc "
            f"{acc(summary['personal-acc'])}{over if summary['personal-acc'] is not None else ''}{spread}, global acc "
            f"{acc(summary['global-acc'])}{over if summary['global-acc'] is not None else ''}{held_out}, "
            f"{summary['failures']} rejected replies{privacy}, {seconds:.1f} s"
            + (f", ABORTED: {aborted}" if aborted else "")
            + (f", STOPPED: {stopped}" if stopped else "")
            + f" -> {self.folder}"
        )

    def plot(self, history: list[RoundLog]) -> None:
        plt = pyplot()

        rounds = [r.server_round for r in history]
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, label in (
            ("personal-acc", "personalized (mean over clients)"),
            ("global-acc", "global model"),
        ):
            ys = [r.evaluate.get(key) for r in history]
            if any(y is not None for y in ys):
                ax.plot(rounds, [np.nan if y is None else y for y in ys], marker="o", label=label)
        ys = [r.train.get("trained-acc") for r in history]
        if any(y is not None for y in ys):
            ax.plot(rounds, [np.nan if y is None else y for y in ys], ls="--", label="after local training")
        ax.set_xlabel("round")
        integer_ticks(ax)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.set_title(f"{self.settings.method} on {self.settings.data.dataset} ({self.settings.data.partition})")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        fig.tight_layout()
        fig.savefig(self.folder / "accuracy.png", dpi=100)
        plt.close(fig)
