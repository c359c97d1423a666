"""Mulan multilabel data: ARFF (dense or sparse) plus the companion label XML (DESIGN §6.2).

Mulan's format (mulan.sourceforge.net/format.html): an ARFF file in which every label is a
nominal attribute with the values ``0`` and ``1``, and an XML file ``<labels><label name=..>``
naming the label attributes (possibly nested for hierarchies; the order of the XML gives the
label order, and label attributes may sit anywhere among the features).  Without an XML file
the labels can be given as a count (``n_labels``: the first N attributes, or the last N if
negative), or read from a MEKA-style relation name ``'name: -C N'`` (same sign convention).

Parsing is done by liac-arff (which reads sparse ARFF; scipy's reader does not).  Its errors
carry only a line number, so on failure we re-read that line and name the offending token and
its attribute.  Other rules, each a :class:`DataFormatError` naming file, line and token:

* missing values (``?``) are refused (Mulan's benchmarks have none; imputing would change the
  data silently);
* a nominal *feature* must have numeric values (e.g. ``{0,1}``; Mulan's text sets use these);
  a label attribute must have exactly the values ``0`` and ``1``;
* in sparse files an omitted value means the *first* declared value (ARFF semantics), so a
  nominal attribute must declare ``0`` first; string attributes are refused.

Examples with an empty label set (Mulan's delicious has some) are kept; training leaves them
out and the metrics have conventions for them (:mod:`topkbench.metrics.multilabel`).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from topkbench.data.files import READ_ERRORS, open_text, read_failure
from topkbench.errors import DataFormatError

_MEKA_C = re.compile(r"-C\s+(-?\d+)")
_NUMERIC = ("NUMERIC", "REAL", "INTEGER")


@dataclass
class MulanData:
    X: np.ndarray | sp.csr_matrix  # n x d features (CSR for sparse ARFF)
    Y: sp.csr_matrix  # n x m 0/1 label indicator (int8)
    feature_names: list[str]
    label_names: list[str]
    relation: str


def read_label_xml(path: str | Path) -> list[str]:
    """Label names in document order from a Mulan XML file (any nesting, any namespace)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else None
        raise DataFormatError(str(path), f"not a valid XML label file: {exc}", line=line) from None
    except READ_ERRORS as exc:
        raise read_failure(path, exc) from None
    names = [
        el.attrib["name"]
        for el in root.iter()
        if el.tag.rsplit("}", 1)[-1] == "label" and "name" in el.attrib
    ]
    if not names:
        raise DataFormatError(str(path), "no <label name=...> element found")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DataFormatError(str(path), f"label names occur twice: {', '.join(dup[:5])}")
    return names


def _first_data_line(path: Path) -> tuple[int, str]:
    """(1-based line number, text) of the first data row after ``@data`` (or (0, ''))."""
    in_data = False
    with open_text(path, errors="replace") as fh:
        for no, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line or line.startswith("%"):
                continue
            if in_data:
                return no, line
            if line.lower().startswith("@data"):
                in_data = True
    return 0, ""


def _data_lines(path: Path):
    """(1-based line number, text) of every data row after ``@data``."""
    in_data = False
    with open_text(path, errors="replace") as fh:
        for no, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line or line.startswith("%"):
                continue
            if in_data:
                yield no, line
            elif line.lower().startswith("@data"):
                in_data = True


def _data_line_of_row(path: Path, row: int) -> tuple[int | None, str]:
    """Line number and text of data row ``row`` (0-based), for error messages."""
    for seen, (no, line) in enumerate(_data_lines(path)):
        if seen == row:
            return no, line
    return None, ""


def _strict_rows(path: Path, attributes) -> None:
    """What liac-arff lets through silently: a sparse row naming an attribute twice (it keeps
    the last value) and digit separators in numbers (``1_000``, which float() accepts)."""
    for no, text in _data_lines(path):
        if text.startswith("{"):
            body = text.strip("{} ")
            pairs = [p.strip() for p in body.split(",") if p.strip()] if body else []
            seen: set[str] = set()
            for p in pairs:
                idx, _, val = p.partition(" ")
                if idx in seen:
                    name = attributes[int(idx)][0] if idx.isdigit() else idx
                    raise DataFormatError(
                        str(path), f"attribute {name!r} appears twice in a sparse row", no, p
                    )
                seen.add(idx)
                if "_" in val and not isinstance(attributes[int(idx)][1], (list, tuple)):
                    raise DataFormatError(str(path), "'_' is not part of a number", no, p)
        else:
            for j, tok in enumerate(t.strip() for t in text.split(",")):
                if (
                    "_" in tok
                    and j < len(attributes)
                    and not isinstance(attributes[j][1], (list, tuple))
                ):
                    raise DataFormatError(str(path), "'_' is not part of a number", no, tok)


