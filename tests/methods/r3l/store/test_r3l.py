"""R3L (METHODS.md §1; R3L.md): reflection parsing, the equations by hand (Eq. 10, 11, 12), the
views on hand-made data, the workflow on the tiny model, the learner with its SFT pairs, and a
collector killed mid-retry."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from reflexdb.trainer.advantages import (
    apply_advantage_transforms,
    group_advantages,
    make_transform,
)
from reflexdb.trainer.losses import get_loss_spec
from reflexdb.methods.r3l.loss import pivotal_mask

from reflexdb import GroupIn, Sibling, TrajectoryIn, TurnIn
from reflexdb.methods.r3l import reflections as r3l
from reflexdb.config import ConfigError, parse_config
from reflexdb.methods.r3l.reflections import ParsedReflection, ReflectionIn, parse_reflection
from tests.processes import rows

D = torch.float64
NULL = float("nan")

VALID = {"trajectory_summary": "Added the numbers, got 9.", "root_cause_analysis": "Misread 4 as 5.",
         "trajectory_outcome": "failure", "improvement_suggestion": "Read each digit twice.", "retry_from_step": 1}


# ---------------------------------------------------------------- reflection parsing


def test_a_valid_reflection_parses():
    p = parse_reflection(json.dumps(VALID), n_turns=3)
    assert (p.valid, p.outcome, p.pivot, p.root_cause, p.error, p.retry) == (
        True, "failure", 1, "Misread 4 as 5.", None, True)
    assert p.fields == VALID


@pytest.mark.parametrize("text, n_turns, valid, error", [
    # text around the JSON: from the first '{' to the last '}'
    ("Here is my reflection:\n" + json.dumps(VALID) + "\nI hope this helps.", 2, True, None),
    # the model wrote the pivot as a string, or as 1.0: an integer all the same
    (json.dumps({**VALID, "retry_from_step": "1"}), 2, True, None),
    (json.dumps({**VALID, "retry_from_step": 1.0}), 2, True, None),
    ({k: v for k, v in VALID.items() if k != "improvement_suggestion"}, 3, False, "missing key(s): improvement_suggestion"),
    ({k: v for k, v in VALID.items() if k not in ("retry_from_step", "trajectory_summary")}, 3, False,
     "missing key(s): trajectory_summary, retry_from_step"),
    ({**VALID, "retry_from_step": 3}, 3, False, "retry_from_step 3 is outside 0..2 (the episode has 3 assistant turn(s))"),
    ({**VALID, "retry_from_step": -1}, 3, False, "retry_from_step -1 is outside 0..2"),
    ({**VALID, "retry_from_step": 1}, 1, False, "retry_from_step 1 is outside 0..0"),
    ({**VALID, "retry_from_step": "first"}, 3, False, "retry_from_step 'first' is not an integer"),
    ({**VALID, "retry_from_step": True}, 3, False, "retry_from_step True is not an integer"),
    ({**VALID, "trajectory_outcome": "partial"}, 3, False, "trajectory_outcome 'partial' is not one of success, "
                                                           "success_but_inefficient, failure"),
    # two JSON objects: first '{' to last '}' spans both, which is not one JSON value
    (json.dumps(VALID) + "\n" + json.dumps(VALID), 3, False, "not valid JSON between the first '{' and the last '}'"),
    ("The answer was wrong because I added badly.", 3, False, "no JSON object"),
    ("} oops {", 3, False, "no JSON object"),
    ('{"trajectory_summary": "unterminated', 3, False, "no JSON object"),
    ('[{"a": 1}]', 3, False, "missing key(s): trajectory_summary"),  # the braces hold {"a": 1}
    ("{[1, 2]}", 3, False, "not valid JSON"),
])
def test_reflection_rules(text, n_turns, valid, error):
    text = text if isinstance(text, str) else json.dumps(text)
    p = parse_reflection(text, n_turns)
    assert p.valid is valid
    if error is None:
        assert p.error is None
    else:
        assert p.error.startswith(error), p.error


def test_a_success_reflection_is_valid_but_asks_for_no_retry():
    p = parse_reflection(json.dumps({**VALID, "trajectory_outcome": "success", "retry_from_step": 0}), 1)
    assert p.valid and not p.retry
    assert parse_reflection(json.dumps({**VALID, "trajectory_outcome": "success_but_inefficient"}), 2).retry


def test_the_reflection_schema_bounds_the_pivot_by_the_episode():
    s = r3l.reflection_schema(3, max_chars=50)
    assert s["required"] == list(r3l.KEYS) and s["additionalProperties"] is False
    assert s["properties"]["retry_from_step"] == {"type": "integer", "minimum": 0, "maximum": 2}
    assert s["properties"]["trajectory_outcome"]["enum"] == list(r3l.OUTCOMES)
    assert s["properties"]["root_cause_analysis"]["maxLength"] == 50


# ---------------------------------------------------------------- positive amplification (Eq. 11)


def _amplified(rewards, max_reward_advantage="alpha", alpha=3.0, max_reward=1.0):
    r = torch.tensor(rewards, dtype=D)
    valid = ~torch.isnan(r)
    ids = [0] * len(rewards)
    adv = group_advantages(r, ids, valid=valid)
    transform = make_transform("positive_amplification", alpha=alpha, max_reward=max_reward,
                               max_reward_advantage=max_reward_advantage)
    return adv, apply_advantage_transforms(r, adv, ids, [transform], valid=valid)


def test_amplification_one_success_in_four_both_settings():
    # [1, 0, 0, 0]: mean 0.25, centred 0.75, −0.25 ×3; sample var (0.5625 + 3·0.0625)/3 = 0.25, std 0.5
    #   A = 0.75/0.500001 = 1.499997, −0.25/0.500001 = −0.4999990
    #   paper (Eq. 11): r = 1 ≥ R_max -> Â = α = 3; the others A ≤ 0 stay
    #   authors' code: Â = 1.0 at R_max
    a_pos, a_neg = 0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)
    adv, paper = _amplified([1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, torch.tensor([a_pos, a_neg, a_neg, a_neg], dtype=D))
    torch.testing.assert_close(paper, torch.tensor([3.0, a_neg, a_neg, a_neg], dtype=D))
    _, code = _amplified([1.0, 0.0, 0.0, 0.0], max_reward_advantage=1.0)
    torch.testing.assert_close(code, torch.tensor([1.0, a_neg, a_neg, a_neg], dtype=D))


def test_amplification_all_fail_and_all_pass():
    # all fail: equal rewards -> A = 0 exactly, and nothing reaches R_max -> Â = A = 0. (With R_max
    # read as the group's maximum, all four would have been promoted to α.)
    for setting in ("alpha", 1.0):
        adv, out = _amplified([0.0, 0.0, 0.0, 0.0], max_reward_advantage=setting)
        assert (adv == 0).all() and (out == 0).all()
    # all pass: A = 0, but every r = 1 ≥ R_max -> Â = α (paper) or 1 (authors' code)
    assert (_amplified([1.0] * 4)[1] == 3.0).all()
    assert (_amplified([1.0] * 4, max_reward_advantage=1.0)[1] == 1.0).all()


def test_amplification_non_binary_and_null_rewards():
    # [0.5, 0.2, 0.8, 0.5]: mean 0.5, centred 0, −0.3, 0.3, 0; var 0.18/3 = 0.06, std 0.2449490
    #   A = ±0.3/0.2449500 = ±1.2247399; none reaches R_max = 1 -> Â = 0, −1.22474, 3·1.22474 = 3.6742197, 0
    a = 0.3 / (math.sqrt(0.06) + 1e-6)
    torch.testing.assert_close(_amplified([0.5, 0.2, 0.8, 0.5])[1], torch.tensor([0.0, -a, 3 * a, 0.0], dtype=D))
    # [0.3, 0.1, 0.1, 0.1]: the group's best is far from R_max: α·A, not the fixed value
    #   mean 0.15, centred 0.15, −0.05 ×3; var (0.0225 + 0.0075)/3 = 0.01, std 0.1 -> A = 0.15/0.100001
    b = 0.15 / (0.1 + 1e-6)
    torch.testing.assert_close(_amplified([0.3, 0.1, 0.1, 0.1])[1][0], torch.tensor(3 * b, dtype=D))
    # [1, NULL, 0, 0]: valid rows 1, 0, 0: mean 1/3, centred 2/3, −1/3, −1/3; var (4/9 + 1/9 + 1/9)/2 = 1/3
    #   A = (2/3)/0.5773513, −(1/3)/0.5773513; the NULL row 0; row 0 at R_max -> 3
    c = (1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    adv, out = _amplified([1.0, NULL, 0.0, 0.0])
    torch.testing.assert_close(adv, torch.tensor([2 * c, 0.0, -c, -c], dtype=D))
    torch.testing.assert_close(out, torch.tensor([3.0, 0.0, -c, -c], dtype=D))
    # a reward above R_max (non-binary scale) also gets the fixed value
    assert _amplified([1.5, 0.0], max_reward=1.0)[1][0] == 3.0


# ---------------------------------------------------------------- the pivotal mask (Eq. 10)

# A 3-turn episode of 12 response tokens: assistant turn 0 = [0, 3), feedback [3, 5), turn 1 =
# [5, 8), feedback [8, 10), turn 2 = [10, 12). The stored loss mask covers the assistant turns.
EPISODE_MASK = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize("pivot, start, kept", [
    (None, 0, [0, 1, 2, 5, 6, 7, 10, 11]),  # no pivot (no twin): every loss token
    (0, 0, [0, 1, 2, 5, 6, 7, 10, 11]),  # pivot 0: nothing before turn 0
    (1, 5, [5, 6, 7, 10, 11]),  # turn 0 masked (k < 1)
    (2, 10, [10, 11]),  # turns 0 and 1 masked
])
def test_pivotal_mask_on_a_three_turn_episode(pivot, start, kept):
    got = pivotal_mask(EPISODE_MASK, torch.tensor([start]))
    assert got.nonzero()[:, 1].tolist() == kept
    # through the method: the row's meta.pivot_token as the collector stores it
    from reflexdb.methods.r3l import pivot_tokens

    batch = _batch([0.0], meta=[{} if pivot is None else {"pivot": pivot, "pivot_token": start}], mask=EPISODE_MASK)
    assert torch.equal(pivot_tokens(batch), got)


def test_pivotal_mask_keeps_an_empty_mask_empty():
    assert not pivotal_mask(torch.zeros(2, 4, dtype=torch.bool), torch.tensor([0, 2])).any()


# ---------------------------------------------------------------- the loss (Eq. 12)


def test_r3l_loss_by_hand():
    # Eq. 12: −1/|G| Σ_τ 1/|τ| Σ_t mask·Â·log π (opmd, seq-mean-token-mean, no ratio, no KL)
    #   row 0: log π −1, −2, −0.5, −1, pivotal mask keeps tokens 2, 3 (pivot_token 2), Â = 3:
    #          mean over kept = (−0.5 − 1)/2 = −0.75 -> −Â·mean = 2.25
    #   row 1: log π −0.2, −0.4, −0.6, −0.8, mask 1, 1, 1, 0, Â = −0.5: mean = −1.2/3 = −0.4 -> −0.2
    #   row 2: no loss token (an empty mask, or a NULL reward: the learner clears its mask): not counted
    #   loss = (2.25 − 0.2)/2 = 1.025; d loss/d log π = −Â/(|τ|·2): row 0 −0.75, row 1 +1/12
    spec = get_loss_spec("opmd")
    params = spec.parse({})
    lp = torch.tensor([[-1.0, -2.0, -0.5, -1.0], [-0.2, -0.4, -0.6, -0.8], [-1.0, -1.0, -1.0, -1.0]], dtype=D,
                      requires_grad=True)
    stored = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    mask = pivotal_mask(stored, torch.tensor([2, 0, 0]))
    out = spec.call(lp, lp.detach(), torch.tensor([3.0, -0.5, 7.0], dtype=D), mask, params)
    assert out.loss.item() == pytest.approx(1.025)
    assert out.kl.item() == 0.0  # no KL (β = 0)
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0, 0, -0.75, -0.75], [1 / 12, 1 / 12, 1 / 12, 0], [0, 0, 0, 0]],
                                                     dtype=D))
    assert spec.normaliser(mask, params) == 2.0  # rows with a loss token


def _three_terms(B=8, T=6):
    """A step of R3L rows: exploration rows 0-4 (row 3 a NULL reward: mask cleared; row 4 with a
    pivot past its last token: empty after the mask), reflect rows 5, 6 and a retry row 7."""
    g = torch.Generator().manual_seed(7)
    lp = -torch.rand(B, T, generator=g, dtype=D) * 2
    lengths = torch.tensor([6, 4, 5, 0, 3, 6, 2, 5])
    stored = torch.arange(T)[None, :] < lengths[:, None]
    pivots = torch.tensor([2, 0, 3, 0, 3, 0, 0, 0])  # row 4: 3 tokens, pivot at 3 -> nothing left
    rewards = torch.tensor([1.0, 0.25, 0.6, NULL, 0.0], dtype=D)  # non-binary, one NULL
    valid = ~torch.isnan(rewards)
    adv = group_advantages(rewards, [0] * 5, valid=valid)
    adv = apply_advantage_transforms(rewards, adv, [0] * 5, [make_transform("positive_amplification")], valid=valid)
    adv = torch.cat([adv, torch.zeros(3, dtype=D)])  # SFT rows: groups of one, A = 0
    policy = torch.zeros(B, dtype=torch.bool)
    policy[:5] = True
    policy[3] = False  # the NULL row carries no loss
    reflect, retry = torch.zeros(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool)
    reflect[[5, 6]], retry[7] = True, True
    return lp, stored & pivotal_mask(stored, pivots), stored, adv, [(policy, "opmd", 1.0), (reflect, "sft", 0.5),
                                                                    (retry, "sft", 2.0)]


@pytest.mark.parametrize("micro_batch_size", [1, 3, 8])
def test_three_terms_over_micro_batches_equal_the_full_batch(micro_batch_size):
    """Each term weighted per micro-batch by its own normaliser's share (as Learner.optimize does)
    gives the full batch's loss and gradient: Eq. 12 = policy term (pivotal mask) + 0.5·reflect
    NLL + 2·retry NLL, with a NULL reward, an emptied mask and non-binary rewards in the batch."""
    lp0, pivoted, stored, adv, terms = _three_terms()
    B = lp0.shape[0]

    def term_mask(rows, name):
        return (pivoted if name == "opmd" else stored) & rows[:, None]

    full = lp0.clone().requires_grad_(True)
    total_full = 0.0
    for rows, name, w in terms:
        spec = get_loss_spec(name)
        params = spec.parse({})
        m = term_mask(rows, name)
        loss = spec.call(full[rows], full[rows].detach(), adv[rows], m[rows], params).loss * w
        loss.backward()
        total_full += loss.item()
    part = lp0.clone().requires_grad_(True)
    total = 0.0
    for start in range(0, B, micro_batch_size):
        sl = slice(start, start + micro_batch_size)
        for rows, name, w in terms:
            spec = get_loss_spec(name)
            params = spec.parse({})
            m = term_mask(rows, name)
            idx = rows[sl].nonzero().flatten()
            norm = spec.normaliser(m[rows], params)
            if idx.numel() == 0 or norm == 0:
                continue
            share = spec.normaliser(m[sl][idx], params) / norm
            loss = spec.call(part[sl][idx], part[sl][idx].detach(), adv[sl][idx], m[sl][idx], params).loss
            (loss * w * share).backward()
            total += loss.item() * w * share
    assert total == pytest.approx(total_full, abs=1e-9)
    torch.testing.assert_close(part.grad, full.grad, rtol=0, atol=1e-12)
    assert full.grad[3].abs().sum() == 0 and full.grad[4].abs().sum() == 0  # NULL row, emptied mask
    assert full.grad[0, :2].abs().sum() == 0 and full.grad[0, 2:].abs().sum() > 0  # before the pivot: none


# ---------------------------------------------------------------- the method and its config


def _batch(rewards, *, meta=None, mask=None, origins=None):
    from reflexdb.trainer.batch import Batch

    from tests.factories import release_origins

    B = len(rewards)
    z = torch.zeros(B, dtype=torch.int64)
    mask = mask if mask is not None else torch.ones(B, 1, dtype=torch.bool)
    return Batch(group_ids=[], trajectory_ids=list(range(B)), group_index=torch.arange(B), rewards=torch.tensor(rewards),
                 correct=torch.tensor(rewards) > 0.5, valid=torch.ones(B, dtype=torch.bool),
                 truncated=torch.zeros(B, dtype=torch.bool), input_ids=z[:, None], attention_mask=z[:, None],
                 prompt_lengths=z, response_lengths=z + mask.shape[1], response_mask=mask,
                 behaviour_logprobs=torch.zeros(mask.shape, dtype=torch.float32), policy_versions=z,
                 confidence=torch.zeros(B), group_versions=[0] * B, group_kinds=["fresh"] * B, meta=meta or [{}] * B,
                 origins=origins or ["base"] * B, origin_table=release_origins())


def test_the_method_s_terms_rows_and_config():
    cfg = parse_config({"run": "r", "algorithm": "r3l", "r3l": {"reflect_weight": 0.5}})
    terms = cfg.method.loss_terms(cfg, cfg.loss_params)
    assert [(t.name, t.loss, t.weight, t.mask is not None) for t in terms] == [
        ("policy", "opmd", 1.0, True), ("reflect", "sft", 0.5, False), ("retry", "sft", 1.0, False)]
    assert cfg.loss_params.agg == "seq-mean-token-mean"  # Eq. 12: 1/|G| Σ_τ 1/|τ| Σ_t
    b = _batch([1.0, 0.0, 1.0, 0.0], origins=["base", "distilled", "reflection", "guided_retry"])
    assert [t.rows(b).tolist() for t in terms] == [[True, True, False, False], [False, False, True, False],
                                                   [False, False, False, True]]
    off = parse_config({"run": "r", "algorithm": "r3l", "r3l": {"pivot_mask": False, "amplification": False,
                                                                  "retry_weight": 0, "reflect_weight": 0}})
    [term] = off.method.loss_terms(off, off.loss_params)
    assert term.mask is None and off.method.transforms(off) == []
    assert len(cfg.method.transforms(cfg)) == 1
    assert cfg.method.settings(cfg)["r3l.sft_max_uses"] == 1


@pytest.mark.parametrize("data, says", [
    ({"collector": {"group_size": 7}}, "collector.group_size is 7; r3l needs an even N"),
    ({"r3l": {"decoding": "regex"}}, "r3l.decoding"),
    ({"r3l": {"alpha": 0}}, "r3l.alpha"),
    ({"r3l": {"max_reward_advantage": 2}}, "r3l.max_reward_advantage"),
    ({"r3l": {"pivots": True}}, "r3l.pivots"),
])
def test_bad_r3l_config_is_refused_naming_the_key(data, says):
    with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
        parse_config({"run": "r", "algorithm": "r3l", **data})


# ---------------------------------------------------------------- the views on hand-made data


def _traj(origin="base", reward=0.0, *, n_turns=2, parent=None, meta=None, text="4"):
    """An episode of ``n_turns`` assistant turns of 3 tokens with 2 feedback tokens between them."""
    turns, ids, T = [TurnIn("user", "What is 2+2?")], [], 0
    for k in range(n_turns):
        turns.append(TurnIn("assistant", f"The answer is {text}.", T, T + 3, attempt=k))
        T += 3
        if k < n_turns - 1:
            turns.append(TurnIn("user", "Incorrect. Please try again.", T, T + 2, attempt=k))
            T += 2
    return TrajectoryIn(prompt_ids=np.arange(5), response_ids=np.arange(T), logprobs=np.full(T, -0.5, np.float32),
                        reward=reward, correct=None if reward is None else reward >= 1.0, turns=turns, origin=origin,
                        parent_trajectory_id=parent, meta=meta or {}, extracted_answer=text)


def _write_r3l_task(store, run, task, outcomes):
    """One task's exploration and retry groups from ``(valid, outcome, pivot, base reward, retry reward)``
    per base episode (retry reward None: no retry). Returns the written groups and reflection ids."""
    ids = r3l.reserve_ids(store, len(outcomes))
    base = [_traj(reward=b) for _, _, _, b, _ in outcomes]
    twins, aux, refl, twin_links, aux_links = [], [], [], [], []
    for j, ((valid, outcome, pivot, b, rr), rid) in enumerate(zip(outcomes, ids)):
        parsed = ParsedReflection(valid, {"root_cause_analysis": f"cause {j}"} if valid else None,
                                  outcome if valid else None, pivot if valid else None,
                                  f"cause {j}" if valid else None, None if valid else "missing key(s): retry_from_step")
        refl.append(ReflectionIn(rid, j, f'{{"reflection": {j}}}', parsed, "free", 0))
        aux.append(_traj("reflection", rr if rr is not None else None, n_turns=1, parent=Sibling(0, j)))
        aux[-1].correct = None
        aux_links.append((len(aux) - 1, rid))
        if rr is not None:
            twins.append(_traj("distilled", rr, parent=Sibling(0, j), meta={"pivot": pivot, "pivot_token": 5 * pivot}))
            twin_links.append((len(base) + len(twins) - 1, rid))
            aux.append(_traj("guided_retry", rr, n_turns=2 - pivot, parent=Sibling(0, j)))
            aux_links.append((len(aux) - 1, rid))
    fill = [_traj(reward=0.0, meta={"reflected": False}) for _ in range(len(outcomes) - len(twins))]
    explore = GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=base + twins + fill, workflow="r3l",
                      attachments=[r3l.Reflections(tuple(refl)), r3l.ReflectionLinks(run, tuple(twin_links))])
    retry = GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=aux, workflow="r3l", kind="retry",
                    attachments=[r3l.ReflectionLinks(run, tuple(aux_links))])
    return store.write_groups([explore, retry]), ids


def test_views_on_hand_made_data(store):
    from tests.factories import setup_run

    run, [ta, tb, _] = setup_run(store, "r3l-views")
    store.set_settings(run, {"r3l.sft_max_uses": 2})
    # task a: base 0 (reward 0) -> failure at pivot 1, retry reward 1 (improved); base 1 (reward 0.5)
    #         -> success (no retry); base 2 -> invalid (no retry); base 3 (0.5) -> retry 0.25 (worse)
    (ea, ra), ids = _write_r3l_task(store, run, ta, [(True, "failure", 1, 0.0, 1.0), (True, "success", 0, 0.5, None),
                                                    (False, None, None, 0.0, None),
                                                    (True, "success_but_inefficient", 0, 0.5, 0.25)])
    # task b: one improved retry from pivot 0
    (eb, rb), ids_b = _write_r3l_task(store, run, tb, [(True, "failure", 0, 0.0, 0.5), (True, "failure", 1, 1.0, 1.0)])

    refl = rows(store, "SELECT reflection_id, exploration_group_id, base_trajectory_id, valid, outcome, pivot, error, "
                       "retry_reward, gain, improved, base_turns, reflection_trajectory_id IS NOT NULL, "
                       "distilled_trajectory_id IS NOT NULL FROM r3l_reflections WHERE task_id = :t "
                       "ORDER BY reflection_id", t=ta)
    b = ea.trajectory_ids
    assert refl == [
        (ids[0], ea.group_id, b[0], True, "failure", 1, None, 1.0, 1.0, True, 2, True, True),
        (ids[1], ea.group_id, b[1], True, "success", 0, None, None, None, None, 2, True, False),
        (ids[2], ea.group_id, b[2], False, None, None, "missing key(s): retry_from_step", None, None, None, 2, True,
         False),
        (ids[3], ea.group_id, b[3], True, "success_but_inefficient", 0, None, 0.25, -0.25, False, 2, True, True),
    ]
    # lineage: the distilled twins and the aux rows point at their base episode (Siblings resolved)
    lineage = rows(store, "SELECT origin, parent_trajectory_id, l.reflection_id FROM trajectories t "
                          "LEFT JOIN trajectory_reflections l ON l.trajectory_id = t.id AND l.run_id = t.run_id "
                          "WHERE group_id IN (:e, :r) AND origin <> 'base' ORDER BY id", e=ea.group_id, r=ra.group_id)
    assert lineage == [("distilled", b[0], ids[0]), ("distilled", b[3], ids[3]),
                       ("reflection", b[0], ids[0]), ("guided_retry", b[0], ids[0]), ("reflection", b[1], ids[1]),
                       ("reflection", b[2], ids[2]), ("reflection", b[3], ids[3]), ("guided_retry", b[3], ids[3])]
    # the SFT sets: verified corrections only (R(retry) > R(base)): a's base 0, b's base 0
    reflect = rows(store, "SELECT reflection_id, gain, available, times_sampled FROM r3l_reflect_set ORDER BY 1")
    assert reflect == [(ids[0], 1.0, True, 0), (ids_b[0], 0.5, True, 0)]
    retry = rows(store, "SELECT reflection_id, pivot, guidance, suffix, available FROM r3l_retry_set ORDER BY 1")
    assert [(r[0], r[1], r[4]) for r in retry] == [(ids[0], 1, True), (ids_b[0], 0, True)]
    assert retry[0][2] == "What is 2+2?" and retry[0][3] == "The answer is 4."  # 1 turn after pivot 1
    assert retry[1][3] == "The answer is 4.\n\nThe answer is 4."
    # each pair at most r3l.sft_max_uses (2) times: after two steps it is no longer available
    pair = rows(store, "SELECT trajectory_id FROM r3l_reflect_set WHERE reflection_id = :r", r=ids[0])[0][0]
    assert r3l.sft_pairs(store, run, "r3l_reflect_set", 10)[0] == pair
    store.record_step(run, 1, 0, [pair])
    store.record_step(run, 2, 0, [pair])
    assert r3l.sft_pairs(store, run, "r3l_reflect_set", 10) == [
        rows(store, "SELECT trajectory_id FROM r3l_reflect_set WHERE reflection_id = :r", r=ids_b[0])[0][0]]
    assert r3l.set_sizes(store, run) == (2, 2, 1, 2)
    # the exploration groups: base ∪ distilled. a: 4 reflected base episodes (0, 0.5, 0, 0.5), 2 twins
    # (1, 0.25), 2 filling base episodes (0, 0): N = 8, base mean 1/6, distilled mean 0.625.
    # b: 2 base (0, 1), 2 twins (0.5, 1): N = 4, base mean 0.5, distilled mean 0.75
    groups = rows(store, "SELECT group_id, size, n_base, n_distilled, base_reward_mean, distilled_reward_mean "
                         "FROM r3l_exploration_groups ORDER BY 1")
    assert groups == [(ea.group_id, 8, 6, 2, pytest.approx(1 / 6), 0.625), (eb.group_id, 4, 2, 2, 0.5, 0.75)]
    # the retry groups are never eligible as groups; failures leaves out distilled and reflection rows
    assert rows(store, "SELECT DISTINCT reason FROM learner_eligible WHERE kind = 'retry'") == [("auxiliary",)]
    assert rows(store, "SELECT DISTINCT origin FROM failures WHERE run_id = :r ORDER BY 1", r=run) == [
        ("base",), ("guided_retry",)]
    # the reflection's root cause reaches the failures view
    assert rows(store, "SELECT root_cause FROM failures WHERE trajectory_id = :t", t=b[0]) == [("cause 0",)]


def test_a_sibling_outside_the_write_is_refused(store):
    from reflexdb.errors import InvalidGroup
    from tests.factories import setup_run

    run, [task, *_] = setup_run(store, "r3l-sibling")
    twin = _traj("distilled", parent=Sibling(1, 0))
    with pytest.raises(InvalidGroup, match=r"trajectories\[0\]\.parent_trajectory_id: Sibling\(group=1, index=0\) "
                                           "names no trajectory of this write of 1 group"):
        store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[twin]))
    assert rows(store, "SELECT count(*) FROM groups") == [(0,)]


# ---------------------------------------------------------------- the workflow on the tiny model


def _config(**r3l_options):
    return parse_config({
        "run": "r3l", "model": "tiny", "algorithm": "r3l", "max_staleness": 100, "seed": 3,
        "tasks": {"train_size": 6, "eval_size": 0},
        "environment": {"name": "multi_attempt", "max_attempts": 3},
        "collector": {"group_size": 6, "tasks_per_batch": 2, "sampling": {"max_new_tokens": 6},
                      "progress_every_s": 1, "poll_interval_s": 0.2},
        "learner": {"groups_per_step": 2, "micro_batch_size": 3, "lr": 1e-3, "poll_interval_s": 0.2},
        "r3l": {"max_tokens": 24, **r3l_options},
    })


def _rig_reflections(monkeypatch):
    """The tiny model writes no valid reflection; make base episode j of each task's three say:
    j = 0 a failure at its last turn, j = 1 a success, j = 2 what the model wrote (invalid)."""
    real = r3l.parse_reflection
    calls = []

    def rigged(text, n_turns):
        j = len(calls) % 3
        calls.append(j)
        if j == 0:
            return ParsedReflection(True, dict(VALID, retry_from_step=n_turns - 1), "failure", n_turns - 1, "why", None)
        if j == 1:
            return ParsedReflection(True, dict(VALID, trajectory_outcome="success"), "success", 0, "why", None)
        return real(text, n_turns)

    monkeypatch.setattr(r3l, "parse_reflection", rigged)


def _rig_retries_solve(monkeypatch):
    """Every guided retry ends solved (reward 1): the tiny model's base episodes never are."""
    from reflexdb.collector.runner import Collector

    real = Collector.resume

    def resume(self, starts):
        out = real(self, starts)
        for ep in out:
            if "Do not mention" in ep.prompt_turns[-1]["content"]:
                ep.last = replace(ep.last, episode_reward=1.0, episode_correct=True)
        return out

    monkeypatch.setattr(Collector, "resume", resume)


