"""The side-by-side page's diff (explorer/diff.py, issue 53): hand-checked pairs of texts and of
turn lists, the pieces always spelling each side's text, and every call bounded on the 1 MB
adversarial corpus of tests/hostile_text.py and on difflib's worst inputs (alone it took 1.6 s on
two 2,000-word texts of interleaved repeated words, 11 s on 4,000, and 20 s on 800 braces against
alternating ones with its junk heuristic off: here it is stopped past WORD_WORK steps)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reflexdb.explorer.diff import (
    ALIGN_WORK,
    CONTEXT_CHARS,
    WORD_WORK,
    Budget,
    Piece,
    align,
    common_prefix,
    common_suffix,
    diff_text,
    one_side,
)
from reflexdb.explorer.side import read_cap

from tests.hostile_text import (
    MB,
    ORDINARY,
    assert_linear,
    corpus,
    hostile_texts,
    other_text,
)

NAMES = list(corpus())


def _spell(pieces: tuple[Piece, ...]) -> str:
    return "".join(p.text for p in pieces)


def _check_offsets(text: str, pieces: tuple[Piece, ...], more: int) -> None:
    """Each piece's text stands where it says in ``text``; skipped and left-out characters add up."""
    at = 0
    for p in pieces:
        assert text[at:at + len(p.text)] == p.text
        at += len(p.text) + p.skipped
    assert at + more == len(text)


# ------------------------------------------------------------------------ hand cases


def test_identical_texts():
    d = diff_text("same\ntext", "same\ntext")
    assert d.same and d.ratio == 1.0 and d.left == d.right == (Piece("same\ntext", False),)


def test_one_word_changed_is_marked_on_both_sides():
    d = diff_text("the cat sat on the mat", "the dog sat on the mat")
    assert d.how == "words"
    # a word's token carries the blanks before it
    assert d.left == (Piece("the", False), Piece(" cat", True), Piece(" sat on the mat", False))
    assert d.right == (Piece("the", False), Piece(" dog", True), Piece(" sat on the mat", False))
    # 2 M / T: 18 characters shared by 22-character texts
    assert d.ratio == pytest.approx(2 * 18 / 44)


def test_a_line_added_before_a_kept_one_marks_only_the_added_line():
    d = diff_text("Python.\n```python\nprint(n)\n```", "Python.\n```python\nn = 12\nprint(n)\n```")
    assert [p.text for p in d.left if p.changed] == []
    assert [p.text for p in d.right if p.changed] == ["\nn = 12"]


def test_an_insertion_is_only_on_the_side_that_has_it():
    d = diff_text("84 / 2 = 42.", "84 / 2 = 42 km/h.")
    assert _spell(d.left) == "84 / 2 = 42." and _spell(d.right) == "84 / 2 = 42 km/h."
    assert [p.text for p in d.left if p.changed] == []
    assert [p.text for p in d.right if p.changed] == [" km/h"]


def test_against_an_empty_text_everything_is_changed():
    d = diff_text("", "something")
    assert d.left == () and d.right == (Piece("something", True),) and d.ratio == 0.0
    assert one_side("only here") == type(d)((Piece("only here", True),), (), "only", 0.0, 0, 0)


def test_past_the_budget_lines_are_compared_as_multisets():
    a = "keep\nold line\nkeep\nkeep\n"
    b = "keep\nkeep\nnew line\nkeep\n"
    d = diff_text(a, b, budget=Budget(0))
    assert d.how == "lines"
    # the common first line is cut off; in what is left, a line is changed unless the other side holds it
    assert _spell(d.left) == a and _spell(d.right) == b
    assert [p.text for p in d.left if p.changed] == ["old line\n"]
    assert [p.text for p in d.right if p.changed] == ["new line\n"]


def test_the_page_budget_is_spent_and_then_lines_are_compared():
    budget = Budget(100)
    assert diff_text("a b c d e", "a b x d e", budget=budget).how == "words"
    assert 0 < 100 - budget.left < 10  # one word against one: a couple of steps
    words = [f"w{i}" for i in range(30)]
    forth, back = " ".join(words), " ".join(reversed(words))  # 117 steps: more than is left
    assert diff_text(forth, back, budget=budget).how == "lines"
    assert budget.left <= 0  # what the stopped diff took is spent: the page's next pairs compare lines
    assert diff_text("a b c", "a x c", budget=budget).how == "lines"
    assert diff_text(forth, back, budget=Budget(1_000)).how == "words"


def test_difflibs_worst_case_is_stopped_and_prose_is_not():
    braces = ("{ " * 199, "} { " * 99)  # 1.45 million steps (0.3-0.8 s) without the bound
    budget = Budget(10**9)
    assert diff_text(*braces, budget=budget).how == "lines"
    assert 10**9 - budget.left == WORD_WORK
    prose = " ".join(f"word{i % 97} and word{i % 89}" for i in range(700))  # 2,100 words
    assert diff_text(prose, prose.replace("word5 ", "WORD5 ")).how == "words"


def test_a_change_in_the_middle_of_a_long_text_is_shown_with_its_context():
    a = "x " * 20_000 + "cat " + "y " * 20_000
    b = "x " * 20_000 + "dog " + "y " * 20_000
    d = diff_text(a, b, show=2_000)
    for text, pieces, more in ((a, d.left, d.left_more), (b, d.right, d.right_more)):
        _check_offsets(text, pieces, more)
        assert pieces[0].skipped == 40_000 - 1 - CONTEXT_CHARS and pieces[-1].skipped > 0  # the blank goes with " cat"
    assert [p.text for p in d.left if p.changed] == [" cat"] and [p.text for p in d.right if p.changed] == [" dog"]


