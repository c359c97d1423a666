"""Record store (DESIGN §8): one atomically written parquet file per finished record.

A record is keyed by the SHA-256 of its canonical spec (dataset, draw/split, method, parameters,
seed, stopping rule, code version).  Files are written to a temporary name in the same directory
and renamed, so an interrupted sweep never leaves a partial record, and a re-run skips every key
already present.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def spec_key(spec: dict[str, Any]) -> str:
    """Stable hash of a run spec (canonical JSON, sorted keys, floats by repr)."""
    blob = json.dumps(spec, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@lru_cache(maxsize=1)
def provenance() -> dict[str, str]:
    import numba
    import scipy

    import topkbench

    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(topkbench.__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {
        "topkbench_version": topkbench.__version__,
        "git_rev": rev or "unknown",
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "numba": numba.__version__,
    }


def _atomic_write(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RecordStore:
    """Records of one experiment under ``<root>/<experiment>/records``."""

    def __init__(self, root: str | os.PathLike, experiment: str) -> None:
        self.dir = Path(root) / experiment
        self.records = self.dir / "records"
        self.warm = self.dir / "warm"

    def has(self, key: str) -> bool:
        return (self.records / f"{key}.parquet").exists()

    def write(self, key: str, record: dict[str, Any]) -> None:
        row = {
            "key": key,
            **record,
            **provenance(),
            "finished_at": datetime.now(UTC).isoformat(),
        }
        _atomic_write(pd.DataFrame([row]), self.records / f"{key}.parquet")

    def load(self) -> pd.DataFrame:
        """All records, one row each, sorted by key.

        The per-record files are the source of truth (each is written atomically).  Reading
        tens of thousands of small files is slow (about 2.5 ms each), so the rows read are
        also kept in one consolidated file, ``records.parquet`` beside ``records/``, rewritten
        atomically whenever new records appear; rows whose record file is gone are dropped.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = {f.stem: f for f in self.records.glob("*.parquet")} if self.records.exists() else {}
        if not files:
            return pd.DataFrame()
        cache = self.dir / "records.parquet"
        parts = []
        have: set[str] = set()
        if cache.exists():
            try:
                base = pq.read_table(cache)
                keep = pa.array([k in files for k in base.column("key").to_pylist()])
                base = base.filter(keep)
                have = set(base.column("key").to_pylist())
                parts.append(base)
            except (OSError, pa.ArrowException, KeyError):
                cache.unlink(missing_ok=True)
        new = [files[k] for k in sorted(set(files) - have)]
        if new:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=4) as pool:  # pyarrow reads without the GIL
                parts += list(pool.map(pq.read_table, new))
        table = pa.concat_tables(parts, promote_options="default")
        if new:
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".parquet")
            os.close(fd)
            try:
                pq.write_table(table, tmp)
                os.replace(tmp, cache)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return table.to_pandas().sort_values("key", kind="stable").reset_index(drop=True)

    # warm-start checkpoints: the dual of the last finished point of a C path
    def save_warm(self, path_key: str, C: float, A: np.ndarray) -> None:
        self.warm.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.warm, prefix=".tmp-", suffix=".npz")
        os.close(fd)
        try:
            np.savez(tmp, C=np.float64(C), A=A)
            os.replace(tmp, self.warm / f"{path_key}.npz")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_warm(self, path_key: str) -> tuple[float, np.ndarray] | None:
        f = self.warm / f"{path_key}.npz"
        if not f.exists():
            return None
        with np.load(f) as z:
            return float(z["C"]), z["A"].copy()
