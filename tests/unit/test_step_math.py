"""The math of one learner step: exact group advantages (equal rewards, NULL rewards), typed loss
parameters, and micro-batch accumulation that reproduces the full batch (hand cases with the
arithmetic in the comments, then every registered loss).

Unit tests of pure math: no database, no model.
"""

from __future__ import annotations

import inspect
import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from reflexdb.trainer.advantages import (
    apply_advantage_transforms,
    group_advantages,
    make_transform,
)
from reflexdb.trainer.losses import (
    AGG_MODES,
    LOSSES,
    LossSpec,
    get_loss,
    get_loss_spec,
    loss_names,
    micro_batch_weights,
    register_loss,
    registry,
)

D = torch.float64
NULL = float("nan")


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------- advantages: equal rewards


@pytest.mark.parametrize("G", [8, 16])
def test_equal_rewards_give_exactly_zero(G):
    # G rewards of 0.7 in float32 (as the learner packs them). Before: r − mean ≈ 1e-8 from rounding,
    # std ≈ 6e-8, so A ≈ 1e-8/(6e-8 + 1e-6) = 0.056 at G = 8, 0.106 at G = 16. Now: max == min -> 0.
    adv = group_advantages(torch.full((1, G), 0.7))
    assert adv.dtype == torch.float32
    assert (adv == 0.0).all()
    # the same in the flat layout, next to a group with spread, and with scale none
    rewards = torch.cat([torch.full((G,), 0.7), t([1.0, 0.0], torch.float32)])
    ids = [0] * G + [1, 1]
    adv = group_advantages(rewards, ids)
    assert (adv[:G] == 0.0).all() and (adv[G:] != 0.0).all()
    assert (group_advantages(rewards, ids, scale="none")[:G] == 0.0).all()


def test_equal_rewards_float64_exactly_zero():
    # float64 alone would leave ~1e-10 for 0.7 (the rounding of mean(r)); the max == min rule gives 0
    for v, G in itertools.product([0.1, 0.3, 0.7, 0.9, 2 / 3], [3, 7, 8, 16, 24]):
        assert (group_advantages(torch.full((1, G), v, dtype=D)) == 0.0).all(), (v, G)


# ---------------------------------------------------------------- advantages: NULL rewards


def test_null_reward_left_out_of_an_equal_group():
    # [1, 1, 1, NULL]: valid rewards all 1 -> 0 for the three; the NULL row -> 0.
    # (Before: NULL entered as 0: mean 0.75, sample std 0.5, A = 0.25/0.5 = +0.5 for the three.)
    valid = torch.tensor([[True, True, True, False]])
    adv = group_advantages(t([[1.0, 1.0, 1.0, 0.0]]), valid=valid)
    assert (adv == 0.0).all()
    # NaN marks a missing reward just as well
    assert (group_advantages(t([[1.0, 1.0, 1.0, NULL]])) == 0.0).all()


