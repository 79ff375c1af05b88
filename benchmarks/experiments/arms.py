"""What the method-against-baseline experiments of this folder share, so that each script keeps
only its own task, arms, method metrics, table and plot.

- an arm's environment: its own ``REFLEXDB_HOME`` (embedded PostgreSQL), offline (:func:`home_env`);
- the ``reflexdb`` commands an arm runs, as a user types them: ``run`` with its log
  (:func:`run_logged`), ``eval --json`` (:func:`eval_json`), ``sql`` (:func:`sql_rows`), and
  ``compare --json`` for a run's learner steps and training seconds (:func:`training`); the held-out
  pass@1 that ``reflexdb run`` prints last (:func:`run_summary`);
- the arms of each seed in turn, with a results file that resumes an interrupted experiment
  (:func:`run_seeds`), and the command line and ``main`` the seeded experiments have in common
  (:func:`experiment_parser`, :func:`output_options`, :func:`new_results`, :func:`report_or_run`);
- the results table's lines (:func:`md_table`);
- the plots' pieces: matplotlib off-screen (:func:`pyplot`, :func:`subplots`), one curve per arm
  and seed (:func:`seed_curves`), the figure's title and file (:func:`save`).

Scripts import it as ``from arms import ...``: Python puts a script's own folder first on its path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "reflexdb.cli.main"]
#: ``reflexdb run``'s closing line: held-out pass@1 before and after training (cli/launch.py).
RUN_SUMMARY = re.compile(r"held-out pass@1 \((\d+) \S+ tasks x (\d+) samples\): (\S+) ([\d.]+) -> (\S+) ([\d.]+)")


def home_env(home: Path) -> dict:
    """The environment of an arm's processes: its own REFLEXDB_HOME (embedded PostgreSQL), offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("REFLEXDB_DATABASE_URL", "OMP_NUM_THREADS")}
    return dict(env, REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def run_logged(cmd: list[str], env: dict, log: Path, what: str, *, capture: bool = False,
               stdout_file: Path | None = None) -> tuple[str, float]:
    """Run ``cmd`` from the project root with its output in ``log`` (with ``capture``: its stderr
    there and its stdout returned, and also written to ``stdout_file`` when given). A failure ends
    the experiment, naming ``what`` and the log. Returns the stdout ('' without ``capture``) and
    the wall-clock seconds."""
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE if capture else fh,
                              stderr=fh if capture else subprocess.STDOUT, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if stdout_file is not None:
        stdout_file.write_text(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"{what}: exit {proc.returncode}; see {log}")
    return proc.stdout or "", wall


def eval_json(env: dict, config: Path, checkpoint: str, *options: str) -> dict:
    """``reflexdb eval -c CONFIG --checkpoint CHECKPOINT --json OPTIONS...``: its result as a dict."""
    out = subprocess.run(CLI + ["eval", "-c", str(config), "--checkpoint", checkpoint, "--json", *options], env=env,
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"eval {checkpoint} {' '.join(options)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sql_rows(env: dict, query: str) -> list[list[float]]:
    """A query's rows as floats (NULL as 0), through ``reflexdb sql`` in the arm's home."""
    out = subprocess.run(CLI + ["sql", "--max-width", "0", " ".join(query.split())],
                         env=env, capture_output=True, text=True, check=True).stdout
    return [[float(c.strip() or 0) for c in line.split("|")] for line in out.strip().splitlines()[2:-1]]


def training(env: dict, run: str) -> dict:
    """What ``reflexdb compare RUN --json`` says of one run (reflexdb/ops/compare.py): ``steps`` (its
    last learner step), ``training_s`` (from policy v0's publication to that step), and its
    held-out pass@1 before and after when evaluated."""
    out = subprocess.run(CLI + ["compare", run, "--json", "--samples", "100"], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)["runs"][0]


def run_summary(stdout: str, what: str) -> dict:
    """The held-out pass@1 before and after that ``reflexdb run`` printed last: ``tasks`` and
    ``samples`` per task, ``before`` and ``after`` (with their labels)."""
    m = RUN_SUMMARY.search(stdout)
    if not m:
        raise SystemExit(f"{what}: no summary in the output:\n{stdout}")
    return {"tasks": int(m.group(1)), "samples": int(m.group(2)), "before_label": m.group(3),
            "before": float(m.group(4)), "after_label": m.group(5), "after": float(m.group(6))}


def run_seeds(res: dict, arms: list[str], run_arm: Callable[[str, int, dict | None], dict], json_out: Path | None,
              *, resume: tuple[str, ...] = ()) -> dict:
    """Each seed's arms in turn (a cut-short experiment still compares like with like), for the
    seeds of ``res`` (from :func:`new_results`). With ``resume``, the ``json_out`` of an earlier
    invocation whose values of those keys match ``res``'s is continued: the arms it holds are
    skipped. ``run_arm(arm, seed, base)`` gets the seed's base-model evaluation once one arm made
    it. The results are written to ``json_out`` after every arm."""
    if resume and json_out and json_out.exists():  # resume an interrupted experiment
        done = json.loads(json_out.read_text())
        if all(done.get(k) == res[k] for k in resume):
            res = done
    for seed in res["seeds"]:
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


def experiment_parser(doc: str, arms: str, *, seeds: str = "0,1", max_steps: int | None = 12,
                      max_seconds: float | None = None) -> argparse.ArgumentParser:
    """The options the experiments begin with: ``--arms`` (default ``arms``), then, when given
    defaults, ``--seeds``, ``--max-steps`` and ``--max-seconds``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default=arms)
    if seeds is not None:
        ap.add_argument("--seeds", default=seeds)
    if max_steps is not None:
        ap.add_argument("--max-steps", type=int, default=max_steps)
    if max_seconds is not None:
        ap.add_argument("--max-seconds", type=float, default=max_seconds)
    return ap


def output_options(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options they end with: ``--json-out``, ``--plot``, ``--report``."""
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--report", type=Path, help="print the table of a results file (and plot it) and exit")
    return ap


def new_results(**fields) -> dict:
    """A results file's start: the date and the machine, ``fields`` in order, no arms yet."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": f"{os.cpu_count()} cores",
            **fields, "arms": []}


def report_or_run(args: argparse.Namespace, run: Callable[[], dict], report: Callable[[dict], str],
                  plot: Callable[[dict, Path], None] | None = None) -> None:
    """An experiment's ``main`` after its options: the results of ``--report`` or of ``run()``,
    their table printed, and, for a script with a ``plot``, the plot drawn to ``--plot`` when asked for."""
    res = json.loads(args.report.read_text()) if args.report else run()
    print(report(res))
    if plot is not None and args.plot:
        plot(res, args.plot)


def md_table(header: list[str], rows: list[list], align: str = "") -> list[str]:
    """A markdown table's lines: ``header``, its rule, then a line a row of cells. ``align`` has a
    letter a column, ``r`` for right-aligned and ``l`` for left (the default for columns past it)."""
    rule = "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l"))
    return [f"| {' | '.join(header)} |", f"|{rule}"] + [f"| {' | '.join(map(str, row))} |" for row in rows]


def pyplot():
    """matplotlib.pyplot, drawing off-screen (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(ncols: int, figsize: tuple[float, float], **kw):
    """A figure of ``ncols`` axes side by side, drawn off-screen: ``(fig, axes)``."""
    return pyplot().subplots(1, ncols, figsize=figsize, **kw)


def seed_curves(ax, res: dict, colors: dict[str, str], curve: str, x: str, y: str, *, div: float = 1) -> None:
    """One line per run of ``res``: its ``curve`` entries' ``x`` against ``y / div``, in its arm's
    color, solid for the first seed and dotted for the others."""
    for r in res["arms"]:
        style = "-" if r["seed"] == res["seeds"][0] else ":"
        s = r[curve]
        ax.plot([c[x] for c in s], [c[y] / div for c in s], style, marker="o", ms=3, color=colors[r["arm"]],
                label=f"{r['arm']} seed {r['seed']}")


def save(fig, path: Path, title: str) -> None:
    """The figure's title (small: it says the setting), then the PNG at ``path``; the figure is closed."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
