"""Runs that survive a crash, and the models a run leaves behind, end to end through Flower (``flwr run`` for one
method, Flower's runtime on the engine for the others: ``THROUGH_FLWR_RUN``).

Every method, with the default model: a run stopped after round k (``stop-after=k``: the ServerApp stops right
after that round's checkpoint, as a crash would), resumed with ``resume-from``, killed (SIGKILL of its ServerApp
process) and resumed again ends exactly where the same run without the interruptions ends: the same per-round
metrics and per-client results.  Flower gives the resumed run new node ids; the
strategy's state is keyed by partition id and each client's state is on disk.  Then each client's saved
personalized model is loaded from its files and scored on that client's test data in the deployed-node
format, giving the accuracy the run reported for that client.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from server_app.engine import Engine
from server_app.job import Exit, outcome
from server_app.runner import RunFailed, results_folder_from_output, stopped_after
from task.config import parse_settings
from task.data import load_client_data
from task.export import load_model, predict_file
from task.methods import METHODS
from task.methods.pifl import PIFLOptions
from tests.event_files import check_event_files_match_rounds_json, runs

pytestmark = pytest.mark.slow

CLIENTS = 3
ROUNDS, STOP_AFTER, KILL_AFTER = 4, 1, 2
#: the defaults a user gets, sized down: rounds, nodes and seed only (the default model and optimiser stay)
SMALL = {"num-server-rounds": ROUNDS, "min-nodes": CLIENTS, "seed": 3}
#: what a method needs beyond SMALL to reach its defining phases within ROUNDS rounds
NEEDS: dict[str, dict[str, Any]] = {
    "pfedlia": {"warmup-rounds": 1},  # the default warm-up (5) is longer than the run; clustering in round 2
    "oracle": {"warmup-rounds": 1, "partition": "planted-clusters", "num-clusters": 2},  # needs planted groups
    "cfl": {"cfl-min-rounds": 2},  # may split within the run (from round 2)
}
#: in the default test run (each method costs four Flower runs, four to five minutes on a loaded machine, and these
#: tests were the largest part of the suite's time): one method per kind of state that must survive, a whole model
#: with BatchNorm buffers kept on the client (FedCAC; the defect this pins, which LG-FedAvg's body and Ditto's model
#: shared), clusters (pFedLIA), tiers and a token ledger (PI-FL); the others, FedAvg, Ditto, LG-FedAvg and FedBN
#: included, run with ``python -m pytest -m extended`` (in the default run, tests/resume/test_by_method.py resumes
#: every method's strategy in-process and test_client_state_files.py checks what clients keep)
DEFAULT_RUN = {"fedcac", "pfedlia", "pifl"}
#: resumed through ``flwr run`` (a SuperLink, the ServerApp in Flower's ``flwr-simulation`` process, which is killed);
#: the others run on the engine (tests/engine/test_equality.py holds it to ``flwr run``, a stopped and resumed run
#: included), the ServerApp's process killed being a ``python -m server_app.sweep`` running the resumed run
THROUGH_FLWR_RUN = {"fedcac"}
#: the method whose finished reference run also serves as the folder a resume of another method must refuse
REFUSAL_CHECK = ("fedcac", "fedavg")


def method_param(method: str):
    return pytest.param(method, marks=() if method in DEFAULT_RUN else pytest.mark.extended, id=method)


def rounds(folder: Path) -> list[dict]:
    return [
        {
            "round": r["round"],
            "train": {k: v for k, v in r["train"].items() if "time" not in k and "rss" not in k},
            "evaluate": r["evaluate"],
        }
        for r in json.loads((folder / "rounds.json").read_text())
    ]


def clients(folder: Path) -> list[dict]:
    with (folder / "clients.csv").open() as fh:
        return [{k: v for k, v in row.items() if "time" not in k and "rss" not in k} for row in csv.DictReader(fh)]


def without_measured(tree):
    """Without what two equal runs cannot share: seconds, and byte counts (each message's config names the run's
    results folder, whose name ends in Flower's run id, whose number of digits varies between runs)."""
    if isinstance(tree, dict):
        return {
            k: without_measured(v) for k, v in tree.items() if not any(w in k for w in ("bytes", "seconds", "time"))
        }
    if isinstance(tree, list):
        return [without_measured(v) for v in tree]
    return tree


def stop(runtime, cfg: dict, stop_after: int) -> Path:
    """Run ``cfg`` with ``stop-after``; the folder of the stopped run (its checkpoint is round ``stop_after``)."""
    with pytest.raises(RunFailed) as crash:
        runtime.run({**cfg, "stop-after": stop_after}, num_supernodes=CLIENTS)
    folder = results_folder_from_output(crash.value.output) or _folder_of_crashed(crash.value.output)
    assert (folder / "checkpoints" / "LATEST").read_text() == f"round-{stop_after:05d}"
    # the ServerApp's stop line names the round and the folder; `python -m server_app.job` exits 4 on it
    assert stopped_after(crash.value.output) == (stop_after, folder)
    assert outcome(0, crash.value.output)[0] == Exit.STOPPED
    return folder


def server_app_processes(simulation) -> list[int]:
    """Process ids of the ServerApp processes (``flwr-simulation``) of ``simulation``'s SuperLink."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if any(a.endswith(b"flwr-simulation") for a in argv[:2]) and f"127.0.0.1:{simulation.port}".encode() in argv:
            found.append(int(proc.name))
    return found


def resume_and_kill(runtime, cfg: dict, folder: Path, kill_after: int) -> tuple[int, Callable[[], None]]:
    """Resume ``folder`` and SIGKILL the ServerApp's process as soon as round ``kill_after``'s checkpoint is
    written, as a crash of the machine would; (the last complete round the checkpoint then names, a function that
    waits for the killed run to end).  Through ``flwr run`` the process is the SuperLink's ``flwr-simulation``, and
    that ``flwr run`` ends only when the SuperLink gives up on the dead ServerApp (its heartbeat, about 30 s here);
    the next run need not wait for it.  On the engine it is a ``python -m server_app.sweep`` process running the
    resumed run."""
    latest, outcome = folder / "checkpoints" / "LATEST", {}
    if isinstance(runtime, Engine):
        return _resume_on_the_engine_and_kill(cfg, folder, kill_after, runtime.home)

    def resume() -> None:
        try:
            outcome["summary"] = runtime.run({**cfg, "resume-from": str(folder)}, num_supernodes=CLIENTS)
        except RunFailed as err:
            outcome["failed"] = err

    runner = threading.Thread(target=resume)
    runner.start()
    deadline = time.monotonic() + 900
    while latest.read_text() < f"round-{kill_after:05d}" and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    killed = server_app_processes(runtime)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    assert killed, "the resumed run ended before it could be killed"
    done = int(latest.read_text().removeprefix("round-"))
    assert KILL_AFTER <= done < ROUNDS

    def ended() -> None:
        runner.join(600)
        assert not runner.is_alive() and "summary" not in outcome, "the killed run went on to the end"

    return done, ended


def _resume_on_the_engine_and_kill(
    cfg: dict, folder: Path, kill_after: int, home: Path
) -> tuple[int, Callable[[], None]]:
    from server_app.engine import APP_DIR, run_config_text

    latest = folder / "checkpoints" / "LATEST"
    process = subprocess.Popen(
        [sys.executable, "-m", "server_app.sweep", str(APP_DIR), "--run-config",
         run_config_text({**cfg, "resume-from": str(folder)}), "--federation-config", f"num-supernodes={CLIENTS}",
         "--out", str(home / "killed-sweep")],
        cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(APP_DIR)},
    )  # fmt: skip
    deadline = time.monotonic() + 900
    while latest.read_text() < f"round-{kill_after:05d}" and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the resumed run ended before it could be killed"
    process.kill()
    process.wait(60)
    done = int(latest.read_text().removeprefix("round-"))
    assert KILL_AFTER <= done < ROUNDS
    return done, lambda: None


def _folder_of_crashed(output: str) -> Path:
    import re

    found = re.findall(r"resume-from='([^']+)'", output)
    assert found, output[-3000:]
    return Path(found[-1])


@pytest.mark.parametrize("method", [method_param(m) for m in METHODS])
def test_a_run_stopped_then_killed_and_resumed_ends_like_the_uninterrupted_one(request, method):
    """The run config a user gets for ``method`` (default model with BatchNorm, SGD with momentum), sized down
    (``SMALL``) and with only what the method needs to run in ``SMALL``'s rounds (``NEEDS``): stopped by
    ``stop-after`` after round 1, resumed and killed (SIGKILL of the ServerApp's process) after round 2's
    checkpoint, resumed again; it ends with the same per-round metrics, per-client results and saved models as
    the run without interruptions."""
    simulation = request.getfixturevalue("simulation" if method in THROUGH_FLWR_RUN else "engine")
    cfg = {**SMALL, "method": method, **NEEDS.get(method, {})}
    reference = simulation.run(cfg, num_supernodes=CLIENTS)
    folder = stop(simulation, cfg, STOP_AFTER)
    killed_after, killed_run_ended = resume_and_kill(simulation, cfg, folder, KILL_AFTER)
    resumed = simulation.run({**cfg, "resume-from": str(folder)}, num_supernodes=CLIENTS)
    killed_run_ended()
    assert Path(resumed["results"]) == folder  # the resumed run writes into the same folder
    log = resumed["log"]
    ref_folder = Path(reference["results"])
    for key in ("personal-acc", "global-acc", "trained-acc", "personal-loss", "clients", "failures", "rounds"):
        assert resumed[key] == reference[key], key
    assert rounds(folder) == rounds(ref_folder)
    assert clients(folder) == clients(ref_folder)
    # TensorBoard shows the resumed run's rounds once each (the three processes' event files read together), as
    # rounds.json has them, and the two runs apart
    check_event_files_match_rounds_json(folder)
    assert {folder.name, ref_folder.name} <= runs(folder.parent)
    resumes = json.loads((folder / "resumes.json").read_text())
    assert [r["after-round"] for r in resumes] == [STOP_AFTER, killed_after]
    if method == "pfedlia":  # the clustering of round 2 is restored, not recomputed by the last resumption
        assert "clustering round" not in log
        assert without_measured(json.loads((folder / "pfedlia_clusters.json").read_text())) == without_measured(
            json.loads((ref_folder / "pfedlia_clusters.json").read_text())
        )
    if method == "pifl":  # tokens are conserved across the resume, round by round as without it
        ledger = json.loads((folder / "pifl_ledger.json").read_text())
        options = parse_settings(cfg).options
        assert isinstance(options, PIFLOptions)
        supply = CLIENTS * options.initial_tokens * ledger["micro-tokens-per-token"]
        assert all(e["total"] == supply for e in ledger["rounds"])
        assert ledger == json.loads((ref_folder / "pifl_ledger.json").read_text())
    # every client's personalized model, from its files, scores on its own test data what the run reported
    settings = parse_settings(cfg)
    reported = {int(row["client"]): float(row["personal-acc"]) for row in clients(folder)}
    for client in range(CLIENTS):
        model_file = folder / "models" / "clients" / f"client-{client}.safetensors"
        _, manifest = load_model(model_file)
        assert manifest["method"] == method and manifest["round"] == ROUNDS
        assert manifest["personal-acc"] == pytest.approx(reported[client])
        data = load_client_data(settings.data, client, CLIENTS)
        np.savez(folder / f"test-{client}.npz", x=data.x_test.numpy(), y=data.y_test.numpy())
        assert predict_file(model_file, folder / f"test-{client}.npz")["accuracy"] == pytest.approx(reported[client])
    server_models = sorted(p.name for p in (folder / "models" / "server").glob("*.safetensors"))
    assert server_models == sorted(p.name for p in (ref_folder / "models" / "server").glob("*.safetensors"))
    for name in server_models:  # the server's models (global, clusters, tiers) are the uninterrupted run's (a
        # method that keeps BatchNorm local, e.g. FedCAC, saves a global model without BatchNorm statistics)
        resumed_arrays = load_file(str(folder / "models" / "server" / name))
        reference_arrays = load_file(str(ref_folder / "models" / "server" / name))
        assert sorted(resumed_arrays) == sorted(reference_arrays), name
        for k, v in reference_arrays.items():
            np.testing.assert_array_equal(resumed_arrays[k], v, err_msg=f"{name}: {k}")
    if method == REFUSAL_CHECK[0]:
        # a folder that does not fit is refused through Flower at once, and the finished run's folder is left as
        # it was (every kind of misfit: tests/resume/test_resume_point.py); the reference run serves as that folder
        before = sorted((p.name, p.stat().st_size) for p in ref_folder.rglob("*"))
        with pytest.raises(RunFailed) as err:
            simulation.run(
                {**cfg, "method": REFUSAL_CHECK[1], "resume-from": str(ref_folder)},
                num_supernodes=CLIENTS,
                timeout=300,
            )
        assert f"is a {method} run" in err.value.output.replace("\n", " ")
        assert sorted((p.name, p.stat().st_size) for p in ref_folder.rglob("*")) == before
