"""LTE's mixed-policy loss (LTE.md Eq. 6-8) on hand-computed numbers.

The batch used throughout: 3 rows of 2 tokens; rows 0 and 1 on-policy, row 2 a replaced
(hinted, correct) rollout. Non-binary advantages A = [0.5, −1.0, 1.5]; row 1's second token is
padding (mask 0).
"""

from __future__ import annotations

import math

import pytest
import torch
from reflexdb.methods.lte.loss import lte_mixed_loss, lte_shaped_loss
from reflexdb.trainer.losses.registry import get_loss_spec

LN = math.log
OLD = torch.log(torch.tensor([[0.5, 0.4], [0.3, 0.2], [0.9, 0.9]], dtype=torch.float64))
# row 0: token 0 ratio 1.1, token 1 ratio 1; row 1: ratio 1; row 2 (hinted): π_θ = 0.5, 0.25
NEW = torch.tensor([[LN(0.55), LN(0.4)], [LN(0.3), LN(0.2)], [LN(0.5), LN(0.25)]], dtype=torch.float64)
ADV = torch.tensor([0.5, -1.0, 1.5], dtype=torch.float64)
MASK = torch.tensor([[1, 1], [1, 0], [1, 1]], dtype=torch.bool)
REPLACED = torch.tensor([False, False, True])
HINTED = torch.log(torch.tensor([[0.9, 0.9], [0.9, 0.9], [0.5, 0.5]], dtype=torch.float64))


def test_mixed_loss_denominator_one():
    # on-policy (Eq. 8, 2nd sum): row 0: min(1.1*0.5, clip(1.1, 0.8, 1.2)*0.5) = 0.55, then 1*0.5 = 0.5;
    #   row 1: 1*(−1.0) = −1.0 (its 2nd token masked). Σ = 0.05, Z = 3 tokens -> 0.0166667
    # off-policy (Eq. 6 with π_old := 1, Eq. 7): r' = 0.5, 0.25; f = 0.5/0.6 = 0.833333, 0.25/0.35 = 0.714286;
    #   × A' = 1.5 -> 1.25 + 1.0714286 = 2.3214286; Z' = 2 -> 1.1607143
    # J = 0.0166667 + 1.1607143 = 1.1773810; loss = −J
    out = lte_mixed_loss(NEW, OLD, ADV, MASK, REPLACED)
    assert out.loss.item() == pytest.approx(-1.1773810, abs=1e-6)
    assert out.on_policy_loss.item() == pytest.approx(-0.0166667, abs=1e-6)
    assert out.off_policy_loss.item() == pytest.approx(-1.1607143, abs=1e-6)
    assert (out.on_policy_tokens.item(), out.off_policy_tokens.item()) == (3, 2)


def test_mixed_loss_denominator_behaviour():
    # r' = π_θ / π_hinted = 0.5/0.5 = 1, 0.25/0.5 = 0.5; f = 1/1.1 = 0.9090909, 0.5/0.6 = 0.8333333;
    # × 1.5 -> 1.3636364 + 1.25 = 2.6136364; / Z' = 2 -> 1.3068182; J = 0.0166667 + 1.3068182 = 1.3234848
    out = lte_mixed_loss(NEW, OLD, ADV, MASK, REPLACED, hinted_logprobs=HINTED, denominator="behaviour")
    assert out.loss.item() == pytest.approx(-1.3234848, abs=1e-6)
    with pytest.raises(ValueError, match="needs the hinted behaviour log-probs"):
        lte_shaped_loss(NEW, None, ADV, MASK, denominator="behaviour")


def test_gamma_changes_the_shaping():
    # γ = 1: f = 0.5/1.5 = 0.3333333, 0.25/1.25 = 0.2; × 1.5 -> 0.5 + 0.3 = 0.8; / 2 -> 0.4
    out = lte_shaped_loss(NEW, None, ADV, MASK & REPLACED[:, None], gamma=1.0)
    assert out.loss.item() == pytest.approx(-0.4, abs=1e-9)


