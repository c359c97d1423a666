"""Frozen run specifications built from plain dicts (the CLI converts Hydra configs to dicts).

The core never sees a ``DictConfig`` (STYLE.md); this module is the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from topkbench.dataset_specs import (
    ALL_KINDS,
    GENERATED_KINDS,
    PreprocessSpec,
    kind_spec,
    preprocess_spec,
)
from topkbench.errors import ConfigError
from topkbench.metrics.multilabel import EMPTY_CONVENTIONS
from topkbench.validation import (
    check_bool,
    check_choice,
    check_eval_every,
    check_int,
    check_int_list,
    check_n_jobs,
    check_number,
    check_positive,
    check_solver,
)

DOC_KEYS = frozenset({"title", "paper", "description", "source", "splits_expected"})
# where a dataset's files are, not what they hold: ``dir`` names the directory its relative
# file names are read from (the files' SHA-256 identify the data in record keys, so moving the
# directory keeps its records)
LOCATION_KEYS = frozenset({"dir"})

# integer options' lower bounds; booleans are every spec field typed bool
_DATASET_INTS = {"n_train": 1, "n_val": 0, "n_test": 0, "n_features": 1, "n_classes": 2,
                 "regions": 1}  # fmt: skip
_DATASET_BOOLS = tuple(sorted(
    {f.name for cls in (*ALL_KINDS.values(), PreprocessSpec) for f in fields(cls)
     if f.type == "bool"}
))  # fmt: skip


class StopRule:
    """The stopping rule of a fit, as :func:`topkbench.fit` takes it (a mixin of the configs
    that carry ``eps``, ``max_epochs``, ``time_limit`` and ``eval_every``)."""

    def stop_rule(self) -> dict[str, Any]:
        return {"eps": self.eps, "max_epochs": self.max_epochs, "time_limit": self.time_limit,
                "eval_every": self.eval_every}  # fmt: skip


def method_options(method: str, *, weights: Any = "flat", fw: str | None = None,
                   solver: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The :func:`topkbench.fit` keywords only some methods take: wtopk_svm's rank weights and
    Frank-Wolfe variant, and a solver choice (only when one is made, so that rows without one
    keep their record keys; fit refuses it for a method without that choice)."""
    from topkbench.losses.registry import get_method

    options: dict[str, Any] = {"solver": solver} if solver else {}
    if "weights" in get_method(method).params:
        options["weights"] = weights
    if fw:
        options["fw"] = fw
    return options


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    kind: str
    options: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DatasetConfig:
        if not isinstance(d, dict) or "kind" not in d:
            raise ConfigError("dataset config needs a 'kind' (e.g. dataset=circle)")
        for key, lo in _DATASET_INTS.items():
            if d.get(key) is not None:
                check_int(f"dataset.{key}", d[key], lo)
        n_labels = d.get("n_labels")
        if n_labels is not None and (
            isinstance(n_labels, bool) or not isinstance(n_labels, int) or n_labels == 0
        ):
            raise ConfigError(
                "dataset.n_labels must be a nonzero integer (N: the first N ARFF attributes, "
                f"-N: the last N); got {n_labels!r}"
            )
        for key in _DATASET_BOOLS:
            if key in d and not isinstance(d[key], bool):
                raise ConfigError(f"dataset.{key} must be true or false; got {d[key]!r}")
        if d.get("float32") is not None and not isinstance(d["float32"], bool):
            raise ConfigError(
                f"dataset.float32 must be true, false or null (auto); got {d['float32']!r}"
            )
        if d.get("class_weight") is not None:
            check_choice("dataset.class_weight", d["class_weight"], ("balanced",))
        pca = d.get("pca")
        none = pca is None or pca is False or pca == "nonsingular"
        if not none and (isinstance(pca, bool) or not isinstance(pca, int) or pca < 1):
            raise ConfigError(
                f"dataset.pca must be a number of components >= 1 or 'nonsingular'; got {pca!r}"
            )
        rest = tuple(sorted((k, v) for k, v in d.items() if k not in ("name", "kind")))
        return cls(name=str(d.get("name", d["kind"])), kind=str(d["kind"]), options=rest)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, **dict(self.options)}

    @property
    def spec(self):
        """The typed parameters of this dataset's kind (:mod:`topkbench.dataset_specs`)."""
        return kind_spec(self.kind, dict(self.options))

    @property
    def preprocess(self):
        """The preprocessing every kind shares (:class:`topkbench.dataset_specs.PreprocessSpec`)."""
        return preprocess_spec(dict(self.options))

    def spec_dict(self) -> dict[str, Any]:
        """What determines the data (for record keys): no titles, notes or download URLs."""
        out = {k: v for k, v in self.as_dict().items() if k not in DOC_KEYS | LOCATION_KEYS}
        files = out.get("files")
        if isinstance(files, dict):
            out["files"] = {
                s: {k: v for k, v in e.items() if k != "url"} if isinstance(e, dict) else e
                for s, e in files.items()
            }
        return out


