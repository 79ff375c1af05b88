"""Multi-turn episodes: the environments, the rollout driver's tokens, and episodes in the store.

The driver tests run the tiny random model (SmolLM2's tokenizer and chat template) in the fast
suite; the done-when test (3 attempts with the real SmolLM2, log-probs against ``score()`` of the
full conversation) is ``slow``.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from reflexdb.collector.engines import SamplingParams, make_engine
from reflexdb.collector.environments import EnvTask, make_environment, parse_options
from reflexdb.collector.environments.multi_attempt import NO_ANSWER_DEFAULT
from reflexdb.collector.episodes import Rollout, environment_factory, environment_ids
from reflexdb.models import tiny_model_dir
from reflexdb.collector.rewards import RewardResult, get_reward
from reflexdb.collector.tasks.templates import get_template, render_chat

from reflexdb import GroupIn
from reflexdb.config import ConfigError, parse_config

MODEL_CACHE = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or Path(tempfile.gettempdir()) / "reflexdb-model-cache")
TASKS = [EnvTask(1, "What is 2 + 3?", "5"), EnvTask(2, "What is 4 + 4?", "8")]


def never_right(text, truth):
    """A reward function that marks every answer wrong (and finds "7" in it), so that every
    episode runs all its attempts."""
    return RewardResult(reward=0.0, correct=False, extracted="7")


def env(reward=never_right, **options):
    return make_environment("multi_attempt", parse_options("multi_attempt", options), TASKS[0],
                            reward_fn=reward, template=get_template("plain"))


# ---------------------------------------------------------------- the environment


def test_multi_attempt_feedback_reward_and_restore():
    e = env(max_attempts=3)
    assert e.reset() == [{"role": "user", "content": "What is 2 + 3?"}]
    s0 = e.step("It is 7.", "stop")
    assert not s0.done and s0.correct is False and s0.answer == "7"
    assert s0.feedback == [{"role": "user", "content": "Incorrect. Your answer 7 does not match. Please try again."}]
    s1 = e.step("It is 7 again.", "stop")
    assert not s1.done
    s2 = e.step("Still 7.", "length")
    assert s2.done and s2.feedback == [] and s2.episode_reward == 0.0 and s2.episode_correct is False
    assert s2.meta == {"attempts": 3, "solved_at": None}
    with pytest.raises(RuntimeError, match="3 attempts made"):
        e.step("more", "stop")
    # restore(k): the conversation before assistant turn k, and the environment ready for it
    msgs = e.restore(1)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[1]["content"] == "It is 7."
    assert not e.step("7", "stop").done and e.step("5", "stop").done  # attempts 1 and 2 again
    assert e.restore(0) == e.reset()
    with pytest.raises(ValueError, match="cannot restore to attempt 3"):
        e.restore(3)


def test_multi_attempt_with_the_math_reward():
    e = env(reward=get_reward("math"), max_attempts=3)
    e.reset()
    s = e.step("I do not know.", "stop")
    assert s.answer is None and s.feedback[0]["content"] == NO_ANSWER_DEFAULT  # the format reminder
    s = e.step("The answer is 6.", "stop")
    assert s.feedback[0]["content"] == "Incorrect. Your answer 6 does not match. Please try again."
    s = e.step("The answer is 5.", "stop")
    assert s.done and s.correct and s.episode_reward == 1.0 and s.episode_correct
    assert s.meta == {"attempts": 3, "solved_at": 2}
    # stops at the first correct attempt; a discount scales a later success: 1 * 0.5^1 = 0.5
    e = env(reward=get_reward("math"), max_attempts=3, attempt_discount=0.5)
    e.reset()
    e.step("6", "stop")
    s = e.step("5", "stop")
    assert s.done and s.episode_reward == 0.5 and s.episode_correct and s.meta["solved_at"] == 1


def test_non_binary_and_failing_rewards():
    values = iter([0.3, 0.9, 0.2])
    e = env(reward=lambda text, truth: RewardResult(next(values), False, "x"), max_attempts=3, attempt_discount=0.5)
    e.reset()
    e.step("a", "stop"), e.step("b", "stop")
    # max(0.3 * 1, 0.9 * 0.5, 0.2 * 0.25) = max(0.3, 0.45, 0.05) = 0.45
    assert e.step("c", "stop").episode_reward == pytest.approx(0.45)

    def broken(text, truth):
        raise ZeroDivisionError("boom")

    e = env(reward=broken)
    e.reset()
    s = e.step("a", "stop")  # a reward function that raises ends the episode with a NULL reward
    assert s.done and s.episode_reward is None and s.episode_correct is None and "ZeroDivisionError" in s.error


def test_config_selects_and_checks_the_environment():
    cfg = parse_config({"run": "r", "environment": {"name": "multi_attempt", "max_attempts": 4}})
    assert cfg.environment.options.max_attempts == 4 and cfg.environment.options.attempt_discount == 1.0
    assert parse_config({"run": "r"}).environment.name == "single"
    with pytest.raises(ConfigError, match="'nowhere' is not a registered environment; known: multi_attempt, single"):
        parse_config({"run": "r", "environment": {"name": "nowhere"}})
    with pytest.raises(ConfigError, match=r"environment.max_attemps: unknown key \(environment 'multi_attempt' takes: "
                                          r"max_attempts, attempt_discount\)"):
        parse_config({"run": "r", "environment": {"name": "multi_attempt", "max_attemps": 4}})
    with pytest.raises(ConfigError, match="environment.max_attempts"):
        parse_config({"run": "r", "environment": {"name": "multi_attempt", "max_attempts": 0}})


# ---------------------------------------------------------------- the driver on the tiny model


@pytest.fixture(scope="module")
def tiny():
    engine = make_engine("hf", model=tiny_model_dir(MODEL_CACHE), device="cpu")
    yield engine
    engine.close()


def rollout(engine, *, max_attempts=3, reward=never_right, max_new_tokens=12, seed=0):
    make_env = environment_factory("multi_attempt", parse_options("multi_attempt", {"max_attempts": max_attempts}),
                                   reward, "plain")
    seeds = itertools.count(seed)
    return Rollout(engine, make_env, lambda: SamplingParams(max_new_tokens=max_new_tokens, seed=next(seeds)), 3)


def conversation(t):
    """The chat messages an episode's turns hold (prompt turns, assistant turns, feedback)."""
    return [{"role": u.role, "content": u.text} for u in t.turns]


