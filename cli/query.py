"""``reflexdb sql`` and ``reflexdb psql``: plain SQL on the experience database."""

from __future__ import annotations

import typer

from reflexdb import admin

from . import screen

URL_OPTION = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: embedded).")


def sql(
    query: str = typer.Argument(..., help="SQL to run (quote it)."),
    write: bool = typer.Option(False, "--write", help="Allow changes (default: read-only transaction)."),
    url: str = URL_OPTION,
    max_width: int = typer.Option(60, "--max-width", help="Truncate cells wider than this (0: never)."),
) -> None:
    """Run SQL and print the result as a table (read-only unless --write)."""
    result = admin.run_sql(url, query, write=write)
    typer.echo(screen.format_table(result.columns, result.rows, max_width=max_width))
    if result.status:
        typer.echo(result.status)


def psql(
    url: str = URL_OPTION,
    args: list[str] = typer.Argument(None, help="Extra arguments passed to psql (after --)."),
) -> None:
    """Open psql on the configured database (the embedded one included)."""
    raise typer.Exit(screen.psql(url, args or []))
