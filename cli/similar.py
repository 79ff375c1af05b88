"""``reflexdb similar``: nearest trajectories by hidden-state embedding (FAISS)."""

from __future__ import annotations

import typer


def similar(
    trajectory_id: int = typer.Argument(..., help="Trajectory whose neighbours to show."),
    k: int = typer.Option(10, "-k", min=1, help="How many neighbours."),
) -> None:
    """Print the trajectories nearest to TRAJECTORY_ID with cosine, reward and text."""
    raise NotImplementedError  # filled in by the FAISS work
