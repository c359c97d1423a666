"""Files written whole or not at all: each into a temporary file beside its target, then
renamed onto it (a rename within a directory is atomic on POSIX), so that a full disk, a
read-only directory or an interrupted run never leaves a torn file where a reader looks."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def replace_files(items: Sequence[tuple[Path, Callable[[Path], None]]]) -> list[Path]:
    """Write each ``(path, write)``: ``write(tmp)`` fills a temporary file beside ``path``;
    only when every one is written are they renamed onto their paths, so that a failure
    while writing leaves every target as it was (its temporary files removed, the error
    raised).  The files get the permissions of a plain ``open`` (``0666`` less the umask;
    ``mkstemp``'s ``0600`` would hide them from other users).  Returns the paths."""
    umask = os.umask(0)
    os.umask(umask)
    temps: list[str] = []
    try:
        for path, write in items:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            temps.append(tmp)
            write(Path(tmp))
            os.chmod(tmp, 0o666 & ~umask)
        for (path, _), tmp in zip(items, temps, strict=True):
            os.replace(tmp, path)
    except BaseException:
        for tmp in temps:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [Path(path) for path, _ in items]


def replace_file(path: Path, write: Callable[[Path], None]) -> Path:
    """:func:`replace_files` for one file."""
    return replace_files([(Path(path), write)])[0]


def write_bytes(data: bytes) -> Callable[[Path], None]:
    """A writer of :func:`replace_files` that writes ``data``."""
    return lambda tmp: tmp.write_bytes(data)


def write_text(text: str) -> Callable[[Path], None]:
    """A writer of :func:`replace_files` that writes ``text`` (UTF-8)."""
    return lambda tmp: tmp.write_text(text, encoding="utf-8")


__all__ = ["replace_file", "replace_files", "write_bytes", "write_text"]