def test_null_reward_non_binary_by_hand():
    # [1, 0.5, NULL, 0]: valid rows 1, 0.5, 0 (G = 3)
    #   mean = 1.5/3 = 0.5; centred = 0.5, 0, −0.5
    #   sample var = (0.25 + 0 + 0.25)/(3 − 1) = 0.25; std = 0.5
    #   A = ±0.5/(0.5 + 1e-6) = ±0.999998; 0 for the middle one and the NULL row
    a = 0.5 / (0.5 + 1e-6)
    expected = t([a, 0.0, 0.0, -a])
    rewards = t([1.0, 0.5, 0.0, 0.0])
    valid = torch.tensor([True, True, False, True])
    torch.testing.assert_close(group_advantages(rewards, [9, 9, 9, 9], valid=valid), expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(group_advantages(t([1.0, 0.5, NULL, 0.0]), [9] * 4), expected, rtol=0, atol=1e-15)
    # Dr.GRPO (scale none): r − mean over the valid rows: 0.5, 0, (NULL) 0, −0.5
    torch.testing.assert_close(group_advantages(rewards, [9] * 4, valid=valid, scale="none"), t([0.5, 0.0, 0.0, -0.5]))


def test_all_null_group_and_group_of_one_valid():
    # group 0: all NULL -> 0, no NaN; group 1: one valid row (0.3) and a NULL -> no spread, 0;
    # group 2: [0, 2] -> mean 1, sample std sqrt(2): ∓1/(1.414214 + 1e-6)
    rewards = t([NULL, NULL, NULL, 0.3, NULL, 0.0, 2.0])
    ids = [0, 0, 0, 1, 1, 2, 2]
    b = 1 / (math.sqrt(2) + 1e-6)
    for scale, expected in (("group", [0, 0, 0, 0, 0, -b, b]), ("none", [0, 0, 0, 0, 0, -1, 1])):
        adv = group_advantages(rewards, ids, scale=scale)
        assert torch.isfinite(adv).all()
        torch.testing.assert_close(adv, t(expected))
        assert (adv[:5] == 0.0).all()


def test_valid_flags_checked():
    with pytest.raises(ValueError, match="valid"):
        group_advantages(t([1.0, 0.0]), [0, 0], valid=torch.tensor([True]))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(t([1.0, 0.0]), [0, 0], scale="std")


def test_transforms_skip_null_rewards():
    # group [NULL, 0.5, 0] (the NULL row packed as reward 0.9 to show it is ignored):
    #   valid 0.5, 0: mean 0.25, sample std sqrt(0.125) = 0.353553 -> A = ±0.25/0.353554 = ±0.707105
    #   amplification with R_max = 0.5: row 1 reaches it -> Â = α = 3; the NULL row (0.9 ≥ 0.5
    #   had it counted) stays 0
    rewards = t([0.9, 0.5, 0.0])
    valid = torch.tensor([False, True, True])
    adv = group_advantages(rewards, [0, 0, 0], valid=valid)
    out = apply_advantage_transforms(rewards, adv, [0, 0, 0],
                                     [make_transform("positive_amplification", max_reward=0.5)], valid=valid)
    a = 0.25 / (math.sqrt(0.125) + 1e-6)
    torch.testing.assert_close(adv, t([0.0, a, -a]))
    torch.testing.assert_close(out, t([0.0, 3.0, -a]))


# ---------------------------------------------------------------- typed loss parameters


def test_parse_unknown_key_names_it_and_the_family_keys():
    with pytest.raises(ValueError) as err:
        get_loss_spec("dr_grpo").parse({"agg": "token-mean"})
    assert str(err.value).startswith("learner.loss_params.agg: not a parameter of loss dr_grpo "
                                     "(its parameters: beta, clip_eps_high, clip_eps_low, max_len)")
    with pytest.raises(ValueError, match=r"learner.loss_params.lam: not a parameter of loss grpo"):
        get_loss_spec("grpo").parse({"lam": 0.9})


def test_parse_bounds_and_types():
    spec = get_loss_spec("grpo")
    with pytest.raises(ValueError, match=r"clip_eps_low: .*got 2.*allowed: >= 0.0, <= 1.0"):
        spec.parse({"clip_eps_low": 2})
    with pytest.raises(ValueError, match=r"learner.loss_params.agg"):
        spec.parse({"agg": "sequence-sum"})
    with pytest.raises(ValueError, match=r"min_advantage"):
        get_loss_spec("grpo_lambda").parse({"min_advantage": 0.5})


def test_parse_defaults_and_max_len():
    p = get_loss_spec("dapo").parse(None, max_len_default=512)
    assert (p.clip_eps_low, p.clip_eps_high, p.beta, p.agg, p.overlong_filter, p.max_len) == \
        (0.2, 0.28, 0.0, "token-mean", True, 512)
    assert get_loss_spec("dapo").parse({"max_len": 64}, max_len_default=512).max_len == 64
    assert get_loss_spec("gspo").parse({}, max_len_default=512) == get_loss_spec("gspo").params()  # no max_len
    assert get_loss_spec("dr_grpo").parse({}).max_len is None  # required only when called


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "gspo", "opmd", "sft", "grpo_lambda"])
def test_param_defaults_are_the_functions(name):
    # one source of truth in practice: the model's defaults equal the function's keyword defaults
    spec = get_loss_spec(name)
    sig = inspect.signature(spec.fn).parameters
    for key, field in spec.params.model_fields.items():
        if key in sig and sig[key].default is not inspect.Parameter.empty:
            assert field.default == sig[key].default, (name, key)
        assert field.description, (name, key)


def test_uses_reference_and_wrong_params():
    assert get_loss_spec("grpo_lambda").uses_reference(get_loss_spec("grpo_lambda").params())  # β = 0.04
    assert not get_loss_spec("grpo").uses_reference(get_loss_spec("grpo").params())
    assert not get_loss_spec("sft").uses_reference(get_loss_spec("sft").params())
    lp = torch.zeros(1, 2, dtype=D)
    with pytest.raises(TypeError, match="GRPOParams"):
        get_loss_spec("grpo").call(lp, lp, t([1.0]), torch.ones(1, 2, dtype=torch.bool), get_loss_spec("sft").params())


