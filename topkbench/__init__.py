"""topkbench: reproduce the top-k and multilabel loss benchmarks of Lapin, Hein & Schiele.

Kept light on purpose (``topkbench --help`` must be instant): heavy modules load lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["fit", "load", "Model", "__version__"]


def __getattr__(name: str):
    if name in ("fit", "Model"):
        from topkbench import model

        return getattr(model, name)
    if name == "load":
        from topkbench.model import Model

        return Model.load
    raise AttributeError(f"module 'topkbench' has no attribute {name!r}")
