"""Build a collector from a config file and run it (what ``reflexdb collect`` does)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import typer

from reflexdb import Store, drill
from reflexdb.config import load_config, parse_overrides
from reflexdb.db import name_process
from reflexdb.retry import DbRetry


def run_collector(config_path: Path, *, max_groups: int | None = None, max_seconds: float | None = None,
                  name: str | None = None, url: str | None = None, overrides: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    drill.phase("start")
    changes = parse_overrides(overrides)
    if name:
        changes["collector.name"] = name
    cfg = load_config(config_path, changes)  # validated before anything starts
    name_process("collect", cfg.run)
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


def run_eval(config_path: Path, *, checkpoint: str, split: str, k: int | None, max_tasks: int | None,
             url: str | None, as_json: bool = False, overrides: list[str] | None = None, attempts: int = 1) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = load_config(config_path, parse_overrides(overrides))
    name_process("eval", cfg.run)
    from .evaluate import evaluate

    store = Store.open(url or cfg.database_url, create_schema=True)
    try:
        r = evaluate(cfg, store, checkpoint, split=split, k=k, max_tasks=max_tasks, attempts=attempts,
                     echo=lambda msg: typer.echo(f"[eval] {msg}", err=True))
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(r)))
        return
    tried = f", {attempts} attempts each" if attempts > 1 else ""
    typer.echo(f"{r.label}: pass@1 {r.pass_at_1:.4f}  pass@{r.samples_per_task} {r.pass_at_k:.4f}  "
               f"({r.tasks} {r.split} tasks x {r.samples_per_task} samples{tried}; MLflow run {r.mlflow_run_id})")
