"""``reflexdb eval``: pass@1 / pass@k of a checkpoint on held-out tasks."""

from __future__ import annotations

from pathlib import Path

import typer


def eval_command(
    config: Path = typer.Option(..., "--config", "-c", help="Run config (YAML)."),
    checkpoint: str = typer.Option("latest", "--checkpoint", help="base, latest, vN (a published version) or a model directory."),
    split: str = typer.Option("eval", "--split", help="Task split to evaluate on."),
    k: int = typer.Option(None, "-k", min=1, help="Samples per task (pass@k); default learner.eval_samples."),
    max_tasks: int = typer.Option(None, "--max-tasks", min=1, help="Evaluate on at most this many tasks."),
    attempts: int = typer.Option(1, "--attempts", min=1, max=64, help="Answers allowed per sample: 1 = one attempt (the default); K > 1 runs each sample as a multi_attempt episode (feedback after a wrong answer), so pass@1 is the share solved within K tries."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config, then embedded)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object instead of a line of text."),
    overrides: list[str] = typer.Option(None, "--set", help="Override a config key: --set learner.lr=1e-5 (repeatable; the value is YAML)."),
) -> None:
    """Report pass@1 and pass@k on held-out tasks with the plain prompt, and log them to MLflow."""
    from reflexdb.collector.cli_entry import run_eval

    run_eval(config, checkpoint=checkpoint, split=split, k=k, max_tasks=max_tasks, url=url, as_json=as_json,
             overrides=overrides, attempts=attempts)
