"""The ``topkbench`` application: its command groups, the error boundary (a short message, a
suggested command and an exit code instead of a traceback) and Hydra's Compose API.

Hydra configs are composed with the Compose API (``version_base="1.3"``) and converted to
frozen dataclasses (``topkbench.config``) before anything else sees them.
"""

from __future__ import annotations

import logging
import os
from functools import wraps
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help=(
        "topkbench: train and benchmark the top-k / multiclass losses of Lapin, Hein & Schiele "
        "(TPAMI 2017) with certified SDCA solvers, and reproduce the papers' tables.\n\n"
        "Configuration is composed from topkbench/conf/ with Hydra overrides, e.g.\n\n"
        "  topkbench train method=lr_multi C=0.5 --json\n\n"
        "  topkbench sweep experiment=table3 n_jobs=2 && topkbench report experiment=table3"
    ),
)
bench_app = typer.Typer(help="Benchmarks (print a table and write CSV under results/bench/).")
# the output directory of every benchmark (typer reads the default; it is never mutated)
OUT_OPT = typer.Option(Path("results/bench"), help="output directory")
# the problem shape shared by bench sdca / scale / peers (d x m; n differs)
BENCH_D_OPT = typer.Option(128, help="features")
BENCH_M_OPT = typer.Option(100, help="classes")
METHOD_SPEC_HELP = "name[:gamma[:k]], repeatable"
SEED_OPT = typer.Option(0, help="drives every random choice (data, permutations)")
TOPK_OPT = typer.Option(3, help="k of the top-k loss")
app.add_typer(bench_app, name="bench")
data_app = typer.Typer(
    no_args_is_help=True,
    help=(
        "Datasets of the registry (topkbench/conf/dataset/*.yaml). Files live in "
        "datasets/<name>/ or $TOPKBENCH_DATA/<name>/."
    ),
)
app.add_typer(data_app, name="data")

log = logging.getLogger("topkbench")


def conf_dir() -> Path:
    env = os.environ.get("TOPKBENCH_CONF")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[1] / "conf"  # shipped as package data


def setup_logging(verbose: bool = False) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=False)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], format="%(message)s"
    )


