"""What an environment is: the other side of a multi-turn episode.

One instance is one episode on one task::

    env = make_environment("multi_attempt", options, task, reward_fn=..., template=...)
    messages = env.reset()                   # the first chat messages (system, user)
    step = env.step(text, finish_reason)     # the model's turn -> feedback, reward, done
    messages = env.restore(k)                # back to the state before assistant turn k

- ``reset`` returns the conversation the first assistant turn answers.
- ``step`` takes the assistant's decoded text and returns a :class:`Step`: the environment's
  reply (``feedback``, chat messages the template renders between assistant turns; empty when the
  episode is over), the verdict on this turn (answer, correct, reward) and, once ``done``, the
  episode's reward and correctness.
- ``restore(k)`` puts the environment back where it was before assistant turn ``k`` (0-based) and
  returns the conversation at that point (R3L retries from a pivot turn). An environment is a
  function of its history, so restoring is replaying the first ``k`` turns' bookkeeping.

The driver (``collector/episodes.py``) owns tokens: an environment sees and writes text only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ..deadline import RewardTimeout


class EnvTask(NamedTuple):
    """A task as an environment sees it."""

    id: int
    prompt: str
    ground_truth: str | None


@dataclass(frozen=True)
class Step:
    """The environment's answer to one assistant turn.

    Attributes:
        feedback: chat messages to append before the next assistant turn (``[]`` when done).
        done: the episode is over.
        answer, correct, reward: the verdict on this turn (``reward`` None: the reward function failed).
        episode_reward, episode_correct: the episode's, once ``done``.
        error: the reward function's error on this turn, if it raised.
        feedback_role: the role the feedback turn is stored with when it is not the message's
            (``tool`` for a tool's output shown to the model as a user message).
        tool_error: the feedback is a tool call's failed execution (``turns.tool_error``).
        tool_call: the call's record, stored with the feedback turn (``turns.tool_call``).
    """

    feedback: list[dict[str, str]] = field(default_factory=list)
    done: bool = True
    answer: str | None = None
    correct: bool | None = None
    reward: float | None = None
    episode_reward: float | None = None
    episode_correct: bool | None = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    feedback_role: str | None = None
    tool_error: bool = False
    tool_call: dict[str, Any] | None = None


class Environment(Protocol):
    """One episode on one task (``collector/environments/base.py`` says what each call does): a class registered with
    ``register_environment(name)``, built as ``cls(task, options, reward_fn=..., template=...)``
    (``task`` an :class:`EnvTask`, ``options`` its ``Options`` model, a pydantic model of the other
    keys of ``environment:``)."""

    name: str
    multi_turn: bool  # whether an episode may have more than one assistant turn (optional; default True)

    def reset(self) -> list[dict[str, str]]:
        """The chat messages the first assistant turn answers (system, user)."""

    def step(self, text: str, finish_reason: str) -> Step:
        """The model's turn (its decoded text and why sampling stopped) -> the verdict and feedback."""

    def restore(self, turn: int) -> list[dict[str, str]]:
        """Back to the state before assistant turn ``turn`` (0-based): the conversation at that point."""

    # Optional: ``step_batch(envs, texts, finish_reasons) -> list[Step]`` (a classmethod) steps
    # many episodes of the class at once; the driver uses it when present (tool calls run
    # concurrently, collector/environments/tool_python.py).


#: How the error of a reward scored 0 without a verdict begins: the reward function passed its
#: deadline (``RewardTimeout``), or its verifier could not check the answer (``Unverified``).
UNVERIFIED = ("RewardTimeout:", "Unverified:")


def unverified(error: str | None) -> bool:
    """Whether a trajectory's ``error`` says its reward is 0 for want of a verdict (counted in
    ``collectors.unverified_rewards``)."""
    return error is not None and error.startswith(UNVERIFIED)


def judge(reward_fn, text: str, ground_truth: str | None) -> tuple[float | None, bool | None, str | None, str | None]:
    """(reward, correct, answer, error) of one response. A reward function that raises gives a NULL
    reward and its error, never a crash (a user's reward function must not stop a collector); one
    stopped at its deadline (collector/deadline.py) scores 0, its error ``RewardTimeout: …``; one
    whose verifier could not check the answer says so in :attr:`RewardResult.error` and scores 0."""
    try:
        r = reward_fn(text, ground_truth)
        return float(r.reward), r.correct, r.extracted, getattr(r, "error", None)
    except RewardTimeout as exc:
        return 0.0, False, None, f"RewardTimeout: {exc}"
    except Exception as exc:
        return None, None, None, f"{type(exc).__name__}: {exc}"
