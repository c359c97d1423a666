"""PCA of sparse, very wide data through the n x n Gram matrix (News20, TPAMI §6.2).

TPAMI §6.2 reduces News20 (15,935 x 62,061, sparse) "to 15478 [dimensions] preserving all
non-singular PCA components".  With n << d the principal components are best computed from the
centred Gram matrix G = Xc Xcᵀ (n x n), never forming a d-sized dense matrix:

    G = V diag(e) Vᵀ,  keep the r eigenvalues e_j > rtol * max(e)   (the non-singular ones),
    train scores   Z = Xc P = V_r diag(sqrt(e_r))     with P = Xcᵀ V_r diag(e_r^-1/2),
    other scores   Z' = (X' - 1 mu^T) P = (X' Xcᵀ - 1 (Xc mu)ᵀ) V_r diag(e_r^-1/2).

Identity used: X' Xcᵀ = X' Xᵀ - (X' mu) 1ᵀ.  Memory: G and its eigendecomposition dominate, about
3 n² doubles at the peak; measured 5.8 GB (7.5 min, 2 cores) on a News20-shaped stand-in by
scripts/pca_memory.py, within the 8 GB the issue allows.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from topkbench.errors import ConfigError

DEFAULT_RTOL = 1e-10


def _dense_rows_product(A, B) -> np.ndarray:
    """A Bᵀ as a dense array for sparse or dense A, B."""
    out = A @ B.T
    return out.toarray() if sp.issparse(out) else np.asarray(out)


def gram_pca(
    X_train, others: list, n_components: int | None = None, rtol: float = DEFAULT_RTOL
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Project ``X_train`` and each matrix in ``others`` on the principal components of X_train.

    Keeps the ``n_components`` largest components, or (``None``) every component with
    eigenvalue above ``rtol * max``.  Returns ``(Z_train, [Z_other...], eigenvalues_kept)``.
    """
    n = X_train.shape[0]
    mu = np.asarray(X_train.mean(axis=0)).ravel()
    Xmu = np.asarray(X_train @ mu).ravel()  # X mu
    G = _dense_rows_product(X_train, X_train)
    # centre: G - X mu 1ᵀ - 1 (X mu)ᵀ + (mu·mu) 11ᵀ
    G -= Xmu[:, None]
    G -= Xmu[None, :]
    G += float(mu @ mu)
    e, V = scipy.linalg.eigh(G, overwrite_a=True, check_finite=False)
    del G
    order = np.argsort(e)[::-1]
    e = e[order]
    rank = int((e > rtol * max(e[0], 0.0)).sum())
    if n_components is not None and n_components > rank:
        raise ConfigError(
            f"asked for {n_components} PCA components but the centred training data has rank "
            f"{rank} (eigenvalues above {rtol:g} x the largest)"
        )
    keep = np.arange(n) < (rank if n_components is None else n_components)
    idx = order[keep]
    ek = e[keep]
    Z_train = V[:, idx]  # V_r (a copy); Z = V_r diag(sqrt e_r), scaled in place
    del V
    Z_train *= np.sqrt(ek)[None, :]
    inv = 1.0 / ek  # V_r e^-1/2 = Z e^-1
    Xc_mu = Xmu - float(mu @ mu)  # Xc mu
    outs = []
    for Xo in others:
        K = _dense_rows_product(Xo, X_train)  # X' Xᵀ
        K -= np.asarray(Xo @ mu).ravel()[:, None]
        K -= Xc_mu[None, :]
        outs.append((K @ Z_train) * inv[None, :])
    return Z_train, outs, ek
