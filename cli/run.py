"""``reflexdb run``: a collector and a learner as separate processes, in one command."""

from __future__ import annotations

from pathlib import Path

import typer


def run(
    config: Path = typer.Argument(..., help="Run config (YAML), e.g. examples/arithmetic-grpo.yaml."),
    max_steps: int = typer.Option(None, "--max-steps", min=1, help="Learner steps (default: learner.max_steps)."),
    max_seconds: float = typer.Option(None, "--max-seconds", min=0, help="Stop the learner after this many seconds."),
    collectors: int = typer.Option(1, "--collectors", min=1, max=64, help="Collector processes to start."),
) -> None:
    """Start collectors and a learner (`reflexdb collect` / `reflexdb learn`) and wait for the learner."""
    from reflexdb.launch import run as launch

    raise typer.Exit(launch(config, max_steps=max_steps, max_seconds=max_seconds, collectors=collectors,
                            echo=lambda m: typer.echo(f"[run] {m}", err=True)))
