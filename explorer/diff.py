"""Two trajectories side by side: their turns paired, each pair's texts with the differences marked.

Everything here reads what a model wrote, so it must finish in time linear in the input's size
(tests/unit/test_explorer_diff.py runs it on the 1 MB texts of tests/hostile_text.py). difflib's
``SequenceMatcher`` is what a reader expects of a diff, but its worst case is much worse than
quadratic on repetitive text: two texts of 2,000 words drawn from 100 distinct ones, interleaved,
took 1.6 s, of 4,000 words 11 s, and 400 braces against alternating ones 2 s (under 200 items
difflib junks nothing; this project's 2-core machine). So, as CLEANER's similarity does:

- the texts' common beginning and end are cut off first, in chunks compared in C (linear);
- what is left is diffed word by word with difflib, counting its steps as it goes
  (:class:`_Bounded`): it is stopped past :data:`WORD_WORK` of them (0.1 s at worst, idle) or
  what the page's budget has left (:class:`Budget`, :data:`PAGE_WORK`);
- past either bound, lines are compared instead (:func:`_lines`): a line of one side is marked as
  changed unless the other side holds it too (as a multiset: one pass over each side, no alignment).

Turns are paired by :func:`align`: the identical turns of both sides (same role and text) are
matched with difflib where the turn counts are small (:data:`ALIGN_WORK`), and between two matched
turns the others are paired in order when their roles agree; past the bound, by index.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest

#: The steps difflib may take on one pair of texts (:class:`_Bounded`); past them the pair's lines
#: are compared. On this project's 2-core machine a step took 200 ns idle and 400-800 ns under a
#: load of 17 (difflib's worst inputs found: 199 braces against alternating ones, 1.45 million
#: steps), so this is 0.1 s at worst, 0.4 s on a busy machine. Prose takes far fewer: two 20,000-
#: character texts of docs/ sharing most lines, 47,000 steps.
WORD_WORK = 500_000
#: The steps all the word diffs of one page may take together (0.4 s at worst, idle).
PAGE_WORK = 2_000_000
#: A middle longer than this many characters is not split into words at all (it goes to lines).
WORD_CHARS = 100_000
#: Characters shown of each side of one pair (the rest is counted, not shown).
SHOW_CHARS = 20_000
#: Unchanged characters kept on each side of a change; a longer unchanged run is cut to that much
#: before and after, the rest counted (a change in the middle of a megabyte turn is shown).
CONTEXT_CHARS = 400
#: difflib pairs turns while ``turns(a) * turns(b)`` is at most this; past it, turns pair by index.
ALIGN_WORK = 10_000

#: A word or a mark with the blanks before it, or blanks at the end: prose gives about one token
#: per word, and a word keeps matching whatever follows it. Linear: a run of blanks with no word
#: after it is tried once (backtracked over once) and then taken whole by the last alternative.
_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
_CHUNK = 4096


@dataclass(frozen=True)
class Piece:
    """A run of one side's text: ``changed`` when the other side does not hold it there; or, with
    ``skipped`` set (and no text), that many unchanged characters left out between two changes."""

    text: str
    changed: bool
    skipped: int = 0


@dataclass(frozen=True)
class TextDiff:
    """One pair of texts compared.

    Attributes:
        left, right: each side's text as pieces, at most ``show`` characters of it.
        how: ``"same"`` (identical), ``"words"`` (difflib on words), ``"lines"`` (lines marked
            shared or not, the bounded comparison) or ``"only"`` (:func:`one_side`).
        ratio: ``2 M / T`` as difflib's ``ratio()``: M the characters both hold, T all of both.
        left_more, right_more: characters of each side past what is shown.
    """

    left: tuple[Piece, ...]
    right: tuple[Piece, ...]
    how: str
    ratio: float
    left_more: int = 0
    right_more: int = 0

    @property
    def same(self) -> bool:
        return self.how == "same"


class Budget:
    """The steps the word diffs of one page may still take (:class:`_Bounded`)."""

    def __init__(self, work: int = PAGE_WORK):
        self.left = work


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix, in chunks compared in C (linear)."""
    n, i = min(len(a), len(b)), 0
    while i < n:
        j = min(n, i + _CHUNK)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def common_suffix(a: str, b: str, limit: int) -> int:
    """The length of the longest common suffix, at most ``limit`` characters."""
    n, k = min(len(a), len(b), limit), 0
    while k < n:
        m = min(n, k + _CHUNK)
        if a[len(a) - m:len(a) - k] != b[len(b) - m:len(b) - k]:
            while a[len(a) - 1 - k] == b[len(b) - 1 - k]:
                k += 1
            return k
        k = m
    return n


