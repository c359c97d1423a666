"""Every override takes effect or is refused, with a one-line message and no traceback."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from topkbench.cli import app

runner = CliRunner()
SMALL = ["dataset.n_test=200", "dataset.n_train=60", "dataset.n_val=60"]
SWEEP = ["experiment=table3", "experiment.draws=1", "experiment.C_grid.min_exp=-1",
         "experiment.C_grid.max_exp=1", "dataset.n_test=200"]  # fmt: skip


def refused(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code not in (0, None), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return " ".join(res.output.split())


@pytest.mark.parametrize(
    "override,expected",
    [
        ("eps=1e-4", "use experiment.eps=1e-4"),
        ("max_epochs=5", "use experiment.max_epochs=5"),
        ("time_limit=3", "use experiment.time_limit=3"),
        ("eval_every=3", "use experiment.eval_every=3"),
        ("method=lr_multi", "option of topkbench train, not of sweep"),
        ("C=2", "option of topkbench train, not of sweep"),
        ("empty_label=one", "use experiment.empty_label=one"),
        ("solver=gd", "an experiment row chooses its solver"),
    ],
)
def test_sweep_refuses_train_options_with_the_right_spelling(tmp_path, override, expected):
    out = refused("sweep", *SWEEP, f"results_dir={tmp_path}", override)
    assert expected in out
    assert not (tmp_path / "table3").exists()  # nothing ran


@pytest.mark.parametrize(
    "cmd,override,expected",
    [
        ("train", "+methd=lr_multi", "unknown configuration key(s): methd"),
        ("train", "+dataset.n_trian=5", "unknown dataset key(s): n_trian"),
        ("sweep", "+experiment.epss=1e-4", "unknown experiment key(s): epss"),
        ("train", "experiment.eps=1e-4", "train runs one model"),
        ("train", "seed=1.5", "seed must be an integer >= 0; got 1.5"),
        ("train", "seed=-1", "seed must be an integer >= 0; got -1"),
        ("train", "seed=abc", "seed must be an integer >= 0; got 'abc'"),
        ("sweep", "n_jobs=0", "n_jobs must be a positive integer, or -1 for all"),
        ("sweep", "n_jobs=abc", "n_jobs must be a positive integer"),
        ("sweep", "n_jobs=-999", "n_jobs = -999 leaves no worker"),
        ("train", "delta=abc", "delta must be a finite number"),
        ("train", "dataset.bias=abc", "dataset.bias must be a number; got 'abc'"),
        ("train", "topk=[0]", "topk[0] must be an integer >= 1; got 0"),
        ("train", "topk=3", "topk must be a list of integers >= 1; got 3"),
        ("sweep", "experiment.ks=[1.5]", "experiment.ks[0] must be an integer >= 1; got 1.5"),
        ("sweep", "experiment.ks=[abc]", "experiment.ks[0] must be an integer >= 1; got 'abc'"),
        ("sweep", "experiment.ks=2", "experiment.ks must be a list of integers >= 1; got 2"),
        ("sweep", "experiment.warm_start=abc", "experiment.warm_start must be true or false"),
        (
            "sweep",
            "experiment.C_grid.min_exp=abc",
            "experiment.C_grid.min_exp must be a finite number; got 'abc'",
        ),
        (
            "sweep",
            "experiment.max_gram_gb=abc",
            "experiment.max_gram_gb must be a number in (0, inf); got 'abc'",
        ),
        ("train", "dataset.n_train=-5", "dataset.n_train must be an integer >= 1; got -5"),
        ("train", "dataset.n_val=abc", "dataset.n_val must be an integer >= 0"),
        ("train", "+dataset.n_labels=abc", "dataset.n_labels must be a nonzero integer"),
        ("sweep", "experiment.folds=1", "experiment.folds must be an integer >= 2"),
        ("sweep", "experiment.eps=0", "experiment.eps must be in (0, 1)"),
        ("sweep", "experiment.certify_time_limit=-1", "certify_time_limit must be a positive"),
    ],
)
def test_bad_overrides_are_one_line_errors(tmp_path, cmd, override, expected):
    base = SWEEP if cmd == "sweep" else SMALL
    out = refused(cmd, *base, f"results_dir={tmp_path}", override)
    assert expected in out


def test_unknown_keys_are_named_with_the_valid_ones(tmp_path):
    out = refused("sweep", *SWEEP, f"results_dir={tmp_path}", "experiment.fold=3")
    assert "unknown experiment key(s): fold" in out and "folds" in out
    out = refused("train", *SMALL, "dataset.n_trian=3")
    assert "unknown dataset key(s): n_trian" in out


def test_dataset_flags_must_be_booleans(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("1 1:1\n2 2:1\n")
    out = refused("train", "dataset=libsvm", f"dataset.train={f}", "dataset.zero_based=maybe")
    assert "dataset.zero_based must be true or false; got 'maybe'" in out


def test_results_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    out = refused("sweep", *SWEEP, f"results_dir={f}")
    assert "is a file" in out or "cannot use results directory" in out


def test_eval_every_setting_is_part_of_the_record_key(tmp_path):
    """Records of eval_every 10 (table3's) and auto share one store (one key each, no type
    clash in the store or in the export)."""
    args = ["sweep", *SWEEP, f"results_dir={tmp_path}"]
    assert runner.invoke(app, args).exit_code == 0
    res = runner.invoke(app, [*args, "experiment.eval_every=auto"])
    assert res.exit_code == 0, res.output
    for extra in ([], ["experiment.eval_every=auto"]):
        res = runner.invoke(app, ["report", *SWEEP, f"results_dir={tmp_path}", *extra])
        assert res.exit_code == 0, res.output
        assert "belong to other settings" in res.output
    res = runner.invoke(app, ["export", *SWEEP, f"results_dir={tmp_path}",
                              "--out", str(tmp_path / "all.parquet")])  # fmt: skip
    assert res.exit_code == 0, res.output
    import pandas as pd

    df = pd.read_parquet(tmp_path / "all.parquet")
    assert set(df["eval_every"]) == {"auto", "10"}


def test_read_only_results_dir_is_a_one_line_error(tmp_path):
    import os
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    immutable = subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode == 0
    try:
        try:
            (ro / "probe").write_text("")
        except OSError:
            pass
        else:
            pytest.skip("this user can write to a read-only directory")
        out = refused("sweep", *SWEEP, f"results_dir={ro}")
        assert "cannot use results directory" in out and str(ro) in out
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(ro)], check=False)
        os.chmod(ro, 0o755)


def test_experiment_keys_without_an_experiment_and_dataset_keys_it_ignores(tmp_path):
    out = refused("sweep", "experiment.eps=1e-4", f"results_dir={tmp_path}")
    assert "no experiment selected" in out
    out = refused("sweep", "experiment=table5_smoke", "dataset.n_train=50",
                  f"results_dir={tmp_path}")  # fmt: skip
    assert "dataset.n_train= does not apply: experiment table5_smoke lists its own datasets" in out


def test_n_jobs_minus_one_means_every_core():
    """joblib's convention: -1 all cores, -2 all but one."""
    import os

    from topkbench.cli.app import compose
    from topkbench.config import ExperimentConfig

    cores = os.cpu_count() or 1
    for value, expected in ((-1, cores), (2, 2), (-cores, 1)):
        exp = ExperimentConfig.from_dict(compose(["experiment=table3", f"n_jobs={value}"]))
        assert exp.n_jobs == expected


