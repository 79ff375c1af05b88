"""``reflexdb sql`` and ``reflexdb psql``: plain SQL on the experience database."""

from __future__ import annotations

import typer

from reflexdb.lazy import lazy


from . import screen

admin = lazy("reflexdb.ops.admin")  # imported when a command runs, not when the CLI starts

URL_OPTION = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: embedded).")
# Analysis commands read from a replica when REFLEXDB_READ_URL names one (reflexdb/ops/replica.py).
READ_URL_OPTION = typer.Option(None, "--url", help="PostgreSQL URL (default: REFLEXDB_READ_URL, a read replica, for "
                                                   "reads; else REFLEXDB_DATABASE_URL; else embedded).")


def sql(
    query: str = typer.Argument(..., help="SQL to run (quote it)."),
    variables: list[str] = typer.Option(None, "--set-var", "-v", help="A psql-style variable: -v run=arithmetic-grpo replaces :'run' (a quoted literal), :\"run\" (an identifier) and :run (verbatim), as psql does (repeatable)."),
    write: bool = typer.Option(False, "--write", help="Allow changes (default: read-only transaction; always on the primary, never REFLEXDB_READ_URL)."),
    url: str = READ_URL_OPTION,
    max_width: int = typer.Option(60, "--max-width", help="Truncate cells wider than this (0: never; --json and --csv never truncate)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as a JSON array of objects."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the rows as CSV with a header line."),
) -> None:
    """Run SQL and print the result as a table (read-only unless --write); the cookbook's queries
    paste as they are, their variables given with -v."""
    from reflexdb.errors import ReflexdbError
    from reflexdb.ops.psqlvars import parse_assignments, substitute
    from reflexdb.ops.replica import read_url

    if as_json and as_csv:
        raise ReflexdbError("give --json or --csv, not both")
    query = substitute(query, parse_assignments(variables))
    result = admin.run_sql(read_url(url, write=write), query, write=write)
    if as_json:
        typer.echo(screen.format_json(result.columns, result.rows))
    elif as_csv:
        typer.echo(screen.format_csv(result.columns, result.rows), nl=False)
    else:
        typer.echo(screen.format_table(result.columns, result.rows, max_width=max_width))
    if result.status:
        typer.echo(result.status, err=as_json or as_csv)


def psql(
    url: str = URL_OPTION,
    args: list[str] = typer.Argument(None, help="Extra arguments passed to psql (after --)."),
) -> None:
    """Open psql on the configured database (the embedded one included)."""
    raise typer.Exit(screen.psql(url, args or []))