def diff_text(a: str, b: str, *, budget: Budget | None = None, show: int = SHOW_CHARS) -> TextDiff:
    """``a`` (left) against ``b`` (right), each side's text as pieces marked changed or not.

    Bounded on any input: linear in ``len(a) + len(b)`` plus a word diff stopped past
    :data:`WORD_WORK` steps (or what ``budget`` has left); module docstring.
    """
    if a == b:
        return _same(a, show)
    p = common_prefix(a, b)
    s = common_suffix(a, b, min(len(a), len(b)) - p)
    budget = Budget() if budget is None else budget
    words = _word_bounds(a, b, p, s)
    if words is not None:
        wp, ws = words
        ta, tb = _TOKEN.findall(a[wp:len(a) - ws]), _TOKEN.findall(b[wp:len(b) - ws])
        found = _words(ta, tb, budget)
        if found is not None:
            return _result(a, b, wp, ws, *found, "words", show)
    lp, ls = _line_bounds(a, p, s)
    left, right, shared = _lines(a[lp:len(a) - ls], b[lp:len(b) - ls], show)
    return _result(a, b, lp, ls, left, right, shared, "lines", show)


def one_side(text: str, show: int = SHOW_CHARS) -> TextDiff:
    """A turn the other side has no partner for: all of it changed (``how`` ``"only"``)."""
    pieces, more = _clip([Piece(text, True)], show)
    return TextDiff(pieces, (), "only", 0.0, more, 0)


def _same(a: str, show: int) -> TextDiff:
    left, more = _clip([Piece(a, False)], show)
    return TextDiff(left, left, "same", 1.0, more, more)


def _word_bounds(a: str, b: str, p: int, s: int) -> tuple[int, int] | None:
    """The common prefix and suffix moved back to a word's edge (at most 200 characters), or None
    when either middle is too long to split into words."""
    p = _back_to_blank(a, p)
    s = len(a) - _forward_to_blank(a, len(a) - s)
    if max(len(a), len(b)) - p - s > WORD_CHARS:  # the longer middle
        return None
    return p, s


def _back_to_blank(text: str, i: int) -> int:
    """``i`` moved back to where the blanks before its word start (tokens carry the blanks before
    them), at most 200 characters; ``i`` itself when that is further."""
    j = i
    while j > 0 and i - j < 200 and not text[j - 1].isspace():
        j -= 1
    while j > 0 and i - j < 200 and text[j - 1].isspace():
        j -= 1
    return j if j == 0 or not text[j - 1].isspace() else i


def _forward_to_blank(text: str, i: int) -> int:
    """``i`` moved forward to a blank (a word's end), at most 200 characters."""
    j = i
    while j < len(text) and j - i < 200 and not text[j].isspace():
        j += 1
    return j if j == len(text) or text[j].isspace() else i


def _line_bounds(a: str, p: int, s: int) -> tuple[int, int]:
    """The common prefix and suffix cut to whole lines: the prefix ends after its last newline, the
    suffix starts after its first (both inside the common text, so a line start on both sides)."""
    lp = a.rfind("\n", 0, p) + 1
    nl = a.find("\n", len(a) - s) if s else -1
    return lp, 0 if nl == -1 else len(a) - nl - 1


