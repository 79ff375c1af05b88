"""Runs side by side: held-out pass@1 with bootstrap confidence intervals, steps and wall clock.

``reflexdb compare RUN...`` (cli/compare.py) reads everything from the database
(``sql/compare.sql``): each run's held-out evaluations (groups of kind ``eval``, one attempt,
eval-split tasks), its learner steps and the publication time of policy v0.

- **A run's pass@1** is the mean over its eval tasks of each task's share of correct samples, at
  the last policy version evaluated ("after") and at version 0 ("before", when evaluated). Its
  interval resamples the tasks (bootstrap, percentile). With ``at_version=N`` (``--at-version``),
  "after" is the last version evaluated **at or below N** instead: runs compared at equal steps
  (evaluate the earlier versions first, ``reflexdb eval --checkpoint vN``, which needs the
  published weights kept: ``learner.keep_policies``). Each run also reports the seconds of
  training behind the version it is scored at (from v0's publication to that version's).
- **An arm** is the runs of one configuration at different seeds: by default the runs whose names
  are equal once a seed suffix (``-s0``, ``_seed2``, ``-3``) is removed; ``by="method"`` groups by
  the run's algorithm instead. An arm's pass@1 is the mean of its runs'; its interval is a
  two-level bootstrap, runs with replacement, then each drawn run's tasks with replacement, so it
  reflects the spread between seeds and between tasks. With one run the interval is the tasks' alone.
- **Δ** of each arm is its pass@1 minus the first arm's (the baseline: name it first), with the
  interval of the difference from the same bootstrap draws (the arms resampled independently).

Steps and wall clock come from ``learner_steps`` and ``policy_versions``: the last step, and the
seconds from policy v0's publication (the learner ready) to the last step.

- **Equal wall clock**: with ``at_seconds=S`` (``--at-seconds``), "after" is the last version
  evaluated whose publication came at most S seconds after v0's, so an arm that makes fewer, slower
  steps is scored at the version it had reached when the other finished.
- **Runs of other databases**: what compare reads of a run is a :class:`RunRecord` (its evaluations
  per version and task, its publication times, its steps). ``save_records`` writes records to a
  JSON file (``--save-runs``) and ``load_records`` reads them back (``--runs-from``), so runs made
  on different machines or in different sessions, each with its own database, can be compared and
  pooled into one arm. A run named on the command line is taken from a file when one holds it,
  else from the database.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import NotFound, ReflexdbError
from ..sqlfile import load_queries

if TYPE_CHECKING:
    from ..store import Store

Q = load_queries("compare.sql")

#: A seed suffix of a run name: ``-s0``, ``_s12``, ``-seed3``, ``.seed-1``, ``-7``.
_SEED_SUFFIX = re.compile(r"[-_.](s|seed)?-?\d+$")


def arm_of(name: str) -> str:
    """The arm of a run name: the name without its seed suffix (``r3l-oracle-s2`` → ``r3l-oracle``)."""
    stripped = _SEED_SUFFIX.sub("", name)
    return stripped or name


#: The ``format`` of a file of run records (``--save-runs`` / ``--runs-from``).
RECORDS_FORMAT = "reflexdb-compare-runs/1"


@dataclass
class RunRecord:
    """All that compare reads of one run, from the database or from a file of records."""

    name: str
    method: str | None
    seed: str | None
    steps: int
    training_s: float | None
    evals: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # version -> (samples, correct) per task
    published: dict[int, float] = field(default_factory=dict)  # version -> seconds after v0's publication
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, seconds, reward/mean)
    source: str = "database"  # or the file it was read from

    def as_dict(self) -> dict[str, Any]:
        def num(v: float) -> float | None:
            return None if v is None or math.isnan(v) else v

        return {"name": self.name, "method": self.method, "seed": self.seed, "steps": self.steps,
                "training_s": self.training_s,
                "evals": {str(v): [list(t) for t in tasks] for v, tasks in sorted(self.evals.items())},
                "published": {str(v): sec for v, sec in sorted(self.published.items())},
                "curve": [[step, num(sec), num(rw)] for step, sec, rw in self.curve]}

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str) -> RunRecord:
        def num(v) -> float:
            return float("nan") if v is None else float(v)

        evals = {int(v): [(int(n), int(c)) for n, c in tasks] for v, tasks in d.get("evals", {}).items()}
        for v, tasks in evals.items():
            if any(n < 1 or not 0 <= c <= n for n, c in tasks):
                raise ValueError(f"run {d.get('name')!r}, v{v}: every task needs samples >= 1 and 0 <= correct <= samples")
        return cls(name=str(d["name"]), method=d.get("method"), seed=None if d.get("seed") is None else str(d["seed"]),
                   steps=int(d.get("steps") or 0),
                   training_s=None if d.get("training_s") is None else float(d["training_s"]), evals=evals,
                   published={int(v): float(sec) for v, sec in d.get("published", {}).items()},
                   curve=[(int(step), num(sec), num(rw)) for step, sec, rw in d.get("curve", [])], source=source)


def save_records(records: Sequence[RunRecord], path: Path) -> None:
    """Write run records as one JSON file (``reflexdb compare RUN... --save-runs FILE``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": RECORDS_FORMAT, "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "runs": [r.as_dict() for r in records]}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def load_records(paths: Sequence[Path]) -> dict[str, RunRecord]:
    """Run records by name from files written by :func:`save_records`; a run in two files, an
    unreadable file or one of another format is refused, naming the file."""
    out: dict[str, RunRecord] = {}
    for path in map(Path, paths):
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise NotFound(f"{path}: no such file of run records") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ReflexdbError(f"{path}: not a file of run records (unreadable JSON: {e})") from None
        if not isinstance(doc, dict) or doc.get("format") != RECORDS_FORMAT:
            raise ReflexdbError(f"{path}: not a file of run records (its format is not {RECORDS_FORMAT!r}; "
                                "write one with `reflexdb compare RUN... --save-runs FILE`)")
        for d in doc.get("runs") or []:
            try:
                r = RunRecord.from_dict(d, source=str(path))
            except (KeyError, TypeError, ValueError) as e:
                raise ReflexdbError(f"{path}: a run record is malformed ({type(e).__name__}: {e})") from None
            if r.name in out:
                raise ReflexdbError(f"run {r.name!r} is in two files of run records: {out[r.name].source} and {path}")
            out[r.name] = r
    return out


