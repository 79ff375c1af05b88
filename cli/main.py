"""The ``reflexdb`` command: a Typer app whose commands live one group per module.

Errors meant for people (:class:`~reflexdb.errors.ReflexdbError`) are printed as one message with
a non-zero exit code; set ``REFLEXDB_DEBUG=1`` (or pass ``--debug``) to see the traceback.
"""

from __future__ import annotations

import os
import sys

import typer

from reflexdb.errors import ReflexdbError

from . import check, collect, compare, db, evaluate, export, importing, learn, plugins, query, run, runs, similar, ui

app = typer.Typer(
    name="reflexdb",
    help="Asynchronous off-policy RL for language models around a PostgreSQL experience database.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
)
app.add_typer(db.app, name="db")
app.add_typer(runs.app, name="runs")
app.command("sql")(query.sql)
app.command("psql")(query.psql)
app.command("similar")(similar.similar)
app.command("export")(export.export)
app.command("import")(importing.import_command)
app.command("collect")(collect.collect)
app.command("learn")(learn.learn)
app.command("eval")(evaluate.eval_command)
app.command("ui")(ui.ui)
app.command("run")(run.run)
app.command("check")(check.check)
app.command("compare")(compare.compare)
app.command("plugins")(plugins.plugins)


def _version(value: bool) -> None:
    if value:
        from reflexdb import __version__

        typer.echo(f"reflexdb {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", envvar="REFLEXDB_DEBUG", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    plugin: list[str] = typer.Option([], "-p", metavar="no:NAME", help="Leave the installed plug-in NAME out (repeatable; as pytest's -p no:NAME); the processes this command starts leave it out too (REFLEXDB_DISABLE_PLUGINS)."),
) -> None:
    if debug:
        os.environ["REFLEXDB_DEBUG"] = "1"
    if plugin:
        from reflexdb.plugins import DISABLE_ENV, disabled_plugins

        bad = [p for p in plugin if not p.startswith("no:") or not p[3:].strip()]
        if bad:
            raise typer.BadParameter(f"{', '.join(bad)}: -p takes no:NAME (leave plug-in NAME out)", param_hint="-p")
        os.environ[DISABLE_ENV] = ",".join(sorted(disabled_plugins() | {p[3:].strip() for p in plugin}))


#: Library chatter a person running reflexdb does not need (set them to see it again).
QUIET_DEFAULTS = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" / "Writing model shards" bars
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # "Creating initial MLflow database tables ..."
    "TOKENIZERS_PARALLELISM": "false",  # the fork warning of the tokenizers library
    "TQDM_DISABLE": "1",  # transformers' one-time "Converting and de-quantizing GGUF tensors" bar
}


def main() -> None:
    """Console-script entry point."""
    for key, value in QUIET_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        app()
    except ReflexdbError as exc:
        if os.environ.get("REFLEXDB_DEBUG") not in (None, "", "0"):
            raise
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