def test_all_replaced_and_none_replaced():
    # G' = G: no on-policy row, the first sum alone (Z = 0 gives 0, not a division by zero).
    # rows 0, 1, 2 as hinted with π_old := 1: row 0: 0.55/0.65 = 0.8461538, 0.4/0.5 = 0.8; × 0.5 -> 0.8230769
    #   row 1: 0.3/0.4 = 0.75; × −1.0 -> −0.75; row 2: 2.3214286 (above). Σ = 2.3945055; Z' = 5 -> 0.4789011
    out = lte_mixed_loss(NEW, OLD, ADV, MASK, torch.ones(3, dtype=torch.bool))
    assert out.on_policy_loss.item() == 0.0
    assert out.loss.item() == pytest.approx(-0.4789011, abs=1e-6)
    # G' = 0: GRPO's clipped surrogate with token-mean (Z = 5): row 2 ratio 0.5/0.9 = 0.5556:
    #   min(0.5556*1.5, clip(0.5556, 0.8, 1.2)*1.5) = min(0.8333333, 1.2) = 0.8333333; 0.25/0.9 = 0.2778 -> 0.4166667.
    #   Σ = 0.05 + 1.25 = 1.3; / 5 = 0.26
    out = lte_mixed_loss(NEW, OLD, ADV, MASK, torch.zeros(3, dtype=torch.bool))
    assert out.off_policy_loss.item() == 0.0
    assert out.loss.item() == pytest.approx(-0.26, abs=1e-6)


def test_empty_mask_and_rows_without_reward():
    # an empty mask: no token carries loss -> 0 with a graph
    empty = torch.zeros_like(MASK)
    new = NEW.clone().requires_grad_(True)
    out = lte_mixed_loss(new, OLD, ADV, empty, REPLACED)
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert torch.count_nonzero(new.grad) == 0
    # a row whose reward is NULL reaches the loss with its mask cleared (trainer/batch.py): the same
    # as leaving the row out. Here row 1 (advantage −1.0): on-policy Σ = 1.05 over Z = 2 -> 0.525
    no_row1 = MASK.clone()
    no_row1[1] = False
    out = lte_mixed_loss(NEW, OLD, ADV, no_row1, REPLACED)
    assert out.on_policy_loss.item() == pytest.approx(-0.525, abs=1e-6)


def test_micro_batches_reproduce_the_full_batch():
    """Two terms, each weighted per micro-batch by its own normaliser's share, give Eq. 8's loss
    and gradient for every split (micro-batches of 1 and 2 rows)."""
    spec = get_loss_spec("lte_shaped")
    params = spec.parse({})
    full_new = NEW.clone().requires_grad_(True)
    lte_mixed_loss(full_new, OLD, ADV, MASK, REPLACED).loss.backward()
    on_mask, off_mask = MASK & ~REPLACED[:, None], MASK & REPLACED[:, None]
    n_on, n_off = on_mask.sum(), off_mask.sum()
    grpo = get_loss_spec("grpo")
    grpo_params = grpo.parse({"agg": "token-mean"})
    for size in (1, 2):
        new = NEW.clone().requires_grad_(True)
        total = 0.0
        for s in range(0, 3, size):
            sl = slice(s, s + size)
            on = grpo.call(new[sl], OLD[sl], ADV[sl], on_mask[sl], grpo_params).loss
            off = spec.call(new[sl], None, ADV[sl], off_mask[sl], params).loss
            w_on = grpo.normaliser(on_mask[sl], grpo_params) / n_on
            w_off = spec.normaliser(off_mask[sl], params) / n_off
            part = on * w_on + off * w_off
            part.backward()
            total += part.item()
        assert total == pytest.approx(lte_mixed_loss(NEW, OLD, ADV, MASK, REPLACED).loss.item(), abs=1e-9)
        assert torch.allclose(new.grad, full_new.grad, atol=1e-9)


# ---------------------------------------------------------------- the hint pool view