def test_the_workflow_end_to_end_on_the_tiny_model(store, tmp_path, monkeypatch, model_cache):
    """Two tasks, N = 6: three base episodes each (one reflection a failure, one a success, one
    invalid), one guided retry and its distilled twin, two filling base episodes; everything in
    one transaction per task, with lineage; the distilled log-probs are score() of the plain
    context; every stage is one engine call for both tasks."""
    from reflexdb.collector.runner import Collector

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    _rig_reflections(monkeypatch)
    cfg = _config()
    collector = Collector(cfg, store, echo=lambda m: None)
    calls = []
    real_generate = collector.engine.generate
    monkeypatch.setattr(collector.engine, "generate", lambda p, n=1, params=None: calls.append(len(p)) or
                        real_generate(p, n=n, params=params))
    collector.setup()
    stats = collector.run(max_groups=4)  # one claim of 2 tasks: 2 exploration + 2 retry groups
    assert stats.groups == 4 and stats.kinds["retry"] == 2
    assert collector.metrics()["collector/seconds_score"] > 0  # the distilled twins' scoring pass, timed (issue 51)
    # base turns (≤ 3 calls for up to 3 attempts), 1 reflection call, retries + fills (≤ 3), never per episode
    assert len(calls) <= 7 and calls[3 if len(calls) == 7 else 1] >= 2
    groups = rows(store, "SELECT id, task_id, kind, size, meta->>'n_distilled', meta->>'n_filled' FROM groups ORDER BY id")
    assert [(k, s, d, f) for _, _, k, s, d, f in groups] == [("fresh", 6, "1", "2"), ("retry", 4, None, None)] * 2
    explore, retry = store.read_groups([groups[0][0], groups[1][0]])
    base, distilled, fills = explore.trajectories[:3], explore.trajectories[3], explore.trajectories[4:]
    assert [t.origin for t in explore.trajectories] == ["base"] * 3 + ["distilled"] + ["base"] * 2
    assert [t.meta.get("reflected") for t in explore.trajectories] == [True] * 3 + [None, False, False]
    aux = retry.trajectories
    assert [t.origin for t in aux] == ["reflection"] * 3 + ["guided_retry"]
    # the reflections: all stored, the invalid one with its error
    refl = rows(store, "SELECT id, trajectory_id, valid, outcome, pivot, error IS NOT NULL, decoding FROM reflections "
                       "WHERE trajectory_id = ANY(:ids) ORDER BY trajectory_id", ids=[t.id for t in base])
    n_turns = sum(u.role == "assistant" and u.token_start is not None for u in base[0].turns)
    assert [r[1:] for r in refl] == [(base[0].id, True, "failure", n_turns - 1, False, "free"),
                                     (base[1].id, True, "success", 0, False, "free"),
                                     (base[2].id, False, None, None, True, "free")]
    links = dict(rows(store, "SELECT trajectory_id, reflection_id FROM trajectory_reflections"))  # R3L's table
    assert [links.get(t.id) for t in aux] == [r[0] for r in refl] + [refl[0][0]]
    assert {t.parent_trajectory_id for t in aux} == {t.id for t in base}
    assert (distilled.parent_trajectory_id, links.get(distilled.id)) == (base[0].id, refl[0][0])
    # the guided retry: the restored conversation and the guidance as its prompt, the suffix from turn k
    guided = aux[3]
    pivot, cut = distilled.meta["pivot"], distilled.meta["pivot_token"]
    assert pivot == n_turns - 1 and base[0].meta["pivot_token"] == cut and "pivot" not in base[1].meta
    assert guided.turns[[u.token_start is None for u in guided.turns].index(False) - 1].text.endswith(
        "Do not mention or refer to this guidance in your answer.")
    assert [u.attempt for u in guided.turns if u.role == "assistant" and u.token_start is not None][0] == pivot
    # distilled = base tokens before turn k ⊕ the retry's tokens, under the plain prompt
    assert list(distilled.prompt_ids) == list(base[0].prompt_ids)
    assert list(distilled.response_ids) == list(base[0].response_ids[:cut]) + list(guided.response_ids)
    assert (distilled.reward, distilled.correct) == (guided.reward, guided.correct)
    own = np.zeros(len(distilled.response_ids), bool)
    for u in distilled.turns:
        if u.role == "assistant" and u.token_start is not None:
            own[u.token_start:u.token_end] = True
    assert np.array_equal(distilled.loss_mask, own) and own[:cut].any() and own[cut:].any()
    [scored] = collector.engine.score([distilled.prompt_ids], [distilled.response_ids], temperature=1.0)
    np.testing.assert_allclose(distilled.logprobs[own], scored.logprobs[own], atol=1e-5)
    assert (distilled.logprobs[~own] == 0).all() and distilled.meta["logprobs_from"] == "rescored"
    # the guided retry's log-probs are its own sampled ones (under the guidance), not the distilled ones
    assert guided.meta["logprobs_from"] == "sampled" and list(guided.prompt_ids) != list(distilled.prompt_ids)
    # the reflection's tokens: prompt = the episode log; its reward is its retry's (none: NULL)
    assert "Step 0 (assistant)" in aux[0].turns[1].text and aux[0].reward == guided.reward and aux[1].reward is None
    assert all(f.meta.get("reflected") is False and f.id not in links for f in fills)


