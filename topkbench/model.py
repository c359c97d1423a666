"""The trained model (DESIGN §9) and the warm starts it gives a path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from topkbench.errors import ConfigError, InputError
from topkbench.feature_map import FeatureMap
from topkbench.validation import check_features

if TYPE_CHECKING:
    from topkbench.solvers.problem import TracePoint


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

        from topkbench.solvers.problem import TracePoint

        return pd.DataFrame(self.trace, columns=TracePoint._fields)


def warm_dual(warm_start, method: str, shape: tuple[int, int], C: float, weights=None, *,
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


def warm_primal(warm_start, method: str, shape: tuple[int, int] | None) -> dict[str, Any]:
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


def __getattr__(name: str):
    # topkbench.model.fit, where it was defined before topkbench.api held it
    if name == "fit":
        from topkbench.api import fit

        return fit
    raise AttributeError(f"module 'topkbench.model' has no attribute {name!r}")


__all__ = ["FeatureMap", "Model", "WarmStart", "warm_dual", "warm_primal"]
