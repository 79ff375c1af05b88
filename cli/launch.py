"""``reflexdb run``: evaluate, train with collectors and a learner as separate processes, evaluate.

The children are exactly the commands a user would type by hand::

    reflexdb eval    -c CONFIG --checkpoint base      # held-out pass@1 before (latest when resuming)
    reflexdb collect -c CONFIG --name RUN-collector-0 # one per --collectors
    reflexdb learn   -c CONFIG [--max-steps N] [--max-seconds S]
    reflexdb eval    -c CONFIG --checkpoint latest    # ... and after

(``--set KEY=VALUE`` overrides go to every child.) With ``--gpus`` they are laid out on a node's
GPUs (cli/layout.py): the learner's ranks under torchrun on some, one collector on each of the
others, each child seeing its GPUs through ``CUDA_VISIBLE_DEVICES``; ``--print-layout`` prints
the command lines and starts nothing. They meet only in the database. This process
migrates the schema, keeps the embedded server up while they run, waits for the learner to
finish, then stops the collectors (SIGTERM: each finishes its in-flight group) and prints the
improvement, where to browse the run (the explorer's page of it, and MLflow) and SQL queries to try.

Signals: the children run in their own process group, so a Ctrl-C reaches only this process,
which passes one SIGTERM to each running child: the learner finishes its step and publishes, the
collectors finish their groups. A learner of several ranks gets it in its ranks, not in torchrun
(which would kill them 30 s later, publishing or not); rank 0 decides for all when to stop. A
second Ctrl-C passes a second SIGTERM (stop now; resume still works). If this process dies, the
kernel sends the children SIGTERM (Linux).

Threads: on a small machine the collector and the learner share the cores, and each is idle
while it waits for the other (the collector for a policy, the learner for groups). Unless
``OMP_NUM_THREADS`` is set, the learner gets every core (each of ``k`` ranks ``cores // k``) and
each of ``n`` collectors ``max(1, cores // n)``, and unless ``OMP_WAIT_POLICY`` is set, OpenMP
threads wait ``PASSIVE`` (asleep, not spinning), so a waiting process leaves its cores to the busy
one: the learner trains on all cores while the collector waits (docs/benchmarks.md, "reflexdb
against TRL"). Evaluations, which run alone, get every core.
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

from .children import child_pids, die_with_parent, python_module
from .layout import GPU_OVERRIDES, Child, Layout, LayoutError, parse_gpus, plan

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

    def __init__(self, config: Path, *, max_steps: int | None, max_seconds: float | None, collectors: int | None,
                 overrides: list[str] | None, evaluate: bool, echo: Callable[[str], None],
                 gpus: list[str] | None = None, learner_gpus: int | None = None, gpu_spec: str | None = None):
        self.config, self.overrides = Path(config), list(overrides or [])
        # validated before anything starts, as every child will read it (--gpus: on CUDA)
        self.cfg = load_config(config, parse_overrides(self.overrides + (list(GPU_OVERRIDES) if gpus else [])))
        self.max_steps, self.max_seconds = max_steps, max_seconds
        self.evaluate, self.echo = evaluate, echo
        learn = []
        if max_steps:
            learn += ["--max-steps", str(max_steps)]
        if max_seconds:
            learn += ["--max-seconds", str(max_seconds)]
        self.common = ["-c", str(self.config)] + [f"--set={o}" for o in self.overrides]
        self.layout: Layout = plan(gpus, run=self.cfg.run, cores=os.cpu_count() or 1, learner_gpus=learner_gpus,
                                   collectors=collectors, common=self.common, learn_args=learn, cli=CLI,
                                   spec=gpu_spec)
        self.n_collectors = len(self.layout.collectors)
        self.children: list[subprocess.Popen] = []
        self.learner: subprocess.Popen | None = None
        self.interrupts = 0
        self.url = ""

    def _env(self, child: Child) -> dict[str, str]:
        """What the layout and the thread rules set in a child's environment (the URL aside)."""
        env = dict(child.env)
        if child.threads and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(child.threads)
        if child.threads and "OMP_WAIT_POLICY" not in os.environ:
            env["OMP_WAIT_POLICY"] = "PASSIVE"  # a waiting process sleeps, leaving its cores
        return env

    def _start(self, child: Child, **kw) -> subprocess.Popen:
        """Start a child; its stdout goes to our stderr (libraries print there) unless captured."""
        kw.setdefault("stdout", sys.stderr)
        # the URL travels in the environment, never on a command line: it may hold a password
        env = dict(os.environ, REFLEXDB_DATABASE_URL=self.url, **self._env(child))
        proc = subprocess.Popen(list(child.argv), env=env, start_new_session=True, preexec_fn=die_with_parent, **kw)
        self.children.append(proc)
        return proc

    def describe(self) -> str:
        """The layout as command lines (``reflexdb run --print-layout``); the database URL is left out."""
        lay = self.layout
        learner = f"{lay.ranks} ranks under torchrun" if lay.ranks > 1 else "one process"
        lines = [f"reflexdb run: run {self.cfg.run!r}, the learner ({learner}) {lay.learner.where()}, "
                 f"{len(lay.collectors)} collector{'s' if len(lay.collectors) != 1 else ''}"]
        if self.evaluate:
            ev = lay.evaluation(["--checkpoint", "base", "--json"], CLI, self.common)
            lines += [f"evaluation {ev.where()}, before training (--checkpoint latest when the run has trained "
                      "versions) and after it (latest), alone:", "  " + ev.shell(self._env(ev))]
        lines += [f"learner ({learner}) {lay.learner.where()}:", "  " + lay.learner.shell(self._env(lay.learner))]
        for c in lay.collectors:
            lines += [f"{c.role} {c.where()}:", "  " + c.shell(self._env(c))]
        return "\n".join(lines)

    def _on_signal(self, signum, _frame) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self.echo("stopping: the learner finishes its step and publishes, the collectors finish their groups "
                      "(Ctrl-C again to stop at once)")
        else:
            self.echo("stopping now")
        for p in self.children:
            if p.poll() is not None:
                continue
            # torchrun would pass a SIGTERM on to the ranks and kill them 30 s later, publishing or not:
            # the ranks get it themselves (rank 0 decides for all when to stop), and torchrun exits with them
            ranks = child_pids(p.pid) if p is self.learner and self.layout.ranks > 1 else []
            for pid in ranks:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if not ranks:
                p.send_signal(signal.SIGTERM)

    def _eval(self, checkpoint: str) -> dict | None:
        proc = self._start(self.layout.evaluation(["--checkpoint", checkpoint, "--json"], CLI, self.common),
                           stdout=subprocess.PIPE, text=True)
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
        for c in self.layout.collectors:
            self._start(c)
        self.echo(f"started {self.n_collectors} collector(s) and a learner for run {self.cfg.run!r}; "
                  "Ctrl-C stops them cleanly")
        learner = self.learner = self._start(self.layout.learner)
        code = learner.wait()
        if code != 0 and not self.interrupts:
            self.echo(f"the learner stopped with exit code {code} (its message is above); stopping the collectors. "
                      "Run the same command to resume")
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


