"""CLEANER reads what a model wrote in time linear in its size (issue 50): ``similarity``
(difflib up to ``SIMILARITY_CHARS`` per side, lines past it), ``fence_token`` and ``shallow_merge``
(a block's token searched among the first ``MERGE_TOKENS`` tokens spelling at most ``MERGE_CHARS``
characters), fed the 1 MB adversarial corpus of ``tests/hostile_text.py`` under its time budget.

Before the change, on this project's 2-core machine: ``similarity`` of two 64,000-character texts
took 40 s (1 MB: hours), of the corpus's 1 MB texts 0.2-1.4 s; ``fence_token`` on a 1 MB turn with
its block at the end 2-8 s, ``shallow_merge`` of two such turns 5 s to over 12 s.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import random
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reflexdb.collector.engines import Sample
from reflexdb.collector.tasks import tool_use
from reflexdb.methods.cleaner import saar
from reflexdb.methods.cleaner.saar import (MERGE_CHARS, MERGE_TOKENS, SIMILARITY_CHARS, fence_token, line_similarity,
                                           searchable, shallow_merge, similarity)

from tests.hostile_text import MB, ORDINARY, assert_linear, corpus, hostile_texts, other_text

NAMES = list(corpus())
FENCE = "\n```python\nprint(1)\n```"


# ------------------------------------------------------------------------ CLEANER: similarity


def random_pair(n: int, alphabet: int = 150, seed: int = 0) -> tuple[str, str]:
    """Two random texts over ``alphabet`` CJK characters: each character rarer than difflib's
    'popular' cut (1%), so none is junked: its worst case (64,000 characters: 40 s before)."""
    rng = random.Random(seed)
    chars = [chr(0x4E00 + i) for i in range(alphabet)]
    return "".join(rng.choices(chars, k=n)), "".join(rng.choices(chars, k=n))


@pytest.mark.parametrize("name", NAMES)
def test_similarity_is_linear(name):
    a = corpus()[name]
    assert_linear(similarity, a, other_text(name), name=f"{name} vs the next")
    assert_linear(similarity, a, a, name=f"{name} vs itself")
    assert_linear(similarity, a, "x" + a[:-1], name=f"{name} vs itself shifted")
    assert_linear(similarity, a, "print(1)", name=f"{name} vs a line")


#: Pairs on which difflib is slowest, by what they are (and what they took before).
WORST_PAIRS = {
    "1 MB random pair": lambda: random_pair(MB),
    "64,000-character random pair (40 s before)": lambda: random_pair(64_000),
    "random pair at the cap (difflib's, 0.14 s)": lambda: random_pair(SIMILARITY_CHARS),
    "16,000 characters against 198 (0.9 s before)": lambda: ("".join(random.Random(1).choices("ab", k=16_000)),
                                                             "ab" * 99),
}


@pytest.mark.parametrize("what", list(WORST_PAIRS))
def test_similarity_of_difflib_worst_pairs_is_bounded(what):
    a, b = WORST_PAIRS[what]()
    assert_linear(similarity, a, b, name=what)
    assert_linear(similarity, b, a, name=f"{what}, swapped")


@ORDINARY
@given(a=hostile_texts(), b=hostile_texts())
def test_similarity_of_ordinary_sizes_is_difflibs(a, b):
    assert max(len(a), len(b)) <= SIMILARITY_CHARS
    assert similarity(a, b) == difflib.SequenceMatcher(None, a, b).ratio()


@ORDINARY
@given(a=hostile_texts(30), b=hostile_texts(30), n=st.integers(1, 3000))
def test_similarity_past_the_cap_is_a_ratio(a, b, n):
    a, b = (a or "x") * n, (b or "y") * n
    s = similarity(a, b)
    assert 0.0 <= s <= 1.0 and similarity(a, a) == 1.0
    if max(len(a), len(b)) > SIMILARITY_CHARS:
        assert similarity(b, a) == s == line_similarity(a, b)


def _python(n: int, seed: int) -> str:
    """``n`` characters of real Python (the standard library's), from a place set by ``seed``."""
    source = "".join(inspect.getsource(m) for m in (argparse, json.decoder, inspect))
    start = random.Random(seed).randrange(len(source) - n)
    return source[start:start + n]


@pytest.mark.parametrize("n", [SIMILARITY_CHARS + 1, 8_000, 16_000])
def test_past_the_cap_the_replacement_agrees_with_difflib_on_real_code(n):
    """The rule's decision (γ = 0.5) on ordinary code just past the cap is difflib's: a typo fixed
    (shallow), the code re-indented into a function (shallow), other code (deep)."""
    for seed in range(3):
        code = _python(n, seed)
        lines = code.split("\n")
        lines[len(lines) // 2] += "  # fixed"
        cases = {"typo": "\n".join(lines), "wrapped": "def main():\n" + "\n".join("    " + x for x in code.split("\n")),
                 "other": _python(n, seed + 100)}
        for what, fixed in cases.items():
            exact = difflib.SequenceMatcher(None, code, fixed).ratio()
            assert (similarity(code, fixed) >= 0.5) == (exact >= 0.5), (what, similarity(code, fixed), exact)


def test_line_similarity_counts_the_characters_of_shared_lines():
    # shared lines "a = 1" (5) and "b" (1), twice "c" in a against once in b: 2·(5 + 1 + 1) / (5+1+1+1 + 5+1+1+2)
    assert line_similarity("a = 1\nb\nc\nc", "  a = 1\nb\nc\ndd\n\n") == pytest.approx(14 / 17)
    assert line_similarity("x\ny", "y\nx") == 1.0 and line_similarity("x", "y") == 0.0
    assert line_similarity(" \n", " \n") == 1.0 and line_similarity(" ", "\n") == 0.0


# ------------------------------------------------------------- CLEANER: fence_token, shallow_merge


def fence_token_before(tokenizer, token_ids, text):
    """``fence_token`` before issue 50 (bisecting the whole turn): the reference within the bounds."""
    pos = tool_use.block_start(text)
    if pos is None:
        return None
    ids = [int(i) for i in token_ids]
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid + 1], skip_special_tokens=True)) > pos:
            hi = mid
        else:
            lo = mid + 1
    return lo