@dataclass(frozen=True)
class TrainConfig(StopRule):
    """One training run (``topkbench train``)."""

    dataset: DatasetConfig
    method: str
    C: float = 1.0
    k: int = 1
    gamma: float = 0.0
    eps: float = 1e-3
    max_epochs: int = 1000
    time_limit: float | None = None
    eval_every: int | str = "auto"
    seed: int = 0
    topk: tuple[int, ...] = (1, 2, 3, 5, 10)
    kernel: str = "linear"
    theta: float | None = None
    delta: float = 0.0  # threshold of the multilabel partition metrics
    empty_label: str = "zero"  # their 0/0 convention: zero (the paper) | one (Mulan)
    weights: Any = "flat"  # wtopk_svm rank weights
    fw: str | None = None  # wtopk_svm: a Frank-Wolfe variant instead of SDCA
    solver: str | None = None  # topk_ent_tr: lbfgs (default) | gd

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        try:
            return cls(
                dataset=DatasetConfig.from_dict(d["dataset"]),
                method=str(d["method"]),
                C=d["C"],
                k=d["k"],
                gamma=d["gamma"],
                eps=d["eps"],
                max_epochs=d["max_epochs"],
                time_limit=d.get("time_limit"),
                eval_every=d.get("eval_every", "auto"),
                seed=check_int("seed", d["seed"], 0),
                topk=tuple(int(v) for v in d.get("topk", (1, 2, 3, 5, 10))),
                kernel=str(d.get("kernel") or "linear"),
                theta=d.get("theta"),
                delta=float(d.get("delta") or 0.0),
                empty_label=_choice(d, "empty_label", "zero", EMPTY_CONVENTIONS),
                weights=d.get("weights", "flat"),
                fw=d.get("fw") or None,
                solver=d.get("solver") or None,
            )
        except KeyError as exc:
            raise ConfigError(f"missing config key {exc.args[0]!r}") from None


@dataclass(frozen=True)
class SweepRow:
    """One row of a paper table: a method with fixed non-C parameters."""

    row: str
    method: str
    gamma: float = 0.0
    k: int = 1
    block: str = ""  # "" = the paper's table; other names are extra report blocks
    paper_row: str = ""  # published row to print beside this one (default: ``row``)
    kernel: str = "linear"  # "rbf": one C path per theta of the experiment's theta grid
    k_values: tuple[int, ...] = ()  # k as a hyper-parameter (Tables 10-12: k in {2,..,5})
    gamma_values: tuple[float, ...] = ()  # gamma as a hyper-parameter (Kato Table 1)
    weights: Any = "flat"  # wtopk_svm: flat | linear | exp | a tuple of rank weights
    fw: str | None = None  # wtopk_svm: a Frank-Wolfe variant instead of SDCA
    solver: str = ""  # topk_ent_tr: lbfgs | gd ("": the method's default)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepRow:
        """A row from YAML; ``k: [2, 3, 4, 5]`` (or a gamma list) makes k (gamma) a
        hyper-parameter selected per column."""
        d = dict(d)
        where = f"row {d.get('row')!r}"
        checks = {"k": lambda name, v: check_int(name, v, 1), "gamma": check_number}
        for key, check in checks.items():  # a list makes it a hyper-parameter
            value = d.get(key)
            if isinstance(value, (list, tuple)):
                if not value:
                    raise ConfigError(f"{where}: empty {key} list")
                d[f"{key}_values"] = tuple(check(f"{where}: {key}", v) for v in value)
                d[key] = d[f"{key}_values"][0]
            elif value is not None:
                d[key] = check(f"{where}: {key}", value)
        if isinstance(d.get("weights"), (list, tuple)):
            d["weights"] = tuple(check_number(f"{where}: weights", v) for v in d["weights"])
        return cls(**d)

    def fit_options(self) -> dict[str, Any]:
        """Extra ``fit`` keywords of this row's method (:func:`method_options`)."""
        return method_options(self.method, weights=self.weights, fw=self.fw, solver=self.solver)

    def variants(self) -> tuple[SweepRow, ...]:
        """The row once per (k, gamma) of its grids (itself when both are fixed)."""
        from dataclasses import replace

        ks = self.k_values or (self.k,)
        gammas = self.gamma_values or (self.gamma,)
        if len(ks) == 1 and len(gammas) == 1:
            return (self,)
        return tuple(replace(self, k=k, gamma=g) for k in ks for g in gammas)


