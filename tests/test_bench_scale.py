"""``topkbench bench scale`` on a tiny size: the problem is written block by block as float32
(.npy and contiguous HDF5), trained memory-mapped in a fresh process, and reported with its
peak resident memory; HDF5 features are memory-mapped only when stored contiguously."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from topkbench.bench.scale import bench_scale, write_scale_problem
from topkbench.cli import app
from topkbench.data.features import read_features
from topkbench.errors import ConfigError


def test_both_formats_hold_the_same_seeded_problem(tmp_path):
    xa, ya = write_scale_problem(tmp_path / "a", 1000, 5, 3, fmt="npy", seed=4, block=300)
    xb, _ = write_scale_problem(tmp_path / "b", 1000, 5, 3, fmt="h5", seed=4, block=1000)
    fa, fb = read_features(xa, ya), read_features(xb)
    assert fa.X.dtype == np.float32 and isinstance(fa.X, np.memmap)
    assert isinstance(fb.X, np.memmap)  # contiguous HDF5: mapped, not read
    np.testing.assert_array_equal(np.asarray(fa.X), np.asarray(fb.X))  # block size irrelevant
    np.testing.assert_array_equal(fa.labels, fb.labels)


def test_chunked_or_compressed_hdf5_is_read_into_memory(tmp_path):
    X = np.arange(24, dtype=np.float32).reshape(6, 4)
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=X, compression="gzip")
        f.create_dataset("labels", data=np.array([0, 1, 2, 0, 1, 2]))
    ff = read_features(path)
    assert not isinstance(ff.X, np.memmap)
    np.testing.assert_array_equal(ff.X, X)


def test_scale_run_trains_memory_mapped_and_reports_memory(tmp_path):
    rows = bench_scale(
        3000, 8, 4, methods=(("svm_multi", 0.0, 1), ("lr_multi", 0.0, 1)), epochs=2,
        fmt="h5", directory=tmp_path,
    )  # fmt: skip
    for r in rows:
        assert r.dtype == "float32" and r.memory_mapped and r.epochs == 2
        assert 0.0 < r.kernel_sec_per_epoch and 0.0 < r.sec_per_epoch
        assert 0.01 < r.peak_rss_gb < 4.0
        assert 0.0 <= r.relative_gap < 1.0
    assert (tmp_path / "data.h5").exists()  # a given directory is kept


def test_cli_writes_csv_and_refuses_bad_input(tmp_path):
    out = tmp_path / "scale.csv"
    args = ["bench", "scale", "--n", "500", "--d", "4", "--m", "3", "--epochs", "1"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert pd.read_csv(out)["memory_mapped"].all()
    res = CliRunner().invoke(app, [*args, "--format", "csv", "--out", str(out)])
    assert res.exit_code != 0 and "format must be one of npy, h5" in res.output
    with pytest.raises(ConfigError, match="not an SDCA method"):
        bench_scale(100, 2, 3, methods=(("topk_ent_tr", 0.0, 1),))
