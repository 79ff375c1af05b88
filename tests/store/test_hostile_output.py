"""Nothing a model or a tool writes stops a collector, an import or a reflection's write (issue 33).

Property-based (hypothesis): arbitrary bytes, sizes and Unicode — NUL, lone surrogates, control
and bidi characters, HTML, fences, tens of kilobytes — thrown at the tool turn (what the code
prints), the sampled text, R3L's reflections and import rows. The collector's loop body runs on a
real store with the real sandbox; after every example it is still running, and the store holds
exactly the groups the collector counted as written (each refused group counted and its reason
recorded, never a crash, never a lost batch).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reflexdb.collector.engines import Sample
from reflexdb.collector.tasks.templates import apply_chat_template

# marker model: sandbox and sampling work, the database incidental; CI's external-server pass skips it
pytestmark = [pytest.mark.timeout(600), pytest.mark.model]

NASTY = ["\x00", "\ud800", "\udfff", "\ud83d", "\u202e", "\ufeff", "\x1b[31m", "<script>alert(1)</script>", "'", "\\",
         "```", "```python\n", "\r\n", "\x7f", "\u0085", "\U0010ffff", "\\u0000", "{", "}", "\"", "\u2028", "💥"]

hostile_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(NASTY) | st.text(max_size=5), max_size=60).map("".join),
    st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
    st.builds(lambda s, n: s * n, st.sampled_from(NASTY) | st.text(min_size=1, max_size=4), st.integers(1, 6000)),
)
hostile_bytes = st.one_of(
    st.binary(max_size=400),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8), st.integers(1, 20000)),  # up to 160 KB
    st.sampled_from(NASTY).map(lambda s: s.encode("utf-8", "surrogatepass")),
)
FAST = {"timeout_s": 2.0, "cpu_s": 2, "max_tool_calls": 2}


class Scripted:
    """An engine whose n-th call 'samples' ``turns[n]``: ids from the tiny model's tokenizer (text a
    tokenizer cannot encode, a lone surrogate, is tokenised with it replaced), the text as given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.turns, self.calls = tokenizer, [""], 0

    def generate(self, prompts, n=1, params=None):
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        safe = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        tok = np.asarray(self.tokenizer.encode(safe, add_special_tokens=False)[:4000] + [self.tokenizer.eos_token_id],
                         np.int32)
        ids = [apply_chat_template(self.tokenizer, p) if p and isinstance(p[0], dict) else list(p) for p in prompts]
        return [[Sample(np.asarray(p, np.int32), tok, np.full(len(tok), -0.5, np.float32), "stop", text,
                        np.ones(8, np.float32)) for _ in range(n)] for p in ids]


def _collector(store, tmp_path, monkeypatch):
    from reflexdb.collector.runner import Collector

    from reflexdb.config import parse_config

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    cfg = parse_config({
        "run": "hostile", "model": "tiny", "algorithm": "grpo", "max_staleness": 1000,
        "environment": {"name": "tool_python", **FAST},
        "tasks": {"source": "arithmetic", "level": 7, "train_size": 2, "eval_size": 0, "template": "tool_python"},
        "collector": {"group_size": 2, "tasks_per_batch": 1, "sampling": {"max_new_tokens": 64}},
        "learner": {"groups_per_step": 1, "micro_batch_size": 1, "publish_every": 1}})
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    script = Scripted(collector.engine.tokenizer)
    collector.engine.generate = script.generate
    return collector, script


def _count(store, sql, *args):
    with store.transaction() as conn:
        return conn.execute(sql, args).fetchone()[0]


def test_no_tool_output_or_sampled_text_stops_the_collector(store, tmp_path, monkeypatch, model_cache):
    collector, script = _collector(store, tmp_path, monkeypatch)

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(before=hostile_text, printed=hostile_bytes, stderr=hostile_bytes, answer=hostile_text,
           pad=st.sampled_from([0, 0, 0, 140_000]))
    @example(before="", printed=b"a\x00b", stderr=b"", answer="\\boxed{1}", pad=0)  # the NUL that stopped it
    @example(before="\x00", printed=b"x" * 100_000, stderr=b"\xff\xfe", answer="\ud800", pad=140_000)  # 140 KB code
    def one_batch(before, printed, stderr, answer, pad):
        code = (f"#{'x' * pad}\nimport sys\nsys.stdout.buffer.write({printed!r})\n"
                f"sys.stderr.buffer.write({stderr!r})\n")
        script.turns, script.calls = [f"{before}\n```python\n{code}```", answer], 0
        groups = collector.stats.groups
        collector._claim_and_collect(collector.workflows, 1)  # the loop's body: never raises
        assert collector.stats.groups + collector.stats.rejected > groups

    one_batch()
    # the store keeps every group the collector counted as written, and counted every refusal
    assert _count(store, "SELECT count(*) FROM groups") == collector.stats.groups
    assert _count(store, "SELECT rejected_groups FROM collectors") == collector.stats.rejected
    assert _count(store, "SELECT count(*) FROM turns WHERE position(chr(65533) in text) > 0") > 0  # NULs replaced
    calls = _count(store, "SELECT count(*) FROM tool_calls")
    assert calls == _count(store, "SELECT count(*) FROM turns WHERE role = 'tool'") and calls > 0
    assert _count(store, "SELECT count(*) FROM tool_calls WHERE status = 'limit' AND detail LIKE 'output over%%'") > 0


