"""R3L reads what a model wrote in time linear in its size (issue 50): ``parse_reflection``
(and ``_as_int``), the reflection and guidance prompts, fed the 1 MB adversarial corpus of
``tests/hostile_text.py`` under its time budget, and checked by hypothesis never to raise and to
return what it returned before on inputs of ordinary size.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reflexdb.methods.r3l.prompts import episode_log, guidance_message, reflection_messages
from reflexdb.methods.r3l.reflections import KEYS, OUTCOMES, _as_int, parse_reflection

from tests.hostile_text import MB, ORDINARY, assert_linear, corpus, hostile_texts, other_text

NAMES = list(corpus())


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
    assert_linear(episode_log, text, [(text, other_text(name)), (text, None)], text, name=name)
    assert_linear(reflection_messages, text, [(text, text)], "not solved (reward 0)", name=name)
    assert_linear(guidance_message, text, name=name)


@ORDINARY
@given(text=hostile_texts())
def test_the_guidance_embeds_any_report_as_written(text):
    assert text.strip() in guidance_message(text)["content"]
    assert text.strip() in reflection_messages("q", [(text, "Incorrect.")], "x")[1]["content"]