@dataclass(frozen=True)
class ExperimentConfig(StopRule):
    """A sweep over C (and draws) for several rows and datasets, per-k selection (DESIGN §7)."""

    name: str
    title: str
    datasets: tuple[DatasetConfig, ...]
    rows: tuple[SweepRow, ...]
    C_values: tuple[float, ...]
    ks: tuple[int, ...]
    draws: int = 1
    seed: int = 0
    eps: float = 1e-3
    max_epochs: int = 1000
    eval_every: int | str = "auto"
    time_limit: float | None = None
    selection: str = "val"  # val | cv | auto (val where the dataset has a val split, else cv)
    folds: int = 5  # stratified CV folds on train when selecting by cv
    extend: int = 0  # grid points added beyond a boundary that holds a column's best C
    C_base: float = 2.0
    C_step: float = 1.0
    published: str | None = None
    results_dir: str = "results"
    n_jobs: int = 1
    scheduler: str | None = None  # dask.distributed scheduler address; None = local processes
    layout: str = "rows"  # report layout: rows (Table 3) | datasets (Table 5)
    warm_start: bool = True  # warm-start along each C path (False: every fit from zero)
    ent_tr_init: str = "same_C"  # topk_ent_tr start: LR^Multi at the same C | "selected"
    blocks: tuple[tuple[str, str], ...] = ()  # extra report blocks: (name, title)
    # multilabel protocol (Tables 7/9, 10-12): the metrics that each select their own
    # hyper-parameters (C, theta and, for partition metrics, the threshold delta)
    metrics: tuple[str, ...] = ()
    delta_grid: str = "mulan"  # threshold grid: mulan (71 points) | voc (100 points in [0.1, 10])
    theta_values: tuple[float, ...] = ()  # RBF theta = 1/(2 sigma^2) grid for kernel: rbf rows
    max_gram_gb: float = 8.0  # refuse RBF fits whose n x n Gram matrix would exceed this
    class_columns: tuple[str, ...] = ()  # class_ap layout: column names in label order
    threshold_rule: str = "grid"  # grid: delta selected per metric | cardinality: matched
    empty_label: str = "zero"  # 0/0 in the partition metrics: zero (the paper) | one (Mulan)
    # a selected fit stopped on the budget is continued from its dual until eps, within these
    certify_time_limit: float = 600.0
    certify_max_epochs: int = 1_000_000

    @property
    def multilabel(self) -> bool:
        return bool(self.metrics)

    @property
    def dataset(self) -> DatasetConfig:
        return self.datasets[0]

    def selection_for(self, index: int) -> str:
        """``val`` or ``cv`` for dataset ``index`` (``auto`` looks for a validation split)."""
        if self.selection != "auto":
            return self.selection
        return "val" if dataset_has_val(self.datasets[index]) else "cv"

    @classmethod
    def from_dict(cls, root: dict[str, Any]) -> ExperimentConfig:
        exp = root.get("experiment")
        if not exp or "name" not in exp:
            raise ConfigError("no experiment selected", hint="topkbench sweep experiment=table3")
        C_values, base, step = _log_grid(exp, "C_grid")
        theta_values = _log_grid(exp, "theta_grid")[0] if exp.get("theta_grid") else ()
        rows = tuple(SweepRow.from_dict(r) for r in exp["rows"])
        for r in rows:
            if r.kernel not in ("linear", "rbf"):
                raise ConfigError(f"row {r.row!r}: kernel must be linear or rbf; got {r.kernel!r}")
            if r.kernel == "rbf" and not theta_values:
                raise ConfigError(f"row {r.row!r} uses the RBF kernel: give a theta_grid")
        from topkbench.metrics.multilabel import PARTITION_METRICS, is_metric

        metrics = tuple(str(x) for x in exp.get("metrics") or ())
        for name in metrics:
            if not is_metric(name):
                raise ConfigError(
                    f"unknown metric {name!r}; use rloss, map, p@K, r@K (K = 1..10) or one of "
                    f"{', '.join(PARTITION_METRICS)}"
                )
        blocks = tuple((str(k), str(v)) for k, v in (exp.get("blocks") or {}).items())
        name = exp["name"]
        _check_rows(name, rows, blocks, metrics)
        layout = str(exp.get("layout", "rows"))
        if layout not in ("rows", "datasets", "multilabel", "class_ap"):
            raise ConfigError(
                f"layout must be rows, datasets, multilabel or class_ap; got {layout!r}"
            )
        if metrics:
            _check_multilabel_protocol(name, exp, layout, metrics)
        else:
            _check_topk_protocol(name, exp, layout)
        if exp.get("datasets"):
            datasets = tuple(DatasetConfig.from_dict(d) for d in exp["datasets"])
        else:
            datasets = (DatasetConfig.from_dict(root["dataset"]),)
        if len({d.name for d in datasets}) != len(datasets):
            raise ConfigError(f"experiment {exp['name']}: duplicate dataset names")
        _check_class_weights(name, datasets, rows)
        selection = str(exp.get("selection", "val"))
        if selection not in ("val", "cv", "auto", "half"):
            raise ConfigError(f"selection must be val, cv, auto or half, got {selection!r}")
        folds = check_int("experiment.folds", exp.get("folds", 5), 2)
        return cls(
            name=str(exp["name"]),
            title=str(exp.get("title", exp["name"])),
            datasets=datasets,
            rows=rows,
            C_values=C_values,
            ks=check_int_list("experiment.ks", exp.get("ks") or [], 1),
            draws=check_int("experiment.draws", exp.get("draws", 1), 1),
            seed=check_int("seed", root.get("seed", 0), 0),
            eps=check_positive("experiment.eps", exp.get("eps", 1e-3), upper=1.0),
            max_epochs=check_int("experiment.max_epochs", exp.get("max_epochs", 1000), 1),
            eval_every=check_eval_every(exp.get("eval_every", "auto")),
            time_limit=_time_limit(exp.get("time_limit")),
            selection=selection,
            folds=folds,
            extend=check_int("experiment.extend", exp.get("extend", 0), 0),
            C_base=base,
            C_step=step,
            published=exp.get("published"),
            results_dir=str(root.get("results_dir", "results")),
            n_jobs=check_n_jobs(root.get("n_jobs", 1)),
            scheduler=root.get("scheduler") or None,
            layout=layout,
            warm_start=check_bool("experiment.warm_start", exp.get("warm_start", True)),
            ent_tr_init=_choice(exp, "ent_tr_init", "same_C", ("same_C", "selected")),
            blocks=blocks,
            metrics=metrics,
            delta_grid=_choice(exp, "delta_grid", "mulan", ("mulan", "voc")),
            theta_values=theta_values,
            max_gram_gb=check_positive("experiment.max_gram_gb", exp.get("max_gram_gb", 8.0)),
            class_columns=tuple(str(c) for c in exp.get("class_columns") or ()),
            threshold_rule=_choice(exp, "threshold_rule", "grid", ("grid", "cardinality")),
            empty_label=_choice(exp, "empty_label", "zero", EMPTY_CONVENTIONS),
            certify_time_limit=_positive(exp, "certify_time_limit", 600.0, float),
            certify_max_epochs=_positive(exp, "certify_max_epochs", 1_000_000, int),
        )


