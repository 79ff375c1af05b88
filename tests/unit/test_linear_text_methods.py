"""The method packages read what a model wrote in time linear in its size (issue 50).

Every function under ``methods/`` (and in the out-of-tree example ``examples/plugins/selfcheck``)
that reads model text is fed the 1 MB adversarial corpus of ``tests/hostile_text.py`` under its
time budget, and checked by hypothesis never to raise and to return what it returned before on
inputs of ordinary size:

- R3L: ``parse_reflection`` (and ``_as_int``), the reflection and guidance prompts;
- LTE: ``hint_text``, ``hinted_question`` (a wrong answer is listed cut to ``ANSWER_CHARS``);
- CLEANER: ``similarity`` (difflib up to ``SIMILARITY_CHARS`` per side, lines past it),
  ``fence_token`` and ``shallow_merge`` (a block's token searched among the first ``MERGE_TOKENS``
  tokens spelling at most ``MERGE_CHARS`` characters);
- selfcheck: ``parse_verdict``.

Before the change, on this project's 2-core machine: ``similarity`` of two 64,000-character texts
took 40 s (1 MB: hours), of the corpus's 1 MB texts 0.2-1.4 s; ``fence_token`` on a 1 MB turn with
its block at the end 2-8 s, ``shallow_merge`` of two such turns 5 s to over 12 s.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import json
import random
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reflexdb.collector.engines import Sample
from reflexdb.collector.tasks import tool_use
from reflexdb.methods.cleaner import saar
from reflexdb.methods.cleaner.saar import (MERGE_CHARS, MERGE_TOKENS, SIMILARITY_CHARS, fence_token, line_similarity,
                                           searchable, shallow_merge, similarity)
from reflexdb.methods.lte.hints import ANSWER_CHARS, KINDS, hint_text, hinted_question
from reflexdb.methods.r3l.prompts import episode_log, guidance_message, reflection_messages
from reflexdb.methods.r3l.reflections import KEYS, OUTCOMES, _as_int, parse_reflection

from tests.hostile_text import MB, assert_linear, corpus, hostile_texts

NAMES = list(corpus())
ROOT = Path(__file__).resolve().parents[2]
FENCE = "\n```python\nprint(1)\n```"
ORDINARY = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _other(name: str) -> str:
    """Another text of the corpus, for two-sided functions."""
    return corpus()[NAMES[(NAMES.index(name) + 1) % len(NAMES)]]


# ---------------------------------------------------------------------------------------- R3L


def _reflection(field: str) -> str:
    """A well-formed reflection whose text fields hold ``field``, after some chatter."""
    return "Here is my reflection: " + json.dumps({
        "trajectory_summary": field, "root_cause_analysis": field, "trajectory_outcome": "failure",
        "improvement_suggestion": field, "retry_from_step": 0})


#: JSON that makes the standard library's parser do the most work per byte (Python objects, deep
#: nesting, big numbers), wrapped as a reflection would be.
JSON_SHAPES = {
    "empty lists": '{"a": [' + ",".join(["[]"] * (MB // 3)) + "]}",
    "empty objects": '{"a": [' + ",".join(["{}"] * (MB // 3)) + "]}",
    "nested 900 deep, repeated": '{"a": [' + ",".join(["[" * 900 + "]" * 900] * (MB // 1801)) + "]}",
    "nested past the recursion limit": '{"a": ' + "[" * MB + "]" * MB + "}",
    "a 1 MB integer pivot": '{"retry_from_step": ' + "9" * MB + "}",
    "a 1 MB string pivot": '{"retry_from_step": "' + "9" * MB + '"}',
    "a 1 MB float pivot": '{"retry_from_step": 1.' + "0" * MB + "}",
    "4,299-digit integers": '{"a": [' + ",".join(["9" * 4299] * (MB // 4300)) + "]}",
    "distinct keys": "{" + ",".join(f'"{i:x}": {{}}' for i in range(MB // 10)) + "}",
}


@pytest.mark.parametrize("name", NAMES)
def test_a_reflection_is_parsed_in_linear_time(name):
    text = corpus()[name]
    assert_linear(parse_reflection, text, 3, name=name)
    assert_linear(parse_reflection, _reflection(text), 3, name=f"a reflection holding {name}")
    assert_linear(parse_reflection, "{" + text + "}", 3, name=f"{{{name}}}")
    assert_linear(_as_int, text, name=name)


@pytest.mark.parametrize("shape", list(JSON_SHAPES))
def test_the_costliest_json_is_parsed_in_linear_time(shape):
    assert_linear(parse_reflection, JSON_SHAPES[shape], 3, name=shape)
    p = parse_reflection(JSON_SHAPES[shape], 3)  # longer than any reflection: refused before json.loads
    assert not p.valid and p.error.endswith("characters; a reflection holds at most 65,536")


@ORDINARY
@given(text=st.one_of(hostile_texts(), hostile_texts(40).map(_reflection),
                      hostile_texts(40).map(lambda s: "{" + s + "}")), n_turns=st.integers(0, 4))
def test_a_reflection_of_any_text_is_read_by_the_rule(text, n_turns):
    p = parse_reflection(text, n_turns)
    assert p.valid == (p.error is None)
    if p.valid:
        assert set(KEYS) <= set(p.fields) and p.outcome in OUTCOMES and 0 <= p.pivot < n_turns


@pytest.mark.parametrize("name", NAMES)
def test_the_r3l_prompts_are_built_in_linear_time(name):
    text = corpus()[name]
    assert_linear(episode_log, text, [(text, _other(name)), (text, None)], text, name=name)
    assert_linear(reflection_messages, text, [(text, text)], "not solved (reward 0)", name=name)
    assert_linear(guidance_message, text, name=name)


@ORDINARY
@given(text=hostile_texts())
def test_the_guidance_embeds_any_report_as_written(text):
    assert text.strip() in guidance_message(text)["content"]
    assert text.strip() in reflection_messages("q", [(text, "Incorrect.")], "x")[1]["content"]


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
    assert_linear(similarity, a, _other(name), name=f"{name} vs the next")
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
    from tests.store.test_cleaner import ANSWER, FAILED_0, FIXED_0, TASK, Scripted
    from tests.store.test_cleaner import saar as saar_rollout

    monkeypatch.setattr(saar, "MERGE_TOKENS", 2)
    eng = Scripted(tok, [FAILED_0, FIXED_0, ANSWER])
    [[se]] = saar_rollout(eng).saar_episodes([TASK], 1)
    [rb] = se.rollbacks
    assert rb.recovered and rb.similarity >= 0.5 and rb.replacement == "deep"
    assert [u.text for u in se.ep.trajectory().turns if u.role == "assistant"] == [FIXED_0, ANSWER]


# ---------------------------------------------------------------------------- selfcheck plug-in


@lru_cache(maxsize=1)
def parse_verdict():
    """The plug-in's ``parse_verdict``, read from its source alone: importing the plug-in would
    register its method, workflow and migrations in this test process."""
    path = ROOT / "examples/plugins/selfcheck/src/reflexdb_selfcheck/workflow.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_VERDICT")
            or (isinstance(n, ast.FunctionDef) and n.name == "parse_verdict")]
    space = {"re": re}
    exec(compile(ast.Module(keep, type_ignores=[]), str(path), "exec"), space)
    return space["parse_verdict"]


@pytest.mark.parametrize("name", NAMES)
def test_a_verdict_is_read_in_linear_time(name):
    assert_linear(parse_verdict(), corpus()[name], name=name)


@ORDINARY
@given(text=hostile_texts())
def test_a_verdict_is_the_first_yes_or_no(text):
    words = re.findall(r"\w+", text)
    first = next((w.lower() for w in words if w.casefold() in ("yes", "no")), None)
    assert parse_verdict()(text) == first
