"""Tool-use episodes (environment ``tool_python``): the code block rule, calls through the real
sandbox, the tool's turns and errors in the stored episode, restore without re-running code, and
a turn's calls run together."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from reflexdb.collector.engines import Sample, SamplingParams
from reflexdb.collector.environments import EnvTask, make_environment, parse_options
from reflexdb.collector.environments.tool_python import ToolPython
from reflexdb.collector.episodes import Rollout, environment_factory
from reflexdb.collector.rewards import RewardResult, get_reward
from reflexdb.collector.tasks.templates import apply_chat_template, get_template
from reflexdb.collector.tasks.tool_use import block_start, code_block, observation

from reflexdb import GroupIn

MODEL_CACHE = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or Path(tempfile.gettempdir()) / "reflexdb-model-cache")
TASK = EnvTask(1, "What is 48291 * 7713?", "372468483")
FAST = {"timeout_s": 2.0, "cpu_s": 2}


def env(reward=None, **options):
    return make_environment("tool_python", parse_options("tool_python", {**FAST, **options}), TASK,
                            reward_fn=reward or get_reward("math"), template=get_template("tool_python"))


def test_code_block_rule():
    assert code_block("Let me compute.\n```python\nprint(2 + 3)\n```\nThen answer.") == "print(2 + 3)"
    assert code_block("```py\nx = 1\nprint(x)\n```") == "x = 1\nprint(x)"
    assert code_block("```Python  \nprint(1)\n```\n```python\nprint(2)\n```") == "print(1)"  # the first block
    assert code_block("Truncated:\n```python\nprint(7 *") == "print(7 *"  # an unclosed block at the end
    assert code_block("The answer is \\boxed{5}.") is None
    assert code_block("```\nprint(1)\n```") is None  # not marked as Python
    assert code_block("```python\n\n```") is None  # empty
    assert observation("", failed=False).startswith("Output: (nothing was printed")
    assert observation("boom", failed=True) == "Error:\n```\nboom\n```"


def test_a_21_kb_boxed_answer_is_graded_in_linear_time():
    """Issue 50: an answer of 3,000 ``\\boxed{`` (21 KB) held ``ToolPython.step`` (through
    ``_answer`` and ``judge``) for 16.7 s; a 1 MB turn for minutes."""
    from tests.hostile_text import MB, assert_linear

    e = env(max_tool_calls=0)
    e.reset()
    for answer in ("\\boxed{" * 3000, "\\boxed{" * (MB // 7)):
        assert_linear(lambda text: e.step(text, "stop"), answer)
    s = e.step("\\boxed{" * 3000, "stop")
    assert s.done and s.episode_reward == 0.0 and s.answer is None


def test_code_blocks_are_found_in_linear_time():
    from tests.hostile_text import assert_linear, corpus

    for name, text in corpus().items():
        assert_linear(code_block, text, name=name)
        assert_linear(block_start, text, name=name)
        assert_linear(lambda t: observation(t, True), text, name=name)


def test_call_then_answer_with_the_real_sandbox():
    e = env()
    msgs = e.reset()
    assert msgs[0]["role"] == "system" and "```python" in msgs[0]["content"] and msgs[1]["content"] == TASK.prompt
    s0 = e.step("I will compute it.\n```python\nprint(48291 * 7713)\n```", "stop")
    assert not s0.done and s0.feedback_role == "tool" and not s0.tool_error
    assert s0.feedback == [{"role": "user", "content": "Output:\n```\n372468483\n```"}]
    s1 = e.step("The product is \\boxed{372468483}.", "stop")
    assert s1.done and s1.episode_reward == 1.0 and s1.episode_correct is True
    assert [c["status"] for c in s1.meta["tool_calls"]] == ["ok"] and s1.meta["tool_errors"] == 0
    with pytest.raises(RuntimeError, match="over"):
        e.step("more", "stop")


def test_failed_calls_are_tool_errors_and_the_episode_goes_on():
    e = env()
    e.reset()
    s0 = e.step("```python\nprint(48291 * 7713\n```", "stop")  # a syntax error
    assert s0.tool_error and "SyntaxError" in s0.feedback[0]["content"] and s0.feedback[0]["content"].startswith("Error:")
    s1 = e.step("```python\nwhile True:\n    pass\n```", "stop")  # the timeout
    assert s1.tool_error and "Timed out" in s1.feedback[0]["content"] or "CPU" in s1.feedback[0]["content"]
    s2 = e.step("```python\nprint(48291 * 7713)\n```", "stop")
    assert not s2.tool_error
    s3 = e.step("\\boxed{372468480}", "stop")  # wrong
    assert s3.done and s3.episode_reward == 0.0 and s3.meta["tool_errors"] == 2
    assert [c["turn"] for c in s3.meta["tool_calls"]] == [0, 1, 2]


def test_after_the_last_call_the_next_turn_is_graded():
    e = env(max_tool_calls=1)
    e.reset()
    s0 = e.step("```python\nprint(1)\n```", "stop")
    assert "No more code can be run" in s0.feedback[0]["content"]
    s1 = e.step("```python\nprint(48291 * 7713)\n```\n\\boxed{372468483}", "stop")  # not run: graded
    assert s1.done and s1.episode_reward == 1.0 and len(s1.meta["tool_calls"]) == 1


def test_non_binary_and_failing_rewards():
    half = env(reward=lambda text, truth: RewardResult(reward=0.5, correct=False, extracted="1"))
    half.reset()
    assert half.step("\\boxed{1}", "stop").episode_reward == 0.5

    def broken(text, truth):
        raise ValueError("grader down")

    bad = env(reward=broken)
    bad.reset()
    s = bad.step("\\boxed{1}", "stop")
    assert s.done and s.episode_reward is None and s.episode_correct is None and "grader down" in s.error


class Counting:
    """A sandbox stand-in that counts runs (restore must never run code again)."""

    def __init__(self, box):
        self.box, self.runs = box, 0

    def run(self, code):
        self.runs += 1
        return self.box.run(code)

    def run_many(self, codes):
        self.runs += len(codes)
        return self.box.run_many(codes)


def test_restore_replays_without_running_code():
    e = env()
    e.sandbox = Counting(e.sandbox)
    e.reset()
    e.step("```python\nprint(6 * 7)\n```", "stop")
    e.step("```python\nprint(1 / 0)\n```", "stop")
    assert e.sandbox.runs == 2
    msgs = e.restore(1)
    assert e.sandbox.runs == 2
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[-1]["content"] == "Output:\n```\n42\n```"
    assert e.calls == 1
    s = e.step("\\boxed{372468483}", "stop")
    assert s.done and s.episode_reward == 1.0
    with pytest.raises(ValueError, match="cannot restore"):
        e.restore(5)


def test_step_batch_runs_a_turns_calls_together():
    envs = [env() for _ in range(4)]
    counting = Counting(envs[0].sandbox)
    for e in envs:
        e.reset()
        e.sandbox = counting
    texts = ["```python\nimport time\ntime.sleep(0.5)\nprint(1)\n```", "\\boxed{372468483}",
             "```python\nimport time\ntime.sleep(0.5)\nprint(3)\n```", "```python\nraise SystemExit(2)\n```"]
    steps = ToolPython.step_batch(envs, texts, ["stop"] * 4)
    assert counting.runs == 3
    assert [s.done for s in steps] == [False, True, False, False]
    assert steps[0].feedback[0]["content"].endswith("1\n```") and steps[2].feedback[0]["content"].endswith("3\n```")
    assert steps[3].tool_error and not steps[0].tool_error and steps[1].episode_reward == 1.0


def test_options_are_validated():
    with pytest.raises(ValueError, match="environment.max_tool_calls"):
        parse_options("tool_python", {"max_tool_calls": -1})
    with pytest.raises(ValueError, match="environment.timeout"):
        parse_options("tool_python", {"timeout": 3})


class Scripted:
    """An engine that 'samples' scripted texts, tokenised exactly (the tiny model's tokenizer):
    turn 0 writes code, turn 1 answers."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate(self, prompts, n, params):
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        out = []
        for p in prompts:
            ids = apply_chat_template(self.tokenizer, p) if p and isinstance(p[0], dict) else p
            tok = np.asarray(self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id], np.int32)
            out.append([Sample(np.asarray(ids, np.int32), tok, np.full(len(tok), -0.5, np.float32), "stop", text,
                               np.zeros(8, np.float32)) for _ in range(n)])
        return out


@pytest.fixture(scope="module")
def tokenizer():
    from reflexdb.models import tiny_model_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir(MODEL_CACHE))


