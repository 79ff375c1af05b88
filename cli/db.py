"""``reflexdb db``: schema migrations, status, and the embedded server."""

from __future__ import annotations

import typer

from reflexdb.lazy import lazy

admin = lazy("reflexdb.ops.admin")  # imported when a command runs, not when the CLI starts

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
    """Migrate the schema down to REVISION (drops tables and data of later revisions; BRANCH@base
    removes a method's branch), in one transaction: refused, with nothing changed, while runs hold
    rows of an origin or a group kind it removes, or rows in a method's table it drops (the message
    names them)."""
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
        width = max(16, *map(len, info.counts))
        for table, n in info.counts.items():
            typer.echo(f"  {table:<{width}} {n:>12,}")
    if info.runs:
        typer.echo("size per run (its partitions: trajectories, turns, token_bytes, embeddings, consumption, "
                   "token_signals):")
        width = max(len(name) for name, *_ in info.runs)
        for name, _, size, trajectories in info.runs:
            typer.echo(f"  {name:<{width}} {size / 2**20:>10,.1f} MiB {trajectories:>12,} trajectories")


@app.command()
def archive(
    run: str = typer.Argument(..., help="The run's name."),
    output: str = typer.Option(..., "-o", "--output", help="A new (or empty) directory for the archive."),
    url: str = URL_OPTION,
) -> None:
    """Write a run to Parquet (one file per table, a manifest with SHA-256s), check every file
    against the database row by row, then delete the run's rows. Refused while a collector,
    learner, eval or import of the run is connected. `reflexdb db restore DIR` brings it back."""
    from pathlib import Path

    from reflexdb import Store
    from reflexdb.ops.archive import archive as write_archive

    with Store.open(url) as store:
        result = write_archive(store, run, Path(output),
                               on_table=lambda t, n: typer.echo(f"  {t:<16} {n:>12,} rows", err=True))
    typer.echo(f"archived run {run!r} ({sum(result.rows.values()):,} rows, {result.bytes / 2**20:,.1f} MiB) to "
               f"{result.directory}; verified, and deleted from the database")


@app.command()
def restore(
    directory: str = typer.Argument(..., help="A directory written by `reflexdb db archive`."),
    url: str = URL_OPTION,
) -> None:
    """Insert an archived run back, with its original ids, in one transaction."""
    from pathlib import Path

    from reflexdb import Store
    from reflexdb.ops.archive import restore as read_archive

    with Store.open(url) as store:
        result = read_archive(store, Path(directory))
    typer.echo(f"restored run {result.run!r} (id {result.run_id}, {sum(result.rows.values()):,} rows) from "
               f"{result.directory}")


@app.command()
def replica(
    stop: bool = typer.Option(False, "--stop", help="Stop the replica (its data directory stays)."),
    directory: str = typer.Option(None, "--dir", help="The replica's data directory (default: $REFLEXDB_HOME/pgdata-replica)."),
) -> None:
    """Start a streaming read replica of the embedded server (copied the first time with
    pg_basebackup) and print the REFLEXDB_READ_URL that sends `reflexdb sql` and `reflexdb export`
    to it. For an external server, set up a standby with its own tools (docs/operations.md)."""
    from pathlib import Path

    from reflexdb.ops import replica as rep
    from reflexdb.errors import ReflexdbError
    from reflexdb.settings import resolve_target

    if not resolve_target(None).embedded:
        raise ReflexdbError("reflexdb db replica copies the embedded server, but REFLEXDB_DATABASE_URL (or "
                            "config.toml) names another server: make a standby with that server's tools and set "
                            "REFLEXDB_READ_URL to it (docs/operations.md, Read replica)")
    path = Path(directory) if directory else None
    if stop:
        typer.echo("replica stopped" if rep.stop(path) else "replica was not running")
        return
    url = rep.start(replica=path)
    typer.echo(f"replica streaming from the embedded server, hot standby at {url}")
    typer.echo(f"export {rep.ENV_READ_URL}='{url}'")


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


@app.command("roles")
def roles_command(url: str = URL_OPTION) -> None:
    """Create the least-privilege roles reflexdb_collector, reflexdb_learner, reflexdb_reader and grant them.

    Run it as the database owner (or a superuser), once per database and again after upgrades
    (`reflexdb db upgrade` re-grants by itself once they exist). See docs/operations.md, "Roles".
    """
    where = admin.apply_roles(url)
    typer.echo(f"roles reflexdb_collector, reflexdb_learner, reflexdb_reader: privileges granted on {where}")
    typer.echo("add a login for a machine or a person: reflexdb db user NAME --role collector|learner|reader")


@app.command("user")
def user_command(
    name: str = typer.Argument(..., help="Login role to create (or whose password and role to set)."),
    role: str = typer.Option(..., "--role", help="collector, learner or reader."),
    password_env: str = typer.Option(None, "--password-env", help="Read the password from this environment variable instead of asking."),
    no_password: bool = typer.Option(False, "--no-password", help="No password (for servers that authenticate otherwise: peer, cert, trust)."),
    url: str = URL_OPTION,
) -> None:
    """Add a login role that is a member of reflexdb_<role>; the password is hashed before it is sent."""
    import os

    if no_password:
        password = None
    elif password_env:
        password = os.environ.get(password_env)
        if not password:
            raise typer.BadParameter(f"environment variable {password_env} is empty or unset", param_hint="--password-env")
    else:
        password = typer.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)
    login = admin.create_user(url, name, role, password)
    typer.echo(f"login role {name!r} is a member of reflexdb_{role}; it connects with {login}")
