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


def kill_when_held(proc, drill_dir, phase: str, timeout: float = 180.0) -> None:
    """Wait until ``proc`` (started with ``REFLEXDB_DRILL_HOLD=phase`` and ``REFLEXDB_DRILL_DIR=drill_dir``)
    has stopped itself as it entered ``phase``, check that it did, and SIGKILL it there (a kill
    timed from outside races a fast model; a process that holds itself does not)."""
    import signal
    import time
    from pathlib import Path

    def stopped() -> bool:
        try:
            return Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        except FileNotFoundError:
            return False

    try:
        deadline = time.monotonic() + timeout
        while not stopped() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert stopped(), (proc.poll(), proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        assert (Path(drill_dir) / f"{proc.pid}.phase").read_bytes().decode().strip() == phase
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
