"""Engines: the ``hf`` engine on the tiny random model (fast) and on SmolLM2-135M (``slow``), the
model cache, and the ``sglang`` adapter (its output parsing here; the real thing only on a GPU).

Models are cached in ``$REFLEXDB_MODEL_CACHE`` or ``<tmp>/reflexdb-model-cache``, independent of
REFLEXDB_HOME, so SmolLM2's one-time GGUF conversion (~30 s) is paid once per machine.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from reflexdb.collector.engines import (
    Engine,
    SamplingParams,
    encode_prompt,
    make_engine,
)
from reflexdb.collector.engines.hf import HFEngine, sample_tokens
from reflexdb.collector.errors import CheckpointMismatch, UnknownName
from reflexdb.models import build_once, tiny_model_dir

MODEL_CACHE = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or Path(tempfile.gettempdir()) / "reflexdb-model-cache")

CHATS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 41 + 7? Answer with a number."}],
]


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    return tiny_model_dir(MODEL_CACHE)


@pytest.fixture(scope="session")
def tiny(tiny_dir) -> HFEngine:
    return HFEngine(tiny_dir, device="cpu")


def assert_matches_score(engine: HFEngine, samples, *, temperature: float = 1.0, atol: float = 1e-4) -> None:
    scored = engine.score([s.prompt_ids for s in samples], [s.token_ids for s in samples], temperature=temperature)
    for s, r in zip(samples, scored):
        assert r.logprobs.shape == s.logprobs.shape
        np.testing.assert_allclose(s.logprobs, r.logprobs, atol=atol, rtol=0)
        np.testing.assert_allclose(s.embedding, r.embedding, atol=atol, rtol=0)


# -- sampling math ---------------------------------------------------------------------------


def test_sample_tokens_draws_from_the_tempered_nucleus():
    # softmax([2, 1, 0, -1]) = [.6439, .2369, .0871, .0321]; with top_p = 0.7 the mass before
    # token 1 is .6439 <= .7 (kept), before token 2 it is .8808 > .7 (dropped).
    # Renormalised nucleus: [.6439, .2369] / .8808 = [.7311, .2689].
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits, SamplingParams(top_p=0.7), gen)
    assert set(tokens.tolist()) == {0, 1}
    assert (tokens == 0).float().mean().item() == pytest.approx(0.7311, abs=0.015)
    expected = torch.where(tokens == 0, math.log(0.7311), math.log(0.2689))
    torch.testing.assert_close(logprobs, expected, atol=1e-3, rtol=0)

    # Temperature 2, no truncation: softmax([1, .5, 0, -.5])
    #   = [2.718, 1.649, 1, .6065] / 5.973 = [.4551, .2760, .1674, .1015].
    tokens, logprobs = sample_tokens(logits, SamplingParams(temperature=2.0), gen)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    torch.testing.assert_close(freq, torch.tensor([0.4551, 0.2760, 0.1674, 0.1015]), atol=0.015, rtol=0)
    torch.testing.assert_close(logprobs, torch.log_softmax(logits / 2, -1).gather(-1, tokens[:, None]).squeeze(1))

    # Greedy: the argmax, with the untempered log-prob.
    tokens, logprobs = sample_tokens(logits[:2], SamplingParams(temperature=0.0), gen)
    assert tokens.tolist() == [0, 0]
    assert logprobs[0].item() == pytest.approx(math.log(0.6439), abs=1e-3)


def test_sampling_params_validation():
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(TypeError):
        SamplingParams(stop="</answer>")  # type: ignore[arg-type]
    assert SamplingParams(stop=["a"], stop_token_ids=[3]).stop == ("a",)


# -- hf engine on the tiny model -------------------------------------------------------------


def test_generate_shapes_and_types(tiny):
    assert isinstance(tiny, Engine)
    params = SamplingParams(max_new_tokens=6, seed=0)
    groups = tiny.generate(CHATS, n=3, params=params)
    assert [len(g) for g in groups] == [3, 3]
    for chat, group in zip(CHATS, groups):
        prompt = encode_prompt(tiny.tokenizer, chat)
        for s in group:
            assert s.prompt_ids.dtype == np.int32 and s.prompt_ids.tolist() == prompt
            assert s.token_ids.dtype == np.int32 and s.logprobs.dtype == np.float32
            assert s.token_ids.shape == s.logprobs.shape == (6,)
            assert s.finish_reason == "length" and s.truncated and s.stop is None
            assert s.embedding.shape == (tiny.hidden_size,) == (64,) and s.embedding.dtype == np.float32
            assert np.all(s.logprobs <= 0) and np.isfinite(s.embedding).all()
            assert s.text == tiny.tokenizer.decode(s.token_ids.tolist(), skip_special_tokens=True)
            assert s.confidence == pytest.approx(math.exp(s.logprobs.mean()), rel=1e-6)


def test_generation_prints_no_library_warning(tiny, caplog):
    """transformers >= 5.24 renamed the KV cache argument (`past_key_values` -> `cache`): the engine
    uses the name its transformers takes, so a clean run prints no deprecation warning."""
    import logging
    import warnings

    tiny._cache_kw = None  # as on a fresh engine
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        tiny.generate(CHATS, n=2, params=SamplingParams(max_new_tokens=4, seed=0))
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "deprecated" in m], said


def test_logprobs_and_embedding_match_score_with_padding_and_early_stops(tiny):
    prompts = [CHATS[0], CHATS[1], "plain text prompt", [1, 2, 3]]  # four lengths: left padding
    first = tiny.generate(prompts, n=2, params=SamplingParams(max_new_tokens=10, seed=1))
    # End some rows early (they leave the batch mid-way) by making tokens they drew stop tokens.
    stop_ids = (int(first[0][0].token_ids[3]), int(first[2][1].token_ids[1]))
    groups = tiny.generate(prompts, n=2, params=SamplingParams(max_new_tokens=10, seed=1, stop_token_ids=stop_ids))
    samples = [s for g in groups for s in g]
    assert groups[0][0].token_ids.tolist() == first[0][0].token_ids[:4].tolist()
    assert groups[0][0].finish_reason == "stop" and groups[2][1].finish_reason == "stop"
    assert {len(s.token_ids) for s in samples} > {10}
    assert_matches_score(tiny, samples)


def test_same_seed_same_samples(tiny):
    params = SamplingParams(max_new_tokens=5, seed=3)
    a = tiny.generate(CHATS, n=2, params=params)
    b = tiny.generate(CHATS, n=2, params=params)
    c = tiny.generate(CHATS, n=2, params=SamplingParams(max_new_tokens=5, seed=4))
    ids = lambda groups: [s.token_ids.tolist() for g in groups for s in g]  # noqa: E731
    assert ids(a) == ids(b) != ids(c)
    assert a[0][0].token_ids.tolist() != a[0][1].token_ids.tolist()  # the n samples differ


def test_greedy_and_tempered_logprobs(tiny):
    greedy = tiny.generate(CHATS, n=2, params=SamplingParams(temperature=0, max_new_tokens=5))
    assert greedy[0][0].token_ids.tolist() == greedy[0][1].token_ids.tolist()
    assert_matches_score(tiny, [s for g in greedy for s in g])  # untempered
    hot = tiny.generate(CHATS, n=1, params=SamplingParams(temperature=0.5, max_new_tokens=5, seed=0))
    assert_matches_score(tiny, [g[0] for g in hot], temperature=0.5)
    # With top-p the recorded log-prob is renormalised over the nucleus: never below the
    # untruncated tempered log-prob.
    nucleus = tiny.generate(CHATS, n=2, params=SamplingParams(top_p=0.5, max_new_tokens=5, seed=0))
    samples = [s for g in nucleus for s in g]
    full = tiny.score([s.prompt_ids for s in samples], [s.token_ids for s in samples])
    assert all(np.all(s.logprobs >= r.logprobs - 1e-5) for s, r in zip(samples, full))
    assert any(np.any(s.logprobs > r.logprobs + 1e-3) for s, r in zip(samples, full))


def test_stop_strings_and_max_tokens(tiny):
    ref = tiny.generate([CHATS[0]], params=SamplingParams(temperature=0, max_new_tokens=8))[0][0]
    ids = ref.token_ids.tolist()
    dec = lambda k: tiny.tokenizer.decode(ids[:k])  # noqa: E731
    # A stop string: the text the 5th token adds; generation must end at its first occurrence.
    stop = dec(5)[len(dec(4)) :].strip() or dec(5)[len(dec(4)) :]
    expected = next(k for k in range(1, 9) if stop in dec(k))
    out = tiny.generate([CHATS[0]], params=SamplingParams(temperature=0, max_new_tokens=8, stop=(stop, "\x00never")))
    s = out[0][0]
    assert s.finish_reason == "stop" and s.stop == stop
    assert s.token_ids.tolist() == ids[:expected]
    # max_new_tokens
    short = tiny.generate([CHATS[0]], params=SamplingParams(temperature=0, max_new_tokens=3))[0][0]
    assert short.finish_reason == "length" and short.token_ids.tolist() == ids[:3]
    # a stop token on the very last allowed step is still "stop"
    last = tiny.generate(
        [CHATS[0]], params=SamplingParams(temperature=0, max_new_tokens=3, stop_token_ids=(ids[2],))
    )[0][0]
    assert last.finish_reason == "stop" and last.token_ids.tolist() == ids[: ids.index(ids[2]) + 1]


def test_score_batches_and_keeps_order(tiny):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 1000, size=k).tolist() for k in (3, 30, 7, 12)]
    responses = [rng.integers(10, 1000, size=k).tolist() for k in (9, 2, 25, 1)]
    together = tiny.score(prompts, responses)
    alone = [tiny.score([p], [r])[0] for p, r in zip(prompts, responses)]
    for a, b, r in zip(together, alone, responses):
        assert a.logprobs.shape == (len(r),)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-4)
    with pytest.raises(ValueError):
        tiny.score([[1]], [[]])


def test_load_weights_in_place(tiny_dir, tmp_path):
    engine = HFEngine(tiny_dir, device="cpu")
    prompt, response = [[1, 2, 3, 4]], [[5, 6, 7]]
    before = engine.score(prompt, response)[0]
    perturbed = HFEngine(tiny_dir, device="cpu").model
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    perturbed.save_pretrained(tmp_path / "ckpt")
    params_before = {k: id(v) for k, v in engine.model.named_parameters()}

    engine.load_weights(tmp_path / "ckpt")
    after = engine.score(prompt, response)[0]
    assert engine.checkpoint == str(tmp_path / "ckpt")
    assert {k: id(v) for k, v in engine.model.named_parameters()} == params_before  # in place
    assert np.abs(after.logprobs - before.logprobs).max() > 1e-3
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()

    engine.load_weights(f"file://{tiny_dir}")
    np.testing.assert_array_equal(engine.score(prompt, response)[0].logprobs, before.logprobs)


def test_load_weights_rejects_a_mismatched_checkpoint(tiny_dir, tmp_path):
    from safetensors.torch import save_file

    engine = HFEngine(tiny_dir, device="cpu")
    before = engine.score([[1, 2]], [[3]])[0].logprobs
    save_file({"model.embed_tokens.weight": torch.zeros(49152, 64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointMismatch, match="missing"):
        engine.load_weights(tmp_path)
    np.testing.assert_array_equal(engine.score([[1, 2]], [[3]])[0].logprobs, before)  # untouched


def test_engine_registry(tiny_dir):
    engine = make_engine("hf", model=str(tiny_dir), device="cpu")
    assert engine.kind == "hf" and engine.model_name == tiny_dir.name
    with pytest.raises(UnknownName, match="known: fast, hf, sglang"):
        make_engine("vllm")


# -- model cache -------------------------------------------------------------------------------


def test_build_once_is_safe_under_concurrency(tmp_path):
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        time.sleep(0.2)
        (out / "weights").write_text("w")

    results = []
    threads = [threading.Thread(target=lambda: results.append(build_once(tmp_path / "m", build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and set(results) == {tmp_path / "m"}
    assert (tmp_path / "m" / "weights").read_text() == "w"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]

    def broken(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        build_once(tmp_path / "b", broken)
    assert not (tmp_path / "b").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


# -- SmolLM2-135M-Instruct (slow: one-time conversion, then ~4 s to load) -----------------------


# -- sglang adapter --------------------------------------------------------------------------


class _FakeSGLang:
    """Answers like ``sglang.Engine.generate`` (lists of dicts with ``meta_info``)."""

    def __init__(self, D: int = 4):
        self.D = D
        self.calls: list[dict] = []

    def generate(self, input_ids, sampling_params, return_logprob, return_hidden_states, logprob_start_len=None):
        self.calls.append({"input_ids": input_ids, "sampling_params": sampling_params, "start": logprob_start_len})
        outs = []
        for i, ids in enumerate(input_ids):
            P = len(ids)
            if sampling_params.get("max_new_tokens") == 0:  # prefill only: rows start-1 .. end
                start = logprob_start_len[i]
                rows = [[float(k)] * self.D for k in range(start, P)]
                meta = {
                    "input_token_logprobs": [(None if k == 0 else -0.1 * k, ids[k], None) for k in range(start, P)],
                    "hidden_states": [rows],
                    "finish_reason": {"type": "length", "length": 0},
                }
                outs.append({"text": "", "output_ids": [], "meta_info": meta})
                continue
            T = 3
            out_ids = [7, 8, 9]
            prefill = [[float(k)] * self.D for k in range(P)]  # the state at position k is k
            decode = [[float(P + k)] * self.D for k in range(T - 1)]
            meta = {
                "output_token_logprobs": [(-0.5 * (k + 1), t, None) for k, t in enumerate(out_ids)],
                "hidden_states": [prefill] + decode,
                "finish_reason": {"type": "stop", "matched": 9} if i % 2 == 0 else {"type": "length", "length": T},
            }
            outs.append({"text": "x", "output_ids": out_ids, "meta_info": meta})
        return outs


def _fake_sglang_engine(tiny_dir):
    from reflexdb.collector.engines.sglang import SGLangEngine
    from transformers import AutoTokenizer

    engine = SGLangEngine.__new__(SGLangEngine)
    engine._engine = _FakeSGLang()
    engine._tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    engine._hidden_size, engine._model_name, engine._warned_top_p, engine.checkpoint = 4, "fake", False, ""
    return engine


def test_sglang_adapter_parses_outputs(tiny_dir):
    engine = _fake_sglang_engine(tiny_dir)
    groups = engine.generate([[1, 2, 3, 4, 5]], n=2, params=SamplingParams(stop=("</answer>",), seed=5))
    call = engine._engine.calls[-1]
    assert call["input_ids"] == [[1, 2, 3, 4, 5]] * 2
    assert call["sampling_params"]["stop"] == ["</answer>"] and call["sampling_params"]["sampling_seed"] == 5
    a, b = groups[0]
    assert a.token_ids.tolist() == [7, 8, 9] and a.logprobs.tolist() == [-0.5, -1.0, -1.5]
    assert (a.finish_reason, b.finish_reason) == ("stop", "length")
    # states that produced o_1..o_3: positions P-1=4 (prefill's last row), 5, 6 → mean 5.
    np.testing.assert_allclose(a.embedding, [5.0] * 4)

    (r,) = engine.score([[1, 2, 3, 4, 5]], [[7, 8, 9]])
    assert engine._engine.calls[-1]["start"] == [4]
    np.testing.assert_allclose(r.logprobs, [-0.5, -0.6, -0.7])  # positions 5, 6, 7
    np.testing.assert_allclose(r.embedding, [5.0] * 4)  # rows 4, 5, 6 of the prefill
    with pytest.raises(ValueError):
        engine.score([[1]], [[2]], temperature=0.7)


def _has_sglang_and_cuda() -> bool:
    import importlib.util

    return torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None