def test_oracle_guidance_retries_every_failure_with_the_ground_truth(store, tmp_path, monkeypatch, model_cache):
    """r3l.guidance: oracle (a diagnostic arm): the tiny model solves nothing, so each of the three
    base episodes of a task is retried from turn 0 whatever its reflection said, with the oracle's
    line (the ground truth) as the guidance: 3 twins, no filling episode; every retry row and
    twin is marked, the group too; the policy's reflections are still stored as written; and the
    learner takes no reflect-set pair and has no reflect term."""
    from reflexdb.collector.runner import Collector
    from reflexdb.methods.r3l import _terms
    from reflexdb.methods.r3l.workflow import oracle_guidance

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    cfg = _config(guidance="oracle")
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    collector.run(max_groups=4)
    groups = rows(store, "SELECT id, task_id, kind, meta->>'n_distilled', meta->>'n_filled', meta->>'guidance' "
                         "FROM groups ORDER BY id")
    assert [g[2:] for g in groups] == [("fresh", "3", "0", "oracle"), ("retry", None, None, None)] * 2
    explore, retry = store.read_groups([groups[0][0], groups[1][0]])
    truth = rows(store, "SELECT ground_truth FROM tasks WHERE id = :t", t=groups[0][1])[0][0]
    assert [t.origin for t in explore.trajectories] == ["base"] * 3 + ["distilled"] * 3
    assert all(t.meta["guidance"] == "oracle" and t.meta["pivot"] == 0 for t in explore.trajectories[3:])
    guided = [t for t in retry.trajectories if t.origin == "guided_retry"]
    assert len(guided) == 3 and all(t.meta["guidance"] == "oracle" for t in guided)
    guidance = [u.text for u in guided[0].turns if u.token_start is None][-1]
    assert guidance == oracle_guidance(truth) == f"The answer is {truth}. Say: The answer is {truth}."
    # twins from turn 0: the retry's tokens alone, under the plain prompt
    assert list(explore.trajectories[3].response_ids) == list(guided[0].response_ids)
    assert rows(store, "SELECT count(*) FROM reflections") == [(6,)]  # the policy's own, as written
    assert [t.name for t in _terms(cfg, None)] == ["policy", "retry"]
    assert [t.name for t in _terms(_config(), None)] == ["policy", "reflect", "retry"]
    # a learner step on them: the reflections of retried episodes may have no pivot (invalid, or
    # "success"): the step's metrics once summed those Nones and the learner died at its first step
    from reflexdb.trainer.learner import Learner

    learner = Learner(cfg, store, echo=lambda m: None)
    learner.setup()
    learner.run(max_steps=1)
    [(metrics,)] = rows(store, "SELECT metrics FROM learner_steps")
    assert metrics["r3l/retries"] == 6 and metrics["r3l/pivot_mean"] == 0.0  # two groups of 3 retried episodes


