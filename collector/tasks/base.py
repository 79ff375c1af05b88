"""The task record every task source (generators, dataset loaders, environments) produces."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One prompt with its verifiable answer.

    Args:
        prompt: the question as plain text (a prompt template turns it into chat messages).
        ground_truth: the reference answer the reward function verifies against.
        dataset: source name (``arithmetic``, ``gsm8k``, a file stem...).
        split: ``train`` | ``eval`` (or the loader's split name).
        task_key: stable identity of the task within its dataset; defaults to a hash of the prompt.
        meta: anything else worth keeping (difficulty level, source file and line, ...).
    """

    prompt: str
    ground_truth: str | None
    dataset: str = "default"
    split: str = "train"
    task_key: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.task_key:
            digest = hashlib.sha256(self.prompt.encode()).hexdigest()[:16]
            object.__setattr__(self, "task_key", digest)

    def to_task_in(self) -> Any:
        """The store's :class:`reflexdb.records.TaskIn` for this task."""
        from reflexdb.records import TaskIn

        return TaskIn(
            prompt=self.prompt,
            ground_truth=self.ground_truth,
            dataset=self.dataset,
            split=self.split,
            task_key=self.task_key,
            meta=dict(self.meta),
        )
