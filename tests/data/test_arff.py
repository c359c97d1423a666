"""Mulan multilabel data: ARFF + label XML (:mod:`topkbench.data.arff`), the ``mulan`` dataset
kind (:func:`topkbench.data.dataset.load_dataset`) and the CLI on Mulan files.

What is tested: dense and sparse ARFF, labels anywhere in the attribute list in XML order
(DESIGN, /work/shared/DESIGN.md §6.2: Mulan's format), label counts and MEKA relation names,
nested/namespaced XML, one DataFormatError naming file, line and token per defect, holdout and
``splits_expected`` of the dataset layer, and ``topkbench train`` / ``data info`` on Mulan data
(the multilabel benchmarks of TPAMI, /work/shared/papers/002_0e6cc4a42c89f487.txt §6.3, scored
with the metrics of §3.1; protocol in DESIGN §7).

Every fixture file is written here into ``tmp_path``; nothing is downloaded."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

from topkbench.cli import app
from topkbench.config import DatasetConfig
from topkbench.data.arff import read_label_xml, read_mulan
from topkbench.data.dataset import load_dataset
from topkbench.errors import DataFormatError

# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------

DENSE = """\
% Mulan-style test file
% with comments

@relation toy

@attribute f1 numeric
@attribute lab_b {0,1}
@attribute - real
@attribute 'my feat' numeric
@attribute nom {0,1}
@attribute lab_a {0,1}
@attribute lab_c {0,1}

@data
% a comment among the data
1.5,1,2,3,0,0,1

-1,0,0.5,4,1,1,1
0,0,0,0,1,0,0
"""
DENSE_X = np.array([[1.5, 2, 3, 0], [-1, 0.5, 4, 1], [0, 0, 0, 1]])
DENSE_Y = np.array([[0, 1, 1], [1, 0, 1], [0, 0, 0]])  # columns lab_a, lab_b, lab_c

XML = """\
<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels">
<label name="lab_a"></label>
<label name="lab_b"></label>
<label name="lab_c"></label>
</labels>
"""

SPARSE = """\
@relation 'sp'
@attribute a numeric
@attribute b numeric
@attribute n {0,1}
@attribute l1 {0,1}
@attribute l2 {0,1}
@data
{0 1.5, 3 1}
{}
{3 1, 4 1}
{1 -2, 2 1}
{}
"""

HEADER = """\
@relation t
@attribute f1 numeric
@attribute f2 numeric
@attribute l1 {0,1}
@attribute l2 {0,1}

@data
1,2,0,1
% comment

