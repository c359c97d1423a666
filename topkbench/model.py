"""The trained model and :func:`fit` (DESIGN §9)."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from topkbench.errors import ConfigError, ConvergenceWarning, InputError
from topkbench.feature_map import FeatureMap
from topkbench.gram import check_gram
from topkbench.losses.registry import get_method
from topkbench.solvers.plan import ACCELERATE_MODES
from topkbench.solvers.problem import TracePoint
from topkbench.solvers.sdca import solve_sdca
from topkbench.validation import (
    check_choice,
    check_eval_every,
    check_features,
    check_int,
    check_method_params,
    check_multilabel,
    check_positive,
    check_solver,
    class_indices,
    example_weights,
)

logger = logging.getLogger(__name__)


class WarmStart(NamedTuple):
    """A point of a path to continue from: the dual ``A`` at ``C``, and for a linear fit's
    second-order phase the primal point ``W`` it certified and the last smoothing of its
    continuation (``gamma_start``).  :meth:`Model.warm_state` gives it and an experiment's
    checkpoint stores exactly it, so that a path resumed from its checkpoint takes the same
    steps as one continued in memory.  The pair ``(C, A)`` is a WarmStart without the rest."""

    C: float
    A: NDArray[np.float64]
    W: NDArray[np.float64] | None = None
    gamma_start: float | None = None


@dataclass
class Model:
    """A trained linear model with its optimization certificate.

    ``primal``, ``dual`` and ``relative_gap`` are in the P(W) scale of DESIGN §2.
    """

    method: str
    params: dict[str, Any]
    W: NDArray[np.float64] | None  # None for kernel models
    A: NDArray[np.float64]
    primal: float
    dual: float
    relative_gap: float
    status: str
    epochs: int
    train_seconds: float
    trace: list[TracePoint] = field(default_factory=list)
    kernel: str | None = None  # None (linear), "precomputed" or "rbf"
    theta: float | None = None  # RBF width, K = exp(-theta |x - z|^2)
    X_train: Any = None  # kept by RBF models to evaluate the train-test kernel
    info: dict[str, Any] = field(default_factory=dict)  # solver-specific extras
    classes: NDArray | None = None  # the label of each score column (None: 0..m-1)
    feature_map: FeatureMap | None = None  # applied to X first (None: X is used as given)
    sample_weight: NDArray[np.float64] | None = None  # the w_i of the fit (None: all 1)

    @classmethod
    def from_result(cls, res, *, method: str, params: dict[str, Any], epochs: int,
                    kernel: str | None = None, theta: float | None = None, X=None,
                    info: dict[str, Any] | None = None, A=None) -> Model:  # fmt: skip
        """The model of a solver result (primal, dual, gap, status, seconds, trace, W, A);
        RBF models keep ``theta`` and their training features ``X``; ``A`` replaces the
        result's dual (e.g. widened to rows that training left out)."""
        rbf = kernel == "rbf"
        return cls(
            method=method, params=params, W=res.W, A=res.A if A is None else A,
            primal=res.primal, dual=res.dual, relative_gap=res.relative_gap,
            status=res.status, epochs=epochs, train_seconds=res.seconds, trace=res.trace,
            kernel=kernel, theta=theta if rbf else None, X_train=X if rbf else None,
            info=info or {},
        )  # fmt: skip

    def warm_state(self) -> WarmStart:
        """The point a fit continues from (:class:`WarmStart`): this model's C and dual, and
        for a linear model its primal and the last smoothing of its continuation."""
        stages = self.info.get("gamma_stages")
        return WarmStart(float(self.params["C"]), self.A, self.W if self.kernel is None else None,
                         float(stages[-1]) if stages else None)  # fmt: skip

    @property
    def n_classes(self) -> int:
        return (self.W if self.W is not None else self.A).shape[1]

    @property
    def n_features(self) -> int | None:
        """Width of the features the model takes (None for a precomputed kernel)."""
        if self.feature_map is not None:
            return self.feature_map.n_features
        if self.W is not None:
            return self.W.shape[0]
        return None if self.X_train is None else self.X_train.shape[1]

    def save(self, path, *, training_data: dict[str, Any] | None = None):
        """Write the model to one ``.npz`` file (arrays plus JSON metadata, no pickle):
        :func:`topkbench.persist.save_model`."""
        from topkbench.persist import save_model

        return save_model(self, path, training_data=training_data)

    @classmethod
    def load(cls, path) -> Model:
        """The model saved at ``path`` by :meth:`save` (``topkbench.load``).  A linear model
        comes back without its dual (``A`` is None), so it cannot warm-start a fit."""
        from topkbench.persist import read_model

        arrays, meta = read_model(path)
        cert = meta["certificate"]
        fmap = None
        if meta["feature_map"] is not None:
            fm = meta["feature_map"]
            fmap = FeatureMap(n_features=int(fm["n_features"]), shift=arrays.get("shift"),
                              div=arrays.get("div"), bias=float(fm["bias"]))  # fmt: skip
        info = dict(meta["info"] or {})
        if meta.get("training_data") is not None:
            info["training_data"] = meta["training_data"]

        def number(v) -> float:  # JSON keeps NaN (no gap: nonconvex methods) as null
            return float("nan") if v is None else float(v)

        return cls(
            method=meta["method"], params=meta["params"], W=arrays.get("W"), A=arrays.get("A"),
            primal=number(cert["primal"]), dual=number(cert["dual"]),
            relative_gap=number(cert["relative_gap"]), status=cert["status"],
            epochs=int(cert["epochs"]), train_seconds=float(cert["train_seconds"]),
            kernel=meta["kernel"], theta=meta["theta"], X_train=arrays.get("X_train"),
            info=info, classes=None if meta["classes"] is None else np.asarray(meta["classes"]),
            feature_map=fmap, sample_weight=arrays.get("sample_weight"),
        )  # fmt: skip

    @property
    def converged(self) -> bool:
        return self.status == "converged"

    def certificate(self) -> dict[str, Any]:
        """Primal, dual and relative gap (P(W) scale), status, epochs and training seconds."""
        return {"primal": self.primal, "dual": self.dual, "relative_gap": self.relative_gap,
                "status": self.status, "epochs": self.epochs,
                "train_seconds": self.train_seconds}  # fmt: skip

    def decision_function(self, X=None, *, K=None) -> NDArray[np.float64]:
        """Scores for each test row (n_test x m).

        Linear models: ``f(x) = W^T x``.  Kernel models: ``f = K A`` with ``K`` the test x
        train kernel; RBF models compute it from ``X`` themselves, precomputed-kernel models
        need ``K=``.
        """
        if X is not None and self.feature_map is not None:
            X = self.feature_map.apply(check_features(X))
        if self.kernel is None:
            if X is None:
                raise InputError("decision_function needs X (a linear model)")
            X = check_features(X)
            if X.shape[1] != self.W.shape[0]:
                raise InputError(
                    f"X has {X.shape[1]} features, the model was trained on {self.W.shape[0]}"
                )
            return np.asarray(X @ self.W)
        n_train = self.A.shape[0]
        if K is None:
            if self.kernel != "rbf" or X is None:
                raise InputError(
                    "this model was trained on a precomputed kernel: pass K = the "
                    f"test x train kernel (n_test x {n_train})"
                )
            from topkbench.gram import rbf_kernel

            X = check_features(X).astype(np.float64, copy=False)
            K = rbf_kernel(X, self.X_train, theta=self.theta)
        K = np.asarray(K, dtype=np.float64)
        if K.ndim != 2 or K.shape[1] != n_train:
            raise InputError(f"K must be n_test x {n_train} (test x train); got {K.shape}")
        return K @ self.A

    def trace_frame(self):
        import pandas as pd

        return pd.DataFrame(self.trace, columns=TracePoint._fields)


