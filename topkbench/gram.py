"""Gram matrices for kernel mode (DESIGN §5, §7: RBF with ``theta = 1/(2 sigma^2)``)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from topkbench.errors import InputError
from topkbench.validation import check_positive


def _sqnorms(X) -> np.ndarray:
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", X, X)


def rbf_kernel(X, Z=None, *, theta: float, block_rows: int = 4096) -> np.ndarray:
    """``K[i, j] = exp(-theta ||x_i - z_j||^2)`` (rows of X against rows of Z, default Z = X).

    Computed in float64 (float32 features are widened) in row blocks of ``block_rows`` to
    bound temporary memory at ``block_rows x len(Z)`` doubles besides the result.  Squared
    distances are clipped at 0 (``|x|^2 + |z|^2 - 2<x,z>`` can round below 0) and the
    diagonal of ``K(X, X)`` is exactly 1.
    """
    theta = check_positive("theta", theta)
    same = Z is None
    X = _float64(X)  # float32 features (a dataset's float32: true): the kernel in float64
    Z = X if same else _float64(Z)
    if X.shape[1] != Z.shape[1]:
        raise InputError(f"rbf_kernel: X has {X.shape[1]} features, Z has {Z.shape[1]}")
    xn = _sqnorms(X)
    zn = _sqnorms(Z)
    K = np.empty((X.shape[0], Z.shape[0]), dtype=np.float64)
    for lo in range(0, X.shape[0], block_rows):
        hi = min(lo + block_rows, X.shape[0])
        G = X[lo:hi] @ Z.T
        G = G.toarray() if sp.issparse(G) else np.asarray(G)
        D = xn[lo:hi, None] + zn[None, :] - 2.0 * G
        np.maximum(D, 0.0, out=D)
        np.exp(-theta * D, out=K[lo:hi])
    if same:
        np.fill_diagonal(K, 1.0)
    return K


def _float64(X):
    return X if X.dtype == np.float64 else X.astype(np.float64)


def check_gram(K, n: int | None = None) -> np.ndarray:
    """A finite, square, symmetric Gram matrix with a non-negative diagonal (float64)."""
    K = np.asarray(K)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise InputError(f"K must be a square n x n Gram matrix; got shape {K.shape}")
    if n is not None and K.shape[0] != n:
        raise InputError(f"K is {K.shape[0]} x {K.shape[0]} but there are {n} labels")
    K = np.ascontiguousarray(K, dtype=np.float64)
    if np.any(np.diag(K) < 0):
        raise InputError("K has a negative diagonal entry, so it is not a Gram matrix")
    # in row blocks: temporaries of block x n, not n x n (an RBF Gram can fill the memory)
    n = K.shape[0]
    block = max(1, 2**24 // max(n, 1))
    scale = 1.0
    for lo in range(0, n, block):
        rows = K[lo : lo + block]
        if not np.isfinite(rows).all():
            raise InputError("K contains NaN or infinite entries")
        scale = max(scale, float(np.abs(rows).max()))
    for lo in range(0, n, block):
        gap = np.abs(K[lo : lo + block] - K[:, lo : lo + block].T).max()
        if gap > 1e-10 * scale:
            raise InputError("K is not symmetric (|K - K^T| > 1e-10 max|K|)")
    return K
