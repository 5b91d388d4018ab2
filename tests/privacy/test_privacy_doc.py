"""docs/privacy.md agrees with what the methods declare (their strategies' ``disclosure()``): its generated table is
the declarations' table, and its hand-written per-method table names every message type and record a method
declares, and says "nothing" exactly where a client receives nothing derived from other clients."""

import re
from pathlib import Path

import pytest

from server_app.disclosure import BEGIN, END, declarations, declared_table
from strategies.replies import BASE, EVALUATE, TRAIN
from task.methods import METHODS

DOC = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"
#: records of every message (the server's instructions, the model) and of every reply (its metrics, the model);
#: what ``arrays`` holds is in the generated table
EVERYWHERE = {"config", "metrics", "timing", "evaluation", "arrays"}
#: the metrics of every reply, listed once in the section "What every method sends"
COMMON = set(BASE.metrics) | set(TRAIN.metrics) | set(EVALUATE.metrics)
#: the rows that say "as <method>" name the method by its display name
DISPLAY = {"FedAvg": "fedavg", "FedPer": "fedper", "pFedLIA's warm-up and per-cluster rounds": "pfedlia"}


def _rows() -> dict[str, list[str]]:
    """method -> its cells in the "Per method" table (a row may hold several methods)."""
    text = DOC.read_text()
    section = text[text.index("## Per method") : text.index("### Declared per message type")]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for method in re.findall(r"`([^`]+)`", cells[0]):
                rows[method] = cells[1:]
    return rows


@pytest.fixture(scope="module")
def declared():
    return {m: declarations(m)[0] for m in METHODS}


def test_the_generated_table_is_the_declarations_table():
    text = DOC.read_text()
    assert BEGIN in text and END in text, "docs/privacy.md lost the markers of its generated table"
    inside = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert inside == declared_table(), "regenerate it: python -m server_app.disclosure --write docs/privacy.md"


def test_every_method_has_a_row():
    assert set(_rows()) == set(METHODS)


def test_every_method_declares_exactly_its_message_types(declared):
    for method, by_type in declared.items():
        queries = {f"query.{q}" for q in METHODS[method].queries}
        assert set(by_type) == {"train", "evaluate", "query.identify"} | queries, method


@pytest.mark.parametrize("method", list(METHODS))
def test_a_row_names_what_its_method_declares(declared, method):
    server, peers, *_ = _rows()[method]
    own = declared[method]
    referred = next((DISPLAY[name] for name in DISPLAY if server.startswith(f"as {name}")), None)
    if referred is not None:  # "as FedAvg": the same records go out and come in
        other = declared[referred]
        for kind in own.keys() & other.keys():
            assert own[kind].sends.keys() == other[kind].sends.keys(), (method, kind)
            assert own[kind].receives.keys() == other[kind].receives.keys(), (method, kind)
        return
    for kind, d in own.items():
        if kind.startswith("query.") and kind != "query.identify":
            assert f"`{kind}`" in server, f"{method}: the row does not name {kind}"
        for name in d.sends.keys() - EVERYWHERE:
            assert f"`{name}`" in server, f"{method}: the row does not name the record `{name}` ({kind})"
        for name in set(d.sends["metrics"].entries or {}) - COMMON:
            assert f"`{name}`" in server, f"{method}: the row does not name the metric `{name}` ({kind})"
        for name, part in d.receives.items():
            if part.from_peers and name not in EVERYWHERE:
                assert f"`{name}`" in peers, f"{method}: the row does not name the received record `{name}`"
    from_peers = any(p.from_peers for d in own.values() for p in d.receives.values())
    assert (peers == "nothing") == (not from_peers), f"{method}: receives {'something' if from_peers else 'nothing'}"


def test_every_message_type_says_what_its_reply_could_tell_and_the_table_shows_it(declared):
    """Each declared message type says in words what the client's reply could tell about its data (``reveals``), and
    the generated table shows it in its own column, on that message's row."""
    text = DOC.read_text()
    rows = {}
    for line in text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip().splitlines()[2:]:
        method, kind, _, tells, _ = (c.strip() for c in line.strip().strip("|").split("|"))
        rows[(method, kind.strip("`"))] = tells
    for method, by_type in declared.items():
        for kind, d in by_type.items():
            assert d.reveals, (method, kind)
            assert rows[(method, kind)] == d.reveals, (method, kind)


def test_what_a_train_reply_could_tell_follows_what_it_sends():
    """A method whose train reply sends model arrays says they tell how its data moved them; Local's reply sends
    metrics only, which tell how well its own model fits its data."""
    local, fedavg = declarations("local")[0]["train"], declarations("fedavg")[0]["train"]
    assert "arrays" not in local.sends and "fits its data" in local.reveals
    assert "arrays" in fedavg.sends and "moved" in fedavg.reveals


def test_the_accountants_examples_in_the_page_are_what_the_accountants_give():
    from task.privacy import calibrate_central, central_bound, local_bound

    text = " ".join(DOC.read_text().split())
    full, local = central_bound(1.0, 10, 1e-5), local_bound(1.0, 3, 1e-5)
    poisson, fixed = central_bound(1.0, 100, 1e-5, 0.1, "poisson"), central_bound(1.0, 100, 1e-5, 0.1, "fixed")
    assert f"RDP {full.rdp:.2f}, PLD {full.pld:.2f} (reported)" in text and full.accountant == "pld"
    assert f"RDP {local.rdp:.2f}, PLD {local.pld:.2f}" in text and local.accountant == "pld"
    assert f"PLD {poisson.pld:.2f} (reported), RDP {poisson.rdp:.2f}" in text and poisson.accountant == "pld"
    said = f"{fixed.epsilon:.2f} against the coalition (reported); without amplification, RDP {fixed.rdp:.2f} and PLD"
    assert said in text and fixed.accountant == "coalition"
    assert f"(sigma {calibrate_central(10.0, 1e-5, 100, 0.1, 'fixed'):.2f} for that target)" in text
    assert f"Poisson sampling needs sigma {calibrate_central(10.0, 1e-5, 100, 0.1, 'poisson'):.2f}" in text
    assert "No benchmark of accuracy against epsilon has been run yet" not in text


def test_with_held_out_clients_the_newcomer_message_says_what_its_reply_could_tell():
    """``holdout-clients`` adds ``query.newcomer``: its declaration, like every message type's, says in words what the
    reply could tell about the newcomer's data."""
    by_type, _ = declarations("fedavg", **{"holdout-clients": 1})
    assert by_type["query.newcomer"].reveals == (
        "how well the model the federation gives a newcomer fits its data, before and after fine-tuning on it"
    )
