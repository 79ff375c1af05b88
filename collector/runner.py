"""``reflexdb collect``: a long-running collector.

Reads top to bottom as the loop it is::

    setup: run, tasks, collector row, newest policy weights
    loop:  reload weights if a newer policy exists
           admission control (staleness bound eta) -> wait for a policy if too far ahead
           ask the run's workflows for work in priority order (the method's list,
             collector/workflows/): the first that claims something turns it into groups
           write each group in one transaction (retried while the database is away; groups a
           workflow returns as a list share one), completing its claim in the same transaction;
           a group the store refuses for its content is counted and skipped, its work released
    stop:  SIGINT/SIGTERM once -> finish the in-flight group, then exit 0;
           twice -> abandon it (claims released, nothing written), exit 0

A group is never half-written: each is one transaction. Nothing a model writes stops the loop:
text the store cannot hold is made storable first (:func:`storable_group`), and a group the store
still refuses for its content is logged with the reason, counted (``collectors.rejected_groups``,
``last_rejection``) and skipped, the rest of the batch written and the skipped work released for
another try (docs/sandbox.md, "Nothing a model writes stops a collector").
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import psycopg

from reflexdb import GroupIn, Store, TrajectoryIn, drill, storage, work
from reflexdb.config import Config
from reflexdb.errors import ClaimLost, InvalidGroup, NotFound
from reflexdb.retry import TRANSIENT, DbRetry
from reflexdb.storable import storable_json, storable_text
from reflexdb.timing import PhaseTimer

from .engines import Engine, Sample, SamplingParams, make_engine, timed
from .engines.base import checkpoint_path
from .environments import EnvTask
from .fetch import Fetcher, InPlace
from .episodes import Episode, Rollout, RolloutStats, Start, environment_factory
from reflexdb.models import model_display_name, resolve_model
from .deadline import Deadline
from .environments.base import unverified
from .rewards import get_reward
from .sources import build_tasks, prompt_messages
from .tasks.templates import get_template
from .workflows import Workflow, make_workflow
from .workflows.base import score_samples

log = logging.getLogger("reflexdb.collect")

#: The collector's phases (:class:`PhaseTimer`, metrics ``collector/seconds_<phase>``) and their
#: labels in the progress line: the engine's generate calls, a workflow's separate scoring pass
#: (log-probs recomputed: R3L, CLEANER), the reward function's calls, the groups' transactions.
PHASES = {"generate": "gen", "score": "score", "reward": "rew", "write": "write"}

#: What the store raises for a group's content (never for the database being away, which DbRetry
#: rides out): its own validation, and what PostgreSQL refuses in a value (an invalid byte
#: sequence or escape in text or JSON, a value too large for an index or a column).
CONTENT_ERRORS = (InvalidGroup, psycopg.errors.DataError, psycopg.errors.ProgramLimitExceeded, UnicodeError)


def storable_group(g: GroupIn) -> GroupIn:
    """``g`` with the text a model or a tool wrote made storable: PostgreSQL text and JSON hold no
    NUL and no lone surrogate, so each becomes U+FFFD in turns, answers, errors and metadata. The
    token ids, which are what trains, are untouched. Changes ``g`` in place and returns it."""
    g.meta = storable_json(g.meta)
    for t in g.trajectories:
        t.extracted_answer, t.error, t.meta = storable_text(t.extracted_answer), storable_text(t.error), \
            storable_json(t.meta)
        for u in t.turns:
            u.text, u.answer, u.tool_call = storable_text(u.text), storable_text(u.answer), storable_json(u.tool_call)
    return g


def _sampled_tokens(t: TrajectoryIn) -> int:
    """Tokens the engine sampled for ``t``: its assistant spans (an episode's environment tokens
    were not generated), or all its response tokens."""
    spans = [u.token_end - u.token_start for u in t.turns if u.role == "assistant" and u.token_start is not None]
    return sum(spans) if spans else len(t.response_ids)


def _checked(policy) -> str:
    """What was checked of a version fetched from storage, for the log line (unclosed bracket)."""
    if policy.manifest_sha256:
        return f" (manifest sha256 {policy.manifest_sha256[:12]}… verified, and every file against it"
    log.warning("policy v%s was published before revision 0029: its config and tokenizer files are checked only "
                "against its manifest in storage", policy.version)
    weights = f"weights' sha256 {policy.sha256[:12]}… verified" if policy.sha256 else "no sha256 recorded"
    return (f" ({weights}; published before revision 0029, so its other files are checked only against its manifest "
            "in storage")


class Abandon(Exception):
    """Raised by the second SIGINT/SIGTERM: drop the in-flight group."""


@dataclass
class Stats:
    groups: int = 0
    trajectories: int = 0
    tokens: int = 0
    correct: int = 0
    reward_errors: int = 0
    unverified_rewards: int = 0  # scored 0 for want of a verdict: past the deadline, or unverifiable
    skipped_rows: int = 0
    rejected: int = 0  # groups the store refused for their content: counted, skipped, never a crash
    fetch_failures: int = 0  # tries to fetch a published version from storage that failed (collector/fetch.py)
    kinds: Counter = field(default_factory=Counter)  # groups of each kind other than 'fresh'
    fresh_samples: int = 0  # trajectories of the policy on the plain prompt (origins counted in pass@1)
    started: float = field(default_factory=time.monotonic)

    def line(self, version: int, since: Stats | None = None, phases: str = "") -> str:
        """A progress line; ``since``: the last report's counts, for the pass@1 of the groups since;
        ``phases``: where the time went (:meth:`PhaseTimer.summary`)."""
        dt = max(time.monotonic() - self.started, 1e-9)
        pass1 = self.correct / self.fresh_samples if self.fresh_samples else float("nan")
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        by_kind = f" ({kinds})" if kinds else ""
        recent = ""
        if since is not None and self.fresh_samples > since.fresh_samples:
            recent = (f"{(self.correct - since.correct) / (self.fresh_samples - since.fresh_samples):.3f} "
                      f"since the last line, ")
        rejected = f" | {self.rejected} refused by the store" if self.rejected else ""
        if self.unverified_rewards:
            rejected += f" | {self.unverified_rewards} rewards unverified (scored 0)"
        if self.fetch_failures:
            rejected += f" | {self.fetch_failures} checkpoint fetches failed"
        return (f"policy v{version} | groups {self.groups}{by_kind} | trajectories {self.trajectories} "
                f"({self.trajectories / dt:.2f}/s) | tokens/s {self.tokens / dt:.1f} | pass@1 {recent}{pass1:.3f} "
                f"overall{rejected}" + (f" | {phases}" if phases else ""))


class Collector:
    """One collector process: turns claimed tasks into stored groups until told to stop."""

    def __init__(self, cfg: Config, store: Store, engine: Engine | None = None, *, echo=print):
        self.cfg = cfg
        self.c = cfg.collector
        self.store = store
        self.echo = echo
        self.name = self.c.name or f"{socket.gethostname()}-{os.getpid()}"
        self.model_location = resolve_model(cfg.model, say=echo)  # a first conversion is said
        # The reward runs in a child process under a deadline (collector/deadline.py), forked before
        # the engine loads so the child is small.
        self.reward_fn = Deadline(get_reward(self.c.reward), self.c.reward_timeout_s)
        self.engine = engine or make_engine(self.c.engine, model=self.model_location, device=self.c.device,
                                           **self.c.engine_options)
        # Where the time goes (PHASES): the engine returns its samples on the host, so no phase
        # needs a device synchronize to end.
        self.timer = PhaseTimer()
        get_template(cfg.tasks.template)  # an unknown name stops here, before any work
        self.params = SamplingParams(
            temperature=self.c.sampling.temperature, top_p=self.c.sampling.top_p,
            max_new_tokens=self.c.sampling.max_new_tokens, stop=tuple(self.c.sampling.stop),
        )
        self.make_env = environment_factory(cfg.environment.name, cfg.environment.options,
                                            self.timer.timed("reward", self.reward_fn), cfg.tasks.template)
        self.rollout_stats = RolloutStats()
        self._said_waiting = float("-inf")  # when the admission wait was last reported
        self._held = False  # whether admission control held new groups at the last look (nothing sampled)
        self._said_bound: int | None = None  # the published max_staleness last said to differ from the config's
        # The groups the run's method never trains (Method.drops): admission does not count them.
        self.drops = cfg.method.drops
        self.version = 0
        self.fetcher: Fetcher | None = None  # made when a version lies in storage (learner.checkpoint_url)
        self.in_place = InPlace(lambda msg: self.echo(msg))  # versions read in place (file://, shared memory): checked first
        self.stopping = False
        self.stats = Stats()
        self.rng = np.random.default_rng([cfg.seed, os.getpid()])
        self.embedding_model = model_display_name(self.model_location)
        # Every database call of the loop rides out an outage of up to db_retry_s.
        self.db = DbRetry(self.c.db_retry_s, lambda msg: self.echo(msg), who=f"collector {self.name}")
        # The method's workflows, in priority order (collector/workflows/).
        self.workflows: list[Workflow] = [make_workflow(w.name, self, **w.options) for w in cfg.method.workflows(cfg)]

    # ------------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        cfg = self.cfg
        self.run_id = self._join_run()
        tasks, skipped = build_tasks(cfg.tasks)
        self.store.add_tasks(self.run_id, tasks)
        self.stats.skipped_rows = skipped
        work.check_drops(self.store, cfg.algorithm, self.drops)
        latest = self.store.latest_policy(self.run_id)
        if latest is not None and latest.version > 0:
            self._load(latest, wait=True)
            if self.version != latest.version and self.fetcher is not None:  # it could not be fetched
                self._fall_back(latest)
        self.collector_id = work.register_collector(
            self.store, self.run_id, self.name, engine=self.c.engine, model=model_display_name(self.model_location),
            policy_version=self.version,
        )
        if skipped:
            work.report_progress(self.store, self.collector_id, policy_version=self.version, skipped_rows=skipped)
        self.echo(f"collector {self.name}: run {cfg.run!r} (id {self.run_id}), {len(tasks)} tasks"
                  f"{f', {skipped} dataset rows skipped' if skipped else ''}, policy v{self.version}")
        if self.drops:
            self.echo(f"admission control leaves out the groups in {self.drops}: method {cfg.algorithm} never trains "
                      "them (Method.drops)")
        if getattr(self.engine, "plan", None):  # the fast engine's memory planner: rows x context
            self.echo(f"engine {self.c.engine}: {self.engine.plan}")
        self._staleness_bound(self.store.get_settings(self.run_id))  # says so if the config's bound is not the run's

    def _staleness_bound(self, settings: dict) -> int:
        """η for admission control: the run's ``learner.max_staleness`` as the learner published it
        (what the views and the learner enforce), or this collector's ``max_staleness`` while
        nothing is published yet. A config that disagrees with the published bound is said once
        (and again if the published one changes)."""
        published = settings.get("learner.max_staleness")
        if published is None:
            return self.cfg.max_staleness
        eta = int(published)
        if eta != self.cfg.max_staleness and eta != self._said_bound:
            self._said_bound = eta
            self.echo(f"max_staleness {self.cfg.max_staleness} in this collector's config differs from the run's "
                      f"learner.max_staleness {eta}, which the learner published: admission control uses {eta}")
        return eta

    def _join_run(self) -> int:
        """The run's id: the run is created when this login may create runs (the owner's); a login
        that may not (the collector role) waits until the learner has created it and recorded its
        embedding dimension, saying so once a minute."""
        from reflexdb import runs

        may_create, may_record = runs.privileges(self.store)
        if may_create:
            return self.store.create_run(self.cfg.run, algorithm=self.cfg.algorithm, config=self.cfg.masked())
        said = float("-inf")
        while True:
            found = runs.find(self.store, self.cfg.run)
            if found is not None and (found[1] is not None or may_record):
                return found[0]
            if time.monotonic() - said >= 60:
                what = ("does not exist yet, and this login may not create runs" if found is None else
                        "has no embedding dimension recorded yet, and this login may not record it")
                self.echo(f"run {self.cfg.run!r} {what} (the collector role): waiting for `reflexdb learn` of the "
                          "run to start (it does both)")
                said = time.monotonic()
            time.sleep(self.c.poll_interval_s)

    def install_signal_handlers(self) -> None:
        def handler(signum, _frame):
            if self.stopping:
                raise Abandon()
            self.stopping = True
            self.echo(f"{signal.Signals(signum).name}: finishing the in-flight group, then stopping "
                      "(send again to abandon it)")

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def run(self, *, max_groups: int | None = None, max_seconds: float | None = None) -> Stats:
        """Collect until stopped, ``max_groups`` written, ``max_seconds`` passed, or the tasks run out."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        last_report = time.monotonic()
        reported = Stats(started=0.0)
        status = "stopped"
        try:
            while not self.stopping:
                if max_groups is not None and self.stats.groups >= max_groups:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if time.monotonic() - last_report >= self.c.progress_every_s:  # heartbeat, also while waiting
                    self._report(reported)
                    last_report = time.monotonic()
                self._maybe_reload()
                want = self.c.tasks_per_batch
                if max_groups is not None:
                    want = min(want, max_groups - self.stats.groups)
                # Work that only replaces groups already admitted (a workflow's admission_free) never waits for
                # admission: the learner may be waiting for exactly that work.
                free = [w for w in self.workflows if getattr(w, "admission_free", False)]
                if free and self._claim_and_collect(free, want):
                    continue
                room = self._admitted(wait_s=self.c.poll_interval_s if free else self.c.progress_every_s)
                if not room:
                    self._held = True
                    continue
                self._held = False
                if self._claim_and_collect(self.workflows, min(want, room)):  # no group past the bound
                    continue
                finite = [w for w in self.workflows if hasattr(w, "exhausted")]
                if finite and all(w.exhausted() for w in finite):
                    self.echo("every task has been collected max_collections times: done")
                    break
                time.sleep(self.c.poll_interval_s)  # others hold the remaining claims
        except Abandon:
            self.echo("abandoned the in-flight group; nothing of it was written")
        except BaseException:
            status = "failed"
            raise
        finally:
            self._shutdown(reported, status)
        return self.stats

    def _shutdown(self, reported: Stats, status: str) -> None:
        try:
            for workflow in self.workflows:
                if hasattr(workflow, "release"):
                    workflow.release()
            self._report(reported)  # the stopped line below says it all
            work.mark_stopped(self.store, self.collector_id, status)
        except TRANSIENT as exc:  # the database is gone: claims expire by TTL anyway
            log.warning("could not record the shutdown in the database: %s", exc)
        close = getattr(self.reward_fn, "close", None)  # a Deadline's process (a benchmark may wrap it)
        if close is not None:
            close()
        self.echo(f"collector {self.name} stopped: {self.stats.line(self.version, phases=self.timer.summary(PHASES))}")

    # ------------------------------------------------------------------ steps

    def _maybe_reload(self) -> None:
        latest = self.db(lambda: self.store.latest_policy(self.run_id))
        if latest is not None and latest.version > self.version:
            self._load(latest)

    def _load(self, policy, *, wait: bool = False) -> None:
        """Load ``policy``'s weights. A copy in shared memory on this machine (the learner's,
        reflexdb/shm.py) is loaded from there; a version in storage is fetched first, in the
        background (``wait``: here, at start-up); until it is whole and verified the collector keeps
        its current version, and a fetch that fails is reported and tried again (collector/fetch.py).
        The cache refuses a version larger than the run's model can be (:func:`reflexdb.storage.size_bound`).
        A version read in place (shared memory, ``file://``) is checked against its row first: a torn
        one is refused and the collector keeps its weights (:class:`~.fetch.InPlace`)."""
        path, fetched = checkpoint_path(policy.checkpoint_uri), ""
        shared = self.in_place.shared(policy)
        if shared is not None:
            path, checked = shared
            fetched = f" (in shared memory, {path}: {checked})"
        elif storage.is_remote(policy.checkpoint_uri):
            if self.fetcher is None:
                cache = storage.CheckpointCache(storage.cache_root(self.cfg.run), storage.options_for(
                    policy.checkpoint_uri, self.cfg.learner.checkpoint_url, self.cfg.learner.checkpoint_storage_options),
                    keep=self.c.checkpoint_cache_versions, max_bytes=storage.size_bound(self.model_location),
                    concurrency=self.c.checkpoint_fetch_concurrency)
                self.fetcher = Fetcher(cache, self.echo)
            path = self.fetcher.ready(policy, None if wait else self.version, wait=wait, sampling=not self._held)
            self.stats.fetch_failures = self.fetcher.failures
            if path is None:
                return
            fetched = f"{_checked(policy)}, cached in {path})"
        else:
            checked = self.in_place.check(policy, path, self.version, sampling=not self._held)
            if checked is None:  # torn: refused (said), checked again later
                return
            fetched = f" ({checked})"
        drill.phase("reload")
        t0 = time.monotonic()
        self.engine.load_weights(path)
        self.version = policy.version
        self.echo(f"loaded policy v{policy.version} from {storage.mask(policy.checkpoint_uri)}{fetched} in "
                  f"{time.monotonic() - t0:.1f}s")

    def _fall_back(self, wanted) -> None:
        """``wanted`` (the newest version) could not be fetched at start-up: start from the newest
        version this collector's cache holds whole and verified for its row, not the base model."""
        cache = self.fetcher.cache
        for version in reversed(cache.versions()):
            if not 0 < version < wanted.version:
                continue
            try:
                policy = self.store.get_policy(self.run_id, version)
            except NotFound:
                continue
            path = cache.cached(policy.checkpoint_uri, version, policy.sha256, policy.manifest_sha256)
            if path is None:  # not the version that row recorded (a run recreated under the same name)
                continue
            t0 = time.monotonic()
            self.engine.load_weights(path)
            self.version = version
            self.echo(f"loaded policy v{version} from this collector's cache ({path}, verified when it was fetched) in "
                      f"{time.monotonic() - t0:.1f}s: the newest verified version it holds, until policy "
                      f"v{wanted.version} can be fetched")
            return
        self.echo(f"starting with the base model (policy v0) until policy v{wanted.version} can be fetched: this "
                  "collector's cache holds no verified version of the run")

    def _claim_and_collect(self, workflows: list[Workflow], want: int) -> bool:
        """Ask ``workflows`` for work in priority order; the first with work wins. Whether one had any."""
        drill.phase("claim")
        for workflow in workflows:
            claimed = workflow.claim(want)
            if claimed:
                if self._write(workflow.collect(claimed)) and hasattr(workflow, "release"):
                    self.db(workflow.release)  # the refused groups' work goes back, for another try
                return True
        return False

    def _admitted(self, wait_s: float) -> int:
        """How many on-policy groups may start now (admission control, reflexdb/work.py); 0: none,
        after waiting up to ``wait_s`` for a newer policy."""
        settings = self.db(lambda: self.store.get_settings(self.run_id))
        # groups other collectors are making from a method's own claims (a workflow's in_flight)
        in_flight = sum(self.db(w.in_flight) for w in self.workflows if hasattr(w, "in_flight"))
        # Every number of the bound as the learner published it (run_settings), this config's before that.
        eta = self._staleness_bound(settings)
        a = self.db(lambda: work.admission(
            self.store, self.run_id, self.name, policy_version=self.version, eta=eta,
            groups_per_step=int(settings.get("learner.groups_per_step", self.cfg.learner.groups_per_step)),
            publish_every=int(settings.get("learner.publish_every", self.cfg.learner.publish_every)),
            imported_per_step=int(settings.get("learner.imported_per_step", self.cfg.learner.imported_per_step)),
            claim_ttl_s=self.c.claim_ttl_s, in_flight=in_flight, drops=self.drops,
        ))
        if a.allowed:
            return a.room
        drill.phase("admission")
        if time.monotonic() - self._said_waiting >= self.c.progress_every_s:  # short waits: say it now and then
            self._said_waiting = time.monotonic()
            self.echo(f"waiting for policy v{a.consume_version - eta}: group {a.next_group} would be "
                      f"{a.staleness} versions stale when consumed (max_staleness {eta})")
        self.db(lambda: self.store.wait_for_policy(self.run_id, self.version, timeout=wait_s,
                                                       poll_interval=self.c.poll_interval_s))
        return 0

    # ------------------------------------------------------------------ what workflows use

    def prompt(self, text: str) -> list[dict]:
        """The chat messages of a task prompt under the run's template."""
        return prompt_messages(self.cfg.tasks.template, text)

    def sample(self, prompts: list, n: int, **overrides) -> list[list[Sample]]:
        """``n`` samples of each prompt in one engine call, with a seed drawn for the call;
        ``overrides``: sampling parameters other than the run's (``temperature=0.7``, ``json_schema=...``)."""
        params = SamplingParams(**{**self.params.__dict__, **overrides, "seed": int(self.rng.integers(2**31))})
        drill.phase("generate")
        t0 = time.perf_counter()
        with self.timer("generate"):
            out = self.engine.generate(prompts, n=n, params=params)
        out = timed(out, time.perf_counter() - t0)
        self.rollout_stats.engine_calls += 1  # the collector's engine calls, rollouts' and these
        self.rollout_stats.sampled_tokens += sum(len(s.token_ids) for row in out for s in row)
        return out

    def rollout(self, tasks: list[EnvTask], n: int) -> list[list[TrajectoryIn]]:
        """``n`` episodes of each task in the run's environment (collector/episodes.py), scored:
        ``result[i][j]`` is episode ``j`` of task ``i``. With ``environment: single`` this is one
        engine call, ``sample`` + ``score``."""
        return [[ep.trajectory() for ep in row] for row in self.episodes(tasks, n)]

    def episodes(self, tasks: list[EnvTask], n: int) -> list[list[Episode]]:
        """As :meth:`rollout`, the episodes themselves: each with its environment, to restore and
        :meth:`resume` (``Episode.trajectory()`` is the trajectory)."""
        drill.phase("generate")
        out = self.driver().episodes(tasks, n)
        self._count_errors([ep.error for row in out for ep in row])
        return out

    def resume(self, starts: list[Start]) -> list[Episode]:
        """One episode from each start (a restored environment and its conversation), batched."""
        drill.phase("generate")
        out = self.driver().resume(starts)
        self._count_errors([ep.error for ep in out])
        return out

    def driver(self, cls: type[Rollout] = Rollout, **options) -> Rollout:
        """The rollout driver over this collector's engine, environment, sampling and policy
        version; ``cls``: a subclass of :class:`Rollout` (a method's own turn loop) with its options."""
        def params() -> SamplingParams:  # one seed per engine call
            return SamplingParams(**{**self.params.__dict__, "seed": int(self.rng.integers(2**31))})

        r = cls(self.engine, self.make_env, params, self.version, **options)
        r.stats, r.timer = self.rollout_stats, self.timer
        return r

    def score(self, ground_truth: str | None, prompt: list[dict], samples: list[Sample]) -> list[TrajectoryIn]:
        """Samples as trajectories with their rewards (a reward function that raises gives a NULL
        reward and the error, never a crash)."""
        with self.timer("reward"):
            trajectories = score_samples(self.reward_fn, ground_truth, prompt, samples)
        self._count_errors([t.error for t in trajectories])
        return trajectories

    def _count_errors(self, errors: list[str | None]) -> None:
        self.stats.reward_errors += sum(e is not None for e in errors)
        self.stats.unverified_rewards += sum(unverified(e) for e in errors)

    def _write(self, units: list[GroupIn | list[GroupIn]]) -> int:
        """Write what a workflow returned: each group in its own transaction, or each list of groups
        (a method's groups that belong together) in one. Returns how many units the store refused
        for their content (each logged and counted; the others are written all the same)."""
        refused = 0
        for unit in units:
            together = [storable_group(g) for g in (unit if isinstance(unit, list) else [unit])]
            try:
                with self.timer("write"):
                    written = self.db(lambda together=together: self.store.write_groups(together,
                                                                                        complete_claim=self.name))
            except ClaimLost as exc:  # another collector (or the learner) has its work item: drop ours
                self.echo(str(exc))
                continue
            except CONTENT_ERRORS as exc:  # what the model wrote, not the database: skip it, never stop
                refused += 1
                self._refused(together, exc)
                continue
            for g, w in zip(together, written):
                drill.journal(f"group {w.group_id} {len(w.trajectory_ids)}")
                self._count(g)
            drill.phase("written")
        return refused

    def _refused(self, together: list[GroupIn], exc: Exception) -> None:
        self.stats.rejected += len(together)
        tasks = ", ".join(str(g.task_id) for g in together)
        reason = f"{type(exc).__name__}: {exc}"
        self.echo(f"the store refused {len(together)} group(s) of task(s) {tasks} for their content, skipped "
                  f"(the work is released for another try): {reason}")
        log.warning("group(s) of task(s) %s refused: %s", tasks, reason)
        for _ in together:
            self.db(lambda: work.record_rejection(self.store, self.collector_id, reason))

    def _count(self, g: GroupIn) -> None:
        # the facts of tables origins and group_kinds (reflexdb/origins.py; read by the write): a
        # method's auxiliary group (kind retry) holds rows whose episodes are counted through the
        # training group's rows, never as samples of pass@1
        origins, kinds = self.store.origins(), self.store.group_kinds()
        own = [t for t in g.trajectories if origins[t.origin].pass_at_1] if kinds[g.kind].pass_at_1 else []
        self.stats.groups += 1
        if g.kind != "fresh":
            self.stats.kinds[g.kind] += 1
        self.stats.trajectories += len(g.trajectories)
        self.stats.fresh_samples += len(own)
        self.stats.tokens += sum(_sampled_tokens(t) for t in g.trajectories if origins[t.origin].sampled)
        self.stats.correct += sum(bool(t.correct) for t in own)

    def metrics(self) -> dict[str, float]:
        """Where this collector's time went since it started (docs/metrics.md, "Where the time
        goes"): seconds in each phase (:data:`PHASES`; nested phases counted once), the wall time,
        and the tokens its engine sampled per second of generation."""
        seconds = self.timer.seconds
        m = {f"collector/seconds_{phase}": seconds.get(phase, 0.0) for phase in PHASES}
        m["collector/wall_seconds"] = self.timer.elapsed()
        m["collector/generated_tokens"] = float(self.rollout_stats.sampled_tokens)
        generating = m["collector/seconds_generate"]
        m["collector/generated_tokens_per_s"] = (self.rollout_stats.sampled_tokens / generating if generating > 0
                                                 else float("nan"))
        return m

    def phase_seconds(self) -> dict[str, float]:
        """The heartbeat's ``collectors.phase_seconds`` (0026): cumulative seconds per phase and
        ``wall``, with ``tokens`` sampled so far, the learner's sum over a run's collectors."""
        m = self.metrics()
        out = {phase: round(m[f"collector/seconds_{phase}"], 3) for phase in PHASES}
        out["wall"] = round(m["collector/wall_seconds"], 3)
        out["tokens"] = int(m["collector/generated_tokens"])
        if self.fetcher is not None:  # versions in storage: time fetching them (in the background), failed tries
            out["fetch"] = round(self.fetcher.seconds, 3)
            out["fetch_failures"] = self.fetcher.failures
        return out

    def _report(self, reported: Stats) -> None:
        s = self.stats
        self.db(lambda: work.report_progress(
            self.store, self.collector_id, policy_version=self.version, groups=s.groups - reported.groups,
            trajectories=s.trajectories - reported.trajectories, tokens=s.tokens - reported.tokens,
            reward_errors=s.reward_errors - reported.reward_errors,
            unverified_rewards=s.unverified_rewards - reported.unverified_rewards,
            phase_seconds=self.phase_seconds(),
        ))
        line = s.line(self.version, since=reported, phases=self.timer.summary(PHASES)) \
            if s.groups > reported.groups else None
        reported.groups, reported.trajectories, reported.tokens, reported.reward_errors = (
            s.groups, s.trajectories, s.tokens, s.reward_errors)
        reported.unverified_rewards = s.unverified_rewards
        reported.correct, reported.fresh_samples = s.correct, s.fresh_samples
        if line is not None:  # a heartbeat with nothing new says nothing
            self.echo(line)
