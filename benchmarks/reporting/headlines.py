"""Each paper's own headline claim, tested once more in the closest setting pflower built.

The grids judge every method on the same terms.  A paper's method is also tested against its paper's own
qualitative claim, in the benchmark built for that method (noisy digits for FedCAC, planted clusters for pFedLIA,
two-source data for PI-FL, ...).  A claim *holds* in a setting when the method is above every baseline the claim names
with a 95 % interval above zero (``intervals.py``: paired by seed and client, same data); it holds *in part* when it
does so in some of the claim's settings only.  Every verdict also names every other run of the same records that is
above the method (a baseline the claim does not name, an ablation, an oracle), and the replies the server rejected in
any of the runs compared.  Everything is read from the records of those benchmarks; nothing is typed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.records import PERSONAL, Rec, axis, load_records, mean, ok, seeds_of, select

from .client2vec import c2v_best
from .intervals import Interval, bootstrap, paired_interval
from .pfedlia import ari
from .text import NAMES, md_table, plural, value_range

#: the smallest adjusted Rand index that counts as recovering the planted clusters (pFedLIA spec's acceptance bar)
ARI_BAR = 0.9


@dataclass(frozen=True)
class Check:
    """One setting of a claim: what the records show there, and whether the claim holds there."""

    setting: str
    text: str
    held: bool | None  # None: not measured (no records, or the runs do not pair)
    beaten_by: tuple[str, ...] = field(default=())


def compare(arm: list[Rec], ref: list[Rec], column: str = "personal-acc") -> Interval:
    """``arm - ref`` on the per-client ``column``, paired by seed and client, with its 95 % interval."""
    return paired_interval(arm, ref, column)


def seed_compare(arm: list[Rec], ref: list[Rec], metric: Callable[[Rec], Any]) -> Interval:
    """``arm - ref`` of a per-run metric (no per-client values, e.g. a best round): paired by seed only, the
    interval a bootstrap over seeds."""
    by_seed = {r["cell"]["seed"]: metric(r) for r in ok(ref)}
    pairs = [(r["cell"]["seed"], metric(r), by_seed.get(r["cell"]["seed"])) for r in ok(arm)]
    diffs = [(s, a - b) for s, a, b in pairs if a is not None and b is not None]
    if not diffs:
        return Interval(reason="no seed run by both")
    point, lo, hi = bootstrap([[d] for _, d in diffs])
    return Interval(point, lo, hi, [s for s, _ in diffs], len(diffs))


def failed_replies(named: list[tuple[str, list[Rec]]]) -> str:
    """ "FedAvg: 4 rejected replies (seeds 1, 2)" for each run set whose server rejected replies ("" without any)."""
    out = []
    for name, recs in named:
        hit = [(r["cell"]["seed"], int((r.get("failures") or {}).get("count") or 0)) for r in recs]
        hit = sorted((s, n) for s, n in hit if n)
        if hit:
            total = sum(n for _, n in hit)
            seeds = ", ".join(str(s) for s, _ in hit)
            replies = "reply" if total == 1 else "replies"
            out.append(f"{name}: {total} rejected {replies} (seed{'s' if len(hit) > 1 else ''} {seeds})")
    return "; ".join(out)


def against(
    name: str,
    arm: list[Rec],
    refs: list[tuple[str, list[Rec]]],
    others: list[tuple[str, list[Rec]]] | None = None,
    compare_with: Callable[[list[Rec], list[Rec]], Interval] = compare,
    metric: Callable[[Rec], Any] = PERSONAL,
) -> tuple[str, bool | None, tuple[str, ...]]:
    """``name`` against each named reference (``refs``) and every other run set of the same records (``others``):
    the text, whether it is above every named reference with an interval above zero (None when some comparison
    cannot be made), and the run sets above it (named or not)."""
    if not ok(arm):
        return f"{name}: no run", None, ()
    above: list[str] = []
    level: list[str] = []
    below: list[str] = []
    unknown: list[str] = []
    beaten: list[str] = []
    others = others or []
    for ref_name, ref in [*refs, *others]:
        iv = compare_with(arm, ref)
        named = any(ref_name == n for n, _ in refs)
        if not iv.ok:
            if named:
                unknown.append(f"{ref_name} ({iv.reason})")
            continue
        b = mean(ref, metric)
        entry = f"{ref_name} ({b:.3f}; {iv.text()} points)" if b is not None else f"{ref_name} ({iv.text()} points)"
        if iv.point < 0:
            sure = "its interval excludes zero" if iv.below else "within the interval"
            beaten.append(f"{ref_name} ({-iv.point * 100:+.1f} points, {sure})")
        if named:
            (above if iv.above else below if iv.below else level).append(entry)
    acc = mean(arm, metric)
    seeds = plural(len(seeds_of(ok(arm))), "seed")
    parts = [f"{name} ({acc:.3f}, {seeds})"]
    if above:
        parts.append("is above " + ", ".join(above))
    if level:
        parts.append("cannot be told apart from " + ", ".join(level))
    if below:
        parts.append("is below " + ", ".join(below))
    if unknown:
        parts.append("cannot be compared with " + ", ".join(unknown))
    text = parts[0] + " " + "; ".join(parts[1:])
    if beaten:
        text += ". Above it: " + ", ".join(beaten)
    failures = failed_replies([(name, arm), *refs, *others])
    text += f". Rejected replies: {failures}" if failures else ""
    held = None if unknown else not (level or below)
    return text, held, tuple(beaten)


def _name(method: str) -> str:
    return NAMES.get(method, method)


def _setting(
    recs: list[Rec], key: str, method: str, name: str, baselines: list[tuple[str, str]], **kw: Any
) -> tuple[str, bool | None, tuple[str, ...]]:
    """``method`` (runs whose ``key`` is ``method``) against the named baselines and every other run set of ``recs``."""
    named = [(n, select(recs, **{key: m})) for m, n in baselines if select(recs, **{key: m})]
    taken = {method, *(m for m, _ in baselines)}
    others = [(_name(m), select(recs, **{key: m})) for m in axis(recs, key) if m not in taken]
    return against(name, select(recs, **{key: method}), named, others, **kw)


def _by_partition(raw: Path, method: str, name: str, order: list[str]) -> list[Check]:
    """``method`` against its claim's baselines in each partition of its benchmark (grid ``method``)."""
    recs = load_records(method, raw)
    checks = []
    for part in axis(recs, "partition", order):
        text, held, beaten = _setting(select(recs, partition=part), "method", method, name, BASELINES[method])
        checks.append(Check(part, text, held, beaten))
    return checks


