"""Files written whole or not at all: each into a temporary file beside its target, then
renamed onto it (a rename within a directory is atomic on POSIX), so that a full disk, a
read-only directory or an interrupted run never leaves a torn file where a reader looks."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from topkbench.errors import OutputError


def _read_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


# read once: setting the umask to read it is process-wide, and would race between threads
_UMASK = _read_umask()


def replace_files(items: Sequence[tuple[Path, Callable[[Path], None]]]) -> list[Path]:
    """Write each ``(path, write)``: ``write(tmp)`` fills a temporary file beside ``path``
    (its name ends in ``path``'s suffix, so that writers which infer a format or a
    compression from it, as pandas does for ``.csv.gz``, infer the target's); only when
    every one is written are they renamed onto their paths, so that a failure while writing
    leaves every target as it was (its temporary files removed, the error raised, with the
    paths already renamed, if a rename failed, in its ``replaced`` attribute).  The files get
    the permissions of a plain ``open`` (``0666`` less the umask; ``mkstemp``'s ``0600``
    would hide them from other users).  Returns the paths."""
    temps: list[str] = []
    replaced: list[Path] = []
    try:
        for path, write in items:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.",
                                       suffix=f".tmp{path.suffix}")  # fmt: skip
            os.close(fd)
            temps.append(tmp)
            write(Path(tmp))
            os.chmod(tmp, 0o666 & ~_UMASK)
        for (path, _), tmp in zip(items, temps, strict=True):
            os.replace(tmp, path)
            replaced.append(Path(path))
    except BaseException as exc:
        for tmp in temps:
            Path(tmp).unlink(missing_ok=True)
        exc.replaced = replaced  # type: ignore[attr-defined]
        raise
    return [Path(path) for path, _ in items]


def write_outputs(items: Sequence[tuple[Path, Callable[[Path], None]]], *,
                  lost: str = "") -> list[Path]:  # fmt: skip
    """:func:`replace_files` for a command's output files: a disk that refuses them ends in
    one :class:`~topkbench.errors.OutputError` naming the file, the reason and what was kept
    (the files as they were, and ``lost``, what the command did that is not on disk)."""
    try:
        return replace_files(items)
    except OSError as exc:
        paths = [Path(p) for p, _ in items]
        where = paths[0] if len(paths) == 1 else paths[0].parent
        replaced = getattr(exc, "replaced", [])
        if replaced:
            kept = f"{', '.join(p.name for p in replaced)} written, the others as they were"
        elif not any(p.exists() for p in paths):
            kept = "nothing written"
        else:
            kept = (
                f"{where} is as it was" if len(paths) == 1 else "the files there are as they were"
            )
        if lost:
            kept += f"; {lost}"
        folder = paths[0].parent
        reason = exc.strerror or str(exc)
        if next((p for p in (folder, *folder.parents) if p.exists()), folder).is_file():
            reason = f"a file stands where its folder {folder} would be"
        raise OutputError(where, reason, kept) from None


def replace_file(path: Path, write: Callable[[Path], None]) -> Path:
    """:func:`replace_files` for one file."""
    return replace_files([(Path(path), write)])[0]


def write_bytes(data: bytes) -> Callable[[Path], None]:
    """A writer of :func:`replace_files` that writes ``data``."""
    return lambda tmp: tmp.write_bytes(data)


def write_text(text: str) -> Callable[[Path], None]:
    """A writer of :func:`replace_files` that writes ``text`` (UTF-8)."""
    return lambda tmp: tmp.write_text(text, encoding="utf-8")


__all__ = ["replace_file", "replace_files", "write_bytes", "write_outputs", "write_text"]
