"""The record store's guarantees (DESIGN §8) and the certification of selected fits.

* a selected fit that stopped on its budget is continued until eps;
* a killed sweep (SIGKILL to its process group, at random moments) resumes to the same report;
* one writer: a second sweep is refused while one runs, a report reads during it;
* content-addressed keys: a changed data file or solver setting recomputes what depends on it,
  and a report reads only the records of the configuration it names;
* corrupt checkpoints are ignored, old-layout directories refused.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from topkbench.cli import compose
from topkbench.config import DatasetConfig, ExperimentConfig
from topkbench.data.synthetic import make_ill_conditioned
from topkbench.experiments.report import build_report
from topkbench.experiments.selection import current_records
from topkbench.experiments.store import RecordStore, StoreError, WriterLock
from topkbench.experiments.sweep import run_sweep


def write_libsvm(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    with open(path, "w") as fh:
        for xi, yi in zip(X, y, strict=True):
            fh.write(f"{yi} " + " ".join(f"{j + 1}:{v:.17g}" for j, v in enumerate(xi)) + "\n")
    return path


@pytest.fixture(scope="module")
def ill_files(tmp_path_factory):
    """Train/val/test LibSVM files of ill-conditioned features (||x||^2 up to ~1e4)."""
    d = tmp_path_factory.mktemp("ill")
    X, y = make_ill_conditioned(240, 10, 3, seed=3)
    return {
        s: write_libsvm(d / f"{s}.txt", X[i : i + 80], y[i : i + 80])
        for s, i in (("train", 0), ("val", 80), ("test", 160))
    }


def copy_files(files: dict[str, Path], where: Path) -> dict[str, Path]:
    """Private copies of the data files, for a test that edits or deletes them."""
    out = {s: where / p.name for s, p in files.items()}
    for s, p in files.items():
        out[s].write_bytes(p.read_bytes())
    return out


def ill_experiment(results: Path, files, **changes) -> ExperimentConfig:
    base = ExperimentConfig.from_dict(compose(["experiment=table3", f"results_dir={results}"]))
    ds = DatasetConfig.from_dict(
        {"name": "ill", "kind": "libsvm", **{s: str(p) for s, p in files.items()}}
    )
    rows = tuple(r for r in base.rows if r.row in ("SVM^Multi", "LR^Multi"))
    return dataclasses.replace(
        base, datasets=(ds,), rows=rows, draws=1, C_values=tuple(2.0**e for e in range(-2, 5)),
        eps=1e-3, max_epochs=3, eval_every=10, time_limit=None, **changes,
    )  # fmt: skip


def test_selected_fit_stopped_on_the_budget_ends_certified(tmp_path, ill_files):
    exp = ill_experiment(tmp_path, ill_files)
    run_sweep(exp)
    recs = current_records(exp, RecordStore(exp.results_dir, exp.name).load())
    assert (recs["status"] != "converged").sum() >= 3  # the grid's large C stop on 3 epochs
    rep = build_report(exp)
    sel = rep.selected
    assert len(sel) == 4 and (sel["status"] == "converged").all()
    assert (sel["relative_gap"] <= exp.eps).all()
    # at least one selection needed the continuation, whose record says so
    continued = recs[recs["certify_epochs"].notna()] if "certify_epochs" in recs else recs[:0]
    assert len(continued) >= 1
    assert (continued["epochs"] > exp.max_epochs).all()
    assert "Selected models certified" in rep.markdown and "4 of 4" in rep.markdown
    # a re-run finds nothing left to do, the continued records included
    again = run_sweep(exp)
    assert sum(s.done for s in again) == 0


def test_uncertified_selection_is_marked(tmp_path, ill_files):
    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    run_sweep(exp)
    rep = build_report(exp)
    n_bad = int((rep.selected["status"] != "converged").sum())
    assert n_bad >= 1
    assert f"{len(rep.selected) - n_bad} of {len(rep.selected)}" in rep.markdown
    assert "†" in rep.markdown.split("Test accuracy")[0]  # a table cell carries the mark


def test_changed_data_file_or_setting_recomputes_what_depends_on_it(tmp_path, ill_files):
    files = copy_files(ill_files, tmp_path)
    exp = ill_experiment(tmp_path / "res", files, certify_max_epochs=1)
    run_sweep(exp)
    n = len(RecordStore(exp.results_dir, exp.name).load())
    # the test file does not change what the records hold? it does: test accuracies
    text = files["test"].read_text().splitlines()
    files["test"].write_text("\n".join(text[:-1]) + "\n")
    second = run_sweep(exp)
    assert sum(s.cached for s in second) == 0
    assert len(RecordStore(exp.results_dir, exp.name).load()) == 2 * n
    # a solver setting: every record is new; the old configuration's report is unchanged
    before = build_report(exp).markdown
    tight = dataclasses.replace(exp, eps=1e-4)
    third = run_sweep(tight)
    assert sum(s.cached for s in third) == 0
    after = build_report(exp).markdown.splitlines()
    assert [x for x in after if "belong to other settings" not in x] == [
        x for x in before.splitlines() if "belong to other settings" not in x
    ]
    assert any(f"{2 * n} records in" in x for x in after)
    assert len(current_records(tight, RecordStore(exp.results_dir, exp.name).load())) == n


def test_report_of_a_partial_sweep_says_so(tmp_path, ill_files):
    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    run_sweep(dataclasses.replace(exp, C_values=exp.C_values[:3]))
    rep = build_report(exp)
    assert rep.incomplete
    assert rep.markdown.startswith(
        "> **Incomplete sweep:** 8 of 14 grid fits of the datasets it ran are missing"
    )


def test_report_of_a_sweep_that_skipped_datasets_is_complete(tmp_path, ill_files):
    """A sweep run with --skip-missing (here: on one of two datasets) finished every fit it
    could: the report names the dataset it did not run, claims no missing grid fits, and the
    HTML page renders the notes' Markdown."""
    from topkbench.experiments.html import _markdown

    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    run_sweep(exp)
    other = dataclasses.replace(exp.datasets[0], name="absent")
    rep = build_report(dataclasses.replace(exp, datasets=(exp.datasets[0], other)))
    assert not rep.incomplete and "Incomplete sweep" not in rep.markdown
    assert "Not run (no records of this configuration" in rep.markdown and "absent" in rep.markdown
    page = _markdown("> **Incomplete sweep:** 3 of 4; run `topkbench sweep` <b>")
    assert "<strong>Incomplete sweep:</strong>" in page and "<code>topkbench sweep</code>" in page
    assert "**" not in page and "&lt;b&gt;" in page


