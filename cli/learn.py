"""``reflexdb learn``: run the learner."""

from __future__ import annotations

from pathlib import Path

import typer


def learn(
    config: Path = typer.Option(..., "--config", "-c", help="Run config (YAML), see docs/configuration.md."),
    max_steps: int = typer.Option(None, "--max-steps", min=1, help="Stop after this many learner steps in total."),
    max_seconds: float = typer.Option(None, "--max-seconds", min=0, help="Stop after this many seconds."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config, then embedded)."),
) -> None:
    """Train on groups from the store and publish weights the collectors reload, until stopped."""
    from reflexdb.trainer.cli_entry import run_learner

    run_learner(config, max_steps=max_steps, max_seconds=max_seconds, url=url)
