"""NexGRPO with a real model: a collector fills a replay request, the learner uses the right ratio
denominators and refreshes confidences under its weights, and both processes run it end to end
(tiny random model, real DeepSpeed on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reflexdb import GroupIn, TrajectoryIn, TurnIn
from reflexdb.config import parse_config
from reflexdb.methods.nexgrpo import requests as replay
from reflexdb.methods.nexgrpo.requests import ReplayRequestIn
from tests.processes import rows

DIM = 64  # the tiny model's hidden size


def config_data(run="nx", **nexgrpo) -> dict:
    return {
        "run": run, "model": "tiny", "algorithm": "nexgrpo", "max_staleness": 100,
        "tasks": {"train_size": 6, "eval_size": 0},
        "collector": {"group_size": 4, "sampling": {"max_new_tokens": 6}, "progress_every_s": 1,
                      "poll_interval_s": 0.2},
        "learner": {"groups_per_step": 2, "micro_batch_size": 4, "lr": 1e-3, "poll_interval_s": 0.2},
        "nexgrpo": {"conf_low": 0.0, "start_pass_at_1": 0.0, **nexgrpo},
    }


def seed_pools(store, cfg, n_tasks=3, seed=0) -> list[tuple[int, list[int]]]:
    """Groups of 4 (2 correct, 2 incorrect with stored confidence ≈ 0.6) on the first train tasks,
    with token ids in the tiny model's vocabulary and 64-d embeddings."""
    from reflexdb.collector.sources import build_tasks

    rng = np.random.default_rng(seed)
    run = store.create_run(cfg.run, algorithm=cfg.algorithm)
    task_ids = store.add_tasks(run, build_tasks(cfg.tasks)[0])
    out = []
    for task in task_ids[:n_tasks]:
        trajs = []
        for j in range(4):
            T = int(rng.integers(4, 8))
            trajs.append(TrajectoryIn(
                prompt_ids=rng.integers(0, 1000, 6), response_ids=rng.integers(0, 1000, T),
                logprobs=np.full(T, -0.5, np.float32), reward=float(j < 2), correct=j < 2,
                turns=[TurnIn("user", "q"), TurnIn("assistant", "a", 0, T)],
                embedding=rng.standard_normal(DIM).astype(np.float32)))
        g = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=trajs))
        out.append((task, list(g.trajectory_ids)))
    return out


def test_replay_group_is_filled_by_the_collector_and_trained_with_pi_beh(store, tmp_path, monkeypatch,
                                                                         model_cache):
    from reflexdb.collector.runner import Collector
    from reflexdb.trainer.batch import pack
    from reflexdb.trainer.learner import Learner

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    cfg = parse_config(config_data())
    [(task, (y, _, b, _))] = seed_pools(store, cfg, n_tasks=1)
    run = store.run_id(cfg.run)
    [rid] = replay.post_requests(store, run, [ReplayRequestIn(task, y, b, 0.8, 0.6, 0.5, 0, 4)],
                                 learner_step=0, learner_version=0)
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    stats = collector.run(max_groups=1)  # the request comes before any fresh task
    assert (stats.groups, stats.kinds["replay"]) == (1, 1)
    [(gid, status)] = rows(store, "SELECT group_id, status FROM replay_requests WHERE id = :i", i=rid)
    assert status == "done"
    [group] = store.read_groups([gid], embeddings=True)
    t = group.trajectories
    # exactly y+, b* and G - 2 = 2 fresh rollouts of the current policy
    assert group.kind == "replay" and len(t) == 4
    assert [(x.origin, x.parent_trajectory_id) for x in t] == [("replayed", y), ("replayed", b), ("base", None),
                                                              ("base", None)]
    assert all(x.embedding is not None and x.embedding.shape == (DIM,) for x in t[2:])
    assert [x.correct for x in t[:2]] == [True, False]

    learner = Learner(cfg, store, echo=lambda m: None)
    learner.setup()
    batch = pack([group], learner.engine.pad_id, origins=store.origins())
    assert batch.replayed.tolist() == [True, True, False, False]
    old, fresh = learner.update.old_logprobs(batch)
    recomputed, _ = learner.engine.token_logprobs(batch.input_ids, batch.attention_mask, batch.prompt_lengths,
                                                  batch.response_lengths, grad=False)
    mask = batch.response_mask
    # y+ and b*: the stored behaviour log-probs (-0.5 each), not the current model's.
    assert fresh.tolist() == [False, False, True, True]
    assert torch.equal(old[:2][mask[:2]], torch.full_like(old[:2][mask[:2]], -0.5))
    assert not torch.allclose(recomputed[:2][mask[:2]], old[:2][mask[:2]], atol=0.1)
    # fresh rollouts: π_old is the weights at the step's start, taken from the training forward
    # (test_learn.py: equal to a second forward).
    # The confidence refresh scores a stored trajectory under the same weights: exp(mean log π_θ).
    [neg] = store.read_trajectories([b])
    [conf] = learner.scorer.score([neg])
    T = len(neg.response_ids)
    assert conf == pytest.approx(float(torch.exp(recomputed[1, :T].double().mean())), rel=1e-5)
    # Training on it runs and reports the replay metrics of the batch.
    result = learner.step([gid])
    assert not result.skipped
    assert result.metrics["replay/share"] == 1.0
    assert result.metrics["replay/negative_confidence"] == pytest.approx(float(np.exp(-0.5)), rel=1e-6)
    assert result.metrics["replay/pair_cosine"] == pytest.approx(0.8)
    assert result.metrics["reward/pass_at_1"] == float(np.mean([x.correct for x in t[2:]]))  # fresh rows only


def test_delayed_start_waits_for_the_pass_at_1_threshold(store, tmp_path, monkeypatch, model_cache):
    from reflexdb.trainer.learner import Learner

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    cfg = parse_config(config_data(run="nx-delay", start_pass_at_1=0.6))  # seeded batches have pass@1 0.5
    seed_pools(store, cfg, n_tasks=3)
    learner = Learner(cfg, store, echo=lambda m: None)
    learner.setup()
    learner.run(max_steps=1)
    assert not learner.hooks.active
    assert rows(store, "SELECT count(*) FROM replay_requests") == [(0,)]
    [(m,)] = rows(store, "SELECT metrics->>'replay/active' FROM learner_steps WHERE step = 1")
    assert m == "0.0"
