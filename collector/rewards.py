"""Answer extraction, verification with ``math-verify``, and the reward-function registry.

A reward function takes the response text and the task's ground truth (``None`` for tasks
without one) and returns a :class:`RewardResult` (reward, correct, extracted answer: the
trajectory columns of the same names). Users add their own by name::

    from reflexdb.collector.rewards import RewardResult, register_reward

    @register_reward("exact")
    def exact(response: str, ground_truth: str | None) -> RewardResult:
        ok = response.strip() == ground_truth
        return RewardResult(reward=float(ok), correct=ok, extracted=response.strip())

Built-in: ``math`` (auto extraction), ``math_boxed``, ``math_answer_tag``, ``math_last_number``
— 1.0 if ``math-verify`` finds the extracted answer equal to the ground truth, else 0.0.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reflexdb.plugins import REWARDS

EXTRACTORS = ("auto", "answer_tag", "boxed", "last_number")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed\s+([^\s$]+)")
# A number: optional sign (not a binary minus after a digit/letter), digits with optional
# thousands separators, optional decimals; or a simple fraction a/b.
_NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?:(?<![\w.])-)?\.\d+")


def extract_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>…</answer>``; an unclosed last ``<answer>`` runs to the end."""
    matches = _ANSWER_TAG.findall(text)
    if matches:
        return matches[-1].strip()
    start = text.lower().rfind("<answer>")
    if start >= 0:
        rest = text[start + len("<answer>") :].strip()
        return rest or None
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), nested braces included."""
    last = None
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            last = text[m.end() : i - 1].strip()
    if last is None:
        bare = _BOXED_BARE.findall(text)
        return bare[-1] if bare else None
    return last


def extract_last_number(text: str) -> str | None:
    """The last number in the text, thousands separators removed (``1,234.5`` → ``1234.5``)."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def extract_answer(text: str, how: str = "auto") -> str | None:
    """The final answer in a response.

    Args:
        how: ``answer_tag``, ``boxed``, ``last_number``, or ``auto``: the first of those three
            that finds something.
    """
    if how == "answer_tag":
        return extract_answer_tag(text)
    if how == "boxed":
        return extract_boxed(text)
    if how == "last_number":
        return extract_last_number(text)
    if how == "auto":
        for extract in (extract_answer_tag, extract_boxed, extract_last_number):
            found = extract(text)
            if found:
                return found
        return None
    raise ValueError(f"unknown extractor {how!r}; known: {', '.join(EXTRACTORS)}")


def _timeout() -> int | None:
    # math-verify times out with signal.alarm, which only works in the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=8192)
def _parse(expr: str) -> tuple[Any, ...]:
    from math_verify import parse

    parsed = parse(expr, parsing_timeout=_timeout())
    if not parsed and "$" not in expr:
        parsed = parse(f"${expr}$", parsing_timeout=_timeout())
    return tuple(parsed)


def verify_answer(answer: str | None, ground_truth: str) -> bool:
    """Whether ``answer`` equals ``ground_truth`` mathematically (``math-verify``): ``72.0`` and
    ``72``, ``\\frac{1}{2}`` and ``0.5``, ``1,000`` and ``1000`` agree. Falls back to comparing
    the stripped strings when ``math-verify`` parses nothing."""
    if answer is None:
        return False
    answer, ground_truth = answer.strip(), ground_truth.strip()
    if not answer:
        return False
    gold, pred = _parse(ground_truth), _parse(answer)
    if not gold or not pred:
        return answer == ground_truth
    from math_verify import verify

    return bool(verify(list(gold), list(pred), timeout_seconds=_timeout()))


# -- registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardResult:
    """What a reward function says about one response.

    Attributes:
        reward: the scalar reward.
        correct: whether the answer was verified correct (``None`` if the task has no notion of it).
        extracted: the answer found in the response (``None`` if none was found).
    """

    reward: float
    correct: bool | None
    extracted: str | None


#: ``fn(response_text, ground_truth) -> RewardResult``.
RewardFn = Callable[[str, "str | None"], RewardResult]


def register_reward(name: str, fn: RewardFn | None = None, *, replace: bool = False) -> Any:
    """Register ``fn`` as reward function ``name``; without ``fn``, a decorator that does."""

    return REWARDS.register(name, fn, replace=replace)


def get_reward(name: str) -> RewardFn:
    """The reward function registered as ``name``.

    Raises:
        UnknownName: nothing is registered under ``name`` (the message lists what is).
    """
    return REWARDS.get(name)


def reward_names() -> list[str]:
    return REWARDS.names()


def math_reward(response: str, ground_truth: str | None, *, how: str = "auto") -> RewardResult:
    """1.0 if the answer extracted with ``how`` verifies against the ground truth, else 0.0."""
    if ground_truth is None:
        raise ValueError("the task has no ground truth to verify against")
    extracted = extract_answer(response, how)
    correct = verify_answer(extracted, ground_truth)
    return RewardResult(reward=1.0 if correct else 0.0, correct=correct, extracted=extracted)


register_reward("math", math_reward)
for _how in ("boxed", "answer_tag", "last_number"):
    register_reward(f"math_{_how}", functools.partial(math_reward, how=_how))
