"""Held-out evaluation (``reflexdb eval``): k episodes of each eval task with the plain prompt
(one attempt each, or ``--attempts K`` in the multi-attempt environment).

    claim:   the next eval tasks of the list it was given (nothing shared: one evaluator)
    collect: k samples per task -> rewards -> one group of kind ``eval`` per task (the learner's
             view never takes them), with the checkpoint in ``meta``
"""

from __future__ import annotations

from reflexdb import GroupIn

from ..environments import EnvTask
from . import register_workflow


#: An eval task is a task as an environment sees it (id, prompt, ground truth).
EvalTask = EnvTask


@register_workflow("eval")
class EvalWorkflow:
    """Args:
        tasks: the held-out tasks to sample.
        k: samples per task.
        meta: stored with each group (checkpoint path and label).
    """

    def __init__(self, ctx, *, tasks: list[EvalTask], k: int, meta: dict):
        self.ctx, self.queue, self.k, self.meta = ctx, list(tasks), k, meta

    def claim(self, want: int) -> list:
        taken, self.queue = self.queue[:want], self.queue[want:]
        return taken

    def collect(self, tasks: list) -> list[GroupIn]:
        c = self.ctx
        episodes = c.rollout(tasks, self.k)
        return [GroupIn(run_id=c.run_id, task_id=t.id, policy_version=c.version, trajectories=batch,
                        workflow="eval", kind="eval", meta=self.meta, embedding_model=c.embedding_model)
                for t, batch in zip(tasks, episodes)]

    def exhausted(self) -> bool:
        return not self.queue