def read_records(store: Store, names: Sequence[str]) -> list[RunRecord]:
    """The named runs' records from the database, in the order named (NotFound for a missing one)."""
    with store.transaction() as conn:
        rows = conn.execute(Q["compare_runs"], {"names": list(names)}).fetchall()
        found = {r[1] for r in rows}
        missing = [n for n in names if n not in found]
        if missing:
            raise NotFound("no run named " + ", ".join(repr(n) for n in missing) + "; `reflexdb runs` lists them")
        ids = [r[0] for r in rows]
        evals = conn.execute(Q["compare_evals"], {"ids": ids}).fetchall()
        steps = conn.execute(Q["compare_steps"], {"ids": ids}).fetchall()
        versions = conn.execute(Q["compare_versions"], {"ids": ids}).fetchall()
    records = {rid: RunRecord(name=name, method=method, seed=run_seed, steps=int(n_steps or 0),
                              training_s=None if training_s is None else float(training_s))
               for rid, name, method, run_seed, _cfg, n_steps, training_s in rows}
    for rid, version, _task, n, c in evals:
        records[rid].evals.setdefault(int(version), []).append((int(n), int(c)))
    for rid, version, sec in versions:
        if sec is not None:
            records[rid].published[int(version)] = float(sec)
    for rid, step, secs, reward in steps:
        records[rid].curve.append((int(step), float(secs) if secs is not None else float("nan"),
                                   float(reward) if reward is not None else float("nan")))
    return [records[i] for i in ids]


@dataclass
class RunResult:
    name: str
    method: str
    arm: str
    seed: str | None
    steps: int
    training_s: float | None
    after_version: int | None = None
    after_s: float | None = None  # seconds from policy v0's publication to after_version's
    after: np.ndarray | None = None  # [tasks] share correct per task at the last version evaluated
    before: np.ndarray | None = None  # ... at version 0
    samples: int = 0  # eval samples at the last version
    interval: tuple[float, float] | None = None
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, seconds, reward/mean)

    @property
    def pass_at_1(self) -> float | None:
        return None if self.after is None else float(self.after.mean())

    @property
    def before_pass_at_1(self) -> float | None:
        return None if self.before is None else float(self.before.mean())


@dataclass
class ArmResult:
    arm: str
    method: str
    runs: list[str]
    pass_at_1: float | None
    interval: tuple[float, float] | None
    before: float | None
    delta: float | None = None
    delta_interval: tuple[float, float] | None = None
    steps: float | None = None
    training_s: float | None = None