def fit(
    X,
    Y,
    method: str,
    *,
    K=None,
    kernel: str | None = None,
    theta: float | None = None,
    C: float = 1.0,
    k: int = 1,
    gamma: float = 0.0,
    eps: float = 1e-3,
    max_epochs: int = 1000,
    seed: int = 0,
    time_limit: float | None = None,
    eval_every: int | str = "auto",
    n_classes: int | None = None,
    warm_start: Model | tuple[float, NDArray[np.float64]] | None = None,
    init: Model | None = None,
    warn: bool = True,
    check_kernel: bool = True,
    weights="flat",
    fw: str | None = None,
    accelerate: str = "auto",
    solver: str | None = None,
    sample_weight=None,
    class_weight=None,
) -> Model:
    """Train ``method`` on features ``X`` (dense or CSR, n x d) and targets ``Y``.

    Minimizes ``P(W) = lambda/2 ||W||^2 + 1/n sum_i L(y_i, W^T x_i)`` with
    ``C = 1/(lambda n)`` (DESIGN §2) and certifies the result with the duality gap.

    ``Y`` holds 0-based class indices for the multiclass methods; for the multilabel methods
    (``svm_ml``, ``lr_ml``) an n x m 0/1 indicator (dense or sparse), or class indices read as
    singleton label sets.  Multilabel examples whose label set is empty or complete carry no
    ranking constraint (TPAMI §3.3): they are left out of training (their dual rows stay 0,
    the count is logged and kept in ``model.info["excluded_examples"]``), and ``n`` in
    ``C = 1/(lambda n)`` and in P(W) counts the remaining examples.

    Parameters
    ----------
    method : name or alias from ``topkbench methods``.
    K : a precomputed Gram matrix (n x n) instead of ``X`` (pass ``X=None``): kernel SDCA,
        scores ``K A``; predict with ``model.decision_function(K=K_test_train)``.
    kernel, theta : ``kernel="rbf"`` trains on ``K = exp(-theta |x_i - x_j|^2)`` computed from
        ``X`` (``theta = 1/(2 sigma^2) > 0``); the model keeps ``X`` to predict.
    C : regularization, ``C = 1/(lambda n) > 0``.
    k : the k of a top-k loss, in ``[1, m-1]``; methods without k require ``k = 1``.
    gamma : smoothing (``>= 0``) for the methods that take it; 0 means the nonsmooth loss.
    eps : stop when the relative duality gap ``(P-D)/max(|P|,|D|) <= eps``.
    max_epochs, time_limit : budgets; stopping on them warns with ``ConvergenceWarning``.
    eval_every : epochs between duality-gap certificates (SDCA), or ``"auto"`` (default:
        :func:`topkbench.solvers.sdca.auto_batch`, a deterministic schedule that keeps the
        certificates at about a fifth of the run, and at a few per cent of a long run that no
        certificate can hand over to a faster phase).
    seed : drives the per-epoch permutations.
    warm_start : a model of the same method on the same data (e.g. the previous C on a path),
        its :meth:`Model.warm_state`, or a pair ``(C_old, A_old)``; the dual is rescaled by
        ``C_new / C_old`` (which keeps it feasible) and W recomputed.
    weights, fw : ``wtopk_svm`` only: the rank weights (``flat``, ``linear``, ``exp`` or a
        non-increasing non-negative sequence; Kato §7.3), and ``fw``: None (default) solves
        it by SDCA with the exact projection of :mod:`topkbench.prox.permutahedron`, a
        Frank-Wolfe variant (``standard``, ``away``, ``pairwise``; Kato §5) by Frank-Wolfe,
        whose ``max_epochs`` bounds the iterations.
    accelerate : SDCA only: ``"auto"`` (default) hands an ill-conditioned problem (``C
        max||x||^2`` large) to Newton's method in the primal at the first certificate when the
        features have ``d m <= 1024`` (:mod:`topkbench.solvers.newton`), and otherwise, once
        plain SDCA is seen to progress slowly, to accelerated SDCA (Catalyst's proximal outer
        loop; :mod:`topkbench.solvers.accelerated`); the nonsmooth hinges go through smoothing
        continuation, and every phase certifies the same problem. ``"never"`` is plain SDCA;
        ``"catalyst"`` and ``"newton"`` force that phase from the first certificate whenever
        the condition number exceeds 1.
    solver : ``topk_ent_tr`` only: ``"lbfgs"`` (default) or ``"gd"``, the authors' batch
        gradient descent with its own stopping rule (:func:`~topkbench.solvers.ent_tr.
        solve_ent_tr_gd`), which is what the paper's Ent_tr numbers come from.
    sample_weight, class_weight : weights of the examples' losses, ``P(W) = lambda/2 ||W||^2
        + 1/n sum_i w_i L(y_i, W^T x_i)`` with ``w_i = sample_weight_i class_weight[y_i]``;
        ``class_weight`` is ``"balanced"`` (``n / (m n_c)``) or a dict label -> weight
        (multiclass only).  SDCA methods only; each example's dual box scales by ``w_i`` and
        the certificate stays exact.  Examples of weight 0 are left out (``n`` counts the
        others, as for the multilabel exclusions).
    check_kernel : verify that ``K`` is finite and symmetric (O(n^2) per call); callers that
        built ``K`` themselves with :func:`topkbench.gram.rbf_kernel` may skip it.
    init : for ``topk_ent_tr`` only, the model whose ``W`` the descent starts from (TPAMI §6.2:
        the selected LR^Multi solution); without it, LR^Multi is first solved at the same C.
    """
    spec = get_method(method)
    X, gram, kernel, theta = _fit_inputs(spec, X, K, kernel, theta, fw, check_kernel)
    n_rows = gram.shape[0] if gram is not None else X.shape[0]
    y, m, classes, keep = _fit_targets(spec, Y, n_rows, n_classes, warn)
    ex_w, keep = _fit_weights(spec, sample_weight, class_weight, y, m, classes, keep, fw)
    _check_memory(X if gram is None else None, n_rows, m)
    C = check_positive("C", C)
    gamma, k = check_method_params(spec, gamma, k, m)
    eps = check_positive("eps", eps, upper=1.0)
    max_epochs = check_int("max_epochs", max_epochs, 0)
    seed = check_int("seed", seed, 0)
    eval_every = check_eval_every(eval_every)
    accelerate = check_choice("accelerate", accelerate, ACCELERATE_MODES)
    solver = check_solver(spec, solver)
    if time_limit is not None:
        time_limit = check_positive("time_limit", time_limit)
    rho = None
    if "weights" in spec.params:
        from topkbench.solvers.frank_wolfe import weight_vector

        rho = weight_vector(weights, k, m)
    elif not isinstance(weights, str) or weights != "flat":
        raise ConfigError(f"weights= is an option of wtopk_svm, not of {spec.name}")
    if init is not None and spec.solver != "lbfgs":
        raise ConfigError(f"init= is for topk_ent_tr; {spec.name} takes warm_start=")
    if fw is not None:
        model = _fit_frank_wolfe(
            gram if gram is not None else X, y, m, spec.name, gram=gram is not None, C=C, k=k,
            gamma=gamma, weights=weights, fw=fw, eps=eps, max_epochs=max_epochs, seed=seed,
            time_limit=time_limit, warm_start=warm_start, warn=warn, kernel=kernel,
            theta=theta, X=X,
        )  # fmt: skip
    elif spec.solver == "lbfgs":
        model = _fit_ent_tr(
            X, y, m, spec.name, C=C, k=k, eps=eps, max_epochs=max_epochs, seed=seed,
            time_limit=time_limit, eval_every=eval_every, warm_start=warm_start, init=init,
            warn=warn, solver=solver, weights=ex_w,
        )  # fmt: skip
    else:
        A0 = _warm_dual(warm_start, spec.name, (n_rows, m), C, ex_w, k=k, rank_weights=rho)
        W_shape = None if gram is not None else (X.shape[1], m)
        res, A, info = _solve_kept_rows(
            gram if gram is not None else X, y, keep, ex_w, A0, gram=gram is not None,
            n_classes=m, loss_id=spec.loss_id, C=C, gamma=gamma, k=k, eps=eps,
            max_epochs=max_epochs, time_limit=time_limit, eval_every=eval_every, seed=seed,
            warn=warn, accelerate=accelerate, rho=rho,
            **_warm_primal(warm_start, spec.name, W_shape),
        )  # fmt: skip
        params = {"C": C, "k": k, "gamma": gamma, "eps": eps, "seed": seed}
        if rho is not None:
            params["weights"] = weights if isinstance(weights, str) else [float(v) for v in rho]
            info["rho"] = [float(v) for v in rho]
        model = Model.from_result(res, method=spec.name, params=params, epochs=res.epochs,
                                  kernel=kernel, theta=theta, X=X, info=info, A=A)  # fmt: skip
        model.sample_weight = ex_w
    model.classes = classes
    return model


