"""The line search of Newton's method in the primal (:mod:`topkbench.solvers.newton`).

Armijo's test at the full step, else the exact minimizer along the Newton direction
(:func:`exact_step`), else backtracking.  The scores along the direction are ``S + t X D``,
so a trial step costs no product with X; for the losses whose gradient is an exact
projection one gradient evaluation gives both the slope and the loss there (Fenchel-Young),
and the examples whose gradient is zero at both ends of the step are left out of the
evaluations in between (:func:`line_search`).  A class-separable loss takes a step per class
(:func:`separable_steps`).
"""

from __future__ import annotations

import math

import numpy as np

from topkbench.losses.curvature import LossDerivatives
from topkbench.solvers.problem import SDCAProblem

ARMIJO = 1e-4
# the line search gives up when the step moves no entry of W by more than this relative amount
MIN_RELATIVE_STEP = 1e-15
# the exact line search stops where the slope along the step is this fraction of the first
LINE_SEARCH_TOL = 0.1
LINE_SEARCH_ITERATIONS = 30


def line_search(prob: SDCAProblem, deriv: LossDerivatives, W, S, D, SD, C: float, gamma: float,
                slope: float, G0):  # fmt: skip
    """The step along the Newton direction ``D`` (scores ``SD``) from ``W`` (scores ``S``,
    gradient of the loss ``G0`` there): 1 when Armijo's test holds there, else the exact
    minimizer along ``D`` (:func:`exact_step`), else halving until Armijo's test holds;
    None when the step falls below rounding (the caller hands the run on).  Returns ``(t,
    G_t)``, ``G_t`` the gradient at ``S + t SD`` when the search evaluated it there (the
    next iteration's, up to the rounding of the scores), else None.  For a class-separable
    loss ``t`` is a step per class (:func:`separable_steps`).

    For the losses whose family has ``fenchel_young`` one gradient evaluation at a step gives
    both the slope and the loss there, and once the gradient at the full step is known, the
    examples whose gradient is zero at both ends are left out of every further evaluation:
    their zero set is convex, so they add nothing to F or its slope anywhere between."""
    if deriv.class_separable:
        return separable_steps(deriv, W, S, D, SD, prob.example_c(C), gamma, G0), None
    Cs = prob.example_c(C)
    # F(W + t D) - F(W) = t <W, D> + t^2/2 ||D||^2 + C (sum L_t - sum L_0): the quadratic
    # part exactly, so that the test is not lost in the rounding of F when C is large
    wd, dd = float(np.vdot(W, D)), float(np.vdot(D, D))
    fy = deriv.fenchel_young
    if fy:
        loss0 = deriv.loss_sum(S, G0, Cs, gamma)
    else:
        no_dual = np.zeros_like(S)
        loss0 = prob.values(S, no_dual, 0.0, C, gamma)[0] * (C * prob.n)
    view = [deriv, S, SD, Cs]  # the rows still evaluated ...
    loss0_rows = [loss0]  # ... and their loss sum at t = 0 (the others' losses are 0)
    live_rows = [None]  # ... as indices (None: all)
    # step -> (loss sum of the rows in view, phi'(t), those rows, their gradient)
    memo: dict[float, tuple[float, float, np.ndarray | None, np.ndarray]] = {}

    def evaluate(t: float) -> tuple[float, float, np.ndarray | None, np.ndarray]:
        if t not in memo:
            der, S_, SD_, Cs_ = view
            S_t = S_ + t * SD_
            G_t = der.gradient(S_t, gamma)
            loss_t = der.loss_sum(S_t, G_t, Cs_, gamma) if fy else math.nan
            slope_t = t * dd + wd + float(np.vdot(Cs_[:, None] * G_t, SD_))
            memo[t] = loss_t, slope_t, live_rows[0], G_t
            if fy and t == 1.0:
                live = (G0 != 0.0).any(axis=1) | (G_t != 0.0).any(axis=1)
                if not live.all():
                    rows = np.flatnonzero(live)
                    sub = deriv.restricted(rows)
                    view[:] = [sub, S[rows], SD[rows], Cs[rows]]
                    live_rows[0] = rows
                    loss0_rows[0] = sub.loss_sum(S[rows], G0[rows], Cs[rows], gamma)
        return memo[t]

    def gradient_at(t: float | None):
        """The whole gradient at step t if it was evaluated (the rows out of view: 0)."""
        if t not in memo:
            return None
        rows, G_t = memo[t][2:]
        if rows is None:
            return G_t
        full = np.zeros_like(S)
        full[rows] = G_t
        return full

    def decrease(t: float) -> float:
        if fy:
            loss_t = evaluate(t)[0]
            base = loss0 if t == 1.0 else loss0_rows[0]
        else:
            loss_t = prob.values(S + t * SD, no_dual, 0.0, C, gamma)[0] * (C * prob.n)
            base = loss0
        return t * wd + 0.5 * t * t * dd + (loss_t - base)

    def slope_at(t: float) -> float:
        return evaluate(t)[1]

    def search() -> float | None:
        if decrease(1.0) <= ARMIJO * slope:
            return 1.0
        t = exact_step(slope_at, slope)
        if t is not None and decrease(t) < 0.0:
            return t
        t_min = MIN_RELATIVE_STEP * max(float(np.abs(W).max()), 1.0) / float(np.abs(D).max() or 1.0)
        t = 0.5
        while t >= t_min:
            if decrease(t) <= ARMIJO * t * slope:
                return t
            t *= 0.5
        return None

    try:
        t = search()
    finally:
        if view[0] is not deriv:
            deriv.failures += view[0].failures
    return t, gradient_at(t)