def test_the_learner_trains_exploration_groups_and_the_sft_pairs(store, tmp_path, monkeypatch, model_cache):
    """Retries that solve what the base episodes did not: verified corrections. A learner step
    takes the two exploration groups and, beside them, the two reflect pairs and the two retry
    pairs (micro-batches of 3 rows, smaller than the step); each pair is used once."""
    from reflexdb.collector.runner import Collector
    from reflexdb.trainer.learner import Learner

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    _rig_reflections(monkeypatch)
    _rig_retries_solve(monkeypatch)
    cfg = _config()
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    collector.run(max_groups=4)
    run = store.run_id(cfg.run)
    assert r3l.set_sizes(store, run) == (2, 2, 2, 2)
    learner = Learner(cfg, store, echo=lambda m: None)
    learner.setup()
    chosen = learner.wait_for_groups(None)
    pairs = rows(store, "SELECT trajectory_id FROM r3l_reflect_set UNION ALL SELECT trajectory_id FROM r3l_retry_set")
    assert len(chosen.group_ids) == 2 and sorted(chosen.extra) == sorted(p for (p,) in pairs)
    learner.run(max_steps=1)
    consumed = rows(store, "SELECT t.origin, count(*) FROM consumption c JOIN trajectories t ON t.id = c.trajectory_id "
                           "GROUP BY 1 ORDER BY 1")
    assert consumed == [("base", 10), ("distilled", 2), ("guided_retry", 2), ("reflection", 2)]
    # each row's advantage by stage (revision 0023): the group's, then positive amplification as
    # r3l.amplification turns it on (Eq. 11 by hand: α = 3 at r ≥ R_max = 1, α·A where A > 0, else A);
    # the SFT pairs, auxiliary rows trained by their own terms, have none
    assert rows(store, "SELECT advantage_stages FROM learner_steps") == [(["group", "positive_amplification"],)]
    sft = {p for (p,) in pairs}
    for tid, r, adv in rows(store, "SELECT c.trajectory_id, t.reward, c.advantages FROM consumption c "
                                   "JOIN trajectories t ON t.id = c.trajectory_id"):
        if tid in sft:
            assert adv is None, tid
        else:
            a, amplified = adv
            assert amplified == pytest.approx(3.0 if r is not None and r >= 1 else 3 * a if a > 0 else a, abs=1e-5)
    assert r3l.set_sizes(store, run) == (2, 2, 0, 0)  # r3l.sft_max_uses = 1
    [(m,)] = rows(store, "SELECT metrics FROM learner_steps")
    assert m["r3l/retry_improvement_rate"] == 1.0 and m["r3l/retries"] == 2 and m["r3l/reflections"] == 6
    assert m["r3l/invalid_rate"] == pytest.approx(1 / 3) and m["r3l/outcome/success"] == 0.5
    assert m["r3l/sft_reflect_rows"] == 2 and m["r3l/sft_retry_rows"] == 2
    assert m["r3l/distilled_per_group"] == 1 and m["r3l/retry_reward_mean"] == 1.0
    assert math.isfinite(m["loss/reflect/nll"]) and math.isfinite(m["loss/retry/nll"])
    # pass@1 counts the base rows only (the guided retries were rigged to succeed); the tiny
    # model, sampled with seeds drawn per process, solves a base task now and then
    [(base_pass,)] = rows(store, "SELECT avg(t.correct::int)::float8 FROM consumption c JOIN trajectories t "
                                 "ON t.id = c.trajectory_id WHERE t.origin = 'base'")
    assert math.isfinite(m["loss/policy_loss"]) and m["reward/pass_at_1"] == pytest.approx(base_pass)
    # the next step takes the new groups' pairs, never the used ones again
    collector.run(max_groups=8)
    nxt = learner.wait_for_groups(None).extra
    assert len(nxt) == 4 and set(nxt).isdisjoint(chosen.extra)