def test_dapo_overlong_filter_switch():
    # rows of one token, ratio 1, A = 1 and 3; row 1 truncated
    spec = get_loss_spec("dapo")
    lp = torch.zeros(2, 1, dtype=D)
    mask, adv, trunc = torch.ones(2, 1, dtype=torch.bool), t([1.0, 3.0]), torch.tensor([False, True])
    on, off = spec.parse({}), spec.parse({"overlong_filter": False})
    # on: row 1 dropped -> −1/1 = −1;  off: (−1 − 3)/2 = −2
    assert spec.call(lp, lp, adv, mask, on, truncated=trunc).loss.item() == -1.0
    assert spec.call(lp, lp, adv, mask, off, truncated=trunc).loss.item() == -2.0
    assert spec.normaliser(mask, on, truncated=trunc) == 1.0
    assert spec.normaliser(mask, off, truncated=trunc) == 2.0
    assert torch.equal(spec.effective_mask(mask, on, truncated=trunc), torch.tensor([[True], [False]]))


def test_normaliser_per_aggregation():
    # rows: 2 tokens, 0 tokens, 3 tokens
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    grpo = get_loss_spec("grpo")
    assert grpo.normaliser(mask, grpo.parse({"agg": "token-mean"})) == 5.0  # 2 + 0 + 3 tokens
    assert grpo.normaliser(mask, grpo.parse({})) == 2.0  # seq-mean-token-mean: 2 rows with tokens
    assert grpo.normaliser(mask, grpo.parse({"agg": "seq-mean-token-sum-norm"})) == 3.0  # every row
    assert get_loss_spec("dr_grpo").normaliser(mask, get_loss_spec("dr_grpo").parse({})) == 3.0
    assert get_loss_spec("gspo").normaliser(mask, get_loss_spec("gspo").parse({})) == 2.0


def test_register_plugin_loss(monkeypatch):
    loss_names()  # the built-ins loaded, then a copy of the registry that the test may change
    monkeypatch.setattr(registry.SPECS, "_items", dict(registry.SPECS._items))

    def toy_loss(logprobs, old_logprobs, advantages, mask, *, scale: float = 2.0, agg="token-mean"):
        return get_loss("sft")(logprobs * scale, None, None, mask, agg=agg)

    assert register_loss("toy", toy_loss) is toy_loss
    assert register_loss("toy", toy_loss) is toy_loss  # the same registration again: a no-op
    assert "toy" in loss_names() and LOSSES["toy"] is toy_loss
    spec = get_loss_spec("toy")
    assert spec.parse({"scale": 3.0}).scale == 3.0
    with pytest.raises(ValueError, match="not a parameter of loss toy"):
        spec.parse({"beta": 0.1})
    with pytest.raises(ValueError, match="already registered"):
        register_loss("toy", get_loss("sft"))

    def no_agg(logprobs, old_logprobs, advantages, mask, *, c: float = 1.0):
        return get_loss("sft")(logprobs, None, None, mask)

    with pytest.raises(ValueError, match="how it aggregates"):
        register_loss("no_agg", no_agg)
    register_loss("no_agg", no_agg, agg="token-mean")
    with pytest.raises(ValueError, match="not arguments"):
        LossSpec("bad", no_agg, get_loss_spec("grpo").params)


# ---------------------------------------------------------------- micro-batch accumulation


def accumulate(spec, params, logprobs, old, adv, mask, truncated, ref, micro_batch_size):
    """Gradient accumulation as the learner does it: contiguous micro-batches, each loss weighted
    by ``N(mb) / N(full)``, backward per micro-batch. Returns ``(summed loss, grad)``."""
    B = mask.shape[0]
    slices = [slice(i, min(i + micro_batch_size, B)) for i in range(0, B, micro_batch_size)]
    weights = micro_batch_weights(spec, params, mask, truncated, slices)
    lp = logprobs.detach().clone().requires_grad_()
    total = 0.0
    for sl, w in zip(slices, weights):
        out = spec.call(lp[sl], old[sl], adv[sl], mask[sl], params,
                        ref_logprobs=None if ref is None else ref[sl], truncated=truncated[sl])
        (out.loss * w).backward()
        total += w * out.loss.item()
    return total, lp.grad


