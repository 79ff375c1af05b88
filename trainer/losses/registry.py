"""Loss families by name, each a ``LossSpec``: its function, its typed parameters, and the
normaliser its aggregation divides by. The learner looks its loss up here once; no ``if/elif``
in a step.

    spec = get_loss_spec("dapo")
    params = spec.parse(cfg_dict, max_len_default=512)          # typed, validated, defaults filled
    out = spec.call(logprobs, old_logprobs, advantages, mask, params, ref_logprobs=ref, truncated=trunc)

with ``[B, T]`` logprobs / old_logprobs / mask and ``[B]`` advantages. ``out`` is a NamedTuple whose
first field is ``loss`` (scalar with grad) and whose other fields are detached scalar statistics,
logged as ``loss/<field>``. ``get_loss(name)`` still returns the bare function.

Every family's loss has the form ``loss = S / max(N, 1)``: ``S`` a sum of per-row terms (policy and
KL alike) and ``N = spec.normaliser(mask, params)`` a count that is additive over rows. A step split
into micro-batches therefore reproduces the full batch's loss and gradient exactly when micro-batch
``m`` is weighted by ``N(m) / N(full)`` (``accumulate.micro_batch_weights``):

==========================  ===========================================================
aggregation                 ``N``
==========================  ===========================================================
token-mean                  loss tokens
seq-mean-token-mean         rows with at least one loss token (GSPO: always this)
seq-mean-token-sum-norm     rows, an empty one included (``S`` holds the constant L_max)
==========================  ===========================================================

"Loss tokens" are those left after the family's own filters (``effective_mask``: DAPO's overlong
filter drops truncated rows).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from pydantic import BaseModel, ValidationError, create_model

from reflexdb.plugins import LOSSES as SPECS

from .common import AGG_MODES, as_bool_mask
from .dapo import DAPOParams, dapo_loss, dapo_signals, overlong_filter
from .dr_grpo import DrGRPOParams, dr_grpo_loss
from .grpo import GRPOParams, grpo_loss, grpo_signals
from .gspo import GSPOParams, gspo_loss, gspo_signals
from .opmd import OPMDParams, opmd_loss, opmd_signals
from .params import LossParams
from .sft import SFTParams, sft_loss, sft_signals
from .signals import TokenSignals, given_advantage_signals

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor

LossFn = Callable[..., NamedTuple]

#: Keyword arguments of a loss function that are tensors passed per call, never parameters.
_TENSOR_ARGS = ("ref_logprobs", "truncated")


@dataclass(frozen=True)
class LossSpec:
    """A registered loss family.

    Attributes:
        name: the registry name (``learner.loss``).
        fn: the loss function ``fn(logprobs, old_logprobs, advantages, mask, **params, ref_logprobs=,
            truncated=)``.
        params: the family's typed parameters (a pydantic model, ``extra="forbid"``, every field
            with the function's own default).
        agg: the aggregation of a family without an ``agg`` parameter (Dr.GRPO:
            ``seq-mean-token-sum-norm``; GSPO: ``seq-mean-token-mean``, per sequence); ``None``
            when ``params`` has an ``agg`` field.
        overlong_filter: name of the bool parameter that switches the family's overlong filter on
            (DAPO: ``"overlong_filter"``): with it on, ``truncated`` reaches the function and
            truncated rows carry no loss. A spec-level parameter, not passed to ``fn``.
        signals: what the loss used per token (``signals.TokenSignals``: advantage, log-ratio,
            clipped), ``signals(logprobs, old_logprobs, advantages, mask, **params)`` taking the
            parameters it names (``truncated`` as ``fn`` gets it); ``None``: the advantage the
            loss was given, no ratio, no clip (``signals.given_advantage_signals``).
    """

    name: str
    fn: LossFn
    params: type[BaseModel]
    agg: str | None = None
    overlong_filter: str | None = None
    signals: Callable[..., TokenSignals] | None = None

    def __post_init__(self) -> None:
        fields = self.params.model_fields
        if self.agg is None and "agg" not in fields:
            raise ValueError(f"loss {self.name!r}: its parameters have no 'agg'; say how it aggregates (agg=...)")
        if self.agg is not None and self.agg not in AGG_MODES:
            raise ValueError(f"loss {self.name!r}: unknown aggregation {self.agg!r}; expected one of {AGG_MODES}")
        if self.overlong_filter is not None and self.overlong_filter not in fields:
            raise ValueError(f"loss {self.name!r}: no parameter {self.overlong_filter!r} to switch its overlong filter")
        accepted = inspect.signature(self.fn).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
            missing = sorted(set(self._fn_keys()) - set(accepted))
            if missing:
                raise ValueError(f"loss {self.name!r}: parameters {missing} are not arguments of {self.fn.__name__}")

    # ------------------------------------------------------------------ parameters

    def keys(self) -> list[str]:
        """The family's parameter names, sorted."""
        return sorted(self.params.model_fields)

    def parse(self, raw: Mapping[str, Any] | None, *, max_len_default: int | None = None,
              where: str = "learner.loss_params") -> BaseModel:
        """Validate ``raw`` (e.g. ``learner.loss_params``) into the family's typed parameters.

        Args:
            raw: parameter name -> value; ``None`` or ``{}`` keeps every default.
            max_len_default: fills ``max_len`` when the family has it and ``raw`` leaves it unset
                (the learner passes ``collector.sampling.max_new_tokens``).
            where: the config path named in error messages.

        Raises:
            ValueError: a key the family does not take (the message names it and lists the family's
                keys), or a value of the wrong type or out of range (one line per problem).
        """
        raw = dict(raw or {})
        problems = []
        for key in sorted(set(raw) - set(self.params.model_fields)):
            note = f"; its aggregation is always {self.agg}" if key == "agg" and self.agg else ""
            problems.append(f"{where}.{key}: not a parameter of loss {self.name} "
                            f"(its parameters: {', '.join(self.keys())}){note}")
        if problems:
            raise ValueError("\n  ".join(problems))
        if "max_len" in self.params.model_fields and raw.get("max_len") is None and max_len_default is not None:
            raw["max_len"] = max_len_default
        try:
            return self.params.model_validate(raw)
        except ValidationError as exc:
            raise ValueError("\n  ".join(_describe(e, self.params, where) for e in exc.errors())) from None

    def aggregation(self, params: BaseModel) -> str:
        """The aggregation mode these parameters select."""
        return self.agg or params.agg

    def uses_reference(self, params: BaseModel) -> bool:
        """Whether the loss needs ``ref_logprobs`` (a KL term: ``beta > 0``)."""
        return float(getattr(params, "beta", 0.0)) > 0.0

    def filters_truncated(self, params: BaseModel) -> bool:
        """Whether truncated rows are dropped by the family's own filter (DAPO with it on)."""
        return self.overlong_filter is not None and bool(getattr(params, self.overlong_filter))

    # ------------------------------------------------------------------ calling

    def call(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor | None,
        advantages: Tensor | None,
        mask: Tensor,
        params: BaseModel,
        *,
        ref_logprobs: Tensor | None = None,
        truncated: Tensor | None = None,
    ) -> NamedTuple:
        """The loss on these rows: ``fn(logprobs, old_logprobs, advantages, mask, **params)``.

        ``ref_logprobs`` reaches families that have a KL term (a ``beta`` parameter) and is ignored
        by the others; ``truncated`` (``[B]`` bool) reaches the family only when its overlong
        filter is on.
        """
        self._check(params)
        kwargs = self._fn_kwargs(params)
        if ref_logprobs is not None and "beta" in self.params.model_fields:
            kwargs["ref_logprobs"] = ref_logprobs
        if truncated is not None and self.filters_truncated(params):
            kwargs["truncated"] = truncated
        return self.fn(logprobs, old_logprobs, advantages, mask, **kwargs)

    def token_signals(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor | None,
        advantages: Tensor | None,
        mask: Tensor,
        params: BaseModel,
        *,
        truncated: Tensor | None = None,
    ) -> TokenSignals:
        """What the loss used at each token of these rows, detached (``LossSpec.signals``), called
        with the arguments :meth:`call` gives ``fn`` and the parameters the signals function names."""
        self._check(params)
        if self.signals is None:
            return given_advantage_signals(logprobs, old_logprobs, advantages, mask)
        accepted = inspect.signature(self.signals).parameters
        kwargs = {k: v for k, v in self._fn_kwargs(params).items() if k in accepted}
        if truncated is not None and self.filters_truncated(params) and "truncated" in accepted:
            kwargs["truncated"] = truncated
        return self.signals(logprobs.detach(), old_logprobs, advantages, mask, **kwargs)

    def effective_mask(self, mask: Tensor, params: BaseModel, *, truncated: Tensor | None = None) -> Tensor:
        """The tokens that carry loss after the family's own filters, bool ``[B, T]``."""
        self._check(params)
        if truncated is not None and self.filters_truncated(params):
            return overlong_filter(mask, truncated)  # DAPO Sec. 3.4
        return as_bool_mask(mask)

    def counts_every_row(self, params: BaseModel) -> bool:
        """Whether the normaliser counts every row of the batch (``seq-mean-token-sum-norm``: Dr.GRPO's
        constant ``B``), a row with a NULL reward or no loss token included."""
        return self.aggregation(params) == "seq-mean-token-sum-norm"

    def normaliser(self, mask: Tensor, params: BaseModel, *, truncated: Tensor | None = None) -> float:
        """``N``, the count the family's aggregation divides these rows' loss by (module docstring).

        Args:
            mask: loss tokens ``[B, T]`` of these rows (before the family's filters).
            params: the family's parameters.
            truncated: ``[B]`` bool, for the overlong filter.
        """
        m = self.effective_mask(mask, params, truncated=truncated)  # [B, T]
        mode = self.aggregation(params)
        if mode == "token-mean":
            return float(m.sum())  # Σ_i |o_i|
        if mode == "seq-mean-token-mean":
            return float(m.any(dim=-1).sum())  # rows with ≥ 1 loss token
        if mode == "seq-mean-token-sum-norm":
            return float(m.shape[0])  # every row: S_i / L_max averaged over all B
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")

    # ------------------------------------------------------------------ internals

    def _fn_keys(self) -> list[str]:
        return [k for k in self.params.model_fields if k != self.overlong_filter]

    def _fn_kwargs(self, params: BaseModel) -> dict[str, Any]:
        return {k: getattr(params, k) for k in self._fn_keys()}

    def _check(self, params: BaseModel) -> None:
        if not isinstance(params, self.params):
            raise TypeError(f"loss {self.name} takes {self.params.__name__} parameters, "
                            f"got {type(params).__name__} (use get_loss_spec({self.name!r}).parse)")


