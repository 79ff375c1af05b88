"""Linear time on hostile text in the core modules: what reads a model's, a tool's or a dataset's
text (issue 50).

Each reader below gets every 1 MB text of ``tests/hostile_text.py``'s corpus under its time budget
(1 s; a quadratic reader takes minutes to hours on 1 MB), and hypothesis' hostile texts, where it
must not raise and must give what a plain reference gives (the reference may be slow: the
inputs are short). Token-level readers get the token ids of each corpus text instead: SmolLM2's
ids of the text's first 16 KB, repeated to 1,048,576 tokens (tokenizing each megabyte whole
would take the suite a minute).

Audited and linear without a change (tested here so they stay so): ``storable_text``,
``validate.prepare_group``, ``importer.parse_row`` and ``read_rows``, the hf engine's stop-string
check.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reflexdb.collector.engines.hf import find_stop, stop_window
from reflexdb.collector.tasks.datasets import ground_truth_from, load_dataset
from reflexdb.explorer.app import _conversation
from reflexdb.explorer.tokens import MAX_SHADED, masked_out, texts, tokens
from reflexdb.ops.importer import BadRow, parse_row, read_rows
from reflexdb.records import GroupIn, TrajectoryIn, TurnIn
from reflexdb.storable import MAX_JSON_DEPTH, storable_json, storable_text
from reflexdb.validate import prepare_group

from tests.hostile_text import MB, OPENERS, assert_linear, corpus, hostile_texts

MODEL_CACHE = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or Path(tempfile.gettempdir()) / "reflexdb-model-cache")
NAMES = sorted(corpus())
HYPOTHESIS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
#: A response of this many tokens stands for 1 MB of text (one token per byte: the worst case).
TOKENS = MB


@pytest.fixture(scope="module")
def tok():
    from reflexdb.models import smollm2_tokenizer_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(MODEL_CACHE))


@pytest.fixture(scope="module")
def corpus_ids(tok) -> dict[str, np.ndarray]:
    """Each corpus text's token ids: those of its first 16 KB, repeated to :data:`TOKENS`."""
    out = {}
    for name, text in corpus().items():
        ids = np.asarray(tok.encode(_encodable(text[:16384]), add_special_tokens=False), dtype=np.int32)
        out[name] = np.resize(ids, TOKENS)
    return out


def _encodable(text: str) -> str:
    """``text`` as a tokenizer can take it (a lone surrogate becomes U+FFFD: the engine's text
    comes from its own decode, which never holds one)."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


# ---------------------------------------------------------------- datasets: the ground truth


def _truth(answer: str, fmt: str) -> str | None:
    """``ground_truth_from``, None where the format's marker is missing (its documented refusal)."""
    try:
        return ground_truth_from(answer, fmt)
    except ValueError:
        return None


#: How a corpus text sits in a GSM8K answer field: after the mark (the number normalisation reads
#: it), and between the mark's answer and a last character (whitespace runs between them made the
#: old regex quadratic: "#### a" + 1 MB of spaces + "b" ran for hours).
GSM8K_FRAMES = {"after the mark": "#### {}", "inside the answer": "#### a{}b"}


@pytest.mark.parametrize("frame", GSM8K_FRAMES)
@pytest.mark.parametrize("name", NAMES)
def test_gsm8k_ground_truth_is_linear(name, frame):
    answer = GSM8K_FRAMES[frame].replace("{}", corpus()[name])
    assert_linear(_truth, answer, "gsm8k", name=f"{name}, {frame}")


@pytest.mark.parametrize("fmt", ["auto", "boxed"])
@pytest.mark.parametrize("name", NAMES)
def test_boxed_ground_truth_is_linear(name, fmt):
    # the `boxed` and `auto` formats read \boxed{} with collector/rewards.py's extract_boxed
    assert_linear(_truth, corpus()[name], fmt, name=f"{name}, {fmt}")


def _old_gsm8k(answer: str) -> str | None:
    """The regex ``ground_truth_from`` used (quadratic in a whitespace run; fine on short text)."""
    m = re.search(r"####\s*(.+?)\s*$", answer, re.S)
    if m is None:
        return None
    value = m.group(1).strip()
    return value.replace(",", "") if re.fullmatch(r"-?[\d,]+(\.\d+)?", value) else value


