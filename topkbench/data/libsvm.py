"""LibSVM / SVMlight text files (DESIGN §6.2): multiclass and multilabel, optionally compressed.

Format, one example per line::

    <labels> <index>:<value> <index>:<value> ... [# comment]

* ``<labels>`` is one integer (multiclass) or a comma-separated list ``l1,l2,...``
  (multilabel; an example with no labels starts directly with its first feature).  Integral
  floats such as ``1.0`` or ``+1`` are accepted (LibSVM writes them); anything else is an error.
* ``<index>`` is 1-based (``zero_based=True`` for files written 0-based) and strictly increasing
  within a line; ``<value>`` is a finite float.  Features not listed are 0 (sparse storage);
  dense files simply list every index.
* Blank lines and lines starting with ``#`` are not examples and are skipped (line numbers in
  error messages still count them).
* ``.gz``, ``.bz2`` and ``.xz`` files are decompressed on the fly.

Every malformed line raises :class:`~topkbench.errors.DataFormatError` naming the file, the
line number and the offending token; nothing is skipped silently.  Labels are returned as the
raw integers of the file; :func:`encode_labels` maps them to ``0..m-1`` and keeps the mapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from topkbench.data.files import READ_ERRORS, open_text, read_failure
from topkbench.errors import DataFormatError, DatasetNotFoundError


@dataclass
class LibsvmData:
    """Features (CSR, float64) and per-example raw label tuples, as read from one file."""

    X: sp.csr_matrix
    labels: list[tuple[int, ...]]
    path: str

    @property
    def n_examples(self) -> int:
        return self.X.shape[0]


def _strict(token: str, path: str, lineno: int, whole: str | None = None) -> None:
    """Python's int() and float() accept digit separators (``1_000``); the format does not."""
    if "_" in token:
        raise DataFormatError(path, "'_' is not part of a number here", lineno, whole or token)


_INT64 = 2**63  # labels are stored as int64


def _parse_label(token: str, path: str, lineno: int) -> int:
    _strict(token, path, lineno)
    try:
        value = int(token)
    except ValueError:
        try:
            number = float(token)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number == int(number)):
            raise DataFormatError(path, "labels must be integers", lineno, token) from None
        value = int(number)
    if not -_INT64 <= value < _INT64:
        raise DataFormatError(
            path, "label out of the 64-bit integer range (|label| < 2^63)", lineno, token
        )
    return value


