"""From the ``tasks:`` section of a run config to the store's tasks and the prompts to sample."""

from __future__ import annotations

import random
from reflexdb.config import ConfigError, TasksConfig
from reflexdb.records import TaskIn

from .tasks.arithmetic import arithmetic_tasks
from .tasks.base import Task
from .tasks.datasets import FieldMap, load_dataset
from .tasks.templates import get_template


def build_tasks(cfg: TasksConfig) -> tuple[list[TaskIn], int]:
    """The train and eval tasks the config describes, and how many dataset rows were skipped.

    Arithmetic: ``train_size`` and ``eval_size`` tasks of level ``level`` from disjoint parts of the
    problem space. File: the valid rows, shuffled with ``seed``; the first ``eval_size`` become the
    eval split, the next ``train_size`` the train split. The loader logs a warning naming the file
    and line of each skipped row.
    """
    if cfg.source == "arithmetic":
        try:
            tasks = arithmetic_tasks(cfg.train_size, level=cfg.level, split="train", seed=cfg.seed)
            if cfg.eval_size:
                tasks += arithmetic_tasks(cfg.eval_size, level=cfg.level, split="eval", seed=cfg.seed)
        except ValueError as exc:
            raise ConfigError(f"tasks (train_size {cfg.train_size}, eval_size {cfg.eval_size}, "
                              f"level {cfg.level}): {exc}") from None
        return [_task_in(t, cfg.dataset) for t in tasks], 0
    fields = FieldMap(prompt=cfg.question_field, answer=cfg.answer_field)
    loaded = load_dataset(cfg.path, fields=fields, dataset=cfg.dataset)  # warns FILE:LINE per skipped row
    rows = list(loaded.tasks)
    random.Random(f"reflexdb-split/{cfg.seed}").shuffle(rows)
    eval_rows, train_rows = rows[: cfg.eval_size], rows[cfg.eval_size : cfg.eval_size + cfg.train_size]
    out = [_task_in(t, cfg.dataset, split="eval") for t in eval_rows]
    out += [_task_in(t, cfg.dataset, split="train") for t in train_rows]
    return out, loaded.skipped


def _task_in(t: Task, dataset: str | None, split: str | None = None) -> TaskIn:
    ti = t.to_task_in()
    if dataset:
        ti.dataset = dataset
    if split:
        ti.split = split
    return ti


def prompt_messages(template: str, question: str) -> list[dict[str, str]]:
    """The chat messages for ``question`` under the named prompt template."""
    return get_template(template).messages(question)
