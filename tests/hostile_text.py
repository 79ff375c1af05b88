"""Adversarial text for the functions that read what a model or a tool wrote (issue 50).

Everything a model writes is hostile input: a function that reads it must finish in time linear in
its size. This module holds the inputs that break a function that is not — repeated openers,
nested braces, unclosed fences, long runs of one character, mixed scripts, invalid UTF-8 — as a
fixed corpus of 1 MB texts (:data:`CORPUS`), as hypothesis strategies that generate such texts
(:func:`hostile_texts`, :func:`megabyte_texts`), and :func:`assert_linear`, which runs a function
on one of them in a child process and fails when it takes longer than a generous budget.

The budget (:data:`BUDGET_S`, 1 s for 1 MB on this project's 2-core machine) is not a speed
target: a linear pass over 1 MB takes milliseconds to a few hundred milliseconds here, and the
quadratic functions this replaced took minutes to hours on the same input (``extract_boxed`` took
16.7 s on 21 KB). The child is killed at ten times the budget, so a quadratic function fails the
test in seconds instead of hanging the suite.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: The size of each adversarial input.
MB = 1024 * 1024
#: Seconds one call on 1 MB may take (a linear pass takes well under it; quadratic ones took hours).
BUDGET_S = float(os.environ.get("REFLEXDB_LINEAR_BUDGET_S", "1.0"))

#: Openers that make a scan-to-the-end-per-occurrence parser quadratic when repeated.
OPENERS = (
    "\\boxed{", "\\fbox{", "\\boxed ", "<answer>", "</answer>", "```python\n", "```", "```py\n", "{", "}", "[", "]",
    '"', "'", "\\", "<", ">", "(", "$", "$$", "\\frac{", "\\left(", '{"', '{"a": ', '"pivot":', "####", "Hint:",
    "<think>", "\n", " ", "\t", "-", ",", ".", "1", "1,", "1/", "-1", "0.", "9,999,", "e", "\x1b[", "\x1b]52;c;",
    "\x1b]8;;", "\u202e", "\u0301", "\ufffd", "\U0001f600", "中", "ع",
)

#: Text a model might mix in: Latin, CJK, Arabic with a right-to-left override, combining marks,
#: emoji (four-byte UTF-8), a zero-width joiner, a replacement character, control characters.
MIXED_SCRIPTS = "The answer is 42 日本語の答え الجواب \u202e٤٢\u202c e\u0301\u0301 😀👩\u200d💻 \ufffd \x00\x07\x1b[31m "


def _repeat(unit: str, size: int = MB) -> str:
    return (unit * (size // max(1, len(unit.encode("utf-8", "surrogatepass"))) + 1))[:size]


def invalid_utf8(size: int = MB) -> str:
    """Invalid UTF-8 as a text reader sees it: bytes decoded with ``surrogateescape`` (lone
    surrogates), the way ``os.fsdecode`` and a careless ``errors=`` hand bytes to text code."""
    raw = (b"\xff\xfe\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x90\x28\xbc \\boxed{\xed\xa0\x80}" * (size // 26 + 1))[:size]
    return raw.decode("utf-8", "surrogateescape")


def _corpus() -> dict[str, str]:
    out = {f"repeated {u!r}": _repeat(u) for u in (
        "\\boxed{", "\\fbox{", "\\boxed ", "<answer>", "```python\n", "```", "{", "[", '"', "\\", "<", "$", '{"a": ',
        "####", "1,", "-", "\x1b[", "\x1b]52;c;")}
    out.update({
        "nested braces": "\\boxed{" + "{" * (MB // 2) + "}" * (MB // 2),
        "unclosed nested braces": "\\boxed{" + "{" * MB,
        "unclosed fence": "```python\n" + "print(1)\n" * (MB // 9),
        "unclosed answer": "<answer>" + "x" * MB,
        "run of one letter": "a" * MB,
        "run of digits": "1" * MB,
        "run of spaces": " " * MB,
        "run of newlines": "\n" * MB,
        "run of one emoji": "😀" * (MB // 4),
        "mixed scripts": _repeat(MIXED_SCRIPTS),
        "invalid utf-8": invalid_utf8(),
        "json nesting": '{"a": [' * (MB // 8) + "1" + "]}" * (MB // 8),
    })
    return out


#: Name → a 1 MB adversarial text (built on first use: about 40 MB in all).
CORPUS: dict[str, str] = {}


def corpus() -> dict[str, str]:
    if not CORPUS:
        CORPUS.update(_corpus())
    return CORPUS


def other_text(name: str) -> str:
    """Another text of the corpus than ``name``'s (the next one), for two-sided functions."""
    names = list(corpus())
    return corpus()[names[(names.index(name) + 1) % len(names)]]


# ---------------------------------------------------------------------------- hypothesis strategies

#: hypothesis settings for the "returns what it returned before" tests on inputs of ordinary size.
ORDINARY = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def hostile_texts(max_units: int = 200) -> st.SearchStrategy[str]:
    """Short texts made of openers, closers, mixed scripts and arbitrary characters (surrogates
    included): for checking that a function returns the right thing and never raises."""
    unit = st.one_of(st.sampled_from(OPENERS), st.text(max_size=8),
                     st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF).map(str))
    return st.lists(unit, max_size=max_units).map("".join)


@st.composite
def megabyte_texts(draw) -> str:
    """A 1 MB text: a few hostile units, repeated; sometimes with a prefix and an unclosed tail."""
    units = draw(st.lists(st.sampled_from(OPENERS), min_size=1, max_size=4))
    prefix = draw(st.sampled_from(("", "Let me think. ", MIXED_SCRIPTS)))
    return prefix + _repeat("".join(units), MB - len(prefix.encode("utf-8", "surrogatepass")))


# ---------------------------------------------------------------------------- the budget


def _timed(conn, fn: Callable, args: tuple) -> None:
    """The child's report: the lesser of its wall and CPU seconds. Wall time alone counts the
    minutes another test's processes take the cores from it (two workers on two cores, one of them
    running a failure drill); CPU time alone counts each thread of a function that runs several.
    Either grows with the work, so a function that is not linear fails on both."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        fn(*args)
        conn.send(("ok", min(time.perf_counter() - t0, time.process_time() - c0)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        conn.send(("raised", f"{type(exc).__name__}: {exc}"[:500]))


def run_timed(fn: Callable, *args: Any, hard_s: float) -> tuple[str, Any]:
    """``fn(*args)`` in a forked child: ``("ok", seconds)``, ``("raised", message)`` or
    ``("killed", hard_s)`` when it was still running at ``hard_s``."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_timed, args=(child, fn, args), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(hard_s):
            return parent.recv()
        return "killed", hard_s
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()


def assert_linear(fn: Callable, text: Any, *more: Any, budget_s: float = BUDGET_S, name: str = "") -> float:
    """Fail unless ``fn(text, *more)`` finishes within ``budget_s`` (best of two tries, so one slow
    moment on a shared machine does not fail it) without raising. Returns the seconds taken."""
    what = f"{getattr(fn, '__qualname__', fn)} on {name or f'{len(text):,} characters'}"
    best = None
    for _ in range(2):
        status, value = run_timed(fn, text, *more, hard_s=max(10 * budget_s, 10.0))
        assert status != "raised", f"{what} raised {value}"
        assert status != "killed", f"{what} was still running after {value:g} s (budget {budget_s:g} s): not linear"
        best = value if best is None else min(best, value)
        if best <= budget_s:
            return best
    raise AssertionError(f"{what} took {best:.2f} s, over its budget of {budget_s:g} s")
