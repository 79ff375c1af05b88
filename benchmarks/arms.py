"""What the method-against-baseline experiments share: a fresh home per arm, SQL through the CLI,
and the arms of each seed run in turn with a results file that resumes an interrupted experiment.

Used by benchmarks/cleaner_vs_dapo.py (the older experiment scripts keep their own copies, as they ran).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CLI = [sys.executable, "-m", "reflexdb.cli.main"]


def home_env(home: Path) -> dict:
    """The environment of an arm's processes: its own REFLEXDB_HOME (embedded PostgreSQL), offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("REFLEXDB_DATABASE_URL", "OMP_NUM_THREADS")}
    return dict(env, REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def sql_rows(env: dict, query: str) -> list[list[float]]:
    """A query's rows as floats, through ``reflexdb sql`` in the arm's home."""
    out = subprocess.run(CLI + ["sql", "--max-width", "0", " ".join(query.split())],
                         env=env, capture_output=True, text=True, check=True).stdout
    return [[float(c.strip() or 0) for c in line.split("|")] for line in out.strip().splitlines()[2:-1]]


def run_seeds(res: dict, arms: list[str], seeds: list[int], run_arm: Callable[[str, int, dict | None], dict],
              json_out: Path | None) -> dict:
    """Each seed's arms in turn (a cut-short experiment still compares like with like), skipping those
    ``res`` already holds; ``run_arm(arm, seed, base)`` gets the seed's base-model evaluation once one
    arm made it. ``res`` is written to ``json_out`` after every arm."""
    for seed in seeds:
        base = next((r["base"] for r in res["arms"] if r["seed"] == seed), None)
        for arm in arms:
            if any(r["arm"] == arm and r["seed"] == seed for r in res["arms"]):
                continue
            print(f"== {arm} seed {seed}", flush=True)
            r = run_arm(arm, seed, base)
            base = r["base"]
            res["arms"].append(r)
            if json_out:
                json_out.write_text(json.dumps(res, indent=2))
    return res
