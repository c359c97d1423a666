"""TPAMI Table 6's protocol on real images (002 §6.2): a network trained with softmax, then
fine-tuned with each top-k loss, beside classifiers trained on its penultimate features.

For each seed s (one seed drives the network's initialization, the data order of training and
fine-tuning, and the classifier fits; :func:`topkbench.deep.network.deterministic`):

1. **Reference.** The CNN is trained from scratch with LR^Multi for up to
   ``reference.epochs`` epochs (a cosine schedule); the epoch with the best val top-1 accuracy
   is kept (ties: the earlier epoch).  This is the "LR^Multi" line of Table 6.
2. **Fine-tuning.** From the reference, every row's loss (smooth top-k SVM_1, top-k Ent_tr,
   softmax again) trains the whole network for ``finetune.epochs`` epochs at a constant
   learning rate, for each rate of ``finetune.lrs``; every (rate, epoch) is a candidate, and
   each column's top-k selects its own on val (ties: fewer epochs, then the smaller rate), as
   Tables 3 and 5 select C per column.  Every row sees the same data order.
3. **Classifier only.** The reference network's penultimate features of every split are
   written to ``<results>/<name>/features/`` and the ``classifier`` rows are fitted on them
   by topkbench's solvers with Table 5's protocol (C selected on val, certified), in the
   experiment ``<results>/<name>/classifier``: TPAMI's "training just the classifier".

Records go through the sweep's store: one per reference network (its weights are the record's
checkpoint), one per fine-tuning (row, rate, epoch), keyed by everything that determines them,
so an interrupted run resumes where it stopped and a finished one is read back.  Networks run
with one torch thread per worker (``n_jobs`` workers share the cores): the numbers do not
depend on ``n_jobs``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from topkbench.config import SweepRow
from topkbench.deep.config import REFERENCE_ROW, FinetuneConfig
from topkbench.errors import ConfigError
from topkbench.experiments.plan import PathSummary
from topkbench.experiments.store import CheckpointRef, read_checkpoint, spec_key

REFERENCE, FINETUNE = "reference", "finetune"


def require_torch(device: str = "cpu") -> None:
    """A clear error where the extra is not installed, or ``device`` is not there."""
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "the fine-tuning protocol needs PyTorch, which is not installed",
            hint="make install-torch, or pip install 'topkbench[torch]'",
        ) from None
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "experiment.device=cuda, but torch sees no CUDA device here",
            hint="experiment.device=cpu",
        )


# -- record specs ------------------------------------------------------------------------------
def reference_spec(cfg: FinetuneConfig, seed: int, digests: dict[str, str]):
    """Everything that determines a reference network (its record key is this spec's hash;
    ``digests``: the SHA-256 of the data files)."""
    import topkbench

    return {
        "experiment": cfg.name,
        "stage": REFERENCE,
        "dataset": cfg.dataset.spec_dict(),
        "data_sha256": digests,
        "seed": seed,
        "network": {"channels": list(cfg.channels), "hidden": cfg.hidden},
        "epochs": cfg.reference_epochs,
        "schedule": asdict(cfg.reference),
        "ks": list(cfg.ks),
        "device": cfg.device,
        "torch": _torch_version(),
        "version": topkbench.__version__,
    }


def _torch_version() -> str | None:
    """The installed torch's version (its kernels change the numbers), read without importing
    it (the report needs no torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def finetune_spec(cfg: FinetuneConfig, ref_key: str, row: SweepRow, lr: float, epoch: int):
    """One fine-tuning candidate: the reference it starts from, the loss, rate and epoch."""
    import topkbench

    schedule = asdict(cfg.finetune) | {"lr": float(lr)}
    return {
        "experiment": cfg.name,
        "stage": FINETUNE,
        "reference": ref_key,
        "method": row.method,
        "k": int(row.k),
        "gamma": float(row.gamma),
        **row.fit_options(),  # wtopk_svm's rank weights (as the sweep's record keys hold them)
        "epochs": cfg.finetune_epochs,
        "epoch": int(epoch),
        "schedule": schedule,
        "ks": list(cfg.ks),
        "device": cfg.device,
        "version": topkbench.__version__,
    }


# -- data and networks (worker side) ---------------------------------------------------------
def image_side(d: int) -> int:
    """The side of square one-channel images of ``d`` pixels (divisible by 4: two poolings)."""
    side = math.isqrt(d)
    if side * side != d or side % 4:
        raise ConfigError(
            f"the fine-tuning protocol needs square one-channel images whose side "
            f"is divisible by 4; got {d} features per example"
        )
    return side


_IMAGES: dict[str, tuple] = {}  # per process: every task of a worker uses the same images


def load_images(cfg: FinetuneConfig):
    """``(splits, m, side)``: each split as float32 tensors (images, labels) on the device,
    loaded once per process and kept (tasks only read them)."""
    key = spec_key({"dataset": cfg.dataset.spec_dict(), "seed": cfg.seed, "device": cfg.device})
    if key not in _IMAGES:
        _IMAGES.clear()  # one data set at a time
        _IMAGES[key] = _read_images(cfg)
    return _IMAGES[key]


def _read_images(cfg: FinetuneConfig):
    import torch

    from topkbench.data.cache import load_dataset_cached

    data = load_dataset_cached(cfg.dataset, cfg.seed)
    for s in ("train", "val", "test"):
        if s not in data.splits:
            raise ConfigError(
                f"dataset {data.name}: the fine-tuning protocol needs train, val "
                f"and test splits; it has {', '.join(data.splits)}"
            )
    side = image_side(data.n_features)
    device = torch.device(cfg.device)
    out = {}
    for s, (X, y) in data.splits.items():
        X = X.toarray() if hasattr(X, "toarray") else X
        out[s] = (
            torch.tensor(np.asarray(X, dtype=np.float32), device=device),
            torch.tensor(np.asarray(y, dtype=np.int64), device=device),
        )
    return out, data.n_classes, side


def _network(cfg: FinetuneConfig, m: int, side: int, seed: int):
    """The seeded CNN and the data-order generator of ``seed`` (one torch thread)."""
    import torch

    from topkbench.deep.network import SmallCNN, deterministic

    torch.set_num_threads(1)
    gen = deterministic(seed)
    model = SmallCNN(m, side, cfg.channels, cfg.hidden).to(cfg.device)
    return model, gen


def weights_checkpoint(model):
    """The network's parameters as a store checkpoint (a one-row float64 array: exact for
    float32 weights), read back by :func:`load_weights`."""
    from torch.nn.utils import parameters_to_vector

    from topkbench.model import WarmStart

    vec = parameters_to_vector(model.parameters()).detach().double().cpu().numpy()
    return WarmStart(1.0, vec[None, :])


def load_weights(model, ref: CheckpointRef | None) -> None:
    """Set ``model``'s parameters from the checkpoint ``ref`` (refused when it is missing or
    does not match its recorded SHA-256)."""
    import torch
    from torch.nn.utils import vector_to_parameters

    warm = None if ref is None else read_checkpoint(ref)
    n = sum(p.numel() for p in model.parameters())
    if warm is None or warm.A.shape != (1, n):
        raise ConfigError(
            "the reference network's weights are missing or damaged in the record store",
            hint="re-run the sweep (the reference is retrained)",
        )
    vec = torch.as_tensor(warm.A[0], dtype=torch.float32, device=next(model.parameters()).device)
    vector_to_parameters(vec, model.parameters())


def _accuracy_fields(prefix: str, acc: dict[int, float]) -> dict[str, float]:
    return {f"{prefix}_top{k}": v / 100.0 for k, v in acc.items()}


# -- tasks (run by the sweep's driver, in process or on workers) -------------------------------
@dataclass(frozen=True)
class ReferenceTask:
    """Train seed ``seed``'s reference network; its record carries the weights."""

    seed: int
    key: str
    spec: dict[str, Any]

    def run(self, cfg: FinetuneConfig, emit) -> PathSummary:
        from topkbench.deep.network import accuracies, train

        t0 = time.perf_counter()
        splits, m, side = load_images(cfg)
        model, gen = _network(cfg, m, side, self.seed)
        best: dict[str, Any] = {}
        curve: list[float] = []

        def on_epoch(epoch: int, net) -> None:
            val = accuracies(net, *splits["val"], cfg.ks)
            curve.append(val[1] / 100.0)
            if not best or val[1] > best["score"] + 1e-9:
                state = {k: v.clone() for k, v in net.state_dict().items()}
                best.update(epoch=epoch, score=val[1], val=val, state=state)

        try:
            losses = train(model, *splits["train"], "lr_multi", cfg.reference_epochs,
                           cfg.reference, gen, on_epoch=on_epoch)  # fmt: skip
        except FloatingPointError as exc:
            raise ConfigError(f"the reference network of seed {self.seed}: {exc}",
                              hint="lower experiment.reference.lr") from None  # fmt: skip
        model.load_state_dict(best["state"])
        test = accuracies(model, *splits["test"], cfg.ks)
        seconds = time.perf_counter() - t0
        record = {
            "experiment": cfg.name,
            "stage": REFERENCE,
            "dataset": cfg.dataset.name,
            "seed": self.seed,
            "row": REFERENCE_ROW,
            "method": "lr_multi",
            "k": 1,
            "gamma": 0.0,
            "epoch": best["epoch"],
            "epochs_run": cfg.reference_epochs,
            "n_classes": m,
            "status": "trained",
            "train_seconds": seconds,
            "train_loss": losses,
            "val_curve": curve,
            "data_sha256": self.spec["data_sha256"],
            **_accuracy_fields("val", best["val"]),
            **_accuracy_fields("test", test),
        }
        emit(self.key, record, ((self.key, weights_checkpoint(model)),))
        return PathSummary(
            REFERENCE_ROW, self.seed, cfg.dataset.name, REFERENCE, done=1, seconds=seconds
        )


@dataclass(frozen=True)
class FinetuneTask:
    """Fine-tune seed ``seed``'s reference with one row's loss at one rate; one record per
    epoch (``points``: ``(epoch, key, spec)`` of every epoch; a run missing any of them
    trains all, and writes the same numbers again for those stored)."""

    seed: int
    row: SweepRow
    lr: float
    reference: CheckpointRef
    points: tuple[tuple[int, str, dict[str, Any]], ...]

    def run(self, cfg: FinetuneConfig, emit) -> PathSummary:
        from dataclasses import replace

        from topkbench.deep.network import accuracies, train

        t0 = time.perf_counter()
        splits, m, side = load_images(cfg)
        # the generator of the seed: the same data order for every row and rate
        model, gen = _network(cfg, m, side, self.seed)
        load_weights(model, self.reference)
        keys = {epoch: (key, spec) for epoch, key, spec in self.points}
        done = 0
        last = [time.perf_counter()]

        def emit_epoch(epoch: int, val, test, status: str) -> None:
            nonlocal done
            key, spec = keys[epoch]
            now = time.perf_counter()
            record = {
                "experiment": cfg.name,
                "stage": FINETUNE,
                "dataset": cfg.dataset.name,
                "seed": self.seed,
                "row": self.row.row,
                "method": self.row.method,
                "k": int(self.row.k),
                "gamma": float(self.row.gamma),
                "lr": float(self.lr),
                "epoch": epoch,
                "reference": spec["reference"],
                "n_classes": m,
                "status": status,
                "train_seconds": now - last[0],  # this epoch and its evaluation
                **_accuracy_fields("val", val),
                **_accuracy_fields("test", test),
            }
            last[0] = now
            emit(key, record, ())
            done += 1

        def on_epoch(epoch: int, net) -> None:
            val = accuracies(net, *splits["val"], cfg.ks)
            emit_epoch(epoch, val, accuracies(net, *splits["test"], cfg.ks), "trained")

        schedule = replace(cfg.finetune, lr=self.lr)
        try:
            train(model, *splits["train"], self.row.method, max(keys), schedule, gen,
                  k=self.row.k, gamma=self.row.gamma, on_epoch=on_epoch,
                  weights=self.row.weights)  # fmt: skip
        except FloatingPointError:
            # a rate too large for this loss: a candidate that no column selects, not the
            # end of the run (its accuracies are NaN)
            nan = dict.fromkeys(cfg.ks, math.nan)
            for epoch in sorted(keys)[done:]:
                emit_epoch(epoch, nan, nan, "diverged")
        return PathSummary(
            self.row.row,
            self.seed,
            cfg.dataset.name,
            f"lr {self.lr:g}",
            done=done,
            seconds=time.perf_counter() - t0,
        )


# -- the driver side ---------------------------------------------------------------------------
def reference_specs(cfg: FinetuneConfig, digests: dict[str, str] | None = None) -> dict:
    """Each seed's reference spec by its record key, ``{seed: (key, spec)}`` (``digests``:
    the data files' SHA-256, default: hashed now)."""
    from topkbench.data.files import file_digests

    digests = file_digests(cfg.dataset) if digests is None else digests
    specs = {s: reference_spec(cfg, s, digests) for s in cfg.seed_values}
    return {s: (spec_key(spec), spec) for s, spec in specs.items()}


def reference_keys(cfg: FinetuneConfig, digests: dict[str, str] | None = None) -> dict[int, str]:
    """Each seed's reference record key (:func:`reference_specs`)."""
    return {s: key for s, (key, _) in reference_specs(cfg, digests).items()}


def finetune_points(cfg: FinetuneConfig, ref_key: str, row: SweepRow, lr: float):
    """``(epoch, key, spec)`` of one fine-tuning run's candidates."""
    out = []
    for epoch in range(1, cfg.finetune_epochs + 1):
        spec = finetune_spec(cfg, ref_key, row, lr, epoch)
        out.append((epoch, spec_key(spec), spec))
    return tuple(out)


def features_file(cfg: FinetuneConfig, seed: int, ref_key: str) -> Path:
    return Path(cfg.results_dir) / cfg.name / "features" / f"seed{seed}-{ref_key[:12]}.npz"


def write_features(cfg: FinetuneConfig, seed: int, ref_key: str, ref: CheckpointRef) -> Path:
    """The reference network's penultimate features of every split in one ``.npz`` (the
    layout of :mod:`topkbench.data.features`, with ``splits/<name>`` indices), written
    atomically; kept when it exists (its name carries the reference's key)."""
    from topkbench.atomic import replace_file

    path = features_file(cfg, seed, ref_key)
    if path.exists():
        return path
    from topkbench.deep.network import features

    splits, m, side = load_images(cfg)
    model, _ = _network(cfg, m, side, seed)
    load_weights(model, ref)
    arrays: dict[str, np.ndarray] = {}
    parts, labels, start = [], [], 0
    for s in ("train", "val", "test"):
        X, y = splits[s]
        parts.append(features(model, X))
        labels.append(y.cpu().numpy())
        arrays[f"splits/{s}"] = np.arange(start, start + len(y))
        start += len(y)
    arrays["features"] = np.concatenate(parts)
    arrays["labels"] = np.concatenate(labels)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    return replace_file(path, write)


CLASSIFIER = "classifier"  # the classifier rows' experiment, a store of its own


def classifier_store(cfg: FinetuneConfig) -> tuple[Path, str]:
    """``(root, experiment)`` of the classifier rows' record store."""
    return Path(cfg.results_dir) / cfg.name, CLASSIFIER


def classifier_experiment(cfg: FinetuneConfig, files: dict[int, Path]):
    """The classifier rows as an experiment of the rows layout on the features of each seed's
    reference network (one dataset per seed, C selected on val)."""
    from dataclasses import replace

    from topkbench.config import ExperimentConfig

    root, name = classifier_store(cfg)
    exp = {
        "name": name,
        "title": f"{cfg.title}: the classifier alone on the reference network's features",
        "layout": "rows",
        "selection": "val",
        "ks": list(cfg.ks),
        **cfg.classifier,
        "datasets": [
            {
                "name": f"seed{s}",
                "kind": "features",
                "dir": str(p.parent),  # not in the record keys: the store can move
                "files": {sp: {"file": p.name} for sp in ("train", "val", "test")},
            }
            for s, p in files.items()
        ],
    }
    out = ExperimentConfig.from_dict({"experiment": exp, "seed": cfg.seed})
    return replace(
        out,
        results_dir=str(root),
        n_jobs=cfg.n_jobs,
        scheduler=cfg.scheduler,
    )


def _readable(ref: CheckpointRef | None) -> bool:
    """Whether a reference's weights are on disk and match their SHA-256 (else the network
    is trained again: the same seed gives the same weights)."""
    return ref is not None and read_checkpoint(ref) is not None


def run_finetune(cfg: FinetuneConfig, on_done=None, on_stage=None,
                 on_fit=None) -> list[PathSummary]:  # fmt: skip
    """Every stage of the protocol (module docstring), resuming from the store."""
    require_torch(cfg.device)
    from topkbench.experiments.run import Driver
    from topkbench.experiments.store import RecordStore, WriterLock
    from topkbench.experiments.sweep import run_sweep

    specs = reference_specs(cfg)
    refs = {s: key for s, (key, _) in specs.items()}
    if cfg.classifier.get("rows"):  # its settings refused now, not after the networks
        classifier_experiment(cfg, {s: features_file(cfg, s, key) for s, key in refs.items()})
    store = RecordStore(cfg.results_dir, cfg.name)
    results: list[PathSummary] = []
    with WriterLock(store):
        driver = Driver(cfg, store, on_done, on_fit)
        try:
            done = store.keys()
            tasks = [
                ReferenceTask(s, key, spec)
                for s, (key, spec) in specs.items()
                if key not in done or not _readable(store.checkpoint_ref(key))
            ]
            if tasks and on_stage:
                on_stage("reference networks", len(tasks))
            results += driver.run(tasks)
            tasks = []
            for s, ref_key in refs.items():
                ck = store.checkpoint_ref(ref_key)
                for row in cfg.rows:
                    for lr in cfg.finetune_lrs:
                        points = finetune_points(cfg, ref_key, row, lr)
                        if not all(key in done for _, key, _ in points):
                            tasks.append(FinetuneTask(s, row, lr, ck, points))
            if tasks and on_stage:
                on_stage("fine-tuning", sum(len(t.points) for t in tasks))
            results += driver.run(tasks)
        except BaseException:
            driver.close(kill=True)
            raise
        finally:
            driver.close()
        files = {
            s: write_features(cfg, s, key, store.checkpoint_ref(key)) for s, key in refs.items()
        }
        store.close()
    if cfg.classifier.get("rows"):
        results += run_sweep(classifier_experiment(cfg, files), on_done, on_stage, on_fit)
    return results