def _group(store, run, task, outcomes, *, kind="fresh"):
    """A group from ``(correct, truncated, answer, reward)`` per trajectory."""
    import numpy as np

    from reflexdb import GroupIn, TrajectoryIn

    trajs = [TrajectoryIn(response_ids=np.arange(4), logprobs=np.full(4, -0.5, np.float32), prompt_ids=np.arange(3),
                          correct=c, reward=r, extracted_answer=a, finish_reason="length" if tr else "stop")
             for c, tr, a, r in outcomes]
    return store.write_group(GroupIn(run_id=run, task_id=task, policy_version=2, trajectories=trajs, kind=kind)).group_id


def test_hint_pool_view_on_hand_made_groups(store):
    from tests.factories import setup_run

    run, tasks = setup_run(store, n_tasks=3)
    wrong = lambda a: (False, False, a, 0.0)  # noqa: E731
    cut = (False, True, None, 0.0)
    none_truncated = _group(store, run, tasks[0], [wrong("7"), wrong("8"), wrong("7"), (False, False, None, 0.0)])
    all_truncated = _group(store, run, tasks[1], [cut, cut, cut])
    some_truncated = _group(store, run, tasks[2], [cut, wrong("12"), (False, True, "99", 0.0)])  # 99: truncated, ignored
    _group(store, run, tasks[0], [wrong("7"), (True, False, "3", 1.0)])  # some-pass: not in the pool
    _group(store, run, tasks[0], [wrong("7"), (False, False, "x", None)])  # a reward missing: not judged
    _group(store, run, tasks[0], [wrong("7")], kind="eval")  # eval groups are never hinted
    with store.transaction() as conn:
        rows = conn.execute("SELECT group_id, hint_kind, wrong_answers, answer_counts, n_truncated, size "
                            "FROM lte_hint_pool WHERE run_id = %s ORDER BY group_id", (run,)).fetchall()
        assert rows == [
            (none_truncated, "wrong_answers", ["7", "8"], {"7": 2, "8": 1}, 0, 4),
            (all_truncated, "concise", [], {}, 3, 3),
            (some_truncated, "concise_wrong_answers", ["12"], {"12": 1}, 2, 3),
        ]
        # a hint row ends the wait: the group leaves the pool
        conn.execute("INSERT INTO hints (group_id, task_id, kind, wrong_answers, hinted_prompt) "
                     "VALUES (%s, %s, 'wrong_answers', '{7,8}', 'q')", (none_truncated, tasks[0]))
        left = conn.execute("SELECT group_id FROM lte_hint_pool WHERE run_id = %s ORDER BY 1", (run,)).fetchall()
    assert left == [(all_truncated,), (some_truncated,)]


def test_hint_templates():
    from reflexdb.methods.lte.hints import KINDS, hint_text, hinted_question
    from reflexdb.collector.tasks.templates import get_template

    wrong = hint_text("wrong_answers", ["7", "8"])
    assert "These answers are known to be wrong: 7, 8." in wrong and "concisely" not in wrong
    concise = hint_text("concise")
    assert "Think concisely" in concise and "known to be wrong" not in concise
    both = hint_text("concise_wrong_answers", ["12"])
    assert "Think concisely" in both and "known to be wrong: 12." in both
    for kind in KINDS:  # every hint asks the model not to mention it
        assert "Do not mention this hint" in hint_text(kind, ["1"])
    assert "Think concisely" in hint_text("wrong_answers", [])  # nothing to list: at least say something useful
    with pytest.raises(ValueError, match="unknown hint kind 'rude'"):
        hint_text("rude")
    # the prompt template wraps the hinted question like any question (answer format unchanged)
    [msg] = get_template("boxed").messages(hinted_question("What is 2 + 3?", "wrong_answers", ["6"]))
    assert msg["content"].startswith("What is 2 + 3?\n\nHint: ") and msg["content"].endswith("\\boxed{}.")


# ---------------------------------------------------------------- hint stages through the store


