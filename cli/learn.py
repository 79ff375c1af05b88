"""``reflexdb learn``: run the learner."""

from __future__ import annotations

from pathlib import Path

import typer


def learn(
    config: Path = typer.Option(..., "--config", "-c", help="Run config (YAML), see docs/configuration.md."),
    max_steps: int = typer.Option(None, "--max-steps", min=1, help="Stop after this many learner steps in total."),
    max_seconds: float = typer.Option(None, "--max-seconds", min=0, help="Start no new step after this many seconds (default: learner.max_seconds)."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config, then embedded)."),
    overrides: list[str] = typer.Option(None, "--set", help="Override a config key: --set learner.lr=1e-5 (repeatable; the value is YAML)."),
) -> None:
    """Train on groups from the store and publish weights the collectors reload, until stopped."""
    from reflexdb.trainer.cli_entry import run_learner

    run_learner(config, max_steps=max_steps, max_seconds=max_seconds, url=url, overrides=overrides)
