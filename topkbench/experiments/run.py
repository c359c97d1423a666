"""Running tasks: a path (:class:`PathTask`), the continuation of a selected fit
(:class:`CertifyTask`), and the driver that executes them and is the store's one writer.

The driver process commits each finished point as it arrives, with the path's warm-start
checkpoint when one is handed on (:func:`checkpoint_due`), so an interrupted sweep loses no
finished record and a re-run resumes where it stopped.  Tasks
run in process, on local worker processes (``n_jobs``) or on a Dask cluster
(``scheduler=ADDRESS``; workers need the data files, not the results directory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from topkbench.config import ExperimentConfig
from topkbench.errors import ClusterError, TopkbenchError
from topkbench.experiments.fits import certifiable, fit_point, make_record, path_context
from topkbench.experiments.plan import PathJob, PathSummary, record_spec
from topkbench.experiments.store import CheckpointRef, RecordStore, read_checkpoint, spec_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PathTask:
    """A path as the driver hands it to a worker: each C with its record key and spec and
    whether the store already holds it, and the path's warm-start checkpoint (the largest
    finished C whose dual was handed on).  Workers never read or write the store."""

    job: PathJob
    points: tuple[tuple[float, str, dict[str, Any], bool], ...]  # (C, key, spec, cached)
    path_key: str
    checkpoint: CheckpointRef | None = None

    def run(self, exp: ExperimentConfig, emit: Emit) -> PathSummary:
        return run_path(exp, self, emit)


# (key, record, checkpoints); (None, None, checkpoints) hands on checkpoints alone
Emit = Callable[[str | None, dict[str, Any] | None, tuple], None]


def plan_path(exp: ExperimentConfig, job: PathJob, store: RecordStore, done: set[str]) -> PathTask:
    """The task of ``job`` against the store's finished keys ``done`` (driver side)."""
    ds = exp.datasets[job.dataset]
    points = []
    for C in sorted(job.C_values):
        spec = record_spec(exp, ds, job.row, job.draw, job.fold, C, job.init_C, job.theta)
        key = spec_key(spec)
        points.append((C, key, spec, key in done))
    path_key = spec_key(
        record_spec(exp, ds, job.row, job.draw, job.fold, None, job.init_C, job.theta)
    )
    ck = None
    if exp.warm_start and job.init_C is None and not all(p[3] for p in points):
        ck = store.checkpoint_ref(path_key)
    return PathTask(job, tuple(points), path_key, ck)


def run_path(exp: ExperimentConfig, task: PathTask, emit: Emit) -> PathSummary:
    """Run (or resume) one path, handing each finished record to ``emit``; returns counts.

    Each record goes with its checkpoints: the path's (the dual at its largest finished C, the
    warm start of a resumed path or of a later stage's points) when :func:`checkpoint_due`,
    and at the task's end if it was not; and, for a fit stopped on the budget, the point's
    own (from which :func:`certify_selected` continues it).  A resumed path whose checkpoint
    is older than its last finished point first fits again, without a record, the finished
    points past the checkpoint, each from the one before as the first run did: its next new
    point starts from the same dual, so the records are those of an uninterrupted run.
    """
    job = task.job
    start = time.perf_counter()
    ds = exp.datasets[job.dataset]
    row, draw, fold = job.row, job.draw, job.fold
    summary = PathSummary(row=row.row, draw=draw, dataset=ds.name, fold=fold)
    data_seed = exp.seed + draw
    init_C = job.init_C
    ctx = None
    ck = None
    prev_model = None
    errors: list[str] = []
    chained = exp.warm_start and init_C is None
    pending: list[float] = []  # finished points since the last new one (see _replay)
    unsaved = 0.0  # fit seconds since the path's checkpoint was last handed on
    saved = True  # whether the store holds ck, the path's state at its last finished point
    for C, key, spec, cached in task.points:
        if cached:
            summary.cached += 1
            prev_model = None
            pending.append(C)
            continue
        if ctx is None:
            ctx, msg = path_context(exp, job, data_seed)
            if msg is not None:
                n_left = len(task.points) - summary.cached
                if msg.startswith("skip:"):
                    summary.skipped = n_left
                    log.info("%s", msg[5:])
                else:
                    summary.failed = n_left
                    errors.append(msg)
                    log.error("%s %s %s: %s", ds.name, row.row, fold, msg)
                break
            ck = read_checkpoint(task.checkpoint) if task.checkpoint is not None else None
        data = ctx.data
        if chained and pending:
            ck, seconds = _replay(exp, job, ctx, data_seed, ck, pending)
            if seconds:
                unsaved, saved = unsaved + seconds, False
        pending.clear()
        # warm start from the largest finished C <= C of this path: the previous point of
        # this job, or the checkpoint
        warm = prev_model if chained else None
        if _usable(ck, data) and ck[0] <= C and (warm is None or ck[0] > warm.params["C"]):
            warm = ck
        t0 = time.perf_counter()
        try:
            model = fit_point(exp, job, ctx, C, data_seed, warm)
        except TopkbenchError as exc:
            summary.failed += 1
            errors.append(f"C={C:g}: {exc}")
            log.error("%s %s draw %d %s C=%g failed: %s", ds.name, row.row, draw, fold, C, exc)
            prev_model = None
            continue
        unsaved += time.perf_counter() - t0
        record = make_record(spec, ds, row, ctx, model, warm is not None)
        checkpoints = []
        if chained and (ck is None or C > ck[0]):
            ck, saved = model.warm_state(), False
            # a fit under a time limit cannot be replayed to the same dual: hand it on
            if exp.time_limit is not None or checkpoint_due(ck, unsaved):
                checkpoints.append((task.path_key, ck))
                unsaved, saved = 0.0, True
        if certifiable(row, model):
            checkpoints.append((key, model.warm_state()))
        emit(key, record, tuple(checkpoints))
        summary.done += 1
        summary.not_converged += model.status != "converged"
        prev_model = model
    if chained and not saved:
        # the path's last state: a later stage's points (a grid extended past its largest C)
        # start from it, as an uninterrupted path's next point would
        emit(None, None, ((task.path_key, ck),))
    summary.seconds = time.perf_counter() - start
    summary.errors = tuple(errors)
    return summary