def _stage_setup(store, *, n_correct=0, size=4, version=0):
    """A run with a none-pass group (or ``n_correct`` right) of ``size`` on task 0 and a some-pass one on task 1."""
    import numpy as np

    from tests.factories import make_group, setup_run

    rng = np.random.default_rng(0)
    run, tasks = setup_run(store, n_tasks=2)
    original = store.write_group(make_group(rng, run, tasks[0], size=size, n_correct=n_correct, version=version,
                                            dim=None))
    other = store.write_group(make_group(rng, run, tasks[1], size=size, n_correct=1, version=version, dim=None))
    return run, tasks, original, other


def _extra(n, rng=None, **kw):
    """``n`` correct extra rollouts (hinted prompt ids: 20 tokens, the plain ones are 12)."""
    import numpy as np

    from tests.factories import make_trajectory

    rng = rng or np.random.default_rng(1)
    return [make_trajectory(rng, P=20, T=10, dim=None, **kw) for _ in range(n)]


def _lte_group(store, stage_row, n_correct, *, mode="hint", seed=0):
    import numpy as np
    from reflexdb.methods.lte.workflow import lte_group

    from reflexdb.methods.lte import stages as lte
    from reflexdb.methods.lte.stages import HintIn, LteStageIn

    [original] = store.read_groups([stage_row.group_id])
    hint = HintIn(lte.reserve_hint_id(store), stage_row.hint_kind, stage_row.wrong_answers, "q + hint") \
        if mode == "hint" else None
    stage = LteStageIn(stage_row.group_id, stage_row.task_id, mode, hint, 4, n_correct)
    return original, lte_group(original, _extra(n_correct), stage, rng=np.random.default_rng(seed), collector="a")


def test_an_lte_group_replaces_failures_with_lineage_in_one_transaction(store):
    from reflexdb.methods.lte import stages as lte
    from tests.processes import rows

    run, tasks, original, other = _stage_setup(store)
    [s] = lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)
    assert (s.group_id, s.hint_kind, s.wrong_answers, s.size) == (original.group_id, "wrong_answers", ["7"], 4)
    orig, group = _lte_group(store, s, 2, seed=0)
    w = store.write_group(group, complete_claim="a")
    [g] = store.read_groups([w.group_id])
    assert (g.kind, g.workflow, g.policy_version, g.size) == ("hinted", "lte", orig.policy_version, 4)
    replaced = group.meta["replaced"]
    assert len(replaced) == 2
    hint_of = dict(rows(store, "SELECT trajectory_id, hint_id FROM trajectory_hints"))  # LTE's table
    for pos, (t, o) in enumerate(zip(g.trajectories, orig.trajectories)):
        assert t.parent_trajectory_id == o.id  # a copy of the original, or the rollout that replaced it
        assert list(t.prompt_ids) == list(o.prompt_ids)  # training prompt: always the plain one
        if pos in replaced:
            assert (t.origin, t.correct, len(t.response_ids)) == ("hinted", True, 10)
            assert hint_of.get(t.id) is not None and t.turns[0].text == o.turns[0].text
        else:
            assert (t.origin, t.correct, hint_of.get(t.id)) == ("replayed", False, None)
    [(status, hint_id, lte_gid, n_sampled, n_correct, mode)] = rows(
        store, "SELECT status, hint_id, lte_group_id, n_sampled, n_correct, mode FROM lte_stages")
    assert (status, lte_gid, n_sampled, n_correct, mode) == ("done", w.group_id, 4, 2, "hint")
    assert rows(store, "SELECT id, group_id, kind, wrong_answers, hinted_prompt FROM hints") == [
        (hint_id, original.group_id, "wrong_answers", ["7"], "q + hint")]
    # the task's claim and collection count are not touched by a hint stage
    assert rows(store, "SELECT times_collected FROM tasks WHERE id = :t", t=tasks[0]) == [(0,)]
    # the pool is empty now, and the learner takes the LTE group and the some-pass one, never the original
    assert rows(store, "SELECT count(*) FROM lte_hint_pool") == [(0,)]
    ids, _, released = lte.eligible_group_ids(store, run, 10, min_version=0, timeout_s=300)
    assert (ids, released) == (sorted([other.group_id, w.group_id]), 0)