def test_second_sweep_is_refused_and_a_report_reads_meanwhile(tmp_path, ill_files):
    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    run_sweep(exp)
    store = RecordStore(exp.results_dir, exp.name)
    with WriterLock(store):
        with pytest.raises(StoreError, match=f"another sweep is writing.*pid {os.getpid()}"):
            run_sweep(exp)
        assert "SVM^Multi" in build_report(exp).markdown
    run_sweep(exp)  # the lock is released


def test_checkpoint_round_trip_and_older_dual_only_files(tmp_path):
    """A checkpoint gives back the whole warm state, bit for bit; one of an older store (the
    dual alone, ``.npy``) still warm-starts."""
    import hashlib
    import io

    from topkbench.experiments.store import CheckpointRef, read_checkpoint
    from topkbench.model import WarmStart

    store = RecordStore(tmp_path, "e")
    rng = np.random.default_rng(3)
    warm = WarmStart(2.0, rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), 0.1 / 3)
    store.save_warm("k", warm)
    got = store.load_warm("k")
    assert got.C == 2.0 and got.gamma_start == warm.gamma_start
    assert np.array_equal(got.A, warm.A) and np.array_equal(got.W, warm.W)
    store.save_warm("kernel", WarmStart(0.5, warm.A))
    assert store.load_warm("kernel")[2:] == (None, None)
    buf = io.BytesIO()
    np.save(buf, warm.A)
    old = tmp_path / "old.npy"
    old.write_bytes(buf.getvalue())
    ref = CheckpointRef(4.0, str(old), hashlib.sha256(buf.getvalue()).hexdigest())
    C, A, W, gamma = read_checkpoint(ref)
    assert C == 4.0 and np.array_equal(A, warm.A) and W is None and gamma is None
    # a key that an older store wrote as .npy: rewriting it leaves no stale file behind
    stale = store.warm / "k.npy"
    stale.write_bytes(buf.getvalue())
    store.save_warm("k", warm)
    assert not stale.exists() and store.load_warm("k").gamma_start == warm.gamma_start