@HYPOTHESIS
@given(st.one_of(hostile_texts(), st.tuples(hostile_texts(40), hostile_texts(40)).map("####".join)))
def test_gsm8k_ground_truth_is_the_old_regexs(answer):
    assert _truth(answer, "gsm8k") == _old_gsm8k(answer)


def test_gsm8k_ground_truth_examples():
    # the text after the first mark, stripped; thousands separators dropped from a plain number
    assert _truth("so 3 + 4 = 7\n#### 1,234\n", "gsm8k") == "1234"
    assert _truth("#### -12.50", "gsm8k") == "-12.50"
    assert _truth("#### 7 apples #### 8", "gsm8k") == "7 apples #### 8"
    assert _truth("#### \n\t ", "gsm8k") == ""  # a mark with only whitespace after it: empty
    assert _truth("no answer ####", "gsm8k") is None  # nothing after the mark
    assert _truth("#### a" + " " * 100_000 + "b", "gsm8k") == "a" + " " * 100_000 + "b"


# ---------------------------------------------------------------- datasets: the rows of a file


def test_a_dataset_line_python_cannot_hold_is_a_skipped_row(tmp_path):
    # Each of these stopped load_dataset with an exception: invalid UTF-8 (UnicodeDecodeError),
    # nesting 10^5 deep (RecursionError), an integer of 5,000 digits (ValueError).
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\n".join([
        b'{"question": "2 + 2?", "answer": "#### 4"}',
        b'{"question": "caf\xe9?", "answer": "#### 1"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"question": "big?", "answer": ' + b"9" * 5000 + b"}",
        b'{"question": "3 + 3?", "answer": "#### 6"}',
    ]) + b"\n")
    ds = load_dataset(path)
    assert [(t.prompt, t.ground_truth) for t in ds.tasks] == [("2 + 2?", "4"), ("3 + 3?", "6")]
    assert [(r.line, r.reason) for r in ds.skipped_rows] == [
        (2, "not UTF-8 (column 18)"),  # '{"question": "caf' is 17 characters
        (3, "JSON this reader cannot hold (RecursionError)"),
        (4, "JSON this reader cannot hold (ValueError)"),
    ]


dataset_line = st.one_of(
    st.fixed_dictionaries({"question": hostile_texts(30), "answer": hostile_texts(30)})
    .map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.binary(max_size=200),
    st.builds(lambda unit, n: unit * n, st.sampled_from([b"[", b'{"a":', b"9", b"\xff"]), st.integers(1, 3000)),
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(dataset_line, max_size=8))
def test_any_dataset_file_loads_every_line_as_a_task_or_a_skipped_row(lines):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "train.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        ds = load_dataset(path)
    # the lines as the text-mode reader splits them (\n, \r, \r\n), blank ones left out
    text = (b"\n".join(lines) + b"\n").decode("utf-8", "surrogateescape")
    assert len(ds.tasks) + ds.skipped == sum(1 for line in re.split(r"\r\n|\r|\n", text) if line.strip())


# ---------------------------------------------------------------- storable_text, storable_json


@pytest.mark.parametrize("name", NAMES)
def test_storable_text_is_linear(name):
    assert_linear(storable_text, corpus()[name], name=name)


def _jsonish(text: str) -> dict:
    return {"text": text, "items": [text, 1.5, math.nan, {"inner": text}], text[:64]: None}


@pytest.mark.parametrize("name", NAMES)
def test_storable_json_is_linear(name):
    assert_linear(lambda t: storable_json(_jsonish(t)), corpus()[name], name=name)


def _nested(kind: str, depth: int):
    value: object = "\x00 innermost"
    for _ in range(depth):
        value = [value] if kind == "list" else {"a\x00": value}
    return value


def _depth(value) -> int:
    """How many containers deep ``value`` is (iteratively: the old storable_json could not)."""
    n = 0
    while isinstance(value, (list, dict)) and value:
        value, n = (value[0] if isinstance(value, list) else next(iter(value.values()))), n + 1
    return n + isinstance(value, (list, dict))


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("depth", [500, 900, 100_000])
def test_storable_json_of_deep_nesting_neither_recurses_nor_stalls(kind, depth):
    # 500 levels stopped the recursive version with RecursionError (two frames a level), and JSON
    # nested 900 deep is what json.loads reads from a model's reply; past MAX_JSON_DEPTH (256)
    # containers become None.
    value = _nested(kind, depth)
    assert_linear(storable_json, value, name=f"{kind}s {depth} deep")
    got = storable_json(value)
    assert _depth(got) == MAX_JSON_DEPTH  # containers at depths 0..255 kept, the one at 256 is None


