"""LibSVM/SVMlight reader (DESIGN §6.2): agreement with scikit-learn's reader on generated files,
compressed files, label mapping, and one clear DataFormatError (file, line, token) per defect."""

from __future__ import annotations

import bz2
import gzip
import lzma

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from topkbench.data.libsvm import encode_labels, read_libsvm
from topkbench.errors import DataFormatError, DatasetNotFoundError


def _random_sparse(n=30, d=12, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * (rng.random(size=(n, d)) < 0.4)
    return X


@pytest.mark.parametrize("zero_based", [False, True])
def test_multiclass_matches_sklearn(tmp_path, zero_based):
    X = _random_sparse()
    y = np.random.default_rng(1).choice([-1, 3, 7, 12], size=X.shape[0])
    path = tmp_path / "train.txt"
    dump_svmlight_file(X, y, str(path), zero_based=zero_based)
    got = read_libsvm(path, zero_based=zero_based, n_features=X.shape[1])
    Xs, ys = load_svmlight_file(str(path), zero_based=zero_based, n_features=X.shape[1])
    np.testing.assert_allclose(got.X.toarray(), Xs.toarray(), rtol=0, atol=0)
    assert [labs[0] for labs in got.labels] == ys.astype(int).tolist()
    codes, classes = encode_labels(got.labels)
    assert classes == [-1, 3, 7, 12]  # sorted by value, mapping kept
    np.testing.assert_array_equal(np.asarray(classes)[codes], y)


def test_multilabel_matches_sklearn_including_empty_label_sets(tmp_path):
    X = _random_sparse(n=25, d=8, seed=2)
    rng = np.random.default_rng(3)
    Y = (rng.random(size=(25, 5)) < 0.35).astype(int)
    Y[4] = 0  # an example with no labels (as in Mulan's delicious)
    path = tmp_path / "ml.txt"
    dump_svmlight_file(X, Y, str(path), multilabel=True, zero_based=False)
    got = read_libsvm(path, multilabel=True, n_features=8)
    Xs, ys = load_svmlight_file(str(path), multilabel=True, n_features=8, zero_based=False)
    np.testing.assert_array_equal(got.X.toarray(), Xs.toarray())
    assert [tuple(sorted(labs)) for labs in got.labels] == [
        tuple(sorted(int(v) for v in labs)) for labs in ys
    ]
    assert got.labels[4] == ()
    Yenc, classes = encode_labels(got.labels, classes=[0, 1, 2, 3, 4])
    assert sp.issparse(Yenc)
    np.testing.assert_array_equal(Yenc.toarray(), Y)


@pytest.mark.parametrize(
    "suffix, opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)]
)
def test_compressed_files(tmp_path, suffix, opener):
    text = "2 1:0.5 3:-1\n1 2:2e-3\n"
    path = tmp_path / f"f.txt{suffix}"
    with opener(path, "wt") as fh:
        fh.write(text)
    got = read_libsvm(path)
    np.testing.assert_array_equal(got.X.toarray(), [[0.5, 0, -1], [0, 2e-3, 0]])
    assert got.labels == [(2,), (1,)]


def test_dense_storage_comments_blank_lines_and_integral_float_labels(tmp_path):
    path = tmp_path / "dense.txt"
    path.write_text("# header comment\n+1 1:1 2:0 3:2\n\n-1.0 1:0 2:3 3:0  # trailing\n")
    got = read_libsvm(path)
    np.testing.assert_array_equal(got.X.toarray(), [[1, 0, 2], [0, 3, 0]])
    assert got.labels == [(1,), (-1,)]


BAD_LINES = [
    # (file text, message fragment, line, token, multilabel)
    ("1 1:1\n2.5 1:1\n", "labels must be integers", 2, "2.5", False),
    ("cat 1:1\n", "labels must be integers", 1, "cat", False),
    ("1 1:1\n1:0.5 2:1\n", "missing label", 2, "1:0.5", False),
    ("1 1:1 3\n", "expected index:value", 1, "3", False),
    ("1 1:1 2:\n", "expected index:value", 1, "2:", False),
    ("1 x:1\n", "feature index is not an integer", 1, "x:1", False),
    ("1 0:1\n", "feature indices start at 1", 1, "0:1", False),
    ("1 3:1 2:1\n", "strictly increasing", 1, "2:1", False),
    ("1 2:1 2:1\n", "strictly increasing", 1, "2:1", False),
    ("1 1:nan\n", "NaN or infinite", 1, "1:nan", False),
    ("1 1:inf\n", "NaN or infinite", 1, "1:inf", False),
    ("1 1:abc\n", "not a number", 1, "1:abc", False),
    ("1,2 1:1\n", "several labels", 1, "1,2", False),
    ("1,,2 1:1\n", "empty label", 1, "1,,2", True),
    ("1,1 1:1\n", "repeated", 1, "1,1", True),
    ("1 qid:3 1:1\n", "qid", 1, "qid:3", False),
    ("1 1:1_000\n", "'_' is not part of a number", 1, "1:1_000", False),
    ("1 1_0:1\n", "'_' is not part of a number", 1, "1_0:1", False),
    ("1_0 1:1\n", "'_' is not part of a number", 1, "1_0", False),
]


@pytest.mark.parametrize("text, fragment, line, token, multilabel", BAD_LINES)
def test_malformed_lines_name_file_line_and_token(
    tmp_path, text, fragment, line, token, multilabel
):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(DataFormatError) as err:
        read_libsvm(path, multilabel=multilabel)
    e = err.value
    assert (e.path, e.line, e.token) == (str(path), line, token)
    assert fragment in str(e)
    assert str(path) in str(e) and f"line {line}" in str(e)


def test_index_beyond_n_features(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("1 1:1\n1 5:1\n")
    with pytest.raises(DataFormatError, match="exceeds n_features = 4") as err:
        read_libsvm(path, n_features=4)
    assert err.value.line == 2


@pytest.mark.parametrize("content", [b"", b"\n\n# only comments\n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(DataFormatError, match="no examples"):
        read_libsvm(path)


def test_binary_garbage_and_missing_file(tmp_path):
    path = tmp_path / "bin.txt"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(DataFormatError, match="not a UTF-8 text file"):
        read_libsvm(path)
    with pytest.raises(DatasetNotFoundError):
        read_libsvm(tmp_path / "nope.txt")
    gz = tmp_path / "broken.txt.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(DataFormatError, match="cannot read"):
        read_libsvm(gz)


def test_encode_labels_with_training_classes_rejects_unknown_label():
    codes, classes = encode_labels([(5,), (2,), (5,)])
    assert classes == [2, 5] and codes.tolist() == [1, 0, 1]
    with pytest.raises(DataFormatError, match="example 2 has label 9"):
        encode_labels([(5,), (9,)], classes=classes, source="test.txt")


@pytest.mark.parametrize("token", ["99999999999999999999", "1e308", "-9223372036854775809"])
@pytest.mark.parametrize("multilabel", [False, True])
def test_label_beyond_int64_names_file_line_and_token(tmp_path, token, multilabel):
    path = tmp_path / "big.svm"
    path.write_text(f"1 1:0.5\n{token} 1:1\n")
    with pytest.raises(DataFormatError) as exc:
        read_libsvm(path, multilabel=multilabel)
    assert str(exc.value).startswith(f"{path}, line 2, token '{token}'"), str(exc.value)
    assert "64-bit" in str(exc.value)
    path.write_text("1 1:0.5\n9223372036854775807 1:1\n")  # the largest int64 is a label
    assert read_libsvm(path, multilabel=multilabel).labels[1] == (9223372036854775807,)
