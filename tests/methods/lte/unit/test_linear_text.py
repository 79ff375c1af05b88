"""LTE reads what a model wrote in time linear in its size (issue 50): ``hint_text`` and
``hinted_question`` (a wrong answer is listed cut to ``ANSWER_CHARS``), fed the 1 MB adversarial
corpus of ``tests/hostile_text.py`` under its time budget, and checked by hypothesis to return what
they returned before on answers of ordinary size.
"""

from __future__ import annotations


import pytest
from hypothesis import given
from hypothesis import strategies as st
from reflexdb.methods.lte.hints import ANSWER_CHARS, KINDS, hint_text, hinted_question

from tests.hostile_text import ORDINARY, assert_linear, corpus, hostile_texts

NAMES = list(corpus())


# ---------------------------------------------------------------------------------------- LTE


def hint_text_before(kind: str, wrong_answers=()) -> str:
    """``hint_text`` before issue 50 (every answer listed whole): the reference on ordinary answers."""
    from reflexdb.methods.lte.hints import CONCISE, NO_MENTION, WRONG_ANSWERS

    parts = []
    if kind in ("concise", "concise_wrong_answers"):
        parts.append(CONCISE)
    if kind in ("wrong_answers", "concise_wrong_answers") and wrong_answers:
        parts.append(WRONG_ANSWERS.format(answers=", ".join(str(a) for a in wrong_answers)))
    if not parts:
        parts.append(CONCISE)
    return "Hint: " + " ".join(parts) + " " + NO_MENTION


@pytest.mark.parametrize("name", NAMES)
def test_a_hint_is_built_in_linear_time_and_stays_short(name):
    text = corpus()[name]
    answers = [text[i:] for i in range(8)]  # G = 8 distinct wrong answers of 1 MB
    for kind in KINDS:
        assert_linear(hinted_question, text, kind, answers, name=f"{kind} on {name}")
    hint = hint_text("concise_wrong_answers", answers)
    assert len(hint) <= len(hint_text_before("concise_wrong_answers", ["…"] * 8)) + 8 * ANSWER_CHARS


@ORDINARY
@given(kind=st.sampled_from(KINDS), answers=st.lists(hostile_texts(60), max_size=8))
def test_a_hint_lists_ordinary_answers_as_before_and_long_ones_cut(kind, answers):
    cut = [a if len(a) <= ANSWER_CHARS else a[:ANSWER_CHARS] + "…" for a in answers]
    assert hint_text(kind, answers) == hint_text_before(kind, cut)
    if all(len(a) <= ANSWER_CHARS for a in answers):
        assert hint_text(kind, answers) == hint_text_before(kind, answers)
    assert hinted_question("Q?", kind, answers) == f"Q?\n\n{hint_text(kind, answers)}"
