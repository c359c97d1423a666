"""Record store (DESIGN §8): one SQLite database per experiment, one writer.

``<results_dir>/<experiment>/records.sqlite`` holds a row per finished record, keyed by the
SHA-256 of its canonical spec (:func:`spec_key`; the sweep builds the spec from the data files'
contents, every solver setting, the protocol, the seed and the code version).  Guarantees:

* **Atomic records.** Each record is committed in its own transaction, together with the
  warm-start checkpoint rows handed on with it, so a killed run leaves a whole record or none.
* **One writer.** Only a sweep's driver process writes; it holds :class:`WriterLock` for the
  whole sweep, and a second sweep on the same directory is refused with the holder's pid.
  Workers compute and hand records to the driver.
* **Consistent reads.** The database runs in WAL mode: ``report`` (any reader) sees a snapshot
  of committed records while a sweep writes.
* **Checkpoints verified on read.** Warm-start checkpoints (the dual, n x m floats, with the
  primal and smoothing a second-order phase continues from) can be large, so they are
  ``.npz`` files written atomically under ``warm/``; the database row stores their SHA-256,
  and a file that does not match is ignored with a warning, never fatal.

The older layout (one parquet file per record under ``records/``) had no content-addressed
keys; such a directory is refused with a message rather than mixed with new records.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import logging
import math
import os
import platform
import sqlite3
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topkbench.atomic import replace_file, write_bytes, write_outputs
from topkbench.errors import ConfigError

log = logging.getLogger(__name__)

SCHEMA = 1
DB_NAME = "records.sqlite"


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


def _json_default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return list(v)
    raise TypeError(f"record value of type {type(v).__name__} cannot be stored: {v!r}")


def _encode(record: dict[str, Any]) -> str:
    return json.dumps(record, default=_json_default, allow_nan=True, separators=(",", ":"))


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint file and the SHA-256 the store recorded for it: what the driver hands a
    worker, which reads the (possibly large) dual itself."""

    C: float
    path: str
    sha256: str


def read_checkpoint(ref: CheckpointRef):
    """The :class:`~topkbench.model.WarmStart` a checkpoint holds, or None when its file is
    missing or does not match its SHA-256 (logged: the fit then starts cold, never fails).
    A checkpoint of an older store holds the dual alone (``.npy``)."""
    from topkbench.model import WarmStart

    try:
        data = Path(ref.path).read_bytes()
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ValueError("its SHA-256 does not match the record store")
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            warm = WarmStart(ref.C, loaded)
        else:
            with loaded:
                gamma = loaded["gamma_start"] if "gamma_start" in loaded else None
                warm = WarmStart(ref.C, loaded["A"], loaded["W"] if "W" in loaded else None,
                                 None if gamma is None else float(gamma))  # fmt: skip
    except (OSError, ValueError, KeyError) as exc:
        log.warning("warm-start checkpoint %s ignored (%s); the fit starts cold", ref.path, exc)
        return None
    arrays = [warm.A] + ([] if warm.W is None else [warm.W])
    if not math.isfinite(ref.C) or not all(np.isfinite(a).all() for a in arrays):
        log.warning("warm-start checkpoint %s ignored (not finite)", ref.path)
        return None
    return warm


class StoreError(ConfigError):
    """The results directory cannot be used (locked, unwritable, an old layout)."""


