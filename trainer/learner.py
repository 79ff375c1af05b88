"""``reflexdb learn``: the asynchronous learner.

One step reads top to bottom (:meth:`Learner.step`)::

    groups  = the method's batch rule (default: oldest eligible groups of view learner_eligible,
              staleness and reuse rules)
    batch   = padded tensors (prompt ⊕ response, loss mask, behaviour log-probs)
    old     = π_old log-probs: recomputed under the weights at the step's start, or behaviour;
              rows sampled in another context always use their behaviour log-probs (π_beh;
              the table of origins, reflexdb/origins.py)
    adv     = group-normalised advantages (float64; NULL rewards left out), then the method's transforms
              (each stage's values kept for the record)
    loss    = the method's loss terms over micro-batches (gradient accumulation), each micro-batch
              weighted by its share of each term's normaliser; backward, optimizer step
    record  = learner_steps row + the trajectories consumed, each with its advantage after every
              stage and what the loss used at each token (learner.record_token_signals; one
              transaction)
    publish = every k steps: DeepSpeed state, HF safetensors, policy_versions row + NOTIFY
    after   = the method's hooks (trainer/method_api/), if any

The learner is the loop; its parts live beside it: the groups come from batch sources
(trainer/sources.py: the method's rule, imported groups), the step's π_old, losses and optimizer
step are the policy update (trainer/update.py), versions are published, pruned and resumed by the
checkpointer (trainer/checkpointer.py), and a method's hooks score trajectories through the scorer
(trainer/scoring.py).

Resume is from the last *published* state: steps recorded after it are rolled back (their
consumption deleted, times_sampled restored), so nothing is consumed twice or skipped.

Every database call rides out an outage of up to ``learner.db_retry_s`` (reflexdb.retry). A step
whose consumption could not be recorded is never published (the process stops first, and resume
rolls it back), and a version is only what its ``policy_versions`` row says (trainer/checkpointer.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from reflexdb import Store, drill, shm, storage, work
from reflexdb.config import Config
from reflexdb.errors import ReflexdbError
from reflexdb.records import TokenSignals
from reflexdb.retry import DbRetry
from reflexdb.settings import home
from reflexdb.timing import PhaseTimer
from reflexdb.tracking import Tracker

from . import ranks
from .advantages import advantage_stages
from .batch import AUXILIARY, Batch, Selection, pack
from .checkpointer import Checkpointer, find_resume, run_places
from .engine import EngineSettings, TrainingEngine
from .fit import FitCheck, tokens_per_pass
from .losses.registry import get_loss_spec
from .scoring import Scorer
from .sources import BatchSource, ImportedGroups, MethodGroups, choose
from .update import PolicyUpdate, signal_rows

log = logging.getLogger("reflexdb.learn")

#: The learner's phases (:class:`PhaseTimer`, metrics ``perf/seconds_<phase>``) and their labels in
#: the progress line: waiting for eligible groups, choosing and reading them (the views, the
#: payloads, packing), the forward and backward passes (π_old and reference log-probs included),
#: the optimizer step, publishing a version.
PHASES = {"wait": "wait", "read": "read", "forward_backward": "fwd+bwd", "optimizer": "opt", "publish": "pub"}


class NullTracker:
    """What ranks other than 0 log to: nothing."""

    run_id = None

    def log_config(self) -> None: ...

    def log_metrics(self, metrics, step) -> None: ...

    def close(self, status: str = "FINISHED") -> None: ...


def advantage_stats(adv: torch.Tensor, valid: torch.Tensor, auxiliary: torch.Tensor) -> dict[str, float]:
    """``advantage/abs_mean`` and ``advantage/nonzero_frac`` over the rows of the step's groups that
    have a reward: a method's auxiliary rows (SFT pairs: groups of one, A = 0, which positive
    amplification may still lift to α) are trained by terms of their own and left out."""
    keep = valid & ~auxiliary
    a = adv.detach().abs()[keep] if keep.any() else adv.new_zeros(1)
    return {"advantage/abs_mean": float(a.mean()), "advantage/nonzero_frac": float((a > 1e-12).float().mean())}


class LearnerStopped(ReflexdbError):
    """The learner stopped on purpose after repeated bad steps; the message says why."""


@dataclass
class StepResult:
    step: int
    loss: float
    skipped: bool
    metrics: dict[str, float]


class Learner:
    """The learner process: consumes groups, trains, publishes."""

    def __init__(self, cfg: Config, store: Store, *, echo: Callable[[str], None] = print):
        from reflexdb.models import resolve_model

        self.cfg = cfg
        self.L = cfg.learner
        self.store = store
        self.echo = echo
        self.method = cfg.method  # trainer/method_api/: batch rule, transforms, loss terms, hooks
        self.terms = self.method.loss_terms(cfg, cfg.loss_params)
        self.specs = [get_loss_spec(t.loss) for t in self.terms]
        self.transforms = self.method.transforms(cfg) if self.method.transforms else []
        self.temperature = cfg.collector.sampling.temperature or 1.0
        self.base_model = resolve_model(cfg.model, say=lambda msg: self.echo(msg))  # a first conversion is said
        # Every database call below goes through db(): an outage of up to db_retry_s is waited out.
        self.db = DbRetry(self.L.db_retry_s, lambda msg: self.echo(msg), who="the learner")
        self.run_id = self.db(lambda: store.create_run(cfg.run, algorithm=cfg.algorithm, config=cfg.masked()))
        # the view of the groups the method never trains (Method.drops) is readable, or a clear stop
        self.db(lambda: work.check_drops(store, self.method.name, self.method.drops))
        # the run's own places: <checkpoint_dir>/<name>.r<id>, <checkpoint_url>/<name>.r<id>, ...
        self.ckpt_dir, self.ckpt_url, self.ckpt_read_url = run_places(
            self.run_id, cfg.run, Path(self.L.checkpoint_dir or storage.local_dir(self.L.checkpoint_url)
                                       or home() / "checkpoints").expanduser().resolve(),
            storage.remote_url(self.L.checkpoint_url), self.L.checkpoint_read_url)
        self.step_no = 0
        self.checkpoints: Checkpointer | None = None  # built in setup(), with the engine
        self.bad_in_row = 0
        self.stopping = False
        self.hooks = None  # the method's stateful part, built in setup()
        self._max_steps: int | None = None  # of the current run(), for the progress line

    # ------------------------------------------------------------------ setup and resume

    def setup(self) -> None:
        """Load the model, resume from the last published state (or publish version 0)."""
        n_rows = self.L.groups_per_step * self.cfg.collector.group_size
        micro = min(self.L.micro_batch_size, n_rows)
        self.n_micro = math.ceil(n_rows / micro)
        settings = EngineSettings(
            device=self.L.device, zero_stage=self.L.zero_stage, micro_batch_size=micro,
            accumulation_steps=self.n_micro, lr=self.L.lr, weight_decay=self.L.weight_decay,
            grad_clip=self.L.grad_clip, dtype=self.L.dtype, fsync=self.L.fsync_publish,
            activation_checkpointing=self.L.activation_checkpointing, packing=self.L.packing,
            offload_optimizer=self.L.offload_optimizer, offload_params=self.L.offload_params,
            publish_shard_bytes=self.L.publish_shard_mb << 20,
            dist_timeout_s=self.L.dist_timeout_s,
        )
        latest, stateful = find_resume(self.store, self.run_id, self.cfg.run, self.db)
        resume = stateful is not None
        uses_ref = any(spec.uses_reference(t.params) for spec, t in zip(self.specs, self.terms))
        longest = self.cfg.collector.sampling.max_new_tokens  # the prompt is not counted (trainer/fit.py)
        fit = FitCheck(tokens_per_pass(self.L.micro_batch_tokens, micro, longest), longest_row=longest,
                       reference_model=uses_ref) if self.L.fit_check else None
        self.engine = TrainingEngine(self.base_model, settings, say=lambda msg: self.echo(msg), fit=fit)
        # Where the time goes (PHASES). On a GPU each phase boundary synchronises, so kernels are
        # charged to the phase that queued them; the micro-batches within a phase run unsynchronised.
        device = torch.device(self.engine.device)
        self.timer = PhaseTimer(sync=(lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None)
        # Data parallel: rank 0 chooses the groups and alone writes to the store and MLflow.
        self.rank, self.world = self.engine.rank, self.engine.world_size
        self.main = self.rank == 0
        if not self.main:
            self.echo = lambda msg: None
        self.ref = self._reference_model() if uses_ref else None
        self.checkpoints = Checkpointer(
            self.store, self.run_id, self.cfg.run, self.ckpt_dir, self.engine, state_every=self.L.state_every,
            keep_states=self.L.keep_states, keep_policies=self.L.keep_policies, main=self.main, db=self.db,
            echo=lambda msg: self.echo(msg), background=self.L.publish_in_background,
            url=self.ckpt_url, storage_options=self.L.checkpoint_storage_options,
            upload_retry_s=self.L.upload_retry_s, read_url=self.ckpt_read_url,
            shared=shm.for_run(self.L.shared_memory_publish, self.L.shared_memory_dir, self.ckpt_dir.name,
                               echo=lambda msg: self.echo(msg)))
        self.update = PolicyUpdate(self.engine, self.terms, self.specs, ref=self.ref, rank=self.rank, world=self.world,
                                   n_micro=self.n_micro, lr=self.L.lr, pi_old=self.L.pi_old, temperature=self.temperature,
                                   max_tokens=self.L.micro_batch_tokens, packed=self.engine.packed,
                                   timer=self.timer, record_signals=self.L.record_token_signals)
        self.scorer = Scorer(self.engine, world=self.world, micro_batch_size=self.L.micro_batch_size,
                             temperature=self.temperature)
        if self.main:
            settings = {
                "learner.groups_per_step": self.L.groups_per_step, "learner.publish_every": self.L.publish_every,
                "learner.max_staleness": self.cfg.max_staleness, "learner.max_reuse": self.L.max_reuse,
                "learner.imported_per_step": self.L.imported_per_step,
                **self.method.settings(self.cfg),
            }
            self.db(lambda: self.store.set_settings(self.run_id, settings))
            from reflexdb.models import model_display_name

            hidden = getattr(getattr(self.engine.ds.module, "config", None), "hidden_size", None)
            if hidden:  # what collectors' embeddings measure: recorded for those that may not record it
                self.db(lambda: self.store.record_embedding_dim(self.run_id, int(hidden),
                                                                model_display_name(self.base_model)))
        self.checkpoints.prepare()
        if resume:
            self.step_no, rolled = self.checkpoints.restore(latest, stateful)
            self.tracker = Tracker(self.cfg, resume_run_id=latest.meta.get("mlflow_run_id")) if self.main \
                else NullTracker()
            self.echo(f"resumed run {self.cfg.run!r} at step {self.step_no} (learner state of policy "
                      f"v{stateful.version}); rolled back {rolled} unpublished step(s)")
            if latest.version > stateful.version:
                # Versions after the newest state (learner.state_every) were trained by steps that
                # are rolled back now: publish the restored weights as a newer version, so that
                # collectors sample from what the learner trains on again.
                self.echo(f"policies v{stateful.version + 1}..v{latest.version} have no learner state "
                          f"(learner.state_every {self.L.state_every}): their steps were rolled back; the "
                          f"weights of step {self.step_no} are published again")
                self.publish(state=False)
                self.checkpoints.wait()  # recorded before the first step
        else:
            self.checkpoints.roll_back_after(0)
            self.tracker = Tracker(self.cfg) if self.main else NullTracker()
            self.tracker.log_config()
            if self.main:  # evaluations made before this run existed (reflexdb run: the base model's)
                self.tracker.log_evaluations(self.store, self.run_id)
            if latest is None:
                self.publish()  # version 0: the base model, so collectors and resume have a start
            else:  # versions without any learner state (recorded by another writer): start from the base
                self.checkpoints.adopt(latest)
            self.echo(f"learner for run {self.cfg.run!r}: method {self.method.name} (loss {self.cfg.loss_family}), "
                      f"{self.L.groups_per_step} groups/step, publish every {self.L.publish_every}, "
                      f"{self.engine.settings.dtype}, {'packed' if self.engine.packed else 'padded'} rows")
        if self.method.hooks is not None:
            self.hooks = self.method.hooks(self.cfg, self)
            if hasattr(self.hooks, "setup"):
                self.hooks.setup()
        self.sources: list[BatchSource] = [MethodGroups(self.store, self.run_id, getattr(self.hooks, "select", None),
                                                        drops=self.method.drops)]
        if self.L.imported_per_step:
            self.sources.append(ImportedGroups(self.store, self.run_id, self.L.imported_per_step))

    @property
    def version(self) -> int:
        """The newest published policy version (0 before setup)."""
        return self.checkpoints.version if self.checkpoints is not None else 0

    def _reference_model(self):
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(self.base_model).to(self.engine.device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # ------------------------------------------------------------------ the loop

    def run(self, *, max_steps: int | None = None, max_seconds: float | None = None) -> None:
        max_steps = max_steps if max_steps is not None else self.L.max_steps
        self._max_steps = max_steps
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while self.world > 1 or not self.stopping:  # with ranks, rank 0 decides for all when to stop
                if max_steps is not None and self.step_no >= max_steps:
                    break
                # every rank trains on the groups rank 0 chose (None: stopped, or out of time while waiting);
                # the others hear from it while it waits (trainer/ranks.py)
                chosen = ranks.from_rank0(lambda until: self._choose(deadline, until), rank=self.rank,
                                          world=self.world, beat_s=self.L.dist_timeout_s / 4)
                if chosen is None:
                    break
                result = self.step(chosen.group_ids, snapshot=chosen.snapshot, extra=chosen.extra)
                self.echo(self._progress(result))
                if self.step_no % self.L.publish_every == 0 and not result.skipped:
                    self.publish()
                if hasattr(self.hooks, "after_step"):
                    self.hooks.after_step(result.metrics)
        finally:
            try:
                self.checkpoints.wait()  # every version published is recorded when run returns
            finally:
                self.tracker.close()

    def finish(self) -> None:
        """On a clean stop: publish what was trained since the last publish, with the learner state
        (:meth:`Checkpointer.finish`)."""
        self.checkpoints.finish(self.step_no, tracker=self.tracker)

    def _choose(self, deadline: float | None, until: float | None) -> Selection | str | None:
        """Rank 0's choice of the step's groups: None to stop (stopped, out of time), or
        ``ranks.WAITING`` at ``until`` if there are none yet (:func:`ranks.from_rank0`)."""
        if not self.stopping and (deadline is None or time.monotonic() < deadline):
            if until is None:
                return self.wait_for_groups(deadline)
            chosen = self.wait_for_groups(until if deadline is None else min(deadline, until))
            if chosen is not None:
                return chosen
            if not self.stopping and (deadline is None or time.monotonic() < deadline):
                return ranks.WAITING
        if self.stopping and self.world > 1:  # a signal's handler says nothing with ranks (trainer/cli_entry.py)
            self.echo(f"stopping after step {self.step_no}: every rank publishes, then stops (resume with the "
                      "same command)")
        return None

    def wait_for_groups(self, deadline: float | None) -> Selection | None:
        """Block until ``groups_per_step`` eligible groups exist in the batch sources
        (trainer/sources.py); ``None`` if stopped or out of time."""
        n = self.L.groups_per_step
        last_said = time.monotonic()
        drill.phase("wait")
        while not self.stopping:
            with self.timer("read"):
                # The newest group before choosing: the wait below is for groups newer than every
                # group this choice could see (eligible or not), so groups that exist but are not
                # eligible (consumed, too stale) do not wake it at once, again and again.
                newest = self.db(lambda: self.store.newest_group_id(self.run_id))
                chosen = choose(self.sources, n, self.version - self.cfg.max_staleness, self.db)
            ids = chosen.group_ids
            if len(ids) >= n:
                return chosen
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if time.monotonic() - last_said >= self.L.wait_log_every_s:
                self.echo(f"waiting for groups: {len(ids)} of {n} eligible (policy v{self.version}, "
                          f"max_staleness {self.cfg.max_staleness}); are collectors running?")
                last_said = time.monotonic()
            timeout = self.L.poll_interval_s if deadline is None else max(0.0, min(self.L.poll_interval_s,
                                                                                  deadline - time.monotonic()))
            # Returns when enough groups with newer ids exist (NOTIFY), else after poll_interval_s;
            # either way the next choice looks at the whole staleness window again, so a group
            # committed late under an older id is taken at the next poll at the latest.
            with self.timer("wait"):
                self.db(lambda: self.store.wait_for_groups(self.run_id, newest, min_count=n - len(ids),
                                                           timeout=timeout, poll_interval=self.L.poll_interval_s))
        return None

    def step(self, group_ids: list[int], *, snapshot: str | None = None, extra: list[int] = ()) -> StepResult:
        """One learner step on the given groups (see the module docstring); ``snapshot``: what the
        query that chose them could see (recorded with the step); ``extra``: a method's auxiliary
        rows (``Selection.extra``)."""
        t0 = time.monotonic()
        drill.phase("step")
        with self.timer("read"):
            groups = self.db(lambda: self.store.read_groups(group_ids, turns=False))     # sample
            aux = self.db(lambda: self.store.read_trajectories(extra, turns=False)) if extra else []
            batch = pack(groups, self.engine.pad_id, aux, origins=self.store.origins())
            if self.n_micro > 1:  # micro-batches of similar lengths pad less; the ranks' shares stay even
                batch = batch.by_length(self.world)
        t_batch = time.monotonic() - t0
        stages = advantage_stages(batch.rewards, batch.group_index, self.transforms,  # advantages
                                  scale=self.cfg.advantage_scale, valid=batch.valid)
        adv = stages[-1][1]  # [B]  after the group normalisation and every transform
        with self.timer("forward_backward"):  # the optimizer step inside is phase "optimizer"
            stats, grad_norm, entropy = self.update.run(batch, adv)                   # π_old, loss, step
        signals = self.token_signals()
        skipped = not math.isfinite(stats["loss"])
        self.bad_in_row = self.bad_in_row + 1 if skipped else 0
        self.step_no += 1
        metrics = self.metrics(batch, groups, stats, grad_norm, entropy, t_batch, time.monotonic() - t0,
                               self.timer.lap())
        # The loss of a group-normalised step averages to about 0 by construction (the advantages of a
        # group sum to 0): the size of the learning signal is the advantages' magnitude, not the loss.
        metrics.update(advantage_stats(adv, batch.valid, batch.auxiliary))
        if skipped:
            self.echo(f"step {self.step_no}: non-finite loss, step skipped ({self.bad_in_row} in a row)")
        if self.main:
            metrics.update(self.collector_metrics())
            drill.phase("record")
            by_stage = batch.per_trajectory(torch.stack([a.reshape(-1) for _, a in stages], dim=1))  # [B, S]
            self.db(lambda: self.store.record_step(                                   # record
                self.run_id, self.step_no, self.version, batch.trajectory_ids, loss=None if skipped else stats["loss"],
                metrics={k: v for k, v in metrics.items() if math.isfinite(v)}, batch_snapshot=snapshot,
                advantages=by_stage, advantage_stages=[name for name, _ in stages], token_signals=signals))
            self.tracker.log_metrics(metrics, self.step_no)
        if self.bad_in_row >= self.L.max_bad_steps:
            raise LearnerStopped(
                f"{self.bad_in_row} learner steps in a row had a non-finite loss; stopping. The last published "
                f"policy is v{self.version}; lower learner.lr or check the data (reflexdb sql) before resuming."
            )
        return StepResult(self.step_no, stats["loss"], skipped, metrics)

    def token_signals(self) -> dict[int, TokenSignals] | None:
        """What the step's loss used at each token of each row, by trajectory id (rank 0; every
        rank's rows gathered there), or None when ``learner.record_token_signals`` is off. A
        trajectory in the batch twice (a group's row and a method's auxiliary row) keeps its
        group row's."""
        if self.update.signals is None:
            return None
        rows = signal_rows(self.update.rows_of_step, self.update.signals)
        if self.world > 1:
            gathered = [None] * self.world if self.main else None
            torch.distributed.gather_object(rows, gathered, dst=0)
            rows = [r for part in gathered or [] for r in part]
        out: dict[int, TokenSignals] = {}
        for tid, auxiliary, sig in sorted(rows, key=lambda r: r[1]):  # group rows first
            out.setdefault(tid, sig)
        return out

    # ------------------------------------------------------------------ what a method's hooks use

    def log_step_metrics(self, metrics: dict[str, float]) -> None:
        """Metrics computed after the step (rank 0): to MLflow, and merged into the step's row."""
        self.tracker.log_metrics(metrics, self.step_no)
        # the step's row holds them too (SQL without MLflow)
        self.db(lambda: self.store.add_step_metrics(self.run_id, self.step_no, metrics))

    # ------------------------------------------------------------------ publishing

    def publish(self, *, state: bool | None = None) -> None:
        """Publish the current weights as the next version (:meth:`Checkpointer.publish`)."""
        with self.timer("publish"):
            self.checkpoints.publish(self.step_no, state=state, tracker=self.tracker)

    # ------------------------------------------------------------------ metrics

    def metrics(self, batch: Batch, groups, stats: dict, grad_norm, entropy: float, t_batch: float,
                t_step: float, phases: dict[str, float]) -> dict[str, float]:
        """The step's metrics (docs/metrics.md); ``phases``: seconds per phase since the previous
        step's metrics (:meth:`PhaseTimer.lap`)."""
        m: dict[str, float] = {f"loss/{k}": v for k, v in stats.items()}
        valid = batch.valid
        m["reward/mean"] = float(batch.rewards[valid].mean()) if valid.any() else float("nan")
        own = batch.where_origin(pass_at_1=True)  # what the policy sampled on the plain prompt (reflexdb/origins.py)
        m["reward/pass_at_1"] = float(batch.correct[own].float().mean()) if own.any() else float("nan")
        m["reward/missing"] = float((~valid).sum())
        classes = {"none": 0, "some": 0, "all": 0}
        for g in groups:
            c = sum(bool(t.correct) for t in g.trajectories)
            classes["none" if c == 0 else "all" if c == len(g.trajectories) else "some"] += 1
        for k, v in classes.items():
            m[f"groups/{k}_pass"] = float(v)
        if hasattr(self.hooks, "metrics"):
            m.update(self.hooks.metrics(batch, groups))
        stale = [self.version - v for v, k in zip(batch.group_versions, batch.group_kinds)
                 if k not in ("imported", AUXILIARY)]
        m["staleness/mean"] = sum(stale) / len(stale) if stale else 0.0  # imported groups have no version
        m["staleness/max"] = float(max(stale, default=0))
        for src in self.sources:
            m.update(src.metrics(batch))
        m["policy/entropy"] = entropy
        if grad_norm is not None:
            m["policy/grad_norm"] = grad_norm
        n_tokens = float(batch.response_mask.sum())
        m["perf/tokens_per_s"] = n_tokens / max(t_step, 1e-9)
        m["perf/trajectories_per_s"] = batch.size / max(t_step, 1e-9)
        m["perf/batch_seconds"] = t_batch
        m["perf/step_seconds"] = t_step
        for phase in PHASES:  # since the previous step's metrics: its publish and this step's wait count here
            m[f"perf/seconds_{phase}"] = phases.get(phase, 0.0)
        return {k: (v if math.isfinite(v) else float("nan")) for k, v in m.items()}

    def collector_metrics(self) -> dict[str, float]:
        """Where the run's collectors spent their time (docs/metrics.md): their heartbeats' totals
        (``collectors.phase_seconds``, 0026) summed over collectors, as ``collector/seconds_<phase>``,
        ``collector/wall_seconds`` and ``collector/generated_tokens_per_s``; collectors log nothing
        to MLflow themselves, so the learner does it for them."""
        from reflexdb import work

        totals = self.db(lambda: work.collector_phases(self.store, self.run_id))
        if not totals:
            return {}
        m = {f"collector/seconds_{k}": v for k, v in totals.items() if k not in ("wall", "tokens", "fetch_failures")}
        if "fetch_failures" in totals:  # versions fetched from learner.checkpoint_url (collector/fetch.py)
            m["collector/checkpoint_fetch_failures"] = totals["fetch_failures"]
        m["collector/wall_seconds"] = totals.get("wall", 0.0)
        generating = totals.get("generate", 0.0)
        m["collector/generated_tokens_per_s"] = totals.get("tokens", 0.0) / generating if generating > 0 else float("nan")
        return m

    def _method_progress(self, m: dict[str, float]) -> str:
        """The method's part of the progress line (``Hooks.progress``), if it has one."""
        return self.hooks.progress(m) if hasattr(self.hooks, "progress") else ""

    def _progress(self, r: StepResult) -> str:
        m = r.metrics
        of = f"/{self._max_steps}" if self._max_steps else ""
        p1 = m["reward/pass_at_1"]  # NaN: no row the policy sampled (e.g. imported groups only)
        return (f"step {r.step}{of} | loss {r.loss:.4f} | reward {m['reward/mean']:.3f} | pass@1 "
                f"{'-' if math.isnan(p1) else f'{p1:.3f}'} "
                f"| groups none/some/all {int(m['groups/none_pass'])}/{int(m['groups/some_pass'])}/"
                f"{int(m['groups/all_pass'])} | staleness {m['staleness/mean']:.2f} (max {int(m['staleness/max'])}) "
                f"| v{self.version} | {m['perf/trajectories_per_s']:.2f} traj/s, {m['perf/tokens_per_s']:.0f} tok/s"
                + (f" | {own}" if (own := self._method_progress(m)) else "")
                + (f" | imported {int(m['imported/groups'])}" if m.get("imported/groups") else "")
                + f" | {self.timer.summary(PHASES)}")
