"""A sweep on a Dask cluster that fails ends in one error line naming the scheduler, within
seconds, with the records that arrived kept: an unreachable or malformed address, a cluster
without workers (it waited silently for as long as it was left), a task that failed or
whose workers died running it (a raw traceback)."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import pytest
from typer.testing import CliRunner

import topkbench.experiments.run as run
from topkbench.cli import app, compose
from topkbench.config import ExperimentConfig
from topkbench.errors import ClusterError
from topkbench.experiments.store import RecordStore
from topkbench.experiments.sweep import run_sweep

SWEEP = ["experiment=table3", "experiment.draws=1", "experiment.C_grid.min_exp=-1",
         "experiment.C_grid.max_exp=1", "dataset.n_test=200"]  # fmt: skip


@pytest.fixture
def quick_watch(monkeypatch):
    monkeypatch.setattr(run, "DASK_CONNECT_SECONDS", 2.0)
    monkeypatch.setattr(run, "DASK_WATCH_SECONDS", 0.5)
    monkeypatch.setattr(run, "DASK_NO_WORKER_SECONDS", 2.0)


@pytest.mark.parametrize("address,expected", [
    ("not-an-address", "cannot reach the Dask scheduler 'not-an-address'"),
    ("tcp://127.0.0.1:9", "cannot reach the Dask scheduler 'tcp://127.0.0.1:9'"),
])  # fmt: skip
def test_an_unreachable_scheduler_is_one_line(tmp_path, quick_watch, address, expected):
    start = time.monotonic()
    res = CliRunner().invoke(app, ["sweep", *SWEEP, f"results_dir={tmp_path}",
                                   f"scheduler={address}"])  # fmt: skip
    assert res.exit_code == 8 and "Traceback" not in res.output, res.output
    assert expected in " ".join(res.output.split())
    assert time.monotonic() - start < 30


@pytest.fixture
def peer():
    """A TCP listener on 127.0.0.1 that is not a Dask scheduler: it accepts and either says
    nothing or answers as an HTTP server refusing the request."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    replies: list[bytes] = []
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at teardown
                return
            held.append(conn)
            if replies:
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    conn.sendall(replies[0])

    threading.Thread(target=serve, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}", replies
    server.close()
    for conn in held:
        conn.close()


@pytest.mark.parametrize("reply,reason", [
    (None, "no answer within 1 s"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "does not answer as a Dask scheduler"),
])  # fmt: skip
def test_a_peer_that_is_not_a_scheduler_is_one_line(tmp_path, quick_watch, monkeypatch, peer,
                                                    reply, reason):  # fmt: skip
    """A listener that accepts and never answers held the client's handshake forever (its
    timeout bounds the TCP connection only); an HTTP server's answer, decoded as a frame
    length, was reported as memory running out."""
    monkeypatch.setattr(run, "DASK_CONNECT_SECONDS", 1.0)
    address, replies = peer
    if reply is not None:
        replies.append(reply)
    start = time.monotonic()
    res = CliRunner().invoke(app, ["sweep", *SWEEP, f"results_dir={tmp_path}",
                                   f"scheduler={address}"])  # fmt: skip
    out = " ".join(res.output.split())
    assert res.exit_code == 8 and "Traceback" not in res.output, res.output
    assert f"cannot reach the Dask scheduler '{address}'" in out and reason in out, out
    assert "memory ran out" not in out
    assert time.monotonic() - start < 20


def test_a_cluster_without_workers_is_reported(tmp_path, quick_watch):
    from distributed import LocalCluster

    exp = ExperimentConfig.from_dict(compose([*SWEEP, f"results_dir={tmp_path}"]))
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        start = time.monotonic()
        with pytest.raises(ClusterError, match="has had no worker for 2 s; .* task.s. wait"):
            run_sweep(dataclasses.replace(exp, scheduler=cluster.scheduler_address))
        assert time.monotonic() - start < 30


def test_a_failed_task_ends_the_sweep_keeping_what_finished(tmp_path, quick_watch, monkeypatch):
    """The first paths finish and are committed; a later one fails on the cluster (as one
    whose workers died does, with KilledWorker): one ClusterError, the finished records
    kept, and the next sweep resumes from them."""
    from distributed import LocalCluster

    real, calls = run._run_collected, []

    def dies_on_the_third(exp, task):
        calls.append(task)
        if len(calls) == 3:
            raise RuntimeError("workers died while trying to run it")
        return real(exp, task)

    monkeypatch.setattr(run, "_run_collected", dies_on_the_third)
    exp = ExperimentConfig.from_dict(compose([*SWEEP, f"results_dir={tmp_path}"]))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster:  # fmt: skip
        dask = dataclasses.replace(exp, scheduler=cluster.scheduler_address)
        with pytest.raises(
            ClusterError,
            match="a task failed on the Dask cluster at .*workers died while trying to run it",
        ):
            run_sweep(dask)
    kept = len(RecordStore(exp.results_dir, exp.name).load())
    assert kept > 0
    monkeypatch.setattr(run, "_run_collected", real)
    summaries = run_sweep(exp)
    assert sum(s.cached for s in summaries) == kept


def test_a_scheduler_that_goes_away_is_one_error(tmp_path, quick_watch, monkeypatch):
    """The scheduler closed while the sweep waits on it (its futures are cancelled): one
    ClusterError saying it was lost (a raw FuturesCancelledError)."""
    import threading

    from distributed import LocalCluster

    monkeypatch.setattr(run, "DASK_NO_WORKER_SECONDS", 30.0)  # the lost scheduler, not this

    exp = ExperimentConfig.from_dict(compose([*SWEEP, f"results_dir={tmp_path}"]))
    cluster = LocalCluster(n_workers=0, processes=False, dashboard_address=None)
    closer = threading.Timer(1.0, cluster.close)
    closer.start()
    try:
        with pytest.raises(ClusterError, match="lost the Dask scheduler"):
            run_sweep(dataclasses.replace(exp, scheduler=cluster.scheduler_address))
    finally:
        closer.cancel()
        cluster.close()


def test_pool_workers_keep_one_blas_thread_under_an_address_space_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (2 << 30, resource.RLIM_INFINITY))
    assert run._worker_blas_threads(1) == 1
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # fmt: skip
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert run._worker_blas_threads(2) == 4
