"""The flwr internals the engine relies on are where server_app/flwr_internals.py says they are, and the check says
what moved when one of them does (so a flwr upgrade fails here, loudly, not in a run)."""

from __future__ import annotations

import pytest

from server_app import flwr_internals as fi


def test_every_internal_the_engine_uses_is_where_it_was():
    problems = fi.check()
    assert not problems, "a flwr upgrade moved what the engine uses:\n" + "\n".join(problems)


def test_a_moved_internal_is_named(monkeypatch):
    def run_api(app_fn, backend_fn, nodes_mapping, state_factory, f_stop):  # lost two parameters
        raise AssertionError("never called")

    monkeypatch.setitem(fi._SIGNATURES, "vce_api.run_api", (run_api, fi._SIGNATURES["vce_api.run_api"][1]))
    monkeypatch.setitem(fi._ATTRIBUTES, "Backend", (fi.Backend, ("build", "submit_job")))
    problems = fi.check()
    assert any(p.startswith("vce_api.run_api no longer takes node_info_stores, metrics") for p in problems)
    assert "Backend has no submit_job" in problems


def test_another_flwr_version_is_named(monkeypatch):
    monkeypatch.setattr(fi, "PINNED_FLWR", "0.0.0")
    assert any("was written against 0.0.0" in p for p in fi.check())


def test_only_the_internals_module_imports_flwr_internals():
    """Nothing else in the app reaches into Flower's private runtime: the engine goes through this one module."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    private = re.compile(
        r"^\s*(from|import)\s+flwr\.(server\.superlink|superlink|simulation\.run_simulation|supercore\.(run|"
        r"task_identity|object_ref|object_store|constant)|server\.superlink\.fleet|proto)",
        re.MULTILINE,
    )
    offenders = [
        str(path.relative_to(root))
        for folder in ("task", "strategies", "client_app", "server_app", "benchmarks")
        for path in (root / folder).rglob("*.py")
        if path.name != "flwr_internals.py" and private.search(path.read_text())
    ]
    assert not offenders, f"flwr internals imported outside server_app/flwr_internals.py: {offenders}"


@pytest.mark.parametrize("name", ["run_api", "register_nodes", "register_node_contexts", "run_serverapp_th"])
def test_the_runtime_parts_are_exported(name):
    assert callable(getattr(fi, name))
