"""``reflexdb ui``: the MLflow UI on reflexdb's tracking store."""

from __future__ import annotations

import subprocess
import sys

import typer


def ui(
    port: int = typer.Option(5000, "--port", help="Port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (127.0.0.1: this machine only)."),
    tracking_uri: str = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                     help="MLflow store (default: sqlite:///$REFLEXDB_HOME/mlflow.db)."),
) -> None:
    """Start the MLflow UI on the runs the learner and `reflexdb eval` logged."""
    from reflexdb.settings import home
    from reflexdb.tracking import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    typer.echo(f"MLflow UI on http://{host}:{port} (store {uri}); Ctrl-C to stop")
    raise typer.Exit(subprocess.call([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                                      "--default-artifact-root", (home() / "mlartifacts").as_uri(),
                                      "--host", host, "--port", str(port)]))
