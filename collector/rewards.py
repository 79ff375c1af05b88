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

Everything here reads what a model wrote, so it is linear in the text's size (each extractor is one
pass; ``tests/unit/test_rewards_hostile.py`` holds them to a time budget on 1 MB adversarial
inputs), and ``math-verify``, whose LaTeX parsing and comparison are not, gets at most
:data:`VERIFY_MAX_CHARS` characters and its own time limit. An answer over the cap, or one
``math-verify`` times out on, scores 0 with the reason in :attr:`RewardResult.error`. The collector
also runs the whole reward function under a deadline (``collector.reward_timeout_s``,
``collector/deadline.py``).
"""

from __future__ import annotations

import contextlib
import functools
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from reflexdb.plugins import REWARDS

EXTRACTORS = ("auto", "answer_tag", "boxed", "last_number")
#: The most characters of an answer (or a ground truth) handed to math-verify: its LaTeX parser and
#: sympy are super-linear, and no answer of a math task is longer. A longer one scores 0, unverified.
VERIFY_MAX_CHARS = 1000
#: The time limit on each math-verify parse and comparison (seconds; :func:`_time_limit` uses
#: ``SIGALRM``, so only in a main thread: the collector's reward process is one).
VERIFY_TIMEOUT_S = 3
#: After the limit, the alarm repeats this often until the call has stopped (seconds): see
#: :func:`_time_limit`.
_REPEAT_S = 0.05

_ANSWER_OPEN = re.compile(r"<answer>", re.I)
_ANSWER_CLOSE = re.compile(r"</answer>", re.I)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed\s+([^\s$]+)")
# A number: optional sign (not a binary minus after a digit/letter), digits with optional
# thousands separators, optional decimals; or a simple fraction a/b.
_NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?:(?<![\w.])-)?\.\d+")


def extract_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>…</answer>``; an unclosed last ``<answer>`` runs to the end.

    One pass: each ``<answer>`` is paired with the first ``</answer>`` after it and the search goes
    on after that close, as a lazy regex's ``findall`` pairs them; but once no close follows, no
    later opener can have one either, so the scan stops instead of trying every opener again.
    """
    pos, last = 0, None
    while (opened := _ANSWER_OPEN.search(text, pos)) is not None:
        closed = _ANSWER_CLOSE.search(text, opened.end())
        if closed is None:
            break
        last, pos = (opened.end(), closed.start()), closed.end()
    if last is not None:
        return text[last[0]:last[1]].strip()
    start = None
    for start in _ANSWER_OPEN.finditer(text, pos):
        pass
    if start is not None:
        return text[start.end():].strip() or None
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) that is closed, nested braces included;
    else the token after the last bare ``\\boxed `` (``\\boxed 42``).

    Linear: one pass computes the brace depth after every character (a ``}`` with nothing open is
    ignored, as a stack would), the least depth from each character to the end, and from those
    whether each opener's brace is ever closed. Scanning to the matching brace from every opener
    instead is quadratic: 3,000 ``\\boxed{`` took 20 s (issue 50).
    """
    starts = [m.end() for m in _BOXED.finditer(text)]  # just past each opener's brace
    if starts:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        walk = np.cumsum((codes == 0x7B).astype(np.int64) - (codes == 0x7D))  # "{" +1, "}" -1
        depth = walk - np.minimum(np.minimum.accumulate(walk), 0)  # [len]: depth after each char
        lowest = np.append(np.minimum.accumulate(depth[::-1])[::-1], np.iinfo(np.int64).max)  # from i on
        at = np.asarray(starts)
        closed = np.nonzero(lowest[at] < depth[at - 1])[0]  # the depth falls below the opener's: closed
        if closed.size:
            start = starts[closed[-1]]
            end = start + int(np.argmax(depth[start:] < depth[start - 1]))
            return text[start:end].strip()
    bare = None
    for bare in _BOXED_BARE.finditer(text):
        pass
    return bare.group(1) if bare is not None else None


def extract_last_number(text: str) -> str | None:
    """The last number in the text, thousands separators removed (``1,234.5`` → ``1234.5``)."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return last.group().replace(",", "") if last is not None else None


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


class Unverified(Exception):
    """math-verify was not asked (the answer is over :data:`VERIFY_MAX_CHARS`) or did not answer
    within its time limit: the answer scores 0, and the reason is stored with the trajectory."""


class _TimedOut(BaseException):
    """Raised into math-verify by :func:`_time_limit`. A ``BaseException``, so that neither
    math-verify's nor sympy's ``except Exception`` clauses take it for a parse error."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_TimedOut` in the body after ``seconds`` (main thread only; elsewhere no limit).

    math-verify's own limit (``parsing_timeout``) raises once from a ``SIGALRM`` handler. Python runs
    a handler between bytecodes of whatever is running, and when that is a garbage-collector
    callback or a ``__del__`` the exception is printed as unraisable and lost: the parse then runs
    on to its end, unbounded (seen in CI under hypothesis, whose gc callback was running). This
    alarm re-arms itself before raising, every :data:`_REPEAT_S`, until the body has stopped.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        signal.setitimer(signal.ITIMER_REAL, _REPEAT_S)  # again, in case this one lands where it is lost
        raise _TimedOut

    previous = signal.signal(signal.SIGALRM, expired)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:  # an alarm that landed in the inner finally re-armed before raising: disarm again
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _parse_once(expr: str) -> list | str:
    from math_verify import parse

    try:
        with _time_limit(VERIFY_TIMEOUT_S):
            return parse(expr, parsing_timeout=None, raise_on_error=True)
    except _TimedOut:
        return f"math-verify timed out parsing {len(expr)} characters ({VERIFY_TIMEOUT_S} s)"
    except Exception:  # noqa: BLE001 - what math-verify cannot parse is not an answer it can check
        return []


@functools.lru_cache(maxsize=8192)
def _parse(expr: str) -> tuple[Any, ...] | str:
    """math-verify's reading of ``expr``, or why there is none in time (a str). Cached, timeouts
    included: a group's samples often repeat an answer, and a slow one costs its time limit once."""
    parsed = _parse_once(expr)
    if not parsed and "$" not in expr:
        parsed = _parse_once(f"${expr}$")
    return parsed if isinstance(parsed, str) else tuple(parsed)


@functools.lru_cache(maxsize=8192)
def _equal(ground_truth: str, answer: str) -> bool | str:
    """Whether math-verify finds the two equal, or why it could not tell in time (a str)."""
    from math_verify import verify

    gold, pred = _parse(ground_truth), _parse(answer)
    for parsed in (gold, pred):
        if isinstance(parsed, str):
            return parsed
    if not gold or not pred:
        return answer == ground_truth
    try:
        with _time_limit(VERIFY_TIMEOUT_S):
            return bool(verify(list(gold), list(pred), timeout_seconds=None, raise_on_error=True))
    except _TimedOut:
        return f"math-verify timed out comparing the answer with the ground truth ({VERIFY_TIMEOUT_S} s)"
    except Exception:  # noqa: BLE001 - an answer math-verify cannot compare is not verified equal
        return False


def verify_answer(answer: str | None, ground_truth: str) -> bool:
    """Whether ``answer`` equals ``ground_truth`` mathematically (``math-verify``): ``72.0`` and
    ``72``, ``\\frac{1}{2}`` and ``0.5``, ``1,000`` and ``1000`` agree. Falls back to comparing
    the stripped strings when ``math-verify`` parses nothing.

    Raises:
        Unverified: either side is over :data:`VERIFY_MAX_CHARS` characters, or math-verify timed
            out on it (its parser and sympy are super-linear: the cap comes before the call;
            ``10^{10^{10}}`` against ``5`` runs into the time limit at 12 characters).
    """
    if answer is None:
        return False
    answer, ground_truth = answer.strip(), ground_truth.strip()
    if not answer:
        return False
    for what, text in (("the answer", answer), ("the ground truth", ground_truth)):
        if len(text) > VERIFY_MAX_CHARS:
            raise Unverified(f"{what} is {len(text):,} characters, over the {VERIFY_MAX_CHARS:,} math-verify is given")
    equal = _equal(ground_truth, answer)
    if isinstance(equal, str):
        raise Unverified(equal)
    return equal


# -- registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardResult:
    """What a reward function says about one response.

    Attributes:
        reward: the scalar reward.
        correct: whether the answer was verified correct (``None`` if the task has no notion of it).
        extracted: the answer found in the response (``None`` if none was found).
        error: set when the answer could not be checked and scores 0 for that (the answer was
            too long for the verifier, or it timed out): the trajectory's ``error``.
    """

    reward: float
    correct: bool | None
    extracted: str | None
    error: str | None = None  # why the reward is 0 without a verdict (``Unverified: …``), stored in ``error``


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
    try:
        correct = verify_answer(extracted, ground_truth)
    except Unverified as exc:
        return RewardResult(reward=0.0, correct=False, extracted=extracted, error=f"Unverified: {exc}; scored 0")
    return RewardResult(reward=1.0 if correct else 0.0, correct=correct, extracted=extracted)


register_reward("math", math_reward)
for _how in ("boxed", "answer_tag", "last_number"):
    register_reward(f"math_{_how}", functools.partial(math_reward, how=_how))
