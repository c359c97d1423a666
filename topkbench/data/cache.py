"""Parsed and preprocessed file datasets cached on disk, shared by a sweep's workers."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np

from topkbench.atomic import replace_file
from topkbench.config import DatasetConfig
from topkbench.data.dataset import Dataset, load_dataset
from topkbench.data.files import data_dir, missing_files, resolve_path, unique_files

log = logging.getLogger(__name__)


# what a cached dataset holds for a given spec; bumped when that changes (2: float32: true
# stores sparse values as float32 too; 3: CSR features at least 2/3 dense are stored dense)
_CACHE_FORMAT = 3


def _cache_path(cfg: DatasetConfig) -> Path:
    import hashlib
    import json

    stamp = []
    for f in unique_files(cfg):
        st = resolve_path(cfg, f["file"]).stat()
        stamp.append([f["file"], st.st_size, st.st_mtime_ns])
    blob = json.dumps([_CACHE_FORMAT, cfg.spec_dict(), stamp], sort_keys=True, default=repr)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
    return data_dir() / ".cache" / f"{cfg.name}-{digest}.pkl"


def load_dataset_cached(cfg: DatasetConfig, seed: int) -> Dataset:
    """:func:`load_dataset`, with parsed/preprocessed LibSVM and .mat data cached on disk.

    Parsing ALOI's text or computing News20's PCA takes long and every worker process of a
    sweep needs the data: the first load writes ``<data dir>/.cache/<name>-<hash>.pkl``
    (atomically; the hash covers the dataset spec and the files' sizes and mtimes, so editing a
    file or an option invalidates it).  File datasets do not depend on ``seed``.

    Dense feature matrices go to ``<name>-<hash>.<split>.npy`` beside the pickle and are loaded
    memory-mapped (read-only): the pool / Dask workers of a sweep then share one copy in the
    page cache instead of holding one each.  The ``.npy`` files are written before
    the pickle, so a pickle only exists once its matrices do.
    """
    import pickle

    if cfg.kind not in ("libsvm", "mat", "mulan") or missing_files(cfg):
        return load_dataset(cfg, seed)
    path = _cache_path(cfg)
    if path.exists():
        try:
            with open(path, "rb") as fh:
                ds = pickle.load(fh)
            for split, (X, y) in ds.splits.items():
                if isinstance(X, str) and X.startswith(_NPY_REF):
                    X = np.load(path.parent / X[len(_NPY_REF) :], mmap_mode="r")
                    ds.splits[split] = (X, y)
            return ds
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            path.unlink(missing_ok=True)
    ds = load_dataset(cfg, seed)
    shell = copy.copy(ds)
    shell.splits = dict(ds.splits)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for split, (X, y) in ds.splits.items():
            if isinstance(X, np.ndarray) and X.dtype.kind == "f":
                name = f"{path.stem}.{split}.npy"
                _atomic_write(path.parent / name, lambda fh, X=X: np.save(fh, X))
                shell.splits[split] = (_NPY_REF + name, y)
        _atomic_write(path, lambda fh: pickle.dump(shell, fh, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError as exc:  # a read-only data directory or a full disk: the cache is optional
        log.debug("dataset cache not written under %s: %s", path.parent, exc)
    return ds


_NPY_REF = "npy-cache:"


def _atomic_write(path: Path, write) -> None:
    """``write(fh)`` into a file opened for writing bytes, replaced atomically
    (:func:`topkbench.atomic.replace_file`)."""

    def fill(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            write(fh)

    replace_file(path, fill)
