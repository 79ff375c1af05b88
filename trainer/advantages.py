"""Group-relative advantages and advantage transforms (METHODS.md §0, §1, §4).

Group normalisation (GRPO outcome supervision, DeepSeekMath Sec. 4.1.2; METHODS.md §0)::

    A_i = (r_i − mean(r)) / (std(r) + 1e-6)       scale="group"
    A_i =  r_i − mean(r)                          scale="none"  (Dr.GRPO)

``std`` is the **sample** standard deviation (Bessel's correction, divisor G − 1). That is what the
reference implementations compute: TRL's ``GRPOTrainer`` (``rewards.view(-1, G).std(dim=1)``) —
which OpenR1, the GRPO-λ authors' code base, uses — and verl's ``compute_grpo_outcome_advantage``
(``torch.std``), both with torch's default ``correction=1``. With G = 8 the two conventions differ
by a factor sqrt(8/7) ≈ 1.069 in |A|. A group of one has no spread and no baseline: its advantage
is 0 here (verl instead uses mean 0, std 1, i.e. A = r; TRL's std would be NaN).

Exactness. The statistics are computed in float64, and a group whose rewards are all equal gets
advantage **exactly** 0: its centred values are set to 0 where the group's max equals its min.
Without that, float32 turns eight rewards of 0.7 into A = 0.056 each (0.106 at G = 16): the
rounding error of ``r − mean`` (~1e-8) divided by ``std + 1e-6`` (~1e-6). Float64 alone still
leaves ~1e-10.

Missing rewards. A row whose reward is NULL (the reward function raised) is *invalid*: it is left
out of its group's mean, std and count, and its advantage is exactly 0. Pass ``valid [B]`` or put
NaN in its reward (both are understood). ``G`` in the formulas is the number of valid rows; a group
with fewer than two valid rows gets 0.

Transforms ``(rewards [B], advantages [B], group_index [B]) -> advantages [B]`` run after the
normalisation, in order (``apply_advantage_transforms``). ``group_index`` holds dense group numbers
``0..n_groups−1``. Registered: ``positive_amplification`` (R3L Eq. 11) and ``clamp_negative``
(GRPO-λ's ``max(A, −0.1)``). Bind their hyperparameters with ``make_transform(name, **params)``.

Stages. ``advantage_stages`` gives the advantages after every stage, named: ``group`` (the
normalisation), then each transform by its registered name (``transform_name``). The learner
records them with its step (``learner_steps.advantage_stages``, ``consumption.advantages``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Hashable, Literal, Sequence

import torch

from reflexdb.plugins import ADVANTAGE_TRANSFORMS

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor

AdvantageScale = Literal["group", "none"]
AdvantageTransform = Callable[["Tensor", "Tensor", "Tensor"], "Tensor"]


def group_index(group_ids: Tensor | Sequence[Hashable]) -> tuple[Tensor, int]:
    """Dense group numbers for arbitrary group labels.

    Args:
        group_ids: ``[B]`` integer tensor, or a sequence of hashable labels (task ids, UUIDs).

    Returns:
        ``(index [B] int64 in 0..n−1, n)``, numbered in order of first appearance for sequences,
        in sorted label order for tensors.
    """
    if isinstance(group_ids, torch.Tensor):
        _, index = torch.unique(group_ids, return_inverse=True)
        return index.reshape(-1), int(index.max().item()) + 1 if index.numel() else 0
    numbers: dict[Hashable, int] = {}
    index = torch.tensor([numbers.setdefault(g, len(numbers)) for g in group_ids], dtype=torch.long)
    return index, len(numbers)


def _flatten(rewards: Tensor, group_ids: Tensor | Sequence[Hashable] | None) -> tuple[Tensor, Tensor, int]:
    """``rewards [N_groups, G]`` (rows are groups) or ``rewards [B]`` with ``group_ids`` -> flat form."""
    if rewards.dim() == 2:
        if group_ids is not None:
            raise ValueError("rewards [N_groups, G] carry their groups in the rows; pass group_ids=None")
        n, g = rewards.shape
        index = torch.arange(n, device=rewards.device).repeat_interleave(g)
        return rewards.reshape(-1), index, n
    if rewards.dim() != 1 or group_ids is None:
        raise ValueError("pass rewards [N_groups, G], or rewards [B] with group_ids [B]")
    index, n = group_index(group_ids)
    if index.shape[0] != rewards.shape[0]:
        raise ValueError(f"{rewards.shape[0]} rewards but {index.shape[0]} group ids")
    return rewards, index.to(rewards.device), n


def _group_sum(values: Tensor, index: Tensor, n: int) -> Tensor:
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, index, values)  # [n]


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable] | None = None,
    *,
    scale: AdvantageScale = "group",
    eps: float = 1e-6,
    valid: Tensor | None = None,
) -> Tensor:
    """Group-relative advantages for many groups at once (no Python loop over groups).

    Args:
        rewards: ``[N_groups, G]`` (one group per row), or ``[B]`` with ``group_ids``. NaN marks a
            missing reward (as ``valid`` False does).
        group_ids: ``[B]`` group labels for flat rewards (any order, groups of any size).
        scale: ``group`` divides by ``std + eps`` (GRPO); ``none`` only centres (Dr.GRPO).
        eps: added to the std (1e-6).
        valid: bool, same shape as ``rewards``; False where the reward is NULL. Invalid rows are
            left out of their group's statistics and get 0. ``None``: every non-NaN reward is valid.

    Returns:
        Advantages with the shape of ``rewards``, in its dtype when floating (float32 otherwise),
        computed in float64. Exactly 0 for invalid rows, for groups with fewer than two valid rows
        and for groups whose valid rewards are all equal.
    """
    if scale not in ("group", "none"):
        raise ValueError(f"scale must be 'group' or 'none', got {scale!r}")
    shape = rewards.shape
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r, index, n = _flatten(rewards.to(torch.float64), group_ids)  # [B] float64
    ok = ~torch.isnan(r)  # [B]  a NaN reward is a missing one
    if valid is not None:
        if valid.numel() != r.numel():
            raise ValueError(f"{r.numel()} rewards but {valid.numel()} valid flags")
        ok &= valid.reshape(-1).to(device=r.device, dtype=torch.bool)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    r = torch.where(ok, r, zero)  # [B]  invalid rows add nothing to the sums below
    counts = _group_sum(ok.to(r.dtype), index, n)  # [n]  G: valid rows per group
    mean = _group_sum(r, index, n) / counts.clamp(min=1)  # [n]  mean(r) over valid rows
    r_max = _group_extreme(torch.where(ok, r, -torch.inf), index, n, "amax")  # [n]
    r_min = _group_extreme(torch.where(ok, r, torch.inf), index, n, "amin")  # [n]
    flat = (r_max == r_min)[index]  # [B]  all valid rewards equal (a group of one included)
    centred = torch.where(ok & ~flat, r - mean[index], zero)  # [B]  r_i − mean(r); exactly 0 when flat
    if scale == "none":
        adv = centred  # [B]  Dr.GRPO: r_i − mean(r), no std
    else:
        var = _group_sum(centred**2, index, n) / (counts - 1).clamp(min=1)  # [n]  sample variance (G − 1)
        adv = centred / (var.sqrt()[index] + eps)  # [B]  DeepSeekMath Sec. 4.1.2: (r_i − mean) / (std + 1e-6)
    return adv.to(out_dtype).reshape(shape)


def _group_extreme(values: Tensor, index: Tensor, n: int, reduce: str) -> Tensor:
    """Per-group max (``amax``) or min (``amin``) of ``values [B]``; ±inf for a group with no rows."""
    fill = -torch.inf if reduce == "amax" else torch.inf
    out = torch.full((n,), fill, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, index, values, reduce=reduce, include_self=True)  # [n]


def register_advantage_transform(name: str) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator: register ``fn(rewards, advantages, group_index, **params) -> advantages``."""

    return ADVANTAGE_TRANSFORMS.register(name)


