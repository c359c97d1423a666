"""Where a dataset's files are, which are missing, and what their contents hash to.

File kinds name their files under ``files:`` (split name -> file name, or the registry form
``{file: ..., url: ..., sha256: ...}``); a relative name resolves under the data directory
(:func:`data_dir`).  Record keys carry the files' SHA-256 (:func:`file_digests`), so a changed
file invalidates exactly its records.
"""

from __future__ import annotations

import lzma
import os
import zlib
from pathlib import Path
from typing import Any

from topkbench.config import DatasetConfig
from topkbench.errors import ConfigError, DataFormatError

SPLIT_ORDER = ("train", "val", "test")


def data_dirs() -> list[Path]:
    """Where datasets are looked for, in order: ``$TOPKBENCH_DATA``, a search path of
    directories (``os.pathsep``-separated, e.g. a writable one for downloads and the cache,
    then read-only collections such as ``../shared/data:../shared/data/mulan``), each
    holding ``<dataset>/<file>``; without it ``datasets/`` of the checkout (or of the cwd)."""
    env = os.environ.get("TOPKBENCH_DATA")
    if env:
        dirs = [Path(p).expanduser().resolve() for p in env.split(os.pathsep) if p]
        if dirs:
            return dirs
    repo = Path(__file__).resolve().parents[2] / "datasets"
    return [repo if repo.is_dir() else Path.cwd() / "datasets"]


def data_dir() -> Path:
    """The first directory of :func:`data_dirs`: where downloads and the parsed-data cache
    are written."""
    return data_dirs()[0]


def file_entries(cfg: DatasetConfig) -> dict[str, dict[str, Any]]:
    """The ``files:`` option as ``split -> {file, url, sha256, ...}``."""
    files = cfg.get("files") or {
        s: cfg.get(s) for s in SPLIT_ORDER if cfg.get(s)
    }  # DESIGN §9: ``dataset=libsvm dataset.train=PATH dataset.val=PATH dataset.test=PATH``
    if not isinstance(files, dict):
        raise ConfigError(f"dataset {cfg.name}: 'files' must map split names to files")
    out = {}
    for split, entry in files.items():
        if entry is None:
            continue
        out[str(split)] = {"file": entry} if isinstance(entry, str) else dict(entry)
        if not out[str(split)].get("file"):
            raise ConfigError(f"dataset {cfg.name}: files.{split} needs a 'file'")
    return out


COMPRESSED = (".gz", ".bz2", ".xz")  # suffixes read through their decompressors
# what reading a file may raise besides a parse error: the system's errors, and a damaged or
# truncated compressed stream (gzip's header and bz2 raise OSError, gzip's deflate data
# zlib.error, xz LZMAError; a stream that ends early, EOFError)
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


def read_failure(path, exc: BaseException) -> DataFormatError:
    """The one-line error of a file that :data:`READ_ERRORS` kept from being read."""
    return DataFormatError(str(path), f"cannot read: {getattr(exc, 'strerror', None) or exc}")


def open_text(path: Path, errors: str = "strict"):
    """A text stream of the file at ``path`` (UTF-8), decompressed on the fly when its name
    ends in ``.gz``, ``.bz2`` or ``.xz``."""
    import bz2
    import gzip

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(Path(path).suffix.lower())
    if opener is not None:
        return opener(path, "rt", encoding="utf-8", errors=errors)
    return open(path, encoding="utf-8", errors=errors)


def resolve_path(cfg: DatasetConfig, name: str) -> Path:
    """An absolute path, a name in the dataset's own ``dir`` (when it has one), a path existing
    relative to the cwd, or ``<dir>/<dataset>/name`` in
    the first of :func:`data_dirs` that holds it (else in the first one: where a download
    goes); where that file is absent but a compressed copy (``name.gz``, ``.bz2``, ``.xz``)
    lies beside it, the copy (the real Mulan sets are shipped gzipped)."""
    p = Path(name).expanduser()
    if cfg.get("dir") and not p.is_absolute():
        return _or_compressed(Path(cfg.get("dir")).expanduser() / p)
    if p.is_absolute() or p.exists():
        return _or_compressed(p)
    candidates = [_or_compressed(d / cfg.name / name) for d in data_dirs()]
    return next((c for c in candidates if c.exists()), candidates[0])


def _or_compressed(p: Path) -> Path:
    if not p.exists():
        for suffix in COMPRESSED:
            packed = p.with_name(p.name + suffix)
            if packed.exists():
                return packed
    return p


def extra_file_entries(cfg: DatasetConfig) -> list[dict[str, Any]]:
    """Files besides the splits' (the Mulan label XML, ``xml:``), as ``{file, url, sha256}``."""
    xml = cfg.get("xml")
    if not xml:
        return []
    return [{"file": xml} if isinstance(xml, str) else dict(xml)]


def unique_files(cfg: DatasetConfig) -> list[dict[str, Any]]:
    """File entries of ``cfg`` with duplicates (several splits in one file) merged."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in [*file_entries(cfg).values(), *extra_file_entries(cfg)]:
        for key in ("file", "labels"):
            name = entry.get(key)
            if not name:
                continue
            cur = seen.setdefault(name, {"file": name, "url": None, "sha256": None})
            if key == "file":
                cur["url"] = cur["url"] or entry.get("url")
                cur["sha256"] = cur["sha256"] or entry.get("sha256")
    return list(seen.values())


def missing_files(cfg: DatasetConfig) -> list[Path]:
    """Files of ``cfg`` that are not on disk (empty for generated datasets)."""
    paths = [resolve_path(cfg, f["file"]) for f in unique_files(cfg)]
    return [p for p in paths if not p.exists()]


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    import hashlib

    if Path(path).is_dir():
        raise DataFormatError(str(path), "is a directory; a data file is expected here")

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


_DIGESTS: dict[tuple[str, int, int], str] = {}


def cached_sha256(path: Path) -> str:
    """:func:`sha256_of`, cached per process by (path, size, mtime)."""
    st = path.stat()
    stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if stamp not in _DIGESTS:
        _DIGESTS[stamp] = sha256_of(path)
    return _DIGESTS[stamp]


def file_digests(cfg: DatasetConfig) -> dict[str, str]:
    """SHA-256 of every file ``cfg`` reads (``{name: digest}``; empty for generated data).

    Record keys carry these, so a changed file invalidates exactly its records.
    """
    out = {}
    for f in unique_files(cfg):
        path = resolve_path(cfg, f["file"])
        try:
            out[f["file"]] = cached_sha256(path)
        except OSError as exc:
            raise DataFormatError(str(path), f"cannot read it ({exc.strerror})") from None
    return out