def _fit_inputs(spec, X, K, kernel, theta, fw, check_kernel):
    """The training inputs of :func:`fit`, checked: ``(X, gram, kernel, theta)`` with ``gram``
    the precomputed or RBF Gram matrix (None for a linear model) and ``kernel`` None,
    ``"precomputed"`` or ``"rbf"``."""
    if "fw" not in spec.params and fw is not None:
        raise ConfigError(f"fw= is an option of wtopk_svm, not of {spec.name}")
    if (K is not None or kernel == "rbf") and spec.solver != "sdca":
        raise ConfigError(f"method {spec.name} ({spec.solver}) has no kernel mode")
    if K is not None:
        if X is not None or kernel not in (None, "precomputed"):
            raise ConfigError("pass either X (with an optional kernel=) or K=, not both")
        gram = check_gram(K) if check_kernel else np.ascontiguousarray(K, dtype=np.float64)
        return None, gram, "precomputed", theta
    if X is None:
        raise InputError("fit needs features X or a Gram matrix K=")
    X = check_features(X)
    if X.dtype == np.float32 and (spec.solver != "sdca" or kernel == "rbf" or fw):
        X = X.astype(np.float64)  # float32 is an SDCA (linear) option
    if kernel not in (None, "linear", "rbf"):
        raise ConfigError(f"kernel must be 'linear' or 'rbf'; got {kernel!r}")
    if kernel != "rbf":
        if theta is not None:
            raise ConfigError(
                f"theta= is the RBF kernel's width; it does not apply to kernel={kernel!r} "
                "(give kernel='rbf' with it, or leave it out)"
            )
        return X, None, None, None
    if theta is None:
        raise ConfigError("kernel='rbf' needs theta > 0 (K = exp(-theta |x-z|^2))")
    theta = check_positive("theta", theta)
    from topkbench.gram import rbf_kernel

    return X, rbf_kernel(X, theta=theta), "rbf", theta


