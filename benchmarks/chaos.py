"""Failure drill: kill collectors and the learner at chosen moments, stop the database, then check
with SQL and the files that nothing committed was lost, nothing trained twice, nothing skipped,
and every process picked up where it was.

    python benchmarks/chaos.py --minutes 10            # the documented drill (docs/reliability.md)
    python benchmarks/chaos.py --short                 # about 2-3 minutes: CI runs this
    python benchmarks/chaos.py --minutes 10 --seed 3 --collectors 3 --json out.json
    python benchmarks/chaos.py --short --storage s3    # weights through a local S3 server, and its outages
    python benchmarks/chaos.py --short --method sevenths   # a method that never trains every seventh group

What it does, on the tiny model in a private ``REFLEXDB_HOME`` with its own embedded PostgreSQL
(or ``--url`` and your server; outages then need ``--db-stop-cmd``/``--db-start-cmd``):

1. starts N ``reflexdb collect`` processes and one ``reflexdb learn``, exactly as a user would;
2. until the time is up, every few seconds takes one action, each kind at least once:
   SIGKILL a collector mid-generation or mid-write (inside its transaction); SIGSTOP a collector
   mid-write for seconds, then SIGCONT (its group commits after newer ones); SIGKILL the learner
   mid-step, mid-record, mid-publish, or while it holds torch's extension build lock at start-up;
   SIGTERM either (they finish what they hold and exit 0); and, once or more, stops the database
   for 8-20 s and starts it again. Killed processes are restarted after 1-4 s. To kill "mid-X",
   the drill watches the phase the process announces (``reflexdb.drill``), stops it (SIGSTOP),
   reads the phase again and kills only if it is still X: the figures count what was hit;
3. stops the collectors (SIGTERM), lets the learner train what is eligible, stops it (SIGTERM);
4. checks (each failed check is a violation): no partial group; every group a collector journaled
   as committed is in the database (and it wrote no group twice); no trajectory consumed beyond
   ``max_reuse``, and ``times_sampled`` equals its consumption rows; learner steps and policy
   versions contiguous; every version's weights present with the recorded sha256 (or pruned by
   ``keep_policies``) and the newest learner states present; staleness of every consumed group
   ``<= max_staleness``; every step consumed whole groups; no claim stuck past its TTL; no group
   left untrained without a reason (view ``untrained_groups``: none ``passed_over``; what is left
   ``waiting`` is less than a batch); no temporary checkpoint directory or torch build lock left;
   no process exited on its own with an error, or ignored SIGTERM.

``--storage s3`` publishes through ``learner.checkpoint_url: s3://...`` on a local S3 server
(moto's, benchmarks/s3server.py) and adds two actions: a storage outage (the server stopped with
SIGSTOP for 30-40 s right after a version is recorded, then SIGCONT: uploads and fetches hang, time
out and are retried) and a learner killed mid-upload. Checked besides: every version the collectors loaded came from s3:// and was
verified against its row (its manifest's recorded sha256); each version kept is in storage, whole,
with the recorded sha256 and manifest_sha256 (a fresh fetch checks both), and the pruned ones are
gone from it.

It prints a table of figures (kills by phase, stalls, restarts, outage seconds, groups, steps,
violations) and exits 1 if any check failed, keeping the home directory for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "reflexdb.cli.main"]

#: The run the drill trains: the tiny model on built-in arithmetic, small and fast, publishing
#: every other step (so a SIGTERM often has unpublished steps to publish), claims expiring soon.
RUN_CONFIG = {
    "run": "chaos",
    "model": "tiny",
    "max_staleness": 1,
    "seed": 0,
    "tasks": {"source": "arithmetic", "level": 1, "train_size": 40, "eval_size": 0},
    "collector": {"group_size": 4, "tasks_per_batch": 2, "sampling": {"max_new_tokens": 12},
                  "claim_ttl_s": 20, "progress_every_s": 5, "poll_interval_s": 0.5, "db_retry_s": 120},
    "learner": {"groups_per_step": 2, "micro_batch_size": 8, "lr": 1e-4, "publish_every": 2,
                "keep_states": 2, "keep_policies": 3, "poll_interval_s": 0.5, "wait_log_every_s": 20,
                "db_retry_s": 120},
}

#: Actions, each taken at least once (in this order) before the rest are drawn at random.
ACTIONS = ("stall-collector-write", "kill-collector-write", "kill-learner-step", "kill-collector-generate",
           "kill-learner-publish", "term-collector", "kill-learner-buildlock", "kill-learner-record",
           "term-learner")

#: ``--storage s3``: versions go through a local S3 server; timeouts short enough that a stopped
#: server fails a call within seconds (the learner retries its upload for upload_retry_s,
#: collectors their fetch; reflexdb/storage.py caps s3fs's own nested tries, S3_TRIES).
S3_LEARNER = {"upload_retry_s": 300,
              "checkpoint_storage_options": {"config_kwargs": {"connect_timeout": 1, "read_timeout": 2,
                                                               "retries": {"max_attempts": 1}}}}
S3_BUCKET = "chaos-checkpoints"
S3_ACTIONS = ("storage-outage", "kill-learner-upload")

#: ``--method lte``: the same run under LTE (hints from the model's own mistakes). The tiny model
#: solves nothing, so every group is none-pass and held for a hint stage; collectors are also
#: killed inside a stage (phase ``hint``), leaving stages that only their timeout ends. The
#: view ``untrained_groups`` must then call a group whose stage outlived its staleness bound
#: ``held_past_staleness``, never ``passed_over`` (issue 37, item 6; docs/reliability.md).
LTE_CONFIG = {"algorithm": "lte", "lte": {"hint_timeout_s": 15}}
LTE_ACTIONS = ("kill-collector-hint",)

#: ``--method sevenths``: the same run under a method whose batch rule never trains every seventh
#: group and declares it (``Method.drops``; the test plug-in tests/data/plugins/sevenths, installed
#: for the drill's processes as pip installs a package). Admission control must count only the
#: groups a step can take: collectors and the learner never wait on each other, and
#: ``untrained_groups`` calls a dropped group ``seventh``, never ``passed_over`` (issue 60).
SEVENTHS_PLUGIN = REPO / "tests" / "data" / "plugins" / "sevenths"
SEVENTHS_CONFIG = {"algorithm": "sevenths"}

SIGNAL_NAMES = {signal.SIGKILL: "SIGKILL", signal.SIGTERM: "SIGTERM", signal.SIGSTOP: "SIGSTOP"}


@dataclass
class Proc:
    """One reflexdb process the drill runs (restarted under the same name after each death)."""

    role: str  # collector | learner
    name: str
    args: list[str]
    popen: subprocess.Popen | None = None
    incarnations: int = 0
    signalled: int | None = None  # the signal the drill sent this incarnation (None: none yet)
    died_at: float | None = None
    pids: list[int] = field(default_factory=list)
    phase_seen: tuple[int, str] | None = None
    phase_since: float | None = None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Drill:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.seed)
        self.home = Path(args.home or tempfile.mkdtemp(prefix="reflexdb-chaos-")).resolve()
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.drill_dir = self.home / "drill"
        self.logs = self.home / "logs"
        for d in (self.drill_dir, self.logs):
            d.mkdir(exist_ok=True)
        self.kills: Counter = Counter()  # (role, signal, phase) -> count
        self.stalls: list[float] = []
        self.outages: list[float] = []
        self.restarts = 0
        self.problems: list[str] = []  # process-level violations found while running
        self.actions_done: Counter = Counter()
        self.procs: list[Proc] = []
        self.db_down = False
        self.running = False
        self.s3 = None  # --storage s3: the S3 server (benchmarks/s3server.py)
        self.storage_outages: list[float] = []

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        os.environ["REFLEXDB_HOME"] = str(self.home)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from reflexdb import embedded
        from reflexdb.models import resolve_model
        from reflexdb.db import database_url
        from reflexdb.settings import resolve_target

        if self.args.url:
            self.url = self.args.url
            self.pgdata = None
        else:
            self.pgdata = self.home / "pgdata"
            self.url = embedded.server_uri(self.pgdata)  # this process keeps it up throughout
        self.url = database_url(resolve_target(self.url))
        from reflexdb.ops import admin
        from reflexdb.store import Store

        plugin_path = self._install_sevenths() if self.args.method == "sevenths" else None
        admin.upgrade(self.url)  # with --method sevenths: the plug-in's branch too
        self.store = Store.open(self.url)
        cfg = json.loads(json.dumps(RUN_CONFIG))
        cfg["run"] = self.args.run
        if self.args.method == "lte":
            cfg.update(json.loads(json.dumps(LTE_CONFIG)))
        if self.args.method == "sevenths":
            cfg.update(json.loads(json.dumps(SEVENTHS_CONFIG)))
        s3_env = {}
        if self.args.storage == "s3":
            from s3server import S3Server

            self.s3 = S3Server(self.logs / "s3-server.log")
            self.s3.make_bucket(S3_BUCKET)
            s3_env = self.s3.env()
            os.environ.update(s3_env)  # the checks fetch from it too
            cfg["learner"].update(json.loads(json.dumps(S3_LEARNER)), checkpoint_url=f"s3://{S3_BUCKET}/{cfg['run']}/",
                                  shared_memory_publish="off")  # its collectors play remote ones: no copy in /dev/shm
        self.config = self.home / "chaos.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.cfg = cfg
        resolve_model("tiny")  # made once here, not by several processes at once
        self.extensions = self._extensions_dir()
        env = dict(os.environ, REFLEXDB_DATABASE_URL=self.url, REFLEXDB_DRILL_DIR=str(self.drill_dir),
                   TORCH_EXTENSIONS_DIR=str(self.extensions), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **s3_env)
        if plugin_path:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (plugin_path, env.get("PYTHONPATH"))))
        for key in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MLFLOW_TRACKING_URI"):
            env.pop(key, None)
        self.env = env
        for i in range(self.args.collectors):
            name = f"{self.args.run}-collector-{i}"
            self.procs.append(Proc("collector", name, ["collect", "--name", name]))
        self.procs.append(Proc("learner", f"{self.args.run}-learner", ["learn"]))

    def _install_sevenths(self) -> str:
        """Install the sevenths test plug-in as pip would (its dist-info with the entry point, its
        source on the path), for this process (its branch is migrated here) and the children.
        Returns their PYTHONPATH entries."""
        site = self.home / "site"
        info = site / "reflexdb_sevenths-0.1.0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reflexdb-sevenths\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text("[reflexdb.plugins]\nsevenths = reflexdb_sevenths:plugin\n")
        paths = [str(site), str(SEVENTHS_PLUGIN / "src")]
        sys.path[:0] = paths  # before the first registry read loads the plug-ins
        return os.pathsep.join(paths)

    def _extensions_dir(self) -> Path:
        """A private TORCH_EXTENSIONS_DIR (the drill plants nothing in yours), seeded with this
        machine's build of DeepSpeed's op when there is one."""
        from reflexdb.trainer.buildlock import extensions_root

        ext = self.home / "torch_extensions"
        built = extensions_root() / "deepspeed_shm_comm"
        if not ext.exists() and (built / "deepspeed_shm_comm.so").exists():
            shutil.copytree(built, ext / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock"))
        ext.mkdir(exist_ok=True)
        return ext

    @property
    def learner(self) -> Proc:
        return next(p for p in self.procs if p.role == "learner")

    def collectors(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "collector"]

    # ------------------------------------------------------------------ processes

    def spawn(self, p: Proc, hold: str | None = None) -> None:
        """Start ``p``; with ``hold``, it stops itself (SIGSTOP) as it enters that phase
        (``REFLEXDB_DRILL_HOLD``): a phase too short to hit from outside (a hint stage of the tiny
        model) is then killed exactly there."""
        log = open(self.logs / f"{p.name}.log", "a")
        log.write(f"\n===== incarnation {p.incarnations + 1} at {time.strftime('%H:%M:%S')}"
                  f"{f' (held at {hold})' if hold else ''} =====\n")
        log.flush()
        env = dict(self.env, REFLEXDB_DRILL_HOLD=hold) if hold else self.env
        p.popen = subprocess.Popen(CLI + p.args + ["-c", str(self.config)], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        p.incarnations += 1
        p.signalled = None
        p.died_at = None
        p.pids.append(p.popen.pid)

    def phase(self, p: Proc) -> str | None:
        from reflexdb.drill import read_phase

        return read_phase(str(self.drill_dir), p.popen.pid) if p.popen else None

    #: Phases a healthy process leaves within this many seconds (waiting for groups or for a policy
    #: can last; starting, generating, writing, training and publishing cannot).
    STUCK_AFTER_S = 180.0
    BUSY_PHASES = ("start", "generate", "write", "step", "record", "publish", "reload", "claim")

    def watch_stuck(self) -> None:
        """A process that sits in a busy phase for minutes is hung (say, on a lock a dead process holds)."""
        now = time.monotonic()
        for p in self.procs:
            if not p.alive() or self.db_down:
                p.phase_since = None
                continue
            ph = self.phase(p) or "start"
            if ph == "start" and (self.extensions / "deepspeed_shm_comm" / "lock").exists():
                # building DeepSpeed's op (minutes on a loaded machine) is progress, not a hang; a lock a
                # dead process left is removed by the next learner (trainer/buildlock.py)
                p.phase_seen, p.phase_since = (p.popen.pid, ph), now
            elif p.phase_since is None or p.phase_seen != (p.popen.pid, ph):
                p.phase_seen, p.phase_since = (p.popen.pid, ph), now
            elif ph in self.BUSY_PHASES and now - p.phase_since > self.STUCK_AFTER_S:
                self.problems.append(f"{p.name} (pid {p.popen.pid}) was stuck in phase {ph!r} for "
                                     f"{now - p.phase_since:.0f} s; killed")
                self.signal(p, signal.SIGKILL, f"stuck-{ph}")
                p.phase_since = None

    def reap(self) -> None:
        """Notice deaths; an exit the drill did not cause, or a SIGTERM that did not end in exit 0,
        is a violation. Restart the dead after 1-4 s (not while the database is down)."""
        now = time.monotonic()
        for p in self.procs:
            if p.popen is None:
                continue
            code = p.popen.poll()
            if code is None:
                continue
            if p.died_at is None:
                p.died_at = now + self.rng.uniform(1, 4)
                if p.signalled is None:
                    self.problems.append(f"{p.name} (pid {p.popen.pid}) exited on its own with code {code}; "
                                         f"see {self.logs / (p.name + '.log')}")
                elif p.signalled == signal.SIGTERM and code != 0:
                    self.problems.append(f"{p.name} (pid {p.popen.pid}) exited with code {code} after SIGTERM")
            if self.running and not self.db_down and now >= p.died_at:
                self.spawn(p)
                self.restarts += 1

    def signal(self, p: Proc, sig: int, phase: str | None) -> None:
        p.signalled = sig
        self.kills[(p.role, SIGNAL_NAMES[sig], phase or "?")] += 1
        try:
            os.kill(p.popen.pid, sig)
            if sig != signal.SIGKILL:
                os.kill(p.popen.pid, signal.SIGCONT)  # if it was stopped to read its phase
        except ProcessLookupError:
            pass

    def at_phase(self, p: Proc, phases: set[str], timeout: float = 90.0) -> str | None:
        """Stop ``p`` (SIGSTOP) when it announces one of ``phases``; return that phase with ``p``
        stopped, or None (``p`` running) if it did not get there in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and p.alive():
            if self.phase(p) in phases:
                os.kill(p.popen.pid, signal.SIGSTOP)
                now = self.phase(p)  # stopped: this is where it is
                if now in phases and p.alive():
                    return now
                os.kill(p.popen.pid, signal.SIGCONT)
            time.sleep(0.002)
        return None

    #: phases of the loops, entered once the signal handlers are installed (the learner's first
    #: publish, of version 0, comes before them)
    LOOP_PHASES = ("wait", "step", "record", "claim", "generate", "write", "admission")

    def wait_started(self, p: Proc, timeout: float = 600.0) -> bool:
        """Wait until ``p`` is alive and in its loop (past start-up: a SIGTERM finds its handlers)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.reap()
            self.watch_stuck()
            if p.alive() and self.phase(p) in self.LOOP_PHASES:
                return True
            time.sleep(0.2)
        return False

    def wait_alive(self, p: Proc, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while not p.alive() and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)
        return p.alive()

    # ------------------------------------------------------------------ actions

    def act(self, action: str) -> bool:
        """Take ``action``; False if its target never reached the phase (nothing was done)."""
        if action == "storage-outage":
            # Right after a version is recorded: collectors fetch it, and the learner's next upload
            # comes within the outage. Longer than s3fs's own 5 tries of a call (12-20 s with
            # these timeouts), so that reflexdb's retries are what ride it out.
            self.wait_started(self.learner)
            held = self.at_phase(self.learner, {"published"}, timeout=120) is not None
            self.storage_outage(self.rng.uniform(30, 40), then_continue=self.learner if held else None)
            self.actions_done[action] += 1
            return True
        what, role, where = (action.split("-", 2) + [""])[:3]
        candidates = [p for p in self.procs if p.role == role]
        p = self.rng.choice(candidates)
        if not self.wait_alive(p):
            return False
        if what == "stall":
            if self.at_phase(p, {"write"}) is None:
                return False
            seconds = self.rng.uniform(2, 5)
            time.sleep(seconds)  # its transaction stays open; other collectors commit newer groups
            os.kill(p.popen.pid, signal.SIGCONT)
            self.stalls.append(seconds)
        elif where == "buildlock":
            if not self._kill_at_build_lock(p):
                return False
        elif where in ("hint", "upload"):  # phases too short to hit from outside
            self.wait_started(p)  # its SIGTERM must find the handlers installed
            if not self._kill_held(p, where):
                return False
        elif what == "term":
            phase = self.at_phase(p, {"generate", "write", "step", "wait", "claim", "record", "publish"}, timeout=30)
            self.signal(p, signal.SIGTERM, phase or self.phase(p))  # SIGTERM, then SIGCONT
            try:
                p.popen.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self.problems.append(f"{p.name} (pid {p.popen.pid}) ignored SIGTERM for 180 s")
                p.popen.kill()
        else:
            phase = self.at_phase(p, {where})
            self.signal(p, signal.SIGKILL, phase or self.phase(p))
        self.actions_done[action] += 1
        return True

    def _kill_held(self, p: Proc, phase: str, timeout: float = 90.0) -> bool:
        """Restart ``p`` held at ``phase`` (SIGTERM first: it releases what it holds and exits 0),
        wait until it has stopped itself there, and SIGKILL it: its claims stay until they expire."""
        self.signal(p, signal.SIGTERM, self.phase(p))
        try:
            p.popen.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.problems.append(f"{p.name} (pid {p.popen.pid}) ignored SIGTERM for 180 s")
            p.popen.kill()
        if p.popen.returncode not in (0, -signal.SIGKILL):
            self.problems.append(f"{p.name} (pid {p.popen.pid}) exited with code {p.popen.returncode} after SIGTERM")
        self.spawn(p, hold=phase)
        self.restarts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and p.alive():
            try:
                state = Path(f"/proc/{p.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                break
            if state == "T" and self.phase(p) == phase:
                self.signal(p, signal.SIGKILL, phase)
                return True
            self.reap()
            time.sleep(0.05)
        # it never got there: SIGTERM (and SIGCONT); the restart after it holds nowhere
        if p.alive():
            self.signal(p, signal.SIGTERM, self.phase(p))
        return False

    def _kill_at_build_lock(self, p: Proc) -> bool:
        """Kill the learner while torch holds its extension build lock (start-up; under a second)."""
        lock = self.extensions / "deepspeed_shm_comm" / "lock"
        self.signal(p, signal.SIGKILL, self.phase(p))
        p.popen.wait()
        p.died_at = time.monotonic()
        self.spawn(p)
        self.restarts += 1
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.alive():
            if lock.exists():
                os.kill(p.popen.pid, signal.SIGSTOP)
                if lock.exists():
                    self.signal(p, signal.SIGKILL, "buildlock")
                    return True
                os.kill(p.popen.pid, signal.SIGCONT)
            time.sleep(0.001)
        return False

    def outage(self, seconds: float) -> None:
        from reflexdb import embedded

        self.db_down = True
        t0 = time.monotonic()
        if self.pgdata is not None:
            embedded.stop(self.pgdata, forget_users=False)
        else:
            subprocess.run(self.args.db_stop_cmd, shell=True, check=True)
        while time.monotonic() - t0 < seconds:
            self.reap()
            time.sleep(0.2)
        if self.pgdata is not None:
            embedded.start(self.pgdata)
        else:
            subprocess.run(self.args.db_start_cmd, shell=True, check=True)
        self.outages.append(time.monotonic() - t0)
        self.db_down = False

    def storage_outage(self, seconds: float, then_continue: Proc | None = None) -> None:
        """The S3 server stops answering for ``seconds`` (SIGSTOP: connections hang), then goes on
        with its objects (SIGCONT). The processes keep running: uploads and fetches are retried.
        ``then_continue``: a process stopped at its phase, let go once the storage is down."""
        self.say(f"  storage stopped for {seconds:.0f} s")
        t0 = time.monotonic()
        self.s3.pause()
        if then_continue is not None and then_continue.alive():
            os.kill(then_continue.popen.pid, signal.SIGCONT)
        try:
            while time.monotonic() - t0 < seconds:
                self.reap()
                time.sleep(0.2)
        finally:
            self.s3.resume()
        self.storage_outages.append(time.monotonic() - t0)

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        self.running = True
        for p in self.procs:
            self.spawn(p)
        t0 = time.monotonic()
        end = t0 + self.args.minutes * 60
        can_outage = self.pgdata is not None or (self.args.db_stop_cmd and self.args.db_start_cmd)
        n_out = self.args.outages if can_outage else 0
        outage_at = sorted(t0 + (i + 1) * (end - t0) / (n_out + 1) for i in range(n_out))
        actions = ACTIONS + (LTE_ACTIONS if self.args.method == "lte" else ()) + \
            (S3_ACTIONS if self.args.storage == "s3" else ())
        if self.args.actions:
            actions = tuple(a for a in actions if a in self.args.actions)
        queue = list(actions)
        tries: Counter = Counter()
        self.say(f"drill: {self.args.collectors} collectors and a learner for {self.args.minutes:g} min "
                 f"(home {self.home})")
        while time.monotonic() < end or queue or outage_at:  # every kind of action at least once
            self.reap()
            self.watch_stuck()
            if outage_at and time.monotonic() >= outage_at[0]:
                outage_at.pop(0)
                seconds = self.rng.uniform(*self.args.outage_seconds)
                self.say(f"  database stopped for {seconds:.0f} s")
                self.outage(seconds)
                continue
            action = queue.pop(0) if queue else self.rng.choice(actions)
            self.say(f"  {time.monotonic() - t0:6.0f}s {action}")
            if not self.act(action) and tries[action] < 3:  # its phase never came: try it again later
                tries[action] += 1
                queue.append(action)
            pause = time.monotonic() + self.rng.uniform(*self.args.gap)
            while time.monotonic() < min(pause, max(end, time.monotonic() + 1)):
                self.reap()
                self.watch_stuck()
                time.sleep(0.1)
        if self.s3 is not None:  # a short drill on a slow machine: go on until collectors loaded from storage
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not self._loaded_from_storage():
                self.reap()
                self.watch_stuck()
                time.sleep(0.5)
        self.running = False
        self.finish()

    def _loaded_from_storage(self) -> bool:
        return any("loaded policy v" in p.read_text(errors="replace")
                   for p in self.logs.glob("*collector*.log"))

    def finish(self) -> None:
        """Stop the collectors, let the learner train what is eligible, stop it."""
        for p in self.procs:
            if p.popen is not None and p.popen.poll() is None:
                os.kill(p.popen.pid, signal.SIGCONT)
        self.reap()
        for p in self.collectors():
            if p.alive():
                p.signalled = signal.SIGTERM
                p.popen.send_signal(signal.SIGTERM)
        for p in self.collectors():
            self._wait_exit(p)
        lr = self.learner
        if not lr.alive():
            self.spawn(lr)
        B = self.cfg["learner"]["groups_per_step"]
        deadline = time.monotonic() + 240
        run_id = self.store.run_id(self.args.run)
        # groups its method never trains are eligible by the core view's rules, but no step takes them
        dropped = " AND group_id NOT IN (SELECT group_id FROM sevenths_group_holds)" \
            if self.args.method == "sevenths" else ""
        while time.monotonic() < deadline and lr.alive():  # it trains while a batch is eligible
            self.watch_stuck()
            [(waiting,)] = self.sql("SELECT count(*) FROM learner_eligible WHERE run_id = :r AND eligible" + dropped,
                                    r=run_id)
            if waiting < B and self.phase(lr) == "wait":
                break
            time.sleep(1)
        lr.signalled = signal.SIGTERM
        if lr.alive():
            lr.popen.send_signal(signal.SIGTERM)
        self._wait_exit(lr)
        self.reap()

    def _wait_exit(self, p: Proc) -> None:
        if p.popen is None:
            return
        try:
            code = p.popen.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.problems.append(f"{p.name} (pid {p.popen.pid}) did not stop within 180 s of SIGTERM")
            p.popen.kill()
            return
        if code not in (0, -signal.SIGKILL) and p.signalled == signal.SIGTERM:
            self.problems.append(f"{p.name} exited with code {code} after SIGTERM; see {self.logs / (p.name + '.log')}")
        p.died_at = time.monotonic()

    # ------------------------------------------------------------------ checks

    def sql(self, query: str, **params) -> list[tuple]:
        from sqlalchemy import text

        with self.store.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(query), params)]

    def check(self) -> dict[str, list[str]]:
        """Every invariant of docs/reliability.md; each maps to the violations found (empty: held)."""
        from reflexdb.trainer.engine import weights_sha256

        run = self.store.run_id(self.args.run)
        c, L = self.cfg["collector"], self.cfg["learner"]
        eta, B = self.cfg["max_staleness"], L["groups_per_step"]
        v: dict[str, list[str]] = {}

        v["no partial group"] = [
            f"group {g}: size {size}, {n} trajectories, {pl} payloads, {tu} with turns"
            for g, size, n, pl, tu in self.sql("""
                SELECT g.id, g.size, count(t.id),
                       count(p.trajectory_id), count(t.id) FILTER (WHERE EXISTS (SELECT 1 FROM turns u WHERE u.trajectory_id = t.id))
                FROM groups g LEFT JOIN trajectories t ON t.group_id = g.id
                LEFT JOIN token_payloads p ON p.trajectory_id = t.id
                WHERE g.run_id = :r GROUP BY g.id HAVING count(t.id) <> g.size OR count(p.trajectory_id) <> g.size
                   OR count(t.id) FILTER (WHERE EXISTS (SELECT 1 FROM turns u WHERE u.trajectory_id = t.id)) <> g.size""",
                                             r=run)]

        journaled, self.journal_counts = self._journals()
        in_db = dict(self.sql("SELECT id, size FROM groups WHERE run_id = :r", r=run))
        v["nothing committed lost"] = [f"group {g} ({n} trajectories) was committed by {who} but is not in the database"
                                       for g, (n, who) in journaled.items() if in_db.get(g) != n]
        self.unjournaled = len(set(in_db) - set(journaled))
        dup = self.sql("""SELECT collector, task_id, policy_version, count(*) FROM groups g WHERE run_id = :r
                          GROUP BY collector, task_id, policy_version,
                                   (SELECT string_agg(p.response_ids::text, '|' ORDER BY t.index_in_group) FROM trajectories t
                                    JOIN token_payloads p ON p.trajectory_id = t.id WHERE t.group_id = g.id)
                          HAVING count(*) > 1""", r=run)
        v["no group written twice"] = [f"{n} identical groups of task {t} (collector {who}, v{pv})" for who, t, pv, n in dup]

        v["nothing consumed beyond max_reuse"] = [
            f"trajectory {t}: times_sampled {ts}, {n} consumption rows (max_reuse {mr})"
            for t, ts, n, mr in self.sql("""
                SELECT t.id, t.times_sampled, count(c.step_id), :mr FROM trajectories t
                LEFT JOIN consumption c ON c.trajectory_id = t.id WHERE t.run_id = :r
                GROUP BY t.id, t.times_sampled HAVING t.times_sampled <> count(c.step_id) OR count(c.step_id) > :mr""",
                                         r=run, mr=L.get("max_reuse", 1))]

        steps = [s for (s,) in self.sql("SELECT step FROM learner_steps WHERE run_id = :r ORDER BY 1", r=run)]
        versions = self.sql("SELECT version, step, checkpoint_uri, sha256, meta->>'learner_state', meta->>'state_tag', "
                            "manifest_sha256 FROM policy_versions WHERE run_id = :r ORDER BY version", r=run)
        v["steps and versions contiguous"] = []
        if steps != list(range(1, len(steps) + 1)):
            v["steps and versions contiguous"].append(f"learner steps are {steps[:5]}...{steps[-5:]}")
        if [r[0] for r in versions] != list(range(len(versions))):
            v["steps and versions contiguous"].append(f"policy versions are {[r[0] for r in versions]}")
        if any(b[1] < a[1] for a, b in zip(versions, versions[1:])) or (versions and steps and versions[-1][1] > steps[-1]):
            v["steps and versions contiguous"].append("a version's step goes backwards or past the last recorded step")
        self.steps, self.versions = len(steps), len(versions)

        v["checkpoints present with their sha256"] = []
        newest = versions[-1][0] if versions else 0
        keep_p, keep_s = L["keep_policies"], L["keep_states"]
        if self.s3 is not None:
            v["checkpoints present with their sha256"] += self._check_storage(run, versions, newest, keep_p)
        for version, step, uri, sha, states, tag, _manifest in versions:
            if self.s3 is not None:  # in storage (checked above); the learner state is local
                if version > newest - keep_s and states and not (Path(states) / tag).is_dir():
                    v["checkpoints present with their sha256"].append(f"v{version}: learner state {Path(states) / tag} missing")
                continue
            path = Path(uri.removeprefix("file://"))
            if version <= newest - keep_p:
                if path.exists():
                    v["checkpoints present with their sha256"].append(f"v{version} should have been pruned: {path}")
                continue
            if not path.is_dir():
                v["checkpoints present with their sha256"].append(f"v{version}: {path} is missing")
            elif weights_sha256(path) != sha:
                v["checkpoints present with their sha256"].append(f"v{version}: sha256 differs from the recorded one")
            if version > newest - keep_s and states and not (Path(states) / tag).is_dir():
                v["checkpoints present with their sha256"].append(f"v{version}: learner state {Path(states) / tag} missing")

        v["staleness within max_staleness"] = [
            f"step {s} (v{sv}) consumed group {g} of v{gv}" for s, sv, g, gv in self.sql("""
                SELECT DISTINCT s.step, s.policy_version, g.id, g.policy_version FROM consumption c
                JOIN learner_steps s ON s.id = c.step_id JOIN groups g ON g.id = c.group_id
                WHERE s.run_id = :r AND s.policy_version - g.policy_version > :eta""", r=run, eta=eta)]

        v["every step consumed whole groups"] = [
            f"step {s}: {ng} groups, {nt} trajectories" for s, ng, nt in self.sql("""
                SELECT s.step, count(DISTINCT c.group_id), count(*) FROM learner_steps s
                JOIN consumption c ON c.step_id = s.id WHERE s.run_id = :r GROUP BY s.id, s.step
                HAVING count(DISTINCT c.group_id) <> :b OR count(*) <> (SELECT sum(size) FROM groups
                       WHERE id IN (SELECT group_id FROM consumption WHERE step_id = s.id))""", r=run, b=B)]

        v["no claim stuck past its TTL"] = self._claims(run, c["claim_ttl_s"])

        self.untrained = dict(self.sql("SELECT reason, count(*) FROM untrained_groups WHERE run_id = :r GROUP BY 1",
                                       r=run))
        v["no eligible group left untrained"] = []
        for reason, n in self.untrained.items():
            if reason in ("passed_over", "unknown"):
                v["no eligible group left untrained"].append(f"{n} group(s) untrained for reason {reason!r}")
        if self.untrained.get("waiting", 0) >= B:
            v["no eligible group left untrained"].append(f"{self.untrained['waiting']} eligible groups were left "
                                                         f"waiting: a batch is {B}")

        from reflexdb import storage

        ckpt = self.home / "checkpoints" / storage.run_key(run, self.args.run)  # the run's own (<name>.r<id>)
        leftovers = [p for p in ckpt.rglob("*") if p.is_dir() and (".tmp-" in p.name or p.name.startswith(".partial-"))]
        leftovers += list(self.extensions.glob("*/lock"))
        v["no leftover temporary files"] = [str(p) for p in leftovers]
        v["processes rode everything out"] = list(self.problems)
        return v

    def _check_storage(self, run: int, versions: list[tuple], newest: int, keep: int) -> list[str]:
        """``--storage s3``: every version recorded with an s3:// URI; the kept ones whole in storage
        with the recorded sha256 (a fresh fetch checks both), the pruned ones gone; every version a
        collector loaded came from s3:// and was verified. Also counts the retries seen in the logs."""
        from reflexdb import storage

        out = []
        cache = storage.CheckpointCache(self.home / "verify-cache", keep=10**6)
        base = storage.run_prefix(self.cfg["learner"]["checkpoint_url"], run, self.args.run)  # the run's own prefix
        in_storage = set(storage.versions_in(base, None))
        for version, _step, uri, sha, _states, _tag, manifest in versions:
            if manifest is None:
                out.append(f"v{version}: published to storage with no manifest_sha256")
            if uri != storage.version_uri(base, version):
                out.append(f"v{version}: recorded as {uri}, not in storage")
            elif version <= newest - keep:
                if version in in_storage:
                    out.append(f"v{version} should have been pruned from storage")
            else:
                try:
                    cache.fetch(uri, version, sha, manifest)
                except Exception as exc:  # noqa: BLE001 - any failure is the violation
                    out.append(f"v{version}: {type(exc).__name__}: {exc}")
        logs = {p.name: p.read_text(errors="replace") for p in self.logs.glob("*.log")}
        collector_logs = "".join(t for n, t in logs.items() if "collector" in n)
        import re

        loads = re.findall(r"loaded policy v\d+ from (\S+) \((manifest sha256 \w+… verified)?", collector_logs)
        out += [f"a collector loaded a version from {u} without a verified fetch" for u, ok in loads
                if not u.startswith("s3://") or not ok]
        self.storage_figures = {
            "versions_loaded_from_s3": len(loads),
            "fetch_failures_reported": collector_logs.count("could not fetch policy"),
            "upload_retries": sum(len(re.findall(r"uploading \S+ to \S+ failed \(", t))
                                  for n, t in logs.items() if "learner" in n),
        }
        return out

    def _journals(self) -> tuple[dict[int, tuple[int, str]], Counter]:
        """Groups the collectors journaled as committed: id -> (trajectories, collector name)."""
        owner = {pid: p.name for p in self.procs for pid in p.pids}
        out: dict[int, tuple[int, str]] = {}
        counts: Counter = Counter()
        for f in self.drill_dir.glob("*.journal"):
            who = owner.get(int(f.stem), f.stem)
            for line in f.read_text().splitlines():
                kind, gid, n = line.split()
                if kind == "group":
                    out[int(gid)] = (int(n), who)
                    counts[who] += 1
        return out, counts

    def _claims(self, run: int, ttl: float) -> list[str]:
        """Claims older than the TTL must be claimable: a probe claim (rolled back) takes them."""
        from reflexdb.db import connect_raw
        from reflexdb.work import claim_sql

        with connect_raw(self.url) as conn:
            expired = conn.execute("SELECT count(*) FROM tasks WHERE run_id = %s AND claimed_by IS NOT NULL "
                                   "AND claimed_at < now() - make_interval(secs => %s)", (run, ttl)).fetchone()[0]
            free = conn.execute("SELECT count(*) FROM tasks WHERE run_id = %s AND split = 'train' AND "
                                "(claimed_by IS NULL OR claimed_at < now() - make_interval(secs => %s))",
                                (run, ttl)).fetchone()[0]
            got = conn.execute(claim_sql(), {"run_id": run, "split": "train", "max_collections": 2**31 - 1,
                                                  "ttl": ttl, "n": 10**6, "collector": "chaos-probe",
                                                  "soft_retirement": False}).fetchall()
            conn.rollback()
        self.expired_claims = expired
        return [] if len(got) == free else [f"a probe could claim {len(got)} of {free} free or expired tasks"]

    # ------------------------------------------------------------------ report

    def figures(self, violations: dict[str, list[str]]) -> dict:
        groups, trajs = self.sql("SELECT count(*), coalesce(sum(size), 0) FROM groups WHERE run_id = :r",
                                 r=self.store.run_id(self.args.run))[0]
        return {
            "minutes": self.args.minutes, "seed": self.args.seed, "collectors": self.args.collectors,
            "kills": {f"{r} {s} {ph}": n for (r, s, ph), n in sorted(self.kills.items())},
            "stalls": len(self.stalls), "stall_seconds": round(sum(self.stalls), 1),
            "restarts": self.restarts, "outages": len(self.outages), "outage_seconds": round(sum(self.outages), 1),
            "groups": groups, "trajectories": int(trajs), "groups_journaled": sum(self.journal_counts.values()),
            "committed_not_journaled": self.unjournaled, "learner_steps": self.steps, "policy_versions": self.versions,
            "untrained": self.untrained, "expired_claims_at_end": self.expired_claims,
            "storage": self.args.storage, "storage_outages": len(self.storage_outages),
            "storage_outage_seconds": round(sum(self.storage_outages), 1), **getattr(self, "storage_figures", {}),
            "actions": dict(sorted(self.actions_done.items())),
            "violations": sum(len(x) for x in violations.values()),
            "checks": {k: len(x) for k, x in violations.items()},
        }

    def say(self, line: str) -> None:
        print(line, flush=True)


