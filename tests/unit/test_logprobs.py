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


@pytest.mark.parametrize("chunk", [1, 3, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_chunked_head_equals_the_full_logits_in_value_and_gradient(chunk, temperature):
    """hidden_response_logprobs projects chunk positions at a time (checkpointed) instead of the
    whole [B, L, V]: the log-probs, entropies and the gradients reaching the hidden states and the
    head's weight are those of response_logprobs on head(hidden). Rows of 2, 5 and 1 response
    tokens (the _batch above), chunks of 1, 3 and more than the 8 tokens there are."""
    from reflexdb.logprobs import hidden_response_logprobs

    _, ids, P, T = _batch()
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, ids.shape[1], 6, generator=gen, dtype=torch.float64)
    head = torch.nn.Linear(6, 11, bias=False).double()
    upstream = torch.randn(3, int(T.max()), generator=gen, dtype=torch.float64)

    def run(fn):
        h = hidden.clone().requires_grad_(True)
        head.weight.grad = None
        lp, ent = fn(h)
        (lp * upstream).sum().backward()
        return lp.detach(), ent, h.grad, head.weight.grad.clone()

    full = run(lambda h: response_logprobs(head(h), ids, P, T, temperature=temperature, with_entropy=True))
    chunked = run(lambda h: hidden_response_logprobs(h, head, ids, P, T, temperature=temperature,
                                                     with_entropy=True, chunk_tokens=chunk))
    for a, b in zip(full, chunked):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-6, atol=1e-6)
    # past each response's end: 0, as response_logprobs
    assert chunked[0][2, 1:].eq(0).all() and chunked[0][0, 2:].eq(0).all()
    # no gradient: nothing is checkpointed, the values are the same
    with torch.no_grad():
        lp, _ = hidden_response_logprobs(hidden, head, ids, P, T, temperature=temperature, chunk_tokens=chunk)
    torch.testing.assert_close(lp.double(), full[0].double(), rtol=1e-6, atol=1e-6)


def test_token_slices_cut_by_the_token_budget():
    from reflexdb.trainer.update import token_slices

    lengths = torch.tensor([10, 10, 30, 10, 5, 5, 100, 5])
    # no budget: n_micro equal slices (the last may be short)
    assert token_slices(lengths, 3, None) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    # budget 40: [10, 10] is 2 × 10 = 20; adding 30 makes 3 × 30 = 90 > 40, cut; [30] alone; ...
    assert token_slices(lengths, 2, 40) == [slice(0, 2), slice(2, 3), slice(3, 4), slice(4, 6), slice(6, 7),
                                            slice(7, 8)]
    # a row longer than the budget is a slice of its own; n_micro slices at least, empty ones too
    assert token_slices(lengths, 1, 9) == [slice(i, i + 1) for i in range(8)]  # 2 × 5 = 10 > 9
    assert token_slices(torch.tensor([4]), 2, 100) == [slice(0, 1), slice(1, 1)]
    assert token_slices(torch.tensor([], dtype=torch.long), 1, 100) == [slice(0, 0)]