def _fedcac(raw: Path) -> list[Check]:
    return _by_partition(raw, "fedcac", "FedCAC", ["pathological", "dirichlet-0.5", "dirichlet-1.0"])


def _pfedlia(raw: Path) -> list[Check]:
    recs = load_records("pfedlia", raw)
    checks = []
    for part in axis(recs, "partition", ["pathological", "noisy"]):
        for parti in axis(select(recs, partition=part), "participation", ["full", "10%"]):
            sel = select(recs, partition=part, participation=parti)
            text, held, beaten = _setting(sel, "method", "pfedlia-central", "pFedLIA (OPTICS)", BASELINES["pfedlia"])
            arm = select(sel, method="pfedlia-central")
            aris = [v for v, _ in (ari(r) for r in ok(arm)) if v is not None]
            if aris:
                found = sum(v >= ARI_BAR for v in aris)
                text += f". ARI {min(aris):.2f}-{max(aris):.2f}, at least {ARI_BAR} in {found} of {len(aris)} seeds"
                held = held if held is None else held and found == len(aris)
            checks.append(Check(f"{part}, {parti} participation", text, held, beaten))
    return checks


def _pifl(raw: Path) -> list[Check]:
    return _by_partition(raw, "pifl", "PI-FL", ["synth-10:90", "digits-10:90"])