def report(f: dict, violations: dict[str, list[str]]) -> str:
    rows = [("duration", f"{f['minutes']:g} min, seed {f['seed']}, {f['collectors']} collectors + 1 learner")]
    rows += [(f"kills: {k}", str(n)) for k, n in f["kills"].items()]
    rows += [("writers stalled mid-transaction", f"{f['stalls']} ({f['stall_seconds']} s in all)"),
             ("restarts", str(f["restarts"])),
             ("database outages", f"{f['outages']} ({f['outage_seconds']} s in all)"),
             ("storage", f['storage'] + (f": {f['storage_outages']} outages ({f['storage_outage_seconds']} s in all), "
                                         f"{f.get('upload_retries', 0)} upload retries, "
                                         f"{f.get('fetch_failures_reported', 0)} failed fetches reported, "
                                         f"{f.get('versions_loaded_from_s3', 0)} versions loaded from S3, verified"
                                         if f['storage'] == 's3' else "")),
             ("groups / trajectories written", f"{f['groups']} / {f['trajectories']}"),
             ("groups journaled by collectors", f"{f['groups_journaled']} (+{f['committed_not_journaled']} committed "
                                                "by a collector killed before its journal line)"),
             ("learner steps / policy versions", f"{f['learner_steps']} / {f['policy_versions']}"),
             ("untrained groups by reason", ", ".join(f"{k} {v}" for k, v in sorted(f["untrained"].items())) or "none"),
             ("claims expired at the end (killed collectors')", str(f["expired_claims_at_end"]))]
    rows += [(f"check: {k}", "ok" if not x else f"{len(x)} VIOLATION(S)") for k, x in violations.items()]
    rows.append(("violations", str(f["violations"])))
    lines = ["| figure | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    detail = [f"  {k}: {msg}" for k, x in violations.items() for msg in x[:10]]
    return "\n".join(lines + (["", "violations:"] + detail if detail else []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to inflict failures (default 10)")
    ap.add_argument("--short", action="store_true", help="the CI drill: 1 minute (then until every kind of action was taken), one 8-s outage, shorter gaps")
    ap.add_argument("--collectors", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--outages", type=int, default=2, help="database stops during the drill (default 2)")
    ap.add_argument("--home", help="REFLEXDB_HOME for the drill (default: a new temporary directory)")
    ap.add_argument("--run", default="chaos", help="run name")
    ap.add_argument("--method", choices=("grpo", "lte", "sevenths"), default="grpo",
                    help="lte: the run under LTE, collectors also killed inside hint stages; sevenths: a method "
                         "that never trains every seventh group (Method.drops; tests/data/plugins/sevenths)")
    ap.add_argument("--url", help="use this PostgreSQL instead of a private embedded one")
    ap.add_argument("--db-stop-cmd", help="with --url: a shell command that stops the server (for outages)")
    ap.add_argument("--db-start-cmd", help="with --url: a shell command that starts it again")
    ap.add_argument("--storage", choices=("local", "s3"), default="local",
                    help="s3: publish through learner.checkpoint_url on a local S3 server (moto), with storage "
                         "outages and a learner killed mid-upload among the actions")
    ap.add_argument("--actions", type=lambda s: s.split(","),
                    help="take only these actions (comma-separated), e.g. storage-outage,kill-learner-upload")
    ap.add_argument("--keep", action="store_true", help="keep the home directory even when every check passed")
    ap.add_argument("--json", help="also write the figures and violations to this file")
    args = ap.parse_args(argv)
    args.gap, args.outage_seconds = (4.0, 10.0), (8.0, 20.0)
    outages = args.outages
    if args.short:
        args.minutes, args.outages, args.gap, args.outage_seconds = 1.0, 1, (1.0, 3.0), (8.0, 8.0)
        if "--outages" in (argv if argv is not None else sys.argv):  # --short --outages 0: no database outage
            args.outages = outages
    drill = Drill(args)
    t0 = time.monotonic()
    try:
        drill.setup()
        drill.run()
        violations = drill.check()
        figures = drill.figures(violations)
    finally:
        for p in drill.procs:
            if p.alive():
                os.kill(p.popen.pid, signal.SIGCONT)
                p.popen.kill()
        if drill.s3 is not None:
            drill.s3.stop()
    figures["wall_seconds"] = round(time.monotonic() - t0, 1)
    print(report(figures, violations))
    print(f"wall clock {figures['wall_seconds']:.0f} s; home {drill.home}")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "violations": violations}, indent=2))
    drill.store.close()
    if drill.pgdata is not None:
        from reflexdb import embedded

        embedded.stop(drill.pgdata)
    if figures["violations"] == 0 and not args.keep:
        shutil.rmtree(drill.home, ignore_errors=True)
    return 0 if figures["violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