def test_tool_episodes_through_the_driver_and_the_store(tokenizer, store):
    engine = Scripted(tokenizer, ["```python\nprint(48291 * 7713)\n```", "So it is \\boxed{372468483}."])
    make_env = environment_factory("tool_python", parse_options("tool_python", FAST), get_reward("math"), "tool_python")
    [[a, b]] = Rollout(engine, make_env, lambda: SamplingParams(max_new_tokens=32), 0).run([TASK], 2)
    assert engine.calls == 2  # one engine call per turn for both episodes
    for t in (a, b):
        spans = [u for u in t.turns if u.token_start is not None]
        assert [u.role for u in spans] == ["assistant", "tool", "assistant"]
        assert [u.trainable for u in spans] == [True, False, True] and not spans[1].tool_error
        assert "372468483" in spans[1].text and t.reward == 1.0 and t.meta["tool_errors"] == 0
        assert not np.any(t.logprobs[spans[1].token_start:spans[1].token_end])
    run_id = store.create_run("tool-episodes")
    from reflexdb import TaskIn

    [task_id] = store.add_tasks(run_id, [TaskIn(TASK.prompt, TASK.ground_truth)])
    w = store.write_group(GroupIn(run_id=run_id, task_id=task_id, policy_version=0, trajectories=[a, b]))
    with store.transaction() as conn:
        rows = conn.execute("SELECT role, tool_error, trainable FROM turns WHERE trajectory_id = ANY(%s) "
                            "AND token_start IS NOT NULL ORDER BY trajectory_id, token_start",
                            (list(w.trajectory_ids),)).fetchall()
    assert [tuple(r) for r in rows] == [("assistant", False, True), ("tool", False, False), ("assistant", False, True)] * 2


