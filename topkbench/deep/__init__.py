"""Networks trained with the registry's losses (TPAMI Table 6's fine-tuning protocol); needs
the extra ``topkbench[torch]``."""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "topkbench.deep needs PyTorch: pip install 'topkbench[torch]' (or pip install torch)"
    ) from exc
