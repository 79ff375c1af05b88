"""reflexdb.logprobs: token log-probs from logits, the one computation the engines and the trainer share."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from reflexdb.logprobs import response_logprobs, token_logprobs


def test_token_logprobs_by_hand():
    # logits [ln 1, ln 2, ln 1] -> softmax [1/4, 1/2, 1/4]; token 1 has log(1/2), token 0 log(1/4).
    # Entropy: -(1/4 ln 1/4 + 1/2 ln 1/2 + 1/4 ln 1/4) = 1.5 ln 2.
    # At temperature 0.5 the logits double: [0, 2 ln 2, 0] -> [1/6, 4/6, 1/6]; token 1 has log(2/3).
    logits = torch.log(torch.tensor([[[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]]]))  # [1, 2, 3]
    targets = torch.tensor([[1, 0]])
    lp, ent = token_logprobs(logits, targets, with_entropy=True)
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.5), math.log(0.25)]]))
    torch.testing.assert_close(ent, torch.full((1, 2), 1.5 * math.log(2)))
    lp, ent = token_logprobs(logits, targets, temperature=0.5)
    torch.testing.assert_close(lp[0, 0], torch.tensor(math.log(2 / 3)))
    assert ent is None
    # Greedy sampling (temperature 0) is scored under the model's own distribution.
    assert torch.equal(token_logprobs(logits, targets, temperature=0.0)[0], token_logprobs(logits, targets)[0])


def _batch(seed: int = 0, V: int = 11):
    """A right-padded batch: prompts of 3, 1, 4 tokens and responses of 2, 5, 1 tokens."""
    gen = torch.Generator().manual_seed(seed)
    P, T = torch.tensor([3, 1, 4]), torch.tensor([2, 5, 1])
    L = int((P + T).max()) + 1  # one extra column of padding
    ids = torch.randint(1, V, (3, L), generator=gen)
    for i in range(3):
        ids[i, P[i] + T[i]:] = 0
    logits = torch.randn(3, L, V, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    return logits, ids, P, T


def _engine_before(logits, input_ids, prompt_lengths, response_lengths, temperature, with_entropy):
    """TrainingEngine.token_logprobs as written before this module existed (the reference)."""
    B, T = input_ids.shape[0], int(response_lengths.max())
    offs = torch.arange(T)
    pos = (prompt_lengths[:, None] - 1 + offs[None, :]).clamp(max=logits.shape[1] - 1)
    picked = logits.gather(1, pos[:, :, None].expand(B, T, logits.shape[-1])).float()
    if temperature != 1.0 and temperature > 0:
        picked = picked / temperature
    logp_all = F.log_softmax(picked, dim=-1)
    targets = input_ids.gather(1, (pos + 1).clamp(max=input_ids.shape[1] - 1))
    valid = offs[None, :] < response_lengths[:, None]
    logprobs = logp_all.gather(-1, targets[:, :, None]).squeeze(-1) * valid
    entropy = -(logp_all.exp() * logp_all).sum(-1) * valid if with_entropy else None
    return logprobs, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_response_logprobs_equals_the_engines_former_computation(temperature):
    logits, ids, P, T = _batch()
    lp, ent = response_logprobs(logits, ids, P, T, temperature=temperature, with_entropy=True)
    ref_lp, ref_ent = _engine_before(logits, ids, P, T, temperature, True)
    assert lp.shape == ent.shape == (3, 5) and lp.dtype == torch.float32
    assert torch.equal(lp, ref_lp) and torch.equal(ent, ref_ent)  # bit for bit
    assert (lp[0, 2:] == 0).all() and (lp[2, 1:] == 0).all() and (ent[2, 1:] == 0).all()  # padding


def test_response_logprobs_scores_the_response_tokens():
    # Row 1: prompt of 1 token, so logits position t predicts ids[1, 1 + t].
    logits, ids, P, T = _batch(1)
    lp, _ = response_logprobs(logits, ids, P, T, temperature=0.5)
    for t in range(5):
        expected = F.log_softmax(logits[1, t].float() / 0.5, -1)[ids[1, 1 + t]]
        assert lp[1, t] == expected


def test_token_logprobs_equal_the_hf_scores_former_computation():
    # HFEngine._score_chunk: log_softmax(logits.float() / temperature) gathered at the targets.
    logits, ids, _, _ = _batch(2)
    targets = ids[:, 1:5]
    for temperature in (1.0, 0.7):
        before = torch.log_softmax(logits[:, :4].float() / temperature, dim=-1).gather(-1, targets[..., None])
        assert torch.equal(token_logprobs(logits[:, :4], targets, temperature=temperature)[0], before.squeeze(-1))


def test_gradients_flow_to_the_logits_and_not_through_the_entropy():
    logits, ids, P, T = _batch(3)
    logits = logits.float().requires_grad_()
    lp, ent = response_logprobs(logits, ids, P, T, with_entropy=True)
    assert not ent.requires_grad
    lp.sum().backward()
    # Row 0 (prompt 3, response 2): positions 2 and 3 predict its response tokens, no other does.
    assert logits.grad[0, 2:4].abs().sum() > 0
    assert logits.grad[0, :2].abs().sum() == 0 and logits.grad[0, 4:].abs().sum() == 0
