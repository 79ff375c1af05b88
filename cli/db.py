"""``reflexdb db``: schema migrations, status, and the embedded server."""

from __future__ import annotations

import typer

from reflexdb import admin

app = typer.Typer(help="Create, migrate and inspect the experience database.", no_args_is_help=True)

URL_OPTION = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: embedded).")


@app.command()
def upgrade(
    url: str = URL_OPTION,
    revision: str = typer.Option("head", help="Target revision."),
) -> None:
    """Create or migrate the schema to REVISION (idempotent)."""
    before, after = admin.upgrade(url, revision)
    if before == after:
        typer.echo(f"schema already at {after}")
    else:
        typer.echo(f"schema upgraded {before or '(empty)'} -> {after}")


@app.command()
def downgrade(
    revision: str = typer.Argument(..., help="Target revision ('base' removes everything)."),
    url: str = URL_OPTION,
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
) -> None:
    """Migrate the schema down to REVISION (drops tables and data of later revisions)."""
    if not yes:
        typer.confirm(f"downgrade the schema to {revision}? Tables of later revisions are dropped", abort=True)
    before, after = admin.downgrade(url, revision)
    typer.echo(f"schema downgraded {before} -> {after or '(empty)'}")


@app.command()
def status(url: str = URL_OPTION) -> None:
    """Show the database URL (password masked), schema revision, row counts and size."""
    info = admin.status(url)
    width = max(len(k) for k in info.fields) + 1
    for key, value in info.fields.items():
        typer.echo(f"{key + ':':<{width}} {value}")
    if info.counts:
        typer.echo("rows:")
        for table, n in info.counts.items():
            typer.echo(f"  {table:<16} {n:>12,}")


@app.command()
def stop() -> None:
    """Stop the embedded PostgreSQL server now (it also stops when its last user exits)."""
    typer.echo("embedded server stopped" if admin.stop_embedded() else "embedded server was not running")


@app.command()
def url(
    url: str = URL_OPTION,
    bin_dir: bool = typer.Option(False, "--bin-dir", help="Print the embedded PostgreSQL's bin directory instead."),
) -> None:
    """Print the database URL in the form psql and pg_dump accept (starts the embedded server)."""
    typer.echo(admin.bin_dir() if bin_dir else admin.libpq_url_for(url))
