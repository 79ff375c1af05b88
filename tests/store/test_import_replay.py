"""Imported groups (reflexdb import) trained beside the run's own: learner.imported_per_step.

The rules live in the view learner_eligible (no staleness rule, max_reuse, only when asked); the
learner mixes at most k imported groups into a step with π_old its own weights; collectors' admission
control counts the fresh share of a step while imported groups last.
"""

from __future__ import annotations

import numpy as np
import pytest
from reflexdb.methods.nexgrpo.batch import replay_selection
from reflexdb.trainer.batch import eligible_group_ids, eligible_imported_ids

from reflexdb import GroupIn, TaskIn, TrajectoryIn, TurnIn, work
from tests.factories import make_group
from tests.processes import rows


def imported_group(rng, run: int, task: int, rewards: list, *, T: int = 6) -> GroupIn:
    """A group as `reflexdb import` writes it: origin and kind imported, no log-probs, version 0."""
    trajs = [TrajectoryIn(prompt_ids=rng.integers(0, 1000, 5), response_ids=rng.integers(0, 1000, T + j),
                          logprobs=None, reward=r, correct=None if r is None else r >= 1.0, origin="imported",
                          turns=[TurnIn("user", "q"), TurnIn("assistant", "a", 0, T + j)])
             for j, r in enumerate(rewards)]
    return GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=trajs, workflow="import", kind="imported")


def _run(store, name: str, n_tasks: int = 6):
    run = store.create_run(name)
    return run, store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(n_tasks)])


def _reasons(store, run: int) -> dict[int, tuple]:
    return {g: (kind, eligible, reason, staleness) for g, kind, eligible, reason, staleness in rows(
        store, "SELECT group_id, kind, eligible, reason, staleness FROM learner_eligible WHERE run_id = :r", r=run)}


def test_imported_groups_are_trained_only_when_asked_with_no_staleness_rule(store):
    rng = np.random.default_rng(0)
    run, tasks = _run(store, "imp-view")
    fresh = store.write_group(make_group(rng, run, tasks[0], version=0)).group_id
    imp = [store.write_group(imported_group(rng, run, t, [1.0, 0.0])).group_id for t in tasks[1:4]]
    # Not asked (the default): never eligible, reason 'imported', and no version to be stale against.
    assert _reasons(store, run)[imp[0]] == ("imported", False, "imported", None)
    assert eligible_imported_ids(store, run, 2) == []
    store.set_settings(run, {"learner.imported_per_step": 2, "learner.max_staleness": 1})
    for v in range(1, 6):  # the learner moves on to v5: the fresh v0 group is stale, imported ones are not
        store.publish_policy(run, v, f"/ckpt/v{v}")
    got = _reasons(store, run)
    assert got[fresh] == ("fresh", False, "stale", 5)
    assert got[imp[0]] == ("imported", True, "ok", None)
    # The oldest first, at most n; the method's queries never take them (they come only this way).
    assert eligible_imported_ids(store, run, 2) == imp[:2]
    assert eligible_imported_ids(store, run, 0) == []
    fresh_new = store.write_group(make_group(rng, run, tasks[4], version=5)).group_id
    assert eligible_group_ids(store, run, 10, min_version=-100).group_ids == [fresh_new]
    assert replay_selection(store, run, 10, min_version=-100, max_replay=2).group_ids == [fresh_new]
    # Each at most max_reuse steps (default 1).
    t_ids = [t for (t,) in rows(store, "SELECT id FROM trajectories WHERE group_id = :g", g=imp[0])]
    store.record_step(run, 1, 5, t_ids)
    assert _reasons(store, run)[imp[0]] == ("imported", False, "consumed", None)
    assert eligible_imported_ids(store, run, 5) == imp[1:]
    store.set_settings(run, {"learner.max_reuse": 2})
    assert eligible_imported_ids(store, run, 5) == imp


@pytest.mark.parametrize(("ahead", "G", "k", "left", "steps"), [
    # k = 0 or nothing imported left: the plain count, ahead // G
    (9, 4, 0, 0, 2), (9, 4, 2, 0, 2),
    # G = 4, k = 3, 5 uses left: 2 steps take imports (1 fresh each), then 4 fresh a step.
    # ahead 0 -> the next step (0); 1 -> 1; 2 -> 2 + (2 - 2) // 4 = 2; 6 -> 2 + 4 // 4 = 3
    (0, 4, 3, 5, 0), (1, 4, 3, 5, 1), (2, 4, 3, 5, 2), (6, 4, 3, 5, 3),
    # k = G (imports only while they last): 8 uses / 4 = 2 steps without fresh groups; 3 // 4 = 0 more
    (3, 4, 4, 8, 2), (4, 4, 4, 8, 3),
])
def test_steps_until_consumed_counts_the_fresh_share(ahead, G, k, left, steps):
    assert work.steps_until_consumed(ahead, G, k, left) == steps


