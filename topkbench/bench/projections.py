"""``topkbench bench projections`` (TPAMI 002 Fig. 3a): seconds per 1,000 projections against the
dimension, per projection, and the fitted scaling exponent."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from topkbench.bench.common import normal_batches, saved_figure
from topkbench.errors import ConfigError


@dataclass
class ProjectionBenchRow:
    method: str
    d: int
    problems: int
    seconds: float  # total for all problems (thresholds + applying them)
    seconds_per_1000: float


PROJECTION_METHODS = {
    # name: (kernel code, k)
    "simplex": (0, 1),
    "alpha k=1": (1, 1),
    "alpha k=5": (1, 5),
    "alpha k=10": (1, 10),
    "beta k=5": (2, 5),
    "D_k k=5": (3, 5),
    "topk_ent k=5": (4, 5),
    "weighted k=5 (exp)": (5, 5),
}


def bench_projections(
    dims=(10, 100, 10**3, 10**4, 10**5, 10**6),
    problems: int = 1000,
    methods=tuple(PROJECTION_METHODS),
    radius: float = 1.0,
    seed: int = 0,
    batch_bytes: int = 64 * 2**20,
    progress=None,
) -> list[ProjectionBenchRow]:
    """TPAMI Fig. 3a: time ``problems`` projections of N(0, 1) vectors of each dimension onto
    each set (``bench.projection_batch``), one core, compiled before timing.  Data comes in
    batches of at most ``batch_bytes`` from one seeded generator; every method projects the
    same batch and only the batched kernel call is timed.  Sets that need ``k < d`` skip the
    smaller dimensions."""
    from topkbench.bench.projection_batch import project_rows

    unknown = [m for m in methods if m not in PROJECTION_METHODS]
    if unknown:
        raise ConfigError(
            f"unknown projection(s) {unknown}; available: {', '.join(PROJECTION_METHODS)}"
        )
    if problems < 1:
        raise ConfigError(f"problems must be >= 1; got {problems}")
    warm = np.random.default_rng(seed).normal(size=(2, 12))
    for name in methods:
        code, k = PROJECTION_METHODS[name]
        project_rows(code, warm, k, radius, np.empty_like(warm))
    rng = np.random.default_rng(seed)
    rows = []
    for d in dims:
        d = int(d)
        if d < 2:
            raise ConfigError(f"bench projections: dimension d must be >= 2; got {d}")
        active = [mth for mth in methods if PROJECTION_METHODS[mth][1] < d]
        spent = dict.fromkeys(active, 0.0)
        for data in normal_batches(rng, problems, d, batch_bytes, progress):
            out = np.empty_like(data)
            for name in active:
                code, k = PROJECTION_METHODS[name]
                t0 = time.perf_counter()
                project_rows(code, data, k, radius, out)
                spent[name] += time.perf_counter() - t0
        for name in active:
            s = spent[name]
            rows.append(ProjectionBenchRow(name, d, problems, s, s * 1000.0 / problems))
    return rows


def scaling_exponent(rows: list[ProjectionBenchRow], lo: int = 10**3, hi: int = 10**6) -> dict:
    """Least-squares slope of log(seconds) against log(d) over ``lo <= d <= hi``, per method
    (1 = linear time); NaN with fewer than two dimensions in range."""
    out = {}
    for name in dict.fromkeys(r.method for r in rows):
        pts = [(r.d, r.seconds) for r in rows if r.method == name and lo <= r.d <= hi]
        if len(pts) < 2:
            out[name] = float("nan")
            continue
        x, y = np.log([p[0] for p in pts]), np.log([max(p[1], 1e-12) for p in pts])
        out[name] = float(np.polyfit(x, y, 1)[0])
    return out


def plot_projections(rows: list[ProjectionBenchRow], path) -> None:
    with saved_figure(path, figsize=(6.0, 4.4)) as (fig, ax):
        for name in dict.fromkeys(r.method for r in rows):
            pts = [r for r in rows if r.method == name]
            ax.loglog([r.d for r in pts], [r.seconds_per_1000 for r in pts], marker="o", label=name)
        ax.set_xlabel("dimension d")
        ax.set_ylabel("seconds per 1,000 projections (one core)")
        ax.set_title("Projection scaling (TPAMI Fig. 3a), N(0, 1) data")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