3,4,1,0
"""  # the next data row is line 12


def write(path, text):
    path.write_text(text)
    return path


def toy_split(rng, n, label_names=("la", "lb", "lc"), d=4):
    """A dense Mulan ARFF text with random features and labels (labels last)."""
    lines = ["@relation gen", ""]
    lines += [f"@attribute x{j} numeric" for j in range(d)]
    lines += [f"@attribute {name} {{0,1}}" for name in label_names]
    lines += ["", "@data"]
    X = np.round(rng.normal(size=(n, d)), 3)
    Y = (X[:, : len(label_names)] + 0.3 * rng.normal(size=(n, len(label_names))) > 0).astype(int)
    for x, y in zip(X, Y, strict=True):
        lines.append(",".join([*(f"{v:g}" for v in x), *(str(v) for v in y)]))
    return "\n".join(lines) + "\n", X, Y


def toy_xml(names=("la", "lb", "lc")):
    body = "".join(f'<label name="{n}"/>' for n in names)
    return (
        f'<?xml version="1.0"?><labels xmlns="http://mulan.sourceforge.net/labels">{body}</labels>'
    )


# ---------------------------------------------------------------------------------------------
# reading ARFF and XML
# ---------------------------------------------------------------------------------------------


def test_dense_with_xml(tmp_path):
    arff = write(tmp_path / "d.arff", DENSE)
    names = read_label_xml(write(tmp_path / "d.xml", XML))
    assert names == ["lab_a", "lab_b", "lab_c"]
    data = read_mulan(arff, names)
    assert isinstance(data.X, np.ndarray)
    np.testing.assert_array_equal(data.X, DENSE_X)
    assert sp.isspmatrix_csr(data.Y) and data.Y.dtype == np.int8
    np.testing.assert_array_equal(data.Y.toarray(), DENSE_Y)
    assert set(np.unique(data.Y.data)) == {1}
    assert data.feature_names == ["f1", "-", "my feat", "nom"]
    assert data.label_names == names
    assert data.relation == "toy"


def test_xml_order_defines_label_order(tmp_path):
    arff = write(tmp_path / "d.arff", DENSE)
    data = read_mulan(arff, ["lab_c", "lab_a", "lab_b"])
    np.testing.assert_array_equal(data.Y.toarray(), DENSE_Y[:, [2, 0, 1]])
    assert data.label_names == ["lab_c", "lab_a", "lab_b"]


def test_nominal_feature_levels_are_values(tmp_path):
    text = "@relation t\n@attribute f {0,5}\n@attribute g {2,1}\n@attribute l {0,1}\n@data\n"
    arff = write(tmp_path / "n.arff", text + "5,1,1\n0,2,0\n")
    data = read_mulan(arff, n_labels=-1)
    np.testing.assert_array_equal(data.X, [[5, 1], [0, 2]])
    np.testing.assert_array_equal(data.Y.toarray(), [[1], [0]])


def test_sparse_file(tmp_path):
    data = read_mulan(write(tmp_path / "s.arff", SPARSE), n_labels=-2)
    assert sp.isspmatrix_csr(data.X) and sp.isspmatrix_csr(data.Y)
    assert data.X.shape == (5, 3) and data.Y.shape == (5, 2)
    np.testing.assert_array_equal(
        data.X.toarray(), [[1.5, 0, 0], [0, 0, 0], [0, 0, 0], [0, -2, 1], [0, 0, 0]]
    )
    np.testing.assert_array_equal(data.Y.toarray(), [[1, 0], [0, 0], [1, 1], [0, 0], [0, 0]])
    assert data.Y.dtype == np.int8
    assert data.feature_names == ["a", "b", "n"] and data.label_names == ["l1", "l2"]


def test_empty_label_sets_are_kept(tmp_path):
    data = read_mulan(write(tmp_path / "h.arff", HEADER + "5,6,0,0\n"), n_labels=-2)
    assert data.Y.shape == (3, 2)
    np.testing.assert_array_equal(data.Y.getnnz(axis=1), [1, 1, 0])
    np.testing.assert_array_equal(data.X, [[1, 2], [3, 4], [5, 6]])


@pytest.mark.parametrize(
    "n_labels, relation, labels",
    [
        (2, "t", ["lab_first", "lab_second"]),
        (-2, "t", ["lab_y", "lab_z"]),
        (None, "'name: -C -3'", ["x2", "lab_y", "lab_z"]),
        (None, "'name: -C 2'", ["lab_first", "lab_second"]),
    ],
)
def test_labels_without_xml(tmp_path, n_labels, relation, labels):
    text = (
        f"@relation {relation}\n@attribute lab_first {{0,1}}\n@attribute lab_second {{0,1}}\n"
        "@attribute x1 numeric\n@attribute x2 {0,1}\n@attribute lab_y {0,1}\n"
        "@attribute lab_z {0,1}\n@data\n1,0,0.5,1,0,1\n0,1,2,0,1,1\n"
    )
    data = read_mulan(write(tmp_path / "c.arff", text), n_labels=n_labels)
    assert data.label_names == labels
    cols = ["lab_first", "lab_second", "x1", "x2", "lab_y", "lab_z"]
    rows = np.array([[1, 0, 0.5, 1, 0, 1], [0, 1, 2, 0, 1, 1]])
    np.testing.assert_array_equal(data.Y.toarray(), rows[:, [cols.index(c) for c in labels]])
    assert data.feature_names == [c for c in cols if c not in labels]


def test_no_xml_and_no_count(tmp_path):
    with pytest.raises(DataFormatError, match="dataset.xml") as exc:
        read_mulan(write(tmp_path / "h.arff", HEADER))
    assert str(tmp_path / "h.arff") in str(exc.value)


def test_nested_xml_with_namespace(tmp_path):
    xml = write(
        tmp_path / "nested.xml",
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<labels xmlns="http://mulan.sourceforge.net/labels">\n'
        '  <label name="lab_c">\n    <label name="lab_a"/>\n  </label>\n'
        '  <label name="lab_b"></label>\n</labels>\n',
    )
    names = read_label_xml(xml)
    assert names == ["lab_c", "lab_a", "lab_b"]
    data = read_mulan(write(tmp_path / "d.arff", DENSE), names)
    np.testing.assert_array_equal(data.Y.toarray(), DENSE_Y[:, [2, 0, 1]])


def test_xml_label_missing_from_arff(tmp_path):
    with pytest.raises(DataFormatError, match="not attributes of the ARFF") as exc:
        read_mulan(write(tmp_path / "d.arff", DENSE), ["lab_a", "lab_q", "lab_c"])
    assert str(exc.value).endswith("not attributes of the ARFF file: lab_q"), str(exc.value)


def test_malformed_xml(tmp_path):
    xml = write(tmp_path / "broken.xml", '<labels><label name="a"></labels>')
    with pytest.raises(DataFormatError) as exc:
        read_label_xml(xml)
    assert "broken.xml" in str(exc.value)
    with pytest.raises(DataFormatError, match="no <label"):
        read_label_xml(write(tmp_path / "empty.xml", "<labels/>"))


# ---------------------------------------------------------------------------------------------
# malformed ARFF: file, line, token
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, token, why",
    [
        ("5,abc,1,1", "'abc'", "attribute 'f2' is numeric"),
        ("5,6,2,1", "'2'", "attribute 'l1' takes one of {0,1}"),
        ("5,6,1", "'5,6,1'", "the row has 3 values; the header declares 4"),
        ("5,?,1,1", "'?'", "missing value for attribute 'f2'"),
    ],
)
def test_malformed_dense_row(tmp_path, row, token, why):
    path = write(tmp_path / "bad.arff", HEADER + row + "\n6,7,0,0\n")
    with pytest.raises(DataFormatError) as exc:
        read_mulan(path, n_labels=-2)
    msg = str(exc.value)
    assert msg.startswith(f"{path}, line 12, token {token}"), msg
    assert why in msg
    assert exc.value.line == 12 and str(exc.value.path) == str(path)


@pytest.mark.parametrize(
    "row, token", [("{0 ?, 1 1}", "'?'"), ("{0 abc, 1 1}", "'abc'"), ("{0 1, 1 3}", "'3'")]
)
def test_malformed_sparse_row(tmp_path, row, token):
    text = "@relation t\n@attribute f1 numeric\n@attribute l1 {0,1}\n@data\n{0 1}\n\n"
    path = write(tmp_path / "bad.arff", text + row + "\n")
    with pytest.raises(DataFormatError) as exc:
        read_mulan(path, n_labels=-1)
    assert str(exc.value).startswith(f"{path}, line 7, token {token}"), str(exc.value)


@pytest.mark.parametrize(
    "row, token, why",
    [
        ("{0 1, 0 5, 1 1}", "'0 5'", "attribute 'f1' appears twice in a sparse row"),
        ("{0 1_000, 1 1}", "'0 1_000'", "'_' is not part of a number"),
    ],
)
def test_sparse_rows_that_liac_arff_would_accept_silently(tmp_path, row, token, why):
    text = "@relation t\n@attribute f1 numeric\n@attribute l1 {0,1}\n@data\n{0 1}\n\n"
    path = write(tmp_path / "bad.arff", text + row + "\n")
    with pytest.raises(DataFormatError) as exc:
        read_mulan(path, n_labels=-1)
    assert str(exc.value).startswith(f"{path}, line 7, token {token}"), str(exc.value)
    assert why in str(exc.value)


def test_digit_separators_in_dense_rows_are_refused(tmp_path):
    text = "@relation t\n@attribute f1 numeric\n@attribute l1 {0,1}\n@data\n1,0\n1_5,1\n"
    with pytest.raises(DataFormatError, match="line 6, token '1_5'"):
        read_mulan(write(tmp_path / "bad.arff", text), n_labels=-1)


@pytest.mark.parametrize(
    "header, needle",
    [
        ("@attribute f1 numeric\n@attribute l1 numeric\n", "label attribute 'l1' must be nominal"),
        ("@attribute f1 numeric\n@attribute l1 {0,1,2}\n", "label attribute 'l1' must be nominal"),
        ("@attribute f1 string\n@attribute l1 {0,1}\n", "attribute 'f1' has type STRING"),
        ("@attribute f1 {a,b}\n@attribute l1 {0,1}\n", "non-numeric values {a,b}"),
    ],
)
def test_bad_attribute_types(tmp_path, header, needle):
    row = {"string": "abc,0", "{a,b}": "a,0"}
    value = next((v for k, v in row.items() if k in header), "1,0")
    path = write(tmp_path / "t.arff", f"@relation t\n{header}@data\n{value}\n")
    with pytest.raises(DataFormatError) as exc:
        read_mulan(path, n_labels=-1)
    assert needle in str(exc.value) and str(path) in str(exc.value)


def test_sparse_nominal_must_declare_zero_first(tmp_path):
    text = "@relation t\n@attribute f1 {1,0}\n@attribute l1 {0,1}\n@data\n{0 1, 1 1}\n{}\n"
    path = write(tmp_path / "t.arff", text)
    with pytest.raises(DataFormatError, match=r"declares \{1,0\}") as exc:
        read_mulan(path, n_labels=-1)
    assert str(path) in str(exc.value)
    # the same header is fine in a dense file (no omitted values)
    dense = write(tmp_path / "dense.arff", text.replace("{0 1, 1 1}\n{}", "1,1\n0,0"))
    np.testing.assert_array_equal(read_mulan(dense, n_labels=-1).X, [[1], [0]])


def test_no_rows(tmp_path):
    path = write(tmp_path / "e.arff", HEADER.split("@data")[0] + "@data\n")
    with pytest.raises(DataFormatError, match="no data rows"):
        read_mulan(path, n_labels=-2)


def test_missing_xml_file(tmp_path):
    with pytest.raises(DataFormatError, match="cannot read") as exc:
        read_label_xml(tmp_path / "nope.xml")
    assert "nope.xml" in str(exc.value)


def test_missing_arff_file_is_a_data_format_error(tmp_path):
    with pytest.raises(DataFormatError, match="cannot read"):
        read_mulan(tmp_path / "nope.arff", n_labels=-2)


# ---------------------------------------------------------------------------------------------
# the dataset layer
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def toy_files(tmp_path):
    rng = np.random.default_rng(0)
    train_text, Xtr, Ytr = toy_split(rng, 12)
    test_text, Xte, Yte = toy_split(rng, 7)
    train = write(tmp_path / "toy-train.arff", train_text)
    test = write(tmp_path / "toy-test.arff", test_text)
    xml = write(tmp_path / "toy.xml", toy_xml())
    return train, test, xml, (Xtr, Ytr, Xte, Yte)


def test_load_mulan_dataset(toy_files):
    train, test, xml, (Xtr, Ytr, Xte, Yte) = toy_files
    cfg = DatasetConfig.from_dict(
        {
            "name": "toy",
            "kind": "mulan",
            "files": {"train": {"file": str(train)}, "test": {"file": str(test)}},
            "xml": str(xml),
        }
    )
    ds = load_dataset(cfg, 0)
    assert ds.multilabel is True
    assert ds.n_classes == 3 and ds.label_names == ["la", "lb", "lc"]
    assert list(ds.splits) == ["train", "test"]
    for (X, Y), (Xr, Yr) in zip(ds.splits.values(), [(Xtr, Ytr), (Xte, Yte)], strict=True):
        assert sp.isspmatrix_csr(Y)
        np.testing.assert_array_equal(Y.toarray(), Yr)
        np.testing.assert_allclose(X, Xr)
    assert ds.n_features == 4
    assert ds.provenance["xml"] == str(xml)
    assert ds.provenance["files"] == {"train": str(train), "test": str(test)}


def test_holdout_is_deterministic(toy_files):
    train, _, xml, (Xtr, Ytr, _, _) = toy_files
    spec = {
        "name": "toy",
        "kind": "mulan",
        "files": {"all": {"file": str(train)}},
        "xml": str(xml),
        "holdout": {"source": "all", "test_count": 3, "seed": 0},
    }
    a = load_dataset(DatasetConfig.from_dict(spec), 0)
    b = load_dataset(DatasetConfig.from_dict(spec), 5)  # the run seed does not matter
    assert list(a.splits) == ["train", "test"]
    assert a.splits["train"][0].shape[0] == 9 and a.splits["test"][0].shape[0] == 3
    for s in ("train", "test"):
        np.testing.assert_array_equal(a.splits[s][0], b.splits[s][0])
        np.testing.assert_array_equal(a.splits[s][1].toarray(), b.splits[s][1].toarray())
    # the two parts partition the file's rows, labels travel with their rows
    X = np.vstack([a.splits["train"][0], a.splits["test"][0]])
    Y = np.vstack([a.splits["train"][1].toarray(), a.splits["test"][1].toarray()])
    order = np.lexsort(X.T[::-1])
    ref = np.lexsort(Xtr.T[::-1])
    np.testing.assert_allclose(X[order], Xtr[ref])
    np.testing.assert_array_equal(Y[order], Ytr[ref])
    assert "holdout" in a.provenance


def test_splits_expected_warns_but_loads(toy_files, caplog):
    train, test, xml, _ = toy_files
    cfg = DatasetConfig.from_dict(
        {
            "name": "toy",
            "kind": "mulan",
            "files": {"train": str(train), "test": str(test)},
            "xml": str(xml),
            "splits_expected": {"train": 391, "test": 7},
        }
    )
    with caplog.at_level(logging.WARNING, logger="topkbench.data.dataset"):
        ds = load_dataset(cfg, 0)
    assert ds.splits["train"][0].shape[0] == 12
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'train' has 12 examples" in warnings[0] and "391" in warnings[0]


def test_label_attributes_differ_between_splits(tmp_path):
    rng = np.random.default_rng(1)
    train = write(tmp_path / "a.arff", toy_split(rng, 5, ("la", "lb"))[0])
    test = write(tmp_path / "b.arff", toy_split(rng, 5, ("la", "lq"))[0])
    cfg = DatasetConfig.from_dict(
        {"name": "toy", "kind": "mulan", "files": {"train": str(train), "test": str(test)}}
    )
    with pytest.raises(DataFormatError, match="dataset.xml"):
        load_dataset(cfg, 0)  # neither XML nor count
    cfg = DatasetConfig.from_dict({**cfg.as_dict(), "n_labels": -2})
    with pytest.raises(DataFormatError, match="label attributes differ") as exc:
        load_dataset(cfg, 0)
    assert str(test) in str(exc.value)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    datadir = tmp_path / "data"
    monkeypatch.setenv("TOPKBENCH_DATA", str(datadir))
    monkeypatch.setenv("COLUMNS", "400")  # rich: no wrapped table cells or messages
    return datadir


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_cli_train_svm_ml_json(toy_files, cli_env):
    train, test, xml, _ = toy_files
    res = invoke(
        "train",
        "method=svm_ml",
        "dataset=mulan",
        f"dataset.train={train}",
        f"dataset.test={test}",
        f"dataset.xml={xml}",
        "--json",
    )
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stdout
    out = json.loads(lines[0])
    assert out["method"] == "svm_ml"
    assert (out["n"], out["d"], out["m"]) == (12, 4, 3)
    assert set(out["metrics"]) == {"train", "test"}
    test_metrics = out["metrics"]["test"]
    keys = {"rloss", "hloss", "acc", "sacc", "f1_micro", "f1_macro", "f1_inst", "map"}
    assert keys <= set(test_metrics), test_metrics
    for key in keys - {"map"}:
        assert 0.0 <= test_metrics[key] <= 1.0


def test_cli_train_malformed_file(tmp_path, cli_env):
    bad = write(tmp_path / "bad.arff", HEADER + "5,abc,1,1\n")
    xml = write(tmp_path / "bad.xml", toy_xml(("l1", "l2")))
    res = invoke(
        "train",
        "method=svm_ml",
        "dataset=mulan",
        f"dataset.train={bad}",
        f"dataset.xml={xml}",
        "--json",
    )
    assert res.exit_code != 0
    text = " ".join(res.output.split())
    assert f"{bad}, line 12, token 'abc'" in text, text
    assert "Traceback" not in res.output


def test_cli_train_label_count_override(tmp_path, cli_env):
    """``+dataset.n_labels=N`` (a key the mulan config does not declare) reaches the reader."""
    arff = write(tmp_path / "h.arff", HEADER + "5,6,1,1\n")
    res = invoke(
        "train", "method=svm_ml", "dataset=mulan", f"dataset.train={arff}",
        "+dataset.n_labels=-2", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip())
    assert (out["n"], out["d"], out["m"]) == (3, 2, 2)


def test_cli_train_documented_label_count_override(tmp_path, cli_env):
    arff = write(tmp_path / "h.arff", HEADER + "5,6,1,1\n")
    res = invoke(
        "train", "method=svm_ml", "dataset=mulan", f"dataset.train={arff}",
        "dataset.n_labels=-2", "--json",
    )  # fmt: skip
    assert "Could not override" not in res.output
    assert res.exit_code == 0, res.output


def test_cli_data_info_emotions(cli_env):
    res = invoke("data", "info", "emotions")
    assert res.exit_code == 0, res.output
    assert "kind: mulan" in res.output
    for name in ("emotions-train.arff", "emotions-test.arff", "emotions.xml"):
        assert name in res.output
        assert str(cli_env / "emotions" / name) in res.output
    assert "missing" in res.output


# ---------------------------------------------------------------------------------------------
# gzipped Mulan files (the real sets are shipped so)
# ---------------------------------------------------------------------------------------------


def gzip_file(path):
    import gzip

    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return packed


def test_gzipped_arff_reads_as_the_plain_file(tmp_path):
    plain = read_mulan(write(tmp_path / "d.arff", DENSE), ["lab_a", "lab_b", "lab_c"])
    packed = gzip_file(write(tmp_path / "e.arff", DENSE))
    data = read_mulan(packed, ["lab_a", "lab_b", "lab_c"])
    np.testing.assert_array_equal(data.X, plain.X)
    np.testing.assert_array_equal(data.Y.toarray(), plain.Y.toarray())
    sparse = read_mulan(gzip_file(write(tmp_path / "s.arff", SPARSE)), n_labels=-2)
    assert sp.issparse(sparse.X) and sparse.Y.shape == (5, 2)


def test_malformed_gzipped_row_names_file_line_and_token(tmp_path):
    packed = gzip_file(write(tmp_path / "bad.arff", HEADER + "5,abc,1,1\n6,7,0,0\n"))
    with pytest.raises(DataFormatError) as exc:
        read_mulan(packed, n_labels=-2)
    assert str(exc.value).startswith(f"{packed}, line 12, token 'abc'"), str(exc.value)


def test_registry_finds_the_gzipped_copy(tmp_path, monkeypatch):
    """A registered Mulan set whose ARFF files lie gzipped under $TOPKBENCH_DATA (name.gz
    beside the registered name) loads, and its record digests are those of the files read."""
    from topkbench.data.files import file_digests, missing_files, sha256_of

    rng = np.random.default_rng(4)
    root = tmp_path / "data"
    (root / "toy").mkdir(parents=True)
    train_text, Xtr, Ytr = toy_split(rng, 9)
    test_text, _, _ = toy_split(rng, 5)
    gzip_file(write(root / "toy" / "toy-train.arff", train_text))
    gzip_file(write(root / "toy" / "toy-test.arff", test_text))
    write(root / "toy" / "toy.xml", toy_xml())
    monkeypatch.setenv("TOPKBENCH_DATA", str(root))
    cfg = DatasetConfig.from_dict({"name": "toy", "kind": "mulan", "xml": "toy.xml",
                                   "files": {"train": {"file": "toy-train.arff"},
                                             "test": {"file": "toy-test.arff"}}})  # fmt: skip
    assert missing_files(cfg) == []
    ds = load_dataset(cfg, 0)
    np.testing.assert_allclose(ds.splits["train"][0], Xtr)
    np.testing.assert_array_equal(ds.splits["train"][1].toarray(), Ytr)
    digests = file_digests(cfg)
    assert digests["toy-train.arff"] == sha256_of(root / "toy" / "toy-train.arff.gz")
