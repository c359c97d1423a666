"""The trained model and :func:`fit` (DESIGN §9)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from topkbench.errors import ConfigError, InputError
from topkbench.losses.registry import get_method
from topkbench.solvers.sdca import TracePoint, solve_sdca
from topkbench.validation import check_features, check_int, check_k, check_labels, check_positive


@dataclass
class Model:
    """A trained linear model with its optimization certificate.

    ``primal``, ``dual`` and ``relative_gap`` are in the P(W) scale of DESIGN §2.
    """

    method: str
    params: dict[str, Any]
    W: NDArray[np.float64]
    A: NDArray[np.float64]
    primal: float
    dual: float
    relative_gap: float
    status: str
    epochs: int
    train_seconds: float
    trace: list[TracePoint] = field(default_factory=list)

    @property
    def n_classes(self) -> int:
        return self.W.shape[1]

    @property
    def converged(self) -> bool:
        return self.status == "converged"

    def decision_function(self, X) -> NDArray[np.float64]:
        """Scores ``f(x) = W^T x`` for each row of ``X`` (n x m)."""
        X = check_features(X)
        if X.shape[1] != self.W.shape[0]:
            raise InputError(
                f"X has {X.shape[1]} features, the model was trained on {self.W.shape[0]}"
            )
        S = X @ self.W
        return np.asarray(S)

    def trace_frame(self):
        import pandas as pd

        return pd.DataFrame(self.trace, columns=TracePoint._fields)


def fit(
    X,
    Y,
    method: str,
    *,
    C: float = 1.0,
    k: int = 1,
    gamma: float = 0.0,
    eps: float = 1e-3,
    max_epochs: int = 1000,
    seed: int = 0,
    time_limit: float | None = None,
    eval_every: int = 1,
    n_classes: int | None = None,
    warm_start: Model | tuple[float, NDArray[np.float64]] | None = None,
    warn: bool = True,
) -> Model:
    """Train ``method`` on features ``X`` (dense or CSR, n x d) and 0-based labels ``Y``.

    Minimizes ``P(W) = lambda/2 ||W||^2 + 1/n sum_i L(y_i, W^T x_i)`` with
    ``C = 1/(lambda n)`` (DESIGN §2) and certifies the result with the duality gap.

    Parameters
    ----------
    method : name or alias from ``topkbench methods``.
    C : regularization, ``C = 1/(lambda n) > 0``.
    k : the k of a top-k loss, in ``[1, m-1]``; methods without k require ``k = 1``.
    gamma : smoothing (``>= 0``) for the methods that take it; 0 means the nonsmooth loss.
    eps : stop when the relative duality gap ``(P-D)/max(|P|,|D|) <= eps``.
    max_epochs, time_limit : budgets; stopping on them warns with ``ConvergenceWarning``.
    seed : drives the per-epoch permutations.
    warm_start : a model of the same method on the same data (e.g. the previous C on a path),
        or a pair ``(C_old, A_old)``; the dual is rescaled by ``C_new / C_old`` (which keeps
        it feasible) and W recomputed.
    """
    spec = get_method(method)
    X = check_features(X)
    y, m = check_labels(Y, X.shape[0], n_classes)
    C = check_positive("C", C)
    gamma = check_positive("gamma", gamma, allow_zero=True)
    k = check_k(k, m)
    eps = check_positive("eps", eps, upper=1.0)
    max_epochs = check_int("max_epochs", max_epochs, 0)
    eval_every = check_int("eval_every", eval_every, 1)
    if time_limit is not None:
        time_limit = check_positive("time_limit", time_limit)
    if "gamma" not in spec.params and gamma != 0.0:
        raise ConfigError(f"method {spec.name} has no smoothing parameter; use gamma=0")
    if "k" not in spec.params and k != 1:
        raise ConfigError(f"method {spec.name} is a top-1 loss and takes no k; use k=1")
    A0 = None
    if warm_start is not None:
        if isinstance(warm_start, Model):
            if warm_start.method != spec.name:
                raise ConfigError(
                    f"warm_start is a {warm_start.method} model; expected {spec.name}"
                )
            C_old, A_old = warm_start.params["C"], warm_start.A
        else:
            C_old, A_old = warm_start
        if A_old.shape != (X.shape[0], m):
            raise ConfigError(
                f"warm_start dual has shape {A_old.shape}; expected {(X.shape[0], m)} "
                "(same training data)"
            )
        A0 = A_old * (C / C_old)
    res = solve_sdca(
        X,
        y,
        n_classes=m,
        loss_id=spec.loss_id,
        C=C,
        gamma=gamma,
        k=k,
        eps=eps,
        max_epochs=max_epochs,
        time_limit=time_limit,
        eval_every=eval_every,
        seed=seed,
        A0=A0,
        warn=warn,
    )
    params = {"C": C, "k": k, "gamma": gamma, "eps": eps, "seed": seed}
    return Model(
        method=spec.name,
        params=params,
        W=res.W,
        A=res.A,
        primal=res.primal,
        dual=res.dual,
        relative_gap=res.relative_gap,
        status=res.status,
        epochs=res.epochs,
        train_seconds=res.seconds,
        trace=res.trace,
    )


__all__ = ["Model", "fit"]
