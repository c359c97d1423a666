"""CLI contract (DESIGN §9): --help, the --json object, error messages and exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from topkbench.cli import app
from topkbench.losses.registry import METHODS

runner = CliRunner()

SMALL = ["dataset.n_test=500", "dataset.n_train=60", "dataset.n_val=60"]


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize(
    "cmd", [[], ["train"], ["sweep"], ["report"], ["methods"], ["bench", "sdca"]]
)
def test_help(cmd):
    res = invoke(*cmd, "--help")
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_train_help_lists_methods():
    res = invoke("train", "--help")
    for name in METHODS:
        assert name in res.output


def test_methods_lists_registry():
    res = invoke("methods")
    assert res.exit_code == 0
    for name in METHODS:
        assert name in res.output


@pytest.mark.parametrize("method", list(METHODS))
def test_train_json_contract(method):
    res = invoke("train", f"method={method}", "C=0.5", *SMALL, "--json")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stdout
    out = json.loads(lines[0])
    for key in (
        "dataset",
        "method",
        "params",
        "n",
        "d",
        "m",
        "primal",
        "dual",
        "relative_gap",
        "status",
        "epochs",
        "train_seconds",
        "metrics",
    ):
        assert key in out
    assert out["method"] == method
    assert (out["n"], out["d"], out["m"]) == (60, 2, 3)
    assert out["status"] == "converged"
    if METHODS[method].solver == "lbfgs":
        # nonconvex: no certificate; the gradient norm instead
        assert out["dual"] is None and out["relative_gap"] is None
        assert out["info"]["grad_norm"] >= 0.0
    else:
        assert out["primal"] >= out["dual"] - 1e-12
        assert out["relative_gap"] <= 1e-3
    assert set(out["metrics"]) == {"train", "val", "test"}
    assert set(out["metrics"]["test"]) == {"top1", "top2"}
    assert 0.0 <= out["metrics"]["test"]["top1"] <= out["metrics"]["test"]["top2"] <= 1.0


def test_train_human_output():
    res = invoke("train", "method=lr_multi", *SMALL)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "relative gap" in text and "top-1" in text


@pytest.mark.parametrize(
    "args, needle",
    [
        (["method=nope"], "Available methods are: svm_ova, lr_ova, svm_multi, lr_multi"),
        (["C=-1"], "C must be in (0, inf); got -1"),
        (["C=0"], "C must be in (0, inf)"),
        (["k=3"], "k must be in [1, 2] (m = 3 classes); got k = 3"),
        (["k=0"], "k must be in [1, 2]"),
        (["gamma=-0.5", "method=svm_multi"], "gamma must be in [0, inf)"),
        (["gamma=1", "method=lr_multi"], "has no smoothing parameter"),
        (["no_such_key=1"], "Could not override 'no_such_key'"),
        (["dataset=nope"], "bad configuration override"),
    ],
)
def test_train_errors(args, needle):
    res = invoke("train", *args, *SMALL)
    assert res.exit_code != 0
    text = " ".join(res.output.split())
    assert needle in text, text
    assert "Traceback" not in res.output


def test_sweep_requires_experiment():
    res = invoke("sweep")
    assert res.exit_code != 0
    assert "no experiment selected" in res.output
    assert "experiment=table3" in res.output


def test_bench_table5_smoke(tmp_path):
    """The Table 5 benchmark command on a tiny Letter-shaped set: both modes, CSV and report."""
    res = runner.invoke(
        app,
        [
            "bench", "table5", "--n-jobs", "1", "--out", str(tmp_path),
            "experiment.datasets=[{base:letter_synth,n_train:150,n_val:80,n_test:100}]",
            "experiment.C_grid.min_exp=0", "experiment.C_grid.max_exp=0", "experiment.extend=0",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    import pandas as pd

    df = pd.read_csv(tmp_path / "table5.csv")
    assert list(df["mode"]) == ["warm", "cold"]
    assert (df["fits"] == 20).all()  # one C per row: 17 rows and the 3 of the L-BFGS block
    assert (df["wall_seconds"] > 0).all()
    assert "Letter-shaped Gaussian classes" in (tmp_path / "table5_letter_synth.md").read_text()
    assert "warm starts save" in res.output


@pytest.mark.parametrize(
    "args", [["--help"], ["methods"], ["train", "--help"], ["bench", "--help"]]
)
def test_help_and_methods_load_no_numba(args):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from topkbench.cli import app\n"
        f"res = CliRunner().invoke(app, {args!r})\n"
        "assert res.exit_code == 0, res.output\n"
        "compiled = ('topkbench.prox', 'topkbench.losses.dispatch', 'topkbench.solvers.epochs')\n"
        "heavy = [m for m in sys.modules if m == 'numba' or m.startswith(compiled)]\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_train_with_balanced_class_weights():
    res = invoke("train", "method=lr_multi", *SMALL, "dataset.class_weight=balanced", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["info"]["weighted"] is True
    res = invoke("train", "method=svm_ml", "dataset=multilabel_synth",
                 "dataset.class_weight=balanced")  # fmt: skip
    assert res.exit_code == 2 and "class_weight applies to multiclass methods" in res.output


def test_theta_with_the_linear_kernel_is_refused():
    res = invoke("train", "method=lr_multi", "theta=0.5", *SMALL, "--json")
    assert res.exit_code != 0
    assert "theta= is the RBF kernel's width" in " ".join(res.output.split())
    ok = invoke("train", "method=lr_multi", "kernel=rbf", "theta=0.5", *SMALL, "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["params"]["theta"] == 0.5


@pytest.mark.parametrize("terminal", [False, True])
def test_sweep_progress_shows_fits_on_a_terminal_and_in_a_log(terminal, caplog):
    """A bar on a terminal; in a log file (no terminal) the same counts as lines, at each
    stage and as fits are stored, where a bar would print only once the sweep is over.  A
    path's new fits count once, whether they were reported one by one or only at its end."""
    import io
    import logging

    from rich.console import Console

    from topkbench.cli.experiments import sweep_progress
    from topkbench.experiments.plan import PathSummary

    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=200)
    counts = {"done": 0, "cached": 0, "failed": 0, "skipped": 0, "not_converged": 0}
    with caplog.at_level(logging.INFO, logger="topkbench"):
        with sweep_progress("t7", counts, console=console, log_every=0.0) as hooks:
            on_done, on_stage, on_fit = hooks
            on_stage("cv", 6)
            on_fit()
            on_fit()
            on_done(PathSummary(row="SVM^ML", draw=0, done=2, cached=1))
            if not terminal:
                assert out.getvalue().splitlines() == [
                    "t7 [cv]: 0/6 fits, done 0 cached 0 failed 0, 0 min 00 s",
                    "t7 [cv]: 1/6 fits, done 1 cached 0 failed 0, 0 min 00 s",
                    "t7 [cv]: 2/6 fits, done 2 cached 0 failed 0, 0 min 00 s",
                    "t7 [cv]: 3/6 fits, done 2 cached 1 failed 0, 0 min 00 s",
                ]
            # a path whose fits were not reported one by one
            on_done(PathSummary(row="SVM^ML", draw=0, done=2, failed=1, errors=("boom",)))
    assert "SVM^ML draw 0 val: boom" in caplog.text
    assert counts["done"] == 4 and counts["failed"] == 1
    shown = out.getvalue()
    assert "t7 [cv]" in shown and "6/6" in shown
    if not terminal:
        assert shown.splitlines()[-1].startswith("t7 [cv]: 6/6 fits, done 4 cached 1 failed 1")


@pytest.mark.parametrize(
    ("args", "target", "message"),
    [
        (["sweep", "experiment=table3"], "topkbench.experiments.sweep.run_sweep",
         "finished records are kept, re-run the command to resume"),
        (["bench", "protocol", "experiment=table7_smoke"],
         "topkbench.bench.protocol.bench_protocol",
         "the timing is lost: a timed protocol runs afresh"),
        (["train", "method=lr_multi", *SMALL], "topkbench.api.fit", "interrupted"),
    ],
)  # fmt: skip
def test_ctrl_c_says_what_the_command_keeps(args, target, message, monkeypatch, tmp_path):
    """A sweep resumes from its records; a timed protocol starts afresh (a re-run wipes its
    directory), and a single fit keeps nothing: only the sweep promises a resume."""
    import importlib

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, interrupt)
    monkeypatch.chdir(tmp_path)
    res = invoke(*args)
    assert res.exit_code == 130, res.output
    said = " ".join(res.output.split())
    assert message in said
    assert ("resume" in said) == (args[0] == "sweep")