def _check_rows(name: str, rows, blocks, metrics) -> None:
    """Rows of an experiment: unique labels, known methods (before any work starts), declared
    blocks, and k, gamma, kernel and solver lists that the row's method takes."""
    from topkbench.losses.registry import get_method

    if len({r.row for r in rows}) != len(rows):
        raise ConfigError(f"experiment {name}: duplicate row labels")
    for r in rows:
        spec = get_method(r.method)
        if r.block and r.block not in dict(blocks):
            raise ConfigError(
                f"experiment {name}: row {r.row!r} names block {r.block!r}, "
                f"which is not declared under 'blocks:' ({', '.join(dict(blocks)) or 'none'})"
            )
        if r.k_values and "k" not in spec.params:
            raise ConfigError(f"row {r.row!r}: {spec.name} takes no k, so no k list")
        if any(k < 1 for k in (r.k, *r.k_values)):
            raise ConfigError(f"row {r.row!r}: k must be >= 1")
        if r.kernel == "rbf" and spec.solver != "sdca":
            raise ConfigError(f"row {r.row!r}: {spec.name} has no kernel mode")
        if not metrics and r.kernel == "rbf":
            raise ConfigError(
                f"row {r.row!r}: RBF rows belong to the multilabel protocol (an experiment "
                "with 'metrics:'); the top-k protocol has no theta selection"
            )
        if r.solver:
            check_solver(spec, r.solver)
        if r.fw:
            if "fw" not in spec.params:
                raise ConfigError(f"row {r.row!r}: fw applies to wtopk_svm, not {spec.name}")
            check_choice(f"row {r.row!r}: fw", r.fw, ("standard", "away", "pairwise"))
        if r.gamma_values and "gamma" not in spec.params:
            raise ConfigError(f"row {r.row!r}: {spec.name} takes no gamma, so no gamma list")
        if any(g < 0 for g in r.gamma_values):
            raise ConfigError(f"row {r.row!r}: gamma must be >= 0")


