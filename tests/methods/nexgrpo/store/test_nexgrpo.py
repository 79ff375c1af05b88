"""NexGRPO on a real store: the pool views, boundary-failure selection, the confidence refresh,
soft retirement and the replay-request protocol (hand-made data; no model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reflexdb.methods.nexgrpo.workflow import replay_group
from reflexdb.methods.nexgrpo.batch import compose_batch, replay_selection
from reflexdb.methods.nexgrpo.planner import (
    PlanStats,
    ReplayPlanner,
    boundary_failures,
    difficulty_weight,
    draw_tasks,
    replay_quota,
)

from reflexdb import GroupIn, ReplayRequestLost, TaskIn, work
from reflexdb.index import EmbeddingIndex
from reflexdb.methods.nexgrpo import requests as replay
from reflexdb.methods.nexgrpo.requests import ReplayRequestIn, in_gate
from tests.factories import make_trajectory, setup_run
from tests.processes import rows


def traj(rng, correct, confidence=None, dim=16, **kw):
    """A trajectory; ``confidence`` is stored as given (else exp(mean logprobs))."""
    kw.setdefault("reward", float(bool(correct)))
    return make_trajectory(rng, correct=correct, confidence=confidence, dim=dim, **kw)


def write(store, run, task, trajs, kind="fresh", version=0, **kw):
    return store.write_group(GroupIn(run_id=run, task_id=task, policy_version=version, trajectories=trajs,
                                     kind=kind, **kw))


# ------------------------------------------------------------------ the pool views


def test_negative_pool_gate_boundaries(store):
    """ℓ exactly at ℓ_low and ℓ_high is in the gate; a hair outside is not (view and Python agree)."""
    run, (t1,) = setup_run(store, "gate", 1)
    rng = np.random.default_rng(0)
    confs = [0.2, 0.9, 0.2 - 1e-9, 0.9 + 1e-9, 0.5, 0.05, 0.99]
    g = write(store, run, t1, [traj(rng, False, c) for c in confs] + [traj(rng, True, 0.95)])
    ids = g.trajectory_ids
    got = rows(store, "SELECT trajectory_id, conf_low, conf_high FROM nexgrpo_negative_pool ORDER BY 1")
    assert got == [(ids[0], 0.2, 0.9), (ids[1], 0.2, 0.9), (ids[4], 0.2, 0.9)]  # defaults without settings
    assert [c for c in confs if in_gate(c, 0.2, 0.9)] == [0.2, 0.9, 0.5]
    assert rows(store, "SELECT trajectory_id FROM nexgrpo_positive_pool") == [(ids[7],)]
    # The gate is a per-run setting.
    store.set_settings(run, {"nexgrpo.conf_low": 0.5, "nexgrpo.conf_high": 0.99})
    got = rows(store, "SELECT trajectory_id FROM nexgrpo_negative_pool ORDER BY 1")
    assert got == [(ids[1],), (ids[3],), (ids[4],), (ids[6],)]


def test_pools_leave_out_replayed_copies_eval_groups_and_failed_rewards(store):
    run, (t1, t2) = setup_run(store, "pools", 2)
    rng = np.random.default_rng(1)
    fresh = write(store, run, t1, [traj(rng, True), traj(rng, False, 0.5), traj(rng, None, 0.5, reward=None,
                                                                               error="boom")])
    write(store, run, t1, [traj(rng, True), traj(rng, False, 0.5)], kind="eval")
    copies = write(store, run, t1, [traj(rng, True, origin="replayed", parent_trajectory_id=fresh.trajectory_ids[0]),
                                    traj(rng, False, 0.5, origin="replayed",
                                         parent_trajectory_id=fresh.trajectory_ids[1]),
                                    traj(rng, True), traj(rng, False, 0.6, dim=None)], kind="replay")
    pos = rows(store, "SELECT trajectory_id, group_kind, has_embedding FROM nexgrpo_positive_pool ORDER BY 1")
    assert pos == [(fresh.trajectory_ids[0], "fresh", True), (copies.trajectory_ids[2], "replay", True)]
    neg = rows(store, "SELECT trajectory_id, has_embedding FROM nexgrpo_negative_pool ORDER BY 1")
    assert neg == [(fresh.trajectory_ids[1], True), (copies.trajectory_ids[3], False)]
    assert rows(store, "SELECT count(*) FROM nexgrpo_positive_pool WHERE task_id = :t", t=t2) == [(0,)]


def test_retired_tasks_are_those_whose_latest_group_was_all_correct(store):
    run, (a, b, c, d, e) = setup_run(store, "retired", 5)
    rng = np.random.default_rng(2)
    ga = write(store, run, a, [traj(rng, True), traj(rng, False, 0.5)])
    ga2 = write(store, run, a, [traj(rng, True), traj(rng, True)])  # a: latest all correct -> retired
    write(store, run, b, [traj(rng, True), traj(rng, True)])
    write(store, run, b, [traj(rng, True), traj(rng, False, 0.5)])  # b: was retired, latest not -> not
    gc = write(store, run, c, [traj(rng, True, origin="replayed"), traj(rng, False, 0.5, origin="replayed"),
                               traj(rng, True), traj(rng, True)], kind="replay")  # c: own rollouts all correct
    write(store, run, d, [traj(rng, True), traj(rng, True)], kind="eval")  # d: eval groups never count
    write(store, run, e, [traj(rng, True), traj(rng, None, reward=None)])  # e: a failed reward is not correct
    got = rows(store, "SELECT task_id, group_id, n_rollouts FROM nexgrpo_retired_tasks ORDER BY 1")
    assert got == [(a, ga2.group_id, 2), (c, gc.group_id, 2)]
    assert ga.group_id < ga2.group_id
    assert replay.retired_count(store, run) == 2


def test_replay_candidates_buckets_and_weights(store):
    run, (a, b, c, d) = setup_run(store, "cands", 4)
    rng = np.random.default_rng(3)
    # a: 3 of 4 correct in its latest group, pools non-empty
    write(store, run, a, [traj(rng, True), traj(rng, False, 0.1)])
    write(store, run, a, [traj(rng, True), traj(rng, True), traj(rng, True), traj(rng, False, 0.5)])
    # b: positives only
    write(store, run, b, [traj(rng, True), traj(rng, True)])
    # c: a negative outside the gate only
    write(store, run, c, [traj(rng, True), traj(rng, False, 0.95)])
    # d: both pools, but the negative has no embedding; 1 of 2 in the latest group
    write(store, run, d, [traj(rng, True), traj(rng, False, 0.5, dim=None)])
    got = rows(store, "SELECT task_id, k, n, n_positive, n_negative, weight, retired FROM nexgrpo_replay_candidates")
    assert len(got) == 1
    task, k, n, n_pos, n_neg, weight, retired = got[0]
    assert (task, k, n, n_pos, n_neg, retired) == (a, 3, 4, 4, 1, False)
    # N(3; 4/2, 1) = exp(-1/2) / sqrt(2 pi) = 0.24197...
    assert weight == pytest.approx(math.exp(-0.5) / math.sqrt(2 * math.pi), rel=1e-12)
    assert weight == pytest.approx(difficulty_weight(3, 4, 1.0), rel=1e-12)
    store.set_settings(run, {"nexgrpo.difficulty_sd": 2.0})
    [(w2,)] = rows(store, "SELECT weight FROM nexgrpo_replay_candidates")
    assert w2 == pytest.approx(difficulty_weight(3, 4, 2.0), rel=1e-12)
    # d becomes a candidate once the gate admits it and it has an embedding; c once the gate widens
    store.set_settings(run, {"nexgrpo.conf_high": 0.99})
    assert [c_.task_id for c_ in replay.candidates(store, run)] == [a, c]


# ------------------------------------------------------------------ pure selection functions


def test_replay_quota_and_weights():
    assert replay_quota(16, 0.5, 100) == 8
    assert replay_quota(16, 0.5, 3) == 3  # min(⌊αB⌋, |E|)
    assert replay_quota(5, 0.5, 100) == 2
    assert replay_quota(4, 0.0, 100) == 0
    assert replay_quota(10, 0.3, 100) == 3  # ⌊0.3 · 10⌋ = 3 despite 0.3*10 = 2.9999999999999996
    # N(k; n/2, 1) for n = 8: peaked at 4, symmetric
    w = [difficulty_weight(k, 8) for k in range(9)]
    assert w[4] == pytest.approx(1 / math.sqrt(2 * math.pi)) and w[3] == pytest.approx(w[5])
    assert w[0] < w[1] < w[2] < w[3] < w[4]


def test_draw_tasks_is_weighted_without_replacement():
    rng = np.random.default_rng(0)
    ids, weights = [10, 11, 12, 13], [0.4, 0.3, 0.2, 0.1]
    firsts = np.zeros(4)
    for _ in range(20000):
        order = draw_tasks(ids, weights, 4, rng)
        assert sorted(order) == ids  # a permutation: no task twice
        firsts[ids.index(order[0])] += 1
    # The first draw is proportional to the weights (4 sd of a binomial with n = 20000: < 0.014).
    assert np.abs(firsts / 20000 - np.array(weights)).max() < 0.014
    assert draw_tasks(ids, [0, 0, 1, 0], 1, rng) == [12]
    assert sorted(draw_tasks(ids, [0, 0, 0, 0], 4, rng)) == ids  # all-zero weights: uniform
    assert draw_tasks(ids, weights, 0, rng) == [] and draw_tasks([], [], 3, rng) == []


def test_compose_batch_takes_at_most_the_replay_share():
    rows_ = [(1, "fresh"), (2, "replay"), (3, "replay"), (4, "fresh"), (5, "replay"), (6, "fresh")]
    assert compose_batch(rows_, 4, 2) == [1, 2, 3, 4]
    assert compose_batch(rows_, 4, 1) == [1, 2, 4, 6]
    assert compose_batch(rows_, 6, 2) == [1, 2, 3, 4, 6]  # fresh short: fewer, never more replay
    assert compose_batch([(2, "replay"), (3, "replay"), (5, "replay")], 4, 2) == [2, 3]
    assert compose_batch(rows_, 3, 0) == [1, 4, 6]


def test_replay_groups_are_found_behind_a_backlog_of_fresh_ones(store):
    """Collectors working ahead can write many fresh groups before a replay group; the batch still
    takes the replay group (a single LIMIT over both kinds once hid it: the learner never saw it)."""
    from reflexdb.trainer.batch import eligible_group_ids

    run, [task] = setup_run(store, "backlog", 1)
    rng = np.random.default_rng(0)
    fresh = [write(store, run, task, [traj(rng, True), traj(rng, False)]).group_id for _ in range(150)]
    [replay_group] = [write(store, run, task, [traj(rng, True), traj(rng, False)], kind="replay").group_id]
    assert replay_selection(store, run, 4, max_replay=2).group_ids == sorted(fresh[:3] + [replay_group])
    assert replay_selection(store, run, 4, max_replay=0).group_ids == fresh[:4]
    assert eligible_group_ids(store, run, 4).group_ids == fresh[:4]  # GRPO: plain FIFO
    # The staleness-window bound never hides an eligible group (all of these are version 0).
    assert replay_selection(store, run, 4, min_version=-1, max_replay=2).group_ids == sorted(fresh[:3] + [replay_group])
    assert eligible_group_ids(store, run, 4, min_version=1).group_ids == []


# ------------------------------------------------------------------ boundary failures (FAISS)


def _pool_task(store, run, task, rng, n_pos=3, n_neg=20, dim=16):
    trajs = [traj(rng, True, dim=dim) for _ in range(n_pos)]
    trajs += [traj(rng, False, float(rng.uniform(0.2, 0.9)), dim=dim) for _ in range(n_neg)]
    return write(store, run, task, trajs)


def test_faiss_choice_equals_brute_force_argmax_cosine(store, reflexdb_home):
    run, tasks = setup_run(store, "faiss", 4)
    rng = np.random.default_rng(4)
    for t in tasks:
        _pool_task(store, run, t, rng, n_pos=4, n_neg=40)
    index = EmbeddingIndex.open(store, run)
    index.catch_up()
    for t in tasks:
        pos, neg = replay.pool_ids(store, t)
        vec = {x.id: x.embedding for x in store.read_trajectories(pos + neg, payloads=False, turns=False,
                                                                  embeddings=True)}
        for anchor in pos:
            a = vec[anchor] / np.linalg.norm(vec[anchor])
            cos = np.array([vec[b] @ a / np.linalg.norm(vec[b]) for b in neg])
            ranked = boundary_failures(index, anchor, neg, 5)
            assert ranked[0].trajectory_id == neg[int(np.argmax(cos))]  # b* = argmax cos (Eq. 6)
            assert [r.trajectory_id for r in ranked] == [neg[i] for i in np.argsort(-cos)[:5]]
            assert [r.cosine for r in ranked] == pytest.approx(np.sort(cos)[::-1][:5], abs=1e-5)
            assert set(r.trajectory_id for r in ranked) <= set(neg)  # never another task's, never a positive


# ------------------------------------------------------------------ the planner and the refresh


def _planner(store, run, *, seed=0, **kw):
    index = EmbeddingIndex.open(store, run)
    args = dict(conf_low=0.2, conf_high=0.9, refresh=True, refresh_candidates=4, group_size=8,
                rng=np.random.default_rng(seed))
    args.update(kw)
    return ReplayPlanner(store, run, index, **args)


def test_refresh_discards_a_candidate_that_left_the_gate(store, reflexdb_home):
    run, (t1,) = setup_run(store, "refresh", 1)
    rng = np.random.default_rng(5)
    _pool_task(store, run, t1, rng, n_pos=1, n_neg=6)
    planner = _planner(store, run)
    planner.index.catch_up()
    [y_plus], neg = replay.pool_ids(store, t1)
    ranked = boundary_failures(planner.index, y_plus, neg, 4)
    # Under the "current weights" the most similar negative became over-confident (0.97) and the
    # second collapsed (0.01): both left [0.2, 0.9]; the third (0.5) is b*.
    refreshed = {ranked[0].trajectory_id: 0.97, ranked[1].trajectory_id: 0.01, ranked[2].trajectory_id: 0.5,
                 ranked[3].trajectory_id: 0.6}
    calls = []

    def score(trajs):
        calls.append([t.id for t in trajs])
        return [refreshed[t.id] for t in trajs]

    stats = planner.plan(lambda n: 1, score, step=3, version=2)
    assert calls == [[ranked[0].trajectory_id], [ranked[1].trajectory_id], [ranked[2].trajectory_id]]
    assert (stats.posted, stats.refreshed, stats.discarded) == (1, 3, 2)
    assert stats.metrics()["replay/refresh_discard_rate"] == pytest.approx(2 / 3)
    got = rows(store, "SELECT task_id, positive_id, negative_id, cosine, refreshed_confidence, discarded, "
                      "group_size, learner_step, learner_version, status FROM replay_requests")
    assert got == [(t1, y_plus, ranked[2].trajectory_id, pytest.approx(ranked[2].cosine), 0.5, 2, 8, 3, 2,
                    "pending")]
    [(stored,)] = rows(store, "SELECT confidence FROM trajectories WHERE id = :i", i=ranked[2].trajectory_id)
    assert rows(store, "SELECT negative_confidence FROM replay_requests") == [(stored,)]


def test_refresh_gives_a_task_up_when_no_candidate_stays_in_the_gate(store, reflexdb_home):
    run, (t1, t2) = setup_run(store, "refresh2", 2)
    rng = np.random.default_rng(6)
    for t in (t1, t2):
        _pool_task(store, run, t, rng, n_pos=1, n_neg=3)
    [y2], neg2 = replay.pool_ids(store, t2)
    planner = _planner(store, run, refresh_candidates=2)
    # Every negative of t1 is out of the gate now; t2's are in.
    score = lambda trajs: [0.05 if t.task_id == t1 else 0.5 for t in trajs]  # noqa: E731
    stats = planner.plan(lambda n: 2, score, step=1, version=0)
    assert stats.posted == 1 and stats.skipped_tasks == 1 and stats.discarded == 2  # t1: 2 candidates tried
    assert rows(store, "SELECT task_id, positive_id, discarded FROM replay_requests") == [(t2, y2, 0)]
    # Without the refresh the most similar negative is taken as it is.
    planner2 = _planner(store, run, refresh=False)
    replay.cancel_stale_requests(store, run, 10**6)
    stats = planner2.plan(lambda n: 2, lambda trajs: pytest.fail("no scoring without refresh"), step=2, version=0)
    assert stats.posted == 2 and stats.refreshed == 0
    assert rows(store, "SELECT count(*) FROM replay_requests WHERE refreshed_confidence IS NULL") == [(2,)]


def test_plan_tops_up_to_the_quota_and_skips_requested_tasks(store, reflexdb_home):
    run, tasks = setup_run(store, "topup", 5)
    rng = np.random.default_rng(7)
    for t in tasks:
        _pool_task(store, run, t, rng, n_pos=2, n_neg=3)
    planner = _planner(store, run, refresh=False)
    B = 8  # quota min(⌊0.5 · 8⌋, |E|) = 4
    quota = lambda n: replay_quota(B, 0.5, n)  # noqa: E731
    assert planner.plan(quota, None, step=1, version=0).posted == 4
    assert planner.plan(quota, None, step=2, version=0).posted == 0  # 4 already in flight
    replay.cancel_stale_requests(store, run, 1)  # planned under v0 < 1: cancelled
    stats = planner.plan(quota, None, step=3, version=1)
    assert stats.posted == 4
    pending = rows(store, "SELECT task_id FROM replay_requests WHERE status = 'pending'")
    assert len(set(pending)) == 4  # never two requests for one task at once
    # Stale requests are cancelled by the plan itself when asked.
    stats = planner.plan(quota, None, step=4, version=3, min_version=2)
    assert stats.cancelled == 4 and stats.posted == 4


def test_plan_stats_metrics_without_work_are_nan():
    m = PlanStats().metrics()
    assert math.isnan(m["replay/refresh_discard_rate"]) and m["replay/requests_posted"] == 0.0


# ------------------------------------------------------------------ soft retirement


def test_retired_tasks_are_drawn_at_the_configured_rate(store):
    """Epochs of claims: active tasks are collected once per epoch, a retired task with probability ε."""
    eps, n_active, n_retired, epochs = 0.2, 4, 8, 150
    run = store.create_run("retire")
    tasks = store.add_tasks(run, [TaskIn(f"q{i}", "1") for i in range(n_active + n_retired)])
    rng = np.random.default_rng(8)
    retired = set(tasks[n_active:])
    for t in retired:  # latest group all correct
        write(store, run, t, [traj(rng, True, dim=None), traj(rng, True, dim=None)])
    for t in tasks[:n_active]:
        write(store, run, t, [traj(rng, True, dim=None), traj(rng, False, 0.5, dim=None)])
    draws = work.RetirementDraws()
    collected = {t: 0 for t in tasks}
    draw_rng = np.random.default_rng(12345)
    # Each epoch, every active task is claimed once; claiming ahead of that passes retired tasks over.
    for _ in range(epochs * n_active):
        [task] = work.claim_tasks(store, run, "c1", 1, retired="nexgrpo_retired_tasks", retire_prob=eps, rng=draw_rng, draws=draws)
        collected[task.id] += 1
        with store.transaction() as conn:
            conn.execute("UPDATE tasks SET claimed_by = NULL, times_collected = times_collected + 1 WHERE id = %s",
                         (task.id,))
    kept, passed = draws.drawn, draws.passed
    rate = kept / (kept + passed)
    sd = math.sqrt(eps * (1 - eps) / (kept + passed))
    assert abs(rate - eps) < 4 * sd, (kept, passed)
    assert kept == sum(collected[t] for t in retired)
    # Per epoch, each retired task came up about once and was drawn about ε of the time.
    per_task = np.array([collected[t] for t in retired]) / ((kept + passed) / n_retired)
    assert abs(per_task.mean() - eps) < 4 * sd
    # Active tasks were never passed over.
    assert rows(store, "SELECT coalesce(sum(times_passed), 0) FROM tasks WHERE id = ANY(:a)",
                a=tasks[:n_active]) == [(0,)]


def test_without_soft_retirement_retired_tasks_are_drawn_in_turn(store):
    run = store.create_run("noretire")
    tasks = store.add_tasks(run, [TaskIn(f"q{i}", "1") for i in range(3)])
    rng = np.random.default_rng(9)
    for t in tasks:
        write(store, run, t, [traj(rng, True, dim=None)])
    got = work.claim_tasks(store, run, "c1", 3)
    assert sorted(t.id for t in got) == sorted(tasks) and not any(t.retired for t in got)
    work.release_claims(store, run, "c1")
    # With ε = 1 retirement changes nothing either.
    got = work.claim_tasks(store, run, "c1", 3, retired="nexgrpo_retired_tasks", retire_prob=1.0)
    assert sorted(t.id for t in got) == sorted(tasks) and all(t.retired for t in got)
    work.release_claims(store, run, "c1")
    # With ε = 0 a fully retired run yields nothing (every turn passed over), and says so by counting.
    draws = work.RetirementDraws()
    assert work.claim_tasks(store, run, "c1", 2, retired="nexgrpo_retired_tasks", retire_prob=0.0, draws=draws) == []
    assert (draws.drawn, draws.passed) == (0, 2 * work.MAX_CLAIM_ROUNDS)
    assert rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]


# ------------------------------------------------------------------ the replay-request protocol


def _request(store, run, task, pos, neg, **kw):
    r = dict(task_id=task, positive_id=pos, negative_id=neg, cosine=0.9, negative_confidence=0.5,
             refreshed_confidence=0.55, discarded=0, group_size=4)
    r.update(kw)
    [rid] = replay.post_requests(store, run, [ReplayRequestIn(**r)], learner_step=1, learner_version=0)
    return rid


def test_replay_requests_are_claimed_once_and_completed_with_their_group(store):
    run, (t1, t2) = setup_run(store, "protocol", 2)
    rng = np.random.default_rng(10)
    g = write(store, run, t1, [traj(rng, True), traj(rng, False, 0.5)])
    y, b = g.trajectory_ids
    r1 = _request(store, run, t1, y, b)
    r2 = _request(store, run, t2, y, b)
    [c1] = replay.claim_requests(store, run, "c1", 1)
    [c2] = replay.claim_requests(store, run, "c2", 5)  # SKIP LOCKED / status: never the same request
    assert (c1.id, c2.id) == (r1, r2) and c1.prompt == "What is 0+3?" and c1.ground_truth == "3"
    assert replay.claim_requests(store, run, "c3", 5) == []
    out = replay.outstanding(store, run)
    assert (out.requests, out.ready_groups, out.task_ids) == (2, 0, frozenset({t1, t2}))
    # The group and the request's completion are one transaction.
    [pos, neg] = store.read_trajectories([y, b])
    fresh = [traj(rng, False, 0.3), traj(rng, True)]
    group = replay_group(c1, pos, neg, fresh, policy_version=0, collector="c1")
    written = store.write_group(group, complete_claim="c1")
    assert rows(store, "SELECT status, group_id, claimed_by FROM replay_requests WHERE id = :i", i=r1) == [
        ("done", written.group_id, "c1")]
    out = replay.outstanding(store, run)
    assert (out.requests, out.ready_groups) == (1, 1)
    # A collector whose claim was taken over writes nothing.
    group2 = replay_group(c2, pos, neg, fresh, policy_version=0, collector="c1")
    before = rows(store, "SELECT count(*) FROM groups")
    with pytest.raises(ReplayRequestLost, match=f"replay request {r2} is no longer collector 'c1'"):
        store.write_group(group2, complete_claim="c1")
    assert rows(store, "SELECT count(*) FROM groups") == before
    # ... nor does anyone for a request that is already done.
    with pytest.raises(ReplayRequestLost):
        store.write_group(replay_group(c1, pos, neg, fresh, policy_version=0), complete_claim=None)
    # Shutdown gives claims back; an expired claim can be taken by another collector.
    replay.release_requests(store, run, "c2")
    assert rows(store, "SELECT status, claimed_by FROM replay_requests WHERE id = :i", i=r2) == [("pending", None)]
    [again] = replay.claim_requests(store, run, "c3", 1)
    with store.transaction() as conn:
        conn.execute("UPDATE replay_requests SET claimed_at = now() - interval '1 hour' WHERE id = %s", (again.id,))
    [taken] = replay.claim_requests(store, run, "c4", 1, claim_ttl_s=60)
    assert taken.id == r2


def test_replay_group_layout_and_lineage(store):
    run, (t1,) = setup_run(store, "layout", 1)
    rng = np.random.default_rng(11)
    g = write(store, run, t1, [traj(rng, True), traj(rng, False, 0.5)])
    y, b = g.trajectory_ids
    rid = _request(store, run, t1, y, b, group_size=5)
    [req] = replay.claim_requests(store, run, "c1", 1)
    pos, neg = store.read_trajectories([y, b])
    fresh = [traj(rng, i == 0, 0.4) for i in range(3)]
    w = store.write_group(replay_group(req, pos, neg, fresh, policy_version=3, collector="c1"),
                          complete_claim="c1")
    [group] = store.read_groups([w.group_id])
    assert (group.kind, group.workflow, group.size, group.policy_version) == ("replay", "nexgrpo", 5, 3)
    assert group.meta["replay_request_id"] == rid and group.meta["cosine"] == 0.9
    t = group.trajectories
    assert [x.origin for x in t] == ["replayed", "replayed", "base", "base", "base"]
    assert [x.parent_trajectory_id for x in t[:2]] == [y, b]
    for copy, orig in zip(t[:2], (pos, neg)):
        np.testing.assert_array_equal(copy.response_ids, orig.response_ids)
        np.testing.assert_array_equal(copy.logprobs, orig.logprobs)  # the behaviour log-probs, untouched
        np.testing.assert_array_equal(copy.token_policy_versions, orig.token_policy_versions)
        assert (copy.reward, copy.correct, copy.confidence, copy.policy_version) == (
            orig.reward, orig.correct, orig.confidence, orig.policy_version)
    assert [x.policy_version for x in t[2:]] == [3, 3, 3]
    # Replayed copies are not pool members (their originals are), and carry no second vector.
    assert rows(store, "SELECT count(*) FROM embeddings WHERE trajectory_id = ANY(:i)",
                i=[t[0].id, t[1].id]) == [(0,)]
    assert rows(store, "SELECT count(*) FROM nexgrpo_positive_pool WHERE trajectory_id = :i", i=t[0].id) == [(0,)]
    # The failures view lists b* once (the original), not its copy.
    assert rows(store, "SELECT count(*) FROM failures WHERE trajectory_id = :i", i=t[1].id) == [(0,)]


def test_admission_counts_replay_groups_and_claimed_requests(store):
    run, (t1,) = setup_run(store, "admission", 1)
    rng = np.random.default_rng(12)
    g = write(store, run, t1, [traj(rng, True), traj(rng, False, 0.5)])
    write(store, run, t1, [traj(rng, True)], kind="replay")
    write(store, run, t1, [traj(rng, True)], kind="eval")
    _request(store, run, t1, *g.trajectory_ids)
    replay.claim_requests(store, run, "other", 1)
    assert replay.claimed_by_others(store, run, "other") == 0 and replay.claimed_by_others(store, run, "me") == 1
    in_flight = replay.claimed_by_others(store, run, "me")  # what the replay workflow's in_flight says
    a = work.admission(store, run, "me", policy_version=0, eta=0, groups_per_step=2, publish_every=1,
                       in_flight=in_flight)
    assert a.next_group == 3  # fresh + replay written, plus another collector's claimed request
    assert not a.allowed and a.consume_version == 1


def test_task_latest_group_counts_own_rollouts(store):
    run, (a, b) = setup_run(store, "latest", 2)
    rng = np.random.default_rng(13)
    write(store, run, a, [traj(rng, True), traj(rng, True)])
    g2 = write(store, run, a, [traj(rng, True, origin="replayed"), traj(rng, False, 0.5, origin="replayed"),
                               traj(rng, True), traj(rng, False, 0.4), traj(rng, False, 0.4)], kind="replay",
               version=3)
    write(store, run, a, [traj(rng, True)], kind="eval")  # newest, but eval: not the latest group
    got = rows(store, "SELECT task_id, group_id, policy_version, n_rollouts, n_correct FROM task_latest_group")
    assert got == [(a, g2.group_id, 3, 3, 1)]  # b has no group: no row