class _OverBudget(Exception):
    pass


class _Bounded(difflib.SequenceMatcher):
    """difflib's matcher, stopped once its steps pass ``steps``.

    Its cost is in ``find_longest_match``: a call walks each item of its range of ``a`` and that
    item's positions in ``b`` (none for a "popular" item, one more frequent than 1% of a ``b`` of
    200 items or more: difflib's autojunk). Each call is charged that walk before it runs, read
    from running sums over ``a`` (one pass), so the count is never below what the call does."""

    def __init__(self, a: list[str], b: list[str], steps: int):
        super().__init__(None, a, b)
        self.left = steps
        self.sums = [0]
        for x in a:
            self.sums.append(self.sums[-1] + len(self.b2j.get(x, ())))

    def find_longest_match(self, alo=0, ahi=None, blo=0, bhi=None):
        ahi = len(self.a) if ahi is None else ahi
        self.left -= self.sums[ahi] - self.sums[alo] + (ahi - alo) + 1
        if self.left < 0:
            raise _OverBudget
        return super().find_longest_match(alo, ahi, blo, bhi)


def _words(ta: list[str], tb: list[str], budget: Budget) -> tuple[list[Piece], list[Piece], int] | None:
    """The word diff of two token lists, or None when it would pass what ``budget`` allows for one
    pair (what it spent until it stopped is spent)."""
    allowed = min(budget.left, WORD_WORK)
    matcher = _Bounded(ta, tb, allowed)
    try:
        opcodes = matcher.get_opcodes()
    except _OverBudget:
        budget.left -= allowed
        return None
    budget.left -= allowed - matcher.left
    left: list[Piece] = []
    right: list[Piece] = []
    shared = 0
    for op, i1, i2, j1, j2 in opcodes:
        x, y = "".join(ta[i1:i2]), "".join(tb[j1:j2])
        if op == "equal":
            shared += len(x)
        _add(left, x, op != "equal")
        _add(right, y, op != "equal")
    return left, right, shared


def _lines(a: str, b: str, show: int) -> tuple[list[Piece], list[Piece], int]:
    """Each side's lines, marked changed unless the other side holds the same line (as many times);
    pieces only for the first ``show`` characters, the count of shared characters over all (the
    counting runs in C: ``str.split`` and ``Counter`` of a list)."""
    la, lb = a.split("\n"), b.split("\n")
    ca, cb = Counter(la), Counter(lb)
    shared = sum((len(k) + 1) * min(n, cb[k]) for k, n in ca.items() if k in cb)
    return _marked(la, cb, show), _marked(lb, ca, show), shared


def _marked(lines: list[str], other: Counter[str], show: int) -> list[Piece]:
    """The first ``show`` characters of ``lines`` (and the line that crosses it) as pieces."""
    remaining = Counter(other)
    out: list[Piece] = []
    run: list[str] = []  # the texts of the run of lines being built, all marked alike
    changed, n = False, 0
    for i, line in enumerate(lines):
        held = remaining[line] > 0
        if held:
            remaining[line] -= 1
        if run and held == changed:  # the mark flips: the run so far is a piece
            out.append(Piece("".join(run), changed))
            run = []
        changed = not held
        run.append(line if i == len(lines) - 1 else line + "\n")
        n += len(run[-1])
        if n > show:
            break
    if run:
        out.append(Piece("".join(run), changed))
    return out


def _add(pieces: list[Piece], text: str, changed: bool) -> None:
    if not text:
        return
    if pieces and pieces[-1].changed == changed:
        pieces[-1] = Piece(pieces[-1].text + text, changed)
    else:
        pieces.append(Piece(text, changed))