# A path's checkpoint (its n x m dual and d x m primal) is pickled to the driver, which packs,
# hashes and writes it: several copies of n m floats, which on a large label space cost more
# than the fits at small C.  Checkpoints up to CHECKPOINT_FREE_BYTES go with every point;
# larger ones once the path's fits since the last one took CHECKPOINT_FIT_RATIO times what
# handing it on costs at CHECKPOINT_BYTES_PER_SECOND, and at the path's end.  That bounds both
# the overhead (1 / ratio of the fit time) and what a resumed path fits again (that many
# seconds, :func:`_replay`, whose fits count towards the next hand-over).
CHECKPOINT_FREE_BYTES = 8 << 20
CHECKPOINT_BYTES_PER_SECOND = 100e6
CHECKPOINT_FIT_RATIO = 10.0


def checkpoint_due(warm, fit_seconds: float) -> bool:
    """Whether a path hands on its checkpoint ``warm`` (a
    :class:`~topkbench.model.WarmStart`) after ``fit_seconds`` of fits since the last one."""
    size = warm.A.nbytes + (warm.W.nbytes if warm.W is not None else 0)
    if size <= CHECKPOINT_FREE_BYTES:
        return True
    return fit_seconds >= CHECKPOINT_FIT_RATIO * size / CHECKPOINT_BYTES_PER_SECOND


def _usable(ck, data) -> bool:
    """Whether the checkpoint ``ck`` is a warm start for this path's examples."""
    return ck is not None and ck[1].shape[0] == data.X.shape[0]


def _replay(exp: ExperimentConfig, job: PathJob, ctx, seed: int, ck, finished: list[float]):
    """The path's warm start after its finished points ``finished`` (ascending C), and the
    seconds its fits took: ``ck`` continued through those past its C, each fitted from the one
    before, as the first run fitted them (no record: the store has theirs).  A fit that fails
    now, where it did not then, ends the replay: the new point starts from the last state
    reached."""
    start = time.perf_counter()
    fitted = False
    for C in finished:
        if ck is not None and C <= ck[0]:
            continue
        warm = ck if _usable(ck, ctx.data) else None
        try:
            ck = fit_point(exp, job, ctx, C, seed, warm).warm_state()
        except TopkbenchError:
            break
        fitted = True
    return ck, (time.perf_counter() - start if fitted else 0.0)