def test_storable_json_keeps_json_that_is_not_too_deep():
    value = json.loads("[" * MAX_JSON_DEPTH + '"a\\u0000"' + "]" * MAX_JSON_DEPTH)
    got = storable_json(value)
    assert _depth(got) == MAX_JSON_DEPTH
    inner = got
    for _ in range(MAX_JSON_DEPTH):
        inner = inner[0]
    assert inner == "a\ufffd"


def _old_storable_json(value):
    """The recursive storable_json (fine on shallow values)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {storable_text(k) if isinstance(k, str) else k: _old_storable_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_old_storable_json(v) for v in value]
    return value


json_like = st.recursive(
    st.one_of(hostile_texts(20), st.floats(), st.integers(), st.booleans(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(hostile_texts(6), st.sampled_from(["\x00", "\ufffd"]),
                                                      st.integers(-2, 2)), inner, max_size=4)),
    max_leaves=40,
)


def _same(a, b) -> bool:
    """Equal, with the same types and the same key order all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@HYPOTHESIS
@given(json_like)
def test_storable_json_is_the_recursive_versions(value):
    got = storable_json(value)
    assert _same(got, _old_storable_json(value))
    json.dumps(got, allow_nan=False).encode("utf-8")  # storable: finite numbers, UTF-8 text


@HYPOTHESIS
@given(hostile_texts())
def test_storable_text_replaces_nul_and_lone_surrogates(text):
    got = storable_text(text)
    assert "\x00" not in got
    got.encode("utf-8")  # no lone surrogate left
    assert got == text.replace("\x00", "\ufffd").encode("utf-8", "surrogatepass").decode("utf-8", "replace")


# ---------------------------------------------------------------- the store's validation


def _validate(text: str) -> None:
    """prepare_group on a trajectory whose every text field is ``text`` (refusals are fine)."""
    from reflexdb.errors import InvalidGroup

    turns = [TurnIn("user", text), TurnIn("assistant", text, 0, 2, answer=text)]
    t = TrajectoryIn(prompt_ids=[1], response_ids=[1, 2], logprobs=[-0.1, -0.2], turns=turns,
                     extracted_answer=text, error=text, meta={"note": text})
    try:
        prepare_group(GroupIn(run_id=1, task_id=1, policy_version=0, trajectories=[t]))
    except InvalidGroup:
        pass


@pytest.mark.parametrize("name", NAMES)
def test_validating_a_group_is_linear(name):
    assert_linear(_validate, corpus()[name], name=name)


@HYPOTHESIS
@given(hostile_texts())
def test_validation_refuses_exactly_the_text_with_nul(text):
    from reflexdb.errors import InvalidGroup

    t = TrajectoryIn(prompt_ids=[1], response_ids=[1], logprobs=[-0.1], turns=[TurnIn("assistant", text, 0, 1)])
    group = GroupIn(run_id=1, task_id=1, policy_version=0, trajectories=[t])
    if "\x00" in text:
        with pytest.raises(InvalidGroup, match="NUL"):
            prepare_group(group)
    else:
        assert prepare_group(group).trajectories[0].turns[0].text == text


# ---------------------------------------------------------------- importer rows


def _row_shapes(text: str) -> list[dict]:
    return [
        {"prompt": text, "completion": text, "ground_truth": text, "task_key": text[:100], "reward": 1},
        {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text}]},
        {"prompt": [{"role": text[:1000], "content": text}], "completion": [{"role": "assistant", "content": text}]},
        {"prompt": "p", "completion": "c", "reward": text, "correct": text},
        {"prompt": "p", "completion": "c", "correct": text},
    ]


def _parse_all(text: str) -> None:
    for row in _row_shapes(text):
        try:
            parse_row(row)
        except BadRow:
            pass


@pytest.mark.parametrize("name", NAMES)
def test_parsing_import_rows_is_linear(name):
    assert_linear(_parse_all, corpus()[name], name=name)


def _read_and_parse(path: Path) -> None:
    for batch in read_rows(path, 2):
        for _, row in batch:
            try:
                parse_row(row)
            except BadRow:
                pass


