"""benchmarks/RESULTS.md is generated from the committed raw records; pairing and settings lines are computed.

Fast (no Flower run): the report is rebuilt in memory from benchmarks/raw/ and compared with the committed
file, so a hand edit of RESULTS.md (or a raw record changed without regenerating) fails here.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

BENCH = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists()) / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import report  # noqa: E402


def test_results_md_is_generated_from_the_raw_records():
    expected = report.build(common.RAW)
    actual = (BENCH / "RESULTS.md").read_text()
    assert actual == expected, (
        "benchmarks/RESULTS.md differs from what benchmarks/raw/ gives: do not edit it by hand; "
        "run `python benchmarks/report.py` and commit the result"
    )


def test_every_raw_record_is_small_and_complete():
    paths = sorted(common.RAW.glob("*/*.json"))
    for path in paths:
        rec = json.loads(path.read_text())
        assert path.stat().st_size < 64_000, f"{path} is {path.stat().st_size} bytes"
        assert rec["schema"] == common.SCHEMA and rec["grid"] == path.parent.name
        assert path.name == common.cell_name(rec["cell"]) + ".json"
        if "measurements" not in rec:
            assert rec["run-config"] and "fingerprint" in rec and "summary" in rec, path
            assert rec["error"] or rec["rounds"], path


# --------------------------------------------------------------------------- helpers
def rec(cell, personal=0.5, glob=None, data="d1", draws="all", config=None, grid="g", error=None, **extra):
    cfg = {
        "method": cell.get("method", "fedavg"),
        "seed": cell.get("seed", 0),
        "lr": 0.05,
        "results-dir": "/x",
        **(config or {}),
    }
    return {
        "schema": common.SCHEMA,
        "grid": grid,
        "cell": cell,
        "command": "python benchmarks/x.py",
        "run": "r",
        "num-supernodes": 10,
        "error": error,
        "code": {"commit": "abc", "dirty": False},
        "machine": {
            "cores": 2,
            "memory-gib": 24,
            "gpu": False,
            "python": "3.11",
            "flwr": "1.41.0",
            "torch": "2.14.1",
            "load-before": 1.0,
            "load-after": 1.0,
        },
        "run-config": cfg,
        "summary": {"personal-acc": personal, "global-acc": glob, "seconds": 1.0},
        "rounds": [{"round": 1, "personal-acc": personal, "global-acc": glob, "train-clients": 10}],
        "clients": {"columns": ["client", "num-examples", "personal-acc"], "rows": [[0, 10, personal]]},
        "artefacts": extra.get("artefacts", {}),
        "failures": {"count": 0, "first": []},
        "fingerprint": {"data": data, "data-columns": ["client", "num-examples"], "draws": draws},
    }


# --------------------------------------------------------------------------- pairing
def test_paired_differences_per_seed_mean_std_and_wins():
    arm = [rec({"method": "a", "seed": s}, personal=p) for s, p in enumerate([0.6, 0.7, 0.5])]
    ref = [rec({"method": "b", "seed": s}, personal=p) for s, p in enumerate([0.5, 0.5, 0.6])]
    p = report.paired(arm, ref, report.PERSONAL)
    assert p.ok and p.deltas == pytest.approx([0.1, 0.2, -0.1])
    assert p.mean == pytest.approx(0.2 / 3) and p.wins == 2 and p.wins_text() == "2/3"
    assert p.text().startswith("+0.0667 ± ")


def test_mismatched_data_fingerprints_give_no_paired_delta():
    arm = [rec({"method": "a", "seed": 0}, personal=0.9, data="d1"), rec({"method": "a", "seed": 1}, data="d2")]
    ref = [rec({"method": "b", "seed": 0}, personal=0.1, data="d1"), rec({"method": "b", "seed": 1}, data="OTHER")]
    p = report.paired(arm, ref, report.PERSONAL)
    assert not p.ok and p.deltas == []
    assert p.text() == "no paired Δ (seed 1: the runs' data differ (data fingerprints disagree))"
    assert p.wins_text() == "—"


def test_draws_must_match_where_the_pairing_claims_them():
    a = [rec({"method": "a", "seed": 0}, draws="h1")]
    assert report.paired(a, [rec({"method": "b", "seed": 0}, draws="h1")], report.PERSONAL, draws=True).ok
    other = report.paired(a, [rec({"method": "b", "seed": 0}, draws="h2")], report.PERSONAL, draws=True)
    assert "drew different clients" in other.reason
    unknown = report.paired(a, [rec({"method": "b", "seed": 0}, draws=None)], report.PERSONAL, draws=True)
    assert "not recorded" in unknown.reason
    # without the draws claim, the same data is enough
    assert report.paired(a, [rec({"method": "b", "seed": 0}, draws="h2")], report.PERSONAL).ok


def test_missing_reference_seed_is_not_paired():
    p = report.paired([rec({"method": "a", "seed": 3})], [rec({"method": "b", "seed": 0})], report.PERSONAL)
    assert not p.ok and "no reference run for seed 3" in p.reason


def test_a_rendered_table_refuses_the_paired_column_when_fingerprints_disagree(tmp_path):
    for seed in (0, 1):
        for method, acc in (("fedavg", 0.5), ("pifl", 0.6)):
            data = "x" if (method, seed) == ("pifl", 1) else f"d{seed}"
            common.write_record(
                rec({"partition": "synth-10:90", "method": method, "seed": seed}, personal=acc, data=data, grid="pifl"),
                tmp_path,
            )
    text = report.render_pifl(tmp_path, {"lr": 0.05})
    row = next(line for line in text.splitlines() if line.startswith("| synth-10:90 | pifl |"))
    assert "no paired Δ (seed 1: the runs' data differ" in row
    assert "+0.1000" not in text


def test_fedbn_on_the_cnn_is_compared_with_fedavg_on_the_cnn_only_in_the_fedc2i_table(tmp_path):
    accs = {"fedavg": 0.70, "fedc2i": 0.80, "fedavg-cnn": 0.85, "fedbn": 0.90}
    for seed in (0, 1):
        for method, acc in accs.items():
            model = "cnn" if method in ("fedavg-cnn", "fedbn") else "c2i-small"
            config = {"model": model, "method": method.removesuffix("-cnn"), "fraction-train": 1.0}
            common.write_record(
                rec({"method": method, "seed": seed}, personal=acc, config=config, grid="fedc2i"), tmp_path
            )
    text = report.render_fedc2i(tmp_path, {"lr": 0.05})
    assert "fedbn and its reference fedavg-cnn (FedAvg) run the `cnn`" in text
    assert "Best federated method by personal-acc: fedc2i." in text  # not a row on another model
    assert "FedBN (0.900) beats FedAvg on the same cnn (0.850): +5.0 points" in text
    assert "| fedbn | 0.9000" in text


def test_fedbn_in_the_client2vec_table_is_paired_with_fedavg_on_the_cnn_by_its_personalized_accuracy(tmp_path):
    # (personalized, global) accuracy; FedBN has no global model: its personalized accuracy (+ seed / 100) counts
    arms = {"FedAvg": (0.60, 0.60), "+ii": (0.65, 0.65), "FedAvg-cnn": (0.70, 0.70), "FedBN-cnn": (0.74, None)}
    for seed in (0, 1):
        for arm, (personal, glob) in arms.items():
            cell = {"setting": "4dom-a0.1", "seed": seed, "arm": arm}
            r = rec(cell, personal=personal + seed / 100, glob=glob, config={"fraction-train": 0.1}, grid="client2vec")
            common.write_record(r, tmp_path)
    text = report.render_client2vec(tmp_path, {"lr": 0.05})
    assert "FedBN-cnn is paired with FedAvg-cnn" in text
    assert "FedBN-cnn: paired Δ (best round) per seed +0.0400 / +0.0500; better than FedAvg-cnn in 2 of 2 seeds" in text
    assert "+ii: paired Δ (best round) per seed +0.0500 / +0.0500; better than FedAvg in 2 of 2 seeds" in text
    assert "FedAvg-cnn: paired" not in text


def test_versus_names_winner_and_seeds():
    a = [rec({"method": "a", "seed": s}, personal=0.8) for s in (0, 1)]
    b = [rec({"method": "b", "seed": s}, personal=0.7) for s in (0, 1)]
    assert (
        report.versus("A", a, "B", b, report.PERSONAL)
        == "A (0.800) beats B (0.700): +10.0 points, better in 2 of 2 seeds (paired)"
    )
    assert report.versus("B", b, "A", a, report.PERSONAL).startswith("B (0.700) does not beat A (0.800): -10.0 points")


# --------------------------------------------------------------------------- settings lines
def test_settings_diff_lists_non_defaults_and_the_rows_that_use_them():
    d = {"lr": 0.05, "fraction-train": 1.0, "min-nodes": 2, "results-dir": "results", "method": "fedavg", "seed": 0}
    recs = [
        rec(
            {"participation": p, "method": m, "seed": s},
            config={
                "fraction-train": 1.0 if p == "full" else 0.1,
                "min-nodes": 50 if p == "full" else 5,
                "lr": 0.1,
                "cfl-eps1": 0.1 if m == "cfl-tuned" else 0.4,
            },
        )
        for p in ("full", "10%")
        for m in ("fedavg", "cfl-tuned")
        for s in (0, 1)
    ]
    diff = report.settings_diff(recs, {**d, "cfl-eps1": 0.4})
    assert "clients (num-supernodes)=10" in diff
    assert "lr=0.1" in diff  # the same in every run: no row attribution
    assert "fraction-train=0.1 (participation 10%)" in diff
    assert "min-nodes=50 (participation full)" in diff and "min-nodes=5 (participation 10%)" in diff
    assert "cfl-eps1=0.1 (method cfl-tuned)" in diff
    assert not any(x.startswith(("results-dir", "seed", "method")) for x in diff)
    assert not any(x.startswith("fraction-train=1.0") for x in diff)  # the default is not a difference


def test_settings_diff_says_once_when_a_key_is_the_rows_label():
    recs = [rec({"partition": p, "seed": 0}, config={"partition": p}) for p in ("iid", "pathological")]
    assert report.settings_diff(recs, {"partition": "dirichlet", "lr": 0.05}) == [
        "clients (num-supernodes)=10",
        "partition: as in the partition column",
    ]


def test_settings_diff_flags_a_default_that_changed_after_the_runs():
    recs = [rec({"seed": s}, config={"warmup-rounds": 20, "lr": 0.1}) for s in (0, 1)]
    for r in recs:
        r["overrides"] = ["lr", "method", "results-dir", "seed"]  # warm-up 20 was the default of the code that ran
    assert report.settings_diff(recs, {"warmup-rounds": 5, "lr": 0.05}) == [
        "clients (num-supernodes)=10",
        "lr=0.1",
        "warmup-rounds=20 (the default when these ran; now 5)",
    ]


def test_settings_diff_flags_keys_no_longer_in_the_defaults():
    diff = report.settings_diff([rec({"seed": 0}, config={"old-key": 3})], {"lr": 0.05})
    assert "old-key=3 (not a run-config key any more)" in diff


def test_paper_diff_separates_differences_from_matches():
    recs = [rec({"seed": s}, config={"fraction-train": 1.0, "warmup-rounds": 20}) for s in (0, 1)]
    paper = [
        report.Paper("participation", "10 %", report.key("fraction-train", report.percent), "spec §3"),
        report.Paper("warm-up rounds", "20", report.key("warmup-rounds"), "spec §3"),
        report.Paper("seeds", "4", report.n_seeds, "spec §3"),
    ]
    differ, same = report.paper_diff(recs, paper)
    assert differ == ["participation: paper 10 %, here 100 % (spec §3)", "seeds: paper 4, here 2 (spec §3)"]
    assert same == ["warm-up rounds"]


def test_a_section_without_records_names_the_command_instead_of_numbers(tmp_path):
    text = report.render_pifl(tmp_path, {})
    assert "Not yet re-run with raw outputs: run `python benchmarks/pifl.py`" in text
    assert "|" not in text


# --------------------------------------------------------------------------- records from a run folder
def _fake_run(folder: Path, examples=(10, 12), goal=None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run-config": {"method": "pfedlia", "lr": 0.05}}))
    (folder / "summary.json").write_text(
        json.dumps({"personal-acc": 0.9, "global-acc": None, "seconds": 3.0, "rounds": 2, "clients": 2, "failures": 0})
    )
    (folder / "rounds.json").write_text(
        json.dumps(
            [
                {
                    "round": r,
                    "train": {"trained-acc": 0.8, "num-replies": 2, "time-train": 0.1},
                    "evaluate": {"personal-acc": 0.9, "num-replies": 2},
                    "extra": {
                        "seconds": 1.5,
                        "comm": {"train-bytes-down": 100, "train-bytes-up": 90, "lia-bytes-down": 10},
                    },
                }
                for r in (1, 2)
            ]
        )
    )
    with open(folder / "clients.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["client", "num-examples", "partition-id", "peak-rss-mb", "personal-acc"]
            + (["goal-examples"] if goal else [])
        )
        for i, n in enumerate(examples):
            w.writerow([i, float(n), float(i), 1000.0, 0.9] + ([goal[i]] if goal else []))
    (folder / "failures.json").write_text("[]")
    (folder / "pfedlia_clusters.json").write_text(
        json.dumps(
            {
                "clustering": {"round": 2, "clusters": 1, "ari": 1.0},
                "assignment": {"0": 0, "1": 0},
                "planted": {"0": 0, "1": 0},
            }
        )
    )
    return folder


def test_record_from_run_keeps_the_essentials(tmp_path):
    folder = _fake_run(tmp_path / "run-a")
    r = common.record_from_run(
        folder,
        grid="g",
        cell={"method": "pfedlia", "seed": 0},
        command="python benchmarks/x.py",
        num_supernodes=2,
        run_config={},
    )
    assert r["run"] == "run-a" and r["run-config"] == {"method": "pfedlia", "lr": 0.05}
    assert r["summary"]["personal-acc"] == 0.9 and r["summary"]["seconds"] == 3.0
    assert r["rounds"][0]["bytes-down"] == 110 and r["rounds"][0]["train-bytes-down"] == 100
    assert r["clients"]["columns"] == ["client", "num-examples", "personal-acc"]  # memory / partition-id dropped
    assert r["clients"]["rows"] == [[0, 10, 0.9], [1, 12, 0.9]]
    assert r["artefacts"]["pfedlia"]["clustering"]["ari"] == 1.0
    assert r["fingerprint"]["draws"] == "all"
    path = common.write_record(r, tmp_path / "raw")
    assert path == tmp_path / "raw" / "g" / "pfedlia__0.json" and json.loads(path.read_text()) == r


def test_data_fingerprint_follows_the_clients_data(tmp_path):
    def fp(name, **kw):
        return common.record_from_run(
            _fake_run(tmp_path / name, **kw), grid="g", cell={}, command="c", num_supernodes=2, run_config={}
        )["fingerprint"]

    assert fp("a")["data"] == fp("b")["data"]
    assert fp("c", examples=(10, 13))["data"] != fp("a2")["data"]
    with_goal = fp("d", goal=(50, 60))
    assert with_goal["data-columns"] == ["client", "num-examples", "goal-examples"]
    assert with_goal["data"] != fp("e", goal=(50, 61))["data"]


def test_failed_run_is_recorded_with_its_reason():
    r = common.record_from_run(
        None,
        grid="g",
        cell={"method": "oracle", "seed": 0},
        command="c",
        num_supernodes=2,
        run_config={"method": "oracle"},
        error="Traceback\nValueError: needs planted clusters\nINFO x",
    )
    assert r["error"] and r["rounds"] == []
    # what was asked, on top of the defaults of the code that ran
    assert r["run-config"] == {**common.app_defaults(), "method": "oracle"} and r["overrides"] == ["method"]
    assert common.failure_line(r["error"]) == "ValueError: needs planted clusters"
    assert report.mean_std([r], report.PERSONAL) == "failed: ValueError: needs planted clusters"


def test_grid_cells_cover_every_combination():
    cells = common.product(
        {
            "partition": {"a": {"partition": "iid"}, "b": {"partition": "dirichlet"}},
            "method": {"m": {"method": "fedavg"}},
        },
        [0, 1],
        {"lr": 0.1},
    )
    assert [c for c, _ in cells] == [{"partition": p, "method": "m", "seed": s} for p in "ab" for s in (0, 1)]
    assert cells[-1][1] == {"lr": 0.1, "partition": "dirichlet", "method": "fedavg", "seed": 1}
    assert common.cell_name({"p": "10%", "d": "synth-10:90", "s": 0}) == "10pct__synth-10_90__0"


def _with_clients(columns, rows):
    r = rec({"seed": 0})
    data_cols = [c for c in columns if c == "client" or c.endswith("examples")]
    r["clients"] = {"columns": columns, "rows": rows}
    r["fingerprint"] = {
        "data": common.digest([[row[columns.index(c)] for c in data_cols] for row in rows]),
        "data-columns": data_cols,
        "draws": "all",
    }
    return r


def test_a_record_with_an_extra_data_column_still_pairs_on_the_columns_both_have():
    old = _with_clients(["client", "num-examples"], [[0, 50], [1, 60]])
    new = _with_clients(["client", "num-examples", "test-examples"], [[0, 50, 20], [1, 60, 25]])
    assert old["fingerprint"]["data"] != new["fingerprint"]["data"]
    assert report.pairing_problem(new, old, draws=False) is None
    other = _with_clients(["client", "num-examples", "test-examples"], [[0, 51, 20], [1, 60, 25]])
    assert report.pairing_problem(other, old, draws=False) == "the runs' data differ (data fingerprints disagree)"
    # the client id alone is no evidence of the same data
    ids_only = _with_clients(["client", "test-examples"], [[0, 20], [1, 25]])
    assert report.pairing_problem(ids_only, old, draws=False) is not None
