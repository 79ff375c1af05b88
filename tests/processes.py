"""Helpers for tests that run reflexdb commands as child processes."""

from __future__ import annotations

import os
import sys

from sqlalchemy import text

REFLEXDB = [sys.executable, "-m", "reflexdb.cli.main"]

# Set in the test process by in-process tests (MLflow's set_tracking_uri exports
# MLFLOW_TRACKING_URI; torch.distributed's rendezvous exports MASTER_PORT & co.): a child must
# choose its own.
PARENT_ONLY = {"MLFLOW_TRACKING_URI", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}


def child_env(db_url, tmp_path, model_cache) -> dict[str, str]:
    """The environment of a reflexdb child: this database, its own home, the shared model cache."""
    env = {k: v for k, v in os.environ.items() if k not in PARENT_ONLY}
    return dict(env, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(tmp_path / "home"),
                REFLEXDB_MODEL_CACHE=str(model_cache), PYTHONUNBUFFERED="1")


def rows(store, sql, **params) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]
