"""LTE's mixed-policy loss (LTE.md Eq. 6-8) on hand-computed numbers.

The batch used throughout: 3 rows of 2 tokens; rows 0 and 1 on-policy, row 2 a replaced
(hinted, correct) rollout. Non-binary advantages A = [0.5, −1.0, 1.5]; row 1's second token is
padding (mask 0).
"""

from __future__ import annotations

import math

import pytest
import torch

from reflexdb.trainer.losses.lte import lte_mixed_loss, lte_shaped_loss
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
    from .factories import setup_run

    run, tasks = setup_run(store, n_tasks=3)
    wrong = lambda a: (False, False, a, 0.0)  # noqa: E731
    cut = (False, True, None, 0.0)
    none_truncated = _group(store, run, tasks[0], [wrong("7"), wrong("8"), wrong("7"), (False, False, None, 0.0)])
    all_truncated = _group(store, run, tasks[1], [cut, cut, cut])
    some_truncated = _group(store, run, tasks[2], [cut, wrong("12"), (False, True, "99", 0.0)])  # 99: truncated, ignored
    _group(store, run, tasks[0], [wrong("7"), (True, False, "3", 1.0)])  # some-pass: not in the pool
    _group(store, run, tasks[0], [wrong("7"), (False, False, "x", None)])  # a reward missing: not judged
    _group(store, run, tasks[0], [wrong("7")], kind="eval")  # eval groups are never hinted
    with store._raw() as conn:
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
    from reflexdb.collector.tasks.hints import KINDS, hint_text, hinted_question
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
