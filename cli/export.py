"""``reflexdb export``: a view, table or query to Parquet, JSONL or CSV (reflexdb/ops/export.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from .query import READ_URL_OPTION


def export(
    source: str = typer.Argument(..., help="A view or table name (failures, episode_turns, ...) or a query (quote it)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output file: .parquet, .jsonl or .csv."),
    fmt: str = typer.Option(None, "--format", help="parquet, jsonl or csv (default: from the suffix)."),
    chat: bool = typer.Option(False, "--chat", help="Trajectory rows: a 'messages' column instead of 'prompt'/'completion'."),
    batch_size: int = typer.Option(1000, "--batch-size", min=1, help="Rows read and written at a time (bounds memory)."),
    url: str = READ_URL_OPTION,
) -> None:
    """Export a view, table or query to Parquet, JSONL or CSV, streamed in batches. Rows with a
    trajectory_id also get prompt/completion (or messages), token ids and log-probs. In CSV, a text
    cell a spreadsheet would run as a formula (starting with = + - @, a tab or CR) gets a ' first."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"exporting to {out}", total=None)
        from reflexdb.ops.export import export as run_export
        from reflexdb.ops.replica import read_url

        stats = run_export(read_url(url), source, out, fmt=fmt, batch_size=batch_size, chat=chat,
                           on_batch=lambda n: progress.update(task, description=f"exporting to {out}: {n:,} rows"))
    typer.echo(f"wrote {stats.rows:,} rows ({len(stats.columns)} columns) to {stats.path}")
