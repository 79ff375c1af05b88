"""Constrained decoding: ``SamplingParams.json_schema`` on the ``hf`` engine (xgrammar's token
bitmask over the logits) and its pass-through to SGLang.

The tiny random model writes gibberish, which is the point: whatever it would say, the grammar
must turn it into JSON that satisfies the schema.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from reflexdb.collector.engines import SamplingParams, encode_prompt
from reflexdb.collector.engines.hf import HFEngine
from reflexdb.collector.errors import MissingDependency
from reflexdb.models import tiny_model_dir

MODEL_CACHE = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or Path(tempfile.gettempdir()) / "reflexdb-model-cache")

SYSTEM = {"role": "system", "content": "Answer with one JSON object describing a person."}
PROMPTS = [
    [SYSTEM, {"role": "user", "content": "Who lives at number 4?"}],
    [SYSTEM, {"role": "user", "content": "Describe the baker, please."}],
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "city": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "city", "age"],
    "additionalProperties": False,
}
SCHEMA_JSON = json.dumps(SCHEMA)


@pytest.fixture(scope="module")
def tiny() -> HFEngine:
    return HFEngine(tiny_model_dir(MODEL_CACHE), device="cpu")


def assert_valid(text: str) -> None:
    """``text`` is strict JSON satisfying SCHEMA (checked by hand: no jsonschema dependency)."""
    obj = json.loads(text)
    assert isinstance(obj, dict) and set(obj) == {"name", "city", "age"}, text
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 30
    assert isinstance(obj["city"], str) and len(obj["city"]) <= 20
    assert type(obj["age"]) is int and 0 <= obj["age"] <= 120


def check_samples(groups, n: int) -> int:
    """Every finished sample is valid; log-probs are finite and <= 0. Returns how many finished."""
    assert [len(g) for g in groups] == [n] * len(groups)
    finished = 0
    for s in (s for g in groups for s in g):
        assert s.logprobs.shape == s.token_ids.shape
        assert np.isfinite(s.logprobs).all() and (s.logprobs <= 0).all()
        if s.finish_reason == "length":  # cut before the JSON closed: not expected at these lengths
            continue
        assert s.finish_reason == "stop" and s.stop is None
        assert_valid(s.text)
        finished += 1
    return finished


# -- SamplingParams --------------------------------------------------------------------------


def test_json_schema_validation():
    params = SamplingParams(json_schema=SCHEMA_JSON)
    assert params.json_schema == SCHEMA_JSON and hash(params) == hash(SamplingParams(json_schema=SCHEMA_JSON))
    assert SamplingParams().json_schema is None
    # A mapping (e.g. from YAML) is stored as its JSON text, so the params stay hashable.
    assert json.loads(SamplingParams(json_schema=SCHEMA).json_schema) == SCHEMA  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        SamplingParams(json_schema="{'type': 'object'}")
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        SamplingParams(json_schema="")
    with pytest.raises(ValueError, match="json_schema must be a JSON object, got an array"):
        SamplingParams(json_schema="[1, 2]")
    with pytest.raises(ValueError, match="json_schema must be a JSON object, got a string"):
        SamplingParams(json_schema='"object"')
    with pytest.raises(TypeError, match="json_schema must be a JSON string"):
        SamplingParams(json_schema=3)  # type: ignore[arg-type]


# -- hf engine -------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_every_sample_satisfies_the_schema(tiny, temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=200, json_schema=SCHEMA_JSON, seed=0)
    groups = tiny.generate(PROMPTS, n=3, params=params)
    assert check_samples(groups, 3) == 6
    texts = {s.text for g in groups for s in g}
    assert len(texts) > 1  # still sampling, not one forced answer


def test_logprobs_are_those_of_the_masked_distribution(tiny):
    groups = tiny.generate(PROMPTS, n=2, params=SamplingParams(max_new_tokens=200, json_schema=SCHEMA_JSON, seed=1))
    samples = [s for g in groups for s in g]
    free = tiny.score([s.prompt_ids for s in samples], [s.token_ids for s in samples])
    for s, r in zip(samples, free):
        # Masking renormalises over the allowed tokens: never below the unconstrained log-prob ...
        assert np.all(s.logprobs >= r.logprobs - 1e-4)
        # ... and a token the grammar forces has probability 1: EOS, the only token after the '}'.
        assert s.finish_reason == "stop" and s.text.endswith("}")
        assert s.logprobs[-1] == pytest.approx(0.0, abs=1e-6) and r.logprobs[-1] < -1
    assert any(np.any(s.logprobs > r.logprobs + 1e-2) for s, r in zip(samples, free))


def test_greedy_and_top_p_with_a_schema(tiny):
    greedy_params = SamplingParams(temperature=0, max_new_tokens=200, json_schema=SCHEMA_JSON)
    greedy = tiny.generate(PROMPTS, n=2, params=greedy_params)
    assert check_samples(greedy, 2) == 4
    assert greedy[0][0].token_ids.tolist() == greedy[0][1].token_ids.tolist()
    nucleus_params = SamplingParams(top_p=0.8, max_new_tokens=200, json_schema=SCHEMA_JSON, seed=2)
    nucleus = tiny.generate(PROMPTS, n=2, params=nucleus_params)
    assert check_samples(nucleus, 2) == 4


def test_free_decoding_is_unconstrained_and_never_imports_xgrammar(tiny, monkeypatch):
    # None in sys.modules makes `import xgrammar` fail: free decoding must not try it.
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    groups = tiny.generate(PROMPTS, n=2, params=SamplingParams(max_new_tokens=40, seed=0))
    for s in (s for g in groups for s in g):
        with pytest.raises(ValueError):  # the tiny random model does not write JSON by itself
            json.loads(s.text)
    with pytest.raises(MissingDependency, match="pip install --no-deps xgrammar apache-tvm-ffi"):
        tiny.generate(PROMPTS, params=SamplingParams(max_new_tokens=5, json_schema=SCHEMA_JSON))


def test_truncated_rows_stay_length(tiny):
    groups = tiny.generate(PROMPTS, n=2, params=SamplingParams(max_new_tokens=6, json_schema=SCHEMA_JSON, seed=0))
    for s in (s for g in groups for s in g):
        assert s.finish_reason == "length" and len(s.token_ids) == 6
        assert s.text.startswith("{")
        with pytest.raises(ValueError):
            json.loads(s.text)


def test_a_schema_xgrammar_refuses_is_a_value_error(tiny):
    before = tiny.prefill_tokens
    with pytest.raises(ValueError, match='json_schema cannot be compiled: Unsupported type "nonsense"'):
        tiny.generate(PROMPTS, params=SamplingParams(json_schema='{"type": "nonsense"}'))
    assert tiny.prefill_tokens == before  # refused before any forward pass


def test_compiled_grammars_are_cached_per_schema(tiny):
    params = SamplingParams(max_new_tokens=3, json_schema=SCHEMA_JSON, seed=0)
    tiny.generate(PROMPTS[:1], params=params)
    compiler, compiled = tiny.grammars.compiler, tiny.grammars.compiled[SCHEMA_JSON]
    tiny.generate(PROMPTS[:1], params=params)
    assert tiny.grammars.compiler is compiler and tiny.grammars.compiled[SCHEMA_JSON] is compiled


def test_shared_prefix_and_kept_cache_prefills(tiny):
    """The mask lives in the decode loop, so every prefill path gives valid JSON."""
    params = SamplingParams(max_new_tokens=200, json_schema=SCHEMA_JSON, seed=3)
    tiny.min_shared_prefix = 1  # the two prompts share the system prompt: one prefill for it
    try:
        before = (tiny.prompt_tokens, tiny.prefill_tokens)
        groups = tiny.generate(PROMPTS, n=3, params=params)
        asked, computed = tiny.prompt_tokens - before[0], tiny.prefill_tokens - before[1]
        assert computed < asked / 3  # n copies of each prompt's cache, and the prefix once
        assert check_samples(groups, 3) == 6

        # A second turn that continues each kept conversation prefills only its new tokens.
        tiny.keep_kv = True
        first = tiny.generate(PROMPTS, n=1, params=params)
        follow = encode_prompt(tiny.tokenizer, [{"role": "user", "content": "Another one."}])
        turns = [g[0].prompt_ids.tolist() + g[0].token_ids.tolist() + follow for g in first]
        before = tiny.prefill_tokens
        groups = tiny.generate(turns, n=2, params=params)
        assert tiny.prefill_tokens - before == 2 * (len(follow) + 1)  # the last sampled token and the turn
        assert check_samples(groups, 2) == 4
    finally:
        tiny.min_shared_prefix, tiny.keep_kv = 64, False
        tiny.forget_kv()


# -- sglang ----------------------------------------------------------------------------------


def test_sglang_passes_json_schema_through():
    from reflexdb.collector.engines.sglang import SGLangEngine

    engine = SGLangEngine.__new__(SGLangEngine)  # no server: only the parameter mapping
    assert engine._sampling_params(SamplingParams(json_schema=SCHEMA_JSON))["json_schema"] == SCHEMA_JSON
    assert "json_schema" not in engine._sampling_params(SamplingParams())
