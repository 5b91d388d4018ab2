"""benchmarks/RESULTS.md is generated from the committed raw records; pairing and settings lines are computed.

Fast (no Flower run): the report is rebuilt in memory from benchmarks/raw/ and compared with the committed
file, so a hand edit of RESULTS.md (or a raw record changed without regenerating) fails here.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks import records, reporting, running
from benchmarks.records import PERSONAL
from benchmarks.reporting import client2vec as reporting_client2vec
from benchmarks.reporting import defaults, figures, pairing, pifl, settings, text
from benchmarks.reporting import fedc2i as reporting_fedc2i

BENCH = Path(records.__file__).resolve().parent


def test_results_md_is_generated_from_the_raw_records():
    expected = reporting.build(records.RAW)
    actual = (BENCH / "RESULTS.md").read_text()
    assert actual == expected, (
        "benchmarks/RESULTS.md differs from what benchmarks/raw/ gives: do not edit it by hand; "
        "run `python -m benchmarks.report` and commit the result"
    )


def test_the_committed_figures_are_drawn_from_the_raw_records():
    assert reporting.stale_figures(records.RAW, BENCH) == [], (
        "a figure beside RESULTS.md is missing or was drawn from other data than benchmarks/raw/ gives: "
        "run `python -m benchmarks.report` and commit the result"
    )


def test_every_raw_record_is_small_and_complete():
    paths = sorted(records.RAW.glob("*/*.json"))
    for path in paths:
        rec = json.loads(path.read_text())
        assert path.stat().st_size < 64_000, f"{path} is {path.stat().st_size} bytes"
        assert rec["schema"] == records.SCHEMA and rec["grid"] == path.parent.name
        assert path.name == records.cell_name(rec["cell"]) + ".json"
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
        "schema": records.SCHEMA,
        "grid": grid,
        "cell": cell,
        "command": "python -m benchmarks.x",
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
    p = pairing.paired(arm, ref, PERSONAL)
    assert p.ok and p.deltas == pytest.approx([0.1, 0.2, -0.1])
    assert p.mean == pytest.approx(0.2 / 3) and p.wins == 2 and p.wins_text() == "2/3"
    assert p.text().startswith("+0.0667 ± ")


def test_mismatched_data_fingerprints_give_no_paired_delta():
    arm = [rec({"method": "a", "seed": 0}, personal=0.9, data="d1"), rec({"method": "a", "seed": 1}, data="d2")]
    ref = [rec({"method": "b", "seed": 0}, personal=0.1, data="d1"), rec({"method": "b", "seed": 1}, data="OTHER")]
    p = pairing.paired(arm, ref, PERSONAL)
    assert not p.ok and p.deltas == []
    assert p.text() == "no paired Δ (seed 1: the runs' data differ (data fingerprints disagree))"
    assert p.wins_text() == "—"


def test_draws_must_match_where_the_pairing_claims_them():
    a = [rec({"method": "a", "seed": 0}, draws="h1")]
    assert pairing.paired(a, [rec({"method": "b", "seed": 0}, draws="h1")], PERSONAL, draws=True).ok
    other = pairing.paired(a, [rec({"method": "b", "seed": 0}, draws="h2")], PERSONAL, draws=True)
    assert other.reason is not None and "drew different clients" in other.reason
    unknown = pairing.paired(a, [rec({"method": "b", "seed": 0}, draws=None)], PERSONAL, draws=True)
    assert unknown.reason is not None and "not recorded" in unknown.reason
    # without the draws claim, the same data is enough
    assert pairing.paired(a, [rec({"method": "b", "seed": 0}, draws="h2")], PERSONAL).ok


def test_missing_reference_seed_is_not_paired():
    p = pairing.paired([rec({"method": "a", "seed": 3})], [rec({"method": "b", "seed": 0})], PERSONAL)
    assert not p.ok and p.reason is not None and "no reference run for seed 3" in p.reason


def test_a_rendered_table_refuses_the_paired_column_when_fingerprints_disagree(tmp_path):
    for seed in (0, 1):
        for method, acc in (("fedavg", 0.5), ("pifl", 0.6)):
            data = "x" if (method, seed) == ("pifl", 1) else f"d{seed}"
            records.write_record(
                rec({"partition": "synth-10:90", "method": method, "seed": seed}, personal=acc, data=data, grid="pifl"),
                tmp_path,
            )
    text = pifl.render_pifl(tmp_path, {"lr": 0.05})
    row = next(line for line in text.splitlines() if line.startswith("| synth-10:90 | pifl |"))
    assert "no paired Δ (seed 1: the runs' data differ" in row
    assert "+0.1000" not in text


def test_fedbn_on_the_cnn_is_compared_with_fedavg_on_the_cnn_only_in_the_fedc2i_table(tmp_path):
    accs = {"fedavg": 0.70, "fedc2i": 0.80, "fedavg-cnn": 0.85, "fedbn": 0.90}
    for seed in (0, 1):
        for method, acc in accs.items():
            model = "cnn" if method in ("fedavg-cnn", "fedbn") else "c2i-small"
            config = {"model": model, "method": method.removesuffix("-cnn"), "fraction-train": 1.0}
            records.write_record(
                rec({"method": method, "seed": seed}, personal=acc, config=config, grid="fedc2i"), tmp_path
            )
    text = reporting_fedc2i.render_fedc2i(tmp_path, {"lr": 0.05})
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
            records.write_record(r, tmp_path)
    text = reporting_client2vec.render_client2vec(tmp_path, {"lr": 0.05})
    assert "FedBN-cnn is paired with FedAvg-cnn" in text
    assert "FedBN-cnn: paired Δ (best round) per seed +0.0400 / +0.0500; better than FedAvg-cnn in 2 of 2 seeds" in text
    assert "+ii: paired Δ (best round) per seed +0.0500 / +0.0500; better than FedAvg in 2 of 2 seeds" in text
    assert "FedAvg-cnn: paired" not in text


def test_versus_names_winner_and_seeds():
    a = [rec({"method": "a", "seed": s}, personal=0.8) for s in (0, 1)]
    b = [rec({"method": "b", "seed": s}, personal=0.7) for s in (0, 1)]
    assert (
        pairing.versus("A", a, "B", b, PERSONAL)
        == "A (0.800) beats B (0.700): +10.0 points, better in 2 of 2 seeds (paired)"
    )
    assert pairing.versus("B", b, "A", a, PERSONAL).startswith("B (0.700) does not beat A (0.800): -10.0 points")


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
    diff = settings.settings_diff(recs, {**d, "cfl-eps1": 0.4})
    assert "clients (num-supernodes)=10" in diff
    assert "lr=0.1" in diff  # the same in every run: no row attribution
    assert "fraction-train=0.1 (participation 10%)" in diff
    assert "min-nodes=50 (participation full)" in diff and "min-nodes=5 (participation 10%)" in diff
    assert "cfl-eps1=0.1 (method cfl-tuned)" in diff
    assert not any(x.startswith(("results-dir", "seed", "method")) for x in diff)
    assert not any(x.startswith("fraction-train=1.0") for x in diff)  # the default is not a difference


def test_settings_diff_says_once_when_a_key_is_the_rows_label():
    recs = [rec({"partition": p, "seed": 0}, config={"partition": p}) for p in ("iid", "pathological")]
    assert settings.settings_diff(recs, {"partition": "dirichlet", "lr": 0.05}) == [
        "clients (num-supernodes)=10",
        "partition: as in the partition column",
    ]


def test_settings_diff_flags_a_default_that_changed_after_the_runs():
    recs = [rec({"seed": s}, config={"warmup-rounds": 20, "lr": 0.1}) for s in (0, 1)]
    for r in recs:
        r["overrides"] = ["lr", "method", "results-dir", "seed"]  # warm-up 20 was the default of the code that ran
    assert settings.settings_diff(recs, {"warmup-rounds": 5, "lr": 0.05}) == [
        "clients (num-supernodes)=10",
        "lr=0.1",
        "warmup-rounds=20 (the default when these ran; now 5)",
    ]


def test_settings_diff_flags_keys_no_longer_in_the_defaults():
    diff = settings.settings_diff([rec({"seed": 0}, config={"old-key": 3})], {"lr": 0.05})
    assert "old-key=3 (not a run-config key any more)" in diff


def test_paper_diff_separates_differences_from_matches():
    recs = [rec({"seed": s}, config={"fraction-train": 1.0, "warmup-rounds": 20}) for s in (0, 1)]
    paper = [
        settings.Paper("participation", "10 %", settings.key("fraction-train", settings.percent), "spec §3"),
        settings.Paper("warm-up rounds", "20", settings.key("warmup-rounds"), "spec §3"),
        settings.Paper("seeds", "4", settings.n_seeds, "spec §3"),
    ]
    differ, same = settings.paper_diff(recs, paper)
    assert differ == ["participation: paper 10 %, here 100 % (spec §3)", "seeds: paper 4, here 2 (spec §3)"]
    assert same == ["warm-up rounds"]


def test_a_section_without_records_names_the_command_instead_of_numbers(tmp_path):
    text = pifl.render_pifl(tmp_path, {})
    assert "Not yet re-run with raw outputs: run `python -m benchmarks.pifl`" in text
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
    with (folder / "clients.csv").open("w", newline="") as fh:
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
    r = running.record_from_run(
        folder,
        grid="g",
        cell={"method": "pfedlia", "seed": 0},
        command="python -m benchmarks.x",
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
    path = records.write_record(r, tmp_path / "raw")
    assert path == tmp_path / "raw" / "g" / "pfedlia__0.json" and json.loads(path.read_text()) == r


def test_data_fingerprint_follows_the_clients_data(tmp_path):
    def fp(name, **kw):
        return running.record_from_run(
            _fake_run(tmp_path / name, **kw), grid="g", cell={}, command="c", num_supernodes=2, run_config={}
        )["fingerprint"]

    assert fp("a")["data"] == fp("b")["data"]
    assert fp("c", examples=(10, 13))["data"] != fp("a2")["data"]
    with_goal = fp("d", goal=(50, 60))
    assert with_goal["data-columns"] == ["client", "num-examples", "goal-examples"]
    assert with_goal["data"] != fp("e", goal=(50, 61))["data"]


def test_failed_run_is_recorded_with_its_reason():
    r = running.record_from_run(
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
    assert r["run-config"] == {**records.run_config_defaults(), "method": "oracle"} and r["overrides"] == ["method"]
    assert records.error_line(r["error"]) == "ValueError: needs planted clusters"
    assert text.mean_std([r], PERSONAL) == "failed: ValueError: needs planted clusters"


def test_a_record_names_the_module_command_that_runs_it_again():
    """A script's records name ``python -m benchmarks.<script>`` with its arguments; the line above a table gives
    that command, also for records that named the script by its path (before the scripts were modules)."""
    assert running.command_line(["/repo/benchmarks/grids.py", "--families", "label-skew", "--note", "a b"]) == (
        "python -m benchmarks.grids --families label-skew --note 'a b'"
    )
    recs = [
        {**rec({"seed": 0}), "command": "python benchmarks/pifl.py --seeds 0 --raw-dir /tmp/raw"},
        {**rec({"seed": 1}), "command": "python -m benchmarks.pifl --seeds 0"},
    ]
    assert [settings.command(r) for r in recs] == ["python -m benchmarks.pifl --seeds 0"] * 2
    assert settings.header(recs, [], {}).startswith("Command: `python -m benchmarks.pifl --seeds 0` (seeds 0, 1).")


def test_grid_cells_cover_every_combination():
    cells = running.product(
        {
            "partition": {"a": {"partition": "iid"}, "b": {"partition": "dirichlet"}},
            "method": {"m": {"method": "fedavg"}},
        },
        [0, 1],
        {"lr": 0.1},
    )
    assert [c for c, _ in cells] == [{"partition": p, "method": "m", "seed": s} for p in "ab" for s in (0, 1)]
    assert cells[-1][1] == {"lr": 0.1, "partition": "dirichlet", "method": "fedavg", "seed": 1}
    assert records.cell_name({"p": "10%", "d": "synth-10:90", "s": 0}) == "10pct__synth-10_90__0"


def test_a_declared_grid_is_its_axes_narrowed_by_the_command_line():
    """A grid declared as data: every combination of the chosen labels and seeds over the base; an option left out
    comes from the chosen preset, then the defaults; a label the grid lacks is refused before anything runs."""
    spec = running.Declared(
        "g",
        {"partition": {"a": {"partition": "iid"}, "b": {"partition": "dirichlet"}}, "method": running.method_axis},
        base={"lr": 0.1},
        defaults={"clients": 4, "methods": "fedavg"},
        presets={"small": {"grid": "g-small", "seeds": "0"}, "big": {"grid": "g-big", "partitions": "b"}},
    )
    args = spec.parse(spec.parser(None), ["--rounds", "3", "--methods", "local,fedcac", "--raw-dir", "/nowhere"])
    assert (args.grid_name, args.clients) == ("g-small", 4)
    cells = spec.cells(args, mu=1)
    assert [tuple(c.values()) for c, _ in cells] == [(p, m, 0) for p in "ab" for m in ("local", "fedcac")]
    assert cells[-1][1] == {
        "lr": 0.1,
        "num-server-rounds": 3,
        "mu": 1,
        "partition": "dirichlet",
        "method": "fedcac",
        "seed": 0,
    }
    big = spec.parse(spec.parser(None), ["--grid", "big"])
    assert big.grid_name == "g-big"
    assert [c for c, _ in spec.cells(big)] == [{"partition": "b", "method": "fedavg", "seed": s} for s in (0, 1, 2)]
    with pytest.raises(SystemExit, match="unknown partitions"):
        spec.cells(spec.parse(spec.parser(None), ["--partitions", "a,c"]))


def _with_clients(columns, rows):
    r = rec({"seed": 0})
    data_cols = [c for c in columns if c == "client" or c.endswith("examples")]
    r["clients"] = {"columns": columns, "rows": rows}
    r["fingerprint"] = {
        "data": records.digest([[row[columns.index(c)] for c in data_cols] for row in rows]),
        "data-columns": data_cols,
        "draws": "all",
    }
    return r


def test_a_record_with_an_extra_data_column_still_pairs_on_the_columns_both_have():
    old = _with_clients(["client", "num-examples"], [[0, 50], [1, 60]])
    new = _with_clients(["client", "num-examples", "test-examples"], [[0, 50, 20], [1, 60, 25]])
    assert old["fingerprint"]["data"] != new["fingerprint"]["data"]
    assert pairing.pairing_problem(new, old, draws=False) is None
    other = _with_clients(["client", "num-examples", "test-examples"], [[0, 51, 20], [1, 60, 25]])
    assert pairing.pairing_problem(other, old, draws=False) == "the runs' data differ (data fingerprints disagree)"
    # the client id alone is no evidence of the same data
    ids_only = _with_clients(["client", "test-examples"], [[0, 20], [1, 25]])
    assert pairing.pairing_problem(ids_only, old, draws=False) is not None


def test_runs_whose_clients_lost_their_replies_are_refused_as_a_pair_with_that_reason():
    """A run in which the gate rejected every train reply of a client does not record that client's data: the
    pair is refused (the means cover different data) and the reason says why, not that the data differ."""
    full = _with_clients(["client", "num-examples", "test-examples"], [[0, 50, 20], [1, 60, 25], [2, 70, 30]])
    lost = _with_clients(["client", "num-examples", "test-examples"], [[0, 50, 20], [1, None, 25], [2, None, 30]])
    for a, b in ((lost, full), (full, lost)):
        assert pairing.pairing_problem(a, b, draws=False) == (
            "a run does not know the data of 2 clients (their replies were rejected)"
        )
    assert pairing.pairing_problem(full, full, draws=False) is None


# --------------------------------------------------------------------------- every method at its defaults
def _defaults_grid(tmp_path, accs, rounds=None, data=None, errors=(), artefacts=None):
    """Write a defaults grid: ``accs[method]`` = final personalized accuracy per seed; ``rounds[method]`` = per seed,
    the personalized accuracy of each round; ``data[(method, seed)]`` overrides the data fingerprint."""
    for method, per_seed in accs.items():
        for seed, acc in enumerate(per_seed):
            r = rec(
                {"method": method, "seed": seed},
                personal=acc,
                glob=acc if method == "fedavg" else None,
                data=(data or {}).get((method, seed), f"d{seed}"),
                grid="defaults",
                error="Traceback\ntask.options.ConfigConflict: oracle needs planted clusters"
                if method in errors
                else None,
                artefacts=(artefacts or {}).get(method, {}),
            )
            r["summary"]["seconds"] = 10.0 + seed
            if rounds and method in rounds:
                r["rounds"] = [
                    {"round": i + 1, "personal-acc": a, "global-acc": a if method == "fedavg" else None}
                    for i, a in enumerate(rounds[method][seed])
                ]
            if method in errors:
                r["summary"], r["rounds"] = dict.fromkeys(r["summary"]), []
            records.write_record(r, tmp_path)


def _row(text_, method):
    return next(line for line in text_.splitlines() if line.startswith(f"| {method} |")).split(" | ")


def test_defaults_table_pairs_by_seed_and_flags_methods_that_are_not_useful(tmp_path):
    _defaults_grid(
        tmp_path,
        {
            "local": [0.90, 0.92, 0.94],
            "fedavg": [0.91, 0.93, 0.95],
            "good": [0.95, 0.92, 0.97],  # +2.8 points over Local on average, better in 2 of 3 seeds
            "gap": [0.89, 0.90, 0.91],  # 3 below FedAvg (the better one), 2 below Local: a gap, not a collapse
            "bad": [0.80, 0.85, 0.90],  # 7 below Local
            "oracle": [0.5, 0.5, 0.5],
        },
        errors=("oracle",),
    )
    text_ = defaults.render_defaults(tmp_path, {"min-nodes": 2, "lr": 0.05})
    good, gap, bad = _row(text_, "`good`"), _row(text_, "`gap`"), _row(text_, "`bad`")
    assert good[1] == "0.9467 (0.9200-0.9700)"  # mean (min-max over seeds)
    assert good[3] == "+2.7 (+0.0 to +5.0)" and good[4] == "2/3"  # paired with Local on the same seed
    assert good[5] == "+1.7 (-1.0 to +4.0)" and good[6] == "2/3"
    assert good[-1].startswith("yes")
    assert "**gap**: -3.0 points vs FedAvg" in gap[-1]
    assert "**no**: -7.0 points vs Local" in bad[-1]
    assert _row(text_, "`local`")[3] == "—" and _row(text_, "`fedavg`")[5] == "—"  # no difference to itself
    oracle = _row(text_, "`oracle`")
    assert "failed: task.options.ConfigConflict: oracle needs planted clusters" in oracle[1]
    assert oracle[-1].startswith("failed")
    assert "`oracle` failed in 3 of 3 runs: task.options.ConfigConflict: oracle needs planted clusters." in text_
    assert oracle[3] == "—" and oracle[5] == "—"
    assert "Useful by the criterion above: 3 of 6 methods (flagged: `bad`, `gap`)." in text_
    # the rows come best first after the two references
    order = [line.split(" | ")[0][2:] for line in text_.splitlines() if line.startswith("| ")][1:]
    assert order == ["`local`", "`fedavg`", "`good`", "`gap`", "`bad`", "`oracle`"]


def test_defaults_table_refuses_a_paired_difference_when_the_partitions_differ(tmp_path):
    _defaults_grid(
        tmp_path,
        {"local": [0.9, 0.9], "fedavg": [0.9, 0.9], "m": [0.95, 0.95]},
        data={("m", 1): "another-partition"},
    )
    row = _row(defaults.render_defaults(tmp_path, {}), "`m`")
    assert row[3].startswith("no paired Δ (seed 1: the runs' data differ") and row[4] == "—"


def test_defaults_row_counts_a_failed_seed_and_keeps_an_error_inside_its_cell(tmp_path):
    _defaults_grid(tmp_path, {"local": [0.9, 0.9], "fedavg": [0.9, 0.9], "flaky": [0.8, 0.7], "broken": [0, 0]})
    for cell in (("flaky", 1), ("broken", 0), ("broken", 1)):
        path = tmp_path / "defaults" / f"{cell[0]}__{cell[1]}.json"
        r = json.loads(path.read_text())
        r["error"], r["rounds"] = "Traceback\nValueError: a | b", []
        r["summary"] = dict.fromkeys(r["summary"])
        path.write_text(json.dumps(r))
    text_ = defaults.render_defaults(tmp_path, {})
    assert _row(text_, "`flaky`")[1] == "0.8000 (1 of 2 runs failed)"
    broken = next(line for line in text_.splitlines() if line.startswith("| `broken` |"))
    assert "failed: ValueError: a \\| b" in broken and broken.count(" | ") == 8  # nine cells, none split


def test_defaults_claims_say_when_a_method_is_fedavg_or_ends_with_one_cluster(tmp_path):
    one = {"pfedlia": {"clustering": {"clusters": 1}, "assignment": {}, "planted": {}}}
    _defaults_grid(
        tmp_path,
        {"local": [0.9, 0.8], "fedavg": [0.85, 0.86], "pfedlia": [0.85, 0.86]},
        artefacts={"pfedlia": one},
    )
    text_ = defaults.render_defaults(tmp_path, {})
    assert "`pfedlia` has FedAvg's accuracy in every seed (paired difference 0)." in text_
    assert "`pfedlia` ended with 1 cluster (one cluster, i.e. a single model, in 2 of 2 seeds)." in text_


def test_defaults_without_records_names_the_command(tmp_path):
    text_ = defaults.render_defaults(tmp_path, {})
    assert "run `python -m benchmarks.defaults`" in text_ and "|" not in text_
    assert defaults.figures_defaults(tmp_path) == []


def test_learning_curves_are_the_per_round_mean_and_spread_over_seeds(tmp_path):
    _defaults_grid(
        tmp_path,
        {"local": [0.6, 0.8], "fedavg": [0.7, 0.7], "oracle": [0, 0]},
        rounds={"local": [[0.2, 0.6], [0.4, 0.8]], "fedavg": [[0.5, 0.7], [0.5, 0.7]]},
        errors=("oracle",),
    )
    (fig,) = defaults.figures_defaults(tmp_path)
    assert [p.title for p in fig.panels] == ["local", "fedavg"]  # the failed method has no curve
    local = fig.panels[0].lines[0]
    assert local.x == [1, 2] and local.y == pytest.approx([0.3, 0.7])
    assert local.lo == pytest.approx([0.2, 0.6]) and local.hi == pytest.approx([0.4, 0.8])
    fedavg_panel = {line.label: line for line in fig.panels[1].lines}
    assert fedavg_panel["personalized"].y == pytest.approx([0.5, 0.7])
    assert "global model" not in fedavg_panel  # FedAvg's global model is its personalized model: drawn once
    assert fedavg_panel["local (reference)"].reference and fedavg_panel["local (reference)"].y == pytest.approx(
        [0.3, 0.7]
    )
    assert "fedavg (reference)" not in fedavg_panel
    text_ = defaults.render_defaults(tmp_path, {})
    assert f"]({fig.file})" in text_  # RESULTS.md shows the figure


def test_a_drawn_figure_carries_its_data_and_a_changed_record_makes_it_stale(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    out.mkdir()
    _defaults_grid(raw, {"local": [0.6], "fedavg": [0.7]}, rounds={"local": [[0.2, 0.6]], "fedavg": [[0.5, 0.7]]})
    assert reporting.stale_figures(raw, out) == [defaults.CURVES]  # not drawn yet
    for fig in reporting.build_figures(raw):
        path = figures.draw(fig, out)
        assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert reporting.stale_figures(raw, out) == []
    _defaults_grid(raw, {"local": [0.6], "fedavg": [0.7]}, rounds={"local": [[0.2, 0.65]], "fedavg": [[0.5, 0.7]]})
    assert reporting.stale_figures(raw, out) == [defaults.CURVES]


def test_the_defaults_grid_runs_every_registered_method_with_nothing_but_method_and_seed():
    from benchmarks import defaults as script
    from task.methods import METHODS

    def plan(*argv: str) -> list[tuple[dict, dict]]:
        return script.cells(script.SPEC.parse(script.SPEC.parser(None), list(argv)))

    grid = plan()
    assert [c["method"] for c, _ in grid] == list(METHODS) * 3  # every method of the registry, seed-major
    assert [c["seed"] for c, _ in grid] == [s for s in (0, 1, 2) for _ in METHODS]
    assert all(cfg == {"method": c["method"], "seed": c["seed"]} for c, cfg in grid)
    assert plan("--methods", "local", "--seeds", "0", "--rounds", "3") == [
        ({"method": "local", "seed": 0}, {"num-server-rounds": 3, "method": "local", "seed": 0})
    ]
    with pytest.raises(SystemExit, match=r"unknown methods \['fedavgg'\]; this benchmark has: local, fedavg"):
        plan("--methods", "fedavgg")


def test_a_record_names_the_cpu_and_the_kernels_pytorch_chose_there():
    """Another instruction set gives other floats (personal losses then differ in their fourth digit after 20
    rounds), so a record says which CPU and which of PyTorch's kernel sets it ran on."""
    import torch

    here = running.machine()
    assert here["cpu-capability"] == torch.backends.cpu.get_cpu_capability()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        assert here["cpu"] == (names[0] if names else None)
