"""What the measurements before any training share (cleaner_v0.py: CLEANER's tool calls;
r3l_reflections.py: R3L's reflections): the untrained policy (v0) collects a few tasks of a
method's example in a run of its own per setting, and the method's view says what came of it.

- one database for the whole measurement: ``REFLEXDB_DATABASE_URL``'s, else an embedded server in a
  fresh ``REFLEXDB_HOME`` (:func:`open_store`);
- per setting, a run named after it and the time, with a collector of policy v0 (:func:`collector`),
  and the rows of a query of that run (:func:`rows`);
- the options they share and the results file (:func:`common_options`, :func:`new_results`,
  :func:`write`).

Scripts import it as ``from v0 import ...``: Python puts a script's own folder first on its path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def common_options(ap: argparse.ArgumentParser, set_help: str) -> argparse.ArgumentParser:
    """``--seed``, ``--set`` (repeatable config overrides, ``set_help`` says how) and ``--json-out``."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help=set_help)
    ap.add_argument("--json-out", type=Path)
    return ap


def open_store(prefix: str):
    """The measurement's database (a :class:`reflexdb.Store`): ``REFLEXDB_DATABASE_URL``'s, else an
    embedded server in a fresh ``REFLEXDB_HOME`` named with ``prefix``; the model hub offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not os.environ.get("REFLEXDB_DATABASE_URL"):
        os.environ["REFLEXDB_HOME"] = tempfile.mkdtemp(prefix=prefix)
    from reflexdb import Store

    return Store.open(os.environ.get("REFLEXDB_DATABASE_URL"), create_schema=True)


def collector(store, config: Path, run_prefix: str, label: str, overrides: dict) -> tuple[object, str]:
    """A set-up collector of policy v0 on ``config`` with ``overrides``, in a new run named
    ``RUN_PREFIX-<unix time>``; its progress goes to stderr tagged with ``label``. Returns the
    collector and the run's name."""
    from reflexdb.collector.runner import Collector
    from reflexdb.config import load_config

    run = f"{run_prefix}-{int(time.time())}"
    cfg = load_config(config, {**overrides, "run": run})
    c = Collector(cfg, store, echo=lambda m: print(f"  [{label}] {m}", file=sys.stderr))
    c.setup()
    return c, run


def rows(conn, query: str, run: str, **params) -> list[tuple]:
    """The rows of ``query`` for the run named ``run`` (``:run`` in the query; ``params`` the others)."""
    from sqlalchemy import text

    return [tuple(r) for r in conn.execute(text(query), {"run": run, **params})]


def new_results(config: Path) -> dict:
    """A results file's start: the date, the machine, its load now (before measuring) and the config."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": f"{os.cpu_count()} cores",
            "load_before": os.getloadavg()[0], "config": str(config.relative_to(ROOT)), "results": []}


def write(path: Path | None, out: dict) -> None:
    """The results as JSON at ``path`` (none: not written)."""
    if path:
        path.write_text(json.dumps(out, indent=2, default=str) + "\n")