def _check_class_weights(name: str, datasets, rows) -> None:
    """``dataset.class_weight`` weighs the classes of the multiclass rows; multilabel losses
    have no classes to weigh and Frank-Wolfe takes no weights."""
    from topkbench.losses.registry import get_method

    weighted = [d.name for d in datasets if d.get("class_weight") is not None]
    if not weighted:
        return
    for r in rows:
        spec = get_method(r.method)
        if spec.task == "multilabel" or r.fw:
            why = "is multilabel" if spec.task == "multilabel" else "uses Frank-Wolfe (unweighted)"
            raise ConfigError(
                f"experiment {name}: dataset {weighted[0]} sets class_weight, and row "
                f"{r.row!r} ({spec.name}) {why}",
                hint="drop dataset.class_weight, or that row",
            )


def _check_multilabel_protocol(name: str, exp: dict[str, Any], layout: str, metrics) -> None:
    """Tables 7/9 and 10-12: fixed grids, a multilabel layout, and mAP for class_ap."""
    if int(exp.get("extend", 0)) > 0:
        raise ConfigError(
            f"experiment {name}: the multilabel protocol uses fixed grids (extend: 0)"
        )
    if layout not in ("multilabel", "class_ap"):
        raise ConfigError(f"experiment {name}: with metrics, layout is multilabel or class_ap")
    if layout == "class_ap" and "map" not in metrics:
        raise ConfigError(f"experiment {name}: layout class_ap selects by map: add it")


def _check_topk_protocol(name: str, exp: dict[str, Any], layout: str) -> None:
    """Tables 3/5: top-k columns and a top-k layout."""
    if not exp.get("ks"):
        raise ConfigError(
            f"experiment {name}: give the top-k columns 'ks' (or 'metrics' for the "
            "multilabel protocol)"
        )
    if layout in ("multilabel", "class_ap"):
        raise ConfigError(f"experiment {name}: layout {layout} needs 'metrics'")


def _log_grid(exp: dict[str, Any], key: str) -> tuple[tuple[float, ...], float, float]:
    """``base ** e`` for ``e = min_exp, min_exp + step, ..., max_exp``; returns (values, base,
    step)."""
    grid = exp[key]
    if not isinstance(grid, dict) or not {"base", "min_exp", "max_exp"} <= set(grid):
        raise ConfigError(f"experiment.{key} needs base, min_exp and max_exp (and step); "
                          f"got {grid!r}")  # fmt: skip
    base = check_number(f"experiment.{key}.base", grid["base"])
    step = check_number(f"experiment.{key}.step", grid.get("step", 1.0))
    lo = check_number(f"experiment.{key}.min_exp", grid["min_exp"])
    hi = check_number(f"experiment.{key}.max_exp", grid["max_exp"])
    if not (base > 1.0 and step > 0.0 and hi >= lo):
        raise ConfigError(
            f"experiment {exp['name']}: {key} needs base > 1, step > 0, max_exp >= min_exp"
        )
    exps = lo + step * np.arange(int(round((hi - lo) / step)) + 1)
    return tuple(float(base**e) for e in exps), base, step


def _time_limit(value) -> float | None:
    return None if value is None else check_positive("experiment.time_limit", value)


def _positive(d: dict[str, Any], key: str, default, cast):
    value = d.get(key, default)
    try:
        out = cast(value)
        ok = out > 0 and out == float(value)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{key} must be a positive {cast.__name__}; got {value!r}")
    return out


def _choice(d: dict[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    return check_choice(key, str(d.get(key, default)), allowed)


def dataset_has_val(cfg: DatasetConfig) -> bool:
    """Whether a dataset comes with a validation split (generated sets: n_val > 0)."""
    if cfg.kind in GENERATED_KINDS:
        return cfg.spec.n_val > 0
    files = cfg.get("files") or {"val": cfg.get("val")}
    return isinstance(files, dict) and files.get("val") is not None