def test_a_none_pass_group_waits_for_its_stage_then_is_released_after_the_timeout(store):
    from reflexdb.methods.lte import stages as lte
    from reflexdb.errors import LteStageLost
    from tests.processes import rows

    run, tasks, original, other = _stage_setup(store)
    ids, _, _ = lte.eligible_group_ids(store, run, 10, min_version=0, timeout_s=300)
    assert ids == [other.group_id]  # waiting for its hint stage
    [s] = lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)
    ids, _, released = lte.eligible_group_ids(store, run, 10, min_version=0, timeout_s=0)  # timed out
    assert (ids, released) == ([original.group_id, other.group_id], 1)
    assert rows(store, "SELECT status FROM lte_stages") == [("released",)]
    # the collector that held it finishes too late: nothing of its group is written
    _, group = _lte_group(store, s, 1)
    with pytest.raises(LteStageLost, match="no longer collector 'a'"):
        store.write_group(group, complete_claim="a")
    assert rows(store, "SELECT count(*) FROM groups WHERE kind = 'hinted'") == [(0,)]
    assert rows(store, "SELECT count(*) FROM hints") == [(0,)]
    # released: out of the pool, never claimed again, still trained (a second choice finds it again)
    assert lte.claim_stages(store, run, "b", 5, min_version=0, timeout_s=300) == []
    assert lte.eligible_group_ids(store, run, 10, min_version=0, timeout_s=0)[0] == [original.group_id,
                                                                                    other.group_id]


def test_a_timed_out_group_is_not_claimed_and_stale_groups_are_not_opened(store):
    from reflexdb.methods.lte import stages as lte

    run, tasks, original, other = _stage_setup(store)
    assert lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=0) == []
    assert lte.claim_stages(store, run, "a", 5, min_version=1, timeout_s=300) == []  # policy 0 < 1: stale
    assert [s.group_id for s in lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)] == \
        [original.group_id]


@pytest.mark.parametrize("unsolved, trained", [("train", True), ("skip", False)])
def test_an_unsolved_stage_writes_its_hint_and_the_original_trains_as_it_is(store, unsolved, trained):
    from reflexdb.methods.lte import stages as lte
    from reflexdb.methods.lte.stages import HintIn, LteStageIn
    from tests.processes import rows

    run, tasks, original, other = _stage_setup(store)
    [s] = lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)
    hint = HintIn(lte.reserve_hint_id(store), s.hint_kind, s.wrong_answers, "q + hint")
    lte.finish_unsolved(store, LteStageIn(s.group_id, s.task_id, "hint", hint, 4, 0), "a")
    assert rows(store, "SELECT status, n_correct, lte_group_id FROM lte_stages") == [("done", 0, None)]
    assert rows(store, "SELECT count(*) FROM hints") == [(1,)]
    ids, _, _ = lte.eligible_group_ids(store, run, 10, min_version=0, timeout_s=300,
                                       train_unsolved=unsolved == "train")
    assert ids == ([original.group_id] if trained else []) + [other.group_id]


