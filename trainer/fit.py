"""Will the learner fit its device? An estimate of its memory before anything is loaded.

:func:`estimate_memory` is a pure function: a model's shape (:class:`ModelShape`, from its
``config.json``), the engine's settings, the world size and the memory available give the bytes
the learner will hold on its device and in host memory, term by term (:class:`MemoryEstimate`).
:func:`fixes` lists the smallest sets of config keys that would make a config that does not fit
fit, and :func:`check_fit` refuses such a config at start (:class:`LearnerDoesNotFit`) with the
numbers and those keys. The learner calls it before DeepSpeed initialises (trainer/engine.py);
the GPU suite's ``scale`` stage calls :func:`estimate_memory` to set what it measures beside it.

The arithmetic, for ``P`` parameters, ``b`` bytes a weight (2 in bfloat16, 4 in float32), ``N``
ranks and ZeRO stage ``s`` (ZeRO, Rajbhandari et al. 2020, §3; DeepSpeed's own estimates,
``estimate_zero{2,3}_model_states_mem_needs``, count model states the same way):

- **weights** ``P·b``; ``P·b/N`` under ZeRO-3, plus the gathered working set (the largest module
  and the one prefetched after it, ``2·M·b``); with ``offload_params`` only that working set stays
  on the device and ``P·b/N`` goes to host memory.
- **gradients** ``P·b`` (sharded, ``/N``, from ZeRO-2); in bfloat16 also the float32 gradients
  the optimizer steps with, ``4·P`` (sharded from ZeRO-1). With ``offload_optimizer`` the float32
  ones live in host memory, and from ZeRO-2 the 16-bit ones leave the device bucket by bucket.
- **optimizer state**: AdamW's two moments, ``8·P``, and in bfloat16 (or under any ZeRO stage,
  which steps a float32 copy of its partition) the float32 master weights, ``4·P``: ``12·P``
  (sharded from ZeRO-1); on the host with ``offload_optimizer``.
- **DeepSpeed's buffers** from ZeRO-1: one reduce bucket, ``min(P, 5·10^8)·b`` (its default
  ``reduce_bucket_size``; the learner does not change it).
- **activations** of one pass of ``T`` tokens (:func:`tokens_per_pass`): per layer and token,
  ``(8·H + 2·(Q + K) + 4·I)·b`` bytes (``H`` hidden size, ``Q``/``K`` the query and key/value
  widths, ``I`` the MLP's; ``+3·(Q + K)`` with Qwen3's q/k norms): what a decoder layer saves for
  its backward pass, counted with torch's saved-tensor hooks on Llama and Qwen3 layers of several
  shapes (tests/unit/test_fit.py measures it again). With activation checkpointing a layer keeps
  only its input (``2·H·b``, measured too) and one layer's full activations exist while it is
  recomputed. Outside the layers ``4·H·b`` a token (embeddings, final norm; measured: nothing of
  it is saved with checkpointing).
- **the vocabulary head**: the log-probs are computed ``head_chunk_tokens`` positions at a time
  (reflexdb/logprobs.py): ``C·V·(4·4 + 2·b)`` bytes for a chunk of ``C`` (the float32 logits,
  their log-softmax and, in the backward pass, both gradients, and the ``b``-byte logits twice),
  on every ZeRO stage.
- **the reference model** (a KL term): ``P·b`` more.

On a CPU device the device is the host: everything counts against the machine's available memory,
shared by the ranks on it. What is left out: the CUDA context and allocator slack (``available``
is what ``torch.cuda.mem_get_info`` says is free once the context exists), and the prompt tokens
of the longest row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from reflexdb.errors import ReflexdbError

if TYPE_CHECKING:
    from .engine import EngineSettings

GiB = 1 << 30

#: DeepSpeed's default ``zero_optimization.reduce_bucket_size`` (elements), which the learner keeps.
REDUCE_BUCKET = 500_000_000

#: Elements saved per token by one decoder layer for its backward pass, as multiples of the widths:
#: hidden size H, query width Q, key/value width K (both), MLP width I; QK_NORM_EXTRA with
#: Qwen3's per-head q/k RMSNorms; CHECKPOINTED what a checkpointed layer keeps (its input); OUTSIDE
#: what the rest of the model keeps (embeddings, final norm). Counted with
#: torch.autograd.graph.saved_tensors_hooks in bfloat16 (tests/unit/test_fit.py).
PER_LAYER_H, PER_LAYER_QK, PER_LAYER_I, QK_NORM_EXTRA, CHECKPOINTED, OUTSIDE = 8, 2, 4, 3, 2, 4

#: Bytes per vocabulary entry of one head chunk position, besides 2·b: four float32 copies.
HEAD_FLOAT32_COPIES = 4


class LearnerDoesNotFit(ReflexdbError):
    """The learner's estimated memory passes what its device (or its host) has: refused at start,
    before the model is loaded (:func:`check_fit`); the message gives the numbers and the keys
    that would make it fit."""

    exit_code = 2


@dataclass(frozen=True)
class ModelShape:
    """What a decoder-only transformer's memory depends on (Llama/SmolLM2, Qwen2, Qwen3 and alike).

    Attributes:
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, vocab_size: as their
            ``config.json`` names them (``num_hidden_layers``, ``num_attention_heads``, ...).
        head_dim: per attention head (default ``hidden_size // num_heads``).
        tie_word_embeddings: the output head shares the input embedding's weight.
        attention_bias: q/k/v (and o) projections with biases (Qwen2: q/k/v).
        qk_norm: per-head RMSNorms of q and k (Qwen3).
        name: the architecture, for messages (``Qwen3ForCausalLM``).
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    name: str = "model"

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any) -> ModelShape:
        """From a ``config.json`` mapping or a transformers ``PretrainedConfig``.

        Raises:
            KeyError: a key the estimate needs is missing (not a decoder of this family), or a
                mixture of experts (whose experts this arithmetic does not count).
        """
        get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        if any(get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
            raise KeyError("a mixture of experts: not estimated")
        need = {}
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
            value = get(key)
            if not isinstance(value, int):
                raise KeyError(f"the model's config has no {key}")
            need[key] = value
        kind = str(get("model_type") or "")
        archs = get("architectures") or []
        return cls(hidden_size=need["hidden_size"], num_layers=need["num_hidden_layers"],
                   num_heads=need["num_attention_heads"],
                   num_kv_heads=get("num_key_value_heads") or need["num_attention_heads"],
                   intermediate_size=need["intermediate_size"], vocab_size=need["vocab_size"],
                   head_dim=get("head_dim") or None, tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                   attention_bias=kind == "qwen2" or bool(get("attention_bias", False)),
                   qk_norm=kind.startswith("qwen3"), name=archs[0] if archs else (kind or "model"))

    @property
    def q_width(self) -> int:
        return self.num_heads * (self.head_dim or self.hidden_size // self.num_heads)

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * (self.head_dim or self.hidden_size // self.num_heads)

    @property
    def layer_parameters(self) -> int:
        """One decoder layer's parameters: attention, the gated MLP, two RMSNorms."""
        H, Q, K = self.hidden_size, self.q_width, self.kv_width
        attn = H * Q + 2 * H * K + Q * H + (Q + 2 * K if self.attention_bias else 0)
        norms = 2 * H + (2 * (self.head_dim or H // self.num_heads) if self.qk_norm else 0)
        return attn + 3 * H * self.intermediate_size + norms

    @property
    def largest_module(self) -> int:
        """Parameters of the largest single module (the embedding, or a decoder layer's MLP)."""
        return max(self.vocab_size * self.hidden_size, 3 * self.hidden_size * self.intermediate_size)

    @property
    def parameters(self) -> int:
        """All parameters, a tied head counted once."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + head + self.num_layers * self.layer_parameters + self.hidden_size

    def activation_elements(self, checkpointed: bool) -> int:
        """Elements one token keeps for the backward pass in all layers (see the module docstring)."""
        H, QK = self.hidden_size, self.q_width + self.kv_width
        layer = PER_LAYER_H * H + PER_LAYER_QK * QK + PER_LAYER_I * self.intermediate_size
        layer += QK_NORM_EXTRA * QK if self.qk_norm else 0
        if checkpointed:  # the layers' inputs, and one layer's activations while it is recomputed
            return self.num_layers * CHECKPOINTED * H + layer
        return self.num_layers * layer + OUTSIDE * H


@dataclass(frozen=True)
class MemoryEstimate:
    """The learner's memory, in bytes; ``device_*`` on its device, ``host`` in host memory (each per rank).

    Attributes:
        parameters: the model's parameters.
        weights, gradients, optimizer, buffers, activations, head, reference: on the device.
        activations_per_token: ``activations / tokens``.
        tokens: the tokens of one pass the activations are for.
        host: in host memory: the offloaded state; with a GPU at least the whole model, which each
            rank loads there before DeepSpeed moves it.
        available, host_available: what there is (None: unknown, not checked).
        ranks_per_host: ranks whose host memory is the same (and, on a CPU device, whose device is).
        unified: the device is the host (a CPU learner).
    """

    parameters: int
    weights: int
    gradients: int
    optimizer: int
    buffers: int
    activations: int
    activations_per_token: int
    tokens: int
    head: int
    reference: int
    host: int
    available: int | None
    host_available: int | None
    ranks_per_host: int
    unified: bool
    settings: Any = field(repr=False, compare=False, default=None)

    @property
    def device(self) -> int:
        """Bytes on the device, per rank."""
        return self.weights + self.gradients + self.optimizer + self.buffers + self.activations + self.head \
            + self.reference

    @property
    def host_total(self) -> int:
        """Bytes in this host's memory, for all its ranks (on a CPU device, the device's too)."""
        return self.ranks_per_host * (self.host + (self.device if self.unified else 0))

    @property
    def fits_device(self) -> bool:
        return self.unified or self.available is None or self.device <= self.available

    @property
    def fits_host(self) -> bool:
        return self.host_available is None or self.host_total <= self.host_available

    @property
    def fits(self) -> bool:
        return self.fits_device and self.fits_host


def tokens_per_pass(micro_batch_tokens: int | None, micro_batch_size: int, longest_row: int) -> int:
    """The most tokens one forward/backward pass feeds the model (trainer/update.py cuts the passes):
    the budget, or a longer row alone; without a budget, ``micro_batch_size`` rows of the longest.

    Args:
        micro_batch_tokens: ``learner.micro_batch_tokens`` (None: no budget).
        micro_batch_size: ``learner.micro_batch_size``.
        longest_row: the longest row expected (the learner passes
            ``collector.sampling.max_new_tokens``; prompts are not counted).
    """
    if micro_batch_tokens is None:
        return micro_batch_size * longest_row
    return max(micro_batch_tokens, longest_row)


def estimate_memory(shape: ModelShape, settings: EngineSettings, *, world_size: int = 1, tokens: int,
                    reference_model: bool = False, available: int | None = None,
                    host_available: int | None = None, ranks_per_host: int | None = None) -> MemoryEstimate:
    """The learner's memory per rank, term by term (the arithmetic: the module docstring).

    Args:
        shape: the model (:meth:`ModelShape.from_config`).
        settings: the engine's settings with a concrete ``dtype`` (:func:`resolve_settings`): read
            are ``device``, ``dtype``, ``zero_stage``, ``offload_optimizer``, ``offload_params``,
            ``activation_checkpointing`` and ``head_chunk_tokens``.
        world_size: learner ranks (ZeRO shards over them).
        tokens: tokens of the largest forward/backward pass (:func:`tokens_per_pass`).
        reference_model: a frozen reference model is on the device too (a KL term).
        available: free bytes of one rank's device (``torch.cuda.mem_get_info``); None: unknown.
            Ignored on a CPU device, whose memory is the host's.
        host_available: available host memory (``MemAvailable``); None: unknown.
        ranks_per_host: ranks sharing this host's memory (default: ``world_size``).

    Returns:
        A :class:`MemoryEstimate` (``fits``, ``device``, ``host_total`` and each term).
    """
    if settings.dtype not in ("bfloat16", "float32"):
        raise ValueError(f"estimate_memory needs a concrete dtype, not {settings.dtype!r} (resolve_settings)")
    P, N, s = shape.parameters, max(1, world_size), settings.zero_stage
    b = 2 if settings.dtype == "bfloat16" else 4
    half = b == 2
    off_opt = settings.offload_optimizer and s >= 1
    off_par = settings.offload_params and s == 3
    host = 0

    weights = P * b
    if s == 3:
        working = 2 * shape.largest_module * b
        weights = working + (0 if off_par else P * b // N)
        host += P * b // N if off_par else 0

    grad_model = P * b // (N if s >= 2 else 1)  # the model's own .grad, in its dtype
    grad32 = 4 * P // (N if s >= 1 else 1) if half else 0  # bf16: the float32 ones the optimizer steps with
    if off_opt:  # the float32 gradients are the optimizer's, in host memory; DeepSpeed's estimate adds 50% there
        host += grad32
        gradients = 0 if s >= 2 else grad_model  # from ZeRO-2 the model's leave in reduce buckets (buffers)
    else:
        gradients = grad_model + grad32

    master = 4 * P if (half or s >= 1) else 0  # fp32 at stage 0: torch AdamW steps the weights themselves
    optimizer = (8 * P + master) // (N if s >= 1 else 1)
    if off_opt:
        host += optimizer
        optimizer = 0

    buffers = min(P, REDUCE_BUCKET) * b if s >= 1 else 0

    per_token = shape.activation_elements(settings.activation_checkpointing) * b
    chunk = min(tokens, max(1, settings.head_chunk_tokens))
    head = chunk * shape.vocab_size * (HEAD_FLOAT32_COPIES * 4 + 2 * b)
    reference = P * b if reference_model else 0
    unified = str(settings.device).split(":")[0] == "cpu"
    if not unified:  # at start each rank loads the whole model into host memory, then DeepSpeed moves it
        host = max(host, P * b)
    return MemoryEstimate(parameters=P, weights=weights, gradients=gradients, optimizer=optimizer, buffers=buffers,
                          activations=per_token * tokens, activations_per_token=per_token, tokens=tokens, head=head,
                          reference=reference, host=host, available=None if unified else available,
                          host_available=host_available, ranks_per_host=ranks_per_host or N, unified=unified,
                          settings=settings)


#: The keys :func:`fixes` may name, cheapest first (what each costs: docs/learner.md, "Will it fit?").
_KEY_ORDER = ("activation_checkpointing", "zero_stage", "offload_optimizer", "offload_params", "micro_batch_tokens")


@dataclass(frozen=True)
class Fix:
    """Config keys (``learner.KEY: VALUE``) with which the estimate fits; ``ranks``: with that many
    learner ranks (GPUs) instead of the current world size. ``estimate``: the memory then."""

    keys: dict[str, Any]
    estimate: MemoryEstimate
    ranks: int | None = None

    def describe(self) -> str:
        text = " and ".join(f"learner.{k}: {str(v).lower() if isinstance(v, bool) else v}"
                            for k, v in self.keys.items())
        if self.ranks:
            text = f"{self.ranks} learner ranks (GPUs)" + (f" with {text}" if text else "")
        e = self.estimate
        if e.unified:
            return f"{text} ({_gib(e.host_total)})"
        offloaded = e.settings.offload_optimizer or e.settings.offload_params
        return f"{text} ({_gib(e.device)} a device" + (f", {_gib(e.host_total)} of host memory)" if offloaded else ")")


def fixes(shape: ModelShape, settings: EngineSettings, *, world_size: int = 1, tokens: int, longest_row: int = 1,
          reference_model: bool = False, available: int | None = None, host_available: int | None = None,
          ranks_per_host: int | None = None, most: int = 3, max_ranks: int = 64) -> list[Fix]:
    """The smallest sets of config keys with which the estimate fits, cheapest first (at most ``most``),
    then, on GPUs, the fewest learner ranks that fit under ZeRO-3 with the config as it is otherwise.

    Tried: ``activation_checkpointing: true``, a higher ``zero_stage``, ``offload_optimizer: true``
    (ZeRO >= 1), ``offload_params: true`` (ZeRO-3), each alone and together, and where none of a
    combination fits, the largest ``micro_batch_tokens`` with which it would (a multiple of 16, at
    least ``longest_row``: a longer row is a pass of its own). A set is named only if no smaller
    one fits, so every key named is needed; of sets with the same keys, the one with the most room.
    Arguments as :func:`estimate_memory`.
    """
    import itertools

    def estimate(s: EngineSettings, t: int, n: int = world_size, per_host: int | None = ranks_per_host):
        return estimate_memory(shape, s, world_size=n, tokens=t, reference_model=reference_model,
                               available=available, host_available=host_available, ranks_per_host=per_host)

    options = [
        [] if settings.activation_checkpointing else [("activation_checkpointing", True)],
        [("zero_stage", z) for z in range(settings.zero_stage + 1, 4)],
        [] if settings.offload_optimizer else [("offload_optimizer", True)],
        [] if settings.offload_params else [("offload_params", True)],
    ]
    best: dict[tuple[str, ...], Fix] = {}  # per set of keys, the fix with the most room
    for choice in itertools.product(*[[None, *o] for o in options]):
        keys = dict(c for c in choice if c is not None)
        candidate = replace(settings, **keys)
        if (candidate.offload_optimizer and candidate.zero_stage < 1) or \
                (candidate.offload_params and candidate.zero_stage < 3):
            continue  # a config the learner refuses
        e = estimate(candidate, tokens)
        if not e.fits:
            budget = _largest_budget(lambda t, c=candidate: estimate(c, t).fits, max(16, longest_row), tokens)
            if budget is None:
                continue
            keys["micro_batch_tokens"] = budget
            e = estimate(candidate, budget)
        if keys:
            name = tuple(keys)
            if name not in best or _room(e) > _room(best[name].estimate):
                best[name] = Fix(keys, e)
    found = [f for f in best.values() if not any(set(g) < set(f.keys) for g in best)]
    found.sort(key=lambda f: (len(f.keys), [_KEY_ORDER.index(k) for k in f.keys]))
    out = found[:most]
    if str(settings.device).split(":")[0] != "cpu":
        z3 = replace(settings, zero_stage=3)
        for n in range(world_size + 1, max_ranks + 1):
            e = estimate(z3, tokens, n, None)
            if e.fits:
                out.append(Fix({} if settings.zero_stage == 3 else {"zero_stage": 3}, e, ranks=n))
                break
    return out


def _room(e: MemoryEstimate) -> int:
    """How far an estimate is from its limit (the device, or for a CPU learner the host)."""
    if e.unified:
        return (e.host_available or 0) - e.host_total
    return (e.available or 0) - e.device


def _largest_budget(fits, low: int, tokens: int) -> int | None:
    """The largest budget in ``[low, tokens)`` for which ``fits(t)``, as a power of two where one is
    at least ``low`` (else a multiple of 16); None if even ``low`` does not fit."""
    if low >= tokens or not fits(low):
        return None
    lo, hi = low, tokens  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    power = 1 << (lo.bit_length() - 1)
    return power if power >= low else max(low, lo // 16 * 16)


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def describe(e: MemoryEstimate, shape: ModelShape, world_size: int) -> str:
    """The estimate in one line: each term, the total and what there is."""
    s = e.settings
    chunk = min(e.tokens, s.head_chunk_tokens)
    terms = [f"weights {_gib(e.weights)}", f"gradients {_gib(e.gradients)}",
             f"optimizer state {_gib(e.optimizer)}",
             f"activations {_gib(e.activations)} ({e.tokens} tokens a pass × {e.activations_per_token / 2**20:.2f} MiB "
             f"a token{', checkpointed' if s.activation_checkpointing else ''})",
             f"vocabulary head {_gib(e.head)} ({chunk} tokens × {shape.vocab_size})"]
    if e.buffers:
        terms.append(f"DeepSpeed buffers {_gib(e.buffers)}")
    if e.reference:
        terms.append(f"reference model {_gib(e.reference)}")
    offloads = (", optimizer offloaded" if s.offload_optimizer else "") + \
        (", parameters offloaded" if s.offload_params else "")
    what = (f"{shape.name}, {e.parameters / 1e9:.2f}B parameters, {s.dtype}, ZeRO-{s.zero_stage}{offloads}, "
            f"{world_size} rank{'s' if world_size != 1 else ''}")
    line = f"{what}: " + ", ".join(terms) + f" = {_gib(e.device)}"
    if e.unified:
        line += f" a rank; host memory {_gib(e.host_total)}"
    else:
        line += " on the device" + (f" of {_gib(e.available)} free" if e.available is not None else "")
        line += f"; host memory {_gib(e.host_total)}"
    if e.ranks_per_host > 1:
        line += f" for {e.ranks_per_host} ranks"
    if e.host_available is not None:
        line += f" of {_gib(e.host_available)} available"
    return line


def check_fit(shape: ModelShape, settings: EngineSettings, *, world_size: int = 1, tokens: int, longest_row: int = 1,
              reference_model: bool = False, available: int | None = None, host_available: int | None = None,
              ranks_per_host: int | None = None, device_name: str = "the device") -> MemoryEstimate:
    """The estimate (:func:`estimate_memory`) if it fits; else :class:`LearnerDoesNotFit` naming the
    numbers and the keys that would make it fit (:func:`fixes`)."""
    kw = dict(world_size=world_size, tokens=tokens, reference_model=reference_model, available=available,
              host_available=host_available, ranks_per_host=ranks_per_host)
    e = estimate_memory(shape, settings, **kw)
    if e.fits:
        return e
    found = fixes(shape, settings, longest_row=longest_row, **kw)
    way = (("It would fit with " + "; or ".join(f.describe() for f in found) + ".") if found else
           "No setting of learner.zero_stage, offload_optimizer, offload_params, activation_checkpointing or "
           "micro_batch_tokens makes it fit: a smaller model, more memory or more GPUs.")
    raise LearnerDoesNotFit(f"the learner does not fit {device_name if not e.fits_device else 'host memory'} "
                            f"(estimated): {describe(e, shape, world_size)}. {way} To start anyway: "
                            "learner.fit_check: false (docs/learner.md, \"Will it fit?\")")


@dataclass(frozen=True)
class FitCheck:
    """What the learner's start-up check needs beyond the engine's settings (trainer/engine.py).

    Attributes:
        tokens: tokens of the largest pass (:func:`tokens_per_pass`).
        longest_row: the longest row expected (the floor of a useful ``micro_batch_tokens``).
        reference_model: a frozen reference model will be on the device too.
    """

    tokens: int
    longest_row: int = 1
    reference_model: bool = False


def device_memory(device: str) -> int | None:
    """Free bytes of a CUDA device (``torch.cuda.mem_get_info``); None for a CPU or when unknown."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    free, _total = torch.cuda.mem_get_info(index)
    return int(free)


def host_memory() -> int | None:
    """Available host memory (``MemAvailable`` of /proc/meminfo, else psutil's); None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no way to know: the host is not checked
        return None


def check_start(model_path: str, settings: EngineSettings, fit: FitCheck, *, world_size: int, ranks_per_host: int,
                say=None) -> MemoryEstimate | None:
    """The learner's check at start, before the model is loaded: the model's ``config.json``, this
    rank's free device memory and the host's available memory into :func:`check_fit`. A model
    whose config the estimate cannot read is not checked (a debug line says so).

    Raises:
        LearnerDoesNotFit: on every rank when the estimate of any rank does not fit.
    """
    import json
    import logging
    import os

    log = logging.getLogger(__name__)
    error: LearnerDoesNotFit | None = None
    estimate = None
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            shape = ModelShape.from_config(json.load(f))
    except (OSError, ValueError, KeyError) as exc:
        log.debug("no memory check: cannot read the shape of %s (%s)", model_path, exc)
        shape = None
    if shape is not None:
        try:
            estimate = check_fit(shape, settings, world_size=world_size, tokens=fit.tokens,
                                 longest_row=fit.longest_row, reference_model=fit.reference_model,
                                 available=device_memory(settings.device), host_available=host_memory(),
                                 ranks_per_host=ranks_per_host, device_name=str(settings.device))
            line = f"memory (estimated): {describe(estimate, shape, world_size)}"
            (say if say is not None and not estimate.unified else log.debug)(line)
        except LearnerDoesNotFit as exc:
            error = exc
    if world_size > 1:  # every rank stops, or none: the others would wait for it in DeepSpeed's start
        import torch

        device = torch.device(settings.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        flag = torch.tensor([1 if error is not None else 0], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if error is None and int(flag.item()):
            raise LearnerDoesNotFit("the learner does not fit the device of another rank (its message says why)")
    if error is not None:
        raise error
    return estimate
