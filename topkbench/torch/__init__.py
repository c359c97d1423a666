"""The top-k and multilabel losses of the registry for PyTorch (the optional extra
``topkbench[torch]``): :func:`loss` and the module :class:`TopKLoss`, exact values and
gradients, batched, on CPU and CUDA (:mod:`topkbench.torch.losses`)."""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "topkbench.torch needs PyTorch: pip install 'topkbench[torch]' (or pip install torch)"
    ) from exc

from topkbench.torch.losses import AVAILABLE, TopKLoss, loss

__all__ = ["AVAILABLE", "TopKLoss", "loss"]
