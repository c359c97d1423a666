"""``topkbench bench scale``: memory at scale, float32 memory-mapped features (n = 10^6): epoch
time and peak RSS of a worker process that trains on them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topkbench.bench.common import (
    check_sdca_methods,
    check_sdca_problem,
    method_label,
)
from topkbench.errors import ConfigError
from topkbench.losses.registry import get_method

SCALE_FORMATS = ("npy", "h5")


def write_scale_problem(
    directory, n: int, d: int, m: int, *, fmt: str = "npy", seed: int = 0,
    separation: float = 0.2, block: int = 65_536,
) -> tuple[Path, Path | None]:  # fmt: skip
    """Write the features of ``make_gaussian_problem``'s model (``separation * mu_y + N(0, I)``,
    float32, drawn block by block from one seeded stream, so memory stays ~ one block) to
    ``directory``: ``X.npy`` + ``y.npy`` (``fmt="npy"``) or ``data.h5`` with contiguous
    ``features`` and ``labels`` (``fmt="h5"``).  Returns ``(features file, labels file or
    None)``."""
    if fmt not in SCALE_FORMATS:
        raise ConfigError(f"bench scale: format must be one of {', '.join(SCALE_FORMATS)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    means = (separation * rng.normal(size=(m, d))).astype(np.float32)
    y = rng.integers(0, m, size=n).astype(np.int64)
    if fmt == "npy":
        xpath, ypath = directory / "X.npy", directory / "y.npy"
        X = np.lib.format.open_memmap(xpath, mode="w+", dtype=np.float32, shape=(n, d))
        np.save(ypath, y)
    else:
        import h5py

        xpath, ypath = directory / "data.h5", None
        fh = h5py.File(xpath, "w")
        X = fh.create_dataset("features", shape=(n, d), dtype=np.float32)
        fh.create_dataset("labels", data=y)
    for a in range(0, n, block):
        b = min(a + block, n)
        X[a:b] = means[y[a:b]] + rng.standard_normal((b - a, d), dtype=np.float32)
    if fmt == "npy":
        X.flush()
        del X
    else:
        fh.close()
    return xpath, ypath


def scale_worker(xpath: str, ypath: str | None, method: str, C: float, gamma: float, k: int,
                 epochs: int, seed: int) -> dict:  # fmt: skip
    """Load the features memory-mapped (``read_features``), train ``epochs`` SDCA epochs (gap
    certificate after each) and report times and this process's peak resident memory.  Run
    in a fresh process (:func:`bench_scale`) so that the peak is the training's alone."""
    import resource
    import warnings

    from topkbench.data.features import read_features
    from topkbench.errors import ConvergenceWarning
    from topkbench.solvers.sdca import solve_sdca

    t0 = time.perf_counter()
    ff = read_features(xpath, ypath)
    load_s = time.perf_counter() - t0
    mapped = isinstance(ff.X, np.memmap) or isinstance(getattr(ff.X, "base", None), np.memmap)
    m = int(ff.labels.max()) + 1
    from threadpoolctl import threadpool_limits

    loss_id = get_method(method).loss_id
    kernel_times: list[float] = []
    with warnings.catch_warnings(), threadpool_limits(1):  # one core, BLAS included
        warnings.simplefilter("ignore", ConvergenceWarning)
        # compile (or load from numba's cache) the float32 kernels outside the timing
        tiny = np.ascontiguousarray(ff.X[:64])
        solve_sdca(tiny, ff.labels[:64], n_classes=m, loss_id=loss_id, C=C, gamma=gamma, k=k,
                   max_epochs=1, warn=False)  # fmt: skip
        # a certificate after every epoch: each trace interval is one epoch + W resync + gap;
        # on_batch times the epoch kernel alone, as bench sdca does
        res = solve_sdca(ff.X, ff.labels, n_classes=m, loss_id=loss_id, C=C, gamma=gamma, k=k,
                         eps=1e-12, max_epochs=epochs, seed=seed, eval_every=1, warn=False,
                         on_batch=lambda _, sec: kernel_times.append(sec))  # fmt: skip
    trace = res.trace
    per_epoch = [b.seconds - a.seconds for a, b in zip(trace, trace[1:], strict=False)]
    kernel_s = float(np.median(kernel_times)) if kernel_times else float("nan")
    return {
        "kernel_sec_per_epoch": kernel_s,
        "dtype": str(ff.X.dtype),
        "memory_mapped": bool(mapped),
        "load_seconds": load_s,
        "epochs": res.epochs,
        "sec_per_epoch": float(np.median(per_epoch)) if per_epoch else float("nan"),
        "train_seconds": res.seconds,
        "relative_gap": res.relative_gap,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
    }


@dataclass
class ScaleBenchRow:
    method: str
    gamma: float
    k: int
    n: int
    d: int
    m: int
    C: float
    format: str
    dtype: str
    memory_mapped: bool
    file_gb: float
    load_seconds: float
    epochs: int
    kernel_sec_per_epoch: float  # one epoch of the bare kernel, as bench sdca times it
    sec_per_epoch: float  # median; one SDCA epoch + the W resync + the gap certificate
    train_seconds: float
    relative_gap: float
    peak_rss_gb: float  # peak resident memory of the training process (file pages included)


def bench_scale(
    n: int = 1_000_000, d: int = 128, m: int = 100, *, methods=(("svm_multi", 0.0, 1),),
    C: float = 1.0, epochs: int = 3, fmt: str = "npy", seed: int = 0, directory=None,
    progress=None,
) -> list[ScaleBenchRow]:  # fmt: skip
    """The memory run: write the float32 problem to disk (``directory``, else a
    temporary one that is removed), then train each method in a fresh Python process on the
    memory-mapped file and report its epoch time and peak resident memory."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile

    check_sdca_problem(n, d, m, C)
    if epochs < 1:
        raise ConfigError(f"bench scale: epochs must be >= 1; got {epochs}")
    check_sdca_methods(methods, m, "bench scale")
    tmp = None
    if directory is None:
        directory = tmp = tempfile.mkdtemp(prefix="topkbench-scale-")
    try:
        if progress:
            progress(f"writing {n} x {d} float32 features ({fmt})")
        xpath, ypath = write_scale_problem(directory, n, d, m, fmt=fmt, seed=seed)
        file_gb = xpath.stat().st_size / 1e9
        rows = []
        for name, gamma, k in methods:
            if progress:
                progress(f"training {method_label(name, gamma, k)} for {epochs} epochs")
            args = dict(xpath=str(xpath), ypath=None if ypath is None else str(ypath),
                        method=name, C=C, gamma=gamma, k=k, epochs=epochs, seed=seed)  # fmt: skip
            code = (
                "import json, sys; from topkbench.bench.scale import scale_worker; "
                "print(json.dumps(scale_worker(**json.loads(sys.argv[1]))))"
            )
            proc = subprocess.run(
                [sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise ConfigError(f"bench scale: training {name} failed:\n{proc.stderr[-2000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(ScaleBenchRow(
                name, gamma, k, n, d, m, C, fmt, res["dtype"], res["memory_mapped"], file_gb,
                res["load_seconds"], res["epochs"], res["kernel_sec_per_epoch"],
                res["sec_per_epoch"], res["train_seconds"],
                res["relative_gap"], res["peak_rss_gb"],
            ))  # fmt: skip
        return rows
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