def _line_text(path: Path, lineno: int) -> str:
    with open_text(path, errors="replace") as fh:
        for no, raw in enumerate(fh, 1):
            if no == lineno:
                return raw.strip()
    return ""


def _unquote(tok: str) -> str:
    tok = tok.strip()
    if len(tok) >= 2 and tok[0] == tok[-1] and tok[0] in "'\"":
        return tok[1:-1]
    return tok


def _bad_token(text: str, attributes) -> tuple[str | None, str]:
    """The first token of data line ``text`` that does not fit its attribute, and why."""
    n_attr = len(attributes)
    if text.startswith("{"):
        body = text.strip("{} ")
        pairs = [p.strip() for p in body.split(",") if p.strip()] if body else []
        items = []
        for p in pairs:
            parts = p.split(None, 1)
            if len(parts) != 2 or not parts[0].isdigit():
                return p, "a sparse entry must be 'index value'"
            j = int(parts[0])
            if j >= n_attr:
                return p, f"attribute index {j} is out of range (the file declares {n_attr})"
            items.append((j, parts[1]))
    else:
        tokens = [t.strip() for t in text.split(",")]
        if len(tokens) != n_attr:
            return text[:60], f"the row has {len(tokens)} values; the header declares {n_attr}"
        items = list(enumerate(tokens))
    for j, tok in items:
        name, kind = attributes[j]
        val = _unquote(tok)
        if val == "?":
            return tok, f"missing value for attribute {name!r}"
        if isinstance(kind, (list, tuple)):
            if val not in kind:
                return tok, f"attribute {name!r} takes one of {{{','.join(kind)}}}"
        elif str(kind).upper() in _NUMERIC:
            try:
                float(val)
            except ValueError:
                return tok, f"attribute {name!r} is numeric"
    return None, "malformed data row"


def _numeric_levels(path: Path, name: str, values) -> np.ndarray:
    try:
        return np.array([float(v) for v in values])
    except ValueError:
        raise DataFormatError(
            str(path),
            f"nominal attribute {name!r} has non-numeric values {{{','.join(values)}}}; "
            "only numeric nominal features (such as {0,1}) are supported",
        ) from None


def _label_columns(path, attributes, relation, label_names, n_labels) -> list[int]:
    names = [a[0] for a in attributes]
    if label_names is not None:
        pos = {n: j for j, n in enumerate(names)}
        missing = [n for n in label_names if n not in pos]
        if missing:
            raise DataFormatError(
                str(path),
                f"{len(missing)} label(s) named in the XML file are not attributes of the ARFF "
                f"file: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}",
            )
        return [pos[n] for n in label_names]
    if n_labels is None:
        match = _MEKA_C.search(relation or "")
        if not match:
            raise DataFormatError(
                str(path),
                "cannot tell which attributes are labels: give the Mulan XML file "
                "(dataset.xml=PATH) or the number of labels (dataset.n_labels=N)",
            )
        n_labels = int(match.group(1))
    n = int(n_labels)
    if n == 0 or abs(n) >= len(names):
        raise DataFormatError(str(path), f"{n} labels is impossible with {len(names)} attributes")
    return list(range(n)) if n > 0 else list(range(len(names) + n, len(names)))


