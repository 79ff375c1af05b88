"""``reflexdb learn``: the asynchronous learner.

One step reads top to bottom (:meth:`Learner.step`)::

    groups  = the method's batch rule (default: oldest eligible groups of view learner_eligible,
              staleness and reuse rules)
    batch   = padded tensors (prompt ⊕ response, loss mask, behaviour log-probs)
    old     = π_old log-probs: recomputed under the weights at the step's start, or behaviour;
              rows sampled in another context always use their behaviour log-probs (π_beh;
              the table of origins, reflexdb/origins.py)
    adv     = group-normalised advantages (float64; NULL rewards left out), then the method's transforms
    loss    = the method's loss terms over micro-batches (gradient accumulation), each micro-batch
              weighted by its share of each term's normaliser; backward, optimizer step
    record  = learner_steps row + the trajectories consumed (one transaction)
    publish = every k steps: DeepSpeed state, HF safetensors, policy_versions row + NOTIFY
    after   = the method's hooks (trainer/methods/), if any

Resume is from the last *published* state: steps recorded after it are rolled back (their
consumption deleted, times_sampled restored), so nothing is consumed twice or skipped.

Every database call rides out an outage of up to ``learner.db_retry_s`` (reflexdb.retry). A step
whose consumption could not be recorded is never published (the process stops first, and resume
rolls it back), and a version is only what its ``policy_versions`` row says: files first, each
version in new directories renamed into place when complete, the row last.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from reflexdb import Store, drill
from reflexdb.config import Config
from reflexdb.errors import ReflexdbError
from reflexdb.logprobs import response_logprobs
from reflexdb.retry import DbRetry
from reflexdb.settings import home, make_dirs
from reflexdb.sqlfile import load_queries
from reflexdb.tracking import Tracker

from .advantages import apply_advantage_transforms, group_advantages
from .batch import (
    AUXILIARY,
    Batch,
    Selection,
    eligible_group_ids,
    eligible_imported_ids,
    mix_imported,
    pack,
    pack_sequences,
)
from .engine import EngineSettings, StateUnreadable, TrainingEngine, clean_partial_files
from .losses.registry import get_loss_spec

Q = load_queries("learner.sql")

log = logging.getLogger("reflexdb.learn")

def _write_error(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def _free_space(path: Path) -> str:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 2**20:,.0f} MiB free in {path}"
    except OSError:
        return f"free space in {path} unknown"


class NullTracker:
    """What ranks other than 0 log to: nothing."""

    run_id = None

    def log_config(self) -> None: ...

    def log_metrics(self, metrics, step) -> None: ...

    def close(self, status: str = "FINISHED") -> None: ...


class LearnerStopped(ReflexdbError):
    """The learner stopped on purpose after repeated bad steps; the message says why."""


class PublishFailed(ReflexdbError):
    """Writing a version's files failed (disk full, I/O error); nothing was recorded for it."""

    exit_code = 8


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
        self.method = cfg.method  # trainer/methods/: batch rule, transforms, loss terms, hooks
        self.terms = self.method.loss_terms(cfg, cfg.loss_params)
        self.specs = [get_loss_spec(t.loss) for t in self.terms]
        self.transforms = self.method.transforms(cfg) if self.method.transforms else []
        self.temperature = cfg.collector.sampling.temperature or 1.0
        self.base_model = resolve_model(cfg.model)
        # Every database call below goes through db(): an outage of up to db_retry_s is waited out.
        self.db = DbRetry(self.L.db_retry_s, lambda msg: self.echo(msg), who="the learner")
        self.run_id = self.db(lambda: store.create_run(cfg.run, algorithm=cfg.algorithm, config=cfg.masked()))
        self.ckpt_dir = Path(self.L.checkpoint_dir or home() / "checkpoints" / cfg.run).expanduser().resolve()
        self.step_no = 0
        self.version = 0
        self.published_step = 0  # the step of the newest published version (a stop publishes only past it)
        self.published_any = False  # whether any version exists (the first publish is version 0)
        self.since_state = 0  # publishes since the last one that wrote the learner state
        self.last_has_state = True
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
        )
        latest = self.db(lambda: self.store.latest_policy(self.run_id))
        stateful = latest if latest is None or latest.meta.get("learner_state") else \
            self.db(lambda: self.store.latest_policy(self.run_id, with_state=True))
        resume = stateful is not None
        if resume:
            self._check_state(stateful)
        self.engine = TrainingEngine(self.base_model, settings, say=lambda msg: self.echo(msg))
        # Data parallel: rank 0 chooses the groups and alone writes to the store and MLflow.
        self.rank, self.world = self.engine.rank, self.engine.world_size
        self.main = self.rank == 0
        if not self.main:
            self.echo = lambda msg: None
        uses_ref = any(spec.uses_reference(t.params) for spec, t in zip(self.specs, self.terms))
        self.ref = self._reference_model() if uses_ref else None
        if self.main:
            settings = {
                "learner.groups_per_step": self.L.groups_per_step, "learner.publish_every": self.L.publish_every,
                "learner.max_staleness": self.cfg.max_staleness, "learner.max_reuse": self.L.max_reuse,
                "learner.imported_per_step": self.L.imported_per_step,
                **self.method.settings(self.cfg),
            }
            self.db(lambda: self.store.set_settings(self.run_id, settings))
            make_dirs(self.ckpt_dir)
            # Leftovers of publishes that were killed or failed (never referenced by a row).
            for path in clean_partial_files(self.ckpt_dir):
                self.echo(f"removed {path}, left by a publish that did not finish")
        if resume:
            try:
                client = self.engine.load_state(stateful.meta["learner_state"], stateful.meta["state_tag"])
            except StateUnreadable as exc:
                raise ReflexdbError(
                    f"cannot resume run {self.cfg.run!r}: the learner state of policy v{stateful.version} is damaged "
                    f"({exc}). Nothing was changed; restore the directory from a backup, or start a new run name."
                ) from None
            self.step_no = int(client["step"])
            self.version = latest.version
            self.published_step = self.step_no
            self.published_any = True
            rolled = self.db(lambda: self._roll_back_after(self.step_no)) if self.main else 0
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
        else:
            if self.main:
                self.db(lambda: self._roll_back_after(0))
            self.tracker = Tracker(self.cfg) if self.main else NullTracker()
            self.tracker.log_config()
            if self.main:  # evaluations made before this run existed (reflexdb run: the base model's)
                self.tracker.log_evaluations(self.store, self.run_id)
            if latest is None:
                self.publish()  # version 0: the base model, so collectors and resume have a start
            else:  # versions without any learner state (recorded by another writer): start from the base
                self.version = latest.version
                self.published_any = True
            self.echo(f"learner for run {self.cfg.run!r}: method {self.method.name} (loss {self.cfg.loss_family}), "
                      f"{self.L.groups_per_step} groups/step, publish every {self.L.publish_every}")
        if self.method.hooks is not None:
            self.hooks = self.method.hooks(self.cfg, self)
            if hasattr(self.hooks, "setup"):
                self.hooks.setup()

    def _check_state(self, policy) -> None:
        state = Path(policy.meta["learner_state"]) / policy.meta["state_tag"]
        if not state.is_dir():
            raise ReflexdbError(
                f"cannot resume run {self.cfg.run!r}: the learner state of policy v{policy.version} "
                f"({state}) is missing. Nothing was changed; restore the directory, or start a new run name."
            )

    def _reference_model(self):
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(self.base_model).to(self.engine.device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _roll_back_after(self, step: int) -> int:
        """Delete this run's steps after ``step`` and restore the consumed trajectories' counts."""
        with self.store.transaction() as conn:
            conn.execute(Q["roll_back_consumption"], {"run_id": self.run_id, "step": step})
            return conn.execute(Q["delete_steps_after"], {"run_id": self.run_id, "step": step}).rowcount

    # ------------------------------------------------------------------ the loop

    def run(self, *, max_steps: int | None = None, max_seconds: float | None = None) -> None:
        max_steps = max_steps if max_steps is not None else self.L.max_steps
        self._max_steps = max_steps
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while not self.stopping:
                if max_steps is not None and self.step_no >= max_steps:
                    break
                chosen = None
                if self.main and (deadline is None or time.monotonic() < deadline):  # rank 0 decides for all
                    chosen = self.wait_for_groups(deadline)  # None: stopped, or out of time while waiting
                if self.world > 1:  # every rank trains on the groups rank 0 chose
                    box = [chosen]
                    torch.distributed.broadcast_object_list(box, src=0)
                    chosen = box[0]
                if chosen is None:
                    break
                result = self.step(chosen.group_ids, snapshot=chosen.snapshot, extra=chosen.extra)
                self.echo(self._progress(result))
                if self.step_no % self.L.publish_every == 0 and not result.skipped:
                    self.publish()
                if hasattr(self.hooks, "after_step"):
                    self.hooks.after_step(result.metrics)
        finally:
            self.tracker.close()

    def finish(self) -> None:
        """On a clean stop: publish the steps trained since the last publish, with the learner
        state; if none, and the last publish wrote no state (``learner.state_every``), write it for
        that version, so that a resume loses no step."""
        if self.step_no > self.published_step:
            self.publish(state=True)
        elif not self.last_has_state:
            self._attach_state()

    def _attach_state(self) -> None:
        """Write the learner state of the newest version (published without one) and record it."""
        states, tag = self.ckpt_dir / "states", f"v{self.version}"
        with self._writing(f"writing the learner state of policy v{self.version}",
                           "A resume starts from the newest version with a state.", states / tag):
            self.engine.save_state(states, tag, {"step": self.step_no, "version": self.version})
        if self.main:
            meta = json.dumps({"learner_state": str(states), "state_tag": tag})

            def attach() -> None:
                with self.store.transaction() as conn:
                    conn.execute(Q["attach_state"], {"meta": meta, "run_id": self.run_id, "version": self.version})

            self.db(attach)
            self._prune_states(states)
        self.last_has_state = True
        self.echo(f"wrote the learner state of policy v{self.version} (step {self.step_no})")

    def wait_for_groups(self, deadline: float | None) -> Selection | None:
        """Block until ``groups_per_step`` eligible groups exist; ``None`` if stopped or out of time.

        With ``learner.imported_per_step`` k > 0, up to k of them are the oldest eligible imported
        groups, and the method's rule chooses the rest.
        """
        n = self.L.groups_per_step
        select = getattr(self.hooks, "select", None) or (
            lambda n, min_version: eligible_group_ids(self.store, self.run_id, n, min_version=min_version))
        last_said = time.monotonic()
        drill.phase("wait")
        while not self.stopping:
            imported = self.db(lambda: eligible_imported_ids(self.store, self.run_id, self.L.imported_per_step))
            chosen = self.db(lambda: select(n - len(imported), self.version - self.cfg.max_staleness))
            ids = chosen.group_ids + imported
            if len(ids) >= n:
                return mix_imported(chosen, imported)
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
            self.db(lambda: self.store.wait_for_groups(self.run_id, max(ids, default=0), min_count=n - len(ids),
                                                       timeout=timeout, poll_interval=self.L.poll_interval_s))
        return None

    def step(self, group_ids: list[int], *, snapshot: str | None = None, extra: list[int] = ()) -> StepResult:
        """One learner step on the given groups (see the module docstring); ``snapshot``: what the
        query that chose them could see (recorded with the step); ``extra``: a method's auxiliary
        rows (``Selection.extra``)."""
        t0 = time.monotonic()
        drill.phase("step")
        groups = self.db(lambda: self.store.read_groups(group_ids, turns=False))     # sample
        aux = self.db(lambda: self.store.read_trajectories(extra, turns=False)) if extra else []
        batch = pack(groups, self.engine.pad_id, aux, origins=self.store.origins())
        if self.n_micro > 1:  # micro-batches of similar lengths pad less; the ranks' shares stay even
            batch = batch.by_length(self.world)
        t_batch = time.monotonic() - t0
        adv = group_advantages(batch.rewards, batch.group_index,                      # advantages
                               scale=self.cfg.advantage_scale, valid=batch.valid)
        if self.transforms:
            adv = apply_advantage_transforms(batch.rewards, adv, batch.group_index, self.transforms,
                                             valid=batch.valid)
        rows = [t.rows(batch) for t in self.terms]                                    # each term's rows
        masks = [t.mask(batch) if t.mask is not None else None for t in self.terms]   # ... and tokens
        mine = self._shard(batch.size)                                                # this rank's rows
        part = batch.rows(mine)
        old, fresh = self.old_logprobs(part)                                          # π_old
        ref = self.ref_logprobs(part)
        stats, grad_norm, entropy = self.optimize(part, old, ref, adv[mine], full=batch,  # loss, step
                                                  rows=rows, mine=mine, fresh=fresh, masks=masks)
        skipped = not math.isfinite(stats["loss"])
        self.bad_in_row = self.bad_in_row + 1 if skipped else 0
        self.step_no += 1
        metrics = self.metrics(batch, groups, stats, grad_norm, entropy, t_batch, time.monotonic() - t0)
        # The loss of a group-normalised step averages to about 0 by construction (the advantages of a
        # group sum to 0): the size of the learning signal is the advantages' magnitude, not the loss.
        a = adv.detach().abs()[batch.valid] if batch.valid.any() else adv.new_zeros(1)
        metrics["advantage/abs_mean"] = float(a.mean())
        metrics["advantage/nonzero_frac"] = float((a > 1e-12).float().mean())
        if skipped:
            self.echo(f"step {self.step_no}: non-finite loss, step skipped ({self.bad_in_row} in a row)")
        if self.main:
            drill.phase("record")
            self.db(lambda: self.store.record_step(                                   # record
                self.run_id, self.step_no, self.version, batch.trajectory_ids, loss=None if skipped else stats["loss"],
                metrics={k: v for k, v in metrics.items() if math.isfinite(v)}, batch_snapshot=snapshot))
            self.tracker.log_metrics(metrics, self.step_no)
        if self.bad_in_row >= self.L.max_bad_steps:
            raise LearnerStopped(
                f"{self.bad_in_row} learner steps in a row had a non-finite loss; stopping. The last published "
                f"policy is v{self.version}; lower learner.lr or check the data (reflexdb sql) before resuming."
            )
        return StepResult(self.step_no, stats["loss"], skipped, metrics)

    # ------------------------------------------------------------------ pieces of a step

    def _shard(self, n_rows: int) -> slice:
        """This rank's contiguous share of a step's rows."""
        per = math.ceil(n_rows / self.world)
        return slice(min(self.rank * per, n_rows), min((self.rank + 1) * per, n_rows))

    def _all_reduce(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.engine.device)  # NCCL reduces CUDA tensors only
        torch.distributed.all_reduce(t)
        return t.cpu().tolist()

    def _slices(self, batch: Batch) -> list[slice]:
        """Exactly ``n_micro`` row slices (the accumulation count DeepSpeed was configured with),
        whatever the batch size: groups may differ in size (replay, a collector with another G)."""
        size = math.ceil(batch.size / self.n_micro)
        return [slice(i * size, min((i + 1) * size, batch.size)) for i in range(self.n_micro)]

    def old_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The ratio denominator per token: ``(old [B, T], fresh [B])``.

        The table of origins (reflexdb/origins.py) says what π_old is for each row: ``old`` holds
        the stored behaviour log-probs π_beh, used for every row whose origin's π_old is
        ``stored`` (tokens sampled in another context or earlier) and, with ``learner.pi_old:
        behaviour``, for the policy's own rows too. ``fresh`` marks the rows whose π_old is the policy at the
        step's start (``pi_old: recompute``): a step takes exactly one optimizer step, after all
        its micro-batches, so the weights at the step's start are the weights of the training
        forward, and :meth:`optimize` takes those rows' π_old from that forward (detached) instead
        of running a second, no-grad forward over the batch. The values are the same; the
        forward pass is saved (docs/benchmarks.md, "reflexdb against TRL").

        Rows whose origin's π_old is ``learner`` (imported: no behaviour log-probs) always take the
        policy at the step's start.
        """
        stored = batch.where_origin(pi_old="stored")  # π_beh (each method's paper says so for its rows)
        learner = batch.where_origin(pi_old="learner")  # no behaviour log-probs (imported)
        fresh = learner if self.L.pi_old == "behaviour" else ~stored
        return batch.behaviour_logprobs, fresh

    @torch.no_grad()
    def ref_logprobs(self, batch: Batch) -> torch.Tensor | None:
        if self.ref is None:
            return None
        out = torch.zeros_like(batch.behaviour_logprobs)
        for sl in self._slices(batch):
            if sl.start >= sl.stop:
                continue
            mb = batch.rows(sl)
            logits = self.ref(input_ids=mb.input_ids.to(self.engine.device),
                              attention_mask=mb.attention_mask.to(self.engine.device)).logits.float()
            lp, _ = response_logprobs(logits, mb.input_ids.to(logits.device), mb.prompt_lengths.to(logits.device),
                                      mb.response_lengths.to(logits.device), temperature=self.temperature)
            out[sl, :lp.shape[1]] = lp.cpu()
        return out

    def optimize(self, batch: Batch, old: torch.Tensor, ref: torch.Tensor | None, adv: torch.Tensor, *,
                 full: Batch, rows: list[torch.Tensor], mine: slice, fresh: torch.Tensor | None = None,
                 masks: list[torch.Tensor | None] | None = None):
        """The method's loss terms over this rank's micro-batches with gradient accumulation; one
        optimizer step.

        ``fresh`` (``[B]`` bool, :meth:`old_logprobs`): rows whose π_old is this forward's own
        log-probs, detached (the weights move only at the step's end); the others use ``old``.

        Term ``k`` applies its loss to its rows (``rows[k]``, ``[B_full]`` bool) only, and to the
        loss tokens its ``masks[k]`` (``[B_full, T]`` bool, or None: all) keeps of them. Each
        micro-batch's value of a term is weighted by its share of that term's normaliser over the
        whole step (``LossSpec.normaliser``: loss tokens, rows with loss tokens, or rows, after the
        family's own filters; ``full`` is the step's batch over all ranks), so the accumulated
        gradient equals the full batch's whatever ``micro_batch_size`` (trainer/losses/accumulate.py);
        DeepSpeed averages gradients over ranks, so the weight carries a factor ``world``. A
        non-finite loss on any rank skips every backward after it and turns the optimizer step into
        a no-op (zero gradients, learning rate 0): the weights do not move.
        """
        masks = masks or [None] * len(self.terms)
        full_masks = [full.response_mask if m is None else full.response_mask & m for m in masks]  # [B_full, T]
        totals = [spec.normaliser(fm[r], t.params, truncated=full.truncated[r])
                  for spec, t, r, fm in zip(self.specs, self.terms, rows, full_masks)]
        mine_rows = [r[mine] for r in rows]
        mine_masks = [fm[mine] for fm in full_masks]
        total_tokens = float(full.response_mask.sum().clamp(min=1))
        sums: dict[str, float] = {}
        entropy_sum, bad = 0.0, False
        grad_norm = None
        for i, sl in enumerate(self._slices(batch)):
            last = i == self.n_micro - 1
            if sl.start < sl.stop:
                mb = batch.rows(sl)
                T = mb.response_mask.shape[1]
                logprobs, entropy = self.engine.token_logprobs(
                    mb.input_ids, mb.attention_mask, mb.prompt_lengths, mb.response_lengths,
                    temperature=self.temperature, with_entropy=True)
                loss = logprobs.sum() * 0.0  # a micro-batch without rows of any term still joins the accumulation
                mb_old = old[sl][:, :T].to(logprobs.device)
                if fresh is not None:  # π_old = π_θ at the step's start = this forward, no gradient
                    mb_old = torch.where(fresh[sl].to(logprobs.device)[:, None], logprobs.detach(), mb_old)
                for k, (spec, term, total) in enumerate(zip(self.specs, self.terms, totals)):
                    idx = mine_rows[k][sl].nonzero().flatten()
                    if idx.numel() == 0 or total == 0:
                        continue
                    mask, truncated = mine_masks[k][sl][idx, :T], mb.truncated[idx]
                    dev = logprobs.device
                    out = spec.call(logprobs[idx.to(dev)], mb_old[idx.to(dev)], adv[sl][idx].to(dev),
                                    mask.to(dev), term.params, truncated=truncated.to(dev),
                                    ref_logprobs=ref[sl][idx, :T].to(dev) if ref is not None else None)
                    share = spec.normaliser(mask, term.params, truncated=truncated) / total
                    loss = loss + out.loss * (term.weight * share)
                    for name, value in out._asdict().items():
                        if value.numel() == 1 and (name != "loss" or k > 0):
                            key = name if k == 0 else f"{term.name}/{name}"
                            sums[key] = sums.get(key, 0.0) + float(value.detach()) * share
                sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
                if not torch.isfinite(loss):
                    bad = True
                elif not bad:
                    self.engine.backward(loss * self.world)
                entropy_sum += float(entropy.sum())
            if last:
                bad = self._all_reduce([float(bad)])[0] > 0
            if last and bad:
                # Finite (zero) gradients for the boundary step, and a learning rate of 0: AdamW then
                # leaves every weight exactly where it was.
                self.engine.backward(sum(p.sum() for p in self.engine.ds.module.parameters()) * 0.0)
                self._set_lr(0.0)
            grad_norm = self.engine.step()
        names = sorted(sums)
        reduced = self._all_reduce([sums[k] for k in names] + [entropy_sum])
        sums, entropy_sum = dict(zip(names, reduced[:-1])), reduced[-1]
        sums.setdefault("loss", 0.0)
        if bad:
            self._set_lr(self.L.lr)
            sums["loss"] = float("nan")
        return sums, grad_norm, entropy_sum / total_tokens

    def _set_lr(self, lr: float) -> None:
        for g in self.engine.optimizer.param_groups:
            g["lr"] = lr

    # ------------------------------------------------------------------ what a method's hooks use

    def score(self, trajectories) -> list[float]:
        """ℓ_θ of stored trajectories under the current weights (rank 0, inside :meth:`scoring`;
        the other ranks join in through :meth:`serve_scores`)."""
        payload = [(t.prompt_ids, t.response_ids, t.loss_mask) for t in trajectories]
        if self.world > 1:
            torch.distributed.broadcast_object_list([payload], src=0)
        return self._confidences(payload)

    @contextlib.contextmanager
    def scoring(self):
        """Rank 0's scoring session: on leaving, tells the other ranks that no more scoring comes."""
        try:
            yield
        finally:
            if self.world > 1:
                torch.distributed.broadcast_object_list([None], src=0)

    def serve_scores(self) -> None:
        """Ranks other than 0: take part in rank 0's scoring forward passes until it is done."""
        while True:
            box = [None]
            torch.distributed.broadcast_object_list(box, src=0)
            if box[0] is None:
                return
            self._confidences(box[0])

    def log_step_metrics(self, metrics: dict[str, float]) -> None:
        """Metrics computed after the step (rank 0): to MLflow, and merged into the step's row."""
        self.tracker.log_metrics(metrics, self.step_no)

        def add_to_step() -> None:  # the step's row holds them too (SQL without MLflow)
            with self.store.transaction() as conn:
                conn.execute(Q["add_step_metrics"], {"metrics": json.dumps(metrics), "run_id": self.run_id,
                                                     "step": self.step_no})

        self.db(add_to_step)

    @torch.no_grad()
    def _confidences(self, payload: list[tuple]) -> list[float]:
        """``exp(mean_t log π_θ(o_t))`` over each response's loss-masked tokens (a confidence ℓ_θ;
        in an episode the model's own tokens, as the stored confidence), temperature as sampled."""
        out: list[float] = []
        step = max(1, self.L.micro_batch_size)
        for start in range(0, len(payload), step):
            chunk = payload[start:start + step]
            ids, attn, P, T = pack_sequences([(p, r) for p, r, _ in chunk], self.engine.pad_id)
            lp, _ = self.engine.token_logprobs(ids, attn, P, T, temperature=self.temperature, grad=False)
            mask = torch.zeros(lp.shape, dtype=torch.float64)
            for i, (_, r, m) in enumerate(chunk):
                mask[i, :len(r)] = torch.as_tensor(np.ones(len(r), bool) if m is None else m, dtype=torch.float64)
            mask = mask.to(lp.device)
            mean = (lp.double() * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
            out.extend(torch.exp(mean).cpu().tolist())
        return out

    # ------------------------------------------------------------------ publishing

    def publish(self, *, state: bool | None = None) -> None:
        """Save the HF weights and (see ``state``) the learner state, then record the policy version
        (the commit point).

        Files first, row last. Each version's state (``states/vK``) and weights (``vK``) are new
        directories, written under temporary names, flushed to disk and renamed into place when
        complete: a published version's files are never rewritten, and a publish that is killed
        or fails leaves no row, only temporary files that the next start removes. Resume then
        starts from the last version whose row exists and has a state.

        ``state``: write the learner state too; by default at version 0 and every
        ``learner.state_every``-th publish (weights alone are what collectors need: the state,
        with the AdamW moments, is about three times their size).

        Raises:
            PublishFailed: the files could not be written (disk full, I/O error); no row was written.
            DatabaseUnavailable: the row could not be written within ``learner.db_retry_s``.
        """
        version = self.version + 1 if self.published_any else 0
        if state is None:
            state = version == 0 or self.since_state + 1 >= self.L.state_every
        tag = f"v{version}"
        states = self.ckpt_dir / "states"
        weights = self.ckpt_dir / f"v{version}"
        t0 = time.monotonic()
        drill.phase("publish")
        with self._writing(f"publishing policy v{version} at step {self.step_no}",
                           f"Nothing was recorded for v{version}. Free space, then run the same command: the "
                           f"learner resumes from policy v{self.version} (step {self.published_step}).",
                           states / tag, weights):
            if state:
                self.engine.save_state(states, tag, {"step": self.step_no, "version": version})
            sha = self.engine.export_hf(weights)
        if self.main:
            meta = {"mlflow_run_id": self.tracker.run_id}
            if state:
                meta.update(learner_state=str(states), state_tag=tag)
            self.db(lambda: self.store.publish_policy(self.run_id, version, f"file://{weights}", sha256=sha,
                                                      step=self.step_no, meta=meta))
            if state:
                self._prune_states(states)
            self._prune_policies(version)
        self.version = version
        self.published_step = self.step_no
        self.published_any = True
        self.since_state = 0 if state else self.since_state + 1
        self.last_has_state = state
        drill.phase("published")
        self.tracker.log_metrics({"perf/publish_seconds": time.monotonic() - t0, "policy/version": version},
                                 self.step_no)
        self.echo(f"published policy v{version} at step {self.step_no} ({weights})")

    @contextlib.contextmanager
    def _writing(self, what: str, then: str, *partial: Path):
        """Run a checkpoint write; on failure remove what it left (``partial``: no row names those
        files) and raise :class:`PublishFailed` saying ``what`` failed, why, the free space, and
        ``then``. torch.save reports a full disk as RuntimeError, not OSError, so any error counts."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - any write error (see above) becomes PublishFailed
            clean_partial_files(self.ckpt_dir)
            if self.main:
                for path in partial:
                    shutil.rmtree(path, ignore_errors=True)
            raise PublishFailed(
                f"{what} failed: {_write_error(exc)} ({_free_space(self.ckpt_dir)}). {then}") from None

    def _prune_states(self, states: Path) -> None:
        """Delete learner states except those of the newest ``keep_states`` versions (resume reads
        the newest; the rows say which directory is whose, whatever its name)."""
        def recent() -> set[str]:
            with self.store.transaction() as conn:
                return {r[0] for r in conn.execute(Q["recent_state_tags"],
                                                   {"run_id": self.run_id, "k": self.L.keep_states})}

        keep = self.db(recent)
        for old in states.iterdir():
            if old.is_dir() and old.name not in keep and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)

    def _prune_policies(self, newest: int) -> None:
        """Delete published weight directories older than the newest ``keep_policies`` versions.

        Collectors load only the newest version, and resume reads the DeepSpeed state, so old
        ``vK`` directories are only needed by ``reflexdb eval --checkpoint vK``.
        """
        if self.L.keep_policies is None:
            return
        for d in self.ckpt_dir.glob("v*"):
            if d.is_dir() and d.name[1:].isdigit() and int(d.name[1:]) <= newest - self.L.keep_policies:
                shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ metrics

    def metrics(self, batch: Batch, groups, stats: dict, grad_norm, entropy: float, t_batch: float,
                t_step: float) -> dict[str, float]:
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
        if self.L.imported_per_step:
            n_imported = sum(k == "imported" for k in batch.group_kinds)
            m["imported/groups"] = float(n_imported)
            imp = batch.imported & valid
            m["imported/reward_mean"] = float(batch.rewards[imp].mean()) if imp.any() else float("nan")
        m["policy/entropy"] = entropy
        if grad_norm is not None:
            m["policy/grad_norm"] = grad_norm
        n_tokens = float(batch.response_mask.sum())
        m["perf/tokens_per_s"] = n_tokens / max(t_step, 1e-9)
        m["perf/trajectories_per_s"] = batch.size / max(t_step, 1e-9)
        m["perf/batch_seconds"] = t_batch
        m["perf/step_seconds"] = t_step
        return {k: (v if math.isfinite(v) else float("nan")) for k, v in m.items()}

    def _progress(self, r: StepResult) -> str:
        m = r.metrics
        of = f"/{self._max_steps}" if self._max_steps else ""
        p1 = m["reward/pass_at_1"]  # NaN: no row the policy sampled (e.g. imported groups only)
        return (f"step {r.step}{of} | loss {r.loss:.4f} | reward {m['reward/mean']:.3f} | pass@1 "
                f"{'-' if math.isnan(p1) else f'{p1:.3f}'} "
                f"| groups none/some/all {int(m['groups/none_pass'])}/{int(m['groups/some_pass'])}/"
                f"{int(m['groups/all_pass'])} | staleness {m['staleness/mean']:.2f} (max {int(m['staleness/max'])}) "
                f"| v{self.version} | {m['perf/trajectories_per_s']:.2f} traj/s, {m['perf/tokens_per_s']:.0f} tok/s"
                + (f" | replay {m['replay/share']:.2f}" if "replay/share" in m else "")
                + (f" | imported {int(m['imported/groups'])}" if m.get("imported/groups") else ""))
