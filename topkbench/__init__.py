"""topkbench: reproduce the top-k and multilabel loss benchmarks of Lapin, Hein & Schiele.

Kept light on purpose (``topkbench --help`` must be instant): heavy modules load lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["fit", "load", "Model", "__version__"]


def __getattr__(name: str):
    if name == "fit":
        from topkbench.api import fit

        return fit
    if name == "Model":
        from topkbench.model import Model

        return Model
    if name == "load":
        from topkbench.model import Model

        return Model.load
    raise AttributeError(f"module 'topkbench' has no attribute {name!r}")
