"""``reflexdb compare RUN...``: held-out pass@1 of runs and arms with bootstrap intervals, steps
and wall clock, as a table and a PNG, from the database (reflexdb/compare.py)."""

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
    runs: list[str] = typer.Argument(..., help="Run names; the first run's arm is the baseline of Δ."),
    by: str = typer.Option("arm", "--by", help="Group runs into arms by name without its seed suffix (arm) or by algorithm (method)."),
    png: Path = typer.Option(None, "--png", help="Also write the plot here (a PNG)."),
    x: str = typer.Option("step", "--x", help="The plot's training curves against learner step (step) or seconds since policy v0 (seconds)."),
    samples: int = typer.Option(2000, "--samples", min=100, max=1_000_000, help="Bootstrap draws."),
    level: float = typer.Option(0.95, "--level", help="Confidence level of the intervals."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap draws."),
    at_version: int = typer.Option(None, "--at-version", help="Score each run at its last version evaluated at or below N (equal steps; evaluate it first with `reflexdb eval --checkpoint vN`), not at its last."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the tables."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL", help="PostgreSQL URL (default: config.toml, then embedded)."),
) -> None:
    """Compare runs: held-out pass@1 per run (interval over tasks) and per arm (mean over seeds,
    interval over seeds and tasks, Δ against the first arm), steps and training seconds."""
    from reflexdb import Store
    from reflexdb.compare import compare as do_compare
    from reflexdb.compare import plot
    from reflexdb.errors import ReflexdbError

    if x not in ("step", "seconds"):
        raise ReflexdbError(f"--x must be step or seconds, not {x!r}")
    with Store.open(url) as store:
        c = do_compare(store, runs, by=by, samples=samples, seed=seed, level=level, at_version=at_version)
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
        where = "latest" if at_version is None else f"v{at_version}"
        typer.echo(f"\nno held-out evaluation after training{'' if at_version is None else f' at or below v{at_version}'}"
                   f" for: {', '.join(c.missing_eval)} (`reflexdb eval -c CONFIG --checkpoint {where}`)")
    if png is not None:
        typer.echo(f"\nplot: {png}")