def test_constrained_reflections_parse_on_the_tiny_model(store, tmp_path, monkeypatch, model_cache):
    """decoding: json_schema (xgrammar): even the tiny random model writes reflections that parse,
    with a pivot inside the episode; free decoding writes none."""
    from reflexdb.collector.runner import Collector

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    cfg = _config(decoding="json_schema", max_chars=40, max_tokens=200)
    collector = Collector(cfg, store, echo=lambda m: None)
    collector.setup()
    collector.run(max_groups=2)
    got = rows(store, "SELECT valid, decoding, pivot < base_turns, error FROM r3l_reflections")
    assert len(got) == 6 and all(v and d == "json_schema" and inside for v, d, inside, _ in got), got  # 2 tasks × 3
    assert rows(store, "SELECT count(*) FROM trajectories WHERE origin = 'guided_retry'")[0][0] == \
        rows(store, "SELECT count(*) FROM reflections WHERE outcome <> 'success'")[0][0]


def test_reward_gain_is_paired_each_retry_against_its_own_base():
    """Three reflected episodes of a group: one whose reflection said success (base 1.0, no retry),
    one invalid (base 0.0, no retry), one retried (base 0.5, retry 0.5). Paired: one pair, gain
    0.5 − 0.5 = 0.00. Before: base mean over all three (1 + 0 + 0.5)/3 = 0.5, retry mean 0.5 → 0,
    and with the success at base 0.0 instead: base mean 0.1667 → (0.5 − 0.1667)/0.1667 = +2.0."""
    from reflexdb.methods.r3l import reward_gain
    from reflexdb.methods.r3l.reflections import ReflectionStats

    def stats(success_base):
        return [ReflectionStats(1, True, "success", 0, False, success_base, None),
                ReflectionStats(1, False, None, None, False, 0.0, None),
                ReflectionStats(1, True, "failure", 1, True, 0.5, 0.5)]

    for success_base in (1.0, 0.0):
        m = reward_gain(stats(success_base))
        assert m["r3l/reward_gain"] == 0.0 and m["r3l/reward_gain_relative"] == 0.0
        assert m["r3l/reward_gain_pairs"] == 1 and m["r3l/base_reward_mean"] == m["r3l/retry_reward_mean"] == 0.5
    assert reward_gain(stats(0.0))["r3l/reflected_base_reward_mean"] == pytest.approx(0.5 / 3)
    # non-binary rewards, a retry whose reward is NULL (left out), a base of 0 (relative gain NaN)
    m = reward_gain([ReflectionStats(1, True, "failure", 0, True, 0.25, 1.0),
                     ReflectionStats(1, True, "failure", 1, True, 0.75, 0.5),
                     ReflectionStats(1, True, "failure", 1, True, 0.5, None)])
    # pairs (0.25, 1.0), (0.75, 0.5): gains +0.75, −0.25 -> mean 0.25; base mean 0.5 -> relative 0.5
    assert m["r3l/reward_gain_pairs"] == 2 and m["r3l/reward_gain"] == pytest.approx(0.25)
    assert m["r3l/reward_gain_relative"] == pytest.approx(0.5)
    m = reward_gain([ReflectionStats(1, True, "failure", 0, True, 0.0, 1.0)])
    assert m["r3l/reward_gain"] == 1.0 and math.isnan(m["r3l/reward_gain_relative"])
    assert math.isnan(reward_gain([])["r3l/reward_gain"])