@pytest.fixture(scope="module")
def tok(model_cache):
    from reflexdb.models import tiny_model_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir(model_cache))


def _sample(tok, ids: list[int]) -> Sample:
    """A sample of these token ids, as the engine returns one (text: their decoding)."""
    ids = np.asarray(ids, np.int32)
    return Sample(np.asarray([1], np.int32), ids, np.full(len(ids), -0.5, np.float32), "stop",
                  tok.decode(ids.tolist(), skip_special_tokens=True), np.ones(8, np.float32))


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text.encode("utf-8", "replace").decode("utf-8"), add_special_tokens=False)  # lone surrogates: '?'


@lru_cache(maxsize=4)
def _megabyte_ids(tok, name: str) -> tuple[int, ...]:
    """Token ids decoding to about 1 MB of the corpus text ``name`` (its first 16 KB, repeated)."""
    unit = _ids(tok, corpus()[name][:16_384]) or [0]
    per = max(1, len(tok.decode(unit).encode("utf-8")))
    return tuple(unit * (MB // per + 1))


def _placed(tok, name: str, where: str) -> list[int]:
    """1 MB of ``name`` with a Python block: at its end, or as far in as fence_token searches."""
    body, fence = list(_megabyte_ids(tok, name)), _ids(tok, FENCE)
    if where == "end":
        return body + fence
    spelled = np.cumsum([len(t) for t in tok.convert_ids_to_tokens(body)])
    room = MERGE_CHARS - sum(len(t) for t in tok.convert_ids_to_tokens(fence))
    start = min(int(np.searchsorted(spelled, room, side="right")), MERGE_TOKENS - len(fence))
    return body[:start] + fence + body[start:]


#: The corpus texts the token-level tests use: each costs several decodes of a million tokens to set
#: up (seconds), and the search they check is bounded by MERGE_TOKENS whatever the text, so eight
#: kinds stand for the thirty: fences, an unclosed one, braces, one character, one four-byte
#: character, mixed scripts, invalid UTF-8, an escape sequence.
TOKEN_NAMES = ["repeated '```python\\n'", "repeated '```'", "unclosed fence", "nested braces", "run of one letter",
               "run of one emoji", "mixed scripts", "invalid utf-8", "repeated '\\x1b['"]


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_fence_token_is_bounded(tok, name):
    for where in ("end", "near the bound"):
        ids = _placed(tok, name, where)
        s = _sample(tok, ids)
        assert_linear(fence_token, tok, s.token_ids, s.text, name=f"{name}, block at the {where}")
        k = fence_token(tok, s.token_ids, s.text)
        pos = tool_use.block_start(s.text)
        if k is not None:  # exact: the block's first character lies in token k
            assert len(tok.decode(ids[:k], skip_special_tokens=True)) <= pos < len(
                tok.decode(ids[:k + 1], skip_special_tokens=True))
        else:  # it starts past what the search decodes
            assert len(tok.decode(ids[:searchable(tok, ids)], skip_special_tokens=True)) <= pos
    assert_linear(fence_token, tok, s.token_ids, corpus()[name], name=f"{name}, text not the ids' decoding")


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_a_shallow_merge_is_bounded(tok, name):
    near, end = _sample(tok, _placed(tok, name, "near the bound")), _sample(tok, _placed(tok, name, "end"))
    assert_linear(shallow_merge, tok, near, near, name=f"{name}, blocks near the bound")
    assert_linear(shallow_merge, tok, end, near, name=f"{name}, a block past the bound")
    if tool_use.block_start(end.text) >= len(tok.decode(list(end.token_ids[:searchable(tok, end.token_ids)]))):
        assert shallow_merge(tok, end, near) is None  # SAAR replaces it deep


def _turn(text: str, code: str) -> str:
    return f"{text}\n```python\n{code}\n```{text[:7]}"


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(text=hostile_texts(40), code=hostile_texts(20))
def test_fence_token_finds_what_it_found_before(tok, text, code):
    for t in (text, _turn(text, code)):
        s = _sample(tok, _ids(tok, t))
        assert fence_token(tok, s.token_ids, s.text) == fence_token_before(tok, s.token_ids, s.text)
        assert fence_token(tok, s.token_ids, t) == fence_token_before(tok, s.token_ids, t)  # t may not be the ids' text


def shallow_merge_before(tokenizer, failed, correction):
    """``shallow_merge`` before issue 50: the reference within the bounds."""
    kf = fence_token_before(tokenizer, failed.token_ids, failed.text)
    kc = fence_token_before(tokenizer, correction.token_ids, correction.text)
    prefix = failed.text[:tool_use.block_start(failed.text)]
    start_c = tool_use.block_start(correction.text)
    kept = tokenizer.decode([int(i) for i in failed.token_ids[:kf]], skip_special_tokens=True)
    before_c = tokenizer.decode([int(i) for i in correction.token_ids[:kc]], skip_special_tokens=True)
    through_c = tokenizer.decode([int(i) for i in correction.token_ids[:kc + 1]], skip_special_tokens=True)
    if kept == prefix and before_c == correction.text[:start_c]:
        seam_ids, tail = [], kc
    else:
        seam = prefix[len(kept):] + through_c[start_c:]
        seam_ids, tail = tokenizer.encode(seam, add_special_tokens=False), kc + 1
    ids = np.concatenate([np.asarray(failed.token_ids[:kf]), np.asarray(seam_ids, dtype=np.int64),
                          np.asarray(correction.token_ids[tail:])]).astype(np.int32)
    lps = np.concatenate([np.asarray(failed.logprobs[:kf]), np.zeros(len(seam_ids)),
                          np.asarray(correction.logprobs[tail:])]).astype(np.float32)
    return Sample(prompt_ids=failed.prompt_ids, token_ids=ids, logprobs=lps, finish_reason=correction.finish_reason,
                  text=tokenizer.decode(ids.tolist(), skip_special_tokens=True), embedding=correction.embedding,
                  stop=correction.stop)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(r1=hostile_texts(30), c1=hostile_texts(15), r2=hostile_texts(30), c2=hostile_texts(15))
def test_a_shallow_merge_is_what_it_was_before(tok, r1, c1, r2, c2):
    failed, fixed = _sample(tok, _ids(tok, _turn(r1, c1))), _sample(tok, _ids(tok, _turn(r2, c2)))
    merged, before = shallow_merge(tok, failed, fixed), shallow_merge_before(tok, failed, fixed)
    assert merged.token_ids.tolist() == before.token_ids.tolist() and merged.text == before.text
    assert merged.logprobs.tolist() == before.logprobs.tolist() and merged.prompt_ids is before.prompt_ids


def test_a_block_past_the_bound_is_replaced_deep(tok, monkeypatch):
    """A shallow replacement (s ≥ γ) whose failed turn's block starts past the tokens fence_token
    searches (MERGE_TOKENS, 2 here) is made deep: the correction whole, recorded as ``deep``."""
    from tests.methods.cleaner.store.test_cleaner import ANSWER, FAILED_0, FIXED_0, TASK, Scripted
    from tests.methods.cleaner.store.test_cleaner import saar as saar_rollout

    monkeypatch.setattr(saar, "MERGE_TOKENS", 2)
    eng = Scripted(tok, [FAILED_0, FIXED_0, ANSWER])
    [[se]] = saar_rollout(eng).saar_episodes([TASK], 1)
    [rb] = se.rollbacks
    assert rb.recovered and rb.similarity >= 0.5 and rb.replacement == "deep"
    assert [u.text for u in se.ep.trajectory().turns if u.role == "assistant"] == [FIXED_0, ANSWER]