def full_batch(spec, params, logprobs, old, adv, mask, truncated, ref):
    lp = logprobs.detach().clone().requires_grad_()
    out = spec.call(lp, old, adv, mask, params, ref_logprobs=ref, truncated=truncated)
    out.loss.backward()
    return out.loss.item(), lp.grad


def test_dapo_token_mean_overlong_filter_by_hand():
    # 4 rows × 2 tokens, row 0 truncated, ratio 1, A = 1, micro-batches {0, 1}, {2, 3}.
    # DAPO token-mean over the 6 kept tokens: loss = Σ −ρ·A / 6, so d loss/d logprob = −A·ρ/6 = −1/6
    # on each kept token, 0 on row 0.
    #   weights N(mb)/N(full): mb 0 keeps row 1's 2 tokens -> 2/6; mb 1 keeps 4 -> 4/6;
    #   mb 0's token-mean divides by 2, mb 1's by 4: 2/6 · 1/2 = 1/6 = 4/6 · 1/4.
    # The old learner weighted by unfiltered tokens (4/8 each): 0.5 · 1/2 = 0.25 on row 1,
    # 0.5 · 1/4 = 0.125 on rows 2 and 3.
    spec = get_loss_spec("dapo")
    params = spec.parse({})
    lp, adv = torch.zeros(4, 2, dtype=D), torch.ones(4, dtype=D)
    mask, trunc = torch.ones(4, 2, dtype=torch.bool), torch.tensor([True, False, False, False])
    assert micro_batch_weights(spec, params, mask, trunc, [slice(0, 2), slice(2, 4)]) == [2 / 6, 4 / 6]
    loss, grad = accumulate(spec, params, lp, lp, adv, mask, trunc, None, 2)
    expected = t([[0.0, 0.0]] + [[-1 / 6, -1 / 6]] * 3)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(full_batch(spec, params, lp, lp, adv, mask, trunc, None)[1], expected, rtol=0, atol=1e-15)
    assert loss == pytest.approx(-1.0)  # (−1 · 6)/6
    # the old weighting, for the record
    old_grad = torch.zeros(4, 2, dtype=D)
    for sl in (slice(0, 2), slice(2, 4)):
        x = lp[sl].clone().requires_grad_()
        (spec.call(x, lp[sl], adv[sl], mask[sl], params, truncated=trunc[sl]).loss * (4 / 8)).backward()
        old_grad[sl] = x.grad
    torch.testing.assert_close(old_grad, t([[0.0, 0.0], [-0.25, -0.25], [-0.125, -0.125], [-0.125, -0.125]]))


def test_dr_grpo_empty_row_by_hand():
    # 4 rows of 1 token, row 3 has no loss token, L_max = 1, ratio 1, A = 1: row sums −1, −1, −1, 0.
    # Dr.GRPO averages S_i / L_max over all 4 rows: (−1 − 1 − 1 + 0)/(1 · 4) = −0.75.
    # Micro-batches {0, 1}, {2, 3}: losses −2/2 = −1 and (−1 + 0)/2 = −0.5.
    #   right (N = rows, 2/4 each):                 0.5 · (−1) + 0.5 · (−0.5)   = −0.75
    #   old (N = rows with tokens, 2/3 and 1/3):   2/3 · (−1) + 1/3 · (−0.5)   = −5/6 = −0.8333
    spec = get_loss_spec("dr_grpo")
    params = spec.parse({"max_len": 1})
    lp, adv = torch.zeros(4, 1, dtype=D), torch.ones(4, dtype=D)
    mask, trunc = torch.tensor([[True], [True], [True], [False]]), torch.zeros(4, dtype=torch.bool)
    full, _ = full_batch(spec, params, lp, lp, adv, mask, trunc, None)
    assert full == pytest.approx(-0.75)
    assert micro_batch_weights(spec, params, mask, trunc, [slice(0, 2), slice(2, 4)]) == [0.5, 0.5]
    loss, grad = accumulate(spec, params, lp, lp, adv, mask, trunc, None, 2)
    assert loss == pytest.approx(-0.75)
    # d/d logprob of each token: −A·ρ/(L_max · 4) = −0.25; the empty row 0
    torch.testing.assert_close(grad, t([[-0.25], [-0.25], [-0.25], [0.0]]), rtol=0, atol=1e-15)
    parts = [spec.call(lp[sl], lp[sl], adv[sl], mask[sl], params).loss.item() for sl in (slice(0, 2), slice(2, 4))]
    assert parts == [-1.0, -0.5]
    assert 2 / 3 * parts[0] + 1 / 3 * parts[1] == pytest.approx(-5 / 6)  # the old weighting


