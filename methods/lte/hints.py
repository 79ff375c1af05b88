"""LTE's hint templates (METHODS.md §2; LTE.md Sec. 3.1), all three kinds in one place.

A hinted prompt is the task's question with a hint after it, rendered with the run's prompt
template like any question, so the answer-format instructions stay the same. The hint never
gives the answer: it says what went wrong in the model's own G failed attempts (they ran out of
room, or they gave these answers, which are wrong) and asks the model not to mention the hint.
Hints exist only in training: evaluation always uses the plain prompt.

The paper's Fig. 3 wording is not in its text; these are ours. Kinds (``hints.kind``, the view
``lte_hint_pool``'s ``hint_kind``):

- ``concise``: every earlier response was cut off at the length limit;
- ``wrong_answers``: none was; the distinct answers they gave are known to be wrong;
- ``concise_wrong_answers``: some were: both.
"""

from __future__ import annotations

from collections.abc import Sequence

CONCISE = ("Earlier attempts at this problem ran out of space before reaching a final answer. Think concisely: "
           "keep each step short and give the final answer as soon as you have it.")
WRONG_ANSWERS = "These answers are known to be wrong: {answers}. Your final answer must be different from all of them."
NO_MENTION = "Do not mention this hint in your response; solve the problem as if you had thought of it yourself."

KINDS = ("concise", "wrong_answers", "concise_wrong_answers")
#: A wrong answer is listed in a hint cut to this many characters (then "…"): an answer is what a
#: model wrote, of any length, and the hinted prompt goes to the tokenizer and into the context.
ANSWER_CHARS = 300


def hint_text(kind: str, wrong_answers: Sequence[str] = ()) -> str:
    """The hint of ``kind`` (one of :data:`KINDS`) for a problem whose failed answers were
    ``wrong_answers`` (each listed cut to :data:`ANSWER_CHARS` characters)."""
    if kind not in KINDS:
        raise ValueError(f"unknown hint kind {kind!r}; expected one of {', '.join(KINDS)}")
    parts = []
    if kind in ("concise", "concise_wrong_answers"):
        parts.append(CONCISE)
    if kind in ("wrong_answers", "concise_wrong_answers") and wrong_answers:
        parts.append(WRONG_ANSWERS.format(answers=", ".join(_shown(str(a)) for a in wrong_answers)))
    if not parts:  # wrong_answers with no answer to list (every response held none): the concise hint
        parts.append(CONCISE)
    return "Hint: " + " ".join(parts) + " " + NO_MENTION


def _shown(answer: str) -> str:
    return answer if len(answer) <= ANSWER_CHARS else answer[:ANSWER_CHARS] + "…"


def hinted_question(question: str, kind: str, wrong_answers: Sequence[str] = ()) -> str:
    """The question with its hint appended (what the prompt template then wraps)."""
    return f"{question}\n\n{hint_text(kind, wrong_answers)}"