def test_admission_paces_collectors_to_the_fresh_share_while_imports_last(store):
    """G = 4 groups a step, k = 2 of them imported, 4 imported groups: the first 2 steps take 2 fresh
    groups each. Without counting that, a collector at v0 would start 8 groups (2 steps' worth at
    G = 4) and the last 4 would be consumed at step 3, version 3 with publish_every 1: stale."""
    rng = np.random.default_rng(0)
    run, tasks = _run(store, "imp-admission", 10)
    for t in tasks[:4]:
        store.write_group(imported_group(rng, run, t, [1.0, 0.0]))
    store.set_settings(run, {"learner.imported_per_step": 2})
    kw = dict(eta=1, groups_per_step=4, publish_every=1, imported_per_step=2)
    started = 0
    while work.admission(store, run, "a", policy_version=0, **kw).allowed:
        store.write_group(make_group(rng, run, tasks[4], size=1))
        started += 1
    # Groups 0-1 go to step 0, 2-3 to step 1 (v1 = 0 + eta): 4 groups; group 4 would wait for step 2.
    a = work.admission(store, run, "a", policy_version=0, **kw)
    assert (started, a.next_group, a.consume_version, a.staleness) == (4, 4, 2, 2)
    # The plain count (k = 0) would have let 8 start.
    assert work.admission(store, run, "a", policy_version=0, **{**kw, "imported_per_step": 0}).allowed


# ----------------------------------------------------------------------------- the learner (model)

def _learner(store, tmp_path, monkeypatch, name: str, **learner):
    from reflexdb.trainer.learner import Learner

    from reflexdb.config import parse_config
    from tests.store.test_learn import config_data

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / name))
    data = {**config_data(**learner), "run": name, "max_staleness": 100}
    lr = Learner(parse_config(data), store, echo=lambda m: None)
    return lr


def _consumed(store, run: int) -> list[tuple]:
    return rows(store, "SELECT s.step, array_agg(DISTINCT c.group_id ORDER BY c.group_id) FROM consumption c "
                       "JOIN learner_steps s ON s.id = c.step_id WHERE s.run_id = :r GROUP BY s.step ORDER BY s.step",
                r=run)


