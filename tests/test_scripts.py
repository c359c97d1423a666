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


def test_pca_memory_keeps_the_nonsingular_components():
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "pca_memory.py"), "--n", "120", "--n-test", "30",
         "--d", "400", "--nnz-per-row", "10"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    m = re.search(r"(\d+) components, train \((\d+), (\d+)\), test \((\d+), (\d+)\)", out)
    assert m is not None, out
    r, n, r2, nt, r3 = (int(g) for g in m.groups())
    assert n == 120 and nt == 30 and r == r2 == r3
    assert 100 <= r <= 119  # centred rank <= n - 1
    assert "peak RSS" in out