def read_libsvm(
    path: str | Path,
    *,
    multilabel: bool = False,
    n_features: int | None = None,
    zero_based: bool = False,
) -> LibsvmData:
    """Read one LibSVM/SVMlight file (see the module docstring).

    ``n_features`` fixes the number of columns (files of one dataset can differ in their largest
    index); an index beyond it is an error.  Without it, the largest index in the file is used.
    """
    path = Path(path)
    name = str(path)
    if not path.is_file():
        raise DatasetNotFoundError(name, [str(path.resolve())], hint="check the path")
    offset = 0 if zero_based else 1
    indptr = [0]
    indices: list[int] = []
    data: list[float] = []
    labels: list[tuple[int, ...]] = []
    max_index = -1
    try:
        with open_text(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                line = raw.split("#", 1)[0]
                tokens = line.split()
                if not tokens:
                    continue
                first = tokens[0]
                if ":" in first:
                    if not multilabel:
                        raise DataFormatError(
                            name,
                            "missing label (a multiclass line starts with its label)",
                            lineno,
                            first,
                            hint="for multilabel files use multilabel=True",
                        )
                    labs: tuple[int, ...] = ()
                    feats = tokens
                else:
                    feats = tokens[1:]
                    if multilabel:
                        parts = first.split(",")
                        if any(p == "" for p in parts):
                            raise DataFormatError(
                                name, "empty label in a label list", lineno, first
                            )
                        labs = tuple(_parse_label(p, name, lineno) for p in parts)
                        if len(set(labs)) != len(labs):
                            raise DataFormatError(name, "a label is repeated", lineno, first)
                    else:
                        if "," in first:
                            raise DataFormatError(
                                name,
                                "several labels on a multiclass line",
                                lineno,
                                first,
                                hint="for multilabel files use multilabel=True",
                            )
                        labs = (_parse_label(first, name, lineno),)
                prev = -1
                for tok in feats:
                    idx_s, sep, val_s = tok.partition(":")
                    if not sep or not idx_s or not val_s:
                        raise DataFormatError(name, "expected index:value", lineno, tok)
                    _strict(tok, name, lineno)
                    if idx_s == "qid":
                        raise DataFormatError(
                            name, "qid (ranking) fields are not supported", lineno, tok
                        )
                    try:
                        idx = int(idx_s) - offset
                    except ValueError:
                        raise DataFormatError(
                            name, "feature index is not an integer", lineno, tok
                        ) from None
                    if idx < 0:
                        base = "0" if zero_based else "1"
                        raise DataFormatError(name, f"feature indices start at {base}", lineno, tok)
                    if idx <= prev:
                        raise DataFormatError(
                            name, "feature indices must be strictly increasing", lineno, tok
                        )
                    if n_features is not None and idx >= n_features:
                        raise DataFormatError(
                            name,
                            f"feature index exceeds n_features = {n_features}",
                            lineno,
                            tok,
                        )
                    try:
                        val = float(val_s)
                    except ValueError:
                        raise DataFormatError(
                            name, "feature value is not a number", lineno, tok
                        ) from None
                    if not math.isfinite(val):
                        raise DataFormatError(name, "feature value is NaN or infinite", lineno, tok)
                    prev = idx
                    if val != 0.0:
                        indices.append(idx)
                        data.append(val)
                if prev > max_index:
                    max_index = prev
                labels.append(labs)
                indptr.append(len(indices))
    except UnicodeDecodeError as exc:
        raise DataFormatError(name, f"not a UTF-8 text file ({exc.reason})") from None
    except READ_ERRORS as exc:
        raise read_failure(name, exc) from None
    if not labels:
        raise DataFormatError(name, "no examples (the file is empty)")
    d = n_features if n_features is not None else max_index + 1
    X = sp.csr_matrix(
        (np.asarray(data, dtype=np.float64), np.asarray(indices, dtype=np.int64), indptr),
        shape=(len(labels), max(d, 0)),
    )
    return LibsvmData(X=X, labels=labels, path=name)


def encode_labels(
    labels: list[tuple[int, ...]], classes: list[int] | None = None, *, source: str = "labels"
):
    """Map raw integer labels to ``0..m-1`` (sorted by value) and return ``(codes, classes)``.

    Multiclass input (every tuple of length 1) gives an int64 array; otherwise a CSR 0/1
    indicator (n x m).  ``classes`` fixes the mapping (e.g. the training file's); a label
    outside it is an error naming the example.
    """
    if classes is None:
        classes = sorted({lab for labs in labels for lab in labs})
    lookup = {c: j for j, c in enumerate(classes)}
    for i, labs in enumerate(labels):
        for lab in labs:
            if lab not in lookup:
                raise DataFormatError(
                    source,
                    f"example {i + 1} has label {lab}, which is not among the "
                    f"{len(classes)} training classes",
                )
    if all(len(labs) == 1 for labs in labels):
        return np.array([lookup[labs[0]] for labs in labels], dtype=np.int64), list(classes)
    rows = np.repeat(np.arange(len(labels)), [len(labs) for labs in labels])
    cols = np.array([lookup[lab] for labs in labels for lab in labs], dtype=np.int64)
    Y = sp.csr_matrix(
        (np.ones(len(cols), dtype=np.int8), (rows, cols)), shape=(len(labels), len(classes))
    )
    return Y, list(classes)
