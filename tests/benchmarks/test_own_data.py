"""The equal-tuning protocol on a user's own data (benchmarks/own_data.py): the federation the user describes becomes
one family (every method tuned alike, selected on validation, reported on test), its estimated compute and how to
shrink it come before any run, progress while it runs, and the user's page comes from the records with the same
generator as docs/choosing-a-method.md.  End to end once, shrunk, on a local copy (a Hugging Face save_to_disk folder)
made here from the embedded digits."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from benchmarks import own_data, protocol
from benchmarks.families import setting_label
from benchmarks.records import PERSONAL, RAW, load_records, write_record
from benchmarks.reporting import choosing
from benchmarks.running import Todo

from .test_grids import record

BASE = ["--dataset", "usps", "--partition", "dirichlet", "--alpha", "0.5", "--clients", "4"]


def family(*extra: str):
    return own_data.own_family(own_data.arguments().parse_args([*BASE, *extra]), {})


def test_the_users_federation_is_one_cell_with_every_method_tuned_alike():
    fam = family("--participation", "0.5", "--methods", "local,fedavg,fedrep,ditto", "--rounds", "7")
    assert fam.cells() == [(0, "dirichlet-0.5")] and fam.clients == 4 and fam.tuned_from is None
    config = fam.cell_config(*fam.middle)
    assert config["dataset"] == "usps" and config["alpha"] == 0.5 and config["fraction-train"] == 0.5
    assert config["num-server-rounds"] == 7 and config["min-nodes"] == 4 and config["train-samples"] == 0
    # the families' rows: the same shared keys, the same number of values of a key of its own
    assert [r.name for r in fam.rows] == ["local", "fedavg", "fedrep", "ditto"]
    assert {len(fam.settings(r)) for r in fam.rows if r.key} == {len(fam.lrs) * len(fam.epochs) * 2}
    bare = family("--methods", "local,fedavg,ditto", "--no-own-keys", "--no-extend", "--lrs", "0.05")
    assert {len(bare.settings(r)) for r in bare.rows} == {2} and bare.ladder == ()
    selection, grid = own_data.planned_runs(bare)
    assert len(selection) == 3 * 2 * 2 and len(grid) == 3 * 5
    assert all(r.config["evaluate-split"] == "validation" for r in selection)
    assert all("evaluate-split" not in r.config for r in grid)


def test_a_bad_federation_is_refused_before_any_run(tmp_path):
    with pytest.raises(SystemExit, match=r"--methods must hold local and fedavg.*\['fedavg'\]"):
        family("--methods", "local,fedrep")
    with pytest.raises(SystemExit, match=r"unknown method \['nosuch'\]; allowed: \["):
        family("--methods", "local,fedavg,nosuch")
    with pytest.raises(SystemExit, match="outside benchmarks/raw"):
        own_data.main([*BASE, "--raw-dir", str(RAW)])
    with pytest.raises(SystemExit, match="does not exist"):
        own_data.main([*BASE, "--data-dir", str(tmp_path / "nothing"), "--raw-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"bad run configs:\n  own / local: .*'batch-size'"):
        own_data.main([*BASE, "--run-config", "batch-size=0", "--raw-dir", str(tmp_path)])


def test_the_estimate_comes_from_the_timing_run_and_says_how_to_shrink_it(tmp_path):
    fam = family("--methods", "local,fedavg,ditto", "--rounds", "11", "--lrs", "0.01,0.05", "--epochs", "1,2")
    # a 3-round timing run: 4 s to start and the first round, then 2 s a round -> 4 + 10 x 2 = 24 s for 11 rounds
    timing = record(protocol.TIMING, {"family": fam.name, "arm": "fedavg"}, 0.5, wall=8.0)
    timing["rounds"] = [{"round": i, "seconds": s} for i, s in enumerate([2.0, 2.0, 2.0], 1)]
    write_record(timing, tmp_path)
    lines = own_data.estimate_lines(fam, tmp_path, Todo(tmp_path), jobs=4)
    selection, grid = own_data.planned_runs(fam)
    assert (
        len(selection) == 2 * (4 + 4 + 8) and len(grid) == 3 * 5
    )  # 2 selection seeds; Local, FedAvg 4 settings, Ditto 8
    assert f"{len(selection) + len(grid)} runs, {len(selection) + len(grid)} not recorded yet" in lines[0]
    found = own_data.seconds_per_run(fam, tmp_path)
    assert found is not None
    per, why = found
    assert per["fedavg"] == pytest.approx(24.0) and "pflower's committed digits grids" in why  # others: FedAvg x cost
    seconds = re.search(r"about (\d+) s per run", lines[1])
    assert seconds is not None and int(seconds.group(1)) == round(float(np.mean(list(per.values()))))
    assert f"{sum(per[r.row.name] for r in selection + grid) / 3600 / 4:.1f} h on 4 workers" in lines[1] or (
        f"{sum(per[r.row.name] for r in selection + grid) / 60 / 4:.0f} min on 4 workers" in lines[1]
    )
    assert "scaled to 11 rounds" in lines[1] and "on 4 workers (--jobs)" in lines[1]
    shrink = lines[2]
    assert "runs per method: local 13, fedavg 13, ditto 21" in shrink  # settings x 2 selection seeds + 5 seeds
    assert "each reported seed is 3 runs; 2 is the fewest a win is judged on" in shrink
    assert (
        "--epochs 1 (each local-epochs value is 16 runs)" in shrink
        and "--lrs (each learning rate is 16 runs)" in shrink
    )
    assert "--no-own-keys" in shrink and "--no-extend" in shrink


def usps_copy(folder: Path, n: int = 400) -> Path:
    """A local copy as a user gives one: a save_to_disk folder of 16x16 grey images (the embedded digits, enlarged)
    under the columns the 'usps' data set reads."""
    from datasets import Dataset, Image
    from PIL import Image as PILImage
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [PILImage.fromarray((im * 255 / 16).astype(np.uint8), "L").resize((16, 16)) for im in digits.images[:n]]
    Dataset.from_dict({"image": images, "label": digits.target[:n].tolist()}).cast_column(
        "image", Image()
    ).save_to_disk(folder)
    return folder


#: what the suite appends to the README's commands: a smaller federation and protocol (argparse keeps the last value)
SHRUNK = [
    "--clients",
    "4",
    "--rounds",
    "2",
    "--methods",
    "local,fedavg,fedrep",
    "--seeds",
    "0,1",
    "--lrs",
    "0.05",
    "--epochs",
    "1",
    "--no-own-keys",
    "--no-extend",
    "--jobs",
    "1",
]


def as_run_here(text: str, data: Path, raw: Path, page: Path) -> list[str]:
    """A README command's arguments with the test's local copy for ``--data-dir``, its folders, and :data:`SHRUNK`."""
    tokens = shlex.split(text)
    assert tokens[:3] == ["python", "-m", "benchmarks.own_data"], text
    args = tokens[3:]
    args[args.index("--data-dir") + 1] = str(data)
    return [*args, *SHRUNK, "--raw-dir", str(raw), "--page", str(page)]


@pytest.mark.slow
def test_the_readmes_commands_run_shrunk_on_a_local_copy_and_write_the_users_page_from_its_records(tmp_path, capsys):
    from tests.readme import readme_commands

    dry, full = (c.text for c in readme_commands() if c.text.startswith("python -m benchmarks.own_data "))
    data, raw, page = usps_copy(tmp_path / "usps"), tmp_path / "raw", tmp_path / "page" / "choosing.md"
    # the dry run: the timing runs, the estimate and how to shrink it; no run of the protocol, no page
    own_data.main(as_run_here(dry, data, raw, page))
    out = capsys.readouterr().out
    assert "estimate: about" in out and "to shrink it:" in out and not page.exists()
    assert {r["cell"]["arm"] for r in load_records(protocol.TIMING, raw)} == {"fedavg", "every-client"}  # 50 %
    assert not (raw / "grids-own-select").exists()

    command = as_run_here(full, data, raw, page)
    own_data.main(command)
    out = capsys.readouterr().out
    # the estimate and how to shrink it come before the first run of the protocol, then progress and the choices
    assert out.index("estimate: about") < out.index("to shrink it:") < out.index("grids-own-select")
    assert "selection: 6 runs" in out and "then 6 runs at the chosen settings (2 seeds): 12 runs" in out
    assert "progress 12/12 runs" in out and "chosen on validation: fedrep lr=0.05 local-epochs=1" in out
    select, grid = load_records("grids-own-select", raw), load_records("grids-own", raw)
    assert len(select) == 6 and len(grid) == 6 and not any(r["error"] for r in select + grid)
    assert all(r["run-config"]["data-dir"] == str(data.resolve()) for r in grid)
    assert {r["run-config"]["fraction-train"] for r in grid} == {0.5} and {r["engine"] for r in grid} == {"in-process"}

    fam = own_data.own_family(own_data.arguments().parse_args(command), {})
    text = page.read_text()
    assert text == choosing.build_own_page(raw, page, fam)  # the page is the records', by the same generator
    assert "(./grids-own-margins.png)" in text and (page.parent / "grids-own-margins.png").exists()
    means = {m: np.mean([PERSONAL(r) for r in grid if r["cell"]["method"] == m]) for m in ("local", "fedavg", "fedrep")}
    winners = next(line for line in text.splitlines() if line.startswith("| all samples, dirichlet-0.3 (middle"))
    assert winners.split(" | ")[1].startswith(f"{means['local']:.3f}")
    assert winners.split(" | ")[2].startswith(f"{means['fedavg']:.3f}")
    answer = text.split("## The answer\n\n")[1].split("\n")[0]
    better = max(("local", "fedavg"), key=means.__getitem__)
    assert answer.startswith("Above both Local and FedAvg here: **`fedrep`**") or (
        f"the better of Local and FedAvg, which is `{better}` ({means[better]:.3f}" in answer
    )
    assert "### Fairness: the spread over clients" in text and "### What each method costs here" in text

    # records of this federation never stand in for another's: the same folder refuses other data or clients
    with pytest.raises(
        SystemExit, match=r"holds runs of another federation \(alpha=0.3, now 0.5\).*--name or --raw-dir"
    ):
        own_data.main([*command, "--alpha", "0.5"])
    # running it again resumes: nothing left to run; a record gone is run again, and the page follows the records
    own_data.main(command)
    assert "12 runs, 0 not recorded yet" in capsys.readouterr().out
    gone = next((raw / "grids-own").glob("*fedrep*1.json"))
    kept = json.loads(gone.read_text())
    gone.unlink()
    assert "Every planned run has its result." not in choosing.build_own_page(raw, page, fam)
    own_data.main(command)
    again = capsys.readouterr().out
    assert "12 runs, 1 not recorded yet" in again and "progress 1/1 runs" in again
    assert setting_label({"lr": 0.05, "local-epochs": 1}) == kept["cell"]["setting"]
    assert "Every planned run has its result." in page.read_text()


def test_a_users_page_without_records_names_the_users_own_command(tmp_path):
    """A federation whose runs all failed (or have not run) says how to run it: the user's own_data command, not
    the grids script's, which knows nothing of the user's federation."""
    own = dataclasses.replace(family(), command="python -m benchmarks.own_data --dataset usps --clients 4")
    page = choosing.build_own_page(tmp_path, tmp_path / "page.md", own)
    assert "`python -m benchmarks.own_data --dataset usps --clients 4`" in page
    assert "benchmarks.grids" not in page