def check_episode(engine, t, attempts):
    tok = engine.tokenizer
    spans = [u for u in t.turns if u.token_start is not None]
    assert [u.role for u in spans] == ["assistant", "user"] * (attempts - 1) + ["assistant"]
    assert [u.attempt for u in spans] == [k // 2 for k in range(2 * attempts - 1)]
    # the spans tile the response ids, in order
    assert spans[0].token_start == 0 and spans[-1].token_end == len(t.response_ids)
    assert all(a.token_end == b.token_start for a, b in zip(spans, spans[1:]))
    # environment tokens: not trainable, log-prob 0
    for u in spans:
        assert u.trainable == (u.role == "assistant")
        if u.role != "assistant":
            assert not np.any(t.logprobs[u.token_start:u.token_end])
    # decoding the stored ids reproduces the template's rendering of the conversation
    decoded = tok.decode(np.concatenate([t.prompt_ids, t.response_ids]).tolist(), skip_special_tokens=False)
    rendered = render_chat(tok, conversation(t), add_generation_prompt=False)
    assert rendered.startswith(decoded) and rendered[len(decoded):] in ("\n", "<|im_end|>\n")
    # each assistant span decodes to its turn's text
    for u in spans:
        if u.role == "assistant":
            assert tok.decode(t.response_ids[u.token_start:u.token_end].tolist(), skip_special_tokens=True) == u.text


def test_driver_batches_turns_and_tokens_are_exact(tiny):
    r = rollout(tiny)
    p0, f0 = tiny.prompt_tokens, tiny.prefill_tokens
    episodes = r.run(TASKS, 4)
    # Turn 0 prefills the two prompts once each (4 samples share each); turns 1 and 2 continue each
    # row's kept cache, so each of the 8 rows prefills only its last sampled token and the
    # environment's tokens: 2 turns x 8 rows x 1 + every environment token.
    first = sum(len(row[0].prompt_ids) for row in episodes)
    assert tiny.prefill_tokens - f0 == first + 2 * 8 + r.stats.environment_tokens
    assert tiny.prompt_tokens - p0 == r.stats.prompt_tokens and not tiny._kv  # forgotten after the batch
    assert [len(row) for row in episodes] == [4, 4]
    # every episode ran 3 attempts: turn 0 for both tasks in one call, then one call per turn
    assert r.stats.engine_calls == 3 and r.stats.turns == 3 * 8 and r.stats.episodes == 8
    assert r.stats.environment_tokens == sum(int((~np.asarray(m)).sum()) for m in [
        np.concatenate([np.ones(u.token_end - u.token_start, bool) if u.trainable else
                        np.zeros(u.token_end - u.token_start, bool) for u in t.turns if u.token_start is not None])
        for row in episodes for t in row])
    for row in episodes:
        for t in row:
            check_episode(tiny, t, 3)
            meta = dict(t.meta)
            calls = meta.pop("generations")
            assert t.correct is False and t.reward == 0.0 and meta == {"attempts": 3, "solved_at": None}
            assert set(t.token_policy_versions.tolist()) == {3}
            # each assistant turn's engine call, timed: its attempt and token count (the trace's key),
            # the call's wall seconds and the 8 rows it sampled together (2 tasks x 4 at turn 0, then 8)
            spans = [u for u in t.turns if u.role == "assistant"]
            assert [(c["attempt"], c["tokens"], c["rows"]) for c in calls] == [
                (u.attempt, u.token_end - u.token_start, 8) for u in spans]
            assert all(c["wall_s"] > 0 for c in calls)
    # one call per turn: every row of a turn has the same call's seconds
    for k in range(3):
        assert len({t.meta["generations"][k]["wall_s"] for row in episodes for t in row}) == 1
    # stored behaviour log-probs are the engine's score() of the whole conversation, token by token
    flat = [t for row in episodes for t in row]
    scored = tiny.score([t.prompt_ids for t in flat], [t.response_ids for t in flat])
    for t, s in zip(flat, scored):
        mask = np.zeros(len(t.response_ids), bool)
        for u in t.turns:
            if u.trainable and u.token_start is not None:
                mask[u.token_start:u.token_end] = True
        assert np.abs(s.logprobs[mask] - t.logprobs[mask]).max() < 1e-3


def test_kept_caches_give_the_same_episodes(tiny):
    """Continuing each row's kept cache samples what prefilling the whole conversation again does."""
    kept = rollout(tiny, seed=5).run(TASKS, 3)
    tiny.keep_kv_tokens = 0  # nothing can be kept: every turn prefills its whole conversation
    try:
        again = rollout(tiny, seed=5).run(TASKS, 3)
    finally:
        tiny.keep_kv_tokens = 65536
    for a, b in zip((t for row in kept for t in row), (t for row in again for t in row)):
        assert a.response_ids.tolist() == b.response_ids.tolist()
        assert np.abs(a.logprobs - b.logprobs).max() < 1e-4


def test_episodes_end_at_different_turns(tiny):
    answers = iter([True, False] * 100)

    def right_every_other(text, truth):
        ok = next(answers)
        return RewardResult(float(ok), ok, "5" if ok else "7")

    episodes = rollout(tiny, reward=right_every_other).run(TASKS[:1], 4)[0]
    # verdicts alternate T, F, T, ...: attempt 0 judges episodes 0-3 (T F T F: 0 and 2 done), attempt 1
    # judges 1 and 3 (T F: 1 done), attempt 2 judges 3 (T)
    assert [t.meta["attempts"] for t in episodes] == [1, 2, 1, 3]
    assert [t.meta["solved_at"] for t in episodes] == [0, 1, 0, 2] and all(t.correct for t in episodes)
    # each turn's engine call sampled only the rows still going: 4, then 2, then 1
    assert [[c["rows"] for c in t.meta["generations"]] for t in episodes] == [[4], [4, 2], [4], [4, 2, 1]]
    for t in episodes:
        check_episode(tiny, t, t.meta["attempts"])


def test_single_environment_is_one_plain_turn(tiny):
    make_env = environment_factory("single", parse_options("single", {}), get_reward("math"), "plain")
    params = SamplingParams(max_new_tokens=12, seed=7)
    r = Rollout(tiny, make_env, lambda: params, 0)
    [row] = r.run(TASKS[:1], 3)
    plain = tiny.generate([get_template("plain").messages(TASKS[0].prompt)], n=3, params=params)[0]
    assert r.stats.engine_calls == 1
    for t, s in zip(row, plain):  # the same engine call as before environments existed
        assert t.response_ids.tolist() == s.token_ids.tolist() and np.array_equal(t.logprobs, s.logprobs)
        assert [u.role for u in t.turns] == ["user", "assistant"] and t.turns[1].token_end == len(s.token_ids)


def test_plain_samples_keep_their_engine_call_on_the_row(tiny):
    """Collector.sample + score (a workflow's single-turn path): each row records the call that sampled
    it, as the driver's turns do; an engine's own samples (no call timed) record nothing."""
    from reflexdb.collector.engines import timed
    from reflexdb.collector.workflows.base import score_samples

    prompt = get_template("plain").messages(TASKS[0].prompt)
    out = tiny.generate([prompt], n=3, params=SamplingParams(max_new_tokens=6, seed=1))
    assert all(s.call is None for s in out[0])
    assert [t.meta for t in score_samples(get_reward("math"), "5", prompt, out[0])] == [{}, {}, {}]
    stamped = timed(out, 0.25)[0]
    assert all(a.token_ids is b.token_ids and a.text == b.text for a, b in zip(stamped, out[0]))
    rows = score_samples(get_reward("math"), "5", prompt, stamped)
    assert [t.meta for t in rows] == [{"generations": [{"attempt": None, "tokens": len(s.token_ids), "wall_s": 0.25,
                                                        "rows": 3}]} for s in out[0]]
    assert [u.attempt for u in rows[0].turns if u.role == "assistant"] == [None]  # the trace's key: (None, tokens)


def test_environment_ids_after_a_truncated_turn(tiny):
    tok = tiny.tokenizer
    history = [{"role": "user", "content": "Hi"}]
    feedback = [{"role": "user", "content": "Again."}]
    sampled = tok.encode("Hello there", add_special_tokens=False)
    closed = tok.decode(environment_ids(tok, history, feedback, sampled, "length"), skip_special_tokens=False)
    assert closed == "<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    stopped = tok.decode(environment_ids(tok, history, feedback, sampled + [tok.eos_token_id], "stop"),
                         skip_special_tokens=False)
    assert stopped == "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------- episodes in the store


