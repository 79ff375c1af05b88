"""``reflexdb eval``: pass@1 and pass@k of a checkpoint on held-out tasks, with the plain prompt.

Every evaluation sample is stored as a group of kind ``eval`` (never trained on: the learner's
view excludes it), so failures can be inspected with SQL like any other; the numbers go to MLflow
as ``eval/pass_at_1`` and ``eval/pass_at_k`` in a run of the experiment ``reflexdb/<run>``.

pass@k uses the unbiased estimator of Chen et al. (2021): with ``n`` samples of which ``c`` are
correct, ``pass@k = 1 − C(n−c, k) / C(n, k)``; here ``n = k``, so it is 1 when any sample is correct.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


from reflexdb import Store, storage, work
from reflexdb.config import Config
from reflexdb.errors import NotFound, ReflexdbError

log = logging.getLogger("reflexdb.eval")


@dataclass(frozen=True)
class EvalResult:
    label: str
    policy_version: int | None
    split: str
    tasks: int
    samples_per_task: int
    pass_at_1: float
    pass_at_k: float
    mlflow_run_id: str | None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al., 2021, Eq. 1)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def resolve_checkpoint(store: Store, run_id: int, spec: str, base_model, cfg: Config | None = None,
                       echo: Callable[[str], None] | None = None) -> tuple[str, Path | str, int | None]:
    """``base``, ``latest``, ``vN`` (a published version of the run) or a directory → (label, path, version).

    A version in storage (``learner.checkpoint_url``) is fetched into ``$REFLEXDB_HOME/cache/<run>/``
    with ``cfg``'s storage options, its manifest checked against the recorded ``manifest_sha256``
    and every file against the manifest, at most what ``base_model`` can be
    (:func:`reflexdb.storage.size_bound`); ``echo``: where the warning for a version published
    before revision 0029 goes (its weights alone are checked against the database)."""
    from reflexdb.collector.engines.base import checkpoint_path

    if spec == "base":
        return "base", base_model, 0
    if spec == "latest" or (spec.startswith("v") and spec[1:].isdigit()):
        policy = store.latest_policy(run_id) if spec == "latest" else store.get_policy(run_id, int(spec[1:]))
        if policy is None:
            raise NotFound("the run has no published policy yet")
        if storage.is_remote(policy.checkpoint_uri):  # learner.checkpoint_url: fetched into the cache, verified
            return f"v{policy.version}", _fetch(cfg, policy, base_model, echo), policy.version
        path = checkpoint_path(policy.checkpoint_uri)
        if not path.is_dir():
            raise NotFound(f"the weights of policy v{policy.version} ({path}) are gone: the learner keeps only the "
                           "newest learner.keep_policies versions; evaluate a newer one, or set keep_policies: null "
                           "to keep them all")
        try:  # read in place: checked against the row as a collector checks it (a torn shard is never loaded)
            storage.verify_version(path, policy.sha256, policy.manifest_sha256)
        except storage.TornVersion as exc:
            raise storage.TornVersion(f"not evaluating policy v{policy.version}: {exc}") from None
        return f"v{policy.version}", path, policy.version
    path = checkpoint_path(spec)
    if not path.is_dir():
        raise NotFound(f"checkpoint {spec} is not a directory (give base, latest, vN or a model directory)")
    return path.name, path, None


def _fetch(cfg: Config | None, policy, base_model, echo: Callable[[str], None] | None) -> Path:
    """A version in storage, downloaded (or found) in ``$REFLEXDB_HOME/cache/<run>/`` and checked
    against its recorded digests; storage errors are retried for a minute, a version refused for
    its bytes is not."""
    run = cfg.run if cfg is not None else f"run-{policy.run_id}"
    options = storage.options_for(policy.checkpoint_uri, cfg.learner.checkpoint_url,
                                  cfg.learner.checkpoint_storage_options) if cfg is not None else {}
    if policy.manifest_sha256 is None:
        (echo or log.warning)(f"policy v{policy.version} was published before revision 0029: only its weights are "
                              "checked against the database (policy_versions.sha256), its config, tokenizer and chat "
                              "template files only against its manifest in storage")
    # every version evaluated is kept: a collector sharing this home keeps its own newest few
    cache = storage.CheckpointCache(storage.cache_root(run), options, keep=1_000_000,
                                    max_bytes=storage.size_bound(base_model))
    try:
        return storage.fetch_with_retries(cache, policy.checkpoint_uri, policy.version, policy.sha256, limit_s=60,
                                          manifest_sha256=policy.manifest_sha256)
    except storage.Rejected as exc:
        raise storage.Rejected(f"not evaluating policy v{policy.version}: {exc}") from None
    except NotFound:
        raise NotFound(f"the weights of policy v{policy.version} ({storage.mask(policy.checkpoint_uri)}) are gone: "
                       "the learner keeps only the newest learner.keep_policies versions; evaluate a newer one, or "
                       "set keep_policies: null to keep them all") from None


@dataclass
class _EvalContext:
    """What the eval workflow uses (collector/workflows/base.py, CollectContext): one evaluator,
    a fixed checkpoint, the sampling seed of the config (the same samples for every checkpoint)."""

    cfg: Config
    store: Store
    run_id: int
    engine: Any
    version: int
    embedding_model: str
    params: Any
    prompt: Callable
    score: Callable
    make_env: Callable
    name: str = "eval"

    def sample(self, prompts, n):
        return self.engine.generate(prompts, n=n, params=self.params)

    def rollout(self, tasks, n):
        from .episodes import Rollout

        return Rollout(self.engine, self.make_env, lambda: self.params, self.version).run(tasks, n)


def evaluate(cfg: Config, store: Store, checkpoint: str = "latest", *, split: str = "eval", k: int | None = None,
             max_tasks: int | None = None, attempts: int = 1, echo=print) -> EvalResult:
    """pass@1 and pass@k of ``checkpoint``; ``attempts`` > 1 runs each sample as an episode of the
    ``multi_attempt`` environment (up to that many answers, with feedback), so pass@1 is the share
    of episodes solved within ``attempts`` tries."""
    from reflexdb.tracking import Tracker

    from .engines import SamplingParams, make_engine
    from reflexdb.models import resolve_model
    from .deadline import Deadline
    from .rewards import get_reward
    from .sources import build_tasks, prompt_messages
    from .workflows import make_workflow
    from .workflows.eval import EvalTask
    from .workflows.base import score_samples
    from .episodes import environment_factory
    from .environments import parse_options

    k = k or cfg.learner.eval_samples
    run_id = store.create_run(cfg.run, algorithm=cfg.algorithm, config=cfg.masked())
    store.add_tasks(run_id, build_tasks(cfg.tasks)[0])  # idempotent: the collector adds the same ones
    tasks = [EvalTask(*row) for row in work.split_tasks(store, run_id, split, max_tasks)]
    if not tasks:
        raise ReflexdbError(f"run {cfg.run!r} has no tasks in split {split!r} (tasks.eval_size is 0?)")
    label, path, version = resolve_checkpoint(store, run_id, checkpoint, resolve_model(cfg.model, say=echo), cfg, echo)
    reward = Deadline(get_reward(cfg.collector.reward), cfg.collector.reward_timeout_s)  # forked before the engine
    engine = make_engine(cfg.collector.engine, model=path, device=cfg.collector.device,
                         **cfg.collector.engine_options)
    s = cfg.collector.sampling
    params = SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                            stop=tuple(s.stop), seed=cfg.seed)
    if attempts < 1:
        raise ReflexdbError(f"--attempts must be >= 1, got {attempts}")
    if attempts == 1 and cfg.environment.name == "multi_attempt":
        env_name, env_options = "single", parse_options("single", {})  # one attempt: the plain prompt
    elif attempts == 1:  # the run's own environment (single; tool_python: tool use, no rollback)
        env_name, env_options = cfg.environment.name, cfg.environment.options
    else:
        extra = dict(cfg.environment.__pydantic_extra__ or {}) if cfg.environment.name == "multi_attempt" else {}
        env_name, env_options = "multi_attempt", parse_options("multi_attempt", {**extra, "max_attempts": attempts})
    tried = f" ({attempts} attempts each)" if attempts > 1 else ""
    echo(f"evaluating {label} on {len(tasks)} {split} tasks x {k} samples{tried}")
    ctx = _EvalContext(cfg=cfg, store=store, run_id=run_id, engine=engine, version=version or 0,
                       embedding_model=engine.model_name, params=params,
                       prompt=lambda text: prompt_messages(cfg.tasks.template, text),
                       score=lambda gt, prompt, samples: score_samples(reward, gt, prompt, samples),
                       make_env=environment_factory(env_name, env_options, reward, cfg.tasks.template))
    workflow = make_workflow("eval", ctx, tasks=tasks, k=k,
                             meta={"checkpoint": str(path), "label": label, "attempts": attempts})
    per_task = []
    import sys

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # a bar on a terminal (stderr), nothing in a log or a pipe
    with Progress(TextColumn(escape(f"[eval] {label}")), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                  TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True,
                  disable=not sys.stderr.isatty()) as progress:
        bar = progress.add_task("eval", total=len(tasks))
        while claimed := workflow.claim(max(1, cfg.collector.tasks_per_batch)):
            for group in workflow.collect(claimed):
                store.write_group(group)
                per_task.append(sum(bool(t.correct) for t in group.trajectories))
                progress.advance(bar)
    p1 = sum(c / k for c in per_task) / len(per_task)
    pk = sum(pass_at_k(k, c, k) for c in per_task) / len(per_task)
    tracker = Tracker(cfg, run_name=f"{cfg.run}-eval-{label}")
    tracker.client.set_tag(tracker.run_id, "reflexdb.checkpoint", str(path))
    tracker.client.log_param(tracker.run_id, "eval.k", k)
    tracker.client.log_param(tracker.run_id, "eval.split", split)
    tracker.client.log_param(tracker.run_id, "eval.attempts", attempts)
    suffix = "" if attempts == 1 else f"_{attempts}_attempts"
    tracker.log_metrics({f"eval/pass_at_1{suffix}": p1, f"eval/pass_at_{k}{suffix}": pk, f"eval/pass_at_k{suffix}": pk,
                         "eval/tasks": float(len(per_task))}, version or 0)
    # ... and into the learner's run, at the learner step of that version: one page for the run
    if version is not None:  # a checkpoint directory outside the run has no step
        tracker.log_to_learner({f"eval/pass_at_1{suffix}": p1}, store.get_policy(run_id, version).step if version else 0)
    tracker.close()
    engine.close()
    reward.close()
    return EvalResult(label, version, split, len(per_task), k, p1, pk, tracker.run_id)
