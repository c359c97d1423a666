"""One error hierarchy for the whole package (STYLE.md, "Errors, logging, progress").

Only the CLI turns these into a short message and an exit code.
"""

from __future__ import annotations


class TopkbenchError(Exception):
    """Base class of every error topkbench raises on purpose."""

    exit_code = 1
    hint: str | None = None


class ConfigError(TopkbenchError, ValueError):
    """An impossible parameter or an unknown name; the message gives the valid range."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class InputError(TopkbenchError, ValueError):
    """Arrays passed to the library are unusable (NaN/Inf, wrong shapes, non-integer labels)."""

    exit_code = 3


class DataFormatError(TopkbenchError, ValueError):
    """A data file is malformed; names the file, line and offending token."""

    exit_code = 3

    def __init__(
        self,
        path: str,
        message: str,
        line: int | None = None,
        token: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if token is not None:
            where += f", token {token!r}"
        super().__init__(f"{where}: {message}")
        self.path, self.line, self.token, self.hint = path, line, token, hint


class DatasetNotFoundError(TopkbenchError, FileNotFoundError):
    """A dataset's files are not where we looked."""

    exit_code = 4

    def __init__(self, name: str, searched: list[str], hint: str | None = None) -> None:
        super().__init__(f"dataset {name!r} not found; searched: {', '.join(searched)}")
        self.name, self.searched, self.hint = name, searched, hint


class SolverError(TopkbenchError, RuntimeError):
    """A solver failed in a way that is not mere non-convergence."""

    exit_code = 5


class OutputError(TopkbenchError, OSError):
    """An output file could not be written (a full or read-only disk); names the file, the
    reason and what was kept."""

    exit_code = 6

    def __init__(self, path, reason: str, kept: str, hint: str | None = None) -> None:
        super().__init__(f"cannot write {path}: {reason}; {kept}")
        self.path, self.hint = path, hint


class ClusterError(TopkbenchError, RuntimeError):
    """A Dask cluster that cannot be reached, lost its workers or its scheduler, or whose
    workers died running a task; finished records are kept."""

    exit_code = 8

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class MemoryLimitError(TopkbenchError, MemoryError):
    """Memory ran out, or the address-space limit (``ulimit -v``) is below what the numerical
    libraries map; finished records are kept."""

    exit_code = 7

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def address_space_limit() -> int | None:
    """The process's address-space limit in bytes (``ulimit -v``, ``prlimit --as``), or None
    where there is none.  Under one, each BLAS thread's buffer is a mapping the limit may
    refuse (OpenBLAS then retries it forever), so the runs keep the BLAS to one thread."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


class ConvergenceWarning(UserWarning):
    """A solver stopped on its budget (epochs or time) before reaching the requested gap."""
