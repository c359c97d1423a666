"""``topkbench bench torch``: forward plus backward of the PyTorch losses
(:mod:`topkbench.torch`) per batch, against ``torch.nn.functional.cross_entropy`` on the same
scores (issue target: the top-k hinges and top-k Ent_tr within 3x of it on the CPU)."""

from __future__ import annotations

import time
from dataclasses import dataclass

# (method, k, gamma) timed by default: the rows of TPAMI Table 6 and the other losses
DEFAULT_CASES = (
    ("lr_multi", 1, 0.0),
    ("topk_svm_alpha_pseudo", 5, 1.0),
    ("topk_svm_alpha_pseudo", 5, 0.0),
    ("topk_svm_alpha", 5, 1.0),
    ("topk_svm_beta", 5, 1.0),
    ("svm_multi", 1, 1.0),
    ("topk_ent", 5, 0.0),
    ("topk_ent_tr", 5, 0.0),
    ("svm_ova", 1, 1.0),
    ("lr_ova", 1, 0.0),
    ("wtopk_svm", 5, 1.0),  # flat weights: the top-5 hinge alpha as printed, Kato's smoothing
    ("wtopk_svm", 5, 0.0),
)


@dataclass
class TorchTiming:
    method: str
    k: int
    gamma: float
    batch: int
    m: int
    dtype: str
    ms: float  # median milliseconds of one forward + backward
    cross_entropy_ms: float
    ratio: float


def _median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def bench_torch(batch: int, ms: tuple[int, ...], cases=DEFAULT_CASES, reps: int = 30,
                seed: int = 0, dtype: str = "float32", device: str = "cpu",
                progress=None) -> list[TorchTiming]:  # fmt: skip
    """Median milliseconds of ``loss(...).backward()`` per case and class count ``m`` on
    N(0, 1) scores (a batch of ``batch`` rows, random labels), beside cross-entropy's."""
    import torch

    from topkbench.torch import loss

    gen = torch.Generator(device="cpu").manual_seed(seed)
    tdtype = getattr(torch, dtype)
    out = []
    for m in ms:
        S = torch.randn(batch, m, generator=gen, dtype=tdtype).to(device).requires_grad_(True)
        y = torch.randint(0, m, (batch,), generator=gen).to(device)

        def run(f, S=S):
            def step():
                S.grad = None
                f().backward()
                if device != "cpu":
                    torch.cuda.synchronize()

            return _median_ms(step, reps)

        ce = run(lambda S=S, y=y: torch.nn.functional.cross_entropy(S, y))
        for method, k, gamma in cases:

            def f(method=method, k=k, gamma=gamma, S=S, y=y):
                return loss(method, S, y, k=k, gamma=gamma)

            t = run(f)
            out.append(TorchTiming(method, k, gamma, batch, m, dtype, t, ce, t / ce))
            if progress is not None:
                progress(out[-1])
    return out