def test_what_is_shown_is_clipped_and_the_rest_counted():
    d = diff_text("a" * 50 + " x", "b" * 50 + " y", show=10)
    assert sum(len(p.text) for p in d.left) == 10 and d.left_more == 42
    d = diff_text("z" * 100, "z" * 100, show=10)
    assert d.same and _spell(d.left) == "z" * 10 and d.left_more == d.right_more == 90


def test_common_prefix_and_suffix():
    a, b = "x" * 10_000 + "A" + "y" * 9_000, "x" * 10_000 + "B" + "y" * 9_000
    assert common_prefix(a, b) == 10_000 and common_suffix(a, b, len(a)) == 9_000
    assert common_prefix("abc", "abc") == 3 and common_prefix("", "abc") == 0
    assert common_suffix("aaa", "aaaa", 2) == 2  # never into what the prefix took


# ------------------------------------------------------------------------ turns


def test_turns_pair_identical_ones_first_then_by_role():
    # a failed call, its error and the correction on the left; on the right the history that
    # replaced them with one turn: the identical turns match and the first call pairs the replacement
    left = [("system", "S"), ("user", "Q"), ("assistant", "call 1"), ("tool", "NameError"), ("assistant", "call 2"),
            ("tool", "650"), ("assistant", "answer")]
    right = [("system", "S"), ("user", "Q"), ("assistant", "call 2, merged"), ("tool", "650"), ("assistant", "answer")]
    assert align(left, right) == [(0, 0), (1, 1), (2, 2), (3, None), (4, None), (5, 3), (6, 4)]


def test_turns_of_different_roles_are_not_paired():
    assert align([("user", "a"), ("assistant", "b")], [("assistant", "c"), ("user", "d")]) == [
        (0, None), (None, 0), (1, None), (None, 1)]
    assert align([], [("user", "x")]) == [(None, 0)]


def test_long_episodes_pair_by_index_in_bounded_time():
    n = 20_000  # past ALIGN_WORK: no difflib
    assert n * n > ALIGN_WORK
    left = [("assistant" if i % 2 else "tool", "{") for i in range(n)]
    right = [("assistant" if i % 2 else "tool", "}") for i in range(n + 1)]
    t0 = time.perf_counter()
    pairs = align(left, right)
    assert time.perf_counter() - t0 < 1.0
    assert pairs[:3] == [(0, 0), (1, 1), (2, 2)] and pairs[-1] == (None, n)


def test_the_worst_turn_lists_difflib_is_given_are_quick():
    side = int(ALIGN_WORK ** 0.5)
    left = [("assistant", "{")] * side
    right = [("tool", "}"), ("assistant", "{")] * (side // 2)
    t0 = time.perf_counter()
    align(left, right)
    assert time.perf_counter() - t0 < 0.5


def test_read_cap_reads_short_turns_whole_and_shares_the_rest():
    assert read_cap([10, 20, 30], 1_000, 500) == 500  # everything fits: the per-turn bound
    assert read_cap([1_000_000] + [10] * 999, 2_000_000, 2**21) == 2**21  # one megabyte turn, read whole
    cap = read_cap([100, 5_000, 5_000], 4_100, 10_000)
    assert cap == 2_000 and 100 + 2 * cap <= 4_100
    assert read_cap([], 10, 5) == 5


# ------------------------------------------------------------------------ any text


@ORDINARY
@given(hostile_texts(), hostile_texts(), st.integers(0, 4))
def test_the_pieces_spell_each_side(a, b, budget):
    d = diff_text(a, b, budget=Budget([0, 10, 1_000, 100_000, 10**9][budget]))
    _check_offsets(a, d.left, d.left_more)
    _check_offsets(b, d.right, d.right_more)
    assert 0.0 <= d.ratio <= 1.0
    assert d.same == (a == b)
    if d.how == "words" and not any(p.skipped for p in d.left + d.right):
        # what is unchanged is the same text on both sides
        assert "".join(p.text for p in d.left if not p.changed) == "".join(p.text for p in d.right if not p.changed)


# ------------------------------------------------------------------------ bounded on hostile input


def _middle(text: str) -> str:
    return text[: len(text) // 2] + "<changed>" + text[len(text) // 2 + 1:]


@pytest.mark.parametrize("name", NAMES)
def test_diff_text_is_linear(name):
    a = corpus()[name]
    assert_linear(diff_text, a, other_text(name), name=f"{name} vs the next")
    assert_linear(diff_text, a, _middle(a), name=f"{name} vs itself changed in the middle")
    assert_linear(diff_text, a, "x" + a[:-1], name=f"{name} vs itself shifted")


def _interleaved(n: int, rep: int, tail: str) -> str:
    """n words: a few words repeated ``rep`` times each, interleaved with one: difflib's worst case
    that its junk heuristic does not catch (2,000 words: 1.6 s)."""
    k = max(1, n // (2 * rep))
    return " ".join(f"v{i % k} {tail}{'' if tail == 'y' else i}" for i in range(n // 2))


@pytest.mark.parametrize("words", [1_000, 2_000, 100_000])
def test_difflibs_worst_case_stays_within_the_budget(words):
    a, b = _interleaved(words, 10, "y"), _interleaved(words, 10, "z")
    assert_linear(diff_text, a, b, name=f"{words} interleaved words")


def test_a_megabyte_against_a_megabyte_of_lines():
    a = "".join(f"line {i}\n" for i in range(MB // 12))
    b = "".join(f"line {i + 1}\n" for i in range(MB // 12))
    assert_linear(diff_text, a, b, name="a megabyte of numbered lines, shifted by one")