@pytest.mark.parametrize("name", NAMES)
def test_reading_an_import_file_is_linear(name, tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = _row_shapes(corpus()[name])
    path.write_bytes(b"\n".join(json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass") for r in rows))
    assert_linear(_read_and_parse, path, name=name)


def test_a_bad_value_in_an_import_row_is_named_briefly():
    # the value was written whole into the message (1 MB of a model's text, printed per bad row)
    row = {"prompt": "p", "completion": "c"}
    with pytest.raises(BadRow) as bad:
        parse_row({**row, "reward": "x" * MB})
    assert str(bad.value) == "reward must be a finite number or null, got '" + "x" * 40 + "'…"
    with pytest.raises(BadRow) as bad:
        parse_row({**row, "correct": "x" * MB})
    assert str(bad.value) == "correct must be true, false or null, got '" + "x" * 40 + "'…"
    with pytest.raises(BadRow, match="got a list$"):
        parse_row({**row, "reward": json.loads("[" * 900 + "]" * 900)})
    with pytest.raises(BadRow, match="got 'high'$"):
        parse_row({**row, "reward": "high"})


def test_an_import_reward_too_large_for_a_float_is_a_bad_row():
    # JSON allows 10^400; float() of it raised OverflowError, which stopped the import
    row = json.loads('{"prompt": "p", "completion": "c", "reward": 1' + "0" * 400 + "}")
    with pytest.raises(BadRow, match=r"^reward must be a finite number or null, got 1000000000"):
        parse_row(row)
    assert parse_row({"prompt": "p", "completion": "c", "reward": 10**20}).reward == 1e20


import_value = st.one_of(hostile_texts(30), st.integers(), st.floats(), st.booleans(), st.none(),
                         st.lists(hostile_texts(5), max_size=3))


@HYPOTHESIS
@given(st.fixed_dictionaries({}, optional={k: import_value for k in (
    "prompt", "completion", "reward", "correct", "ground_truth", "task_key")}))
def test_an_import_row_is_parsed_or_named_bad(row):
    try:
        parsed = parse_row(row)
    except BadRow as exc:
        assert len(str(exc)) < 200
        return
    assert parsed.completion == row["completion"]
    assert parsed.prompt_messages == [{"role": "user", "content": row["prompt"]}]
    assert parsed.reward is None or math.isfinite(parsed.reward)


# ---------------------------------------------------------------- the explorer's tokens


def _payload(ids: np.ndarray) -> dict[str, np.ndarray]:
    n = len(ids)
    return {"response_ids": ids, "logprobs": np.linspace(-5, 0, n, dtype=np.float32),
            "versions": np.zeros(n, np.int32), "loss_mask": (np.arange(n) % 3 != 0).astype(np.uint8)}


def _page_turns(tok, ids: np.ndarray) -> list:
    """The conversation the trajectory page renders: one assistant turn over every token."""
    t = {"turns": [{"turn_index": 0, "role": "assistant", "text": "…", "token_start": 0, "token_end": len(ids),
                    "tool_call": None}], "tokens": _payload(ids), "marks": [{"token": len(ids) - 1, "label": "end"}]}
    return _conversation(t, tok)


@pytest.mark.parametrize("name", NAMES)
def test_the_explorers_token_texts_are_linear(name, tok, corpus_ids):
    assert_linear(texts, tok, corpus_ids[name], name=f"{name}: {TOKENS:,} tokens")


@pytest.mark.parametrize("name", NAMES)
def test_the_explorers_turn_rendering_is_linear(name, tok, corpus_ids):
    assert_linear(_page_turns, tok, corpus_ids[name], name=f"{name}: {TOKENS:,} tokens")


def test_a_long_turn_shades_its_first_tokens_and_counts_the_rest(tok, corpus_ids):
    ids = corpus_ids["mixed scripts"]
    (turn,) = _page_turns(tok, ids)
    assert [tk.index for tk in turn["tokens"]] == list(range(MAX_SHADED))
    assert turn["unshaded"] == TOKENS - MAX_SHADED
    assert turn["masked_out"] == (TOKENS + 2) // 3  # indices 0, 3, 6, ... of 1,048,576: 349,526
    assert turn["notes"] == [{"token": TOKENS - 1, "label": "end"}]  # a mark past the shaded tokens
    (short,) = _page_turns(tok, ids[:10])
    assert [tk.index for tk in short["tokens"]] == list(range(10)) and short["unshaded"] == 0
    assert short["masked_out"] == 4  # 0, 3, 6, 9


@HYPOTHESIS
@given(hostile_texts(60), st.lists(st.integers(0, 49151), max_size=20))
def test_token_texts_are_each_ids_own_decode(tok, text, extra):
    ids = np.asarray(tok.encode(_encodable(text), add_special_tokens=False) + extra, dtype=np.int32)
    each = [tok.decode([int(i)], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    assert texts(tok, ids) == each
    toks = tokens(tok, _payload(ids), 1, len(ids), limit=5)
    assert [(tk.index, tk.text) for tk in toks] == [(i, each[i]) for i in range(1, min(len(ids), 6))]
    assert masked_out(_payload(ids), 1, len(ids)) == sum(1 for i in range(1, len(ids)) if i % 3 == 0)


def test_token_ids_outside_the_vocabulary_are_shown_as_ids(tok):
    assert texts(tok, np.asarray([1, -5, 10**9], dtype=np.int64)) == ["[1]", "[-5]", "[1000000000]"]
    assert texts(None, np.asarray([7])) == ["[7]"]


# ---------------------------------------------------------------- the hf engine's stop strings

#: Stop strings as a config gives them (the longest sets the window: 4 · 9 + 4 = 40 tokens).
STOPS = ("</answer>", "```\n", "Human:", "\n\n\n")


def _check_steps(tok, ids: np.ndarray, steps: int = 2_000) -> str | None:
    """The engine's stop check after each of the last ``steps`` tokens of a long response."""
    window, hit = stop_window(STOPS), None
    for end in range(len(ids) - steps + 1, len(ids) + 1):
        hit = find_stop(tok, ids, end, STOPS, window) or hit
    return hit


@pytest.mark.parametrize("name", NAMES)
def test_stop_strings_are_matched_in_a_window_not_the_whole_response(name, tok, corpus_ids):
    # Each step decodes the last 40 tokens, 50-180 µs here whatever the response's length (40
    # tokens of 64 spaces are 2,560 characters): 2,000 steps at the end of a 1,048,576-token
    # response cost what they cost at its start. Decoding the response so far would take hours.
    assert_linear(_check_steps, tok, corpus_ids[name], name=f"{name}: last 2,000 of {TOKENS:,} tokens")


def _first_stop(n: int, hit_at) -> tuple[int, str] | None:
    """The first ``end`` in 1..n where ``hit_at(end)`` finds a stop string, and the string."""
    return next(((end, hit) for end in range(1, n + 1) if (hit := hit_at(end)) is not None), None)


#: U+FFFD is left out: a window that starts inside a character's byte tokens decodes as U+FFFD.
STOP_CHOICES = [s for s in OPENERS if s != "\ufffd"]


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(hostile_texts(50), st.lists(st.sampled_from(STOP_CHOICES), min_size=1, max_size=3, unique=True))
def test_the_stop_window_finds_what_decoding_the_whole_response_finds(tok, text, stop):
    ids = tok.encode(_encodable(text), add_special_tokens=False)
    stop, row, window = tuple(stop), np.asarray(ids, dtype=np.int64), stop_window(stop)
    windowed = _first_stop(len(ids), lambda end: find_stop(tok, row, end, stop, window))
    whole = _first_stop(len(ids), lambda end: next((s for s in stop if s in tok.decode(ids[:end])), None))
    assert windowed == whole


def test_an_import_text_over_the_cap_is_a_bad_row_before_the_tokenizer_reads_it():
    from reflexdb.ops.importer import MAX_TEXT_CHARS

    with pytest.raises(BadRow, match=r"^a text of the row is 4,000,001 characters; at most 4,000,000$"):
        parse_row({"prompt": "p", "completion": "x" * (MAX_TEXT_CHARS + 1)})
    with pytest.raises(BadRow, match="4,000,001 characters"):
        parse_row({"messages": [{"role": "user", "content": "y" * (MAX_TEXT_CHARS + 1)},
                                {"role": "assistant", "content": "c"}]})
    assert parse_row({"prompt": "p", "completion": "x" * MAX_TEXT_CHARS}).completion == "x" * MAX_TEXT_CHARS