def test_a_group_the_store_refuses_is_counted_and_skipped_and_the_batch_goes_on(store, tmp_path, monkeypatch,
                                                                                  model_cache):
    """Whatever the store refuses for its content is logged with the reason, counted in the
    collectors table, its work released for another try; the batch's other groups are written."""
    from reflexdb.errors import InvalidGroup

    collector, script = _collector(store, tmp_path, monkeypatch)
    said = []
    collector.echo = said.append
    script.turns = ["\\boxed{1}"]
    real = collector.store.write_groups
    calls = []

    def refuse_first(groups, **kw):
        calls.append(len(groups))
        if len(calls) == 1:
            raise InvalidGroup("trajectories[0].turns[2].text", "a made-up refusal")
        return real(groups, **kw)

    monkeypatch.setattr(collector.store, "write_groups", refuse_first)
    collector._claim_and_collect(collector.workflows, 2)  # two tasks: two groups, the first refused
    assert (collector.stats.groups, collector.stats.rejected) == (1, 1)
    assert any("refused 1 group(s)" in m and "a made-up refusal" in m for m in said)
    with store.transaction() as conn:
        rejected, reason = conn.execute("SELECT rejected_groups, last_rejection FROM collectors").fetchone()
        claimed = conn.execute("SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL").fetchone()[0]
    assert rejected == 1 and "a made-up refusal" in reason and "InvalidGroup" in reason
    assert claimed == 0  # the refused task went back to the pool
    assert "1 refused by the store" in collector.stats.line(0)


@settings(max_examples=200, deadline=None, database=None)
@given(text=st.one_of(hostile_text, st.builds(lambda d: "[" * d + "]" * d, st.integers(1, 200_000)),
                      st.builds(lambda n: '{"retry_from_step": ' + "9" * n + "}", st.integers(1, 10_000)),
                      st.builds(lambda s: json.dumps({"trajectory_outcome": "failure", "retry_from_step": 0,
                                                      "trajectory_summary": s, "root_cause_analysis": s,
                                                      "improvement_suggestion": s}), hostile_text)),
       n_turns=st.integers(0, 5))
def test_parsing_a_reflection_never_raises(text, n_turns):
    from reflexdb.methods.r3l.reflections import parse_reflection

    p = parse_reflection(text, n_turns)
    assert p.valid == (p.error is None)


def test_reflections_of_any_text_are_stored(store):
    """R3L's reflections rows, whatever the model wrote: NUL and lone surrogates in the raw text
    and inside the parsed JSON fields are stored as U+FFFD, never refused."""
    from reflexdb import GroupIn, TaskIn
    from reflexdb.methods.r3l.reflections import ReflectionIn, Reflections, parse_reflection, reserve_ids
    from tests.factories import make_trajectory

    run = store.create_run("reflections")
    [task] = store.add_tasks(run, [TaskIn("p")])
    rng = np.random.default_rng(0)

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(field=hostile_text, raw=hostile_text)
    def one(field, raw):
        text = raw + json.dumps({"trajectory_summary": field, "root_cause_analysis": field,
                                 "trajectory_outcome": "failure", "improvement_suggestion": field,
                                 "retry_from_step": 0}, ensure_ascii=False)
        [rid] = reserve_ids(store, 1)
        att = Reflections((ReflectionIn(rid, 0, text, parse_reflection(text, 1), "free", 0),))
        store.write_groups([GroupIn(run_id=run, task_id=task, policy_version=0,
                                    trajectories=[make_trajectory(rng)], attachments=[att])])

    one()
    with store.transaction() as conn:
        assert conn.execute("SELECT count(*) FROM reflections").fetchone()[0] == 25


row_value = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | hostile_text,
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
                         max_leaves=8)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "wizard"]) | hostile_text,
                                 "content": hostile_text})
import_row = st.one_of(
    st.fixed_dictionaries({"prompt": hostile_text | st.lists(message, max_size=3) | row_value,
                           "completion": hostile_text | row_value},
                          optional={"reward": row_value, "correct": row_value, "ground_truth": row_value,
                                    "task_key": row_value | st.text(min_size=3000, max_size=3000)}),
    st.fixed_dictionaries({"messages": st.lists(message, max_size=4)}),
    row_value,
)
import_line = st.one_of(import_row.map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
                        st.binary(max_size=200), st.just(b"[" * 100_000), st.just(b"1" * 5000))


def test_import_rows_of_any_content_are_imported_or_named_never_a_crash(store, tmp_path, model_cache):
    """Every line of a JSONL file of hostile rows is imported or reported as FILE:LINE: problem; the
    import never raises; the store holds exactly the rows it counted as imported."""
    from reflexdb.models import tiny_model_dir

    from reflexdb.ops.importer import Tokenizer, import_file

    tok = Tokenizer(tiny_model_dir(model_cache))
    run = store.create_run("imports")
    total = {"imported": 0}

    @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(lines=st.lists(import_line, min_size=1, max_size=6))
    def one(lines):
        path = tmp_path / "rows.jsonl"
        path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
        stats = import_file(store, run, path, tok, batch_size=3)
        assert stats.imported + stats.already + len(stats.bad) == stats.rows
        total["imported"] += stats.imported

    one()
    with store.transaction() as conn:
        assert conn.execute("SELECT count(*) FROM trajectories WHERE run_id = %s", (run,)).fetchone()[0] == \
            total["imported"]
