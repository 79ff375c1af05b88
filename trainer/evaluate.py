"""``reflexdb eval``: pass@1 and pass@k of a checkpoint on held-out tasks, with the plain prompt.

Every evaluation sample is stored as a group of kind ``eval`` (never trained on: the learner's
view excludes it), so failures can be inspected with SQL like any other; the numbers go to MLflow
as ``eval/pass_at_1`` and ``eval/pass_at_k`` in a run of the experiment ``reflexdb/<run>``.

pass@k uses the unbiased estimator of Chen et al. (2021): with ``n`` samples of which ``c`` are
correct, ``pass@k = 1 − C(n−c, k) / C(n, k)``; here ``n = k``, so it is 1 when any sample is correct.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from reflexdb import GroupIn, Store, TrajectoryIn, TurnIn
from reflexdb.config import Config
from reflexdb.errors import NotFound, ReflexdbError


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


def resolve_checkpoint(store: Store, run_id: int, spec: str, base_model) -> tuple[str, Path | str, int | None]:
    """``base``, ``latest``, ``vN`` (a published version of the run) or a directory → (label, path, version)."""
    from reflexdb.collector.engines.base import checkpoint_path

    if spec == "base":
        return "base", base_model, 0
    if spec == "latest" or (spec.startswith("v") and spec[1:].isdigit()):
        policy = store.latest_policy(run_id) if spec == "latest" else store.get_policy(run_id, int(spec[1:]))
        if policy is None:
            raise NotFound("the run has no published policy yet")
        path = checkpoint_path(policy.checkpoint_uri)
        if not path.is_dir():
            raise NotFound(f"the weights of policy v{policy.version} ({path}) are gone: the learner keeps only the "
                           "newest learner.keep_policies versions; evaluate a newer one, or set keep_policies: null "
                           "to keep them all")
        return f"v{policy.version}", path, policy.version
    path = checkpoint_path(spec)
    if not path.is_dir():
        raise NotFound(f"checkpoint {spec} is not a directory (give base, latest, vN or a model directory)")
    return path.name, path, None


def evaluate(cfg: Config, store: Store, checkpoint: str = "latest", *, split: str = "eval", k: int | None = None,
             max_tasks: int | None = None, echo=print) -> EvalResult:
    from reflexdb.collector.engines import SamplingParams, make_engine
    from reflexdb.collector.models import resolve_model
    from reflexdb.collector.rewards import get_reward
    from reflexdb.collector.sources import build_tasks, prompt_messages

    from .tracking import Tracker

    k = k or cfg.learner.eval_samples
    run_id = store.create_run(cfg.run, algorithm=cfg.algorithm, config=cfg.masked())
    store.add_tasks(run_id, build_tasks(cfg.tasks)[0])  # idempotent: the collector adds the same ones
    with store.engine.connect() as conn:
        tasks = conn.execute(text("SELECT id, prompt, ground_truth FROM tasks WHERE run_id = :r AND split = :s "
                                  "ORDER BY id LIMIT :n"), {"r": run_id, "s": split, "n": max_tasks or 2**31 - 1}).all()
    if not tasks:
        raise ReflexdbError(f"run {cfg.run!r} has no tasks in split {split!r} (tasks.eval_size is 0?)")
    label, path, version = resolve_checkpoint(store, run_id, checkpoint, resolve_model(cfg.model))
    engine = make_engine(cfg.collector.engine, model=path, device=cfg.collector.device)
    reward = get_reward(cfg.collector.reward)
    s = cfg.collector.sampling
    params = SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                            stop=tuple(s.stop), seed=cfg.seed)
    echo(f"evaluating {label} on {len(tasks)} {split} tasks x {k} samples")
    per_task = []
    batch = max(1, cfg.collector.tasks_per_batch)
    for start in range(0, len(tasks), batch):
        chunk = tasks[start:start + batch]
        prompts = [prompt_messages(cfg.tasks.template, t.prompt) for t in chunk]
        for task, prompt, samples in zip(chunk, prompts, engine.generate(prompts, n=k, params=params)):
            trajs, correct = [], 0
            for smp in samples:
                try:
                    r = reward(smp.text, task.ground_truth)
                    rew, ok, ans, err = float(r.reward), r.correct, r.extracted, None
                except Exception as exc:
                    rew, ok, ans, err = None, None, None, f"{type(exc).__name__}: {exc}"
                correct += bool(ok)
                trajs.append(TrajectoryIn(
                    prompt_ids=smp.prompt_ids, response_ids=smp.token_ids, logprobs=smp.logprobs, reward=rew,
                    correct=ok, extracted_answer=ans, error=err, finish_reason=smp.finish_reason,
                    embedding=smp.embedding,
                    turns=[*(TurnIn(m["role"], m["content"]) for m in prompt),
                           TurnIn("assistant", smp.text, 0, len(smp.token_ids))]))
            store.write_group(GroupIn(run_id=run_id, task_id=task.id, policy_version=version or 0,
                                      trajectories=trajs, workflow="eval", kind="eval",
                                      meta={"checkpoint": str(path), "label": label},
                                      embedding_model=engine.model_name))
            per_task.append(correct)
    p1 = sum(c / k for c in per_task) / len(per_task)
    pk = sum(pass_at_k(k, c, k) for c in per_task) / len(per_task)
    tracker = Tracker(cfg, run_name=f"{cfg.run}-eval-{label}")
    tracker.client.set_tag(tracker.run_id, "reflexdb.checkpoint", str(path))
    tracker.client.log_param(tracker.run_id, "eval.k", k)
    tracker.client.log_param(tracker.run_id, "eval.split", split)
    tracker.log_metrics({"eval/pass_at_1": p1, f"eval/pass_at_{k}": pk, "eval/pass_at_k": pk,
                         "eval/tasks": float(len(per_task))}, version or 0)
    tracker.close()
    engine.close()
    return EvalResult(label, version, split, len(per_task), k, p1, pk, tracker.run_id)