def fail(message: str, hint: str | None = None, code: int = 2) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    if hint:
        console.print(f"[dim]try:[/] {hint}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


# below this address-space limit (ulimit -v, prlimit --as) the numerical libraries do not
# even load: their shared objects, numba's compiler and the BLAS's buffers map about this much
# (the resident memory of a small run is a third of it)
MIN_ADDRESS_SPACE = 1 << 30


def guard_address_space() -> None:
    """Under a finite address-space limit: refuse one below :data:`MIN_ADDRESS_SPACE` with
    its figure, and keep the BLAS to one thread.  Each OpenBLAS thread maps a 32 MB buffer
    at its first call, and a mapping the limit refuses is retried forever (a sweep under a
    limit spun at 100 % CPU, writing nothing); one thread maps its buffer at the first
    product, while memory is still free."""
    from topkbench.errors import MemoryLimitError, address_space_limit

    soft = address_space_limit()
    if soft is None:
        return
    if soft < MIN_ADDRESS_SPACE:
        raise MemoryLimitError(
            f"the address-space limit is {soft / 2**20:.0f} MB; topkbench needs at least "
            f"{MIN_ADDRESS_SPACE / 2**20:.0f} MB of address space (its numerical libraries "
            "map that much, though far less is resident)",
            hint="raise the limit (ulimit -v, prlimit --as) or drop it",
        )
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    import sys

    if "numpy" in sys.modules:  # loaded already: limit its BLAS's threads at run time
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")


# what an interrupted command keeps: a sweep keeps its finished records and resumes from them;
# a timed protocol starts afresh (its timing covers one whole run); the others keep nothing
RESUMABLE = "interrupted; finished records are kept, re-run the command to resume"
TIMED_AFRESH = ("interrupted; the timing is lost: a timed protocol runs afresh each time, "
                "into a new results directory under --out")  # fmt: skip


def handle_errors(fn=None, *, interrupted: str = "interrupted"):
    """Our errors as one line and an exit code (:func:`fail`); ``interrupted`` is what Ctrl-C
    prints (:data:`RESUMABLE` for a sweep).  ``@handle_errors`` or
    ``@handle_errors(interrupted=...)``."""
    if fn is None:
        return lambda f: handle_errors(f, interrupted=interrupted)

    @wraps(fn)
    def wrapper(*args, **kwargs):
        from topkbench.errors import TopkbenchError

        try:
            guard_address_space()
            return fn(*args, **kwargs)
        except TopkbenchError as exc:
            fail(str(exc), getattr(exc, "hint", None), exc.exit_code)
        except MemoryError as exc:  # also pyarrow's ArrowMemoryError
            fail(
                f"memory ran out ({type(exc).__name__}{': ' if str(exc) else ''}{exc}); what "
                "was finished is kept (a sweep's records: re-run it to resume)",
                "free memory, raise the limit (ulimit -v), or use fewer workers (n_jobs=1)",
                code=7,
            )
        except KeyboardInterrupt:
            fail(interrupted, code=130)

    return wrapper


def compose(overrides: list[str] | None, command: str | None = None) -> dict[str, Any]:
    """Compose ``topkbench/conf/config.yaml`` with Hydra overrides into a plain dict.

    Every override either takes effect or is refused: keys that ``command`` would ignore
    (:func:`~topkbench.config_keys.check_override_keys`), unknown keys at any level, and run options
    of the wrong type or range are errors."""
    from topkbench.config_keys import (
        check_config_keys,
        check_dataset_overrides,
        check_override_keys,
        check_run_options,
    )

    if command is not None:
        check_override_keys(command, overrides)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from topkbench.errors import ConfigError

    conf = conf_dir()
    if not (conf / "config.yaml").exists():
        raise ConfigError(f"config directory {conf} has no config.yaml (set TOPKBENCH_CONF)")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=_upserts(overrides))
        out = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # Hydra/OmegaConf raise many types; all are config errors
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = "overrides look like key=value, e.g. C=0.5; see --help"
        if "Could not override" in msg:
            hint = "the configuration does not set that key: add it with +key=value"
        raise ConfigError(f"bad configuration override: {msg}", hint=hint) from None
    exp = out.get("experiment")  # type: ignore[union-attr]
    if isinstance(exp, dict) and exp.get("datasets"):
        exp["datasets"] = [_resolve_dataset(conf, d) for d in exp["datasets"]]
    check_config_keys(out)
    check_dataset_overrides(overrides, out)
    check_run_options(out)
    return out  # type: ignore[return-value]


def _upserts(overrides: list[str] | None) -> list[str]:
    """``experiment.KEY=V`` and ``dataset.KEY=V`` set the key whether or not the chosen YAML
    file mentions it (Hydra's ``++``); unknown keys are then refused by name, with the valid
    ones, by :func:`~topkbench.config_keys.check_config_keys`."""
    out = []
    for item in overrides or ():
        key = item.split("=", 1)[0]
        parts = key.split(".")
        if "=" in item and len(parts) == 2 and parts[0] in ("experiment", "dataset"):
            item = "++" + item
        out.append(item)
    return out


def _resolve_dataset(conf: Path, entry: Any) -> dict[str, Any]:
    """An experiment's dataset entry: a registry name, or ``{base: NAME, <overrides>}``."""
    from topkbench.data.registry import registry_entry

    if isinstance(entry, str):
        return registry_entry(conf, entry).as_dict()
    if isinstance(entry, dict) and entry.get("base"):
        base = registry_entry(conf, str(entry["base"])).as_dict()
        base.update({k: v for k, v in entry.items() if k != "base"})
        return base
    return entry


def check_data_files(cfg) -> None:
    """Refuse data files that fail their checksum; say which have none to check against."""
    from topkbench.data.files import missing_files
    from topkbench.data.registry import check_before_use

    if cfg.kind not in ("libsvm", "mat", "mulan", "features") or missing_files(cfg):
        return  # generated data; missing files get their own error from the loader
    unchecked = check_before_use(cfg)
    if unchecked:
        log.info("%s: no checksum on record for %s: not verified", cfg.name, ", ".join(unchecked))