def gpus_here(spec: str | None, *, print_only: bool = False) -> list[str] | None:
    """The ``CUDA_VISIBLE_DEVICES`` entries of ``--gpus SPEC`` on this machine (None: no ``--gpus``).

    Checked against ``torch.cuda.device_count()`` where CUDA exists. Without CUDA, ``--gpus`` is
    refused, except for ``--print-layout`` (``print_only``), which lays out the ids as given.

    Raises:
        LayoutError: no CUDA here, or a spec :func:`reflexdb.cli.layout.parse_gpus` refuses.
    """
    if spec is None:
        return None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else None
    if count is None and not print_only:
        raise LayoutError(f"reflexdb run --gpus {spec}: torch sees no CUDA GPU on this machine (torch "
                          f"{torch.__version__}); leave --gpus out to run on the CPU, or add --print-layout to see "
                          "the commands it would start on a machine with GPUs")
    return parse_gpus(spec, visible=os.environ.get("CUDA_VISIBLE_DEVICES"), count=count)


def run(config: Path, *, max_steps: int | None = None, max_seconds: float | None = None,
        collectors: int | None = None, overrides: list[str] | None = None, evaluate: bool = True, echo=print,
        gpus: list[str] | None = None, learner_gpus: int | None = None, gpu_spec: str | None = None) -> RunResult:
    """``reflexdb run``: see the module docstring; ``gpus`` etc.: :func:`reflexdb.cli.layout.plan`."""
    return Launcher(config, max_steps=max_steps, max_seconds=max_seconds, collectors=collectors,
                    overrides=overrides, evaluate=evaluate, echo=echo, gpus=gpus, learner_gpus=learner_gpus,
                    gpu_spec=gpu_spec).run()


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