def _step_batch():
    """B = 7, T = 5 rows as the learner sees them after dropping a NULL-reward row.

    Two groups: a = [1.0, 0.5, NULL, 0.0, 0.25], b = [0.8, 0.2, 0.6]; advantages from
    ``group_advantages`` (non-binary, the NULL left out), then the NULL row removed.
    """
    rewards = t([1.0, 0.5, NULL, 0.0, 0.25, 0.8, 0.2, 0.6])
    adv = group_advantages(rewards, ["a"] * 5 + ["b"] * 3)
    keep = ~torch.isnan(rewards)
    adv = adv[keep]  # [7]
    assert adv.shape == (7,) and torch.isfinite(adv).all() and (adv != 0).sum() == 7
    B, T = 7, 5
    lengths = torch.tensor([5, 3, 0, 2, 4, 1, 5])  # row 2 has no loss token
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [B, T]
    truncated = torch.tensor([False, False, False, False, False, False, True])  # row 6 hit max_len
    g = torch.Generator().manual_seed(3)
    logprobs = -torch.rand(B, T, generator=g, dtype=D) * 2  # [B, T]
    old = logprobs + 0.3 * torch.randn(B, T, generator=g, dtype=D)  # ratios e^{±0.3}: some clipped
    ref = logprobs + 0.5 * torch.randn(B, T, generator=g, dtype=D)
    return logprobs, old, adv, mask, truncated, ref


def _grid():
    """(loss, raw params) for every registered loss × each agg it takes × overlong filter on/off ×
    β = 0 and 0.1 (where it has β); GSPO also with wide clips (the defaults clip nearly every row)."""
    cases = []
    for name in loss_names():
        spec = get_loss_spec(name)
        fields = spec.params.model_fields
        axes = [
            [{"agg": a} for a in AGG_MODES] if "agg" in fields else [{}],
            [{spec.overlong_filter: on} for on in (True, False)] if spec.overlong_filter else [{}],
            [{"beta": 0.0}, {"beta": 0.1}] if "beta" in fields else [{}],
            [{}, {"clip_eps_low": 0.2, "clip_eps_high": 0.2}] if name == "gspo" else [{}],
        ]
        for parts in itertools.product(*axes):
            raw = {k: v for p in parts for k, v in p.items()}
            cases.append(pytest.param(name, raw, id=f"{name}-" + "-".join(f"{k}={v}" for k, v in raw.items())))
    return cases


@pytest.mark.parametrize("micro_batch_size", [1, 3, 7])
@pytest.mark.parametrize("name,raw", _grid())
def test_micro_batches_reproduce_the_full_batch(name, raw, micro_batch_size):
    spec = get_loss_spec(name)
    params = spec.parse(raw, max_len_default=5)
    logprobs, old, adv, mask, truncated, ref = _step_batch()
    ref = ref if spec.uses_reference(params) else None
    full_loss, full_grad = full_batch(spec, params, logprobs, old, adv, mask, truncated, ref)
    loss, grad = accumulate(spec, params, logprobs, old, adv, mask, truncated, ref, micro_batch_size)
    assert full_grad.abs().sum() > 0  # a test of something
    assert loss == pytest.approx(full_loss, abs=1e-6)
    torch.testing.assert_close(grad, full_grad, rtol=0, atol=1e-6)
    assert sum(micro_batch_weights(spec, params, mask, truncated, [slice(0, 7)])) == 1.0


# ---------------------------------------------------------------- the learner's step: NULL rewards in Dr.GRPO


class _Rows:
    """The part of a Batch that PolicyUpdate.optimize reads: row i's input id is i."""

    def __init__(self, mask, truncated, valid, ids=None):
        self.response_mask, self.truncated, self.valid = mask, truncated, valid
        self.ids = torch.arange(mask.shape[0]) if ids is None else ids
        self.size = mask.shape[0]
        self.input_ids = self.ids[:, None]
        self.attention_mask = self.prompt_lengths = self.response_lengths = self.ids

    def rows(self, sl):
        return _Rows(self.response_mask[sl], self.truncated[sl], self.valid[sl], self.ids[sl])


