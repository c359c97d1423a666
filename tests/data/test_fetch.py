"""``topkbench data fetch|verify|list|info`` against a local HTTP server (DESIGN §6.2, §9).

A registry entry ``toy`` (kind libsvm) is written into a copy of ``conf/`` whose URLs point at
a ThreadingHTTPServer on 127.0.0.1; ``$TOPKBENCH_CONF`` / ``$TOPKBENCH_DATA`` point the CLI at
the copies.  Nothing leaves the machine."""

from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import socket
import threading
import time
from pathlib import Path

import pooch
import pytest
import yaml
from typer.testing import CliRunner

from topkbench.cli import app
from topkbench.data.dataset import load_dataset
from topkbench.data.registry import registry_entry, verify

CONF = Path(__file__).resolve().parents[2] / "topkbench" / "conf"

FILES = {
    "train": ("toy.tr", "-1 1:0.5 3:1\n5 2:2\n17 1:-1\n5 3:0.25\n-1 2:1\n"),
    "val": ("toy.val", "17 2:1\n-1 1:1\n"),
    "test": ("toy.t", "5 4:3\n-1 1:1\n17 2:7\n"),
}
SHA = {f: hashlib.sha256(text.encode()).hexdigest() for f, text in FILES.values()}


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (signature of the base class)
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    for fname, text in FILES.values():
        (root / fname).write_text(text)
    handler = functools.partial(QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A conf copy and an empty data dir; returns (confdir, datadir)."""
    confdir = tmp_path / "conf"
    shutil.copytree(CONF, confdir)
    datadir = tmp_path / "data"
    monkeypatch.setenv("TOPKBENCH_CONF", str(confdir))
    monkeypatch.setenv("TOPKBENCH_DATA", str(datadir))
    monkeypatch.setenv("COLUMNS", "400")  # rich: no wrapped table cells or messages
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    # pooch's log handler keeps the stderr of the first CliRunner call, closed by the next one
    monkeypatch.setattr(pooch.get_logger(), "disabled", True)
    return confdir, datadir


def write_toy(confdir: Path, base_url: str, sha: dict[str, str | None]) -> None:
    entry = {
        "name": "toy",
        "kind": "libsvm",
        "title": "Toy LibSVM dataset served from localhost",
        "paper": {"m": 3, "n": 5, "d": 4},
        "files": {
            split: {"file": fname, "url": f"{base_url}/{fname}", "sha256": sha[fname]}
            for split, (fname, _) in FILES.items()
        },
    }
    (confdir / "dataset" / "toy.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_fetch_with_registry_checksums(server, env):
    confdir, datadir = env
    write_toy(confdir, server, SHA)
    res = invoke("data", "fetch", "toy", "--no-progress")
    assert res.exit_code == 0, res.output
    for fname, text in FILES.values():
        assert (datadir / "toy" / fname).read_text() == text
    assert "downloaded" in res.output
    assert not (datadir / "toy" / "SHA256SUMS").exists()  # registry hashes need no record
    res = invoke("data", "verify", "toy")
    assert res.exit_code == 0, res.output
    assert res.output.count(" ok ") == 3 and "registry" in res.output
    ds = load_dataset(registry_entry(confdir, "toy"), seed=0)
    assert ds.label_names == ["-1", "5", "17"]
    assert ds.n_features == 4 and list(ds.splits) == ["train", "val", "test"]
    assert ds.splits["train"][1].tolist() == [0, 1, 2, 1, 0]
    # a second fetch finds everything in place and downloads nothing
    res = invoke("data", "fetch", "toy", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "downloaded" not in res.output and res.output.count(" ok ") == 3


def test_fetch_wrong_checksum_leaves_nothing(server, env):
    confdir, datadir = env
    write_toy(confdir, server, {**SHA, "toy.tr": "0" * 64})
    res = invoke("data", "fetch", "toy", "--no-progress")
    assert res.exit_code != 0
    assert res.exit_code == 4  # FetchError
    out = res.output
    assert "checksum" in out
    assert f"{server}/toy.tr" in out
    assert f"put the files by hand in {datadir / 'toy'}" in out
    target = datadir / "toy"
    assert not (target / "toy.tr").exists()
    leftovers = [p.name for p in target.iterdir()] if target.exists() else []
    assert leftovers == []  # no partial or temporary download either


def test_fetch_server_down_names_url_and_directory(env):
    confdir, datadir = env
    base = f"http://127.0.0.1:{free_port()}"
    write_toy(confdir, base, SHA)
    res = invoke("data", "fetch", "toy", "--no-progress")
    assert res.exit_code == 4, res.output
    assert f"could not download {base}/toy.tr" in res.output
    assert str(datadir / "toy") in res.output and "by hand" in res.output
    assert not (datadir / "toy" / "toy.tr").exists()


def test_trust_on_first_use_records_hash_and_verify_detects_corruption(server, env):
    confdir, datadir = env
    write_toy(confdir, server, dict.fromkeys(SHA))
    res = invoke("data", "verify", "toy")  # nothing there yet
    assert res.exit_code == 1 and res.output.count("missing") >= 3
    res = invoke("data", "fetch", "toy", "--no-progress")
    assert res.exit_code == 0, res.output
    lock = datadir / "toy" / "SHA256SUMS"
    recorded = {}
    for line in lock.read_text().splitlines():
        h, f = line.split()
        recorded[f] = h
    assert recorded == SHA
    assert "recorded on first fetch" in res.output
    res = invoke("data", "verify", "toy")
    assert res.exit_code == 0, res.output
    assert "recorded on first fetch" in res.output

    path = datadir / "toy" / "toy.val"
    path.write_text(path.read_text().replace("17", "18"))
    res = invoke("data", "verify", "toy")
    assert res.exit_code == 1
    assert "mismatch" in res.output and "recorded on first fetch" in res.output
    statuses = {st.file: st for st in verify(registry_entry(confdir, "toy"))}
    bad = statuses["toy.val"]
    assert (bad.state, bad.source, bad.expected) == ("mismatch", "recorded", SHA["toy.val"])
    assert statuses["toy.tr"].state == "ok"
    # fetch refuses to paper over the corrupted file and keeps the record
    res = invoke("data", "fetch", "toy", "--no-progress")
    assert res.exit_code == 4
    assert "checksum mismatch" in res.output and str(path) in res.output
    assert lock.read_text().count("\n") == 3 and SHA["toy.val"] in lock.read_text()


def test_files_placed_by_hand_are_recorded_by_fetch(env):
    confdir, datadir = env
    write_toy(confdir, f"http://127.0.0.1:{free_port()}", dict.fromkeys(SHA))
    (datadir / "toy").mkdir(parents=True)
    for fname, text in FILES.values():
        (datadir / "toy" / fname).write_text(text)
    res = invoke("data", "verify", "toy")
    assert res.exit_code == 0 and res.output.count("unchecked") == 3
    res = invoke("data", "fetch", "toy", "--no-progress")  # no download needed (server down)
    assert res.exit_code == 0, res.output
    assert (datadir / "toy" / "SHA256SUMS").read_text().count("\n") == 3


def test_list_and_info_mention_toy(server, env):
    confdir, datadir = env
    write_toy(confdir, server, SHA)
    res = invoke("data", "list")
    assert res.exit_code == 0, res.output
    assert "toy" in res.output and "letter" in res.output
    assert str(datadir) in res.output
    toy_row = next(line for line in res.output.splitlines() if " toy " in line)
    assert "libsvm" in toy_row and "missing" in toy_row
    res = invoke("data", "info", "toy")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("toy: Toy LibSVM dataset")
    assert "kind: libsvm" in res.output
    assert f"directory: {datadir / 'toy'}" in res.output
    assert "toy.tr" in res.output and "missing" in res.output
    invoke("data", "fetch", "toy", "--no-progress")
    res = invoke("data", "list")
    toy_row = next(line for line in res.output.splitlines() if " toy " in line)
    assert "present" in toy_row


def test_unknown_dataset_lists_registered_names(env):
    res = invoke("data", "info", "nosuchset")
    assert res.exit_code == 2
    assert "unknown dataset 'nosuchset'" in res.output and "letter" in res.output
    assert "topkbench data list" in res.output


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    """Announces a 100,000-byte body and sends it as :meth:`body` says, quietly."""

    def do_GET(self):  # noqa: N802 (the base class's name)
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            self.body()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def body(self):
        raise NotImplementedError

    def log_message(self, format, *args):  # noqa: A002
        pass


class TrickleHandler(_SlowHandler):
    """Sends a large body one byte every 50 ms: no single read ever times out."""

    def body(self):
        for _ in range(100_000):
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(0.05)


class StallHandler(_SlowHandler):
    """Sends the headers and one byte, then nothing: no receive ever returns."""

    def body(self):
        self.wfile.write(b"x")
        self.wfile.flush()
        time.sleep(60)


@pytest.mark.parametrize("handler,within", [(TrickleHandler, 15), (StallHandler, 10)])
def test_fetch_stops_at_the_deadline(env, handler, within):
    """A server that trickles a byte every 50 ms (no single read times out) or that stalls
    (no receive ever returns; a 30 s socket timeout alone would hold the command): the
    deadline holds either way, with a one-line error and no partial file."""
    confdir, datadir = env
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        write_toy(confdir, f"http://127.0.0.1:{httpd.server_address[1]}", SHA)
        start = time.monotonic()
        res = invoke("data", "fetch", "toy", "--no-progress", "--deadline", "1")
        assert time.monotonic() - start < within
        assert res.exit_code == 4, res.output
        assert "exceeded its deadline of 1 s" in " ".join(res.output.split())
        assert "Traceback" not in res.output
        assert not (datadir / "toy" / "toy.tr").exists()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_train_refuses_a_file_that_fails_its_checksum(server, env):
    confdir, datadir = env
    write_toy(confdir, server, SHA)
    assert invoke("data", "fetch", "toy", "--no-progress").exit_code == 0
    assert invoke("train", "dataset=toy", "C=1").exit_code == 0
    path = datadir / "toy" / "toy.tr"
    path.write_text(path.read_text().replace("0.5", "0.7"))
    res = invoke("train", "dataset=toy", "C=1")
    assert res.exit_code == 4, res.output
    assert "checksum mismatch" in res.output and "toy.tr" in res.output