def _fit_targets(spec, Y, n_rows: int, n_classes, warn: bool):
    """The targets of :func:`fit`, checked: ``(y, m, classes, keep)``, ``y`` the class indices
    (multiclass, with ``classes`` their labels) or the label sets as a CSR indicator
    (multilabel), and ``keep`` the rows to train on (None: all; multilabel examples whose
    label set is empty or complete carry no ranking constraint, TPAMI §3.3)."""
    if spec.task != "multilabel":
        if sp.issparse(Y) or np.ndim(Y) == 2:
            raise InputError(
                f"method {spec.name} is multiclass and needs 1-D labels (one class index per "
                "example); for multilabel targets use svm_ml or lr_ml (or a primary-label column)"
            )
        y, m, classes = class_indices(Y, n_rows, n_classes)
        return y, m, classes, None
    y, m = check_multilabel(Y, n_rows, n_classes)
    sizes = np.diff(y.indptr)
    keep = (sizes > 0) & (sizes < m)
    excluded = int(n_rows - keep.sum())
    if excluded == n_rows:
        raise InputError(
            f"every one of the {n_rows} training examples has an empty or complete label "
            "set; a multilabel ranking loss needs at least one with 0 < |Y| < m"
        )
    if not excluded:
        return y, m, None, None
    logger.log(
        logging.INFO if warn else logging.DEBUG,
        "%s: %d of %d training examples have an empty or complete label set and are "
        "left out of training (no ranking constraint)",
        spec.name, excluded, n_rows,
    )  # fmt: skip
    return y, m, None, keep