def test_episode_round_trips_through_the_store(tiny, store):
    run_id = store.create_run("episodes")
    from reflexdb import TaskIn
    [task_id] = store.add_tasks(run_id, [TaskIn(TASKS[0].prompt, TASKS[0].ground_truth)])
    episodes = rollout(tiny).run([TASKS[0]._replace(id=task_id)], 2)[0]
    w = store.write_group(GroupIn(run_id=run_id, task_id=task_id, policy_version=3, trajectories=episodes))
    [group] = store.read_groups([w.group_id])
    for sent, got in zip(episodes, group.trajectories):
        assert got.prompt_ids.tolist() == list(sent.prompt_ids) and got.response_ids.tolist() == sent.response_ids.tolist()
        assert np.array_equal(got.logprobs, sent.logprobs)
        assert got.token_policy_versions.tolist() == sent.token_policy_versions.tolist()
        assert [(u.role, u.text, u.token_start, u.token_end, u.attempt, u.answer, u.correct, u.reward)
                for u in got.turns] == [(u.role, u.text, u.token_start, u.token_end, u.attempt, u.answer, u.correct,
                                         u.reward) for u in sent.turns]
        # the learner's loss mask: exactly the assistant spans, never an environment token
        expected = np.zeros(len(sent.response_ids), bool)
        for u in got.turns:
            if u.role == "assistant":
                expected[u.token_start:u.token_end] = True
        assert got.loss_mask.tolist() == expected.tolist()
        # confidence: exp(mean log-prob) over the model's own tokens only
        assert got.confidence == pytest.approx(float(np.exp(sent.logprobs[expected].astype(np.float64).mean())))
        assert got.meta == sent.meta and got.meta["attempts"] == 3 and len(got.meta["generations"]) == 3
    from reflexdb.trainer.batch import pack

    batch = pack([group], pad_id=0, origins=store.origins())
    for i, t in enumerate(group.trajectories):
        assert batch.response_mask[i, :len(t.response_ids)].numpy().tolist() == t.loss_mask.tolist()
    # one row per turn in the view, in order, readable in psql
    with store.transaction() as conn:
        view = conn.execute("SELECT turn_index, role, attempt, n_tokens, trainable, answer, correct, feedback, attempts "
                            "FROM episode_turns WHERE trajectory_id = %s ORDER BY turn_index",
                            (w.trajectory_ids[0],)).fetchall()
    assert [(r[1], r[2], r[4]) for r in view] == [("user", None, False), ("assistant", 0, True), ("user", 0, False),
                                                   ("assistant", 1, True), ("user", 1, False), ("assistant", 2, True)]
    assert view[1][7] == "Incorrect. Your answer 7 does not match. Please try again." and view[5][7] is None
    assert {r[8] for r in view} == {3} and view[1][5] == "7" and view[1][6] is False


