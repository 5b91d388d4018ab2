"""The scripted federations most pFedLIA server tests start from: a central run and a peer-to-peer run
(tests/pfedlia/server_kit.py)."""

import pytest

from tests.pfedlia.server_kit import Federation, p2p_beneficial


@pytest.fixture  # per test, not per module: mutmut maps the code a fixture runs to the test that first uses it
def central():
    return Federation().run()


@pytest.fixture  # per test (see central)
def p2p():
    return Federation(**{"lia-mode": "p2p"}, beneficial=p2p_beneficial).run()