def test_sft_rows_stay_out_of_the_advantage_statistics():
    """Rows of two groups (A = 0.7, −0.7, 0, and a NULL reward's 0) and an SFT pair, a group of one
    that positive amplification lifted to α = 3. Over the groups' rows with a reward: |A| mean
    (0.7 + 0.7 + 0)/3 = 0.4667, non-zero 2/3. Before, the SFT row counted: (0.7 + 0.7 + 0 + 3)/4 =
    1.1 and 3/4."""
    from reflexdb.trainer.learner import advantage_stats

    adv = torch.tensor([0.7, -0.7, 0.0, 0.0, 3.0], dtype=D)
    valid = torch.tensor([True, True, True, False, True])
    auxiliary = torch.tensor([False, False, False, False, True])
    m = advantage_stats(adv, valid, auxiliary)
    assert m["advantage/abs_mean"] == pytest.approx(1.4 / 3) and m["advantage/nonzero_frac"] == pytest.approx(2 / 3)
    assert advantage_stats(adv, valid, torch.zeros(5, dtype=torch.bool))["advantage/abs_mean"] == pytest.approx(1.1)
    # nothing left: 0, not NaN
    assert advantage_stats(adv, valid, torch.ones(5, dtype=torch.bool)) == {"advantage/abs_mean": 0.0,
                                                                           "advantage/nonzero_frac": 0.0}
