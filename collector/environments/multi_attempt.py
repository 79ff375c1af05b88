"""``multi_attempt``: answer a math problem in up to K attempts, with feedback after a wrong one.

As in R3L's code (R3L.md; METHODS.md §1): after a wrong answer the environment says
"Incorrect. Your answer X does not match. Please try again."; after a response with no answer it
can parse, it reminds the model of the answer format. The episode ends at the first correct
answer or after ``max_attempts``.

Reward: ``max_k r_k · d^k`` over the attempts ``k = 0..`` made, ``r_k`` the reward function's value
of attempt ``k`` and ``d = attempt_discount``; with the default ``d = 1`` and a 0/1 reward it is 1
when any attempt is correct. The episode is correct when any attempt is. The final answer (of
the last attempt) and the attempt that found the right one (``solved_at``) are stored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from . import register_environment
from .base import EnvTask, Step, judge

WRONG = "Incorrect. Your answer {answer} does not match. Please try again."
#: Format reminders by the prompt template's answer format (collector/tasks/templates.py).
NO_ANSWER = {
    "boxed": "I could not find a final answer in your response. Please try again and put your final answer "
             "within \\boxed{}.",
    "answer_tag": "I could not find a final answer in your response. Please try again and write only the final "
                  "answer inside <answer></answer> tags.",
}
NO_ANSWER_DEFAULT = "I could not find a final answer in your response. Please try again and end with the final answer."


@register_environment("multi_attempt")
class MultiAttemptMath:
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        max_attempts: int = Field(3, ge=1, le=64, description="K: most assistant turns in an episode.")
        attempt_discount: float = Field(1.0, gt=0.0, le=1.0, description="d: a correct attempt k (0-based) earns d^k times its reward; 1 = any correct attempt earns the full reward.")

    def __init__(self, task: EnvTask, options: Options | None = None, *, reward_fn, template):
        self.task, self.reward_fn, self.template = task, reward_fn, template
        self.options = options or self.Options()
        self.history: list[tuple[str, str]] = []  # (text, finish_reason) of each assistant turn
        self._verdicts: list[tuple] = []

    @property
    def multi_turn(self) -> bool:
        return self.options.max_attempts > 1

    def reset(self) -> list[dict[str, str]]:
        self.history, self._verdicts = [], []
        return self.template.messages(self.task.prompt)

    def _feedback(self, answer: str | None) -> str:
        if answer is None:
            return NO_ANSWER.get(self.template.answer_format, NO_ANSWER_DEFAULT)
        return WRONG.format(answer=answer)

    def step(self, text: str, finish_reason: str) -> Step:
        if self.history and self._verdicts[-1][1]:
            raise RuntimeError("the episode is over: the last attempt was correct")
        if len(self.history) >= self.options.max_attempts:
            raise RuntimeError(f"the episode is over: {self.options.max_attempts} attempts made")
        k = len(self.history)
        reward, correct, answer, error = judge(self.reward_fn, text, self.task.ground_truth)
        self.history.append((text, finish_reason))
        self._verdicts.append((reward, bool(correct), answer, error))
        done = bool(correct) or error is not None or k + 1 >= self.options.max_attempts
        if not done:
            return Step(feedback=[{"role": "user", "content": self._feedback(answer)}], done=False,
                        answer=answer, correct=correct, reward=reward)
        rewards = [r for r, *_ in self._verdicts]
        if any(r is None for r in rewards):
            episode_reward = None
        else:
            d = self.options.attempt_discount
            episode_reward = max(r * d**i for i, r in enumerate(rewards))
        solved = next((i for i, v in enumerate(self._verdicts) if v[1]), None)
        return Step(done=True, answer=answer, correct=correct, reward=reward, episode_reward=episode_reward,
                    episode_correct=None if episode_reward is None else solved is not None, error=error,
                    meta={"attempts": k + 1, "solved_at": solved})

    def restore(self, turn: int) -> list[dict[str, str]]:
        if not 0 <= turn <= len(self.history) or turn >= self.options.max_attempts:
            raise ValueError(f"cannot restore to attempt {turn}: {len(self.history)} made, "
                             f"at most {self.options.max_attempts}")
        kept = self.history[:turn]
        messages = self.reset()
        for text, reason in kept:
            messages.append({"role": "assistant", "content": text})
            messages += self.step(text, reason).feedback
        return messages