def read_mulan(
    path: str | Path,
    label_names: list[str] | None = None,
    n_labels: int | None = None,
) -> MulanData:
    """Read a Mulan ARFF file; labels named by ``label_names`` (from :func:`read_label_xml`),
    else ``n_labels`` / the MEKA ``-C`` option (module docstring)."""
    import arff

    path = Path(path)
    try:
        first_no, first = _first_data_line(path)
    except READ_ERRORS as exc:
        raise read_failure(path, exc) from None
    sparse = first.startswith("{")
    try:
        with open_text(path, errors="replace") as fh:
            obj = arff.load(fh, encode_nominal=True, return_type=arff.COO if sparse else arff.DENSE)
    except arff.ArffException as exc:
        line = getattr(exc, "line", None)
        line = line if line and line > 0 else None
        token, why = None, str(exc)
        if line is not None:
            text = _line_text(path, line)
            if not text.startswith("@"):
                try:
                    with open_text(path, errors="replace") as fh:
                        header = arff.loads(
                            _header_only(fh), encode_nominal=True, return_type=arff.DENSE
                        )["attributes"]
                    token, why = _bad_token(text, header)
                    if sparse != text.startswith("{"):
                        why = "sparse and dense rows mixed in one file"
                except arff.ArffException:
                    token = text[:60]
            else:
                token = text[:60]
        raise DataFormatError(str(path), f"{why} ({type(exc).__name__})", line, token) from None
    except READ_ERRORS as exc:
        raise read_failure(path, exc) from None
    attributes = obj["attributes"]
    _strict_rows(path, attributes)
    relation = obj.get("relation", "")
    n_attr = len(attributes)
    levels = {}
    for j, (name, kind) in enumerate(attributes):
        if isinstance(kind, (list, tuple)):
            levels[j] = (name, list(kind))
        elif str(kind).upper() not in _NUMERIC:
            raise DataFormatError(
                str(path),
                f"attribute {name!r} has type {kind}; only numeric and nominal are supported",
            )
    label_cols = _label_columns(path, attributes, relation, label_names, n_labels)
    for j in label_cols:
        name, kind = attributes[j]
        if not isinstance(kind, (list, tuple)) or sorted(kind) != ["0", "1"]:
            raise DataFormatError(
                str(path),
                f"label attribute {name!r} must be nominal {{0,1}}; it is declared as {kind}",
            )
    if sparse:
        values, rows, cols = obj["data"]
        values = np.asarray(values, dtype=object)
        if any(v is None for v in values):
            pos = next(q for q, v in enumerate(values) if v is None)
            line, text = _data_line_of_row(path, int(rows[pos]))
            raise DataFormatError(
                str(path), f"missing value for attribute {attributes[cols[pos]][0]!r}", line, "?"
            )
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        vals = values.astype(np.float64)
        for j, (name, vlist) in levels.items():
            lv = _numeric_levels(path, name, vlist)
            if lv[0] != 0.0:
                raise DataFormatError(
                    str(path),
                    f"nominal attribute {name!r} declares {{{','.join(vlist)}}}: in a sparse "
                    "file an omitted value means the first one, which must be 0",
                )
            sel = cols == j
            vals[sel] = lv[vals[sel].astype(np.int64)]
        n = max(_count_rows(path), int(rows.max()) + 1 if rows.size else 0)
        M = sp.csr_matrix((vals, (rows, cols)), shape=(n, n_attr))
        M.sum_duplicates()
    else:
        data = obj["data"]
        if any(v is None for row in data for v in row):
            r = next(i for i, row in enumerate(data) if any(v is None for v in row))
            j = next(j for j, v in enumerate(data[r]) if v is None)
            line, _ = _data_line_of_row(path, r)
            raise DataFormatError(
                str(path), f"missing value for attribute {attributes[j][0]!r}", line, "?"
            )
        M = np.asarray(data, dtype=np.float64).reshape(len(data), n_attr)
        for j, (name, vlist) in levels.items():
            M[:, j] = _numeric_levels(path, name, vlist)[M[:, j].astype(np.int64)]
    if M.shape[0] == 0:
        raise DataFormatError(str(path), "no data rows after @data", first_no or None)
    feat_cols = [j for j in range(n_attr) if j not in set(label_cols)]
    if sparse:
        Mc = M.tocsc()
        X = sp.csr_matrix(Mc[:, feat_cols])
        Ylab = sp.csr_matrix(Mc[:, label_cols])
    else:
        X = np.ascontiguousarray(M[:, feat_cols])
        Ylab = sp.csr_matrix(M[:, label_cols])
    Ylab.eliminate_zeros()
    Y = sp.csr_matrix(
        (np.ones(Ylab.nnz, dtype=np.int8), Ylab.indices, Ylab.indptr), shape=Ylab.shape
    )
    Y.sort_indices()
    return MulanData(
        X=X,
        Y=Y,
        feature_names=[attributes[j][0] for j in feat_cols],
        label_names=[attributes[j][0] for j in label_cols],
        relation=relation,
    )


def _header_only(fh):
    """The header of an ARFF file followed by an empty @data section (for diagnosis)."""
    out = []
    for raw in fh:
        out.append(raw)
        if raw.strip().lower().startswith("@data"):
            break
    return "".join(out)


def _count_rows(path: Path) -> int:
    return sum(1 for _ in _data_lines(path))
