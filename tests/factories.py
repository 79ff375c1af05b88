"""Builders of realistic groups for tests (random but seeded)."""

from __future__ import annotations

import numpy as np

from reflexdb import GroupIn, TaskIn, TrajectoryIn, TurnIn


def make_trajectory(rng: np.random.Generator, *, T: int = 50, P: int = 12, dim: int | None = 16, reward: float = 1.0,
                    correct: bool | None = True, text: str = "The answer is 5.", **kw) -> TrajectoryIn:
    """A single-turn trajectory of ``T`` response tokens with an embedding of ``dim`` (or none).

    Keyword arguments override any field of :class:`TrajectoryIn`.
    """
    fields = dict(
        prompt_ids=rng.integers(0, 49152, P),
        response_ids=rng.integers(0, 49152, T),
        logprobs=-rng.random(T).astype(np.float32),
        reward=reward,
        correct=correct,
        turns=[TurnIn("user", "What is 2+3?"), TurnIn("assistant", text, 0, T)],
        embedding=None if dim is None else rng.standard_normal(dim).astype(np.float32),
        extracted_answer="5" if correct else "7",
    )
    fields.update(kw)
    return TrajectoryIn(**fields)


def make_group(rng: np.random.Generator, run_id: int, task_id: int, *, size: int = 4, version: int = 0,
               n_correct: int | None = None, **kw) -> GroupIn:
    """A group of ``size`` trajectories, the first ``n_correct`` correct (default: half)."""
    n_correct = size // 2 if n_correct is None else n_correct
    trajs = [make_trajectory(rng, reward=float(i < n_correct), correct=i < n_correct, **kw) for i in range(size)]
    return GroupIn(run_id=run_id, task_id=task_id, policy_version=version, trajectories=trajs)


def setup_run(store, name: str = "test", n_tasks: int = 3) -> tuple[int, list[int]]:
    run = store.create_run(name)
    tasks = store.add_tasks(run, [TaskIn(prompt=f"What is {i}+3?", ground_truth=str(i + 3)) for i in range(n_tasks)])
    return run, tasks


def release_origins() -> dict:
    """The table of origins as revisions 0018 and 0021 fill it (for batches made by hand, without a store)."""
    import importlib

    from reflexdb.origins import Origin

    rows = importlib.import_module("reflexdb.migrations.versions.0018_origins").ROWS
    left_out = {"replayed", "distilled", "reflection"}  # 0021: in_failures false
    return {r[0]: Origin(*r, in_failures=r[0] not in left_out) for r in rows}