def test_corrupt_checkpoint_is_ignored_and_logged(tmp_path, caplog):
    from topkbench.model import WarmStart

    store = RecordStore(tmp_path, "e")
    A = np.arange(6.0).reshape(3, 2)
    store.save_warm("k", WarmStart(2.0, A))
    C, got = store.load_warm("k")[:2]
    assert C == 2.0 and np.array_equal(got, A)
    f = store.warm / "k.npz"
    f.write_bytes(f.read_bytes()[:-8])
    assert store.load_warm("k") is None
    assert "k.npz ignored" in caplog.text
    f.unlink()
    assert store.load_warm("k") is None


def test_old_layout_and_bad_paths_are_refused(tmp_path):
    old = tmp_path / "e" / "records"
    old.mkdir(parents=True)
    (old / "abc.parquet").write_bytes(b"")
    with pytest.raises(StoreError, match="older topkbench"):
        RecordStore(tmp_path, "e")
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="is a file"):
        RecordStore(tmp_path, "file").write("k", {"a": 1})


def _sweep_cmd(results: Path) -> list[str]:
    return [sys.executable, "-m", "topkbench.cli", "sweep", "experiment=table3",
            "experiment.draws=1", "experiment.C_grid.min_exp=-3", "experiment.C_grid.max_exp=3",
            "dataset.n_test=500", f"results_dir={results}", "n_jobs=2"]  # fmt: skip


def _report(results: Path) -> str:
    exp = ExperimentConfig.from_dict(
        compose(["experiment=table3", "experiment.draws=1", "experiment.C_grid.min_exp=-3",
                 "experiment.C_grid.max_exp=3", "dataset.n_test=500", f"results_dir={results}"])
    )  # fmt: skip
    return build_report(exp).markdown


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
    return out


def _children(pid: int) -> list[int]:
    res = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split()]