def _describe(err: dict, model: type[BaseModel], where: str) -> str:
    """One validation error as ``<where>.<key>: <message> (got ...; allowed: ...)``."""
    key = ".".join(str(p) for p in err["loc"])
    bounds = []
    info = model.model_fields.get(str(err["loc"][0])) if err["loc"] else None
    for m in info.metadata if info else ():
        for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if hasattr(m, attr):
                bounds.append(f"{op} {getattr(m, attr)}")
    allowed = f"; allowed: {', '.join(bounds)}" if bounds else ""
    return f"{where}.{key}: {err['msg']} (got {err.get('input')!r}{allowed})"


# ---------------------------------------------------------------------- the registry


class _Functions(Mapping[str, LossFn]):
    """Read-only view name -> loss function over the registered specs (``LOSSES``)."""

    def __getitem__(self, name: str) -> LossFn:
        return SPECS.get(name).fn

    def __iter__(self) -> Iterator[str]:
        return iter(SPECS.names())

    def __len__(self) -> int:
        return len(SPECS)

    def __repr__(self) -> str:
        return f"LOSSES({SPECS.names()})"


#: name -> loss function (read-only; register with ``register_loss``).
LOSSES: Mapping[str, LossFn] = _Functions()


def register_loss_spec(spec: LossSpec) -> LossSpec:
    """Add ``spec`` under its name; names are unique (registering an equal spec again is a no-op)."""
    return SPECS.register(spec.name, spec)


