"""``reflexdb compare RUN...``: held-out pass@1 of runs and arms with bootstrap intervals, steps
and wall clock, as a table and a PNG, from the database (reflexdb/ops/compare.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from . import screen


def _p(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _ci(iv) -> str:
    return "-" if iv is None else f"[{iv[0]:.3f}, {iv[1]:.3f}]"


def compare(
    runs: list[str] = typer.Argument(None, help="Run names; the first run's arm is the baseline of Δ (default with --runs-from: every run of the files).", show_default=False),
    by: str = typer.Option("arm", "--by", help="Group runs into arms by name without its seed suffix (arm) or by algorithm (method)."),
    png: Path = typer.Option(None, "--png", help="Also write the plot here (a PNG)."),
    x: str = typer.Option("step", "--x", help="The plot's training curves against learner step (step) or seconds since policy v0 (seconds)."),
    samples: int = typer.Option(2000, "--samples", min=100, max=1_000_000, help="Bootstrap draws."),
    level: float = typer.Option(0.95, "--level", help="Confidence level of the intervals."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap draws."),
    at_version: int = typer.Option(None, "--at-version", help="Score each run at its last version evaluated at or below N (equal steps; evaluate it first with `reflexdb eval --checkpoint vN`), not at its last."),
    at_seconds: float = typer.Option(None, "--at-seconds", help="Score each run at its last version evaluated that was published at most S seconds after v0 (equal wall clock), not at its last."),
    save_runs: Path = typer.Option(None, "--save-runs", help="Also write what was read of the runs (evaluations per version and task, publication times, steps) to this JSON file, for --runs-from on another machine or database."),
    runs_from: list[Path] = typer.Option(None, "--runs-from", help="Take runs from a file written by --save-runs (repeatable): a run named there is read from the file, not the database."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the tables."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config.toml, then embedded)."),
) -> None:
    """Compare runs: held-out pass@1 per run (interval over tasks) and per arm (mean over seeds,
    interval over seeds and tasks, Δ against the first arm), steps and training seconds."""
    from reflexdb import Store
    from reflexdb.ops.compare import compare as do_compare
    from reflexdb.ops.compare import load_records, plot, save_records
    from reflexdb.errors import ReflexdbError

    if x not in ("step", "seconds"):
        raise ReflexdbError(f"--x must be step or seconds, not {x!r}")
    runs = list(runs or [])
    recorded = load_records(runs_from or [])
    if not runs and not recorded:
        raise ReflexdbError("name at least one run to compare (or give --runs-from FILE)")
    names = runs or list(recorded)
    kw = dict(by=by, samples=samples, seed=seed, level=level, at_version=at_version, at_seconds=at_seconds,
              recorded=recorded)
    if all(n in recorded for n in names):  # nothing to read from a database: none is opened
        c = do_compare(None, names, **kw)
    else:
        with Store.open(url) as store:
            c = do_compare(store, names, **kw)
    if save_runs is not None:
        save_records(c.records, save_runs)
    if png is not None:
        plot(c, png, x=x)
    if as_json:
        typer.echo(json.dumps(c.as_dict() | ({"png": str(png)} if png else {}), default=float))
        return
    lvl = f"{c.level:.0%} CI"
    typer.echo(screen.format_table(
        ["run", "method", "seed", "steps", "training s", "version", "its s", "pass@1 before", "pass@1 after",
         lvl + " (tasks)"],
        [(r.name, r.method, r.seed or "-", r.steps, "-" if r.training_s is None else f"{r.training_s:.0f}",
          "-" if r.after_version is None else f"v{r.after_version}", "-" if r.after_s is None else f"{r.after_s:.0f}",
          _p(r.before_pass_at_1), _p(r.pass_at_1), _ci(r.interval)) for r in c.runs]))
    typer.echo("")
    typer.echo(screen.format_table(
        ["arm", "method", "runs", "mean steps", "mean training s", "pass@1 before", "pass@1 after",
         lvl + " (seeds, tasks)", "Δ vs " + c.arms[0].arm, lvl + " of Δ"],
        [(a.arm, a.method, len(a.runs), "-" if a.steps is None else f"{a.steps:.1f}",
          "-" if a.training_s is None else f"{a.training_s:.0f}", _p(a.before), _p(a.pass_at_1), _ci(a.interval),
          "-" if a.delta is None else f"{a.delta:+.3f}", _ci(a.delta_interval)) for a in c.arms]))
    if c.missing_eval:
        bound = "" if at_version is None else f" at or below v{at_version}"
        bound += "" if at_seconds is None else f" published by {at_seconds:g} s"
        typer.echo(f"\nno held-out evaluation after training{bound} for: {', '.join(c.missing_eval)}")
        for name in c.missing_eval:
            v = c.evaluate.get(name)
            typer.echo(f"  {name}: no trained version{bound}" if v is None else
                       f"  {name}: reflexdb eval -c CONFIG --set run={name} --checkpoint v{v}")
    if save_runs is not None:
        typer.echo(f"\nrun records: {save_runs}")
    if png is not None:
        typer.echo(f"\nplot: {png}")