def _fit_weights(spec, sample_weight, class_weight, y, m: int, classes, keep, fw):
    """The examples' weights ``w_i`` (None: all 1) and the rows to train on, those of weight
    0 left out as well."""
    n_rows = y.shape[0]
    codes = None if spec.task == "multilabel" else y
    ex_w = example_weights(sample_weight, class_weight, codes, m, classes, n_rows)
    if ex_w is None or np.all(ex_w == 1.0):
        return None, keep  # the unweighted problem, on the unweighted code path
    if fw is not None:
        raise ConfigError(
            f"sample_weight and class_weight are not available with fw={fw}: the "
            "Frank-Wolfe solver has no weighted form (the default SDCA solver has)"
        )
    if np.any(ex_w == 0.0):
        keep = (ex_w > 0.0) if keep is None else keep & (ex_w > 0.0)
        if not keep.any():
            raise InputError("every example with a label set to rank has weight 0")
    return ex_w, keep


def _solve_kept_rows(F, y, keep, weights, A0, *, gram: bool, **solver):
    """:func:`~topkbench.solvers.sdca.solve_sdca` on the rows ``keep`` (all when None) of
    the features or Gram matrix ``F``, from the dual ``A0`` (a fresh array, which the solver
    may take over); returns ``(result, A, info)`` with the dual widened to every row (0 on
    the rows left out) and the count of those in ``info``."""
    n_rows = F.shape[0]
    if keep is not None:
        rows = np.flatnonzero(keep)
        F = F[rows][:, rows] if gram else F[rows]
        y = y[rows]
        A0 = None if A0 is None else A0[rows]
        weights = None if weights is None else weights[rows]
    res = solve_sdca(F, y, gram=gram, A0=A0, take_A0=True, sample_weight=weights, **solver)
    A, info = res.A, dict(res.info)
    if keep is not None:
        A = np.zeros((n_rows, res.A.shape[1]))
        A[keep] = res.A
        info["excluded_examples"] = int(n_rows - keep.sum())
    if weights is not None:
        info["weighted"] = True
    return res, A, info


