"""Training: :func:`fit` (DESIGN §9), its checked parameters (:class:`FitParams`,
:class:`StopRule`), and the table of solvers it chooses from (:data:`SOLVERS`).

``fit`` checks its inputs (:func:`topkbench.training_data.training_data`) and its parameters
(:func:`fit_params`), takes the first solver of :data:`SOLVERS` that applies to the method,
and returns the :class:`~topkbench.model.Model` that solver builds.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from topkbench.errors import ConfigError, ConvergenceWarning
from topkbench.losses.registry import MethodSpec, get_method
from topkbench.model import Model, warm_dual, warm_primal
from topkbench.training_data import TrainingData, training_data
from topkbench.validation import (
    check_choice,
    check_eval_every,
    check_int,
    check_method_params,
    check_positive,
    check_solver,
)


@dataclass(frozen=True)
class StopRule:
    """When a solver stops.

    ``eps``: the relative duality gap ``(P - D)/max(|P|, |D|) <= eps`` (L-BFGS for top-k
    Ent_tr: its relative gradient tolerance).  ``max_epochs`` (Frank-Wolfe: iterations) and
    ``time_limit`` (seconds, None: none) are budgets: stopping on them warns with
    ``ConvergenceWarning`` when ``warn``.  ``eval_every``: epochs between duality-gap
    certificates (SDCA), or ``"auto"``, :func:`topkbench.solvers.sdca.auto_batch`'s
    deterministic schedule, which keeps the certificates at about a fifth of the run, and at
    a few per cent of a long run that no certificate can hand over to a faster phase.
    """

    eps: float
    max_epochs: int
    time_limit: float | None
    eval_every: int | str
    warn: bool


@dataclass(frozen=True)
class FitParams:
    """A method's parameters, checked against the registry.

    ``C = 1/(lambda n) > 0``; ``k`` in ``[1, m-1]`` for a top-k loss (1 for the others);
    ``gamma >= 0`` the smoothing of the methods that take it (0: the nonsmooth loss);
    ``seed`` drives the per-epoch permutations.  ``accelerate`` (SDCA): ``"auto"`` hands an
    ill-conditioned problem (``C max||x||^2`` large) to Newton's method in the primal
    (:mod:`topkbench.solvers.newton`) or to accelerated SDCA (Catalyst;
    :mod:`topkbench.solvers.accelerated`) by the rules of :mod:`topkbench.solvers.plan`, the
    nonsmooth hinges through smoothing continuation, every phase certifying the same
    problem; ``"never"`` is plain SDCA; ``"catalyst"`` and ``"newton"`` force that phase from
    the first certificate whenever the condition number exceeds 1.  ``solver`` (top-k
    Ent_tr): ``"lbfgs"`` or ``"gd"``, the authors' gradient descent with its own stopping
    rule (:func:`~topkbench.solvers.ent_tr.solve_ent_tr_gd`), which the paper's numbers come
    from.  ``weights`` (``wtopk_svm``): the rank weights as given (``flat``, ``linear``,
    ``exp`` or a non-increasing non-negative sequence; Kato §7.3), ``rho`` as a vector (None
    for the other methods); ``fw``: None solves ``wtopk_svm`` by SDCA with the exact
    projection of :mod:`topkbench.prox.permutahedron`, a Frank-Wolfe variant (``standard``,
    ``away``, ``pairwise``; Kato §5) by Frank-Wolfe.  ``float32`` (linear SDCA):
    ``"auto"`` runs the passes of plain epochs in float32 where every feature value is
    exactly a float32 (binary bag-of-words, pixels in {0, 1}, small integers) or the
    features are float32 already (:func:`topkbench.solvers.problem.keeps_single`: while far
    from eps; every certificate stays float64 and is the same as for the float64 values);
    ``"never"`` keeps them in float64.
    """

    C: float
    k: int
    gamma: float
    seed: int
    accelerate: str
    solver: str | None
    weights: Any
    rho: NDArray[np.float64] | None
    fw: str | None
    float32: str = "auto"

    def model_params(self, stop: StopRule) -> dict[str, Any]:
        """The ``params`` a model records (the weighted hinge's weights as given, or as a
        list)."""
        params = {"C": self.C, "k": self.k, "gamma": self.gamma, "eps": stop.eps,
                  "seed": self.seed}  # fmt: skip
        if self.rho is not None:
            params["weights"] = (self.weights if isinstance(self.weights, str)
                                 else [float(v) for v in self.rho])  # fmt: skip
        return params


def fit_params(spec: MethodSpec, m: int, *, C, k, gamma, eps, max_epochs, seed, time_limit,
               eval_every, warn, accelerate, solver, weights, fw,
               float32="auto") -> tuple[FitParams, StopRule]:  # fmt: skip
    """The parameters of :func:`fit` for ``spec`` on ``m`` classes, checked: impossible
    values are refused with their valid range."""
    from topkbench.solvers.plan import ACCELERATE_MODES

    C = check_positive("C", C)
    gamma, k = check_method_params(spec, gamma, k, m)
    eps = check_positive("eps", eps, upper=1.0)
    max_epochs = check_int("max_epochs", max_epochs, 0)
    seed = check_int("seed", seed, 0)
    eval_every = check_eval_every(eval_every)
    accelerate = check_choice("accelerate", accelerate, ACCELERATE_MODES)
    float32 = check_choice("float32", float32, ("auto", "never"))
    solver = check_solver(spec, solver)
    if time_limit is not None:
        time_limit = check_positive("time_limit", time_limit)
    rho = None
    if "weights" in spec.params:
        from topkbench.solvers.frank_wolfe import weight_vector

        rho = weight_vector(weights, k, m)
    elif not isinstance(weights, str) or weights != "flat":
        raise ConfigError(f"weights= is an option of wtopk_svm, not of {spec.name}")
    return (FitParams(C, k, gamma, seed, accelerate, solver, weights, rho, fw, float32),
            StopRule(eps, max_epochs, time_limit, eval_every, warn))  # fmt: skip


def fit(X, Y, method: str, *, K=None, kernel: str | None = None, theta: float | None = None,
        C: float = 1.0, k: int = 1, gamma: float = 0.0, eps: float = 1e-3,
        max_epochs: int = 1000, seed: int = 0, time_limit: float | None = None,
        eval_every: int | str = "auto", n_classes: int | None = None,
        warm_start: Model | tuple[float, NDArray[np.float64]] | None = None,
        init: Model | None = None, warn: bool = True, check_kernel: bool = True,
        weights="flat", fw: str | None = None, accelerate: str = "auto",
        solver: str | None = None, sample_weight=None, class_weight=None,
        float32: str = "auto") -> Model:  # fmt: skip
    """Train ``method`` (a name or alias of ``topkbench methods``) on features ``X`` (dense or
    CSR, n x d) and targets ``Y``: minimize ``P(W) = lambda/2 ||W||^2 + 1/n sum_i w_i L(y_i,
    W^T x_i)``, ``C = 1/(lambda n)`` (DESIGN §2), and certify the result by its duality gap.

    ``Y``: 0-based class indices (multiclass), or for ``svm_ml`` and ``lr_ml`` an n x m 0/1
    indicator (dense or sparse) or class indices read as singleton label sets; multilabel
    examples whose label set is empty or complete carry no ranking constraint (TPAMI §3.3)
    and are left out (dual rows 0; ``model.info["excluded_examples"]``; n counts the rest).
    ``K``: a precomputed Gram matrix instead of ``X`` (``X=None``; predict with
    ``decision_function(K=K_test_train)``); ``check_kernel`` verifies it is finite and
    symmetric.  ``kernel="rbf"`` with ``theta = 1/(2 sigma^2)`` trains on ``exp(-theta |x_i -
    x_j|^2)`` and keeps ``X`` to predict.  ``n_classes``: m when Y does not show every class.
    ``sample_weight``, ``class_weight`` (``"balanced"``, ``n / (m n_c)``, or a dict label ->
    weight; multiclass): ``w_i = sample_weight_i class_weight[y_i]`` (SDCA; each dual box
    scales by ``w_i``, the certificate stays exact; weight 0 leaves the example out).
    ``warm_start``: a model of the same method on the same data (the previous C of a path),
    its :meth:`~Model.warm_state`, or a pair ``(C_old, A_old)``; the dual is rescaled by
    ``C_new / C_old`` (feasible again).  ``init`` (``topk_ent_tr``): the model whose ``W`` the
    descent starts from (TPAMI §6.2: the selected LR^Multi one; else LR^Multi at the same C).
    The method's parameters (``C``, ``k``, ``gamma``, ``seed``, ``accelerate``, ``solver``,
    ``weights``, ``fw``, ``float32``) are those of :class:`FitParams`, the stopping rule's (``eps``,
    ``max_epochs``, ``time_limit``, ``eval_every``, ``warn``) those of :class:`StopRule`; the
    solver is the first row of :data:`SOLVERS` that applies.
    """
    spec = get_method(method)
    data = training_data(spec, X, Y, K=K, kernel=kernel, theta=theta, n_classes=n_classes,
                         fw=fw, check_kernel=check_kernel, warn=warn,
                         sample_weight=sample_weight, class_weight=class_weight)  # fmt: skip
    params, stop = fit_params(spec, data.m, C=C, k=k, gamma=gamma, eps=eps, seed=seed,
                              max_epochs=max_epochs, time_limit=time_limit,
                              eval_every=eval_every, warn=warn, accelerate=accelerate,
                              solver=solver, weights=weights, fw=fw,
                              float32=float32)  # fmt: skip
    if init is not None and spec.solver != "lbfgs":
        raise ConfigError(f"init= is for topk_ent_tr; {spec.name} takes warm_start=")
    model = choose_solver(spec, fw).run(spec, data, params, stop, warm_start, init)
    model.classes = data.classes
    return model


def _fit_sdca(spec, data: TrainingData, params: FitParams, stop: StopRule, warm_start,
              init) -> Model:  # fmt: skip
    """SDCA with its phase plan (:func:`~topkbench.solvers.sdca.solve_sdca`), on the rows
    ``data.keep``; the dual is widened to every row (0 on the rows left out)."""
    from topkbench.solvers.sdca import solve_sdca

    m, gram, ex_w, keep = data.m, data.gram is not None, data.weights, data.keep
    F, y, n_rows = data.features, data.y, data.n_rows
    if not gram:
        F = pass_precision(F, params.float32)
    A0 = warm_dual(warm_start, spec.name, (n_rows, m), params.C, ex_w, k=params.k,
                   rank_weights=params.rho)  # fmt: skip
    A0_rows, w_rows = A0, ex_w
    if keep is not None:
        rows = np.flatnonzero(keep)
        F = F[rows][:, rows] if gram else F[rows]
        y = y[rows]
        A0_rows = None if A0 is None else A0[rows]
        w_rows = None if ex_w is None else ex_w[rows]
    res = solve_sdca(
        F, y, gram=gram, A0=A0_rows, take_A0=True, sample_weight=w_rows, n_classes=m,
        loss_id=spec.loss_id, C=params.C, gamma=params.gamma, k=params.k, eps=stop.eps,
        max_epochs=stop.max_epochs, time_limit=stop.time_limit, eval_every=stop.eval_every,
        seed=params.seed, warn=stop.warn, accelerate=params.accelerate, rho=params.rho,
        **warm_primal(warm_start, spec.name, None if gram else (data.X.shape[1], m)),
    )  # fmt: skip
    A, info = res.A, dict(res.info)
    if keep is not None:
        A = np.zeros((n_rows, res.A.shape[1]))
        A[keep] = res.A
        info["excluded_examples"] = int(n_rows - keep.sum())
    if ex_w is not None:
        info["weighted"] = True
    if params.rho is not None:
        info["rho"] = [float(v) for v in params.rho]
    model = Model.from_result(res, method=spec.name, params=params.model_params(stop),
                              epochs=res.epochs, kernel=data.kernel, theta=data.theta,
                              X=data.X, info=info, A=A)  # fmt: skip
    model.sample_weight = ex_w
    return model


def pass_precision(X, float32: str):
    """The features SDCA's passes read: a float32 copy of float64 features whose every value
    is exactly a float32 (``float32="auto"``: the certificates, which widen them, are the
    same as for ``X``), float64 ones for ``"never"``, else ``X`` itself."""
    values = X.data if sp.issparse(X) else X
    if float32 == "never":
        return X.astype(np.float64) if values.dtype == np.float32 else X
    if values.dtype != np.float64:
        return X
    flat = values.reshape(-1)  # checked in blocks: inexact data is refused at its first
    step = 1 << 20
    for a in range(0, flat.size, step):
        block = flat[a : a + step]
        if not np.array_equal(block.astype(np.float32), block):
            return X
    if sp.issparse(X):  # the float32 values on the same structure
        return sp.csr_matrix((values.astype(np.float32), X.indices, X.indptr), shape=X.shape)
    return X.astype(np.float32)


def _fit_frank_wolfe(spec, data: TrainingData, params: FitParams, stop: StopRule, warm_start,
                     init) -> Model:  # fmt: skip
    """``wtopk_svm`` by Frank-Wolfe (:mod:`topkbench.solvers.frank_wolfe`, Kato §5-6)."""
    from topkbench.solvers.frank_wolfe import VARIANTS, as_operator, solve_frank_wolfe

    fw, rho, m, gram = params.fw, params.rho, data.m, data.gram is not None
    if fw not in VARIANTS:
        raise ConfigError(f"fw must be one of {', '.join(VARIANTS)}; got {fw!r}")
    F = data.features
    A0 = warm_dual(warm_start, spec.name, (F.shape[0], m), params.C, k=params.k,
                   rank_weights=rho)  # fmt: skip
    res = solve_frank_wolfe(
        F if gram else as_operator(F), data.y, gram=gram, n_classes=m, rho=rho, C=params.C,
        gamma=params.gamma, variant=fw, eps=stop.eps, max_iter=stop.max_epochs,
        time_limit=stop.time_limit, warn=stop.warn, A0=A0,
    )  # fmt: skip
    model_params = params.model_params(stop)
    model_params["fw"] = fw
    return Model.from_result(res, method=spec.name, params=model_params, epochs=res.iterations,
                             kernel=data.kernel, theta=data.theta, X=data.X,
                             info={"steps": res.steps, "rho": [float(v) for v in rho]})  # fmt: skip


def _fit_ent_tr(spec, data: TrainingData, params: FitParams, stop: StopRule, warm_start,
                init) -> Model:  # fmt: skip
    """top-k Ent_tr: L-BFGS, or the authors' gradient descent (``solver="gd"``; both in
    solvers/ent_tr.py) from ``init.W`` (a trained LR^Multi model, the TPAMI §6.2 protocol), or
    from LR^Multi solved at the same C.

    ``eps`` is the relative gradient tolerance of L-BFGS and the duality-gap tolerance of the
    LR^Multi start; ``max_epochs`` bounds both.  Gradient descent keeps the authors' own
    stopping rule (``||grad F||_2 <= 1e-3`` or 1,000 iterations) whatever ``eps`` is.  The
    returned ``A`` is the LR^Multi dual of the starting point, so a model can warm-start the
    next C of a path (the LR^Multi path is warm-started, then Ent_tr restarts from its
    solution).  No duality gap exists for this nonconvex loss: ``dual`` and ``relative_gap``
    are NaN.
    """
    from topkbench.solvers.ent_tr import solve_ent_tr, solve_ent_tr_gd

    X, y, m, name = data.X, data.y, data.m, spec.name
    C, k, solver, weights = params.C, params.k, params.solver, data.weights

    def descend(W0):
        if solver == "gd":
            return solve_ent_tr_gd(X, y, W0, C=C, k=k, weights=weights)
        return solve_ent_tr(X, y, W0, C=C, k=k, gtol=stop.eps,
                            max_iter=max(1, stop.max_epochs), weights=weights)  # fmt: skip

    if init is not None:
        if init.W is None or init.W.shape != (X.shape[1], m):
            raise ConfigError(
                f"init needs a linear model with W of shape {(X.shape[1], m)} on these features"
            )
        return _ent_tr_model(name, params, stop, init, descend(init.W), 0.0)
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
        X, y, "lr_multi", C=C, eps=stop.eps, max_epochs=stop.max_epochs, seed=params.seed,
        time_limit=stop.time_limit, eval_every=stop.eval_every, n_classes=m,
        warm_start=lr_warm, warn=stop.warn, sample_weight=weights, float32=params.float32,
    )  # fmt: skip
    # for k = 1 (LR^Multi) the descent only confirms stationarity of the start
    return _ent_tr_model(name, params, stop, start, descend(start.W), start.train_seconds)


def _ent_tr_model(name: str, params: FitParams, stop: StopRule, start: Model, r,
                  init_seconds: float) -> Model:  # fmt: skip
    """The Model of an Ent_tr run: descent result ``r`` started from LR^Multi model ``start``."""
    solver = params.solver
    if r.status != "converged" and stop.warn:
        label = "gradient descent" if solver == "gd" else "L-BFGS"
        warnings.warn(
            f"top-k Ent_tr {label} stopped on {r.status} after {r.iterations} iterations "
            f"({r.message}); the result is the last point reached",
            ConvergenceWarning,
            stacklevel=3,
        )
    return Model(
        method=name,
        params={
            "C": params.C,
            "k": params.k,
            "gamma": 0.0,
            "eps": stop.eps,
            "seed": params.seed,
            "solver": solver,
        },  # fmt: skip
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


@dataclass(frozen=True)
class SolverRoute:
    """One row of :data:`SOLVERS`: the solver ``name``, the methods it ``serves``, when
    :func:`fit` ``chooses`` it for a method and an ``fw`` option (``when`` says it in
    words), and the function that ``run`` s it and builds the model."""

    name: str
    when: str
    serves: Callable[[MethodSpec], bool]
    chooses: Callable[[MethodSpec, str | None], bool]
    run: Callable[..., Model]


# the solvers :func:`fit` chooses from, in order: the first whose ``chooses`` holds
SOLVERS: tuple[SolverRoute, ...] = (
    SolverRoute("frank-wolfe", "fw= names a variant (standard, away, pairwise; Kato §5-6)",
                lambda spec: "fw" in spec.params, lambda spec, fw: fw is not None,
                _fit_frank_wolfe),
    SolverRoute("ent-tr", "L-BFGS, or gradient descent (solver='gd'), from LR^Multi",
                lambda spec: spec.solver == "lbfgs", lambda spec, fw: spec.solver == "lbfgs",
                _fit_ent_tr),
    SolverRoute("sdca", "otherwise; its phase plan (accelerate=, solvers/plan.py) may hand "
                "over to Newton or accelerated SDCA", lambda spec: spec.solver == "sdca",
                lambda spec, fw: True, _fit_sdca),
)  # fmt: skip


def choose_solver(spec: MethodSpec, fw: str | None) -> SolverRoute:
    """The row of :data:`SOLVERS` that :func:`fit` runs for ``spec`` with option ``fw``."""
    return next(route for route in SOLVERS if route.chooses(spec, fw))


def solver_routes(spec: MethodSpec) -> tuple[SolverRoute, ...]:
    """The rows of :data:`SOLVERS` that can train ``spec`` (``topkbench methods``)."""
    return tuple(route for route in SOLVERS if route.serves(spec))


__all__ = ["SOLVERS", "FitParams", "SolverRoute", "StopRule",
           "choose_solver", "fit", "fit_params", "solver_routes"]  # fmt: skip