def test_loss_mask_on_an_environment_token_is_refused(tiny, store):
    from reflexdb.errors import InvalidGroup

    run_id = store.create_run("episodes-bad")
    from reflexdb import TaskIn
    [task_id] = store.add_tasks(run_id, [TaskIn("q", "1")])
    t = rollout(tiny, max_attempts=2).run([EnvTask(task_id, "q", "1")], 1)[0][0]
    env_start = next(u.token_start for u in t.turns if u.role == "user" and u.token_start is not None)
    t.loss_mask = np.ones(len(t.response_ids), bool)  # would train on the environment's tokens
    with pytest.raises(InvalidGroup, match=rf"trajectories\[0\].loss_mask: marks token {env_start}, which lies in no "
                                           "trainable turn's span"):
        store.write_group(GroupIn(run_id=run_id, task_id=task_id, policy_version=0, trajectories=[t]))
    with store.transaction() as conn:
        assert conn.execute("SELECT count(*) FROM groups WHERE run_id = %s", (run_id,)).fetchone() == (0,)


# ---------------------------------------------------------------- the done-when test, real SmolLM2


def test_shared_prefix_prefill_gives_the_same_samples(tiny):
    """The HF engine prefills a prefix shared by several prompts once; each row still sees exactly
    its own prompt, so the samples are the ones an unshared prefill gives."""
    tok = tiny.tokenizer
    base = tok.encode("<|im_start|>user\nWhat is 2 + 3? Think about it.<|im_end|>\n<|im_start|>assistant\n")
    prompts = [base + tok.encode(t) for t in ("It is 5", "Maybe 6, or", "7")] + [tok.encode("Other prompt")]
    params = SamplingParams(max_new_tokens=8, seed=3)
    tiny.share_prefixes, tiny.min_shared_prefix = False, 1
    try:
        plain = tiny.generate(prompts, n=2, params=params)
        p0, f0 = tiny.prompt_tokens, tiny.prefill_tokens
        tiny.share_prefixes = True
        shared = tiny.generate(prompts, n=2, params=params)
        asked, prefilled = tiny.prompt_tokens - p0, tiny.prefill_tokens - f0
    finally:
        tiny.share_prefixes, tiny.min_shared_prefix = True, 64
    # asked: 2 samples x every prompt; prefilled: the shared prefix once, then each prompt's rest
    assert asked == 2 * sum(len(p) for p in prompts)
    assert prefilled == sum(len(p) for p in prompts) - 2 * len(base)
    for a, b in zip(plain, shared):
        for x, y in zip(a, b):
            assert x.token_ids.tolist() == y.token_ids.tolist()
            assert np.abs(x.logprobs - y.logprobs).max() < 1e-4
            assert np.abs(x.embedding - y.embedding).max() < 1e-4


# ---------------------------------------------------------------- end to end: reflexdb run, then eval --attempts