@dataclass(frozen=True)
class CertifyTask:
    """Continue one selected, budget-stopped fit from its stored dual until eps (within the
    experiment's certify budget), and replace its record by the certified one."""

    job: PathJob  # its one C
    key: str
    spec: dict[str, Any]
    checkpoint: CheckpointRef | None
    prior_epochs: int
    prior_seconds: float

    def run(self, exp: ExperimentConfig, emit: Emit) -> PathSummary:
        job = self.job
        ds = exp.datasets[job.dataset]
        summary = PathSummary(row=job.row.row, draw=job.draw, dataset=ds.name, fold=job.fold)
        start = time.perf_counter()
        seed = exp.seed + job.draw
        ctx, msg = path_context(exp, job, seed)
        if ctx is None:
            summary.failed = 1
            summary.errors = (msg,)
            return summary
        (C,) = job.C_values
        warm = read_checkpoint(self.checkpoint) if self.checkpoint is not None else None
        try:
            model = fit_point(exp, job, ctx, C, seed, warm,
                               max_epochs=exp.certify_max_epochs,
                               time_limit=exp.certify_time_limit)  # fmt: skip
        except TopkbenchError as exc:
            summary.failed = 1
            summary.errors = (f"C={C:g}: {exc}",)
            return summary
        record = make_record(self.spec, ds, job.row, ctx, model, warm is not None)
        record.update(
            epochs=self.prior_epochs + model.epochs,
            train_seconds=self.prior_seconds + model.train_seconds,
            certify_epochs=model.epochs,
            certify_seconds=model.train_seconds,
            certify_time_limit=exp.certify_time_limit,
            certify_max_epochs=exp.certify_max_epochs,
        )
        certified = certifiable(job.row, model)
        emit(self.key, record, ((self.key, model.warm_state()),) if certified else ())
        summary.done = 1
        summary.not_converged = int(model.status != "converged")
        summary.seconds = time.perf_counter() - start
        return summary


_QUEUE = None  # a pool worker's channel to the driver


