"""A small convolutional network trained and fine-tuned with the registry's losses, for TPAMI
Table 6's protocol on images (002 §6.2: a network trained with softmax, then fine-tuned for
1-3 epochs with the smooth top-k hinges, top-k Ent_tr or softmax again, and compared by
top-k accuracy).

Everything is driven by one seed: the weights' initialization and the order of the examples
come from torch generators seeded from it, and torch runs its deterministic algorithms, so the
same call gives the same network on the CPU (:func:`deterministic`).  The losses are
:func:`topkbench.torch.loss` (the per-example scale of DESIGN §2, averaged over the batch).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from topkbench.deep.config import Schedule
from topkbench.metrics.topk import topk_accuracy
from topkbench.torch import loss as topk_loss


class SmallCNN(nn.Module):
    """Two 3 x 3 convolutions (each followed by ReLU and 2 x 2 max pooling), a hidden layer
    of ``hidden`` units (the penultimate features, :meth:`features`) and a linear
    classifier.  Sized for 28 x 28 one-channel images (Caltech101 Silhouettes)."""

    def __init__(self, n_classes: int, side: int = 28, channels: tuple[int, int] = (16, 32),
                 hidden: int = 128):  # fmt: skip
        super().__init__()
        if side % 4:
            raise ValueError(f"images must have a side divisible by 4 (two 2x2 poolings), "
                             f"got {side}")  # fmt: skip
        c1, c2 = channels
        self.side = side
        self.body = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(c2 * (side // 4) ** 2, hidden), nn.ReLU(),
        )  # fmt: skip
        self.classifier = nn.Linear(hidden, n_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The penultimate activations (the classifier's input)."""
        return self.body(x.view(-1, 1, self.side, self.side))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def deterministic(seed: int) -> torch.Generator:
    """Seed torch (the weights' initialization) and switch to its deterministic algorithms;
    returns a CPU generator for the data order, seeded from ``seed`` too."""
    # cuBLAS is deterministic only with a fixed workspace, set before its first use
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    return torch.Generator().manual_seed(seed + 1)


def train(model: SmallCNN, X: torch.Tensor, y: torch.Tensor, method: str, epochs: int,
          schedule: Schedule, generator: torch.Generator, k: int = 1, gamma: float = 0.0,
          on_epoch: Callable[[int, SmallCNN], None] | None = None,
          weights="flat") -> list[float]:  # fmt: skip
    """Train ``model`` for ``epochs`` passes over ``(X, y)`` (shuffled by ``generator``) on
    the loss ``method`` (registry name, with ``k``, ``gamma`` and wtopk_svm's ``weights``);
    ``on_epoch(epoch, model)`` after each pass (1-based).  Returns the mean training loss of
    each epoch."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    opt = torch.optim.SGD(model.parameters(), lr=schedule.lr, momentum=schedule.momentum,
                          weight_decay=schedule.weight_decay)  # fmt: skip
    n = X.shape[0]
    steps = epochs * math.ceil(n / schedule.batch_size)
    step = 0
    means = []
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(n, generator=generator)
        total = 0.0
        for a in range(0, n, schedule.batch_size):
            idx = order[a : a + schedule.batch_size]
            frac = step / max(steps - 1, 1)
            rate = schedule.final + (1 - schedule.final) * 0.5 * (1 + math.cos(math.pi * frac))
            for group in opt.param_groups:
                group["lr"] = schedule.lr * rate
            opt.zero_grad(set_to_none=True)
            out = model(X[idx])
            if not bool(torch.isfinite(out).all()):
                raise FloatingPointError(f"training with {method} diverged in epoch {epoch} "
                                         f"(scores overflowed at lr {schedule.lr}): lower the "
                                         "learning rate")  # fmt: skip
            value = topk_loss(method, out, y[idx], k=k, gamma=gamma, weights=weights)
            value.backward()
            opt.step()
            total += float(value.detach()) * idx.numel()
            step += 1
        means.append(total / n)
        if on_epoch is not None:
            on_epoch(epoch, model)
    return means


@torch.no_grad()
def scores(model: SmallCNN, X: torch.Tensor, batch: int = 1024) -> np.ndarray:
    """The class scores of every row of X (evaluation mode), as a float64 array."""
    model.eval()
    return np.concatenate([model(X[a : a + batch]).double().cpu().numpy()
                           for a in range(0, X.shape[0], batch)])  # fmt: skip


@torch.no_grad()
def features(model: SmallCNN, X: torch.Tensor, batch: int = 1024) -> np.ndarray:
    """The penultimate features of every row of X (evaluation mode), float64."""
    model.eval()
    return np.concatenate([model.features(X[a : a + batch]).double().cpu().numpy()
                           for a in range(0, X.shape[0], batch)])  # fmt: skip


def accuracies(model: SmallCNN, X: torch.Tensor, y: torch.Tensor,
               ks=(1, 3, 5, 10)) -> dict[int, float]:  # fmt: skip
    """Top-k accuracy (%) for each k, ties counted against the prediction (DESIGN §2)."""
    acc = topk_accuracy(scores(model, X), y.cpu().numpy(), ks)
    return {k: 100.0 * v for k, v in acc.items()}


__all__ = ["Schedule", "SmallCNN", "accuracies", "deterministic", "features", "scores", "train"]
