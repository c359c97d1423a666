"""The PyTorch tests' import of torch: skipped without the extra topkbench[torch], except where
TOPKBENCH_REQUIRE_TORCH is set (CI installs the extra, so a missing torch fails there)."""

from __future__ import annotations

import os

import pytest


def import_torch():
    """torch, or a skip of the calling test module (a failure under TOPKBENCH_REQUIRE_TORCH)."""
    if os.environ.get("TOPKBENCH_REQUIRE_TORCH"):
        import torch

        return torch
    return pytest.importorskip("torch", reason="the extra topkbench[torch] is not installed")
