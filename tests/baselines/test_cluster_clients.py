"""What the IFCA and FedSoft clients must do (pifl.md §5 baselines: Ghosh et al.; Ruan & Joe-Wong), with
cluster models fitted to known digits so the right choice is known in advance."""

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from client_app.fedsoft import SIGMA, importance_weights
from task.params import record_to_numpy, to_record
from task.train import evaluate
from tests.client_kit import client, client_data, context, digits_of, numpy_state, trained_state

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def centres():
    c = client("ifca", client_data(LOW))
    init = {k: v.detach().clone() for k, v in c.reset_model().state_dict().items()}
    low = trained_state(c.reset_model(), *digits_of(LOW, 30, 0))
    high = trained_state(c.reset_model(), *digits_of(HIGH, 30, 0))
    return init, low, high


def tiers(*states):
    return to_record({k: np.stack([numpy_state(s)[k] for s in states]) for k in states[0]})


def as_torch(rec):
    return {k: torch.from_numpy(v) for k, v in record_to_numpy(rec).items()}


def dist(a, b):
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a if a[k].is_floating_point())) ** 0.5


def scores(c, state, split="test"):
    model = c.reset_model()
    model.load_state_dict(state)
    return evaluate(model, getattr(c.data, f"x_{split}"), getattr(c.data, f"y_{split}"))


# ------------------------------------------------------------------------------------------ IFCA
def test_ifca_trains_the_cluster_model_that_fits_its_training_split_best(centres):
    init, low, high = centres
    c = client("ifca", client_data(HIGH, val_classes=LOW), tiers=3)
    reply = c.train(RecordDict({"tiers": tiers(init, low, high)}))
    assert reply["metrics"]["cluster"] == 2
    trained = as_torch(reply["arrays"])
    assert dist(trained, high) < dist(trained, low) and dist(trained, high) > 0
    assert reply["metrics"]["num-examples"] == len(c.data.y_train)


def test_ifca_evaluates_the_cluster_chosen_on_the_validation_split_or_else_the_training_split(centres):
    _init, low, high = centres
    disagree = client("ifca", client_data(HIGH, val_classes=LOW, test_classes=LOW), tiers=2)
    ev = disagree.evaluate(RecordDict({"tiers": tiers(high, low)}))["metrics"]
    assert ev["cluster"] == 1  # chosen on the validation split (0-4), not on the training split (5-9)
    loss, acc = scores(disagree, low)
    assert ev["personal-acc"] == pytest.approx(acc) and ev["personal-loss"] == pytest.approx(loss)
    data = client_data(HIGH, val_classes=LOW)
    data.x_val, data.y_val = data.x_val[:0], data.y_val[:0]
    no_val = client("ifca", data, tiers=2)
    assert no_val.evaluate(RecordDict({"tiers": tiers(high, low)}))["metrics"]["cluster"] == 0


# ------------------------------------------------------------------------------------------ FedSoft
def test_importance_weights_are_shares_of_best_fitted_points_floored_at_sigma():
    losses = np.array([[0.1, 0.9, 0.2, 0.5], [0.3, 0.1, 0.6, 0.4], [0.9, 0.9, 0.9, 0.9]])
    u = importance_weights(losses)  # points' best centres: 0, 1, 0, 1
    raw = np.array([0.5, 0.5, SIGMA])
    np.testing.assert_allclose(u, raw / raw.sum())
    assert u.sum() == pytest.approx(1.0) and u[2] > 0
    np.testing.assert_allclose(importance_weights(losses, sigma=0.3), np.array([0.5, 0.5, 0.3]) / 1.3)