def exact_step(slope_at, slope0: float) -> float | None:
    """The step ``t`` in (0, 1] where the convex ``phi(t) = F(W + t D)`` is least, by the
    Illinois variant of regula falsi on ``phi'``, with ``phi'(0) = slope0 < 0``.

    For the smoothed hinges phi is piecewise quadratic with breakpoints a fraction gamma
    apart, and a semismooth Newton direction overshoots many of them: halving the step until
    Armijo's test holds then takes steps of 1/16 or less, iteration after iteration, where
    the minimizer along the direction is often several times further (the exact line search
    of Keerthi & DeCoste's finite Newton method, JMLR 2005).  ``phi'`` is piecewise linear
    there, so the secant steps are exact once both ends lie on one piece; for the smooth
    losses it is smooth and the iteration converges superlinearly.  None if ``phi'(1) <= 0``
    cannot be told apart from rounding (then the caller backtracks)."""
    lo, f_lo, hi = 0.0, slope0, 1.0
    f_hi = slope_at(1.0)
    if not f_hi > 0.0:
        return 1.0 if f_hi <= 0.0 else None
    side = 0
    for _ in range(LINE_SEARCH_ITERATIONS):
        t = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        if not lo < t < hi:
            t = 0.5 * (lo + hi)
        f = slope_at(t)
        if abs(f) <= LINE_SEARCH_TOL * abs(slope0):
            return t
        if f < 0.0:
            lo, f_lo = t, f
            if side == -1:
                f_hi *= 0.5
            side = -1
        else:
            hi, f_hi = t, f
            if side == 1:
                f_lo *= 0.5
            side = 1
    return lo if lo > 0.0 else None


def separable_steps(deriv: LossDerivatives, W, S, D, SD, Cs, gamma: float, G0):
    """A step per class along ``D`` for a class-separable loss (the one-vs-all losses), or
    None when no class can move.  ``F = sum_c F_c(w_c)`` splits by class, so each class's
    ``phi_c(t) = F_c(w_c + t d_c)`` is minimized on its own: a class whose Newton step is
    full while another's needs damping is not held back by it.  ``phi_c`` is convex with
    ``phi_c'(t) = t ||d_c||^2 + <w_c, d_c> + sum_i C_i G_ic(t) (X D)_ic``, and one gradient
    evaluation at the scores ``S + SD diag(t)`` gives every class's slope, so the steps are
    found together: ``t_c = 1`` where ``phi_c'(1) <= 0``, else the Illinois regula falsi of
    :func:`exact_step` on each class's slope, run in lockstep, keeping the largest ``t_c``
    seen with ``phi_c'(t_c) <= 0`` (F_c decreases all the way there, so no test of values is
    needed) once ``|phi_c'| <= LINE_SEARCH_TOL |phi_c'(0)|`` there or its bracket is spent;
    a class without descent (``phi_c'(0) >= 0``: no step or rounding) stays put."""
    wd = np.einsum("jc,jc->c", W, D)
    dd = np.einsum("jc,jc->c", D, D)
    CSD = Cs[:, None] * SD

    def slopes(t):
        return t * dd + wd + np.einsum("ic,ic->c", deriv.gradient(S + SD * t, gamma), CSD)

    f_lo = wd + np.einsum("ic,ic->c", G0, CSD)
    descent = f_lo < 0.0
    lo = np.zeros_like(wd)
    hi = np.ones_like(wd)
    f_hi = slopes(hi)
    done = ~descent | (f_hi <= 0.0)
    lo[descent & (f_hi <= 0.0)] = 1.0
    tol = LINE_SEARCH_TOL * np.abs(f_lo)
    side = np.zeros(wd.shape, dtype=np.int8)
    for _ in range(LINE_SEARCH_ITERATIONS):
        if done.all():
            break
        t = hi - f_hi * (hi - lo) / np.where(done, 1.0, f_hi - f_lo)
        t = np.where((lo < t) & (t < hi), t, 0.5 * (lo + hi))
        t = np.where(done, lo, t)
        f = slopes(t)
        below = ~done & (f <= 0.0)
        above = ~done & (f > 0.0)
        lo, f_lo = np.where(below, t, lo), np.where(below, f, f_lo)
        hi, f_hi = np.where(above, t, hi), np.where(above, f, f_hi)
        f_hi = np.where(below & (side == -1), 0.5 * f_hi, f_hi)
        f_lo = np.where(above & (side == 1), 0.5 * f_lo, f_lo)
        side = np.where(below, -1, np.where(above, 1, side)).astype(np.int8)
        done = done | (below & (np.abs(f) <= tol))
    return lo if (lo > 0.0).any() else None
