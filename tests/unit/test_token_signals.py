"""Per-token learner signals (trainer/losses/signals.py): what each loss family's loss used at each
token, with hand-computed numbers, and the same numbers the loss's own statistics report."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reflexdb.records import TokenSignals as Row
from reflexdb.store import signal_arrays, signal_bytes
from reflexdb.trainer.losses import get_loss_spec
from reflexdb.trainer.losses.signals import TokenSignals, token_signals
from reflexdb.trainer.update import SignalRecorder, StepSignals, signal_rows

NAN = float("nan")
ln = math.log


def _spec(name: str, **params):
    spec = get_loss_spec(name)
    return spec, spec.parse(params, max_len_default=8)


def _same(got: torch.Tensor, want: list, abs: float = 1e-6) -> None:
    """Equal, NaN where ``want`` has NaN."""
    got = got.double()
    want_t = torch.tensor(want, dtype=torch.float64)
    assert torch.equal(torch.isnan(got), torch.isnan(want_t)), (got, want)
    keep = ~torch.isnan(want_t)
    assert torch.allclose(got[keep], want_t[keep], atol=abs), (got, want)


# Two rows, old log-probs 0 (π_old = 1 for the arithmetic), ε = 0.2:
#   row 0: A = 1,  ρ = [1.5, 0.9, 0.5, -] (the 4th token is out of the mask)
#   row 1: A = -2, ρ = [1.5, 0.5, -, -]
LOGPROBS = torch.tensor([[ln(1.5), ln(0.9), ln(0.5), 0.0], [ln(1.5), ln(0.5), 0.0, 0.0]])
OLD = torch.zeros(2, 4)
ADV = torch.tensor([1.0, -2.0])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize("family", ["grpo", "dr_grpo", "dapo"])
def test_the_token_surrogates_signals(family):
    spec, params = _spec(family, clip_eps_high=0.2)
    sig = spec.token_signals(LOGPROBS, OLD, ADV, MASK, params)
    # advantage: A_i on each loss token, none (NaN) off the mask
    _same(sig.advantage, [[1, 1, 1, NAN], [-2, -2, NAN, NAN]])
    # log-ratio: log ρ − 0: ln 1.5 = 0.405465, ln 0.9 = −0.105361, ln 0.5 = −0.693147
    _same(sig.log_ratio, [[0.405465, -0.105361, -0.693147, NAN], [0.405465, -0.693147, NAN, NAN]])
    # clipped where clip(ρ)·A < ρ·A (the clipped branch is the smaller objective):
    #   row 0 (A = 1):  1.5 → 1.2·1 = 1.2 < 1.5 yes; 0.9 inside; 0.5 → 0.8 > 0.5 no
    #   row 1 (A = −2): 1.5 → 1.2·−2 = −2.4 > −3 no; 0.5 → 0.8·−2 = −1.6 < −1.0 yes
    assert sig.clipped.tolist() == [[True, False, False, False], [False, True, False, False]]
    # the loss's own statistics agree: 2 clipped of 5 loss tokens; ratio mean (1.5+0.9+0.5+1.5+0.5)/5 = 0.98
    out = spec.call(LOGPROBS, OLD, ADV, MASK, params)
    assert float(out.clip_frac) == pytest.approx(float(sig.clipped.sum()) / 5) == pytest.approx(0.4)
    assert float(out.ratio_mean) == pytest.approx(float(sig.log_ratio[MASK].exp().mean())) == pytest.approx(0.98)


def test_dapo_overlong_filter_leaves_a_truncated_row_without_signals():
    spec, params = _spec("dapo", clip_eps_high=0.2)
    sig = spec.token_signals(LOGPROBS, OLD, ADV, MASK, params, truncated=torch.tensor([False, True]))
    _same(sig.advantage, [[1, 1, 1, NAN], [NAN] * 4])  # row 1 truncated: no loss token (Sec. 3.4)
    _same(sig.log_ratio[1], [NAN] * 4)
    assert sig.clipped[1].tolist() == [False] * 4
    off = spec.token_signals(LOGPROBS, OLD, ADV, MASK, spec.parse({"overlong_filter": False}),
                             truncated=torch.tensor([False, True]))
    _same(off.advantage[1], [-2, -2, NAN, NAN])  # the filter off: the row keeps its tokens


def test_gspo_records_the_sequence_ratio_on_each_token():
    spec, params = _spec("gspo")  # ε_low = 3e-4, ε_high = 4e-4
    logprobs = torch.tensor([[0.1, 0.3, 0.0], [1e-4, -1e-4, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    sig = spec.token_signals(logprobs, torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask, params)
    # log s_i = mean of the row's log-ratios: (0.1 + 0.3)/2 = 0.2; (1e-4 − 1e-4)/2 = 0
    _same(sig.log_ratio, [[0.2, 0.2, NAN], [0.0, 0.0, NAN]])
    # s_0 = e^0.2 = 1.2214 > 1 + 4e-4 with A > 0: clipped, on both tokens; s_1 = 1: not
    assert sig.clipped.tolist() == [[True, True, False], [False, False, False]]
    _same(sig.advantage, [[1, 1, NAN], [1, 1, NAN]])
    out = spec.call(logprobs, torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask, params)
    assert float(out.clip_frac) == pytest.approx(0.5)  # 1 of 2 sequences, as recorded


def test_opmd_has_no_clip_and_sft_no_advantage():
    spec, params = _spec("opmd")
    sig = spec.token_signals(LOGPROBS, OLD, ADV, MASK, params)
    _same(sig.advantage, [[1, 1, 1, NAN], [-2, -2, NAN, NAN]])
    _same(sig.log_ratio[0], [0.405465, -0.105361, -0.693147, NAN])  # the ratio approx_kl reads; the loss has none
    assert not sig.clipped.any()  # no ratio clip: never clipped
    spec, params = _spec("sft")
    sig = spec.token_signals(LOGPROBS, OLD, ADV, MASK, params)
    assert torch.isnan(sig.advantage).all() and torch.isnan(sig.log_ratio).all() and not sig.clipped.any()


def test_grpo_lambda_trace_records_the_traced_ratio_and_the_clamped_advantage():
    # c = γλ = 0.5; d = [0.1, 0.15]: S_0 = 0.1, S_1 = 0.15 + 0.5·0.1 = 0.2 (Eq. 1)
    # ρ = e^S = [1.1052, 1.2214]; row 0 A = 1: only ρ_1 > 1.2 is clipped
    # row 1 A = −0.5 → Â = max(−0.5, −0.1) = −0.1 (Alg. 1); ρ > 1 with Â < 0: the unclipped branch is smaller
    spec, params = _spec("grpo_lambda", lam=0.5, beta=0.0)
    logprobs = torch.tensor([[0.1, 0.15], [0.1, 0.15]])
    sig = spec.token_signals(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -0.5]), torch.ones(2, 2, dtype=torch.bool),
                             params)
    _same(sig.log_ratio, [[0.1, 0.2], [0.1, 0.2]])
    _same(sig.advantage, [[1.0, 1.0], [-0.1, -0.1]])
    assert sig.clipped.tolist() == [[False, True], [False, False]]
    out = spec.call(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -0.5]), torch.ones(2, 2, dtype=torch.bool), params)
    assert float(out.clip_frac) == pytest.approx(0.25)


def test_grpo_lambda_weight_records_the_weighted_advantage():
    # ε-weight, c = 0.5, log π_θ = [0, 0]: f = 1 + σ(0 − 1) = 1.268941 each
    # w_0 = f_0 = 1.268941; w_1 = f_1 + 0.5·f_0 = 1.903412; Â = 1 → advantage w_t·Â
    # old = [−0.3, 0.3]: r = e^d = [e^0.3 = 1.3499 (clipped, A > 0), e^−0.3 = 0.7408 (0.8·1 > 0.7408: not)]
    spec, params = _spec("grpo_lambda", lam=0.5, beta=0.0, update_style="weight")
    sig = spec.token_signals(torch.zeros(1, 2), torch.tensor([[-0.3, 0.3]]), torch.tensor([1.0]),
                             torch.ones(1, 2, dtype=torch.bool), params)
    _same(sig.advantage, [[1.268941, 1.903412]])
    _same(sig.log_ratio, [[0.3, -0.3]])
    assert sig.clipped.tolist() == [[True, False]]


def test_a_family_without_signals_records_the_advantage_it_was_given():
    spec, params = _spec("lte_shaped")  # LTE's shaped term defines none
    assert spec.signals is None
    sig = spec.token_signals(LOGPROBS, OLD, ADV, MASK, params)
    _same(sig.advantage, [[1, 1, 1, NAN], [-2, -2, NAN, NAN]])
    assert torch.isnan(sig.log_ratio).all() and not sig.clipped.any()


def test_an_empty_mask_gives_no_signal():
    spec, params = _spec("grpo")
    sig = spec.token_signals(LOGPROBS, OLD, ADV, torch.zeros(2, 4, dtype=torch.bool), params)
    assert torch.isnan(sig.advantage).all() and torch.isnan(sig.log_ratio).all() and not sig.clipped.any()


def test_the_recorder_keeps_the_first_terms_values_across_micro_batches():
    """Rows 0-1 in one micro-batch, rows 2-3 in the next; two terms: the second covers row 3's
    tokens and row 1's last token only where the first term left them."""
    rec = SignalRecorder(4, 3, "cpu")
    ones = torch.ones(2, 3, dtype=torch.bool)
    first = token_signals(torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool),
                          advantage=torch.tensor([1.0, 2.0]), log_ratio=torch.zeros(2, 3))
    second = TokenSignals(torch.full((2, 3), 9.0), torch.full((2, 3), 0.5), ones)
    rec.add_entropy(slice(0, 2), torch.tensor([[0.1, 0.2], [0.3, 0.4]]))  # this micro-batch's T is 2
    rec.add(slice(0, 2), torch.tensor([0, 1]), first, torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool))
    rec.add(slice(0, 2), torch.tensor([1]), TokenSignals(*(v[:1] for v in second)), ones[:1])
    rec.add(slice(2, 4), torch.tensor([1]), TokenSignals(*(v[:1] for v in second)), ones[:1])
    out = rec.result()
    _same(out.advantage, [[1, 1, NAN], [2, 2, 9], [NAN] * 3, [9, 9, 9]])
    _same(out.log_ratio, [[0, 0, NAN], [0, 0, 0.5], [NAN] * 3, [0.5, 0.5, 0.5]])
    assert out.clipped.tolist() == [[False] * 3, [False, False, True], [False] * 3, [True] * 3]
    _same(out.entropy[:2], [[0.1, 0.2, NAN], [0.3, 0.4, NAN]])


