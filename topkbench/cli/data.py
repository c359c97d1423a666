"""``topkbench data list | info | fetch | verify``: the dataset registry and its files."""

from __future__ import annotations

import typer

from topkbench.cli.app import (
    conf_dir,
    data_app,
    handle_errors,
)


def _status_table(cfg, statuses) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table("file", "state", "sha256 check", "path", title=f"{cfg.name}")
    for st in statuses:
        check = {"registry": "registry", "recorded": "recorded on first fetch"}.get(
            st.source, "none published"
        )
        t.add_row(st.file, st.state, check, str(st.path))
    Console().print(t)


@data_app.command("list", help="List the registered datasets and whether their files are here.")
@handle_errors
def data_list() -> None:
    import os

    from rich.console import Console
    from rich.table import Table

    from topkbench.data.files import data_dirs, missing_files
    from topkbench.data.registry import registry_entry, registry_names

    where = os.pathsep.join(str(p) for p in data_dirs())
    t = Table("name", "kind", "paper m / n / d", "files", "title", title=f"data dirs: {where}")
    for name in registry_names(conf_dir()):
        cfg = registry_entry(conf_dir(), name)
        paper = cfg.get("paper") or {}
        shape = " / ".join(str(paper.get(k, "?")) for k in ("m", "n", "d")) if paper else ""
        if cfg.kind in ("circle", "gaussian"):
            state = "generated"
        else:
            state = "missing" if missing_files(cfg) else "present"
        t.add_row(name, cfg.kind, shape, state, str(cfg.get("title", "")))
    Console().print(t)


@data_app.command("info", help="Show a dataset's files, sources, preprocessing and state.")
@handle_errors
def data_info(name: str = typer.Argument(..., help="registered dataset name")) -> None:
    from topkbench.data.files import data_dir
    from topkbench.data.registry import registry_entry, verify

    cfg = registry_entry(conf_dir(), name)
    typer.echo(f"{cfg.name}: {cfg.get('title', '')}")
    typer.echo(f"  kind: {cfg.kind}")
    for key, value in cfg.options:
        if key not in ("files", "title"):
            typer.echo(f"  {key}: {value}")
    if cfg.kind in ("circle", "gaussian"):
        typer.echo("  generated on the fly; nothing to download")
        return
    typer.echo(f"  directory: {data_dir() / cfg.name}")
    if cfg.kind == "features":
        from topkbench.data import features

        typer.echo("  expected layout (you supply the files):")
        typer.echo("    " + features.__doc__.split("Layout", 1)[1].strip().replace("\n", "\n    "))
    _status_table(cfg, verify(cfg))


@data_app.command("fetch", help="Download a dataset's files (checksums verified, resumable).")
@handle_errors
def data_fetch(
    name: str = typer.Argument(..., help="registered dataset name"),
    progress: bool = typer.Option(True, help="show a download progress bar"),
    deadline: float = typer.Option(
        3600.0, min=0.001, help="seconds a file's download may take in total"
    ),
) -> None:
    from topkbench.data.registry import fetch, registry_entry

    cfg = registry_entry(conf_dir(), name)
    if cfg.kind in ("circle", "gaussian"):
        typer.echo(f"{name} is generated on the fly; nothing to fetch")
        return
    _status_table(cfg, fetch(cfg, progressbar=progress, deadline=deadline))


@data_app.command("verify", help="Check a dataset's files against their sha256 (exit 1 if bad).")
@handle_errors
def data_verify(name: str = typer.Argument(..., help="registered dataset name")) -> None:
    from topkbench.data.registry import registry_entry, verify

    cfg = registry_entry(conf_dir(), name)
    statuses = verify(cfg)
    _status_table(cfg, statuses)
    if any(st.state in ("missing", "mismatch") for st in statuses):
        raise typer.Exit(1)
