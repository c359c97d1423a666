"""The fine-tuning protocol's configuration (``layout: finetune``, TPAMI Table 6), built from
the composed experiment dict and checked here, without importing torch.

An experiment of this layout names one image dataset and holds, besides its name, title and
published numbers:

* ``seeds``: how many networks (seed ``seed``, ``seed + 1``, ...; each drives its network's
  initialization, data order and classifier fits);
* ``network``: the CNN's widths (``channels: [c1, c2]``, ``hidden``);
* ``reference``: the softmax network trained from scratch (``epochs``, the largest number
  tried, and its :class:`Schedule`); its epoch is selected on val by top-1 accuracy;
* ``finetune``: ``epochs`` (each of 1 .. epochs is a candidate), the learning rates ``lrs``
  tried (a constant rate: fine-tuning continues a trained network), and the optimizer's
  momentum, weight decay and batch size, the same for every loss;
* ``rows``: the fine-tuning losses (``row, method, k, gamma``, as in the other tables);
* ``classifier``: the rows trained on the reference network's penultimate features by
  topkbench's solvers (an experiment of the rows layout: ``rows, C_grid, eps, max_epochs,
  extend, ent_tr_init``), TPAMI's "training just the classifier";
* ``device``: ``cpu`` or ``cuda``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topkbench.config import DatasetConfig, SweepRow
from topkbench.errors import ConfigError
from topkbench.validation import (
    check_choice,
    check_int,
    check_int_list,
    check_n_jobs,
    check_positive,
)

LAYOUT = "finetune"
DEVICES = ("cpu", "cuda")
FINETUNE_KEYS = frozenset(
    {
        "name",
        "title",
        "datasets",
        "layout",
        "published",
        "ks",
        "seeds",
        "network",
        "reference",
        "finetune",
        "rows",
        "classifier",
        "device",
    }
)
_SCHEDULE_KEYS = {"lr", "momentum", "weight_decay", "batch_size", "final"}
_NETWORK_KEYS = {"channels", "hidden"}
_REFERENCE_KEYS = _SCHEDULE_KEYS | {"epochs"}
_FINETUNE_KEYS = (_SCHEDULE_KEYS - {"lr", "final"}) | {"epochs", "lrs"}
# the classifier experiment's own keys (its name, data and k columns come from the protocol)
_CLASSIFIER_KEYS = {
    "rows",
    "C_grid",
    "eps",
    "max_epochs",
    "extend",
    "ent_tr_init",
    "time_limit",
    "eval_every",
    "certify_time_limit",
}


def is_finetune(root: dict[str, Any]) -> bool:
    """Whether the composed configuration ``root`` selects an experiment of this layout."""
    exp = root.get("experiment")
    return isinstance(exp, dict) and exp.get("layout") == LAYOUT


@dataclass(frozen=True)
class Schedule:
    """SGD with momentum and weight decay; the learning rate decays by cosine from ``lr``
    to ``lr * final`` over the epochs of one call (``final = 1``: constant)."""

    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_size: int = 64
    final: float = 0.01

    def __post_init__(self):
        check_positive("lr", self.lr)
        check_int("batch_size", self.batch_size, 1)
        check_positive("momentum", self.momentum, allow_zero=True, upper=1.0)
        check_positive("weight_decay", self.weight_decay, allow_zero=True)
        if check_positive("final", self.final) > 1.0:
            raise ConfigError(f"final must be in (0, 1]; got {self.final!r}")


def _section(where: str, value: Any, valid: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of {', '.join(sorted(valid))}")
    if unknown := set(value) - valid:
        raise ConfigError(
            f"unknown {where} key(s): {', '.join(sorted(unknown))}",
            hint=f"valid: {', '.join(sorted(valid))}",
        )
    return dict(value)


def _schedule(where: str, d: dict[str, Any], **fixed) -> Schedule:
    args = {k: v for k, v in d.items() if k in _SCHEDULE_KEYS} | fixed
    try:
        return Schedule(**args)
    except ConfigError as exc:  # named by its key in the experiment
        raise ConfigError(f"{where}.{exc}") from None


REFERENCE_ROW = "LR^Multi"  # Table 6's name of the network before fine-tuning


def _multiclass(row: SweepRow) -> None:
    from topkbench.losses.registry import get_method

    spec = get_method(row.method)
    if spec.task != "multiclass":
        raise ConfigError(f"row {row.row!r}: {spec.name} is a multilabel loss; the fine-tuning "
                          "protocol trains multiclass networks")  # fmt: skip
    if row.k_values or row.gamma_values or row.kernel != "linear":
        raise ConfigError(f"row {row.row!r}: rows of this protocol take one k and one gamma")


def _check_rows(rows: tuple[SweepRow, ...]) -> None:
    """Fine-tuning rows: multiclass losses, each named once
    (not as the reference network) and each a different loss (the records of a loss are
    shared by rows that would train the same one)."""
    losses = set()
    for r in rows:
        _multiclass(r)
        if r.row == REFERENCE_ROW:
            raise ConfigError(f"row {r.row!r} is the reference network's name; name the "
                              "fine-tuned row otherwise, e.g. 'LR^Multi (FT)'")  # fmt: skip
        loss = (r.method, r.k, r.gamma)
        if loss in losses:
            raise ConfigError(f"row {r.row!r} fine-tunes the same loss as another row")
        losses.add(loss)
    if len({r.row for r in rows}) != len(rows):
        raise ConfigError("fine-tuning rows must have different names")


@dataclass(frozen=True)
class FinetuneConfig:
    """A fine-tuning experiment (TPAMI Table 6's protocol on one image dataset)."""

    name: str
    title: str
    dataset: DatasetConfig
    rows: tuple[SweepRow, ...]
    classifier: dict[str, Any]  # the classifier experiment's keys (see the module docstring)
    ks: tuple[int, ...] = (1, 3, 5, 10)
    seeds: int = 5
    seed: int = 0
    channels: tuple[int, int] = (16, 32)
    hidden: int = 128
    reference_epochs: int = 10
    reference: Schedule = Schedule()
    finetune_epochs: int = 3
    finetune_lrs: tuple[float, ...] = (0.01, 0.001)
    finetune: Schedule = Schedule(lr=0.01, final=1.0)  # its lr is each of finetune_lrs
    device: str = "cpu"
    published: str | None = None
    results_dir: str = "results"
    n_jobs: int = 1
    scheduler: None = None  # local workers only (the sweep's driver reads it)
    layout: str = LAYOUT

    @property
    def datasets(self) -> tuple[DatasetConfig, ...]:
        return (self.dataset,)

    @property
    def seed_values(self) -> tuple[int, ...]:
        return tuple(self.seed + i for i in range(self.seeds))

    @classmethod
    def from_dict(cls, root: dict[str, Any]) -> FinetuneConfig:
        exp = root["experiment"]
        name = str(exp["name"])
        datasets = exp.get("datasets") or []
        if len(datasets) != 1:
            raise ConfigError(
                f"experiment {name}: the fine-tuning protocol takes one image "
                f"dataset; got {len(datasets)}"
            )
        dataset = DatasetConfig.from_dict(datasets[0])
        rows = tuple(SweepRow.from_dict(r) for r in exp.get("rows") or ())
        if not rows:
            raise ConfigError(f"experiment {name}: no fine-tuning rows")
        _check_rows(rows)
        network = _section("experiment.network", exp.get("network"), _NETWORK_KEYS)
        ref = _section("experiment.reference", exp.get("reference"), _REFERENCE_KEYS)
        ft = _section("experiment.finetune", exp.get("finetune"), _FINETUNE_KEYS)
        classifier = _section("experiment.classifier", exp.get("classifier"), _CLASSIFIER_KEYS)
        channels = check_int_list(
            "experiment.network.channels", network.get("channels", [16, 32]), 1
        )
        if len(channels) != 2:
            raise ConfigError(
                f"experiment.network.channels must be two integers >= 1 (the two "
                f"convolutions' widths); got {list(channels)}"
            )
        lrs = ft.get("lrs", [0.01, 0.001])
        if not isinstance(lrs, (list, tuple)) or not lrs:
            raise ConfigError(
                f"experiment.finetune.lrs must be a non-empty list of learning "
                f"rates > 0; got {lrs!r}"
            )
        lrs = tuple(check_positive(f"experiment.finetune.lrs[{i}]", v) for i, v in enumerate(lrs))
        ks = check_int_list("experiment.ks", exp.get("ks", [1, 3, 5, 10]), 1)
        if 1 not in ks:
            raise ConfigError(f"experiment.ks must hold 1 (the reference network's epoch is "
                              f"selected by top-1 accuracy); got {list(ks)}")  # fmt: skip
        for i, r in enumerate(classifier.get("rows") or ()):
            if not isinstance(r, dict) or "row" not in r or "method" not in r:
                raise ConfigError(f"experiment.classifier.rows[{i}] needs a row and a method")
            _multiclass(SweepRow.from_dict(r))
        if root.get("scheduler"):
            # the fine-tuning tasks read the reference's weights from the results directory,
            # which a Dask cluster's workers do not have
            raise ConfigError(
                "the fine-tuning protocol runs on local worker processes; scheduler= is not "
                "supported for it",
                hint="use n_jobs=N",
            )
        return cls(
            name=name,
            title=str(exp.get("title", name)),
            dataset=dataset,
            rows=rows,
            classifier=classifier,
            ks=ks,
            seeds=check_int("experiment.seeds", exp.get("seeds", 5), 1),
            seed=check_int("seed", root.get("seed", 0), 0),
            channels=(channels[0], channels[1]),
            hidden=check_int("experiment.network.hidden", network.get("hidden", 128), 1),
            reference_epochs=check_int("experiment.reference.epochs", ref.get("epochs", 10), 1),
            reference=_schedule("experiment.reference", ref),
            finetune_epochs=check_int("experiment.finetune.epochs", ft.get("epochs", 3), 1),
            finetune_lrs=lrs,
            finetune=_schedule("experiment.finetune", ft, lr=lrs[0], final=1.0),
            device=check_choice("experiment.device", exp.get("device", "cpu"), DEVICES),
            published=exp.get("published"),
            results_dir=str(root.get("results_dir", "results")),
            n_jobs=check_n_jobs(root.get("n_jobs", 1)),
        )