def test_killed_sweep_resumes_to_the_same_report_without_orphans(tmp_path):
    ref = tmp_path / "ref"
    start = time.monotonic()
    subprocess.run(_sweep_cmd(ref), check=True, capture_output=True)
    duration = time.monotonic() - start  # kills land within a run of this length
    expected = _report(ref)
    # while a sweep runs: a second one is refused with its pid, a report reads a snapshot
    res = tmp_path / "concurrent"
    proc = subprocess.Popen(_sweep_cmd(res), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 60
    while not (res / "table3" / "sweep.lock").exists() and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run(_sweep_cmd(res), capture_output=True, text=True)
    assert proc.poll() is None, "the first sweep ended before the second one started"
    assert second.returncode != 0
    assert f"another sweep is writing to {res / 'table3'} (pid {proc.pid}" in " ".join(
        second.stderr.split()
    )
    while not RecordStore(res, "table3").keys() and time.time() < deadline:
        time.sleep(0.1)
    assert "SVM^Multi" in _report(res)
    proc.wait()
    assert _report(res) == expected
    res = tmp_path / "killed"
    rng = np.random.default_rng(0)
    for share in rng.uniform(0.2, 0.6, size=3):  # each resumed run has less left to do
        proc = subprocess.Popen(_sweep_cmd(res), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(share * duration)
        workers = _children(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it finished first
            pass
        proc.wait()
        deadline = time.time() + 10
        while _alive(workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(workers)
    # the driver alone killed: its workers follow it (no orphans computing)
    proc = subprocess.Popen(_sweep_cmd(res), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(0.3 * duration)
    workers = _children(proc.pid)
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while _alive(workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(workers)
    subprocess.run(_sweep_cmd(res), check=True, capture_output=True)
    recs = RecordStore(res, "table3").load()
    assert recs["key"].is_unique
    assert _report(res) == expected


def test_records_of_a_changed_row_definition_are_left_out(tmp_path, ill_files):
    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    run_sweep(exp)
    everything = RecordStore(exp.results_dir, exp.name).load()
    rows = tuple(dataclasses.replace(r, gamma=0.5) if r.row == "SVM^Multi" else r for r in exp.rows)
    changed = dataclasses.replace(exp, rows=rows)
    kept = current_records(changed, everything)
    assert set(kept["row"]) == {"LR^Multi"}
    assert len(kept) == (everything["row"] == "LR^Multi").sum()


def test_report_without_the_data_files_uses_the_records_digests(tmp_path, ill_files):
    files = copy_files(ill_files, tmp_path)
    exp = ill_experiment(tmp_path / "res", files, certify_max_epochs=1)
    run_sweep(exp)
    before = build_report(exp).markdown
    for f in files.values():
        f.unlink()
    after = build_report(exp).markdown
    assert "Data files of ill are not on this machine" in after
    assert [x for x in after.splitlines() if "not on this machine" not in x] == before.splitlines()


def test_a_report_does_not_wait_for_an_open_write_transaction(tmp_path, ill_files):
    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    run_sweep(exp)
    import sqlite3

    writer = sqlite3.connect(Path(exp.results_dir) / exp.name / "records.sqlite",
                             isolation_level=None)  # fmt: skip
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("DELETE FROM records")  # uncommitted: the report must not see it
    try:
        start = time.monotonic()
        rep = build_report(exp)
        assert time.monotonic() - start < 10
        assert "SVM^Multi" in rep.markdown and not rep.incomplete
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_store_being_created_reads_as_empty(tmp_path):
    import sqlite3

    (tmp_path / "e").mkdir()
    conn = sqlite3.connect(tmp_path / "e" / "records.sqlite")
    conn.execute("CREATE TABLE unrelated (x)")
    conn.close()
    store = RecordStore(tmp_path, "e")  # the file exists, the writer's tables do not yet
    assert store.keys() == set() and store.load().empty and store.load_warm("k") is None


def test_damaged_store_is_a_one_line_error_with_the_recovery(tmp_path, ill_files):
    """Pages overwritten in the middle of records.sqlite (a sound header): report, export and
    sweep say 'cannot open record store' and how to recover, with no traceback."""
    from typer.testing import CliRunner

    from topkbench.cli import app

    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    run_sweep(exp)
    db = Path(exp.results_dir) / exp.name / "records.sqlite"
    for side in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        assert not side.exists() or side.stat().st_size == 0 or side.name.endswith("-shm")
    data = bytearray(db.read_bytes())
    assert len(data) > 3 * 4096
    rng = np.random.default_rng(0)
    data[4096:] = rng.integers(0, 256, len(data) - 4096, dtype=np.uint8).tobytes()
    db.write_bytes(bytes(data))
    store = RecordStore(exp.results_dir, exp.name)
    with pytest.raises(StoreError, match="cannot open record store") as exc:
        store.load()
    assert "PRAGMA integrity_check" in exc.value.hint and "mv " in exc.value.hint
    store.close()
    runner = CliRunner()
    args = [f"results_dir={exp.results_dir}", "experiment=table3"]
    for cmd in (["report"], ["export", "--out", str(tmp_path / "r.csv")]):
        res = runner.invoke(app, [*cmd, *args])
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert "cannot open record store" in " ".join(res.output.split())


def test_full_disk_during_a_sweep_keeps_what_finished(tmp_path, ill_files, monkeypatch):
    """ENOSPC while writing a warm checkpoint: a one-line error saying where, that finished
    records are kept and that re-running resumes; the records already committed stay."""
    import errno

    exp = ill_experiment(tmp_path, ill_files, certify_max_epochs=1)
    calls = {"n": 0}
    real = RecordStore._write_checkpoint_file

    def full_after_five(self, key, warm):
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.warm / key))
        return real(self, key, warm)

    monkeypatch.setattr(RecordStore, "_write_checkpoint_file", full_after_five)
    with pytest.raises(StoreError) as exc:
        run_sweep(exp)
    text = str(exc.value)
    assert "no space left on the disk while writing" in text and str(exp.results_dir) in text
    assert "re-running the same command resumes" in text
    kept = RecordStore(exp.results_dir, exp.name).load()
    assert len(kept) >= 2
    monkeypatch.setattr(RecordStore, "_write_checkpoint_file", real)
    second = run_sweep(exp)
    assert sum(s.cached for s in second) >= len(kept)


def test_report_on_a_read_only_results_directory_prints_and_warns(tmp_path, monkeypatch):
    """The report files cannot be written (a read-only results directory; simulated, since
    root writes anywhere): the report still goes to stdout, with a warning."""
    import errno

    from typer.testing import CliRunner

    import topkbench.experiments.render as render
    from topkbench.cli import app

    args = ["experiment=table7_smoke", "experiment.C_grid.step=4", f"results_dir={tmp_path}",
            'experiment.rows=[{row: "LR^ML", method: lr_ml}]']  # fmt: skip
    runner = CliRunner()
    assert runner.invoke(app, ["sweep", *args]).exit_code == 0

    def read_only(exp, rep):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "report.md"))

    monkeypatch.setattr(render, "write_report", read_only)
    res = runner.invoke(app, ["report", *args])
    assert res.exit_code == 0, res.output
    assert "| LR^ML |" in res.stdout
    text = " ".join(res.output.split())
    assert "could not write the report files" in text and "Permission denied" in text


def test_report_without_its_refits_says_the_sweep_is_incomplete(tmp_path):
    """Cross-validated selections whose refit records are missing (an interrupted refit
    stage) leave cells empty: the report says so as it does for missing grid fits."""
    import sqlite3

    from typer.testing import CliRunner

    from topkbench.cli import app

    args = ["experiment=table7_smoke", "experiment.C_grid.step=4", f"results_dir={tmp_path}",
            'experiment.rows=[{row: "LR^ML", method: lr_ml}]']  # fmt: skip
    runner = CliRunner()
    assert runner.invoke(app, ["sweep", *args]).exit_code == 0
    complete = runner.invoke(app, ["report", *args])
    assert complete.exit_code == 0 and "Incomplete" not in complete.stdout
    db = tmp_path / "table7_smoke" / "records.sqlite"
    with sqlite3.connect(db) as conn:
        pattern = '%"fold":"refit"%'
        gone = conn.execute("DELETE FROM records WHERE body LIKE ?", (pattern,)).rowcount
    assert gone > 0
    res = runner.invoke(app, ["report", *args])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("> **Incomplete sweep:** 7 of 7 selected models have no test")


def test_lists_are_read_only_where_a_record_holds_a_list(tmp_path):
    """A multilabel split's grid metrics and per-class APs, and a training run's validation
    curve and losses, are lists; every other metric is one number (a list there made the
    report's average fail): such a record is skipped by load and not counted as done."""
    store = RecordStore(tmp_path, "lists")
    legit = {"val_top1": 0.5, "val_f1_micro_grid": [0.1, 0.2], "test_ap_classes": [0.3, None],
             "val_curve": [0.4, 0.5], "train_loss": [2.0, 1.0]}  # fmt: skip
    store.write("good", legit)
    store.write("bad", {"val_top1": [0.5]})
    assert store.keys() == {"good"}
    assert list(store.load()["key"]) == ["good"]
    store.close()
