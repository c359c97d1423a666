"""``topkbench bench kato-fig2`` (Kato Fig. 2) on a tiny problem: CSV and PNG written, every
solver traced, and Kato's finding reproduced -- the authors' pseudo-alpha SDCA leaves a
duality gap under the printed top-k hinge that our printed-alpha SDCA closes."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from topkbench.bench import kato as bench
from topkbench.bench.common import make_gaussian_problem
from topkbench.cli import app
from topkbench.errors import ConfigError


def test_kato_fig2_smoke(tmp_path):
    res = CliRunner().invoke(
        app,
        ["bench", "kato-fig2", "--n", "200", "--d", "16", "--m", "6", "--iters", "150",
         "--out", str(tmp_path)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "kato_fig2.csv")
    assert (tmp_path / "kato_fig2.png").stat().st_size > 10_000
    solvers = set(df["solver"])
    assert len(solvers) == 6 and any("pseudo" in s for s in solvers)
    assert (df["gap"] >= -1e-10).all()  # P_printed - D is a valid gap for every solver
    last = df.groupby("solver")["gap"].last()
    pseudo = last[[s for s in last.index if "pseudo" in s][0]]
    printed = last[[s for s in last.index if "printed" in s][0]]
    weighted = last[[s for s in last.index if "weighted" in s][0]]
    assert printed < 1e-6 < pseudo and weighted < 1e-6
    assert (df.groupby("solver")["seconds"].apply(lambda s: s.is_monotonic_increasing)).all()


def test_kato_fig2_refuses_k_outside_1_to_m_minus_1_before_any_kernel_runs(monkeypatch):
    # its SDCA study calls the kernels directly, where a k >= m would read past the scores
    def no_kernels(*args, **kwargs):
        raise AssertionError("the SDCA study ran before k was checked")

    monkeypatch.setattr(bench, "_sdca_study", no_kernels)
    X, y = make_gaussian_problem(60, 4, 4, 0)
    with pytest.raises(ConfigError, match=r"k must be in \[1, 3\]"):
        bench.kato_fig2(X, y, k=4, iters=2)


def test_kato_fig3_and_fig4_smoke(tmp_path):
    """Kato Figs. 3-4 studies: every (panel, run) traced, certificates valid and monotone
    (best primal, non-decreasing dual), and smoothing lowers the optimum (the smoothed dual
    stays below the non-smooth primal: D_gamma <= OPT_gamma <= OPT_0 <= P_0)."""
    args = ["--n", "120", "--d", "8", "--m", "5", "--iters", "60", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, ["bench", "kato-fig3", "--gamma", "0", "--gamma", "10", *args])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "kato_fig3.csv")
    assert (tmp_path / "kato_fig3.png").stat().st_size > 10_000
    runs = df.groupby(["panel", "label"])
    assert runs.ngroups == 8 and set(df["variant"]) == {"standard", "away", "pairwise", "sdca"}
    sizes = runs.size()
    assert (sizes[[p for p in sizes.index if "SDCA" not in p[0]]] == 61).all()
    assert (sizes <= 61).all()  # SDCA stops early once its gap is exactly 0
    assert (df["gap"] >= -1e-12).all()
    # Frank-Wolfe certifies with its best primal: the gap never rises; SDCA ascends the dual
    fw = df[df["variant"] != "sdca"].groupby(["panel", "label"])
    assert fw["gap"].apply(lambda g: (g.diff().dropna() <= 1e-15).all()).all()
    assert runs["dual"].apply(lambda g: (g.diff().dropna() >= -1e-12 * g.abs().max()).all()).all()
    last = runs.last()
    sdca_last = last[last["variant"] == "sdca"]
    assert (sdca_last["relative_gap"] < last[last["variant"] != "sdca"]["relative_gap"].min()).all()
    for panel in set(df["panel"]):
        assert last.loc[(panel, "gamma = 10"), "dual"] <= last.loc[(panel, "gamma = 0"), "primal"]
        assert last.loc[(panel, "gamma = 10"), "primal"] < last.loc[(panel, "gamma = 0"), "primal"]
    res = CliRunner().invoke(app, ["bench", "kato-fig4", "--fw", "away", *args])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "kato_fig4.csv")
    assert set(df["label"]) == {"flat", "linear", "exp"}
    assert set(df["variant"]) == {"away", "sdca"}
    res = CliRunner().invoke(app, ["bench", "kato-fig4", "--fw", "newton", *args])
    assert res.exit_code != 0 and "--fw must be one of" in res.output