def _warm_dual(warm_start, method: str, shape: tuple[int, int], C: float, weights=None, *,
               k: int = 1, rank_weights=None):  # fmt: skip
    """The warm-start dual rescaled to ``C`` and the example weights of the new fit, from a
    model of ``method``, a :class:`WarmStart` or a pair ``(C_old, A_old)``; None without a
    warm start.

    Example i's block lives in its conjugate's domain scaled by ``C w_i``, so the block is
    rescaled by ``C w_i / (C_old w_old_i)`` (feasible again); a row of old weight 0 holds 0
    and stays 0.  A pair carries no weights: it is taken to come from a fit with the same
    weights as this one (an experiment's path).  A model of another k (or, for wtopk_svm,
    other rank weights) has another conjugate domain, and is refused."""
    if warm_start is None:
        return None
    if isinstance(warm_start, Model):
        if warm_start.method != method:
            raise ConfigError(f"warm_start is a {warm_start.method} model; expected {method}")
        if warm_start.A is None:
            raise ConfigError("warm_start: this model keeps no dual (a saved linear model)")
        if warm_start.params.get("k", 1) != k:
            raise ConfigError(
                f"warm_start was fit with k = {warm_start.params.get('k', 1)}; this fit has "
                f"k = {k} (another dual domain)"
            )
        old_rho = warm_start.info.get("rho")
        if rank_weights is not None and (
            old_rho is None or not np.array_equal(np.asarray(old_rho), rank_weights)
        ):
            raise ConfigError("warm_start was fit with other rank weights (another dual domain)")
        C_old, A_old, w_old = warm_start.params["C"], warm_start.A, warm_start.sample_weight
    elif isinstance(warm_start, WarmStart) or (
        isinstance(warm_start, tuple | list) and len(warm_start) == 2
    ):
        C_old, A_old, w_old = warm_start[0], np.asarray(warm_start[1]), weights
    else:
        raise ConfigError(
            "warm_start must be a Model, its warm_state() or a pair (C_old, A_old); got "
            f"{type(warm_start).__name__}"
        )
    if A_old.shape != shape:
        raise ConfigError(
            f"warm_start dual has shape {A_old.shape}; expected {shape} (same training data)"
        )
    new = np.full(shape[0], float(C)) if weights is None else C * weights
    old = np.full(shape[0], float(C_old)) if w_old is None else C_old * w_old
    ratio = np.divide(new, old, out=np.zeros(shape[0]), where=old > 0.0)
    return A_old * ratio[:, None]