def make_transform(name: str, **params: object) -> AdvantageTransform:
    """The registered transform ``name`` with its hyperparameters bound (from the config)."""
    fn = ADVANTAGE_TRANSFORMS.get(name)  # UnknownName (a KeyError) lists the known ones
    transform = functools.partial(fn, **params)
    transform.transform_name = name  # the stage's name in a step's record (transform_name)
    return transform


def transform_name(transform: AdvantageTransform) -> str:
    """The name ``transform`` is registered under: ``make_transform``'s name, else the registry's
    name of the function (a ``functools.partial`` of it too), else the callable's own ``__name__``."""
    name = getattr(transform, "transform_name", None)
    if name:
        return str(name)
    fn = getattr(transform, "func", transform)  # functools.partial: the function it binds
    for registered, obj in ADVANTAGE_TRANSFORMS.items():
        if obj is fn:
            return registered
    return getattr(fn, "__name__", type(fn).__name__)


def _transform_chain(
    rewards: Tensor,
    advantages: Tensor,
    group_ids: Tensor | Sequence[Hashable] | None,
    transforms: Sequence[AdvantageTransform],
    valid: Tensor | None,
) -> list[Tensor]:
    """``[advantages, after transforms[0], after transforms[1], ...]``, each with invalid rows set to
    exactly 0 (each transform itself receives the previous one's output as it came)."""
    shape = advantages.shape
    r, index, _ = _flatten(rewards if rewards.is_floating_point() else rewards.float(), group_ids)
    ok = ~torch.isnan(r)  # [B]
    if valid is not None:
        ok &= valid.reshape(-1).to(device=r.device, dtype=torch.bool)
    r = torch.where(ok, r, torch.full((), torch.nan, dtype=r.dtype, device=r.device))
    adv = advantages.reshape(-1)
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    out = [torch.where(ok, adv, zero).reshape(shape)]
    for transform in transforms:
        adv = transform(r, adv, index)
        out.append(torch.where(ok, adv, zero.to(adv.dtype)).reshape(shape))
    return out


