"""``reflexdb run``: start collectors and a learner as separate processes, as a user would by hand.

The children are exactly ``reflexdb collect -c CONFIG`` and ``reflexdb learn -c CONFIG``; they
meet only in the database. This process migrates the schema, keeps the embedded server up while
they run, waits for the learner to finish, then stops the collectors (SIGTERM: each finishes its
in-flight group) and prints a summary. Ctrl-C stops everything the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from . import admin
from .config import load_config
from .db import database_url
from .settings import resolve_target
from .store import Store

CLI = [sys.executable, "-m", "reflexdb.cli.main"]


def run(config: Path, *, max_steps: int | None, max_seconds: float | None, collectors: int = 1,
        echo=print) -> int:
    cfg = load_config(config)  # validated before anything starts
    url = database_url(resolve_target(cfg.database_url))
    admin.upgrade(url)
    store = Store.open(url)  # also keeps the embedded server alive for the children
    env = dict(os.environ, REFLEXDB_DATABASE_URL=url)  # not on the command line: it may hold a password
    learn_cmd = CLI + ["learn", "-c", str(config)]
    if max_steps:
        learn_cmd += ["--max-steps", str(max_steps)]
    if max_seconds:
        learn_cmd += ["--max-seconds", str(max_seconds)]
    procs = [subprocess.Popen(CLI + ["collect", "-c", str(config), "--name", f"{cfg.run}-collector-{i}"], env=env)
             for i in range(collectors)]
    echo(f"started {collectors} collector(s) and a learner for run {cfg.run!r}; Ctrl-C stops them cleanly")
    learner = subprocess.Popen(learn_cmd, env=env)
    interrupted = False

    def forward(signum, _frame):
        nonlocal interrupted
        interrupted = True
        for p in [learner, *procs]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = signal.signal(signal.SIGINT, forward), signal.signal(signal.SIGTERM, forward)
    try:
        code = learner.wait()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 300
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGTERM, old[1])
    run_id = store.run_id(cfg.run)
    with store.engine.connect() as conn:
        steps, version = conn.execute(text(
            "SELECT (SELECT max(step) FROM learner_steps WHERE run_id = :r), "
            "(SELECT max(version) FROM policy_versions WHERE run_id = :r)"), {"r": run_id}).one()
        groups = conn.execute(text("SELECT count(*) FROM groups WHERE run_id = :r AND kind = 'fresh'"),
                              {"r": run_id}).scalar()
    store.close()
    echo(f"run {cfg.run!r}: {steps or 0} learner steps, policy v{version}, {groups} groups collected"
         + ("; interrupted: run the same command to resume" if interrupted else ""))
    return code