def _worker_init(queue, blas_threads: int) -> None:
    """Pool workers: records go to the driver through ``queue``; Ctrl-C is the driver's to
    handle; a worker dies with the driver (Linux ``PR_SET_PDEATHSIG``), so a killed sweep
    leaves no orphan computing; and the workers share the cores, ``blas_threads`` BLAS
    threads each, instead of each spinning as many threads as there are cores."""
    import signal

    from threadpoolctl import threadpool_limits

    global _QUEUE
    _QUEUE = queue
    threadpool_limits(blas_threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the driver died before prctl took effect
        os._exit(1)


def _run_queued(exp: ExperimentConfig, index: int, task) -> None:
    """Run a task in a pool worker: its records, then ("done", index, summary), go through the
    one queue, so the driver sees a task's records before its end (one process's messages
    arrive in order)."""
    summary = task.run(exp, lambda *msg: _QUEUE.put(("record", msg)))
    _QUEUE.put(("done", (index, summary)))


def _run_collected(exp: ExperimentConfig, task) -> tuple[PathSummary, list]:
    """Run a task on a Dask worker and return its records with its summary.  A path's
    checkpoint, handed on with some of its records and at its end, supersedes the one before:
    only the last is kept, so a returned path holds one n x m dual plus those of its
    budget-stopped fits."""
    out: list = []
    summary = task.run(exp, lambda *msg: out.append(msg))
    path_key = getattr(task, "path_key", None)
    last = max((i for i, (_, _, cks) in enumerate(out) if any(c[0] == path_key for c in cks)),
               default=None)  # fmt: skip
    for i, (key, record, cks) in enumerate(out):
        if i != last:
            out[i] = (key, record, tuple(c for c in cks if c[0] != path_key))
    return summary, out


# the Dask driver's watch: how long to try to reach the scheduler, how often to look at the
# cluster while tasks wait, and how long a cluster may stay without workers
DASK_CONNECT_SECONDS = 10.0
DASK_WATCH_SECONDS = 2.0
DASK_NO_WORKER_SECONDS = 60.0


def _worker_blas_threads(n_jobs: int) -> int:
    """BLAS threads per pool worker: the cores shared out, or one under a finite
    address-space limit (each OpenBLAS thread maps a buffer, and one the limit refuses is
    retried forever; :func:`topkbench.cli.app.guard_address_space`)."""
    from topkbench.errors import address_space_limit

    if address_space_limit() is not None:
        return 1
    return max(1, (os.cpu_count() or 1) // n_jobs)


def _dask_connect(address: str):
    """A Dask client connected to ``address`` within :data:`DASK_CONNECT_SECONDS`, or one
    :class:`ClusterError` naming the scheduler.

    ``Client(address, timeout=...)`` bounds the TCP connection but not the handshake that
    follows, so a peer that accepts and never answers would hold it forever; the client is
    therefore created in a daemon thread the driver stops waiting for (a connection that
    completes after that is closed there).  A peer that answers but is not a scheduler (an
    HTTP server) makes the protocol decoder read garbage lengths, which surfaces as anything
    from a ``ValueError`` to a ``MemoryError``: each is the scheduler's fault, not ours."""
    import threading

    from distributed import Client

    out: dict[str, Any] = {}
    gave_up = threading.Event()

    def connect() -> None:
        try:
            client = Client(address, timeout=DASK_CONNECT_SECONDS, set_as_default=False)
        except Exception as exc:
            out["error"] = exc
            return
        out["client"] = client
        if gave_up.is_set():
            with contextlib.suppress(Exception):
                client.close(timeout=DASK_CONNECT_SECONDS)

    thread = threading.Thread(target=connect, name="dask-connect", daemon=True)
    thread.start()
    # a second past the client's own timeout, so that its error (a refused port) comes first
    thread.join(DASK_CONNECT_SECONDS + 1.0)
    if thread.is_alive():
        gave_up.set()
        if "client" in out:  # connected between the join and the flag: closed here
            with contextlib.suppress(Exception):
                out["client"].close(timeout=DASK_CONNECT_SECONDS)
        reason = f"no answer within {DASK_CONNECT_SECONDS:g} s"
    elif "client" in out:
        return out["client"]
    else:
        exc = out["error"]
        if isinstance(exc, (OSError, TimeoutError, ValueError, TypeError)):
            reason = str(exc)
        else:
            reason = f"it does not answer as a Dask scheduler ({type(exc).__name__}: {exc})"
    raise ClusterError(f"cannot reach the Dask scheduler {address!r}: {reason}",
                       hint="check the address (tcp://HOST:PORT)")  # fmt: skip


class Driver:
    """The sweep's one writer (DESIGN §8): runs tasks in process, on a local process pool
    (``n_jobs``) or on a Dask cluster (``scheduler``), and commits every record the workers
    hand back in its own transaction.  Pool workers stream records as each fit finishes; Dask
    workers return a path's records with its summary (so they never touch a shared file).
    ``on_path_done(summary)`` follows each task's end, ``on_fit()`` each record committed
    (before its task's summary)."""

    def __init__(self, exp: ExperimentConfig, store: RecordStore, on_path_done=None,
                 on_fit=None) -> None:  # fmt: skip
        self.exp, self.store, self.on_path_done, self.on_fit = exp, store, on_path_done, on_fit
        self._pool = None
        self._queue = None

    def commit(self, key: str | None, record: dict[str, Any] | None, checkpoints: tuple) -> None:
        if key is None:  # a path's checkpoint alone
            for ck_key, warm in checkpoints:
                self.store.save_warm(ck_key, warm)
        else:
            self.store.write(key, record, checkpoints)
            if self.on_fit:
                self.on_fit()

    def run(self, tasks: list) -> list[PathSummary]:
        results: list[PathSummary] = []

        def done(s: PathSummary) -> None:
            results.append(s)
            if self.on_path_done:
                self.on_path_done(s)

        exp = self.exp
        if not tasks:
            return results
        if exp.scheduler:
            self._run_dask(tasks, done)
            return results
        if exp.n_jobs == 1 or len(tasks) == 1:
            for task in tasks:
                done(task.run(exp, self.commit))
            return results
        self._run_pool(tasks, done)
        return results

    def _run_dask(self, tasks: list, done) -> None:
        """The tasks on the Dask cluster at ``exp.scheduler``, committing each path's records
        as it finishes.  The cluster is watched: an address that cannot be reached within
        :data:`DASK_CONNECT_SECONDS`, a task whose workers died running it (Dask's
        ``KilledWorker``), a lost scheduler, and a cluster left without workers for
        :data:`DASK_NO_WORKER_SECONDS` each end the sweep with one :class:`ClusterError`
        naming the scheduler (the records that arrived are committed)."""
        from concurrent.futures import CancelledError

        address = self.exp.scheduler
        client = _dask_connect(address)
        try:
            pending = set(client.map(_run_collected, [self.exp] * len(tasks), tasks, pure=False))
            idle_since = None
            while pending:
                finished, pending = self._dask_wait(client, pending)
                # the finished paths first, so that a failed one leaves them committed
                for fut in sorted(finished, key=lambda f: f.status != "finished"):
                    if fut.status != "finished":
                        raise self._dask_failure(fut)
                    try:
                        summary, msgs = fut.result()
                    except (OSError, CancelledError) as exc:  # the result's transfer
                        raise self._lost(exc) from None
                    for msg in msgs:
                        self.commit(*msg)
                    done(summary)
                if pending and not self._dask_workers(client):
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > DASK_NO_WORKER_SECONDS:
                        raise ClusterError(
                            f"the Dask cluster at {address} has had no worker for "
                            f"{DASK_NO_WORKER_SECONDS:g} s; {len(pending)} task(s) wait; "
                            "finished records are kept",
                            hint="start workers (dask worker ADDRESS) and re-run the sweep",
                        )  # fmt: skip
                else:
                    idle_since = None
        finally:
            with contextlib.suppress(Exception):
                client.close(timeout=DASK_CONNECT_SECONDS)

    def _lost(self, exc: BaseException) -> ClusterError:
        return ClusterError(f"lost the Dask scheduler {self.exp.scheduler}: "
                            f"{type(exc).__name__}: {exc}; finished records are kept",
                            hint="re-run the sweep to resume")  # fmt: skip

    def _dask_wait(self, client, pending):
        """``(finished, pending)`` after at most :data:`DASK_WATCH_SECONDS`; a lost scheduler
        (the futures cancelled, the connection closed) is a :class:`ClusterError`."""
        from concurrent.futures import CancelledError

        from distributed import wait

        try:
            with client.as_current():  # wait takes the current client (none is the default)
                return wait(pending, timeout=DASK_WATCH_SECONDS, return_when="FIRST_COMPLETED")
        except TimeoutError:  # nothing finished in this look: the cluster is checked
            return set(), pending
        except (OSError, CancelledError) as exc:
            raise self._lost(exc) from None

    def _dask_workers(self, client) -> dict:
        from concurrent.futures import CancelledError

        try:
            return client.scheduler_info().get("workers") or {}
        except (OSError, TimeoutError, CancelledError) as exc:
            raise self._lost(exc) from None

    def _dask_failure(self, fut) -> ClusterError:
        """The error of a future that did not finish: cancelled (the scheduler went away) or
        failed (its task raised, or its workers died running it: ``KilledWorker``)."""
        if fut.status == "cancelled":
            return self._lost(RuntimeError("the task was cancelled"))
        exc = fut.exception()
        return ClusterError(
            f"a task failed on the Dask cluster at {self.exp.scheduler}: "
            f"{type(exc).__name__}: {exc}; finished records are kept",
            hint="re-run the sweep to resume",
        )  # fmt: skip

    def _run_pool(self, tasks: list, done) -> None:
        import queue as queue_mod
        from concurrent.futures import ProcessPoolExecutor

        if self._pool is None:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            self._queue = ctx.Queue()
            self._pool = ProcessPoolExecutor(
                self.exp.n_jobs, mp_context=ctx, initializer=_worker_init,
                initargs=(self._queue, _worker_blas_threads(self.exp.n_jobs)),
            )  # fmt: skip
        futures = [self._pool.submit(_run_queued, self.exp, i, t) for i, t in enumerate(tasks)]
        finished = 0
        while finished < len(tasks):
            try:
                kind, payload = self._queue.get(timeout=0.1)
            except queue_mod.Empty:
                kind, payload = None, None
            if kind is None:
                # a failed task (or a dead worker: the pool is then broken) stops the sweep,
                # after the records that did arrive are committed
                failed = next((f for f in futures if f.done() and f.exception()), None)
                if failed is not None:
                    self._drain()
                    raise failed.exception()
                continue
            if kind == "record":
                self.commit(*payload)
            else:
                finished += 1
                done(payload[1])

    def _drain(self, seconds: float = 2.0) -> None:
        """Commit the records still queued (the workers' feeder threads may need a moment),
        until the queue has been quiet for 0.5 s or ``seconds`` have passed."""
        import queue as queue_mod

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                kind, payload = self._queue.get(timeout=0.5)
            except queue_mod.Empty:
                return
            if kind == "record":
                self.commit(*payload)

    def close(self, kill: bool = False) -> None:
        if self._pool is not None:
            if kill:  # interrupted: keep what finished, then stop the workers
                self._drain()
                for p in list(getattr(self._pool, "_processes", {}).values()):
                    p.terminate()
                self._drain(0.5)
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