def _client2vec(raw: Path) -> list[Check]:
    """The global model at the last round (per client, paired) is what the verdict rests on; the best round (the
    maximum over every round's score, which favours the arm whose accuracy jumps most) is shown beside it."""
    recs = load_records("client2vec", raw)
    checks = []
    method = "+i+ii+iii"
    for setting in axis(recs, "setting", ["4dom-a0.1"]):
        sel = select(recs, setting=setting)
        name = "All three case studies (+i+ii+iii)"
        last, held, beaten = _setting(
            sel,
            "arm",
            method,
            name + ", last round",
            BASELINES["client2vec"],
            compare_with=lambda a, b: compare(a, b, "global-acc"),
            metric=lambda r: r["summary"].get("global-acc"),
        )
        best, _, _ = _setting(
            sel,
            "arm",
            method,
            name + ", best round",
            BASELINES["client2vec"],
            compare_with=lambda a, b: seed_compare(a, b, c2v_best),
            metric=c2v_best,
        )
        text = f"{last} — beside it, the best round (seeds only): {best}"
        checks.append(Check(f"{setting} (accuracy of the global model)", text, held, beaten))
    return checks


def _fedc2i(raw: Path) -> list[Check]:
    recs = load_records("fedc2i", raw)
    if not recs:
        return []
    text, held, beaten = _setting(recs, "method", "fedc2i", "FedC2I", BASELINES["fedc2i"])
    return [Check("5 domains, one client each", text, held, beaten)]


@dataclass(frozen=True)
class Claim:
    method: str  # the ``method`` value (a key of choosing.PAPERS)
    name: str
    claim: str  # the paper's claim, in words
    setting: str  # the closest setting pflower built, in words
    section: str  # the heading of its table in benchmarks/RESULTS.md
    checks: Callable[[Path], list[Check]]


#: per paper method: (method or arm value, name) of the baselines its claim names, in its benchmark's records
BASELINES: dict[str, list[tuple[str, str]]] = {
    "fedcac": [
        ("local", "Local"),
        ("fedavg", "FedAvg"),
        ("fedper", "FedPer"),
        ("fedrep", "FedRep"),
        ("ditto", "Ditto"),
    ],
    "pfedlia": [("fedavg", "FedAvg"), ("cfl-tuned", "CFL (tuned thresholds)")],
    "pifl": [("fedavg", "FedAvg"), ("pifl-ni", "PI-FL with random bids (NI)")],
    "client2vec": [("FedAvg", "FedAvg")],
    "fedc2i": [("local", "Local"), ("fedavg", "FedAvg")],
}

CLAIMS = [
    Claim(
        "fedc2i",
        "FedC2I",
        "with a visual domain per client, FedC2I's influence-weighted mixing beats both FedAvg and Local",
        "feature-shift digits, each client with its own domain, the paper's optimizer and learning rate",
        "FedC2I on feature-shift digits",
        _fedc2i,
    ),
    Claim(
        "pfedlia",
        "pFedLIA",
        "with clients in hidden groups, pFedLIA recovers the groups (without being told how many) and then beats "
        "FedAvg and clustered FL (CFL)",
        "planted clusters of digits (groups of clients sharing two labels), with and without noisy clients",
        "pFedLIA on planted clusters",
        _pfedlia,
    ),
    Claim(
        "fedcac",
        "FedCAC",
        "under label skew FedCAC beats Local, FedAvg and the personalized baselines FedPer, FedRep and Ditto",
        "digits with Gaussian pixel noise (so that the partitions separate the methods)",
        "FedCAC on noisy digits",
        _fedcac,
    ),
    Claim(
        "pifl",
        "PI-FL",
        "when clients mix data of two sources, PI-FL's bidding forms tiers that specialise, and its personalized "
        "models beat FedAvg and the same protocol with random bids",
        "two-source data (synthetic concept shift, and the lower digits against the upper), mixed 10:90",
        "PI-FL on two-source data",
        _pifl,
    ),
    Claim(
        "client2vec",
        "Client2Vec",
        "on feature-shift x label-skew data, the client index used for sampling, aggregation and the local loss "
        "together beats FedAvg",
        "digits in feature-shift domains crossed with Dirichlet label skew, a cohort of the clients per round",
        "Client2Vec case studies on feature-shift x label-skew digits",
        _client2vec,
    ),
]


def anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading (lowercase, punctuation dropped, spaces as hyphens)."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def verdict(checks: list[Check]) -> str:
    """``holds`` / ``holds in part`` / ``does not hold`` over a claim's settings (``not measured`` without any)."""
    known = [c.held for c in checks if c.held is not None]
    if not known:
        return "not measured"
    if all(known):
        return "holds" + ("" if len(known) == len(checks) else f" where measured ({len(known)} of {len(checks)})")
    return "does not hold" if not any(known) else f"holds in {sum(known)} of {plural(len(checks), 'setting')}"


def shape(recs: list[Rec]) -> str:
    """Clients, rounds and the share of clients per round of a benchmark's runs, from its records."""
    if not recs:
        return "no records"
    configs = [r["run-config"] for r in recs if r.get("run-config")]
    clients = value_range(sorted({r.get("num-supernodes") for r in recs}))
    rounds = value_range(sorted({c.get("num-server-rounds") for c in configs}))
    cohort = value_range(sorted({f"{c.get('fraction-train', 1.0):.0%}" for c in configs}))
    return f"in the records: {clients} clients, {rounds} rounds, {cohort} of the clients per round"


def render_claims(raw: Path, results: str = "../benchmarks/RESULTS.md") -> tuple[str, dict[str, str]]:
    """The section of the choosing page (a table, one row per setting) and each method's verdict in words."""
    rows, verdicts, seeds = [], {}, set()
    for c in CLAIMS:
        checks = c.checks(Path(raw))
        seeds |= {len(seeds_of(load_records(c.method, Path(raw))))}
        verdicts[c.method] = verdict(checks)
        where = f"[{c.setting}]({results}#{anchor(c.section)}) ({shape(load_records(c.method, Path(raw)))})"
        if not checks:
            rows.append([f"**{c.name}**", c.claim, where, "no records", "not measured"])
        for i, ch in enumerate(checks):
            held = "not measured" if ch.held is None else "holds" if ch.held else "does not hold"
            if ch.beaten_by:
                held += f"; {plural(len(ch.beaten_by), 'run set')} above it"
            first = i == 0
            rows.append(
                [
                    f"**{c.name}**" if first else "",
                    c.claim if first else "",
                    where if first else "",
                    f"{ch.setting}: {ch.text}",
                    held,
                ]
            )
    seeds.discard(0)
    n_seeds = f", {' or '.join(map(str, sorted(seeds)))} seeds" if seeds else ""
    intro = (
        "Each of the five papers' methods is tested once more against its paper's own claim, in the benchmark built "
        "for it: the setting closest to the paper's that runs here, every method at the same shared settings, "
        f"untuned{n_seeds}. A claim holds in a setting when the method "
        "is above every baseline the claim names with a 95 % interval above zero (paired by seed and client); every "
        'other run of the same records that is above the method is named too ("Above it"), and so are replies the '
        "server rejected. Client2Vec's benchmark scores the global model: its verdict rests on the last round, with "
        "the best round (the maximum over noisy rounds, which favours the noisier arm) beside it."
    )
    table = md_table(["method", "the paper's claim", "our closest setting", "what our runs show", "claim"], rows)
    return f"{intro}\n\n{table}", verdicts
