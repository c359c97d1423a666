"""topkbench: reproduce the top-k and multilabel loss benchmarks of Lapin, Hein & Schiele.

Kept light on purpose (``topkbench --help`` must be instant): heavy modules load lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["fit", "load", "Model", "__version__"]


def __getattr__(name: str):
    if name in ("fit", "Model", "load"):
        from topkbench import api

        return {"fit": api.fit, "Model": api.Model, "load": api.Model.load}[name]
    raise AttributeError(f"module 'topkbench' has no attribute {name!r}")
