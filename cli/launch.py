"""``reflexdb run``: evaluate, train with collectors and a learner as separate processes, evaluate.

The children are exactly the commands a user would type by hand::

    reflexdb eval    -c CONFIG --checkpoint base      # held-out pass@1 before (latest when resuming)
    reflexdb collect -c CONFIG --name RUN-collector-0 # one per --collectors
    reflexdb learn   -c CONFIG [--max-steps N] [--max-seconds S]
    reflexdb eval    -c CONFIG --checkpoint latest    # ... and after

(``--set KEY=VALUE`` overrides go to every child.) They meet only in the database. This process
migrates the schema, keeps the embedded server up while they run, waits for the learner to
finish, then stops the collectors (SIGTERM: each finishes its in-flight group) and prints the
improvement, where to browse the run (the explorer's page of it, and MLflow) and SQL queries to try.

Signals: the children run in their own process group, so a Ctrl-C reaches only this process,
which passes one SIGTERM to each running child: the learner finishes its step and publishes, the
collectors finish their groups. A second Ctrl-C passes a second SIGTERM (stop now; resume still
works). If this process dies, the kernel sends the children SIGTERM (Linux).

Threads: on a small machine the collector and the learner share the cores, and each is idle
while it waits for the other (the collector for a policy, the learner for groups). Unless
``OMP_NUM_THREADS`` is set, the learner gets every core and each of ``n`` collectors
``max(1, cores // n)``, and unless ``OMP_WAIT_POLICY`` is set, OpenMP threads wait ``PASSIVE``
(asleep, not spinning), so a waiting process leaves its cores to the busy one: the learner trains
on all cores while the collector waits (docs/benchmarks.md, "reflexdb against TRL").
Evaluations, which run alone, get every core.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from sqlalchemy import text

from reflexdb.ops import admin
from reflexdb.config import load_config, parse_overrides
from reflexdb.db import database_url
from reflexdb.settings import resolve_target
from reflexdb.store import Store
from reflexdb.tracking import explorer_url

from .children import die_with_parent, python_module

#: how a child starts: `python -m reflexdb.cli.main`, the working directory kept off its path
#: (a `reflexdb/` folder there would shadow the installed package: cli/children.py)
CLI = python_module("reflexdb.cli.main")


@dataclass
class RunResult:
    """What ``reflexdb run`` did; ``exit_code`` is the process's."""

    exit_code: int
    interrupted: bool = False
    steps: int = 0
    version: int | None = None
    before: dict | None = None  # reflexdb eval --json of the starting checkpoint
    after: dict | None = None
    queries: list[str] = field(default_factory=list)


