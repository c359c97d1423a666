"""Pseudo vs printed top-k hinge alpha (DESIGN §4.1; Kato & Hirohashi 004 §8).

Trains topk_svm_alpha_pseudo, topk_svm_alpha (printed) and topk_svm_beta to a relative gap of
1e-10 on a seeded synthetic problem, prints their optimal primals (pseudo <= alpha <= beta must
hold), and scores the pseudo solution (W, A) under the printed alpha: its primal/dual gap
shows that the pseudo solver does not minimize the printed loss.

Usage: .venv/bin/python scripts/pseudo_vs_printed.py [--n 200] [--d 10] [--m 8] [--C 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

import topkbench
from topkbench.losses.registry import get_method
from topkbench.solvers.problem import evaluate_objective, relative_gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--C", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 5])
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    n, m, C = args.n, args.m, args.C
    X = rng.normal(size=(n, args.d))
    # labels from the quantiles of a noisy linear score: overlapping, ordered classes
    score = 2.0 * X[:, :3].sum(axis=1) + rng.normal(size=n)
    y = score.argsort().argsort() * m // n
    printed = get_method("topk_svm_alpha").loss_id
    print(f"n={n} d={args.d} m={m} C={C:g} seed={args.seed}; every fit to relative gap 1e-10")
    for k in args.ks:
        fits = {}
        for name in ("topk_svm_alpha_pseudo", "topk_svm_alpha", "topk_svm_beta"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fits[name] = topkbench.fit(
                    X, y, name, C=C, k=k, eps=1e-10, max_epochs=50_000, seed=args.seed
                )
            f = fits[name]
            print(
                f"k={k} {name:22s} P*={f.primal:.8f} gap={f.relative_gap:.1e} "
                f"epochs={f.epochs} ({f.status})"
            )
        ps = fits["topk_svm_alpha_pseudo"]
        P, D = evaluate_objective(X, y, ps.A, ps.W, printed, C, 0.0, k)
        print(
            f"k={k} pseudo solution under the printed alpha: P={P:.8f} D={D:.8f} "
            f"relative gap={relative_gap(P, D):.3g}"
        )


if __name__ == "__main__":
    main()