def _warm_primal(warm_start, method: str, shape: tuple[int, int] | None) -> dict[str, Any]:
    """What a second-order phase may start from besides the warm dual: the warm point's own
    primal ``W_start`` (near the optimum on a C path, where the rescaled dual's ``X^T A`` is
    not) and the last smoothing of its continuation ``gamma_start`` (a model's
    :meth:`~Model.warm_state`, or a :class:`WarmStart`), for a linear fit whose ``W`` has
    ``shape`` (None: a kernel fit, which takes neither)."""
    if isinstance(warm_start, Model):
        warm_start = warm_start.warm_state() if warm_start.method == method else None
    if shape is None or not isinstance(warm_start, WarmStart):
        return {}
    out: dict[str, Any] = {}
    if warm_start.W is not None:
        if np.shape(warm_start.W) != shape:
            raise ConfigError(
                f"warm_start primal W has shape {np.shape(warm_start.W)}; expected {shape} "
                "(same features and classes)"
            )
        out["W_start"] = warm_start.W
    if warm_start.gamma_start is not None:
        out["gamma_start"] = float(warm_start.gamma_start)
    return out


def _available_memory() -> float | None:
    """Bytes the kernel can give without swapping (``MemAvailable``: free memory plus the
    reclaimable page cache, which memory-mapped features fill), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _check_memory(X, n: int, m: int) -> None:
    """Refuse a problem whose W (d x m) and dual (n x m) would not fit in memory, with the
    figure: a stray label of 2^40 or a feature index of 1e11 would otherwise end in a
    MemoryError (or in swap) deep inside the solver."""
    d = 0 if X is None else X.shape[1]
    need = 8.0 * (d * m + 2 * n * m)
    avail = _available_memory()
    if avail is None:
        return
    if need > avail:
        raise InputError(
            f"the model needs {need / 2**30:.1f} GB (W: {d:,} features x {m:,} classes, "
            f"dual: {n:,} x {m:,}), more than the {avail / 2**30:.1f} GB of available memory; "
            "check the feature indices and labels of the data"
        )


def _fit_frank_wolfe(F, y, m, name, *, gram, C, k, gamma, weights, fw, eps, max_epochs, seed,
                     time_limit, warm_start, warn, kernel, theta, X) -> Model:  # fmt: skip
    """``wtopk_svm`` by Frank-Wolfe (solvers/frank_wolfe.py, Kato §5-6)."""
    from topkbench.solvers.frank_wolfe import (
        VARIANTS,
        as_operator,
        solve_frank_wolfe,
        weight_vector,
    )

    if fw not in VARIANTS:
        raise ConfigError(f"fw must be one of {', '.join(VARIANTS)}; got {fw!r}")
    rho = weight_vector(weights, k, m)
    A0 = _warm_dual(warm_start, name, (F.shape[0], m), C, k=k, rank_weights=rho)
    res = solve_frank_wolfe(
        F if gram else as_operator(F), y, gram=gram, n_classes=m, rho=rho, C=C, gamma=gamma,
        variant=fw, eps=eps, max_iter=max_epochs, time_limit=time_limit, warn=warn, A0=A0,
    )  # fmt: skip
    params = {"C": C, "k": k, "gamma": gamma, "eps": eps, "seed": seed,
              "weights": weights if isinstance(weights, str) else [float(v) for v in rho],
              "fw": fw}  # fmt: skip
    return Model.from_result(res, method=name, params=params, epochs=res.iterations,
                             kernel=kernel, theta=theta, X=X,
                             info={"steps": res.steps, "rho": [float(v) for v in rho]})  # fmt: skip


def _fit_ent_tr(X, y, m, name, *, C, k, eps, max_epochs, seed, time_limit, eval_every,
                warm_start, init, warn, solver, weights=None) -> Model:  # fmt: skip
    """top-k Ent_tr: L-BFGS, or the authors' gradient descent (``solver="gd"``; both in
    solvers/ent_tr.py) from ``init.W`` (a trained LR^Multi model, the TPAMI §6.2 protocol), or
    from LR^Multi solved at the same C.

    ``eps`` is the relative gradient tolerance of L-BFGS and the duality-gap tolerance of the
    LR^Multi start; ``max_epochs`` bounds both.  Gradient descent keeps the authors' own
    stopping rule (``||grad F||_2 <= 1e-3`` or 1,000 iterations) whatever ``eps`` is.  The
    returned ``A`` is the LR^Multi dual of the starting point, so a model can warm-start the
    next C of a path (the LR^Multi path is warm-started, then Ent_tr restarts from its
    solution).  No duality gap exists for this
    nonconvex loss: ``dual`` and ``relative_gap`` are NaN.
    """
    from topkbench.solvers.ent_tr import solve_ent_tr, solve_ent_tr_gd

    def descend(W0):
        if solver == "gd":
            return solve_ent_tr_gd(X, y, W0, C=C, k=k, weights=weights)
        return solve_ent_tr(X, y, W0, C=C, k=k, gtol=eps, max_iter=max(1, max_epochs),
                            weights=weights)  # fmt: skip

    if init is not None:
        if init.W is None or init.W.shape != (X.shape[1], m):
            raise ConfigError(
                f"init needs a linear model with W of shape {(X.shape[1], m)} on these features"
            )
        start = init
        r = descend(init.W)
        return _ent_tr_model(name, C, k, eps, seed, start, r, warn, 0.0, solver)
    lr_warm = warm_start
    if isinstance(warm_start, Model):
        if warm_start.method not in (name, "lr_multi"):
            raise ConfigError(
                f"warm_start is a {warm_start.method} model; expected {name} or lr_multi"
            )
        lr_warm = (warm_start.params["C"], warm_start.A)
    elif warm_start is not None:
        # the dual only: an Ent_tr model's W (in a WarmStart) is no LR^Multi primal point
        lr_warm = (warm_start[0], warm_start[1])
    start = fit(
        X, y, "lr_multi", C=C, eps=eps, max_epochs=max_epochs, seed=seed,
        time_limit=time_limit, eval_every=eval_every, n_classes=m, warm_start=lr_warm,
        warn=warn, sample_weight=weights,
    )  # fmt: skip
    # for k = 1 (LR^Multi) the descent only confirms stationarity of the start
    r = descend(start.W)
    return _ent_tr_model(name, C, k, eps, seed, start, r, warn, start.train_seconds, solver)


def _ent_tr_model(name, C, k, eps, seed, start, r, warn, init_seconds: float, solver) -> Model:
    """The Model of an Ent_tr run: descent result ``r`` started from LR^Multi model ``start``."""
    if r.status != "converged" and warn:
        label = "gradient descent" if solver == "gd" else "L-BFGS"
        warnings.warn(
            f"top-k Ent_tr {label} stopped on {r.status} after {r.iterations} iterations "
            f"({r.message}); the result is the last point reached",
            ConvergenceWarning,
            stacklevel=3,
        )
    return Model(
        method=name,
        params={"C": C, "k": k, "gamma": 0.0, "eps": eps, "seed": seed, "solver": solver},
        W=r.W,
        A=start.A,
        primal=r.primal,
        dual=float("nan"),
        relative_gap=float("nan"),
        status=r.status,
        epochs=r.iterations,
        train_seconds=init_seconds + r.seconds,
        trace=r.trace,
        info={
            "grad_norm": r.grad_norm,
            "solver": solver,
            "solver_message": r.message,
            "init_method": "lr_multi",
            "init_C": start.params["C"],
            "init_primal": start.primal,
            "init_relative_gap": start.relative_gap,
            "init_epochs": start.epochs,
            "init_status": start.status,
        },
    )


__all__ = ["FeatureMap", "Model", "fit"]