def test_a_directory_where_a_file_is_expected_is_one_line(tmp_path):
    """As a data file, as train --save and as predict --out: a one-line error, no traceback."""
    import numpy as np

    import topkbench

    folder = tmp_path / "folder"
    folder.mkdir()
    out = refused("train", "method=lr_multi", "dataset=libsvm", f"dataset.train={folder}")
    assert f"{folder}: is a directory; a data file is expected" in out
    out = refused("train", "method=lr_multi", *SMALL, "--save", str(folder))
    assert f"--save {folder} is a directory" in out
    X = np.random.default_rng(0).random((12, 3))
    model = topkbench.fit(X, np.arange(12) % 3, "lr_multi").save(tmp_path / "m.npz")
    np.save(tmp_path / "x.npy", X)
    out = refused("predict", str(model), str(tmp_path / "x.npy"), "--out", str(folder))
    assert f"--out {folder} is a directory" in out
    with pytest.raises(topkbench.errors.InputError, match="is a directory"):
        topkbench.fit(X, np.arange(12) % 3, "lr_multi").save(folder)


def test_export_says_when_there_is_nothing_or_nowhere_to_write(tmp_path, monkeypatch):
    """``export`` from a missing store says there are no records (it wrote an empty file and
    exited 0); to a directory, or where the disk refuses the file, it names the path and what
    was kept, in one line."""
    out = refused("export", *SWEEP, f"results_dir={tmp_path}", "--out", str(tmp_path / "r.csv"))
    assert "no records in" in out and not (tmp_path / "r.csv").exists()
    assert runner.invoke(app, ["sweep", *SWEEP, f"results_dir={tmp_path}"]).exit_code == 0
    out = refused("export", *SWEEP, f"results_dir={tmp_path}", "--out", str(tmp_path))
    assert f"cannot export to {tmp_path}: it is a directory" in out
    target = tmp_path / "r.csv"
    target.write_text("kept\n")

    def full_disk(*args, **kwargs):
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("pandas.DataFrame.to_csv", full_disk)
    out = refused("export", *SWEEP, f"results_dir={tmp_path}", "--out", str(target))
    assert f"cannot write {target}: No space left on device; {target} is as it was" in out
    assert target.read_text() == "kept\n" and not list(tmp_path.glob(".*.tmp*"))


