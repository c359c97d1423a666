"""topkbench.deep.network: the small CNN of the fine-tuning protocol, seeded and deterministic,
trained and fine-tuned with the registry's losses."""

from __future__ import annotations

import numpy as np
import pytest
from torch_required import import_torch

torch = import_torch()

from topkbench.deep.network import (  # noqa: E402
    Schedule,
    SmallCNN,
    accuracies,
    deterministic,
    features,
    scores,
    train,
)


def _images(n=96, m=4, seed=0):
    """Binary 28 x 28 images of m classes: each class lights its own quadrant pattern."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, m, n)
    X = (rng.random((n, 28, 28)) < 0.05).astype(np.float32)
    for c in range(m):
        r, q = divmod(c, 2)
        X[y == c, 14 * r : 14 * r + 10, 14 * q : 14 * q + 10] = 1.0
    return torch.tensor(X.reshape(n, 784)), torch.tensor(y)


def _fit(seed, method="lr_multi", epochs=2, **kw):
    X, y = _images()
    gen = deterministic(seed)
    model = SmallCNN(4, channels=(4, 8), hidden=16)
    losses = train(model, X, y, method, epochs, Schedule(lr=0.05, batch_size=16), gen, **kw)
    return model, losses, X, y


def test_same_seed_same_network():
    a, la, X, _ = _fit(3)
    b, lb, _, _ = _fit(3)
    c, _, _, _ = _fit(4)
    assert la == lb
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(),
                                                      strict=True))  # fmt: skip
    np.testing.assert_array_equal(scores(a, X), scores(b, X))


def test_training_learns_and_fine_tuning_moves_on_with_each_loss():
    model, losses, X, y = _fit(0, epochs=6)
    assert losses[-1] < losses[0]
    acc = accuracies(model, X, y)
    assert acc[1] > 60.0 and acc[3] == pytest.approx(100.0) and set(acc) == {1, 3, 5, 10}
    before = [p.clone() for p in model.parameters()]
    for method, k, gamma in (("topk_svm_alpha_pseudo", 3, 1.0), ("topk_ent_tr", 3, 0.0)):
        train(model, X, y, method, 1, Schedule(lr=0.01, batch_size=16), deterministic(1),
              k=k, gamma=gamma)  # fmt: skip
    assert any(not torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))
    # wtopk_svm's rank weights reach the loss: other weights, another network
    tuned = []
    for weights in ("flat", "exp"):
        net, _, _, _ = _fit(0, epochs=1)
        train(net, X, y, "wtopk_svm", 1, Schedule(lr=0.05, batch_size=16), deterministic(1),
              k=3, gamma=0.5, weights=weights)  # fmt: skip
        tuned.append(scores(net, X))
    assert not np.array_equal(*tuned)
    F = features(model, X)
    assert F.shape == (96, 16) and np.isfinite(F).all()


def test_each_epoch_reports_and_bad_settings_are_refused():
    seen = []
    _fit(0, epochs=2, on_epoch=lambda e, m: seen.append(e))
    assert seen == [1, 2]
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        _fit(0, epochs=0)
    with pytest.raises(ValueError, match=r"lr must be in \(0, inf\)"):
        Schedule(lr=0.0)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        Schedule(momentum=1.0)
    with pytest.raises(ValueError, match="divisible by 4"):
        SmallCNN(3, side=30)
    with pytest.raises(ValueError, match=r"k must be in \[1, 3\]"):
        _fit(0, method="topk_svm_beta", k=4, gamma=1.0)


def test_a_diverging_loss_stops_with_a_clear_error():
    X, y = _images()
    model = SmallCNN(4, channels=(4, 8), hidden=16)
    with pytest.raises(FloatingPointError, match="diverged"):
        train(model, X * 1e30, y, "lr_multi", 3, Schedule(lr=10.0, batch_size=16),
              deterministic(0))  # fmt: skip
