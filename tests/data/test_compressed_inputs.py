"""Damaged compressed inputs, the same for .gz, .bz2 and .xz, LibSVM and ARFF, in the loaders
and through train and predict: one error naming the file (an .xz stream gave a raw
LZMAError, corrupt deflate data in a .gz a raw zlib.error, and a truncated or empty
compressed ARFF file ended in an uncaught EOFError that printed only 'Aborted.')."""

from __future__ import annotations

import bz2
import gzip
import lzma

import numpy as np
import pytest
from typer.testing import CliRunner

import topkbench
from topkbench.cli import app
from topkbench.data.arff import read_mulan
from topkbench.data.libsvm import read_libsvm
from topkbench.errors import DataFormatError

LIBSVM = "".join(f"{1 + i % 3} 1:{i}.5 2:-{i} 3:0.25\n" for i in range(9))
ARFF = (
    "@relation r\n@attribute f1 numeric\n@attribute f2 numeric\n"
    "@attribute a {0,1}\n@attribute b {0,1}\n@data\n"
    + "".join(f"{i}.5,{i},{i % 2},{1 - i % 2}\n" for i in range(8))
)
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def damaged(text: str, suffix: str, how: str) -> bytes:
    """The compressed bytes of ``text``, damaged ``how``."""
    data = COMPRESS[suffix](text.encode())
    if how == "magic":  # not this format at all
        return b"XX" + data[2:]
    if how == "crc":  # the stream's checksum of the data no longer matches
        end = -5 if suffix == ".gz" else -13 if suffix == ".xz" else -3
        return data[:end] + bytes([data[end] ^ 0xFF]) + data[end + 1 :]
    if how == "deflate":  # a byte of gzip's compressed data itself (past its 10-byte header)
        return data[:12] + bytes([data[12] ^ 0xFF]) + data[13:]
    if how == "truncated":
        return data[: len(data) // 2]
    return b""  # empty


CASES = [(s, h) for s in COMPRESS for h in ("magic", "crc", "truncated", "empty")]
CASES.append((".gz", "deflate"))


def read(path, fmt: str):
    return read_libsvm(path) if fmt == "libsvm" else read_mulan(path, n_labels=-2)


@pytest.mark.parametrize("fmt", ["libsvm", "arff"])
@pytest.mark.parametrize("suffix,how", CASES)
def test_a_damaged_compressed_file_is_one_error_naming_it(tmp_path, fmt, suffix, how):
    path = tmp_path / f"data.{'txt' if fmt == 'libsvm' else 'arff'}{suffix}"
    path.write_bytes(damaged(LIBSVM if fmt == "libsvm" else ARFF, suffix, how))
    if how == "empty" and suffix != ".xz" and fmt == "libsvm":
        with pytest.raises(DataFormatError, match="empty|cannot read"):  # gzip/bz2: no data
            read(path, fmt)
        return
    with pytest.raises(DataFormatError) as exc:
        read(path, fmt)
    assert str(exc.value).startswith(str(path)), str(exc.value)


@pytest.mark.parametrize("suffix,how", [(".xz", "crc"), (".gz", "crc"), (".gz", "deflate")])
def test_train_and_predict_on_a_damaged_file_say_which(tmp_path, suffix, how):
    runner = CliRunner()
    good = tmp_path / "good.txt"
    good.write_text(LIBSVM)
    bad = tmp_path / f"bad.txt{suffix}"
    bad.write_bytes(damaged(LIBSVM, suffix, how))
    res = runner.invoke(app, ["train", "dataset=libsvm", f"dataset.train={bad}", "method=lr_multi"])
    assert res.exit_code not in (0, None) and isinstance(res.exception, (SystemExit, type(None)))
    assert "Traceback" not in res.output and bad.name in res.output, res.output
    X = np.array([[i + 0.5, -i, 0.25] for i in range(9)])
    model = topkbench.fit(X, np.arange(9) % 3, "lr_multi")
    model.save(tmp_path / "m.npz")
    res = runner.invoke(app, ["predict", str(tmp_path / "m.npz"), str(bad)])
    assert res.exit_code not in (0, None) and isinstance(res.exception, (SystemExit, type(None)))
    assert "Traceback" not in res.output and bad.name in res.output, res.output