class _Engine:
    """A 'model' whose token log-probs are one parameter per token: the gradient is read off it."""

    device = "cpu"

    def __init__(self, theta):
        self.theta = theta.clone().requires_grad_(True)
        self.boundaries: list[bool] = []
        self.ds = SimpleNamespace(set_gradient_accumulation_boundary=self.boundaries.append)

    def token_logprobs(self, input_ids, attention_mask, prompt_lengths, response_lengths, *, temperature,
                       with_entropy):
        return self.theta[input_ids[:, 0]], torch.zeros(input_ids.shape[0], self.theta.shape[1], dtype=D)

    def backward(self, loss):
        loss.backward()

    def step(self):
        return 0.0


@pytest.mark.parametrize("micro,max_tokens", [(1, None), (4, None), (5, None), (12, 20), (4, 9)])
def test_dr_grpo_null_rewards_count_in_its_constant_normaliser(micro, max_tokens):
    """12 rows of 2 tokens, rows 3 and 8 with a NULL reward (A = 0), row 5 with an empty mask,
    L_max = 2, ratio 1, one step in
    ``micro`` micro-batches. Dr.GRPO's loss is 1/B Σ_b (Σ_t −ρ·A_b)/L_max with B = 12, every row:
    d loss/d logprob = −A_b/(L_max · B) = −A_b/24 on each token of row b, 0 on the NULL rows.
    Before: the default term took the 10 rows with a reward, B = 10, and the gradient was exactly
    12/10 of that (−A_b/20).

    ``max_tokens``: the token budget cuts the micro-batches further (row i is 2i tokens long
    here, so (12, 20) makes slices of 4, 2, 2, 1, 1, 1, 1 rows): the same gradient, and
    DeepSpeed told that only the last pass ends the step."""
    from reflexdb.trainer.method_api.base import LossTerm
    from reflexdb.trainer.update import PolicyUpdate

    B, T = 12, 2
    rewards = t([1.0, 0.0, 0.5, NULL, 0.25, 1.0, 0.0, 0.75, NULL, 0.0, 1.0, 0.5])  # non-binary, two NULL
    valid = ~torch.isnan(rewards)
    adv = group_advantages(rewards, [0] * 6 + [1] * 6, valid=valid)
    assert adv[3] == 0 and adv[8] == 0
    spec = get_loss_spec("dr_grpo")
    params = spec.parse({"max_len": T})
    term = LossTerm("policy", "dr_grpo", params)
    mask, truncated = torch.ones(B, T, dtype=torch.bool), torch.zeros(B, dtype=torch.bool)
    mask[5] = False  # an empty mask: no loss token, still one of the B rows
    batch = _Rows(mask, truncated, valid)
    engine = _Engine(torch.zeros(B, T, dtype=D))
    update = PolicyUpdate(engine, [term], [spec], ref=None, rank=0, world=1, n_micro=math.ceil(B / micro), lr=1.0,
                          pi_old="recompute", temperature=1.0, max_tokens=max_tokens)
    rows = update.term_rows(batch)
    assert rows[0].all()  # the NULL rows too: they are among the B rows
    stats, _, _ = update.optimize(batch, torch.zeros(B, T, dtype=D), None, adv, full=batch, rows=rows,
                                  mine=slice(0, B), fresh=torch.ones(B, dtype=torch.bool))
    expected = (-adv / (T * B))[:, None].expand(B, T).clone()
    expected[5] = 0.0
    torch.testing.assert_close(engine.theta.grad, expected, rtol=0, atol=1e-12)
    assert engine.boundaries[-1] and not any(engine.boundaries[:-1])
    assert len(engine.boundaries) >= math.ceil(B / micro)
    # and the loss as recorded: −Σ_{b≠5} A_b · T / (T · B) = −(Σ A − A_5) / 12 (row 5 has no token)
    assert stats["loss"] == pytest.approx(float(-(adv.sum() - adv[5]) / B), abs=1e-12)
    # the rows before (the 10 with a reward): the gradient was exactly 12/10 of the full batch's
    before = _Engine(torch.zeros(B, T, dtype=D))
    update.engine = before
    update.optimize(batch, torch.zeros(B, T, dtype=D), None, adv, full=batch, rows=[valid], mine=slice(0, B),
                    fresh=torch.ones(B, dtype=torch.bool))
    torch.testing.assert_close(before.theta.grad, expected * 12 / 10, rtol=0, atol=1e-12)