def test_fedsoft_client_reports_the_share_of_its_points_each_centre_fits_best(centres):
    _init, low, high = centres
    x_lo, y_lo = digits_of(LOW, 24, 0)
    x_hi, y_hi = digits_of(HIGH, 8, 0)
    data = client_data(LOW)
    data.x_train, data.y_train = torch.cat([x_lo, x_hi]), torch.cat([y_lo, y_hi])
    c = client("fedsoft", data, tiers=2)
    u = np.array(c.query("fedsoft_u", RecordDict({"tiers": tiers(low, high)}))["metrics"]["fedsoft-u"])
    per_point = []
    for s in (low, high):
        model = c.reset_model()
        model.load_state_dict(s)
        with torch.no_grad():
            per_point.append(
                torch.nn.functional.cross_entropy(model(data.x_train), data.y_train, reduction="none").numpy()
            )
    best = np.argmin(np.stack(per_point), axis=0)
    share = np.maximum(np.bincount(best, minlength=2) / len(best), SIGMA)
    np.testing.assert_allclose(u, share / share.sum(), rtol=1e-6)
    assert u[0] > 0.6  # mostly 0-4 points: the low centre fits most of them
    with pytest.raises(ValueError, match="query"):
        c.query("no-such-query", RecordDict())


def soft_content(states, u=None):
    content = RecordDict({"tiers": tiers(*states)})
    cfg: dict[
        str, int | float | str | bytes | bool | list[int] | list[float] | list[str] | list[bytes] | list[bool]
    ] = {}
    if u is not None:
        cfg["u"] = list(u)
    if cfg:
        content["fedsoft"] = ConfigRecord(cfg)
    return content


def test_fedsoft_starts_from_the_u_weighted_mixture_of_the_centres(centres):
    _init, low, high = centres
    c = client("fedsoft", client_data(HIGH), tiers=2)
    ev = c.evaluate(soft_content([low, high], u=[1.0, 3.0]))["metrics"]  # weights normalised: 0.25 / 0.75
    mixed = {k: 0.25 * low[k] + 0.75 * high[k] if low[k].is_floating_point() else high[k] for k in low}
    loss, acc = scores(c, mixed)
    assert ev["personal-loss"] == pytest.approx(loss, rel=1e-5) and ev["personal-acc"] == pytest.approx(acc)
    uniform = c.evaluate(soft_content([low, high]))["metrics"]  # no importance weights sent yet: uniform
    loss, _ = scores(c, {k: 0.5 * low[k] + 0.5 * high[k] for k in low})
    assert uniform["personal-loss"] == pytest.approx(loss, rel=1e-5)
    for bad in ([1.0], [-1.0, 2.0], [0.0, 0.0]):
        with pytest.raises(ValueError, match="importance weights"):
            c.evaluate(soft_content([low, high], u=bad))


def test_fedsoft_proximal_term_pulls_towards_the_mixture_and_the_model_stays_on_the_client(centres):
    init, low, high = centres
    data = client_data(HIGH)
    ref = {k: 0.5 * low[k] + 0.5 * high[k] for k in low}
    trained = {}
    for lam in (0.0, 5.0):
        ctx = context("fedsoft", **{"tiers": 2, "local-epochs": 3, "fedsoft-lambda": lam})
        reply = client("fedsoft", data, ctx).train(soft_content([low, high], u=[0.5, 0.5]))
        trained[lam] = as_torch(reply["arrays"])
        assert all(torch.equal(as_torch(ctx.state["model"])[k], trained[lam][k]) for k in trained[lam])
    assert dist(trained[5.0], ref) < 0.8 * dist(trained[0.0], ref)
    # later rounds continue from the stored own model, whatever the centres are now
    ctx = context("fedsoft", **{"tiers": 2, "local-epochs": 1})
    client("fedsoft", data, ctx).train(soft_content([low, high], u=[0.5, 0.5]))
    own = as_torch(ctx.state["model"])
    c = client("fedsoft", data, ctx)
    ev = c.evaluate(soft_content([init, init], u=[0.5, 0.5]))["metrics"]
    assert ev["personal-loss"] == pytest.approx(scores(c, own)[0], rel=1e-6)


def test_fedsoft_importance_weights():
    import numpy as np

    from client_app.fedsoft import importance_weights

    losses = np.array([[0.1, 0.2, 3.0, 0.3], [1.0, 0.1, 0.2, 0.4]])  # centre 0 best for points 0 and 3
    np.testing.assert_allclose(importance_weights(losses, sigma=0.0), [0.5, 0.5])
    u = importance_weights(np.array([[0.1, 0.1], [1.0, 1.0]]))
    assert u[1] > 0 and abs(u.sum() - 1) < 1e-12 and u[0] > 0.99  # smoothed, never exactly zero
