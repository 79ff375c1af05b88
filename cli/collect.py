"""``reflexdb collect``: run a long-running collector."""

from __future__ import annotations

from pathlib import Path

import typer


def collect(
    config: Path = typer.Option(..., "--config", "-c", help="Run config (YAML), see docs/configuration.md."),
    max_groups: int = typer.Option(None, "--max-groups", min=1, help="Stop after writing this many groups."),
    max_seconds: float = typer.Option(None, "--max-seconds", min=0, help="Stop after this many seconds."),
    name: str = typer.Option(None, "--name", help="Collector name (default: host-pid); overrides collector.name."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config, then embedded)."),
    overrides: list[str] = typer.Option(None, "--set", help="Override a config key: --set learner.lr=1e-5 (repeatable; the value is YAML)."),
) -> None:
    """Generate groups of trajectories from the run's tasks and write them to the store, until stopped."""
    from reflexdb.collector.cli_entry import run_collector

    run_collector(config, max_groups=max_groups, max_seconds=max_seconds, name=name, url=url, overrides=overrides)