def test_a_report_on_a_full_disk_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    """The report files are written all or none: a disk that fills while they are written
    leaves the previous report.md, report.csv and selected.csv as they were (report.md was
    rewritten and report.csv left stale), no temporary file behind, and the warning says so."""
    import errno

    assert runner.invoke(app, ["sweep", *SWEEP, f"results_dir={tmp_path}"]).exit_code == 0
    assert runner.invoke(app, ["report", *SWEEP, f"results_dir={tmp_path}"]).exit_code == 0
    out = tmp_path / "table3"
    before = {p.name: p.read_bytes() for p in out.glob("*.*") if p.suffix in (".md", ".csv")}
    assert set(before) == {"report.md", "report.csv", "selected.csv"}
    wider = [*SWEEP, "experiment.C_grid.max_exp=2"]  # another configuration: another report
    assert runner.invoke(app, ["sweep", *wider, f"results_dir={tmp_path}"]).exit_code == 0

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("pandas.DataFrame.to_csv", full_disk)
    res = runner.invoke(app, ["report", *wider, f"results_dir={tmp_path}"])
    assert res.exit_code == 0 and "| SVM^OVA |" in res.output  # printed all the same
    assert "are as they were, and the report is printed to stdout only" in res.output
    assert {p: (out / p).read_bytes() for p in before} == before
    assert not [p for p in out.iterdir() if ".tmp" in p.name]