@dataclass
class Comparison:
    runs: list[RunResult]
    arms: list[ArmResult]
    level: float
    samples: int  # bootstrap draws
    missing_eval: list[str]
    at_version: int | None = None
    at_seconds: float | None = None
    records: list[RunRecord] = field(default_factory=list)  # what was read of each run, in order (``save_records``)
    # per run of ``missing_eval``: the version whose evaluation would score it (the last one published
    # within the bounds), None when no trained version was published within them
    evaluate: dict[str, int | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        def run(r: RunResult) -> dict[str, Any]:
            return {"run": r.name, "method": r.method, "arm": r.arm, "seed": r.seed, "steps": r.steps,
                    "training_s": r.training_s, "after_version": r.after_version, "after_s": r.after_s,
                    "pass_at_1": r.pass_at_1,
                    "interval": r.interval, "before_pass_at_1": r.before_pass_at_1,
                    "tasks": None if r.after is None else len(r.after), "eval_samples": r.samples}

        return {"level": self.level, "bootstrap_samples": self.samples, "at_version": self.at_version,
                "at_seconds": self.at_seconds,
                "runs": [run(r) for r in self.runs],
                "arms": [a.__dict__ for a in self.arms], "missing_eval": self.missing_eval,
                "evaluate": self.evaluate}


def _within(rec: RunRecord, v: int, at_version: int | None, at_seconds: float | None) -> bool:
    """Version ``v`` of ``rec`` is at or below ``at_version`` and was published at most ``at_seconds``
    after v0 (an unset bound holds)."""
    return ((at_version is None or v <= at_version)
            and (at_seconds is None or rec.published.get(v, math.inf) <= at_seconds))


def version_to_evaluate(rec: RunRecord, *, at_version: int | None = None,
                        at_seconds: float | None = None) -> int | None:
    """The version of ``rec`` whose held-out evaluation would score it under the bounds: its last
    trained version published within them (with no bound, its last); None when it published none."""
    return max((v for v in rec.published if v > 0 and _within(rec, v, at_version, at_seconds)), default=None)


def _draw(runs: Sequence[np.ndarray], rng: np.random.Generator) -> float:
    """One two-level bootstrap draw: runs with replacement, then each drawn run's tasks."""
    picks = rng.integers(len(runs), size=len(runs))
    return float(np.mean([runs[p][rng.integers(len(runs[p]), size=len(runs[p]))].mean() for p in picks]))


def _interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def compare(store: Store | None, names: Sequence[str], *, by: str = "arm", samples: int = 2000, seed: int = 0,
            level: float = 0.95, at_version: int | None = None, at_seconds: float | None = None,
            recorded: dict[str, RunRecord] | None = None) -> Comparison:
    """Read the named runs and compute the comparison (see the module docstring). ``at_version``:
    score each run at its last version evaluated at or below it, not at its last; ``at_seconds``:
    at its last version evaluated that was published at most that many seconds after v0.
    ``recorded`` (:func:`load_records`): runs taken from files instead of ``store``; with no
    names, every recorded run, in file order."""
    recorded = recorded or {}
    names = list(names) or list(recorded)
    if not names:
        raise ReflexdbError("name at least one run to compare")
    if len(set(names)) != len(names):
        raise ReflexdbError("a run is named twice: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
    if by not in ("arm", "method"):
        raise ReflexdbError(f"--by must be arm or method, not {by!r}")
    if not 0 < level < 1:
        raise ReflexdbError(f"--level must be between 0 and 1, not {level}")
    if at_version is not None and at_version < 1:
        raise ReflexdbError(f"--at-version must be a trained version (1 or more), not {at_version}")
    if at_seconds is not None and not (at_seconds > 0 and math.isfinite(at_seconds)):
        raise ReflexdbError(f"--at-seconds must be a number of seconds above 0, not {at_seconds}")
    from_db = [n for n in names if n not in recorded]
    if from_db and store is None:
        raise NotFound("no run record named " + ", ".join(repr(n) for n in from_db) + " in the files given")
    in_db = {r.name: r for r in read_records(store, from_db)} if from_db else {}
    records = [recorded[n] if n in recorded else in_db[n] for n in names]
    rng = np.random.default_rng(seed)
    ordered: list[RunResult] = []
    for rec in records:
        method = rec.method or "-"
        r = RunResult(name=rec.name, method=method, arm=arm_of(rec.name) if by == "arm" else method, seed=rec.seed,
                      steps=rec.steps, training_s=rec.training_s, curve=list(rec.curve))
        scored = [v for v in rec.evals if _within(rec, v, at_version, at_seconds)]
        last = max(scored, default=0)
        if last > 0:
            r.after_version = last
            r.after_s = rec.published.get(last)
            r.after = np.array([c / n for n, c in rec.evals[last]])
            r.samples = sum(n for n, _ in rec.evals[last])
            r.interval = _interval(np.array([r.after[rng.integers(len(r.after), size=len(r.after))].mean()
                                             for _ in range(samples)]), level)
        if 0 in rec.evals:
            r.before = np.array([c / n for n, c in rec.evals[0]])
        ordered.append(r)
    arms: dict[str, list[RunResult]] = {}
    for r in ordered:
        arms.setdefault(r.arm, []).append(r)
    draws: dict[str, np.ndarray] = {}
    out: list[ArmResult] = []
    for arm, members in arms.items():
        scored = [m for m in members if m.after is not None]
        befores = [m.before_pass_at_1 for m in members if m.before is not None]
        a = ArmResult(arm=arm, method=", ".join(sorted({m.method for m in members})), runs=[m.name for m in members],
                      pass_at_1=None, interval=None, before=float(np.mean(befores)) if befores else None,
                      steps=float(np.mean([m.steps for m in members])),
                      training_s=(float(np.mean([m.training_s for m in members if m.training_s is not None]))
                                  if any(m.training_s is not None for m in members) else None))
        if scored:
            tasks = [m.after for m in scored]
            d = np.array([_draw(tasks, rng) for _ in range(samples)])
            draws[arm] = d
            a.pass_at_1 = float(np.mean([t.mean() for t in tasks]))
            a.interval = _interval(d, level)
        out.append(a)
    base = out[0]
    if base.arm in draws:
        for a in out[1:]:
            if a.arm in draws:
                a.delta = a.pass_at_1 - base.pass_at_1
                a.delta_interval = _interval(draws[a.arm] - draws[base.arm], level)
    missing = [r.name for r in ordered if r.after is None]
    return Comparison(runs=ordered, arms=out, level=level, samples=samples, missing_eval=missing,
                      at_version=at_version, at_seconds=at_seconds, records=records,
                      evaluate={rec.name: version_to_evaluate(rec, at_version=at_version, at_seconds=at_seconds)
                                for rec in records if rec.name in missing})


def plot(comparison: Comparison, path: Path, *, x: str = "step") -> None:
    """One PNG: held-out pass@1 per arm (mean, interval, each run's dot, before as a grey ring) and
    each run's batch reward per learner step (``x="step"``) or per training second (``"seconds"``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {a.arm: colors[i % len(colors)] for i, a in enumerate(comparison.arms)}
    for i, a in enumerate(comparison.arms):
        runs = [r for r in comparison.runs if r.arm == a.arm]
        for j, r in enumerate(runs):
            dx = (j - (len(runs) - 1) / 2) * 0.08
            if r.pass_at_1 is not None:
                left.plot(i + 0.25 + dx, r.pass_at_1, "o", color=color[a.arm], alpha=0.5, ms=5)
            if r.before_pass_at_1 is not None:
                left.plot(i + 0.25 + dx, r.before_pass_at_1, "o", mfc="none", color="grey", ms=5)
        if a.pass_at_1 is not None:
            lo, hi = a.interval
            left.errorbar(i, a.pass_at_1, yerr=[[a.pass_at_1 - lo], [hi - a.pass_at_1]], fmt="s", color=color[a.arm],
                          capsize=5, ms=8)
    left.set_xticks(range(len(comparison.arms)), [f"{a.arm}\n({len(a.runs)} run{'s' * (len(a.runs) > 1)})"
                                                  for a in comparison.arms], fontsize=8)
    left.set_ylim(-0.02, 1.02)
    left.set_ylabel("held-out pass@1 (last version evaluated" + (
        f", at most v{comparison.at_version})" if comparison.at_version is not None else ")"))
    left.set_title(f"mean and {comparison.level:.0%} bootstrap interval\n(dots: runs; rings: before training)",
                   fontsize=9)
    for r in comparison.runs:
        pts = [(s, sec, rw) for s, sec, rw in r.curve if not np.isnan(rw)]
        if pts:
            xs = [p[0] if x == "step" else p[1] for p in pts]
            right.plot(xs, [p[2] for p in pts], "-", color=color[r.arm], alpha=0.6, lw=1.2,
                       label=r.arm if r is next(q for q in comparison.runs if q.arm == r.arm) else None)
    right.set_xlabel("learner step" if x == "step" else "seconds since policy v0")
    right.set_ylabel("batch mean reward")
    right.set_title("training batches, each run", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["ArmResult", "Comparison", "RunRecord", "RunResult", "arm_of", "compare", "load_records", "plot",
           "read_records", "save_records"]