@pytest.mark.parametrize("pi_old", ["recompute", "behaviour"])
def test_a_step_on_imported_groups_only_uses_the_learners_own_pi_old(store, tmp_path, monkeypatch, model_cache,
                                                                       pi_old):
    """imported_per_step = groups_per_step: a step of imported groups alone (offline data), with
    non-binary and NULL rewards and micro-batches of 3 rows for a batch of 8. Whatever pi_old says,
    an imported row's π_old is the policy at the step's start (no behaviour log-probs), so the
    ratio is exactly 1 on every token, and the GRPO loss is −(1/N) Σ_i A_i over the N = 6 valid rows,
    which is 0: each group's advantages sum to 0. The gradient is not 0: the weights move."""
    import torch

    rng = np.random.default_rng(0)
    lr = _learner(store, tmp_path, monkeypatch, f"imp-only-{pi_old}", groups_per_step=2, imported_per_step=2,
                  micro_batch_size=3, pi_old=pi_old)
    run = store.create_run(lr.cfg.run)
    tasks = store.add_tasks(run, [TaskIn("What is 1 + 1?", "2"), TaskIn("What is 2 + 1?", "3")])
    imp = [store.write_group(imported_group(rng, run, tasks[0], [0.25, None, 1.0, 0.6])).group_id,
           store.write_group(imported_group(rng, run, tasks[1], [0.0, 0.5, None, 0.5])).group_id]
    lr.setup()
    before = [p.detach().clone() for p in lr.engine.ds.module.parameters()]
    chosen = lr.wait_for_groups(deadline=None)
    assert chosen.group_ids == imp
    r = lr.step(chosen.group_ids, snapshot=chosen.snapshot)
    m = r.metrics
    assert m["loss/ratio_max"] == pytest.approx(1.0, abs=1e-6) and m["loss/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert r.loss == pytest.approx(0.0, abs=1e-6)  # −(1/6) Σ A_i, each group's A summing to 0
    assert m["policy/grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, lr.engine.ds.module.parameters()))
    assert m["reward/missing"] == 2.0  # the NULL rewards carry no loss
    assert m["imported/groups"] == 2.0
    assert m["imported/reward_mean"] == pytest.approx((0.25 + 1.0 + 0.6 + 0.0 + 0.5 + 0.5) / 6)  # 2.85 / 6
    assert np.isnan(m["reward/pass_at_1"]) and m["staleness/max"] == 0.0  # nothing the policy sampled
    assert _consumed(store, run) == [(1, imp)]
    lr.finish()


def test_the_learner_mixes_at_most_k_imported_groups_into_each_step(store, tmp_path, monkeypatch, model_cache):
    """groups_per_step 2, imported_per_step 1: each step takes the oldest imported group and the
    oldest fresh one, until the imported groups are used up; then fresh ones only."""
    from tests.store.test_learn import tiny_group

    rng = np.random.default_rng(1)
    lr = _learner(store, tmp_path, monkeypatch, "imp-mixed", groups_per_step=2, imported_per_step=1)
    run = store.create_run(lr.cfg.run)
    tasks = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(6)])
    imp = [store.write_group(imported_group(rng, run, t, [1.0, 0.0, 0.5])).group_id for t in tasks[:2]]
    fresh = [store.write_group(tiny_group(rng, run, t)).group_id for t in tasks[2:6]]
    lr.setup()
    lr.run(max_steps=3)
    assert _consumed(store, run) == [(1, [imp[0], fresh[0]]), (2, [imp[1], fresh[1]]), (3, fresh[2:4])]
    got = {s: m for s, m in rows(store, "SELECT step, metrics FROM learner_steps WHERE run_id = :r", r=run)}
    assert [got[s]["imported/groups"] for s in (1, 2, 3)] == [1.0, 1.0, 0.0]
    # The fresh group of step 2 is 1 version old; the imported one has no version and is not counted.
    assert got[2]["staleness/max"] == 1.0
    assert {r for (r,) in rows(store, "SELECT reason FROM learner_eligible WHERE kind = 'imported' AND run_id = :r",
                                r=run)} == {"consumed"}
    # The staleness view: imported groups have no producing policy.
    assert rows(store, "SELECT step, kind, staleness, token_staleness FROM staleness WHERE run_id = :r "
                       "AND step = 2 ORDER BY kind", r=run) == [(2, "fresh", 1, 1), (2, "imported", None, None)]
    lr.finish()


def test_a_runs_experience_exported_and_imported_trains_to_the_same_weights(store, db_url, tmp_path, monkeypatch,
                                                                            model_cache):
    """The database holds all a step needs: a run's trained groups, exported and imported into a
    new run, then trained as imported groups alone, give the same weights bit for bit (sha256 of
    each published version). π_old is the learner's own weights in both runs (pi_old: recompute
    there, always for imported rows here), so each step sees the same rows, rewards (non-binary,
    NULL), groups and order."""
    from reflexdb.models import resolve_model

    from reflexdb.ops.export import export
    from reflexdb.ops.importer import Tokenizer, import_file
    from tests.store.test_learn import tiny_group

    rng = np.random.default_rng(2)
    src = _learner(store, tmp_path, monkeypatch, "replay-src", groups_per_step=2, micro_batch_size=3)
    run = store.create_run("replay-src")
    tasks = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(4)])
    for t in tasks:
        store.write_group(tiny_group(rng, run, t, rewards=[0.25, None, 1.0, 0.6]))
    src.setup()
    src.run(max_steps=2)
    out = tmp_path / "experience.parquet"
    export(db_url, "SELECT t.id AS trajectory_id, t.reward, t.correct, k.task_key FROM trajectories t "
                   "JOIN groups g ON g.id = t.group_id JOIN tasks k ON k.id = t.task_id "
                   f"WHERE t.run_id = {run} AND EXISTS (SELECT 1 FROM consumption c WHERE c.group_id = g.id) "
                   "ORDER BY g.id, t.index_in_group", out)
    dst = _learner(store, tmp_path, monkeypatch, "replay-dst", groups_per_step=2, micro_batch_size=3,
                   imported_per_step=2)
    target = store.create_run("replay-dst")
    stats = import_file(store, target, out, Tokenizer(resolve_model("tiny")))
    assert (stats.imported, stats.groups) == (16, 4)
    dst.setup()
    dst.run(max_steps=2)

    def shas(r):
        return rows(store, "SELECT version, sha256 FROM policy_versions WHERE run_id = :r ORDER BY 1", r=r)

    assert [v for v, _ in shas(run)] == [0, 1, 2] and len({h for _, h in shas(run)}) == 3  # each step moved
    assert shas(target) == shas(run)