def test_arithmetic_levels_for_tool_use():
    from reflexdb.collector.tasks import arithmetic_tasks

    products = arithmetic_tasks(50, level=7, seed=3)
    sums = arithmetic_tasks(50, level=8, seed=3)
    assert len({t.prompt for t in products}) == 50 and len({t.prompt for t in sums}) == 50
    for t in products + sums:
        expr = t.prompt.removeprefix("What is ").removesuffix("?")
        assert str(eval(expr)) == t.ground_truth  # noqa: S307  (our own generated arithmetic)
    assert all(" * " in t.prompt and int(t.ground_truth) >= 1000 for t in products)
    assert all(4 <= t.prompt.count("+") <= 6 for t in sums)
    assert not {t.prompt for t in arithmetic_tasks(20, level=7, split="eval")} & {t.prompt for t in products}


def test_the_one_shot_template_puts_a_worked_exchange_before_the_question():
    msgs = get_template("tool_python_shot").messages(TASK.prompt)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert code_block(msgs[2]["content"]) == "print(372 * 419)" and str(372 * 419) in msgs[3]["content"]
    assert msgs[4]["content"].endswith("\\boxed{155868}.") and msgs[-1]["content"] == TASK.prompt
    assert get_template("tool_python").messages(TASK.prompt)[1:] == [{"role": "user", "content": TASK.prompt}]