def test_signal_rows_cut_each_row_to_its_length_and_drop_arrays_without_values():
    from types import SimpleNamespace

    batch = SimpleNamespace(trajectory_ids=[7, 8], response_lengths=torch.tensor([2, 3]),
                            group_index=torch.tensor([0, 1]), group_kinds=["fresh", "fresh"])
    sig = StepSignals(torch.tensor([[0.5, 0.5, NAN], [NAN, NAN, NAN]]), torch.tensor([[0.1, NAN, NAN], [NAN] * 3]),
                      torch.tensor([[True, False, False], [False] * 3]), torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]]))
    (a, aux_a, ra), (b, _, rb) = signal_rows(batch, sig)
    assert (a, b, aux_a) == (7, 8, False)
    assert ra.advantage.tolist() == [0.5, 0.5] and ra.clipped.tolist() == [True, False]
    assert ra.entropy.tolist() == [1.0, 2.0] and len(rb.entropy) == 3
    assert rb.advantage is None and rb.log_ratio is None  # NaN at every token: the loss gave the row none


def test_the_stored_form_is_float16_and_one_byte_a_flag():
    row = Row(advantage=np.array([0.75, NAN, -1e5]), log_ratio=None, clipped=np.array([True, False, True]),
              entropy=np.array([0.1, 2.0, 10.0]))
    adv, ratio, clipped, entropy = signal_bytes(row)
    # 3 tokens: 2 bytes a float16, 1 a flag
    assert (len(adv), ratio, len(clipped), len(entropy)) == (6, None, 3, 6)
    back = signal_arrays((adv, ratio, clipped, entropy))
    # float16 keeps 11 significant bits: 0.1 → 0.0999755859375; past ±65504 → ±inf
    assert back.advantage[0] == 0.75 and math.isnan(back.advantage[1]) and back.advantage[2] == -math.inf
    assert back.entropy[0] == pytest.approx(0.0999755859375, abs=0) and back.log_ratio is None
    assert back.clipped.tolist() == [True, False, True]
