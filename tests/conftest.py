import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

torch.set_num_threads(1)

# no test here is timed (speed targets live in the benchmark scripts): Hypothesis' per-example deadline would
# only turn a loaded machine (two test workers, a benchmark beside them) into a flaky failure
settings.register_profile("pflower", deadline=None)
settings.load_profile("pflower")

if ROOT.name == "mutants":
    # mutation testing (docs/mutation/README.md) runs these tests from mutants/: one failing example kills a mutant, so
    # skip Hypothesis' shrinking (minutes per killed mutant, which mutmut then reports as a timeout)
    from hypothesis import Phase

    settings.register_profile("mutmut", phases=[Phase.explicit, Phase.generate], database=None, deadline=None)
    settings.load_profile("mutmut")


@pytest.fixture(scope="session")
def simulation():
    """A private SuperLink in simulation mode for end-to-end runs, stopped by pid at the end.  Its runs get
    Flower's default client resources (two CPUs per client), as a bare ``flwr run .`` does: on two cores one Ray
    worker runs the clients one at a time, which starts in about three quarters of the time two workers take.  A
    run's results do not depend on it; the README's command and the benchmarks ask for one CPU per client
    (tests/project/test_readme_examples.py runs those commands)."""
    from server_app.runner import LocalSimulation

    with LocalSimulation(num_cpus=None) as sim:
        yield sim


@pytest.fixture
def temporary_files(monkeypatch):
    """Every file ``tempfile.mkstemp`` creates during the test, as paths (an atomic write's temporary files)."""
    import tempfile
    from pathlib import Path

    made: list[Path] = []
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        made.append(Path(name))
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return made


@pytest.fixture(scope="session")
def engine():
    """Flower's simulation runtime in this test process (server_app/engine.py): the runtime of the method-level
    end-to-end tests, held to ``flwr run`` by tests/engine/test_equality.py.  ``engine.run(run_config,
    num_supernodes)`` returns the run's summary.json plus ``log``, as ``simulation.run`` does."""
    from server_app.engine import Engine

    with Engine() as runtime:
        yield runtime