def test_the_fix_shot_shows_what_the_real_sandbox_answers_and_its_fix():
    """tool_python_fix_shot (issue 37's CLEANER regime): its first call fails as the sandbox really
    fails it, the next adds one line and prints the answer the shot ends with; its question is no
    level-9 task's."""
    from reflexdb.collector.sandbox import PythonSandbox
    from reflexdb.collector.tasks.arithmetic import arithmetic_tasks

    msgs = get_template("tool_python_fix_shot").messages(TASK.prompt)
    assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    first, fixed = code_block(msgs[2]["content"]), code_block(msgs[4]["content"])
    assert fixed == "import math\n" + first  # the one-line fix
    box = PythonSandbox()
    failed, ok = box.run(first), box.run(fixed)
    assert failed.failed and msgs[3]["content"] == observation(failed.observation(), failed=True)
    assert not ok.failed and msgs[5]["content"] == observation(ok.observation(), failed=False)
    assert msgs[6]["content"].endswith(f"\\boxed{{{ok.stdout.strip()}}}.") and msgs[-1]["content"] == TASK.prompt
    level9 = {t.prompt for split in ("train", "eval") for t in arithmetic_tasks(400, level=9, split=split)}
    assert msgs[1]["content"] not in level9 and not any("perm" in p for p in level9)


def test_tool_calls_are_recorded_with_their_turns(tokenizer, store):
    """Each call's record is stored with its tool turn and read back through the view tool_calls;
    a call printing a NUL byte (which stopped the collector before issue 33) is stored with U+FFFD."""
    import hashlib

    from reflexdb import TaskIn

    code = "import sys\nsys.stdout.buffer.write(b'a\\x00b')\nprint(1 / 0)"
    engine = Scripted(tokenizer, [f"```python\n{code}\n```", "```python\nprint(7)\n```", "\\boxed{7}"])
    make_env = environment_factory("tool_python", parse_options("tool_python", FAST), get_reward("math"), "tool_python")
    [[t]] = Rollout(engine, make_env, lambda: SamplingParams(max_new_tokens=32), 0).run([TASK], 1)
    tools = [u for u in t.turns if u.role == "tool"]
    assert [u.tool_call["status"] for u in tools] == ["error", "ok"] and tools[0].tool_error
    assert tools[0].tool_call["code_sha256"] == hashlib.sha256(code.encode()).hexdigest()
    run_id = store.create_run("tool-calls")
    [task_id] = store.add_tasks(run_id, [TaskIn(TASK.prompt, TASK.ground_truth)])
    w = store.write_group(GroupIn(run_id=run_id, task_id=task_id, policy_version=0, trajectories=[t]))
    with store.transaction() as conn:
        rows = conn.execute("SELECT status, exit_code, detail, wall_s > 0, cpu_s > 0, memory_peak_mb > 0, output_bytes, "
                            "code_bytes, code_sha256, tool_error, call_text LIKE '%%sys.stdout%%', run "
                            "FROM tool_calls WHERE trajectory_id = %s ORDER BY turn_index", (w.trajectory_ids[0],)).fetchall()
    first, second = (tuple(r) for r in rows)
    assert first[:2] == ("error", 1) and first[2] is None and first[3:6] == (True, True, True)
    assert first[7:] == (len(code), hashlib.sha256(code.encode()).hexdigest(), True, True, "tool-calls")
    assert first[6] > 3  # the NUL and the traceback were printed
    assert second[:2] == ("ok", 0) and second[6] == 2 and second[9] is False
    [read] = store.read_groups([w.group_id])
    assert "a\ufffdb" in [u for u in read.trajectories[0].turns if u.role == "tool"][0].text
    assert read.trajectories[0].turns[3].tool_call["status"] == "error"
