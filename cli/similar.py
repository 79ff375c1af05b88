"""``reflexdb similar``: nearest trajectories by hidden-state embedding (FAISS)."""

from __future__ import annotations

import typer

from . import screen
from .query import URL_OPTION


def similar(
    trajectory_id: int = typer.Argument(..., help="Trajectory whose neighbours to show."),
    k: int = typer.Option(10, "-k", min=1, help="How many neighbours."),
    url: str = URL_OPTION,
    max_width: int = typer.Option(80, "--max-width", help="Truncate cells wider than this (0: never)."),
) -> None:
    """Print the trajectories nearest to TRAJECTORY_ID with cosine, reward and text.

    Catches up the run's FAISS index from the database first (see docs/faiss.md).
    """
    from reflexdb import Store
    from reflexdb.db import database_url
    from reflexdb.index import SIMILAR_COLUMNS, similar_trajectories
    from reflexdb.settings import resolve_target

    # resolve_target normalises postgres:// URLs to the psycopg driver (or starts the embedded server).
    with Store.open(database_url(resolve_target(url))) as store:
        result = similar_trajectories(store, trajectory_id, k)
    typer.echo(f"nearest to trajectory {result.trajectory_id} among {result.indexed} embeddings of run "
               f"{result.run_id}, by cosine similarity")
    rows = [tuple(getattr(n, c) for c in SIMILAR_COLUMNS) for n in result.neighbors]
    typer.echo(screen.format_table(list(SIMILAR_COLUMNS), rows, max_width=max_width))
