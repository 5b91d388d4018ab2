"""PI-FL's Profiler (pifl.md §2.1, §2.3): its server set is an IID sample of the run's own data, and each
winner's score is the first-order Shapley estimate at its new tier model."""

import numpy as np
import pytest
import torch

from task.models import build_model
from task.params import load_record
from tests.pifl.server_kit import pifl, train_one_round_with_offsets


def test_the_server_set_is_an_iid_sample_of_server_set_size_distinct_samples_of_the_data_set():
    # pifl.md §2.1: the Profiler holds a small IID server test set (server-set-size samples), the same in every round
    from task.data import load_centralized

    strat = pifl(**{"server-set-size": 40})
    x, y = strat.server_set()
    data = load_centralized("digits")
    assert len(x) == len(y) == 40 and len({r.tobytes() for r in x.numpy()}) == 40
    index = {r.tobytes(): i for i, r in enumerate(data.x)}
    picked = [index[r.tobytes()] for r in x.numpy()]  # every row is a row of the data set, with its own label
    assert y.tolist() == data.y[picked].tolist()
    assert len(set(y.tolist())) >= 8  # IID: (nearly) every class, not the first rows of one class
    assert strat.server_set()[0] is x  # built once
    again = pifl(**{"server-set-size": 40}).server_set()[0]
    torch.testing.assert_close(again, x)  # reproducible


def test_the_server_set_is_drawn_from_the_runs_own_data_noise_and_local_copy_included(tmp_path):
    """The server's set is a sample of the data the clients hold: with noise-std the same noisy pixels, with a
    local copy of a real data set (data-dir; no hub at run time) rows of that copy."""
    from datasets import Dataset, DatasetDict, Image
    from PIL import Image as PILImage

    from task.data import load_centralized

    def rows_of(data, x):
        index = {r.tobytes(): i for i, r in enumerate(data.x)}
        return [index.get(r.tobytes()) for r in x.numpy()]

    x, y = pifl(**{"server-set-size": 30, "noise-std": 0.7}).server_set()
    noisy = load_centralized("digits", noise_std=0.7)
    assert None not in rows_of(noisy, x) and None in rows_of(load_centralized("digits"), x)

    rng = np.random.default_rng(0)

    def split(n):
        imgs = [PILImage.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8), "L") for _ in range(n)]
        return Dataset.from_dict({"image": imgs, "label": (np.arange(n) % 10).tolist()}).cast_column("image", Image())

    DatasetDict({"train": split(60), "test": split(20)}).save_to_disk(tmp_path / "mnist")
    x, y = pifl(**{"dataset": "mnist", "data-dir": str(tmp_path / "mnist"), "server-set-size": 30}).server_set()
    local = load_centralized("mnist", str(tmp_path / "mnist"))
    picked = rows_of(local, x)
    assert len(x) == 30 and None not in picked and y.tolist() == local.y[picked].tolist()


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient after a backward pass, in double precision."""
    out = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient from the loss"
        out[name] = p.grad.double()
    return out


def test_each_winners_score_is_the_first_order_shapley_estimate_at_its_new_tier_model():
    # pifl.md §2.3 / App. A: psi_kc = -lambda_c (W_c - W_M)^T g, g the mean cross-entropy gradient of the new tier model
    # W_M on the server set; computed for every tier of the round (each with its own gradient)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "server-set-size": 60})
    base, sizes, offset = train_one_round_with_offsets(strat, seed=1, scale=0.3)
    x, y = strat.server_set()
    st = strat.settings
    model = build_model("mlp", st.in_channels, st.image_size, st.num_classes)
    for k in (0, 1):
        load_record(model, strat.tiers[k])
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grad = gradients(model)
        group = strat.winners[k]
        lam = {c: sizes[c] / sum(sizes[g] for g in group) for c in group}
        for c in group:
            diff = sum(
                float(
                    (
                        (
                            torch.from_numpy(base[n] + offset[c][n]).double()
                            - torch.from_numpy(strat.tiers[k][n]).double()
                        )
                        * grad[n]
                    ).sum()
                )
                for n in grad
            )
            assert strat.scores[k][c] == pytest.approx(-lam[c] * diff, rel=1e-3, abs=1e-7)
