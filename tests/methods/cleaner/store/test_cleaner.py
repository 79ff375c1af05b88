"""CLEANER (METHODS.md §5; CLEANER.md Sec. 4): the similarity rule at the threshold, shallow and
deep merges, SAAR episodes through the real sandbox (two failures corrected; K failed corrections
keep the error with the note), purified rows rescored and linked to their raw twins in one
transaction, the view, the metrics, the loss, the method's config; a collector killed
mid-episode writes nothing."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from reflexdb.collector.engines import Sample, SamplingParams
from reflexdb.collector.environments import EnvTask, parse_options
from reflexdb.collector.episodes import environment_factory, own_tokens
from reflexdb.collector.rewards import get_reward
from reflexdb.methods.cleaner.saar import (
    SaarRollout,
    fence_token,
    replacement,
    shallow_merge,
    similarity,
)
from reflexdb.collector.tasks.templates import apply_chat_template
from reflexdb.collector.tasks.tool_use import NO_CODE, TRY_DIFFERENT
from reflexdb.trainer.losses import get_loss_spec
from reflexdb.methods.cleaner import cleaner_metrics

from reflexdb.config import ConfigError, parse_config
from tests.processes import rows

MODEL_CACHE = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or Path(tempfile.gettempdir()) / "reflexdb-model-cache")
TASK = EnvTask(1, "What is 48291 * 7713?", "372468483")
FAST = {"timeout_s": 2.0, "cpu_s": 2, "max_tool_calls": 3}
D = torch.float64
NULL = float("nan")

# Two failed calls, each corrected at the first attempt: a typo (shallow), then a new approach (deep).
FAILED_0 = "I multiply them.\n```python\nprint(48291 * 7713\n```"  # SyntaxError
FIXED_0 = "The parenthesis is missing.\n```python\nprint(48291 * 7713)\n```"  # similarity 0.97: shallow
FAILED_1 = "Check it another way.\n```python\nprint(x)\n```"  # NameError
FIXED_1 = "Use a loop instead.\n```python\ntotal = 0\nfor _ in range(7713):\n    total += 48291\nprint(total)\n```"  # deep
ANSWER = "So it is \\boxed{372468483}."
TWO_FIXES = [FAILED_0, FIXED_0, FAILED_1, FIXED_1, ANSWER]


class Scripted:
    """An engine whose n-th call 'samples' ``turns[n]`` for every row, tokenised exactly (the tiny
    model's tokenizer), log-prob −0.5 per token; it records each call's prompts (token ids)."""

    def __init__(self, tokenizer, turns, score=None):
        self.tokenizer, self.turns, self.prompts = tokenizer, turns, []
        if score is not None:
            self.score = score

    def generate(self, prompts, n=1, params=None):
        text = self.turns[min(len(self.prompts), len(self.turns) - 1)]
        ids = [apply_chat_template(self.tokenizer, p) if p and isinstance(p[0], dict) else list(p) for p in prompts]
        self.prompts.append(ids)
        tok = np.asarray(self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id], np.int32)
        return [[Sample(np.asarray(p, np.int32), tok, np.full(len(tok), -0.5, np.float32), "stop", text,
                        np.ones(8, np.float32)) for _ in range(n)] for p in ids]


@pytest.fixture(scope="module")
def tokenizer():
    from reflexdb.models import tiny_model_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir(MODEL_CACHE))


def saar(engine, *, share=1.0, max_attempts=3, threshold=0.5, **options):
    make_env = environment_factory("tool_python", parse_options("tool_python", {**FAST, **options}),
                                   get_reward("math"), "tool_python")
    return SaarRollout(engine, make_env, lambda: SamplingParams(max_new_tokens=64), 0, share=share,
                       max_attempts=max_attempts, threshold=threshold, rng=np.random.default_rng(0))


def spans(t):
    return [u for u in t.turns if u.token_start is not None]


# ---------------------------------------------------------------- the similarity rule (Sec. 4.2)


@pytest.mark.parametrize("failed, fixed, sim, kind", [
    ("ab", "ac", 0.5, "shallow"),  # 2·1 matching / (2 + 2) = 0.5 = γ: shallow (s ≥ γ)
    ("abc", "axy", 1 / 3, "deep"),  # 2·1 / 6
    ("abcd", "abce", 0.75, "shallow"),  # 2·3 / 8
    ("print(x)", "print(x)", 1.0, "shallow"),
    ("", "print(1)", 0.0, "deep"),
])
def test_similarity_rule_at_the_threshold(failed, fixed, sim, kind):
    assert similarity(failed, fixed) == pytest.approx(sim)
    assert replacement(similarity(failed, fixed), 0.5) == kind
    assert replacement(0.4999, 0.5) == "deep" and replacement(0.5, 0.5) == "shallow"
    assert replacement(0.9, 1.0) == "deep" and replacement(1.0, 1.0) == "shallow"


# ---------------------------------------------------------------- merges on hand-made turns


def test_shallow_and_deep_merges_on_hand_made_turns(tokenizer):
    eng = Scripted(tokenizer, [FAILED_0])
    [[failed]] = eng.generate([[1, 2]])
    eng.turns = [FIXED_0]
    [[fixed]] = eng.generate([[1, 2]])
    kf, kc = fence_token(tokenizer, failed.token_ids, failed.text), fence_token(tokenizer, fixed.token_ids, fixed.text)
    assert tokenizer.decode(failed.token_ids[:kf]) == "I multiply them.\n"
    assert tokenizer.decode(fixed.token_ids[:kc]) == "The parenthesis is missing.\n"
    merged = shallow_merge(tokenizer, failed, fixed)  # (r_t, c'_t): the reasoning kept, the code replaced
    assert merged.text == "I multiply them.\n```python\nprint(48291 * 7713)\n```"
    assert list(merged.token_ids) == list(failed.token_ids[:kf]) + list(fixed.token_ids[kc:])
    assert merged.token_ids[-1] == tokenizer.eos_token_id and merged.finish_reason == "stop"
    assert len(merged.logprobs) == len(merged.token_ids)
    assert fence_token(tokenizer, [1, 2], "no code here") is None
    with pytest.raises(ValueError, match="fenced Python block in both"):
        eng.turns = [ANSWER]
        shallow_merge(tokenizer, failed, eng.generate([[1]])[0][0])


# ---------------------------------------------------------------- SAAR episodes (real sandbox)


def test_an_episode_with_two_failures_purifies_to_the_expected_turns(tokenizer):
    eng = Scripted(tokenizer, TWO_FIXES)
    [[se]] = saar(eng).saar_episodes([TASK], 1)
    assert len(eng.prompts) == 5  # one engine call per turn, corrections included
    # the purified conversation: (r_0, c'_0, o'_0), (r'_aux, c'_1, o'_1), the answer
    pure, raw = se.ep.trajectory(), se.raw.trajectory()
    assert [(u.role, u.tool_error) for u in spans(pure)] == [("assistant", False), ("tool", False), ("assistant", False),
                                                            ("tool", False), ("assistant", False)]
    assert [u.text for u in spans(pure)][::2] == ["I multiply them.\n```python\nprint(48291 * 7713)\n```", FIXED_1,
                                                  ANSWER]
    assert "372468483" in spans(pure)[1].text and "372468483" in spans(pure)[3].text
    # the raw one: every turn as sampled, failed calls and errors included (Eq. 6)
    assert [u.text for u in spans(raw) if u.role == "assistant"] == TWO_FIXES
    assert [u.tool_error for u in spans(raw) if u.role == "tool"] == [True, False, True, False]
    assert "SyntaxError" in spans(raw)[1].text and "NameError" in spans(raw)[5].text
    assert pure.reward == raw.reward == 1.0 and pure.meta["tool_errors"] == 0
    # token spans: contiguous, the assistant spans exactly the sampled (or merged) tokens
    for t in (pure, raw):
        ends = [(u.token_start, u.token_end) for u in spans(t)]
        assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:])) and ends[-1][1] == len(t.response_ids)
    first = spans(pure)[0]
    assert tokenizer.decode(pure.response_ids[first.token_start:first.token_end],
                            skip_special_tokens=True) == spans(pure)[0].text
    assert list(pure.response_ids[spans(pure)[2].token_start:spans(pure)[2].token_end]) == \
        tokenizer.encode(FIXED_1, add_special_tokens=False) + [tokenizer.eos_token_id]  # deep: the correction whole
    own = own_tokens(pure)
    assert own.sum() == sum(u.token_end - u.token_start for u in spans(pure) if u.role == "assistant")
    # the rollbacks
    r0, r1 = se.rollbacks
    assert (r0.turn, r0.attempts, r0.recovered, r0.replacement, r0.error_status) == (0, 1, True, "shallow", "error")
    assert r0.similarity == pytest.approx(similarity("print(48291 * 7713", "print(48291 * 7713)"))
    assert (r0.failed_code, r0.corrected_code) == ("print(48291 * 7713", "print(48291 * 7713)")
    assert (r1.turn, r1.replacement) == (2, "deep") and r1.similarity < 0.5 and "NameError" in r1.error_text
    # each correction saw its error (h̃_t, Eq. 7); the next turn saw the purified history only
    seen = [tokenizer.decode(p[0]) for p in eng.prompts]
    assert "SyntaxError" in seen[1] and "print(48291 * 7713\n" in seen[1]
    assert "SyntaxError" not in seen[2] and "The parenthesis is missing" not in seen[2] and "I multiply them." in seen[2]
    assert "NameError" in seen[3] and "NameError" not in seen[4] and "Check it another way" not in seen[4]
    assert [c["lookahead"] for c in se.calls] == [False, True, False, True]


def test_k_failed_corrections_keep_the_error_with_the_note_and_stop_rollback(tokenizer):
    script = [FAILED_0, "Try y.\n```python\nprint(y)\n```", "I am not sure.", "```python\nprint(y)\n```",
              FAILED_1, ANSWER]
    eng = Scripted(tokenizer, script)
    [[se]] = saar(eng).saar_episodes([TASK], 1)
    pure, raw = se.ep.trajectory(), se.raw.trajectory()
    [rb] = se.rollbacks  # the second failure is not rolled back: rollback stopped
    assert (rb.turn, rb.attempts, rb.recovered, rb.similarity, rb.replacement) == (0, 3, False, None, None)
    assert rb.corrected_code == "print(y)" and se.stopped
    assert [u.text for u in spans(pure) if u.role == "assistant"] == [FAILED_0, FAILED_1, ANSWER]
    tools = [u for u in spans(pure) if u.role == "tool"]
    assert [u.tool_error for u in tools] == [True, True] and tools[0].text.endswith(TRY_DIFFERENT)
    assert TRY_DIFFERENT not in tools[1].text
    assert [u.text for u in spans(raw) if u.role == "assistant"] == script
    raw_tools = [u for u in spans(raw) if u.role == "tool"]
    assert len(raw_tools) == 5 and all(u.tool_error for u in raw_tools) and raw_tools[2].text == NO_CODE
    # each correction saw the ones before it; after K, the note and not the corrections
    seen = [tokenizer.decode(p[0]) for p in eng.prompts]
    assert "print(y)" in seen[2] and "I am not sure." in seen[3]
    assert TRY_DIFFERENT in seen[4] and "print(y)" not in seen[4]
    assert [c["lookahead"] for c in se.calls] == [False, True, True, False]  # no block: no call


def test_without_saar_a_failed_call_stays_and_the_episode_is_raw(tokenizer):
    eng = Scripted(tokenizer, [FAILED_0, FIXED_0, ANSWER])
    [[se]] = saar(eng, share=0.0).saar_episodes([TASK], 1)
    assert not se.saar and se.rollbacks == [] and se.look is None
    assert list(se.ep.trajectory().response_ids) == list(se.raw.trajectory().response_ids)
    assert "SyntaxError" in tokenizer.decode(eng.prompts[1][0])  # the model went on with its error in context
    with pytest.raises(ValueError, match="needs a tool environment"):
        SaarRollout(eng, environment_factory("single", parse_options("single", {}), get_reward("math"), "plain"),
                    lambda: SamplingParams(), 0).saar_episodes([TASK], 1)


# ---------------------------------------------------------------- metrics, loss, config


def test_cleaner_metrics_by_hand():
    # row a: purified, 2 rollbacks (1 shallow, 1 deep), 2 calls kept, raw 4 calls / 2 errors, 4 sandbox calls 0.4 s
    # row b: raw, 1 failed call (SAAR on, K failed: 1 rollback not recovered), 3 sandbox calls 0.2 s
    # row c: no SAAR, no call
    a = {"saar": True, "tool_calls": [{}, {}], "tool_errors": 0, "raw_tool_calls": 4, "raw_tool_errors": 2,
         "rollbacks": 2, "recovered": 2, "shallow": 1, "deep": 1, "runnable": True, "sandbox_calls": 4, "sandbox_s": 0.4}
    b = {"saar": True, "tool_calls": [{}], "tool_errors": 1, "raw_tool_calls": 4, "raw_tool_errors": 4,
         "rollbacks": 1, "recovered": 0, "shallow": 0, "deep": 0, "runnable": False, "sandbox_calls": 3, "sandbox_s": 0.2}
    c = {"saar": False, "tool_calls": [], "tool_errors": 0, "raw_tool_calls": 0, "raw_tool_errors": 0,
         "rollbacks": 0, "recovered": 0, "shallow": 0, "deep": 0, "runnable": False, "sandbox_calls": 0, "sandbox_s": 0.0}
    m = cleaner_metrics([a, b, c, {}])  # a row without CLEANER's meta is not counted
    assert m["cleaner/tool_calls_per_traj"] == pytest.approx(1.0)  # (2 + 1 + 0) / 3
    assert m["cleaner/tool_errors_per_traj"] == pytest.approx(1 / 3)
    assert m["cleaner/raw_tool_calls_per_traj"] == pytest.approx(8 / 3)
    assert m["cleaner/raw_tool_errors_per_traj"] == pytest.approx(2.0)  # (2 + 4 + 0) / 3
    assert m["cleaner/rollbacks_per_traj"] == pytest.approx(1.0)
    assert m["cleaner/recovery_rate"] == pytest.approx(2 / 3)
    assert m["cleaner/shallow_share"] == m["cleaner/deep_share"] == pytest.approx(0.5)
    assert m["cleaner/purified_share"] == pytest.approx(2 / 3) and m["cleaner/saar_share"] == pytest.approx(2 / 3)
    assert m["cleaner/runnable_share"] == pytest.approx(1 / 3)
    assert m["cleaner/sandbox_s_per_call"] == pytest.approx(0.6 / 7)
    empty = cleaner_metrics([])
    assert math.isnan(empty["cleaner/recovery_rate"]) and math.isnan(empty["cleaner/tool_calls_per_traj"])


def _dapo_case():
    # rows: 0 purified (π_old = its rescored log-probs), 1 raw (π_old = the learner's own: ratio 1),
    #       2 a NULL reward (the learner clears its mask), 3 an empty mask
    lp = torch.tensor([[-1.0, -0.5, 0.0], [-0.2, -0.4, -0.6], [-1.0, -1.0, -1.0], [-0.3, -0.3, -0.3]], dtype=D)
    old = torch.tensor([[-1.5, -0.5, 0.0], [-0.2, -0.4, -0.6], [-1.0, -1.0, -1.0], [-0.3, -0.3, -0.3]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5, 0.0, 0.7], dtype=D)  # non-binary rewards' advantages
    return lp, old, mask, adv


@pytest.mark.parametrize("micro_batch_size", [1, 2, 4])
def test_dapo_on_purified_and_raw_rows_by_hand(micro_batch_size):
    # DAPO (CLEANER.md Table 5): −1/Σ|o| Σ min(ρA, clip(ρ, 0.8, 1.28)A), token-mean, no KL
    #   row 0 token 0: ρ = e^(−1 + 1.5) = 1.6487 > 1.28, A = 1 -> min(1.6487, 1.28) = 1.28 (clipped: no gradient)
    #   row 0 token 1: ρ = 1 -> 1;  row 1: ρ = 1, A = −0.5 -> −0.5 × 3;  rows 2, 3: no token
    #   loss = −(1.28 + 1 − 1.5)/5 = −0.156;  d/dlp = −ρA/5: row 0 [0, −0.2], row 1 +0.1 each
    spec = get_loss_spec("dapo")
    params = spec.parse({})
    lp0, old, mask, adv = _dapo_case()
    full = lp0.clone().requires_grad_(True)
    out = spec.call(full, old, adv, mask, params)
    assert out.loss.item() == pytest.approx(-0.156) and out.kl.item() == 0.0
    out.loss.backward()
    torch.testing.assert_close(full.grad, torch.tensor([[0, -0.2, 0], [0.1, 0.1, 0.1], [0, 0, 0], [0, 0, 0]], dtype=D))
    part = lp0.clone().requires_grad_(True)
    total, norm = 0.0, spec.normaliser(mask, params)
    for s in range(0, 4, micro_batch_size):
        sl = slice(s, s + micro_batch_size)
        share = spec.normaliser(mask[sl], params) / norm
        if share == 0:
            continue
        loss = spec.call(part[sl], old[sl], adv[sl], mask[sl], params).loss * share
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(-0.156)
    torch.testing.assert_close(part.grad, full.grad)


def test_the_method_s_loss_origins_and_config(store):
    ORIGINS = store.origins()  # the table of origins (migration 0018)

    cfg = parse_config({"run": "r", "algorithm": "cleaner", "environment": {"name": "tool_python"},
                        "cleaner": {"saar_share": 0.7}})
    [term] = cfg.method.loss_terms(cfg, cfg.loss_params)
    assert (term.loss, cfg.loss_params.clip_eps_low, cfg.loss_params.clip_eps_high, cfg.loss_params.agg,
            cfg.loss_params.beta) == ("dapo", 0.2, 0.28, "token-mean", 0.0)
    [wf] = cfg.method.workflows(cfg)
    assert (wf.name, wf.options) == ("cleaner", {"share": 0.7, "max_attempts": 3, "threshold": 0.5})
    assert cfg.method.settings(cfg)["cleaner.saar_share"] == 0.7
    # π_old: a purified row's rescored log-probs; a raw row's, the learner's weights; both count in pass@1
    assert (ORIGINS["purified"].pi_old, ORIGINS["raw"].pi_old) == ("stored", "policy")
    assert ORIGINS["purified"].pass_at_1 and ORIGINS["raw"].pass_at_1 and not ORIGINS["purified"].sampled


@pytest.mark.parametrize("data, says", [
    ({}, "environment.name is 'single'; cleaner rolls back failed tool calls and needs environment.name: tool_python"),
    ({"environment": {"name": "tool_python"}, "cleaner": {"similarity_threshold": 1.5}}, "cleaner.similarity_threshold"),
    ({"environment": {"name": "tool_python"}, "cleaner": {"max_attempts": 0}}, "cleaner.max_attempts"),
    ({"environment": {"name": "tool_python"}, "cleaner": {"k": 3}}, "cleaner.k: unknown key"),
])
def test_bad_cleaner_config_is_refused_naming_the_key(data, says):
    with pytest.raises(ConfigError) as err:
        parse_config({"run": "r", "algorithm": "cleaner", **data})
    assert says in str(err.value)


# ---------------------------------------------------------------- the collector and the store


def _config(**cleaner):
    return parse_config({
        "run": "cleaner-rig", "model": "tiny", "algorithm": "cleaner", "max_staleness": 100,
        "environment": {"name": "tool_python", **FAST},
        "tasks": {"source": "arithmetic", "level": 7, "train_size": 2, "eval_size": 0, "template": "tool_python"},
        "collector": {"group_size": 2, "tasks_per_batch": 1, "sampling": {"max_new_tokens": 64}},
        "learner": {"groups_per_step": 1, "micro_batch_size": 1, "publish_every": 1},
        "cleaner": cleaner})


def _rig(collector, script):
    eng = Scripted(collector.engine.tokenizer, script)
    collector.engine.generate = eng.generate  # the real engine scores; the script samples
    return eng


def test_purified_and_raw_rows_are_written_linked_in_one_transaction(store, tmp_path, monkeypatch, model_cache):
    """One task, G = 2, both episodes purified twice: the training group holds the two purified
    rows (log-probs = score() of the purified context), the retry group their raw twins (as
    sampled); the rollbacks are rows; the view answers; pass@1 counts each episode once."""
    from reflexdb.collector.runner import Collector

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    collector = Collector(_config(), store, echo=lambda m: None)
    collector.setup()
    _rig(collector, TWO_FIXES)
    stats = collector.run(max_groups=2)
    assert stats.groups == 2 and stats.kinds["retry"] == 1 and stats.fresh_samples == 2
    groups = rows(store, "SELECT id, kind, size, workflow, meta->>'n_purified' FROM groups ORDER BY id")
    assert [g[1:] for g in groups] == [("fresh", 2, "cleaner", "2"), ("retry", 2, "cleaner", None)]
    train, twins = store.read_groups([groups[0][0], groups[1][0]])
    assert [t.origin for t in train.trajectories] == ["purified"] * 2
    assert [t.origin for t in twins.trajectories] == ["raw"] * 2
    assert [t.parent_trajectory_id for t in train.trajectories] == [t.id for t in twins.trajectories]
    pure, raw = train.trajectories[0], twins.trajectories[0]
    assert (pure.reward, raw.reward) == (0.0, 0.0)  # the task's answer is not 372468483
    assert pure.meta["logprobs_from"] == "rescored" and raw.meta["logprobs_from"] == "sampled"
    assert (pure.meta["raw_tool_calls"], pure.meta["raw_tool_errors"], pure.meta["rollbacks"]) == (4, 2, 2)
    # purified log-probs = score() of the purified context; the raw ones as sampled
    own = np.zeros(len(pure.response_ids), bool)
    for u in pure.turns:
        if u.role == "assistant" and u.token_start is not None:
            own[u.token_start:u.token_end] = True
    [scored] = collector.engine.score([pure.prompt_ids], [pure.response_ids], temperature=1.0)
    np.testing.assert_allclose(pure.logprobs[own], scored.logprobs[own], atol=1e-5)
    assert (pure.logprobs[~own] == 0).all() and np.array_equal(pure.loss_mask, own)
    raw_own = raw.loss_mask
    assert np.allclose(raw.logprobs[raw_own], -0.5)
    # the rollbacks: rows of the purified trajectory, at its turn indices (2 prompt turns first)
    got = rows(store, "SELECT turn_index, attempts, recovered, replacement, error_status, failed_code, corrected_code, "
                      "error_text LIKE '%%SyntaxError%%' FROM purifications WHERE trajectory_id = :t ORDER BY turn_index",
               t=pure.id)
    assert [g[:7] for g in got] == [(2, 1, True, "shallow", "error", "print(48291 * 7713", "print(48291 * 7713)"),
                                    (4, 1, True, "deep", "error", "print(x)", FIXED_1.split("```python\n")[1][:-4])]
    assert got[0][7] and rows(store, "SELECT role FROM turns WHERE trajectory_id = :t AND turn_index IN (2, 4)",
                              t=pure.id) == [("assistant",), ("assistant",)]
    view = rows(store, "SELECT origin, tool_calls, tool_errors, raw_trajectory_id, raw_tool_calls, raw_tool_errors, "
                       "rollbacks, recovered, shallow, deep, saar FROM cleaner_tool_errors ORDER BY trajectory_id")
    assert view == [("purified", 2, 0, t.id, 4, 2, 2, 2, 1, 1, True) for t in twins.trajectories]


def test_the_learner_trains_the_purified_rows_with_cleaner_metrics(store, tmp_path, monkeypatch, model_cache):
    """A learner step (micro-batches of 1 row, smaller than the step) takes the training group
    only: the purified rows, never their raw twins; cleaner/* from the rows."""
    from reflexdb.collector.runner import Collector
    from reflexdb.trainer.learner import Learner

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    # MLflow exports the tracking URI it is given into os.environ: restored after the test, so the
    # tests after this one track into their own homes
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cfg = _config()
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    _rig(collector, TWO_FIXES)
    collector.run(max_groups=2)
    learner = Learner(cfg, store, echo=lambda m: None)
    learner.setup()
    learner.run(max_steps=1)
    assert rows(store, "SELECT t.origin, count(*) FROM consumption c JOIN trajectories t ON t.id = c.trajectory_id "
                       "GROUP BY 1") == [("purified", 2)]
    [(m,)] = rows(store, "SELECT metrics FROM learner_steps")
    assert m["cleaner/tool_calls_per_traj"] == 2 and m["cleaner/tool_errors_per_traj"] == 0
    assert m["cleaner/raw_tool_calls_per_traj"] == 4 and m["cleaner/raw_tool_errors_per_traj"] == 2
    assert m["cleaner/rollbacks_per_traj"] == 2 and m["cleaner/recovery_rate"] == 1.0
    assert m["cleaner/shallow_share"] == 0.5 and m["cleaner/runnable_share"] == 1.0
    assert m["reward/pass_at_1"] == 0.0 and math.isfinite(m["loss/policy_loss"])


# ---------------------------------------------------------------- hand-made data (the view, the cookbook)


TOOL_ERROR = "Error:\n```\nTraceback (most recent call last):\nNameError: name 'x' is not defined\n```"


def tool_record(failed: bool) -> dict:
    """A call's record as the sandbox writes it (ToolResult.record): a failed call took 0.1 s."""
    import hashlib

    return {"status": "error" if failed else "ok", "exit_code": 1 if failed else 0, "detail": None,
            "wall_s": 0.1 if failed else 0.03, "cpu_s": 0.02, "memory_peak_mb": 4.5, "output_bytes": 60 if failed else 2,
            "code_bytes": 8, "code_sha256": hashlib.sha256(b"print(1)").hexdigest()}


def tool_trajectory(rng, errors: list[bool], *, origin: str, reward: float, **kw):
    """A hand-made tool episode: per call an assistant turn (5 tokens) and a tool turn (5 tokens,
    ``tool_error`` and the call's record as given), then the answer (5 tokens)."""
    from reflexdb import TurnIn
    from tests.factories import make_trajectory

    turns, k = [TurnIn("user", "What is 48291 * 7713?")], 0
    for failed in errors:
        turns += [TurnIn("assistant", "```python\nprint(1)\n```", k, k + 5, True),
                  TurnIn("tool", TOOL_ERROR if failed else "Output: 1", k + 5, k + 10, False, tool_error=failed,
                         tool_call=tool_record(failed))]
        k += 10
    turns.append(TurnIn("assistant", "\\boxed{1}", k, k + 5, True))
    return make_trajectory(rng, T=k + 5, reward=reward, correct=reward == 1.0, turns=turns, origin=origin, dim=None,
                           **kw)


def write_cleaner_task(store, run: int, task: int, episodes: list[dict], *, version: int = 0):
    """Write a task's CLEANER groups as the workflow does: the training group (purified rows where
    an episode has ``pure``, else raw) with its rollbacks, and the raw twins' group of kind retry.
    Each episode: ``raw`` (errors of its calls), ``pure`` (or None), ``rollbacks`` (PurificationIn
    fields after ``index``), ``reward``."""
    from reflexdb import GroupIn, Sibling
    from reflexdb.methods.cleaner.rollbacks import PurificationIn, Purifications, Rollback

    rng = np.random.default_rng(task)
    train, twins, rbs = [], [], []
    for ep in episodes:
        meta = {"saar": ep.get("saar", True), "raw_tool_calls": len(ep["raw"]), "raw_tool_errors": sum(ep["raw"]),
                "rollbacks": len(ep.get("rollbacks", []))}
        raw = tool_trajectory(rng, ep["raw"], origin="raw", reward=ep["reward"], meta=meta)
        if ep.get("pure") is None:
            train.append(raw)
            continue
        pure = tool_trajectory(rng, ep["pure"], origin="purified", reward=ep["reward"], meta=meta,
                               parent_trajectory_id=Sibling(1, len(twins)))
        twins.append(raw)
        rbs += [PurificationIn(len(train), r[0], Rollback(r[0] - 1, *r[1:])) for r in ep["rollbacks"]]
        train.append(pure)
    groups = [GroupIn(run_id=run, task_id=task, policy_version=version, trajectories=train, workflow="cleaner",
                      attachments=[Purifications(tuple(rbs))])]
    if twins:
        groups.append(GroupIn(run_id=run, task_id=task, policy_version=version, trajectories=twins,
                              workflow="cleaner", kind="retry"))
    return store.write_groups(groups)


#: Two tasks of a CLEANER run (the cookbook's data too). Task X at v0: a call fixed at once
#: (shallow), an episode with no failure, a call whose K = 3 corrections all failed (timeout).
#: Task Y at v1: two calls fixed (deep, then shallow), an episode with no call.
CLEANER_X = [
    {"raw": [True, False], "pure": [False], "reward": 1.0,
     "rollbacks": [(2, 1, True, 0.9, "shallow", "NameError: name 'x' is not defined", "error", "print(x)",
                    "x = 5\nprint(x)")]},
    {"raw": [False], "reward": 1.0},
    {"raw": [True, True, True, True], "pure": [True], "reward": 0.0,
     "rollbacks": [(2, 3, False, None, None, "Timed out after 4 s", "timeout", "while True: pass",
                    "while True: pass")]},
]
CLEANER_Y = [
    {"raw": [True, False, True, False], "pure": [False, False], "reward": 1.0,
     "rollbacks": [(2, 1, True, 0.2, "deep", "ZeroDivisionError: division by zero", "error", "print(1/0)",
                    "total = sum(range(10))\nprint(total)"),
                   (4, 1, True, 0.7, "shallow", "SyntaxError: invalid syntax", "error", "print(2", "print(2)")]},
    {"raw": [], "reward": 0.0},
]


def test_the_view_on_hand_made_data(store):
    from tests.factories import setup_run

    run, (tx, ty) = setup_run(store, "cleaner-view", 2)
    [gx, twins_x] = write_cleaner_task(store, run, tx, CLEANER_X)
    write_cleaner_task(store, run, ty, CLEANER_Y, version=1)
    got = rows(store, "SELECT trajectory_id, origin, policy_version, tool_calls, tool_errors, raw_trajectory_id, "
                      "raw_tool_calls, raw_tool_errors, rollbacks, recovered, shallow, deep, saar "
                      "FROM cleaner_tool_errors WHERE run_id = :r ORDER BY trajectory_id", r=run)
    x0, x1, x2 = gx.trajectory_ids
    assert got[:3] == [(x0, "purified", 0, 1, 0, twins_x.trajectory_ids[0], 2, 1, 1, 1, 1, 0, True),
                       (x1, "raw", 0, 1, 0, x1, 1, 0, 0, 0, 0, 0, True),
                       (x2, "purified", 0, 1, 1, twins_x.trajectory_ids[1], 4, 4, 1, 0, 0, 0, True)]
    assert [g[1:5] + g[6:12] for g in got[3:]] == [("purified", 1, 2, 0, 4, 2, 2, 2, 1, 1), ("raw", 1, 0, 0, 0, 0, 0, 0, 0, 0)]
    assert not set(twins_x.trajectory_ids) & {g[0] for g in got}  # raw twins are no rows of their own
    # the rollbacks are rows of the purified trajectories; a bad status is refused, nothing written
    assert rows(store, "SELECT count(*), count(*) FILTER (WHERE recovered) FROM purifications") == [(4, 3)]
    from reflexdb import InvalidGroup

    bad = [{"raw": [True, False], "pure": [False], "reward": 1.0,
            "rollbacks": [(2, 1, True, 0.9, "shallow", "e", "crashed", "a", "b")]}]
    with pytest.raises(InvalidGroup, match="error_status"):
        write_cleaner_task(store, run, tx, bad)
    assert rows(store, "SELECT count(*) FROM purifications") == [(4,)]
    assert rows(store, "SELECT count(*) FROM trajectories WHERE run_id = :r", r=run) == [(8,)]


def test_a_shallow_merge_keeps_the_text_before_the_fence_byte_identical(tokenizer):
    """A fence token that straddles the block's start (SmolLM2's " ```": a space of the reasoning
    and the fence in one token, in the failed turn "ok.  ```python"; the correction's fence token
    "```" after a newline has none): swapping the sampled tokens at the fence token gave
    "ok. ```python" for "ok.  ```python". The seam is tokenized again; the rest are the sampled ids."""
    failed_text = "ok.  ```python\nprint(1/0)\n```"
    fixed_text = "fix:\n```python\nprint(1)\n```"
    eng = Scripted(tokenizer, [failed_text])
    [[failed]] = eng.generate([[1, 2]])
    eng.turns = [fixed_text]
    [[fixed]] = eng.generate([[1, 2]])
    kf, kc = fence_token(tokenizer, failed.token_ids, failed.text), fence_token(tokenizer, fixed.token_ids, fixed.text)
    straddles = tokenizer.decode(failed.token_ids[:kf]) != "ok.  " or tokenizer.decode(fixed.token_ids[:kc]) != "fix:\n"
    assert straddles, "this tokenizer puts the spaces in their own token: the case is not exercised"
    merged = shallow_merge(tokenizer, failed, fixed)
    assert merged.text == "ok.  ```python\nprint(1)\n```"
    # the sampled ids on both sides of the seam, and one log-prob per token
    assert list(merged.token_ids[:kf]) == list(failed.token_ids[:kf])
    assert list(merged.token_ids[-(len(fixed.token_ids) - kc - 1):]) == list(fixed.token_ids[kc + 1:])
    assert len(merged.logprobs) == len(merged.token_ids)