def register_loss(
    name: str,
    fn: LossFn,
    params: type[BaseModel] | None = None,
    *,
    agg: str | None = None,
    overlong_filter: str | None = None,
    signals: Callable[..., TokenSignals] | None = None,
) -> LossFn:
    """Add a loss family under ``name`` (e.g. LTE's shaped off-policy term, a plug-in's loss).

    Args:
        name: the registry name; unique.
        fn: ``fn(logprobs, old_logprobs, advantages, mask, **params) -> NamedTuple`` (first field ``loss``).
        params: its typed parameters; ``None`` derives them from ``fn``'s keyword arguments with
            defaults (every value accepted as given, no bounds).
        agg, overlong_filter, signals: as in ``LossSpec`` (``agg`` is needed when the parameters have none).

    Returns:
        ``fn``, so that it can be used as a plain call after the definition.
    """
    known = SPECS._items.get(name)
    if (known is not None and known.fn is fn and params in (None, known.params)
            and (agg, overlong_filter, signals) == (known.agg, known.overlong_filter, known.signals)):
        return fn  # the same registration again (a module imported twice)
    register_loss_spec(LossSpec(name, fn, params or _params_from_signature(name, fn), agg, overlong_filter, signals))
    return fn


def _params_from_signature(name: str, fn: LossFn) -> type[BaseModel]:
    """A parameter model from ``fn``'s keyword arguments that have defaults (tensors excluded)."""
    fields = {
        p.name: (Any, p.default)
        for p in list(inspect.signature(fn).parameters.values())[4:]
        if p.name not in _TENSOR_ARGS and p.default is not p.empty and p.kind is not p.VAR_KEYWORD
    }
    return create_model(f"{name}_params", __base__=LossParams, **fields)


def loss_names() -> list[str]:
    """The registered loss families, sorted (built-in and plug-ins')."""
    return SPECS.names()


def get_loss_spec(name: str) -> LossSpec:
    """The ``LossSpec`` registered under ``name``.

    Raises:
        UnknownName: unknown name (a KeyError; the message lists the known ones).
    """
    return SPECS.get(name)


def get_loss(name: str) -> LossFn:
    """The loss function registered under ``name``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    return get_loss_spec(name).fn


for _spec in (
    LossSpec("grpo", grpo_loss, GRPOParams, signals=grpo_signals),
    LossSpec("dr_grpo", dr_grpo_loss, DrGRPOParams, agg="seq-mean-token-sum-norm",  # Dr.GRPO: constant L_max
             signals=grpo_signals),  # the same surrogate
    LossSpec("dapo", dapo_loss, DAPOParams, overlong_filter="overlong_filter", signals=dapo_signals),  # Sec. 3.4
    LossSpec("gspo", gspo_loss, GSPOParams, agg="seq-mean-token-mean",  # 1/G Σ_i over non-empty sequences
             signals=gspo_signals),
    LossSpec("opmd", opmd_loss, OPMDParams, signals=opmd_signals),
    LossSpec("sft", sft_loss, SFTParams, signals=sft_signals),
):
    register_loss_spec(_spec)
