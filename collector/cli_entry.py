"""Build a collector from a config file and run it (what ``reflexdb collect`` does)."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from reflexdb import Store, drill
from reflexdb.config import load_config, parse_overrides
from reflexdb.retry import DbRetry


def run_collector(config_path: Path, *, max_groups: int | None = None, max_seconds: float | None = None,
                  name: str | None = None, url: str | None = None, overrides: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    drill.phase("start")
    changes = parse_overrides(overrides)
    if name:
        changes["collector.name"] = name
    cfg = load_config(config_path, changes)  # validated before anything starts
    from .runner import Collector

    echo = lambda msg: typer.echo(f"[collect] {msg}", err=True)  # noqa: E731
    # Started while the database is away: wait for it, as the loop does.
    retry = DbRetry(cfg.collector.db_retry_s, echo, who="the collector")
    store = retry(lambda: Store.open(url or cfg.database_url, create_schema=True))
    try:
        collector = Collector(cfg, store, echo=echo)
        retry(collector.setup)
        collector.install_signal_handlers()
        collector.run(max_groups=max_groups, max_seconds=max_seconds)
    finally:
        store.close()
