"""``reflexdb import``: JSONL or Parquet rows of prompt + completion (+ reward) into a run
(reflexdb/ops/importer.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer


def import_command(
    file: Path = typer.Argument(..., help="A .jsonl or .parquet file of prompt + completion (+ reward) rows."),
    config: Path = typer.Option(..., "--config", "-c", help="The run's config (its name, model and tokenizer)."),
    dataset: str = typer.Option(None, "--dataset", help="Dataset name of the tasks created (default: the file's stem)."),
    batch_size: int = typer.Option(500, "--batch-size", min=1, help="Rows per transaction."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config, then embedded)."),
    overrides: list[str] = typer.Option(None, "--set", help="Override a config key (repeatable; the value is YAML)."),
) -> None:
    """Import rows as trajectories of origin 'imported' (queryable and exportable; trained only with
    learner.imported_per_step > 0). Bad rows are reported as FILE:LINE and skipped; exit code 1 when
    there were any."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from reflexdb import Store
    from reflexdb.models import resolve_model
    from reflexdb.config import load_config, parse_overrides
    from reflexdb.db import name_process
    from reflexdb.errors import NotFound
    from reflexdb.ops.importer import Tokenizer, check_file, import_file
    from reflexdb import runs

    check_file(file)  # a missing file, a .csv, a broken Parquet file: refused before anything is created
    cfg = load_config(config, parse_overrides(overrides))
    name_process("import", cfg.run)
    tokenizer = Tokenizer(resolve_model(cfg.model))
    store = Store.open(url or cfg.database_url, create_schema=True)
    try:
        try:
            store.run_id(cfg.run)
            new_run = False
        except NotFound:
            new_run = True
        run_id = store.create_run(cfg.run, algorithm=cfg.algorithm, config=cfg.masked())
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      transient=True, disable=not sys.stderr.isatty()) as progress:
            task = progress.add_task(f"importing {file}", total=None)
            stats = import_file(store, run_id, file, tokenizer, dataset=dataset, batch_size=batch_size,
                                on_batch=lambda s: progress.update(task, description=f"importing {file}: {s.rows:,} rows"))
        if new_run and not stats.imported and not stats.already:  # nothing came of it: leave no empty run
            runs.delete(store, run_id)
    finally:
        store.close()
    for line in stats.bad[:50]:
        typer.echo(line, err=True)
    if len(stats.bad) > 50:
        typer.echo(f"... and {len(stats.bad) - 50} more bad rows", err=True)
    typer.echo(f"imported {stats.imported:,} new of {stats.rows:,} rows as {stats.groups:,} groups into run {cfg.run!r}"
               + (f"; {stats.already:,} already imported" if stats.already else "")
               + (f"; {len(stats.bad):,} bad rows skipped" if stats.bad else "")
               + ("" if stats.imported or stats.already or not new_run else " (no run was created)"))
    if stats.bad:
        raise typer.Exit(1)