def test_two_collectors_racing_for_one_stage_one_wins_and_nothing_is_written_twice(store):
    import threading

    from reflexdb.methods.lte import stages as lte
    from reflexdb.errors import LteStageLost
    from tests.processes import rows

    run, tasks, original, other = _stage_setup(store)
    barrier, got = threading.Barrier(2), {}

    def claim(name):
        barrier.wait()
        got[name] = lte.claim_stages(store, run, name, 5, min_version=0, timeout_s=300)

    threads = [threading.Thread(target=claim, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(v) for v in got.values()) == [0, 1]
    winner = "a" if got["a"] else "b"
    [s] = got[winner]
    _, mine = _lte_group(store, s, 2)
    _, theirs = _lte_group(store, s, 1)
    store.write_group(mine, complete_claim=winner)
    with pytest.raises(LteStageLost):  # the loser, had it sampled anyway, writes nothing
        store.write_group(theirs, complete_claim="b" if winner == "a" else "a")
    assert rows(store, "SELECT count(*) FROM groups WHERE kind = 'hinted'") == [(1,)]
    assert rows(store, "SELECT count(*) FROM hints") == [(1,)]


def test_a_dead_collectors_stage_is_claimed_again_after_its_ttl(store):
    import time

    from reflexdb.methods.lte import stages as lte
    from reflexdb.errors import LteStageLost

    run, tasks, original, other = _stage_setup(store)
    [s] = lte.claim_stages(store, run, "dead", 5, min_version=0, timeout_s=300, claim_ttl_s=0.5)
    assert lte.claim_stages(store, run, "b", 5, min_version=0, timeout_s=300, claim_ttl_s=0.5) == []
    time.sleep(0.6)  # "dead" never releases (killed): its claim expires
    [again] = lte.claim_stages(store, run, "b", 5, min_version=0, timeout_s=300, claim_ttl_s=0.5)
    assert again.group_id == s.group_id
    _, late = _lte_group(store, s, 1)
    with pytest.raises(LteStageLost):
        store.write_group(late, complete_claim="dead")
    _, group = _lte_group(store, again, 1)
    store.write_group(group, complete_claim="b")


def test_grpo_extra_mode_writes_no_hint_and_on_policy_replacements(store):
    from reflexdb.methods.lte import stages as lte
    from tests.processes import rows

    run, tasks, original, other = _stage_setup(store)
    [s] = lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)
    _, group = _lte_group(store, s, 3, mode="extra")
    w = store.write_group(group, complete_claim="a")
    [g] = store.read_groups([w.group_id])
    assert sorted(t.origin for t in g.trajectories) == ["base", "base", "base", "replayed"]
    assert rows(store, "SELECT count(*) FROM trajectory_hints") == [(0,)]
    assert rows(store, "SELECT mode, hint_id FROM lte_stages") == [("extra", None)]
    assert rows(store, "SELECT count(*) FROM hints") == [(0,)]
    assert rows(store, "SELECT count(*) FROM lte_hint_pool") == [(0,)]


def test_release_gives_claims_back(store):
    from reflexdb.methods.lte import stages as lte

    run, tasks, original, other = _stage_setup(store)
    assert len(lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)) == 1
    lte.release_stages(store, run, "a")
    assert len(lte.claim_stages(store, run, "b", 5, min_version=0, timeout_s=300)) == 1


# ---------------------------------------------------------------- end to end on the tiny model


def _lte_config(**lte):
    from reflexdb.config import parse_config

    return parse_config({
        "run": "lte", "model": "tiny", "algorithm": "lte", "max_staleness": 100,
        "tasks": {"train_size": 6, "eval_size": 0},
        "collector": {"group_size": 4, "tasks_per_batch": 2, "sampling": {"max_new_tokens": 6},
                      "progress_every_s": 1, "poll_interval_s": 0.2},
        "learner": {"groups_per_step": 2, "micro_batch_size": 3, "lr": 1e-3, "poll_interval_s": 0.2},
        "lte": lte,
    })


def _rig(monkeypatch, prompts=None):
    """Judge extra rollouts by their prompt: under a hint, episodes 0, 2, ... are right; else none."""
    from reflexdb.collector.runner import Collector

    real = Collector.rollout

    def rigged(self, tasks, n):  # the tiny model never answers right
        out = real(self, tasks, n)
        for task, episodes in zip(tasks, out):
            if prompts is not None:
                prompts.append(task.prompt)
            for j, t in enumerate(episodes):
                t.correct = "Hint:" in task.prompt and j % 2 == 0
                t.reward = float(t.correct)
        return out

    monkeypatch.setattr(Collector, "rollout", rigged)