def _store_errors(method):
    """Turn the faults a store meets on disk into one-line :class:`StoreError` s: a damaged
    database file (``sqlite3.DatabaseError`` from pages overwritten anywhere, not only a bad
    header) and a full disk (``ENOSPC`` from SQLite or from a checkpoint file), saying where
    and how to go on.  Records committed before the fault are kept either way."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            if "disk is full" in str(exc) or "disk I/O error" in str(exc):
                raise StoreError(_disk_full(self.db, exc)) from None
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            raise _damaged(self.db, exc) from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise StoreError(_disk_full(exc.filename or self.dir, exc)) from None
            raise

    return wrapper


# the fields of a record that hold numbers (or null), besides the metrics (val_*, test_*), and
# those that hold text
_NUMBER_FIELDS = frozenset({
    "C", "gamma", "k", "eps", "theta", "delta", "init_C", "time_limit", "max_epochs", "draw",
    "data_seed", "primal", "dual", "relative_gap", "epochs", "train_seconds", "plain_epochs",
    "newton_iterations", "accelerated_epochs", "n_train", "n_features", "n_classes",
})  # fmt: skip
_TEXT_FIELDS = ("key", "experiment", "method", "row", "dataset", "status", "fold")


def _list_metric(name: str) -> bool:
    """The metrics that hold a list of numbers: a multilabel split's partition metrics on
    the threshold grid (``<split>_<metric>_grid``) and its per-class APs
    (``<split>_ap_classes``), and a training run's validation curve (``val_curve``).  Every
    other metric is one number, which selection averages."""
    return name.endswith(("_grid", "_ap_classes")) or name == "val_curve"


def _record_fault(rec) -> str | None:
    """Why a stored record cannot be read (None: it can): not an object, a text field that
    is not text, a number field or metric that is not a number."""

    def number(v) -> bool:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))

    if not isinstance(rec, dict):
        return "its body is not a JSON object"
    for name in _TEXT_FIELDS:
        if name in rec and not isinstance(rec[name], str):
            return f"{name} is {rec[name]!r}, not text"
    for name, v in rec.items():
        metric = name.startswith(("val_", "test_"))
        if name in _NUMBER_FIELDS or metric:
            listed = metric and _list_metric(name)
            if not (number(v) or (listed and isinstance(v, list) and all(map(number, v)))):
                return f"{name} is {v!r}, not a number"
    return None


def _read_records(conn: sqlite3.Connection):
    """``(key, record, fault)`` of every stored record, in key order: ``fault`` says why the
    record cannot be read (:func:`_record_fault`; its body is then not used), or is None."""
    for key, body in conn.execute("SELECT key, body FROM records ORDER BY key"):
        try:
            rec = json.loads(body)
        except (TypeError, ValueError):
            yield key, None, "its body is not JSON"
        else:
            yield key, rec, _record_fault(rec)


def _damaged(db, exc) -> StoreError:
    return StoreError(
        f"cannot open record store {db}: {exc}",
        hint=f"check it with: sqlite3 {db} 'PRAGMA integrity_check'; if it is damaged, move "
        f"it aside (mv {db} {db}.damaged) and re-run the sweep, which recomputes its records",
    )


def _disk_full(where, exc) -> str:
    return (
        f"no space left on the disk while writing {where} ({exc}); the records finished "
        "before it are kept, and re-running the same command resumes from them once there "
        "is space"
    )


class RecordStore:
    """Records of one experiment under ``<root>/<experiment>/``.

    Readers (``has``, ``keys``, ``load``, ``load_warm``) work on any store; ``write`` and
    ``save_warm`` are for the process that holds the :class:`WriterLock`.
    """

    def __init__(self, root: str | os.PathLike, experiment: str) -> None:
        self.dir = Path(root) / experiment
        self.db = self.dir / DB_NAME
        self.warm = self.dir / "warm"
        self._conn: sqlite3.Connection | None = None
        self._writable = False
        legacy = self.dir / "records"
        if legacy.is_dir() and any(legacy.glob("*.parquet")):
            raise StoreError(
                f"{self.dir} holds records of an older topkbench (records/*.parquet), whose keys "
                "do not cover the data files' contents and every solver setting",
                hint=f"move it away or delete it, then re-run the sweep: rm -r {self.dir}",
            )

    # -- connection --------------------------------------------------------------------------
    def _connect(self, create: bool) -> sqlite3.Connection | None:
        if self._conn is not None and (self._writable or not create):
            return self._conn
        if self._conn is not None:  # a reader so far: reopen for writing
            self.close()
        if not create and not self.db.exists():
            return None
        if create:
            if self.dir.exists() and not self.dir.is_dir():
                raise StoreError(f"results path {self.dir} is a file, not a directory")
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create results directory {self.dir}: {exc}") from None
        try:
            if create:
                conn = sqlite3.connect(self.db, timeout=60.0, isolation_level=None)
            else:  # readers never write, not even the schema (a report may run read-only)
                conn = self._reader()
            if create:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, body TEXT NOT "
                    "NULL, finished_at TEXT NOT NULL)"
                )
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS checkpoints (key TEXT PRIMARY KEY, C REAL NOT "
                    "NULL, file TEXT NOT NULL, sha256 TEXT NOT NULL)"
                )
                conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
            schema = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
        except sqlite3.OperationalError as exc:
            if not create and "no such table" in str(exc):
                conn.close()  # a writer is creating the store this moment: nothing to read yet
                return None
            raise StoreError(f"cannot open record store {self.db}: {exc}") from None
        except sqlite3.Error as exc:
            raise _damaged(self.db, exc) from None
        if schema is None or int(schema[0]) != SCHEMA:
            conn.close()
            raise StoreError(
                f"{self.db} has store schema {schema and schema[0]}, this topkbench reads "
                f"schema {SCHEMA}",
                hint=f"use another results_dir, or delete {self.dir}",
            )
        self._conn = conn
        self._writable = create
        return conn

    def _reader(self) -> sqlite3.Connection:
        """A read-only connection; on a directory we cannot write to (an archived results
        copy) SQLite cannot create its WAL index, so the file is then opened as immutable."""
        uri = self.db.resolve().as_uri()
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60.0, isolation_level=None)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.OperationalError:
            conn.close()
            conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- records -----------------------------------------------------------------------------
    @_store_errors
    def has(self, key: str) -> bool:
        conn = self._connect(create=False)
        return bool(conn and conn.execute("SELECT 1 FROM records WHERE key = ?", (key,)).fetchone())

    @_store_errors
    def keys(self) -> set[str]:
        """The keys of the records :meth:`load` reads: one it skips (edited by hand) is not
        done, so that a sweep computes it again and replaces it."""
        conn = self._connect(create=False)
        return {k for k, _, fault in _read_records(conn) if fault is None} if conn else set()

    @_store_errors
    def write(
        self,
        key: str,
        record: dict[str, Any],
        checkpoints: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        """Commit one record (replacing a record of the same key) and its warm-start
        checkpoints ``(checkpoint key, WarmStart)`` in one transaction."""
        row = {"key": key, **record, **provenance()}
        now = datetime.now(UTC).isoformat()
        row["finished_at"] = now
        cks = [self._write_checkpoint_file(*c) for c in checkpoints]
        conn = self._connect(create=True)
        with self._transaction(conn):
            conn.execute(
                "INSERT OR REPLACE INTO records VALUES (?, ?, ?)", (key, _encode(row), now)
            )
            for ck in cks:
                conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)", ck)
        self._drop_older_checkpoint_files(cks)

    def _drop_older_checkpoint_files(self, cks) -> None:
        """Remove the dual-only ``.npy`` file an older store kept under a key whose
        checkpoint row now names the ``.npz`` (after the commit: until then the row named it)."""
        for key, *_ in cks:
            (self.warm / f"{key}.npy").unlink(missing_ok=True)

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection):
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(f"record store {self.db} is not writable: {exc}") from None
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @_store_errors
    def load(self) -> pd.DataFrame:
        """All records (one consistent snapshot), one row each, sorted by key.  A record whose
        body is not a JSON object, or holds a value of the wrong type (edited by hand), is
        skipped with a warning that counts such records: a sweep computes it again."""
        conn = self._connect(create=False)
        if conn is None:
            return pd.DataFrame()
        rows, faults = [], []
        for key, rec, fault in _read_records(conn):
            if fault is None:
                rows.append(rec)
            else:
                faults.append(f"{key} ({fault})")
        if faults:
            log.warning(
                "%d record(s) of %s cannot be read and are skipped (edited by hand?), e.g. %s",
                len(faults), self.db, faults[0],
            )  # fmt: skip
        return pd.DataFrame(rows)

    # -- warm-start checkpoints --------------------------------------------------------------
    def _write_checkpoint_file(self, key: str, warm):
        """Write the :class:`~topkbench.model.WarmStart` ``warm`` under ``key`` (``.npz``,
        atomically); returns its row of the checkpoints table."""
        self.warm.mkdir(parents=True, exist_ok=True)
        arrays = {"A": np.ascontiguousarray(warm.A)}
        if warm.W is not None:
            arrays["W"] = np.ascontiguousarray(warm.W)
        if warm.gamma_start is not None:
            arrays["gamma_start"] = np.float64(warm.gamma_start)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        data = buf.getvalue()
        name = f"{key}.npz"
        replace_file(self.warm / name, write_bytes(data))
        return key, float(warm.C), name, hashlib.sha256(data).hexdigest()

    @_store_errors
    def save_warm(self, key: str, warm) -> None:
        """Store the :class:`~topkbench.model.WarmStart` ``warm`` under ``key``."""
        ck = self._write_checkpoint_file(key, warm)
        conn = self._connect(create=True)
        with self._transaction(conn):
            conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)", ck)
        self._drop_older_checkpoint_files([ck])

    @_store_errors
    def checkpoint_ref(self, key: str) -> CheckpointRef | None:
        """Where the checkpoint under ``key`` lives (read it with :func:`read_checkpoint`)."""
        conn = self._connect(create=False)
        row = (
            conn
            and conn.execute(
                "SELECT C, file, sha256 FROM checkpoints WHERE key = ?", (key,)
            ).fetchone()
        )
        if not row:
            return None
        C, name, digest = row
        return CheckpointRef(float(C), str(self.warm / name), digest)

    def load_warm(self, key: str):
        """The checkpoint (a :class:`~topkbench.model.WarmStart`) under ``key``, or None
        (absent, or its file is missing or does not match its recorded SHA-256: logged and
        ignored)."""
        ref = self.checkpoint_ref(key)
        return None if ref is None else read_checkpoint(ref)

    def export(self, path: str | os.PathLike, also: tuple[pd.DataFrame, ...] = ()) -> Path:
        """Write every record to ``path`` (``.parquet`` or ``.csv``, atomically: a failed
        write leaves ``path`` as it was), followed by the records ``also`` (another store's,
        of the same experiment).  A store without records, and a path that is a directory or
        cannot be written, are refused with one line naming them."""
        path = Path(path)
        if path.is_dir():
            raise StoreError(
                f"cannot export to {path}: it is a directory",
                hint=f"give a file name, e.g. --out {path / 'records.csv'}",
            )
        if path.suffix not in (".parquet", ".csv"):
            raise ConfigError(f"export to {path}: use a .parquet or .csv file name")
        df = self.load()
        if also and not df.empty:
            df = pd.concat([df, *also], ignore_index=True)
        if df.empty:
            raise StoreError(
                f"no records in {self.dir}: nothing to export",
                hint="run `topkbench sweep` with the same overrides first",
            )
        for col in df.columns:  # JSON keeps mixed types (eval_every "auto" or 3): as text
            if df[col].dtype != object:
                continue
            if df[col].map(lambda v: isinstance(v, (dict, list))).any():
                df[col] = df[col].map(lambda v: None if v is None else json.dumps(v))
            elif df[col].map(type).nunique() > 1:
                df[col] = df[col].map(lambda v: None if v is None else str(v))

        def fill(tmp: Path) -> None:
            if path.suffix == ".parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_csv(tmp, index=False)

        return write_outputs([(path, fill)])[0]


def read_records(root: str | os.PathLike, experiment: str) -> tuple[pd.DataFrame, Path]:
    """Every record of the store of ``experiment`` under ``root`` (one snapshot, the store
    closed again; empty where there is none yet) and the store's directory."""
    store = RecordStore(root, experiment)
    try:
        return store.load(), store.dir
    finally:
        store.close()


class WriterLock:
    """Exclusive right to write an experiment's records (held by a sweep's driver).

    An advisory ``flock`` on ``<dir>/sweep.lock``; the kernel drops it when the holder dies, so
    a killed sweep never leaves a stale lock.  The file names the holder for the refusal.
    """

    def __init__(self, store: RecordStore) -> None:
        self.path = store.dir / "sweep.lock"
        self._fh = None

    def __enter__(self) -> WriterLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+")  # noqa: SIM115 - held for the lock's lifetime
        except OSError as exc:
            raise StoreError(f"cannot use results directory {self.path.parent}: {exc}") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StoreError(
                f"another sweep is writing to {self.path.parent} ({holder})",
                hint="wait for it to finish, or give this sweep another results_dir",
            ) from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {platform.node()}, since "
                     f"{datetime.now(UTC):%H:%M:%S} UTC")  # fmt: skip
            fh.flush()
        except OSError as exc:  # a full disk refuses even the holder's line
            fcntl.flock(fh, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):  # close flushes what the disk refused again
                fh.close()
            if exc.errno == errno.ENOSPC:
                raise StoreError(_disk_full(self.path, exc)) from None
            raise StoreError(f"cannot use results directory {self.path.parent}: {exc}") from None
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