def apply_advantage_transforms(
    rewards: Tensor,
    advantages: Tensor,
    group_ids: Tensor | Sequence[Hashable] | None,
    transforms: Sequence[AdvantageTransform],
    *,
    valid: Tensor | None = None,
) -> Tensor:
    """Run ``transforms`` in order on advantages of the same layout as ``group_advantages``.

    Args:
        rewards: ``[N_groups, G]`` or ``[B]`` (with ``group_ids``); NaN marks a missing reward.
        advantages: same shape as ``rewards``.
        group_ids: as in ``group_advantages``.
        transforms: callables ``(rewards [B], advantages [B], group_index [B]) -> advantages [B]``.
        valid: as in ``group_advantages``. Invalid rows reach the transforms with a NaN reward
            (group statistics skip it) and leave with advantage exactly 0.
    """
    return _transform_chain(rewards, advantages, group_ids, transforms, valid)[-1]


def advantage_stages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable] | None,
    transforms: Sequence[AdvantageTransform] = (),
    *,
    scale: AdvantageScale = "group",
    eps: float = 1e-6,
    valid: Tensor | None = None,
) -> list[tuple[str, Tensor]]:
    """The advantages after every stage: ``group_advantages``, then each of ``transforms`` in order.

    Args:
        rewards, group_ids, scale, eps, valid: as in ``group_advantages``.
        transforms: as in ``apply_advantage_transforms``.

    Returns:
        ``[("group", A), (transform_name(t), Â), ...]``, each with the shape of ``rewards`` and
        exactly 0 for invalid rows. The last is what ``apply_advantage_transforms`` returns (the
        advantages the loss uses); ``group`` is named so whatever ``scale`` is.
    """
    adv = group_advantages(rewards, group_ids, scale=scale, eps=eps, valid=valid)
    if not transforms:
        return [("group", adv)]
    after = _transform_chain(rewards, adv, group_ids, transforms, valid)[1:]
    return [("group", adv), *((transform_name(t), a) for t, a in zip(transforms, after))]


@register_advantage_transform("positive_amplification")
def positive_amplification(
    rewards: Tensor,
    advantages: Tensor,
    group_index: Tensor,
    *,
    alpha: float = 3.0,
    max_reward: float = 1.0,
    max_reward_advantage: float | Literal["alpha"] = "alpha",
) -> Tensor:
    """R3L positive amplification (R3L.md Eq. 11; METHODS.md §1)::

        Â = max_reward_advantage   if r ≥ R_max   (R_max: the maximum attainable reward)
        Â = α · A                  elif A > 0
        Â = A                      otherwise

    Two readings are settled here (docs/r3l.md). ``R_max`` is the maximum *attainable* reward
    (``max_reward``, 1.0 by default, as the authors' code tests ``r ≥ 1``), not the group's
    maximum: with the group's, every failure of an all-failed group would be promoted to Â = α.
    The value at ``R_max`` is α in the paper's Eq. 11 (``"alpha"``, the default) and 1.0 in the
    authors' code (pass ``1.0``).

    Args:
        rewards, advantages, group_index: ``[B]``; a NaN reward (missing) never reaches ``R_max``.
        alpha: α (3.0 in the paper).
        max_reward: R_max.
        max_reward_advantage: ``"alpha"`` or a number.
    """
    at_max = rewards >= max_reward  # [B]  NaN >= x is False
    top = alpha if max_reward_advantage == "alpha" else float(max_reward_advantage)
    amplified = torch.where(advantages > 0, alpha * advantages, advantages)  # Eq. 11 rows 2–3
    return torch.where(at_max, torch.full_like(advantages, top), amplified)  # Eq. 11 row 1


@register_advantage_transform("clamp_negative")
def clamp_negative(
    rewards: Tensor,
    advantages: Tensor,
    group_index: Tensor,
    *,
    min_advantage: float = -0.1,
) -> Tensor:
    """GRPO-λ's negative-advantage clamp ``Â = max(A, −0.1)`` (GRPO-lambda.md Sec. 4.2, Algorithm 1).

    ``grpo_lambda_loss`` applies the same clamp itself (``min_advantage``); applying both is
    harmless (the clamp is idempotent). This transform is for using it with other losses.
    """
    return advantages.clamp(min=min_advantage)
