"""Smoke tests of the study scripts in scripts/ (tiny sizes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_pseudo_vs_printed_reports_the_order_and_a_positive_gap():
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "pseudo_vs_printed.py"), "--n", "60", "--m", "5",
         "--ks", "3"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    primal = {name: float(v) for name, v in re.findall(r"k=3 (topk_svm_\w+)\s+P\*=([0-9.]+)", out)}
    assert primal["topk_svm_alpha_pseudo"] <= primal["topk_svm_alpha"] + 1e-8
    assert primal["topk_svm_alpha"] <= primal["topk_svm_beta"] + 1e-8
    gap = float(re.search(r"relative gap=([-0-9.e]+)", out).group(1))
    assert gap > 1e-4  # the pseudo optimum is not the printed-alpha optimum
