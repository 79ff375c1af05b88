"""``reflexdb run``: evaluate, train with a collector and a learner as separate processes, evaluate."""

from __future__ import annotations

from pathlib import Path

import typer


def run(
    config: Path = typer.Argument(..., help="Run config (YAML), e.g. examples/arithmetic-grpo.yaml."),
    max_steps: int = typer.Option(None, "--max-steps", min=1, help="Learner steps in total (default: learner.max_steps)."),
    max_seconds: float = typer.Option(None, "--max-seconds", min=0, help="Start no new learner step after this many seconds (default: learner.max_seconds)."),
    collectors: int = typer.Option(1, "--collectors", min=1, max=64, help="Collector processes to start."),
    evaluate: bool = typer.Option(True, "--eval/--no-eval", help="Evaluate held-out pass@1 before and after training."),
    overrides: list[str] = typer.Option(None, "--set", help="Override a config key in every process: --set learner.lr=1e-5 (repeatable; the value is YAML)."),
) -> None:
    """Evaluate, train (`reflexdb collect` + `reflexdb learn` processes), evaluate again, and say where to look."""
    from reflexdb.config import load_config, parse_overrides

    from .launch import run as launch
    from .launch import summary

    name = load_config(config, parse_overrides(overrides)).run
    result = launch(config, max_steps=max_steps, max_seconds=max_seconds, collectors=collectors, overrides=overrides,
                    evaluate=evaluate, echo=lambda m: typer.echo(f"[run] {m}", err=True))
    typer.echo(summary(name, result))
    raise typer.Exit(result.exit_code)
