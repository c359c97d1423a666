"""Saved models: a round trip keeps every score and the certificate, for linear, RBF,
precomputed-kernel and nonconvex models and for models that carry their feature scaling;
bad files and data of the wrong width get one-line errors; ``train --save`` and ``predict``
work end to end on LibSVM files."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

import topkbench
from topkbench.cli import app
from topkbench.data.synthetic import make_gaussian
from topkbench.errors import ConfigError, DataFormatError, InputError
from topkbench.feature_map import FeatureMap
from topkbench.persist import read_metadata

runner = CliRunner()


def _problem(seed=0, m=5, n=80, d=4):
    part = make_gaussian(seed, n_train=n, n_val=0, n_test=0, n_features=d, n_classes=m,
                         separation=1.0)["train"]  # fmt: skip
    return part.X, part.y


@pytest.mark.parametrize(
    "method, kwargs",
    [
        ("svm_multi", {}),
        ("topk_svm_alpha", {"k": 2}),
        ("topk_ent_tr", {"k": 2}),  # nonconvex: no dual, NaN gap
        ("svm_multi", {"kernel": "rbf", "theta": 0.3}),
        ("wtopk_svm", {"k": 2, "weights": "linear", "max_epochs": 50}),
    ],
)
def test_round_trip_keeps_scores_and_certificate(tmp_path, method, kwargs):
    X, y = _problem()
    model = topkbench.fit(X, y, method, C=2.0, warn=False, **kwargs)
    model.classes = np.array(["a", "b", "c", "d", "e"])
    path = model.save(tmp_path / "model.npz", training_data={"note": "unit test"})
    back = topkbench.load(path)
    np.testing.assert_array_equal(back.decision_function(X), model.decision_function(X))
    for name in ("method", "params", "status", "epochs", "kernel", "theta"):
        assert getattr(back, name) == getattr(model, name)
    for name in ("primal", "dual", "relative_gap"):
        a, b = getattr(back, name), getattr(model, name)
        assert (math.isnan(a) and math.isnan(b)) or a == b
    assert list(back.classes) == list("abcde")
    assert back.info["training_data"] == {"note": "unit test"}
    meta = read_metadata(path)
    assert meta["versions"]["topkbench"] == topkbench.__version__
    with np.load(path, allow_pickle=False) as npz:  # an object array would raise here
        assert all(npz[name].dtype != object for name in npz.files)


def test_precomputed_kernel_model_round_trip(tmp_path):
    X, y = _problem()
    K = X @ X.T
    model = topkbench.fit(None, y, "lr_multi", K=K, C=1.0)
    back = topkbench.load(model.save(tmp_path / "k.npz"))
    np.testing.assert_array_equal(back.decision_function(K=K[:7]), model.decision_function(K=K[:7]))
    with pytest.raises(InputError, match="precomputed kernel"):
        back.decision_function(X)


def test_feature_map_takes_raw_features(tmp_path):
    X, y = _problem(d=3)
    raw = 40.0 * X + 7.0
    shift, div = raw.mean(0), raw.std(0)
    fmap = FeatureMap(3, shift, div, bias=1.0)
    Z = fmap.apply(raw)
    np.testing.assert_allclose(Z[:, :3], (raw - shift) / div)
    np.testing.assert_array_equal(Z[:, 3], 1.0)
    model = topkbench.fit(Z, y, "lr_multi", C=1.0)
    saved = replace(model, feature_map=fmap).save(tmp_path / "m.npz")
    back = topkbench.load(saved)
    np.testing.assert_allclose(back.decision_function(raw), model.decision_function(Z))
    np.testing.assert_allclose(back.decision_function(sp.csr_matrix(raw)),
                               model.decision_function(Z))  # fmt: skip
    assert back.n_features == 3
    with pytest.raises(InputError, match="X has 4 features, the model was trained on 3"):
        back.decision_function(Z)
    maxabs = FeatureMap(3, np.zeros(3), np.abs(raw).max(0))
    np.testing.assert_allclose(maxabs.apply(sp.csr_matrix(raw)).toarray(),
                               raw / np.abs(raw).max(0))  # fmt: skip


def test_bad_model_files_are_refused(tmp_path):
    with pytest.raises(InputError, match="no such model file"):
        topkbench.load(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_text("not a zip")
    with pytest.raises(DataFormatError, match="junk.npz: not a saved topkbench model"):
        topkbench.load(junk)
    other = tmp_path / "other.npz"
    np.savez(other, W=np.zeros((2, 2)))
    with pytest.raises(DataFormatError, match="no metadata"):
        topkbench.load(other)
    X, y = _problem()
    path = topkbench.fit(X, y, "lr_multi").save(tmp_path / "m.npz")
    with np.load(path) as npz:
        arrays = dict(npz)
    meta = json.loads(str(arrays["metadata"]))
    meta["format_version"] = 99
    arrays["metadata"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "future.npz", **arrays)
    with pytest.raises(DataFormatError, match="version 99"):
        topkbench.load(tmp_path / "future.npz")


def test_saved_linear_model_cannot_warm_start(tmp_path):
    X, y = _problem()
    back = topkbench.load(topkbench.fit(X, y, "lr_multi").save(tmp_path / "m.npz"))
    assert back.A is None
    with pytest.raises(ConfigError, match="keeps no dual"):
        topkbench.fit(X, y, "lr_multi", warm_start=back)


def test_estimator_model_saves_its_classes_and_data_hash(tmp_path):
    from topkbench.estimators import TopKClassifier

    X, y = _problem()
    names = np.array(["ant", "bee", "cat", "dog", "eel"])[y]
    clf = TopKClassifier(method="lr_multi").fit(X, names)
    back = topkbench.load(clf.model_.save(tmp_path / "m.npz"))
    assert list(back.classes) == list(clf.classes_)
    assert len(back.info["training_data"]["arrays_blake2b"]) == 32
    np.testing.assert_array_equal(back.decision_function(X), clf.model_.decision_function(X))


def test_predict_matches_labels_that_are_equal_numbers(tmp_path):
    """A classifier fitted on float labels (scikit-learn's LibSVM reader returns floats) has
    classes 0.0, 3.0, ...; a LibSVM file's labels 0, 3, ... are those classes (matched by
    their text, "0" against "0.0", every example counted a miss and every label 'not a
    class')."""
    from sklearn.datasets import load_svmlight_file

    from topkbench.estimators import TopKClassifier
    from topkbench.predict import predict_file

    X, y = _problem()
    _write_libsvm(tmp_path / "train.svm", X, y, labels_offset=0)
    Xf, yf = load_svmlight_file(str(tmp_path / "train.svm"), n_features=X.shape[1])
    assert yf.dtype.kind == "f"
    clf = TopKClassifier(method="lr_multi").fit(Xf, yf)
    path = clf.model_.save(tmp_path / "m.npz")
    result = predict_file(path, tmp_path / "train.svm", top=1)
    assert result.notes == []
    assert result.metric == ("top-1 accuracy", pytest.approx(clf.score(Xf, yf)))
    assert result.metric[1] > 0.5


def _write_libsvm(path, X, y, labels_offset=2):
    with open(path, "w") as fh:
        for row, label in zip(X, y, strict=True):
            feats = " ".join(f"{j + 1}:{v:.6g}" for j, v in enumerate(row))
            fh.write(f"{3 * label + labels_offset} {feats}\n")


def test_train_save_then_predict_on_libsvm_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parts = make_gaussian(1, n_train=300, n_val=0, n_test=120, n_features=6, n_classes=5,
                          separation=1.0)  # fmt: skip
    _write_libsvm("train.svm", 30 * parts["train"].X + 5, parts["train"].y)
    _write_libsvm("test.svm", 30 * parts["test"].X + 5, parts["test"].y)
    res = runner.invoke(app, ["train", "method=lr_multi", "C=0.5", "dataset=libsvm",
                              "dataset.train=train.svm", "dataset.test=test.svm",
                              "dataset.bias=1", "dataset.scale=standard", "topk=[1,3]",
                              "--save", "model.npz", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    trained = json.loads(res.stdout.strip().splitlines()[-1])
    meta = read_metadata("model.npz")
    assert meta["training_data"]["dataset"] == "libsvm"
    assert set(meta["training_data"]["file_sha256"]) == {"train.svm", "test.svm"}
    assert meta["feature_map"] == {"bias": 1.0, "n_features": 6}
    res = runner.invoke(app, ["predict", "model.npz", "test.svm", "--top", "3", "--out", "p.csv"])
    assert res.exit_code == 0, res.output
    import pandas as pd

    frame = pd.read_csv("p.csv")
    assert list(frame.columns) == ["row", "label_1", "label_2", "label_3", "score_1", "score_2",
                                   "score_3", "true"]  # fmt: skip
    assert len(frame) == 120
    assert (frame["score_1"] >= frame["score_2"]).all()
    top3 = frame[["label_1", "label_2", "label_3"]].to_numpy() == frame[["true"]].to_numpy()
    assert top3.any(axis=1).mean() == pytest.approx(trained["metrics"]["test"]["top3"])
    top1 = (frame["label_1"] == frame["true"]).mean()
    assert top1 == pytest.approx(trained["metrics"]["test"]["top1"])
    assert "top-3 accuracy on test.svm" in res.output
    # the raw .npy features of the test file, without labels, give the same predictions
    np.save("test.npy", 30 * parts["test"].X + 5)
    res = runner.invoke(app, ["predict", "model.npz", "test.npy", "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "accuracy" not in res.output
    # data of the wrong width: a one-line error naming both widths
    np.save("wide.npy", np.zeros((4, 7)))
    res = runner.invoke(app, ["predict", "model.npz", "wide.npy"])
    assert res.exit_code == 3
    assert "X has 7 features, the model was trained on 6" in res.output
    res = runner.invoke(app, ["predict", "model.npz", "test.svm", "--top", "9"])
    assert res.exit_code == 2 and "--top must be in [1, 5]" in res.output


def test_train_save_refuses_pca_features(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parts = make_gaussian(2, n_train=60, n_val=0, n_test=20, n_features=4, n_classes=3,
                          separation=1.0)  # fmt: skip
    _write_libsvm("train.svm", parts["train"].X, parts["train"].y)
    res = runner.invoke(app, ["train", "method=lr_multi", "dataset=libsvm",
                              "dataset.train=train.svm", "+dataset.pca=2",
                              "--save", "m.npz"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "PCA" in res.output
    assert not (tmp_path / "m.npz").exists()


def test_predict_reads_multilabel_files(tmp_path):
    from topkbench.data.synthetic import make_multilabel
    from topkbench.predict import predict_file

    part = make_multilabel(0, n_train=80, n_val=0, n_test=0, n_features=4, n_labels=4)["train"]
    Y = part.Y.toarray() if sp.issparse(part.Y) else np.asarray(part.Y)
    model = topkbench.fit(part.X, Y, "lr_ml", C=1.0)
    path = model.save(tmp_path / "ml.npz")
    with open(tmp_path / "ml.svm", "w") as fh:
        for row, labels in zip(part.X, Y, strict=True):
            labs = ",".join(str(j) for j in np.flatnonzero(labels))
            feats = " ".join(f"{j + 1}:{v:.6g}" for j, v in enumerate(row))
            fh.write(f"{labs} {feats}\n")
    result = predict_file(path, tmp_path / "ml.svm", top=2)
    name, value = result.metric
    S = model.decision_function(part.X)
    top2 = np.argsort(-S, axis=1, kind="stable")[:, :2]
    expected = np.mean([Y[i, top2[i]].sum() / 2 for i in range(len(Y))])
    assert name == "precision@2" and value == pytest.approx(expected)


def test_saved_file_is_readable_by_others(tmp_path):
    import os
    import stat

    X, y = _problem()
    path = topkbench.fit(X, y, "lr_multi").save(tmp_path / "m.npz")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask


def test_predict_without_top_takes_a_k_the_model_has(tmp_path):
    """--top's default: min(5, m - 1) (a 4-class model gets 3, not an error), or the k of a
    top-k model; the command says which it took."""
    from topkbench.predict import predict_file

    parts = make_gaussian(3, n_train=80, n_val=0, n_test=10, n_features=3, n_classes=4,
                          separation=1.0)  # fmt: skip
    X, y = parts["train"].X, parts["train"].y
    plain = topkbench.fit(X, y, "lr_multi").save(tmp_path / "lr.npz")
    topk = topkbench.fit(X, y, "topk_svm_beta", k=2, max_epochs=50, warn=False).save(
        tmp_path / "t2.npz")  # fmt: skip
    np.save(tmp_path / "x.npy", parts["test"].X)
    first = predict_file(plain, tmp_path / "x.npy")
    assert [c for c in first.frame.columns if c.startswith("label_")] == [
        "label_1", "label_2", "label_3"]  # fmt: skip
    assert first.top_rule.startswith("k = 3 = min(5, m - 1) for this 4-class model")
    second = predict_file(topk, tmp_path / "x.npy")
    assert second.top_rule.startswith("k = 2, the model's k")
    assert "label_3" not in second.frame.columns
    res = runner.invoke(app, ["predict", str(plain), str(tmp_path / "x.npy")])
    assert res.exit_code == 0, res.output
    assert "--top not given: k = 3" in " ".join(res.output.split())


# --- damaged and edited model files ------------------------------------------------------------


def _edited(tmp_path, name, *, meta=None, arrays=None, drop=(), raw_meta=None, model=None):
    """A saved model rewritten with metadata fields and arrays replaced (or dropped)."""
    from topkbench.persist import read_metadata

    X, y = _problem()
    src = (model or topkbench.fit(X, y, "lr_multi")).save(tmp_path / "src.npz")
    with np.load(src, allow_pickle=False) as npz:
        entries = {k: npz[k] for k in npz.files if k != "metadata"}
    md = read_metadata(src)
    md.update(meta or {})
    entries.update(arrays or {})
    for k in drop:
        entries.pop(k, None)
    entries["metadata"] = np.array(raw_meta if raw_meta is not None else json.dumps(md))
    path = tmp_path / name
    with open(path, "wb") as fh:
        np.savez(fh, **entries)
    return path


@pytest.mark.parametrize(
    "edit,reason",
    [
        (dict(arrays={"W": np.full((4, 5), np.nan)}), "W holds non-finite values"),
        (dict(arrays={"W": np.zeros(12)}), "W must be a 2-D numeric array; it is 1-D"),
        (dict(arrays={"W": np.array(["a", "b"])}), "array 'W' is not numeric"),
        (
            dict(
                arrays={"W": np.zeros((7, 5))}, meta={"feature_map": {"n_features": 3, "bias": 1.0}}
            ),
            "W has 7 rows; expected 4",
        ),
        (dict(meta={"classes": ["a", "b"]}), "2 classes listed for 5 score columns"),
        (dict(meta={"kernel": "rbf", "theta": 1.0}), "no A array"),
        (dict(meta={"method": 3}), "metadata field 'method' must be a method name"),
        (dict(meta={"method": "nope"}), "unknown method 'nope'"),
        (
            dict(meta={"certificate": {"status": "converged", "primal": "x"}}),
            "certificate field 'primal' must be a number",
        ),
        (
            dict(meta={"feature_map": {"n_features": "3", "bias": 1.0}}),
            "feature_map.n_features must be a positive integer",
        ),
        (dict(raw_meta="{not json"), "its metadata is not JSON"),
        (dict(raw_meta="[1, 2]"), "its metadata is not a JSON object"),
        (dict(drop=("W",)), "no W array"),
        (dict(meta={"classes": ["a", "b", "a", "c", "d"]}), "class label 'a' is listed twice"),
        (dict(meta={"classes": [1, 2, 3, 4, 2]}), "class label 2 is listed twice"),
        (dict(meta={"classes": [0, 1, 2, 3, 1.0]}), "class label 1.0 is listed twice (as 1)"),
        (dict(meta={"params": {"C": 1.0, "k": 99}}),
         "params.k must be in [1, 4] for a model of 5 classes; got 99"),
        (dict(meta={"classes": ["a", ["b"], "c", "d", "e"]}), "class label ['b']: each label"),
        (dict(arrays={"W": np.zeros((4, 0))}, meta={"classes": None, "n_classes": 0}),
         "it has no class (0 score columns)"),
        (dict(meta={"params": {"C": 1.0, "k": "abc"}}), "params.k must be an integer >= 1"),
        (dict(meta={"params": {"C": -1.0, "k": 1}}), "params.C must be a positive number"),
        (dict(meta={"feature_map": {"n_features": 4, "bias": 0.0}},
              arrays={"shift": np.zeros(4), "div": np.array([1.0, -2.0, 1.0, 1.0])}),
         "scaling divisor div[1] = -2.0; each must be a positive finite number"),
        (dict(meta={"feature_map": {"n_features": 4, "bias": 0.0}},
              arrays={"shift": np.zeros(4), "div": np.array([1.0, 1.0, 0.0, 1.0])}),
         "scaling divisor div[2] = 0.0"),
        (dict(meta={"feature_map": {"n_features": 4, "bias": 0.0}},
              arrays={"shift": np.zeros(4), "div": np.array([np.nan, 1.0, 1.0, 1.0])}),
         "scaling divisor div[0] = nan"),
    ],
)  # fmt: skip
def test_inconsistent_model_files_are_refused_at_load(tmp_path, edit, reason):
    """Edited metadata or arrays never make a model that predicts: topkbench.load and predict
    both say 'not a saved topkbench model (reason)'."""
    path = _edited(tmp_path, "bad.npz", **edit)
    with pytest.raises(DataFormatError) as exc:
        topkbench.load(path)
    assert f"not a saved topkbench model ({reason}" in str(exc.value), str(exc.value)
    np.save(tmp_path / "x.npy", np.zeros((2, 3)))
    res = runner.invoke(app, ["predict", str(path), str(tmp_path / "x.npy")])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "not a saved topkbench model" in " ".join(res.output.split())


def test_rbf_model_without_its_training_features_is_refused(tmp_path):
    X, y = _problem()
    rbf = topkbench.fit(X, y, "lr_multi", kernel="rbf", theta=0.5)
    path = _edited(tmp_path, "rbf.npz", model=rbf, drop=("X_train",))
    with pytest.raises(DataFormatError, match=r"not a saved topkbench model \(no X_train array"):
        topkbench.load(path)
    path = _edited(tmp_path, "rbf2.npz", model=rbf, meta={"theta": -1.0})
    with pytest.raises(DataFormatError, match="an RBF model needs theta > 0"):
        topkbench.load(path)


@pytest.mark.parametrize("damage", ["empty", "truncated", "object", "single"])
def test_damaged_model_files_are_refused(tmp_path, damage):
    X, y = _problem()
    good = topkbench.fit(X, y, "lr_multi").save(tmp_path / "good.npz")
    path = tmp_path / "bad.npz"
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif damage == "object":
        with open(path, "wb") as fh:
            np.savez(fh, W=np.array([{"a": 1}], dtype=object), metadata=np.array("{}"))
    else:
        np.save(path.with_suffix(".npy"), np.zeros(3))
        path = path.with_suffix(".npy")
    with pytest.raises(DataFormatError) as exc:
        topkbench.load(path)
    text = str(exc.value)
    assert "not a saved topkbench model (" in text and "allow_pickle" not in text, text


def test_a_header_declaring_more_data_than_the_file_holds_is_refused(tmp_path):
    """An entry whose .npy header declares W of 4 x 10^11 in a file of a few kB is refused
    before anything is allocated (it ended in a raw MemoryError)."""
    import io
    import zipfile

    path = _edited(tmp_path, "huge.npz")
    header = np.lib.format.header_data_from_array_1_0(np.zeros((4, 5)))
    header["shape"] = (4, 10**11)
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, header)
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist() if n != "W.npy"}
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in entries.items():
            zf.writestr(n, data)
        zf.writestr("W.npy", member.getvalue() + np.zeros(20).tobytes())
    huge = r"entry 'W' declares shape \(4, 100000000000\)"
    with pytest.raises(DataFormatError, match=huge) as exc:
        topkbench.load(path)
    assert str(exc.value).count("not a saved topkbench model") == 1, str(exc.value)


def test_outputs_the_disk_refuses_are_one_line_naming_what_was_kept(tmp_path, monkeypatch):
    """train --save, predict --out and bench protocol --out on a full disk, or where a file
    stands in place of their folder: one error line naming the path and what was kept (they
    ended in a raw OSError), and nothing torn left behind."""
    import errno

    monkeypatch.chdir(tmp_path)
    X, y = _problem()
    np.save("x.npy", X)
    topkbench.fit(X, y, "lr_multi").save("model.npz")
    (tmp_path / "afile").write_text("")

    def one_line(args, expected):
        res = runner.invoke(app, args)
        assert res.exit_code not in (0, None) and "Traceback" not in res.output, res.output
        assert expected in " ".join(res.output.split()), res.output

    one_line(["train", "method=lr_multi", "dataset.n_test=100", "--save", "afile/m.npz"],
             "cannot write afile/m.npz: a file stands where its folder afile would be; "
             "nothing written")  # fmt: skip
    one_line(
        ["predict", "model.npz", "x.npy", "--out", "afile/p.csv"],
        "cannot write afile/p.csv: a file stands where its folder afile would be",
    )
    one_line(["bench", "protocol", "experiment=table5_smoke", "--out", "afile/bench"],
             "afile/bench")  # fmt: skip
    (tmp_path / "p.csv").write_text("kept\n")

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr("pandas.DataFrame.to_csv", full_disk)
        one_line(
            ["predict", "model.npz", "x.npy", "--out", "p.csv"],
            "cannot write p.csv: No space left on device; p.csv is as it was",
        )
    with monkeypatch.context() as mp:
        mp.setattr(np, "savez_compressed", full_disk)
        one_line(
            ["train", "method=lr_multi", "dataset.n_test=100", "--save", "model.npz"],
            "cannot write model.npz: No space left on device; model.npz is as it was",
        )
    assert (tmp_path / "p.csv").read_text() == "kept\n"
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_outputs_keep_the_compression_their_name_asks_for(tmp_path, monkeypatch):
    """predict --out preds.csv.gz is gzip-compressed (the temporary file of the atomic write
    keeps the target's suffix, from which pandas infers the compression)."""
    import gzip

    monkeypatch.chdir(tmp_path)
    X, y = _problem()
    np.save("x.npy", X)
    topkbench.fit(X, y, "lr_multi").save("model.npz")
    res = runner.invoke(app, ["predict", "model.npz", "x.npy", "--out", "p.csv.gz"])
    assert res.exit_code == 0, res.output
    with gzip.open("p.csv.gz", "rt") as fh:
        assert fh.readline().startswith("row,label_1")


def test_a_partly_renamed_set_of_outputs_says_which_were_written(tmp_path):
    """When a rename fails after others succeeded, the error names the files written."""
    from topkbench.atomic import write_outputs, write_text
    from topkbench.errors import OutputError

    (tmp_path / "b.csv").mkdir()  # a directory where the second file goes: its rename fails
    with pytest.raises(OutputError, match="a.md written, the others as they were"):
        write_outputs([(tmp_path / "a.md", write_text("new")),
                       (tmp_path / "b.csv", write_text("x"))])  # fmt: skip
    assert (tmp_path / "a.md").read_text() == "new"
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_fit_is_still_reachable_from_topkbench_model():
    import topkbench.api
    import topkbench.model

    assert topkbench.model.fit is topkbench.api.fit