def test_hint_stages_run_while_admission_holds_new_groups_back(store, tmp_path, monkeypatch, model_cache):
    """max_staleness 0 and 4 groups already written: the collector may not start a new group, but
    the hint stages of the none-pass ones replace groups already admitted, so they run (else the
    learner, waiting for them, and the collector, waiting for a policy, would wait on each other
    until the hint timeout)."""
    import numpy as np
    from reflexdb.collector.runner import Collector
    from reflexdb.collector.sources import build_tasks

    from tests.factories import make_group
    from tests.processes import rows

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    cfg = _lte_config()
    cfg = cfg.model_copy(update={"max_staleness": 0})
    _rig(monkeypatch)
    run = store.create_run(cfg.run, algorithm="lte")
    tasks = store.add_tasks(run, build_tasks(cfg.tasks)[0])
    rng = np.random.default_rng(0)
    for task in tasks[:4]:
        store.write_group(make_group(rng, run, task, n_correct=0, dim=None, P=6, T=5,
                                     response_ids=rng.integers(0, 1000, 5), prompt_ids=rng.integers(0, 1000, 6)))
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    stats = collector.run(max_groups=4, max_seconds=120)
    assert stats.groups == 4
    assert rows(store, "SELECT kind, count(*) FROM groups GROUP BY 1 ORDER BY 1") == [("fresh", 4), ("hinted", 4)]


def test_lte_workflow_and_learner_end_to_end_on_the_tiny_model(store, tmp_path, monkeypatch, model_cache):
    """A collector writes none-pass groups, then their hint stages (real sampling under the hinted
    prompt; the judge is rigged so that half of the hinted rollouts are right); the learner trains
    the LTE groups instead of the originals, with the hinted rows' behaviour log-probs as π_old."""
    from reflexdb.collector.runner import Collector
    from reflexdb.trainer.batch import pack
    from reflexdb.trainer.learner import Learner

    from tests.processes import rows

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    cfg = _lte_config()
    prompts = []
    _rig(monkeypatch, prompts)
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    stats = collector.run(max_groups=4)  # 2 fresh none-pass groups, then their 2 LTE groups
    assert stats.groups == 4
    assert sum("Hint:" in p for p in prompts) == 2  # one hinted rollout call per stage
    lte_groups = rows(store, "SELECT id, meta->>'original_group_id' FROM groups WHERE kind = 'hinted' ORDER BY id")
    originals = [int(o) for _, o in lte_groups]
    assert len(lte_groups) == 2
    assert rows(store, "SELECT status, n_sampled, n_correct FROM lte_stages ORDER BY group_id") == [("done", 4, 2)] * 2
    for gid, orig in zip([g for g, _ in lte_groups], originals):
        [g], [o] = store.read_groups([gid]), store.read_groups([orig])
        hinted = [t for t in g.trajectories if t.origin == "hinted"]
        linked = {r[0] for r in rows(store, "SELECT trajectory_id FROM trajectory_hints")}
        assert len(hinted) == 2 and all(t.id in linked and t.correct for t in hinted)
        assert {t.parent_trajectory_id for t in g.trajectories} == {t.id for t in o.trajectories}
        assert all(list(t.prompt_ids) == list(o.trajectories[0].prompt_ids) for t in g.trajectories)
        assert g.policy_version == o.policy_version

    learner = Learner(cfg, store, echo=lambda m: None)
    learner.setup()
    chosen = learner.wait_for_groups(None)
    assert chosen.group_ids == [g for g, _ in lte_groups]  # never the originals
    batch = pack(store.read_groups(chosen.group_ids, turns=False), learner.engine.pad_id, origins=store.origins())
    old, fresh = learner.update.old_logprobs(batch)
    assert torch.equal(old[batch.of_origin("hinted")], batch.behaviour_logprobs[batch.of_origin("hinted")])
    assert not fresh.any()  # hinted rows and the kept originals (replayed copies): their behaviour log-probs
    learner.run(max_steps=1)
    consumed = {t for (t,) in rows(store, "SELECT DISTINCT group_id FROM consumption")}
    assert consumed == {g for g, _ in lte_groups}
    [(metrics,)] = rows(store, "SELECT metrics FROM learner_steps")
    assert metrics["lte/lte_groups"] == 2 and metrics["lte/none_pass_before"] == 2
    assert metrics["lte/some_pass_after"] == 2 and metrics["lte/replaced_per_group"] == 2
    assert metrics["lte/hinted_success_rate"] == 0.5 and metrics["reward/pass_at_1"] == 0.0
    assert sum(v for k, v in metrics.items() if k.startswith("lte/hint_kind/")) == 2
    assert math.isfinite(metrics["loss/hinted/policy_loss"]) and metrics["loss/hinted/num_tokens"] > 0