def test_a_report_page_on_a_full_disk_is_named_in_the_warning(tmp_path, monkeypatch):
    """report --html where the disk fills at report.html: the warning names that file and
    the files that were written (it named none and said the report went to stdout only)."""
    import errno

    args = [*SWEEP, f"results_dir={tmp_path}"]
    assert runner.invoke(app, ["sweep", *args]).exit_code == 0

    def full_disk(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("topkbench.experiments.html.replace_file", full_disk)
    res = runner.invoke(app, ["report", *args, "--html"])
    out = " ".join(res.output.split())
    assert res.exit_code == 0 and "| SVM^OVA |" in res.output, res.output
    page = tmp_path / "table3" / "report.html"
    assert f"could not write {page} (No space left on device)" in out, out
    assert "report.md, report.csv, selected.csv" in out and "stdout only" not in out
    assert (tmp_path / "table3" / "report.md").exists() and not page.exists()


@pytest.mark.parametrize("cmd", ["sweep", "bench protocol"])
def test_a_full_disk_at_the_sweep_lock_is_one_line(tmp_path, monkeypatch, cmd):
    """A disk too full for the lock file's one line (the holder it names) gave a raw OSError
    from sweep and bench protocol; now one error naming the lock file, before anything ran."""
    import builtins
    import errno
    from pathlib import Path

    import topkbench.experiments.store as store

    def lock_on_a_full_disk(path, *args, **kwargs):
        fh = builtins.open(path, *args, **kwargs)
        if Path(path).name == "sweep.lock":

            def full(text):
                raise OSError(errno.ENOSPC, "No space left on device")

            fh.write = full
        return fh

    monkeypatch.setattr(store, "open", lock_on_a_full_disk, raising=False)
    if cmd == "sweep":
        out = refused("sweep", *SWEEP, f"results_dir={tmp_path}")
    else:
        out = refused("bench", "protocol", *SWEEP, "--n-jobs", "1", "--out", str(tmp_path))
    assert "no space left on the disk while writing" in out and "sweep.lock" in out, out
    assert str(tmp_path) in out
    assert not list(tmp_path.rglob("records.sqlite"))


def test_records_edited_by_hand_are_skipped_and_counted(tmp_path, caplog):
    """A record whose body is not JSON, or that holds text where a number belongs, or a list
    where a metric is one number (report crashed averaging it), is skipped by report with a
    warning that counts them, and the next sweep computes them again (it counted them as
    done), to the report of the untouched store."""
    import json
    import sqlite3

    args = [*SWEEP, f"results_dir={tmp_path}"]
    assert runner.invoke(app, ["sweep", *args]).exit_code == 0
    whole = runner.invoke(app, ["report", *args])
    assert whole.exit_code == 0, whole.output
    md = (tmp_path / "table3" / "report.md").read_text()
    db = sqlite3.connect(tmp_path / "table3" / "records.sqlite")
    (k1, b1), (k2, _), (k3, b3) = db.execute("SELECT key, body FROM records LIMIT 3").fetchall()
    db.execute("UPDATE records SET body = ? WHERE key = ?",
               (json.dumps({**json.loads(b1), "primal": "abc"}), k1))  # fmt: skip
    db.execute("UPDATE records SET body = 'not json {' WHERE key = ?", (k2,))
    db.execute("UPDATE records SET body = ? WHERE key = ?",
               (json.dumps({**json.loads(b3), "val_top1": [0.5]}), k3))  # fmt: skip
    db.commit()
    db.close()
    res = runner.invoke(app, ["report", *args])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "3 of 36 grid fits of the datasets it ran are missing" in res.output
    text = " ".join(caplog.text.split())
    assert "3 record(s) of" in text and "cannot be read and are skipped" in text
    assert runner.invoke(app, ["sweep", *args]).exit_code == 0
    db = sqlite3.connect(tmp_path / "table3" / "records.sqlite")
    bodies = dict(db.execute("SELECT key, body FROM records WHERE key IN (?, ?, ?)",
                             (k1, k2, k3)).fetchall())  # fmt: skip
    db.close()
    recomputed = {k: json.loads(b) for k, b in bodies.items()}
    assert set(recomputed) == {k1, k2, k3}
    assert all(isinstance(r["primal"], float) and isinstance(r["val_top1"], float)
               for r in recomputed.values())  # fmt: skip
    caplog.clear()
    again = runner.invoke(app, ["report", *args])
    assert again.exit_code == 0, again.output
    assert "cannot be read" not in caplog.text and "incomplete" not in caplog.text
    assert "missing" not in again.output
    assert (tmp_path / "table3" / "report.md").read_text() == md


def test_memory_that_runs_out_is_one_line(monkeypatch):
    """A MemoryError anywhere in a command (pyarrow's ArrowMemoryError is one) ends in one
    error line with exit code 7, not a traceback."""
    import topkbench.api

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 68.7 MiB")

    monkeypatch.setattr(topkbench.api, "fit", no_memory)
    res = runner.invoke(app, ["train", *SMALL, "method=lr_multi"])
    assert res.exit_code == 7 and "Traceback" not in res.output
    assert "memory ran out (MemoryError: Unable to allocate 68.7 MiB)" in " ".join(
        res.output.split()
    )


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux's prlimit")
def test_a_sweep_under_an_address_space_limit_never_hangs(tmp_path):
    """Under a limit below what the libraries map, the sweep refuses at once with the figure
    (it spun forever in the BLAS's buffer allocation); under a tight one above it, the BLAS
    keeps to one thread and the sweep finishes."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "topkbench.cli", "sweep", *SWEEP, f"results_dir={tmp_path}"]
    low = subprocess.run(["prlimit", "--as=700000000", *cmd], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert low.returncode == 7 and "Traceback" not in low.stderr
    assert "the address-space limit is 668 MB; topkbench needs at least 1024 MB" in " ".join(
        low.stderr.split()
    )
    ok = subprocess.run(["prlimit", "--as=1200000000", *cmd, "n_jobs=2"], capture_output=True,
                        text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "finished:" in ok.stderr