def _result(a: str, b: str, p: int, s: int, left: list[Piece], right: list[Piece], shared: int, how: str,
            show: int) -> TextDiff:
    """The whole of each side as pieces (the common prefix and suffix around the middle's), clipped."""
    sides = []
    for text, mid in ((a, left), (b, right)):
        pieces: list[Piece] = []
        _add(pieces, text[:p], False)
        for piece in mid:
            _add(pieces, piece.text, piece.changed)
        _add(pieces, text[len(text) - s:] if s else "", False)
        sides.append(_clip(_elide(pieces), show, len(text)))
    total = len(a) + len(b)
    ratio = 2 * (p + s + shared) / total if total else 1.0
    (lp, lm), (rp, rm) = sides
    return TextDiff(lp, rp, how, min(1.0, ratio), lm, rm)


def _elide(pieces: list[Piece]) -> list[Piece]:
    """Each unchanged run cut to :data:`CONTEXT_CHARS` next to the changes around it (the first run
    keeps its end, the last its start), the characters between counted as skipped."""
    if not any(x.changed for x in pieces):
        return pieces
    out: list[Piece] = []
    keep = CONTEXT_CHARS
    for i, piece in enumerate(pieces):
        first, last = i == 0, i == len(pieces) - 1
        room = (0 if first else keep) + (0 if last else keep)
        if piece.changed or len(piece.text) <= room + 80:
            out.append(piece)
            continue
        head = "" if first else piece.text[:keep]
        tail = "" if last else piece.text[len(piece.text) - keep:]
        if head:
            out.append(Piece(head, False))
        out.append(Piece("", False, len(piece.text) - len(head) - len(tail)))
        if tail:
            out.append(Piece(tail, False))
    return out


def _clip(pieces: list[Piece], show: int, total: int | None = None) -> tuple[tuple[Piece, ...], int]:
    """The pieces up to ``show`` characters of text, and how many characters of the text are left
    out past them (skipped pieces are counted where they stand)."""
    out, n, skipped = [], 0, 0
    for piece in pieces:
        if n >= show:
            break
        if piece.skipped:
            out.append(piece)
            skipped += piece.skipped
            continue
        text = piece.text[:show - n]
        out.append(Piece(text, piece.changed))
        n += len(text)
    size = sum(len(x.text) + x.skipped for x in pieces) if total is None else total
    return tuple(out), max(0, size - n - skipped)


# ---------------------------------------------------------------------------- turns


def align(a: Sequence[tuple[str, str]], b: Sequence[tuple[str, str]]) -> list[tuple[int | None, int | None]]:
    """Pairs of positions ``(i, j)`` of two turn lists, each turn ``(role, text)``, in order; a turn
    with no partner is paired with None.

    Identical turns are matched with difflib while ``len(a) * len(b) <= ALIGN_WORK``; the turns
    between two matches pair in order while their roles agree. Past the bound, turns pair by index
    (same roles) as the longer episodes' first turns usually do.
    """
    if len(a) * len(b) > ALIGN_WORK:
        return _gap(a, b, 0, len(a), 0, len(b))
    out: list[tuple[int | None, int | None]] = []
    i = j = 0
    for bi, bj, size in difflib.SequenceMatcher(None, list(a), list(b), autojunk=False).get_matching_blocks():
        out += _gap(a, b, i, bi, j, bj)
        out += [(bi + k, bj + k) for k in range(size)]
        i, j = bi + size, bj + size
    return out


def _gap(a: Sequence[tuple[str, str]], b: Sequence[tuple[str, str]], i1: int, i2: int, j1: int,
         j2: int) -> list[tuple[int | None, int | None]]:
    out: list[tuple[int | None, int | None]] = []
    for i, j in zip_longest(range(i1, i2), range(j1, j2)):
        if i is not None and j is not None and a[i][0] != b[j][0]:
            out += [(i, None), (None, j)]
        else:
            out.append((i, j))
    return out


__all__ = ["ALIGN_WORK", "CONTEXT_CHARS", "PAGE_WORK", "SHOW_CHARS", "WORD_WORK", "Budget", "Piece", "TextDiff", "align",
           "common_prefix", "common_suffix", "diff_text", "one_side"]
