"""Build a learner from a config file and run it (what ``reflexdb learn`` does)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import typer

from reflexdb import Store, drill
from reflexdb.config import load_config, parse_overrides
from reflexdb.db import name_process
from reflexdb.retry import DbRetry

from . import ranks


def run_learner(config_path: Path, *, max_steps: int | None = None, max_seconds: float | None = None,
                url: str | None = None, overrides: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    drill.phase("start")
    cfg = load_config(config_path, parse_overrides(overrides))  # validated before anything starts
    name_process("learn", cfg.run)
    if cfg.learner.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # say so, instead of DeepSpeed's "unable to detect" warning
    from .learner import Learner

    echo = lambda msg: typer.echo(f"[learn] {msg}", err=True)  # noqa: E731
    # Started while the database is away (a restart after a crash, say): wait for it like any call.
    store = DbRetry(cfg.learner.db_retry_s, echo, who="the learner")(
        lambda: Store.open(url or cfg.database_url, create_schema=True))
    learner = None
    try:
        learner = Learner(cfg, store, echo=echo)
        learner.setup()

        def handler(signum, _frame):
            if learner.stopping:
                raise KeyboardInterrupt
            learner.stopping = True  # with several ranks, rank 0's flag decides for all (Learner.run)
            if learner.world == 1:  # with ranks, rank 0 says so when it acts on it: torchrun's SIGTERM may
                # instead mean that another rank died, and then every rank stops at once (trainer/ranks.py)
                echo(f"{signal.Signals(signum).name}: finishing the current step, publishing, then stopping "
                     f"(resume with the same command)")

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        learner.run(max_steps=max_steps, max_seconds=max_seconds if max_seconds is not None else cfg.learner.max_seconds)
        learner.finish()  # publishes the steps trained since the last publish (none: publishes nothing)
        learner.echo(f"stopped at step {learner.step_no}, policy v{learner.version}")
    except Exception as exc:  # a collective failed because another rank is gone: one line on each rank left
        ranks.raise_if_a_rank_is_lost(exc, learner.step_no if learner is not None else 0, cfg.learner.dist_timeout_s)
        raise
    finally:
        store.close()
