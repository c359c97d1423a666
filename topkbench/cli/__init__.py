"""Command-line interface: the only package that imports Typer and Hydra.

Each module holds one command group and registers it on :data:`app` when imported; commands
import the library lazily, so ``topkbench --help`` loads neither numba nor the kernels.
"""

from topkbench.cli import bench_papers, bench_solvers, data, experiments, predict, train  # noqa: F401
from topkbench.cli.app import app, compose


def main() -> None:
    app()


__all__ = ["app", "compose", "main"]