def _threads(share: int = 1) -> str:
    """OpenMP threads for a child that shares the cores with ``share - 1`` others of its kind."""
    return str(max(1, (os.cpu_count() or 1) // max(1, share)))


def suggested_queries(run: str, run_id: int) -> list[str]:
    """Three SQL queries to try after a run (the quickstart prints them; a test runs them)."""
    return [
        "SELECT policy_version, count(*) AS groups, round(avg(pass_rate)::numeric, 3) AS pass_rate "
        f"FROM group_stats WHERE run_id = {run_id} AND kind <> 'eval' GROUP BY 1 ORDER BY 1",
        "SELECT prompt, extracted_answer, ground_truth, round(confidence::numeric, 3) AS confidence "
        f"FROM failures WHERE run = '{run.replace(chr(39), chr(39) * 2)}' AND split = 'train' "
        "ORDER BY confidence DESC LIMIT 5",
        "SELECT step, policy_version, round((metrics->>'reward/pass_at_1')::numeric, 3) AS pass_at_1, "
        "round((metrics->>'staleness/mean')::numeric, 2) AS staleness "
        f"FROM learner_steps WHERE run_id = {run_id} ORDER BY step",
    ]


class Launcher:
    """One ``reflexdb run``: its children, its signal handling and its summary."""

    def __init__(self, config: Path, *, max_steps: int | None, max_seconds: float | None, collectors: int,
                 overrides: list[str] | None, evaluate: bool, echo: Callable[[str], None]):
        self.config, self.overrides = Path(config), list(overrides or [])
        self.cfg = load_config(config, parse_overrides(self.overrides))  # validated before anything starts
        self.max_steps, self.max_seconds = max_steps, max_seconds
        self.n_collectors, self.evaluate, self.echo = collectors, evaluate, echo
        self.children: list[subprocess.Popen] = []
        self.interrupts = 0

    def _env(self, threads: str | None) -> dict[str, str]:
        env = dict(os.environ, REFLEXDB_DATABASE_URL=self.url)  # not on a command line: it may hold a password
        if threads and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = threads
        if threads:
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a waiting process sleeps, leaving its cores
        return env

    def _start(self, args: list[str], threads: str | None, **kw) -> subprocess.Popen:
        """Start a child; its stdout goes to our stderr (libraries print there) unless captured."""
        kw.setdefault("stdout", sys.stderr)
        cmd = CLI + args + ["-c", str(self.config)] + [f"--set={o}" for o in self.overrides]
        proc = subprocess.Popen(cmd, env=self._env(threads), start_new_session=True, preexec_fn=die_with_parent,
                                **kw)
        self.children.append(proc)
        return proc

    def _on_signal(self, signum, _frame) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self.echo("stopping: the learner finishes its step and publishes, the collectors finish their groups "
                      "(Ctrl-C again to stop at once)")
        else:
            self.echo("stopping now")
        for p in self.children:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def _eval(self, checkpoint: str) -> dict | None:
        proc = self._start(["eval", "--checkpoint", checkpoint, "--json"], None, stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate()
        if proc.returncode != 0 or self.interrupts:
            if not self.interrupts:
                self.echo(f"evaluation of {checkpoint} failed (exit {proc.returncode}); see the messages above")
            return None
        return json.loads(out.strip().splitlines()[-1])

    def run(self) -> RunResult:
        # REFLEXDB_DATABASE_URL wins over the config's database_url, as in collect / learn / eval.
        self.url = database_url(resolve_target(os.environ.get("REFLEXDB_DATABASE_URL") or self.cfg.database_url))
        admin.upgrade(self.url)
        store = Store.open(self.url)  # also keeps the embedded server alive for the children
        old = signal.signal(signal.SIGINT, self._on_signal), signal.signal(signal.SIGTERM, self._on_signal)
        result = RunResult(exit_code=0)
        try:
            run_id = store.create_run(self.cfg.run, algorithm=self.cfg.algorithm, config=self.cfg.masked())
            latest = store.latest_policy(run_id)
            if self.evaluate:
                start = "latest" if latest is not None and latest.version > 0 else "base"
                self.echo(f"evaluating the {start} model on the held-out tasks first")
                result.before = self._eval(start)
            if not self.interrupts:
                result.exit_code = self._train()
            if self.evaluate and not self.interrupts and result.exit_code == 0:
                self.echo("evaluating the trained model on the held-out tasks")
                result.after = self._eval("latest")
        finally:
            signal.signal(signal.SIGINT, old[0])
            signal.signal(signal.SIGTERM, old[1])
        with store.engine.connect() as conn:
            result.steps, result.version = conn.execute(text(
                "SELECT coalesce((SELECT max(step) FROM learner_steps WHERE run_id = :r), 0), "
                "(SELECT max(version) FROM policy_versions WHERE run_id = :r)"), {"r": run_id}).one()
        store.close()
        result.interrupted = self.interrupts > 0
        result.queries = suggested_queries(self.cfg.run, run_id)
        if result.interrupted:
            result.exit_code = 130
        return result

    def _train(self) -> int:
        for i in range(self.n_collectors):
            self._start(["collect", "--name", f"{self.cfg.run}-collector-{i}"], _threads(self.n_collectors))
        learn = ["learn"]
        if self.max_steps:
            learn += ["--max-steps", str(self.max_steps)]
        if self.max_seconds:
            learn += ["--max-seconds", str(self.max_seconds)]
        self.echo(f"started {self.n_collectors} collector(s) and a learner for run {self.cfg.run!r}; "
                  "Ctrl-C stops them cleanly")
        learner = self._start(learn, _threads())
        code = learner.wait()
        collectors = [p for p in self.children if p is not learner and p.poll() is None]
        for p in collectors:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 300
        for p in collectors:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        return code


def run(config: Path, *, max_steps: int | None = None, max_seconds: float | None = None, collectors: int = 1,
        overrides: list[str] | None = None, evaluate: bool = True, echo=print) -> RunResult:
    """``reflexdb run``: see the module docstring."""
    return Launcher(config, max_steps=max_steps, max_seconds=max_seconds, collectors=collectors,
                    overrides=overrides, evaluate=evaluate, echo=echo).run()


def summary(cfg_run: str, r: RunResult) -> str:
    """The lines ``reflexdb run`` ends with."""
    lines = [f"run {cfg_run!r}: {r.steps} learner steps, policy v{r.version}"]
    if r.before and r.after:
        delta = 100 * (r.after["pass_at_1"] - r.before["pass_at_1"])
        lines.append(f"held-out pass@1 ({r.after['tasks']} {r.after['split']} tasks x {r.after['samples_per_task']} "
                     f"samples): {r.before['label']} {r.before['pass_at_1']:.3f} -> {r.after['label']} "
                     f"{r.after['pass_at_1']:.3f} ({delta:+.1f} points)")
    elif r.before:
        lines.append(f"held-out pass@1 of {r.before['label']}: {r.before['pass_at_1']:.3f}")
    if r.interrupted:
        lines.append(f"interrupted at step {r.steps} (policy v{r.version} published): run the same command to "
                     "resume; nothing trained is lost")
    lines.append("")
    lines.append(f"browse its steps, groups and trajectories:  reflexdb ui   (then open "
                 f"{explorer_url()}/runs/{quote(cfg_run, safe='')})")
    lines.append("follow the run in MLflow:  reflexdb ui   (then open http://127.0.0.1:5000)")
    lines.append("three SQL queries to try:")
    lines += [f'  reflexdb sql "{q}"' for q in r.queries]
    return "\n".join(lines)