def test_a_hint_stage_that_ends_late_is_not_passed_over(store):
    """Issue 37: a none-pass group held for its hint stage while a step rightly took a newer group;
    the stage (its claimer killed, its claim timed out) ended only after the group's staleness
    window: nothing found, the group free to train as it is (lte.unsolved: train). Before revision
    0024 untrained_groups counted the step taken during the hold and said 'passed_over'; now it
    judges the group by the steps after the stage ended: none could take it, 'held_past_staleness'.
    A step that chose after the stage ended and took a newer group is still 'passed_over'."""
    from sqlalchemy import text

    from tests.processes import rows

    run, tasks, original, other = _stage_setup(store)
    assert other.group_id > original.group_id
    store.set_settings(run, {"lte.mode": "hint", "lte.unsolved": "train", "learner.max_staleness": 1})
    [(tid,)] = rows(store, "SELECT id FROM trajectories WHERE group_id = :g LIMIT 1", g=other.group_id)

    def snapshot():
        return rows(store, "SELECT pg_current_snapshot()::text")[0][0]

    def reasons():
        return rows(store, "SELECT group_id, reason FROM untrained_groups WHERE run_id = :r ORDER BY 1", r=run)

    store.record_step(run, 1, 0, [tid], loss=0.0, metrics={}, batch_snapshot=snapshot())  # during the hold
    assert reasons() == [(original.group_id, "hint_stage")]
    with store.engine.begin() as conn:  # the stage ends: done, nothing correct, no LTE group
        conn.execute(text("INSERT INTO lte_stages (group_id, run_id, status, mode, completed_at) "
                          "VALUES (:g, :r, 'done', 'hint', clock_timestamp())"), {"g": original.group_id, "r": run})
    store.publish_policy(run, 0, "file:///v0", step=0)
    store.publish_policy(run, 2, "file:///v2", step=1)  # learner at v2: v0's groups are past max_staleness 1
    assert reasons() == [(original.group_id, "held_past_staleness")]  # was 'passed_over'
    # within its window, a step that chose after the stage ended (the step before it recorded
    # after) and took a newer group is a defect as before
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM policy_versions WHERE run_id = :r AND version = 2"), {"r": run})
    store.record_step(run, 2, 0, [tid], loss=0.0, metrics={}, batch_snapshot=snapshot())
    assert reasons() == [(original.group_id, "waiting")]  # step 2 chose before the stage's end was known
    store.record_step(run, 3, 0, [tid], loss=0.0, metrics={}, batch_snapshot=snapshot())
    assert reasons() == [(original.group_id, "passed_over")]


def test_untrained_groups_names_lte_reasons_never_passed_over(store):
    """The learner skips a none-pass group by design while it waits for its stage, and never
    trains a replaced one: untrained_groups says so instead of calling them passed over."""
    from reflexdb.methods.lte import stages as lte
    from tests.processes import rows

    run, tasks, original, other = _stage_setup(store)
    store.set_settings(run, {"lte.mode": "hint", "lte.unsolved": "train"})
    ids, snapshot, _ = lte.eligible_group_ids(store, run, 10, min_version=0, timeout_s=300)
    assert ids == [other.group_id]
    [(tid,)] = rows(store, "SELECT id FROM trajectories WHERE group_id = :g LIMIT 1", g=other.group_id)
    store.record_step(run, 1, 0, [tid], loss=0.0, metrics={}, batch_snapshot=snapshot)

    def reasons():
        return rows(store, "SELECT group_id, reason FROM untrained_groups WHERE run_id = :r ORDER BY 1", r=run)

    assert reasons() == [(original.group_id, "hint_stage")]
    [s] = lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)
    _, group = _lte_group(store, s, 2)
    w = store.write_group(group, complete_claim="a")
    assert reasons() == [(original.group_id, "replaced"), (w.group_id, "waiting")]
