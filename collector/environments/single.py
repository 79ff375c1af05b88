"""``single``: one assistant turn, scored by the run's reward function (the default environment)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from . import register_environment
from .base import EnvTask, Step, judge


@register_environment("single")
class SingleTurn:
    multi_turn = False  # no episode continues: the engine need not keep caches
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, task: EnvTask, options=None, *, reward_fn, template):
        self.task, self.reward_fn, self.template = task, reward_fn, template

    def reset(self) -> list[dict[str, str]]:
        return self.template.messages(self.task.prompt)

    def step(self, text: str, finish_reason: str) -> Step:
        reward, correct, answer, error = judge(self.reward_fn, text, self.task.ground_truth)
        return Step(done=True, answer=answer, correct=correct, reward=reward, episode_reward=reward,
                    episode_correct=correct, error=error)

    def restore(self, turn: int) -> list[dict[str, str]]:
        if turn != 0:
            raise ValueError(f"a single-turn episode has only turn 0, not {turn}")
        return self.reset()
