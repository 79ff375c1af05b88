"""SmolLM2-135M itself (the real model): sampling against a separate forward pass, finish reasons, weight reloads, multi-attempt episodes; SGLang where a GPU has it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reflexdb.collector.engines import (
    SamplingParams,
    encode_prompt,
    make_engine,
)
from reflexdb.collector.engines.hf import HFEngine
from reflexdb.models import smollm2_dir

from reflexdb import GroupIn
from tests.unit.test_engine_hf import (  # noqa: F401
    CHATS,
    MODEL_CACHE,
    _has_sglang_and_cuda,
    assert_matches_score,
)


@pytest.fixture(scope="module")
def smol() -> HFEngine:
    return HFEngine(smollm2_dir(MODEL_CACHE), device="cpu")


def test_smollm2_samples_match_a_separate_forward_pass(smol):
    assert smol.hidden_size == 576 and smol.model_name == "SmolLM2-135M-Instruct"
    groups = smol.generate(CHATS, n=2, params=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12, seed=0))
    samples = [s for g in groups for s in g]
    for s in samples:
        assert s.embedding.shape == (576,)
        assert s.finish_reason in ("stop", "length")
        assert (s.finish_reason == "length") == (len(s.token_ids) == 12 and s.token_ids[-1] != 2)
    assert_matches_score(smol, samples, atol=1e-3)


def test_smollm2_finish_reasons(smol):
    prompt = [[{"role": "user", "content": "What is 2+3? Answer briefly."}]]
    done = smol.generate(prompt, params=SamplingParams(temperature=0, max_new_tokens=24))[0][0]
    assert done.finish_reason == "stop" and done.stop is None
    assert done.token_ids[-1] == smol.tokenizer.eos_token_id  # <|im_end|> kept, nothing after it
    assert "<|im_end|>" not in done.text and "5" in done.text
    cut = smol.generate(prompt, params=SamplingParams(temperature=0, max_new_tokens=3))[0][0]
    assert cut.finish_reason == "length" and cut.token_ids.tolist() == done.token_ids[:3].tolist()
    word = done.text.split()[1]
    stopped = smol.generate(prompt, params=SamplingParams(temperature=0, max_new_tokens=24, stop=(word,)))[0][0]
    assert stopped.finish_reason == "stop" and stopped.stop == word
    assert stopped.text.endswith(word) or word in stopped.text[-len(word) - 2 :]
    assert len(stopped.token_ids) < len(done.token_ids)


def test_smollm2_weight_reload_changes_outputs(smol, tmp_path):
    prompt, response = [encode_prompt(smol.tokenizer, CHATS[0])], [smol.tokenizer.encode("It is 5.")]
    before = smol.score(prompt, response)[0].logprobs
    original = smol.checkpoint
    with torch.no_grad():
        for p in smol.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    smol.model.save_pretrained(tmp_path / "v1")
    smol.load_weights(original)  # back to the published base weights
    np.testing.assert_array_equal(smol.score(prompt, response)[0].logprobs, before)
    smol.load_weights(tmp_path / "v1")
    assert np.abs(smol.score(prompt, response)[0].logprobs - before).max() > 1e-2
    smol.load_weights(original)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_sglang_and_cuda(), reason="needs a CUDA GPU and sglang")
def test_sglang_agrees_with_hf(tmp_path):
    from reflexdb.collector.engines.sglang import SGLangEngine

    path = smollm2_dir(MODEL_CACHE)
    sgl = SGLangEngine(path, mem_fraction_static=0.3)
    try:
        hf = HFEngine(path, device="cuda", dtype="float32")
        groups = sgl.generate(CHATS, n=2, params=SamplingParams(max_new_tokens=16, seed=0))
        samples = [s for g in groups for s in g]
        scored = hf.score([s.prompt_ids for s in samples], [s.token_ids for s in samples])
        for s, r in zip(samples, scored):
            assert s.embedding.shape == (576,)
            assert np.median(np.abs(s.logprobs - r.logprobs)) < 0.05
            cos = s.embedding @ r.embedding / (np.linalg.norm(s.embedding) * np.linalg.norm(r.embedding))
            assert cos > 0.99
        own = sgl.score([s.prompt_ids for s in samples], [s.token_ids for s in samples])
        assert all(np.median(np.abs(o.logprobs - s.logprobs)) < 0.05 for o, s in zip(own, samples))
        hf.model.save_pretrained(tmp_path / "same")
        sgl.load_weights(tmp_path / "same")
    finally:
        sgl.close()
from tests.store.test_episodes import MODEL_CACHE, TASKS, check_episode, rollout  # noqa: F401


def test_three_attempt_episode_with_smollm2(store):
    engine = make_engine("hf", model=smollm2_dir(MODEL_CACHE), device="cpu")
    try:
        r = rollout(engine, max_new_tokens=24, seed=11)  # 3 turns of up to 24 tokens: the checks need turns, not length
        run_id = store.create_run("episodes-smollm2")
        from reflexdb import TaskIn
        [task_id] = store.add_tasks(run_id, [TaskIn(TASKS[0].prompt, TASKS[0].ground_truth)])
        episodes = r.run([TASKS[0]._replace(id=task_id)], 2)[0]
        scored = engine.score([t.prompt_ids for t in episodes], [t.response_ids for t in episodes])
        w = store.write_group(GroupIn(run_id=run_id, task_id=task_id, policy_version=3, trajectories=episodes))
        [group] = store.read_groups([w.group_id])
        for t, s, got in zip(episodes, scored, group.trajectories):
            check_episode(engine, t, 3)
            mask = got.loss_mask
            assert mask.sum() == sum(u.token_end - u.token_start for u in t.turns if u.role == "assistant")
            assert np.abs(s.logprobs[mask] - t.logprobs[mask]).max() < 1e-3  # every assistant token
            assert got.response_ids.tolist() == t.response_ids.tolist() and np.array_equal(got.logprobs, t.logprobs)
            assert [(u.role, u.text, u.token_start, u.token_end) for u in got.turns] == \
                   [(u.role, u.text, u.token_start, u.token_end) for u in t.turns]
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not (__import__("torch").cuda.is_available()
                         and __import__("importlib").util.find_spec("sglang") is not None),
                    reason="needs a CUDA GPU and sglang")
def test_driver_over_sglang():
    """The same driver over the sglang engine: token-id prompts each turn, the same checks; its
    behaviour log-probs against the HF engine's score() of the whole conversation (bf16 kernels:
    the median gap, as in test_engine_hf.py's SGLang test)."""
    from reflexdb.collector.engines.sglang import SGLangEngine

    path = smollm2_dir(MODEL_CACHE)
    sgl = SGLangEngine(path, mem_fraction_static=0.3)
    try:
        episodes = [t for row in rollout(sgl, max_new_tokens=24).run(TASKS, 2) for t in row]
        hf = make_engine("hf", model=path, device="cuda", dtype="float32")
        scored = hf.score([t.prompt_ids for t in episodes], [t.response_ids for t in episodes])
        for t, s in zip(episodes, scored):
            check_episode(sgl, t, 3)
            mask = np.zeros(len(t.response_ids), bool)
            for u in t.turns:
                if u.role == "assistant":
                    mask[u.token_start:u.token_end] = True
            assert np.median(np.abs(s.logprobs[mask] - t.logprobs[mask])) < 0.05
    finally:
        sgl.close()
