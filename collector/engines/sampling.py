"""What both local engines (``hf`` and ``fast``) do with a row's logits, once: the sampler, the
counter-based draws, stop strings, the JSON grammar's token mask and the building of a
:class:`~.base.Sample`.

Every number a sample stores is computed here, so the two engines store the same numbers for the
same logits (docs/collector-engines.md):

- :func:`sample_tokens` draws one token per row by inverse CDF from
  ``renormalise(top_p(softmax(logits / temperature)))`` and returns its log-prob under that
  distribution; the sampling settings are per row (:class:`RowSampling`), so rows of calls with
  different settings decode in one batch with exactly the numbers each call alone would give.
- :func:`counter_uniforms` makes each row's draw a pure function of (seed, row, step).
- :func:`find_stop` / :func:`first_stop` look for stop strings in a window of the last tokens
  (linear in the response, whatever it holds).
- :class:`Grammars` compiles a JSON schema once per engine (xgrammar) and gives each constrained
  row a matcher; :func:`apply_bitmask` masks a batch's logits with the packed bitmask on any device.
"""

from __future__ import annotations

import importlib.util
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import MissingDependency
from .base import Sample, SamplingParams

# -- per-row sampling settings --------------------------------------------------------------------


@dataclass(frozen=True)
class RowSampling:
    """The sampling settings of a batch's rows, as tensors (`[B]` each).

    Attributes:
        temperature: float32; ``1`` on greedy rows (their logits are used untempered).
        top_p: float32 nucleus mass; ``1`` disables truncation (and on greedy rows).
        greedy: bool: take the most likely token (``temperature == 0``).
        any_top_p: whether some row has ``top_p < 1``: the only rows that sort their vocabulary.
        any_greedy: whether some row is greedy.
    """

    temperature: torch.Tensor
    top_p: torch.Tensor
    greedy: torch.Tensor
    any_top_p: bool
    any_greedy: bool

    def __getitem__(self, rows: torch.Tensor | slice) -> RowSampling:
        """The settings of ``rows`` (the flags kept: they may now over-state, never under-state)."""
        return RowSampling(self.temperature[rows], self.top_p[rows], self.greedy[rows], self.any_top_p,
                           self.any_greedy)

    @staticmethod
    def of(params: Sequence[SamplingParams] | SamplingParams, rows: int | None = None,
           device: torch.device | str = "cpu") -> RowSampling:
        """The settings of ``rows`` rows of one call (``params`` one object), or of one row per
        element of ``params``."""
        if isinstance(params, SamplingParams):
            params = [params] * int(rows if rows is not None else 1)
        greedy = [p.greedy for p in params]
        temp = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy)]
        return RowSampling(
            temperature=torch.tensor(temp, dtype=torch.float32, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            any_top_p=any(p < 1.0 for p in top_p),
            any_greedy=any(greedy),
        )


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams | RowSampling,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return it with its log-prob under the sampling distribution.

    Args:
        logits: `[B, V]` float32 next-token logits (a grammar's mask already applied: ``-inf``).
        params: one call's settings for every row, or each row's (:class:`RowSampling`).
        generator: source of randomness when ``uniforms`` is not given.
        uniforms: `[B]` float64 uniform draws in [0, 1), one per row (inverse-CDF sampling).
    Returns:
        tokens `[B]` int64 and logprobs `[B]` float32: ``log q(token)`` with
        ``q = renormalise(top_p(softmax(logits / temperature)))``; greedy rows (temperature 0)
        get the untempered ``log_softmax(logits)``.
    """
    rs = params if isinstance(params, RowSampling) else RowSampling.of(params, logits.shape[0], logits.device)
    logp = torch.log_softmax(logits / rs.temperature[:, None], dim=-1)  # [B, V]
    if rs.any_top_p:
        cut = rs.top_p < 1.0  # [B]
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_lp.exp()
        # Drop a token once the mass strictly before it exceeds top_p (SGLang's rule); the most
        # likely token always stays.
        drop = ((probs.cumsum(dim=-1) - probs) > rs.top_p[:, None]) & cut[:, None]
        sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
        nucleus = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_lp)
        nucleus = nucleus - torch.logsumexp(nucleus, dim=-1, keepdim=True)  # renormalise the nucleus
        logp = torch.where(cut[:, None], nucleus, logp)
    # Inverse-CDF draw (much faster than torch.multinomial on CPU): the first index with
    # cdf > u, for u uniform in [0, cdf[-1]), always has non-zero probability.
    cdf = logp.exp().double().cumsum(dim=-1)  # [B, V]
    if uniforms is None:
        uniforms = torch.rand(cdf.shape[0], generator=generator, device=cdf.device, dtype=torch.float64)
    tokens = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True).squeeze(1)
    tokens = tokens.clamp(max=logits.shape[-1] - 1)  # u * cdf[-1] rounding up to cdf[-1] itself
    if rs.any_greedy:
        tokens = torch.where(rs.greedy, logits.argmax(dim=-1), tokens)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(1)


# -- counter-based draws --------------------------------------------------------------------------

_M32 = 0xFFFFFFFF
# Odd multipliers below 2**31: every product of a 32-bit value with one fits in int64, so the
# hash below is exact on any device (int64 overflow is not defined behaviour in C++).
_MUL = (0x7FEB352D, 0x446CA68B, 0x2C1B3C6D, 0x297A2D39)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) of int64 values in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = (x * _MUL[0]) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL[1]) & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL[2]) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL[3]) & _M32
    return x ^ (x >> 16)


def counter_uniforms(seed: torch.Tensor | int, row: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
    """``[B]`` float64 uniforms in ``[0, 1)``, one per (``seed``, ``row``, ``step``), each a pure
    function of its three integers: a row's draw at a step is the same whichever rows it is
    batched with, in whichever order, on whichever engine (``hf`` and ``fast`` sample the same
    tokens from the same logits). 53 random bits from two rounds of :func:`_mix32`; no generator
    state, so one decode step captured in a CUDA graph draws fresh numbers at each replay.

    Args:
        seed: the call's seed, ``0 <= seed < 2**63`` (an int, a `[]` or a `[B]` tensor: rows of
            several calls decode together, each with its call's seed).
        row: ``[B]`` int64 index of each sample in its call (``prompt * n + sample``).
        step: the token's index in its response (int or ``[B]`` int64).
    """
    seed = torch.as_tensor(seed, dtype=torch.long, device=row.device)
    step = torch.as_tensor(step, dtype=torch.long, device=row.device)
    h = _mix32(step & _M32)
    h = _mix32(h ^ (row & _M32))
    h = _mix32(h ^ ((seed >> 32) & _M32))
    h = _mix32(h ^ (seed & _M32))
    hi = _mix32(h ^ 0x1B873593) >> 5  # 27 bits
    lo = _mix32(h ^ 0x5BD1E995) >> 6  # 26 bits
    return (hi * (1 << 26) + lo).double() * (1.0 / (1 << 53))


def call_seed(params: SamplingParams) -> int:
    """The seed of one ``generate`` call: ``params.seed``, or 63 fresh random bits."""
    if params.seed is not None:
        return int(params.seed) & ((1 << 63) - 1)
    return secrets.randbits(63)


# -- stop strings ---------------------------------------------------------------------------------


def stop_window(stop: Sequence[str]) -> int:
    """Tokens to re-decode when looking for a stop string after each sampled token: enough for the
    longest one even when every character is split over several byte-level tokens.

    The window, not the response so far, is what each step decodes: matching stop strings costs
    ``O(window)`` per token, so a response of ``T`` tokens costs ``O(T)``, whatever it holds.
    """
    return 4 * max((len(s) for s in stop), default=0) + 4


def find_stop(tokenizer: Any, row: torch.Tensor | np.ndarray, end: int, stop: Sequence[str],
              window: int) -> str | None:
    """The first of ``stop`` (in its order) in the text of ``row[end - window : end]``, the last
    ``window`` (:func:`stop_window`) of a row's ``end`` tokens so far; ``None`` when none is there."""
    text = tokenizer.decode(row[max(0, end - window) : end].tolist())
    return next((s for s in stop if s in text), None)


def first_stop(tokenizer: Any, row: np.ndarray, start: int, last: int, stop: Sequence[str],
               window: int) -> tuple[int, str] | None:
    """The first response length in ``(start, last]`` at which a stop string ends ``row``, exactly
    where checking after every token (:func:`find_stop`) would end it; one decode of the span
    when none is there (an engine that looks every few tokens)."""
    if last <= start:
        return None
    text = tokenizer.decode(row[max(0, start + 1 - window) : last].tolist())
    if not any(s in text for s in stop):
        return None
    for end in range(start + 1, last + 1):
        hit = find_stop(tokenizer, row, end, stop, window)
        if hit is not None:
            return end, hit
    return None


# -- building a sample ----------------------------------------------------------------------------


def make_sample(tokenizer: Any, prompt_ids: Sequence[int] | np.ndarray, token_ids: np.ndarray,
                logprobs: np.ndarray, finish_reason: str, embedding: np.ndarray,
                stop: str | None = None) -> Sample:
    """A :class:`~.base.Sample` with the dtypes the store expects and the decoded text."""
    ids = np.asarray(token_ids, dtype=np.int32)
    return Sample(
        prompt_ids=np.asarray(prompt_ids, dtype=np.int32),
        token_ids=ids,
        logprobs=np.asarray(logprobs, dtype=np.float32),
        finish_reason=finish_reason,  # type: ignore[arg-type]
        text=tokenizer.decode(ids.tolist(), skip_special_tokens=True),
        embedding=np.asarray(embedding, dtype=np.float32),
        stop=stop,
    )


# -- constrained decoding (json_schema) -----------------------------------------------------------


def xgrammar() -> Any:
    """The ``xgrammar`` module, imported only when a call asks for ``json_schema``."""
    try:
        import xgrammar as xgr
    except ImportError as exc:
        raise MissingDependency(
            "json_schema decoding needs the xgrammar package: pip install --no-deps xgrammar apache-tvm-ffi"
        ) from exc
    return xgr


def json_token_bitmask(decoded_vocab: list[bytes], vocab_size: int, keep: list[int]) -> torch.Tensor:
    r"""xgrammar's packed bitmask, `[ceil(V / 32)]` int32 (bit ``t % 32`` of word ``t // 32`` for
    token ``t``), of the tokens without a raw control character (U+0000..U+001F); ``keep`` (the
    EOS tokens) are allowed whatever they decode to.

    Strict JSON has no raw control characters, and with ``any_whitespace=False`` the grammar never
    needs one, but xgrammar 0.2.8's rule for a string with ``maxLength`` (``[^"\\\r\n]``) lets a
    tab or ``\x01`` through, which ``json.loads`` then refuses. Every control character is one byte
    below 0x20 in UTF-8, and no byte of a multi-byte character is.
    """
    allowed = np.ones(-(-vocab_size // 32) * 32, dtype=bool)
    for t, text in enumerate(decoded_vocab[:vocab_size]):
        if text and min(text) < 0x20:
            allowed[t] = False
    allowed[[t for t in keep if t < vocab_size]] = True
    words = (allowed.reshape(-1, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    return torch.from_numpy(words.astype(np.uint32).view(np.int32))


class Grammars:
    """JSON-schema grammars of one engine: xgrammar's compiler (it holds the tokenizer's
    vocabulary), the bitmask of tokens strict JSON may contain, one compiled grammar per distinct
    schema string; matchers per constrained row.

    Args:
        tokenizer: the engine's Hugging Face tokenizer.
        vocab_size: ``V``, the width of the logits the masks cover.
        eos_ids: the tokens the decode loop takes for EOS: the grammar may end only with one.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]):
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, list(eos_ids)
        self.compiler: Any = None
        self.json_tokens: torch.Tensor | None = None  # [W] int32
        self.compiled: dict[str, Any] = {}

    @property
    def words(self) -> int:
        """``W = ceil(V / 32)``: int32 words of one row's packed bitmask."""
        return -(-self.vocab_size // 32)

    def compile(self, schema: str) -> Any:
        """``schema`` compiled (once per engine and schema string).

        Raises:
            ValueError: xgrammar cannot compile it (the message is xgrammar's, without its C++ prefix).
        """
        compiled = self.compiled.get(schema)
        if compiled is not None:
            return compiled
        xgr = xgrammar()
        if self.compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.eos_ids or None)
            self.compiler = xgr.GrammarCompiler(info)
            self.json_tokens = json_token_bitmask(info.decoded_vocab, self.vocab_size, self.eos_ids)
        try:
            # No free whitespace (xgrammar's fixed ", " and ": " separators): given the choice, a
            # weak model can loop on spaces and newlines.
            compiled = self.compiler.compile_json_schema(schema, any_whitespace=False)
        except RuntimeError as exc:
            # xgrammar's C++ messages start with "[time] file.cc:line: ".
            reason = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(exc).strip())
            raise ValueError(f"json_schema cannot be compiled: {reason}") from None
        self.compiled[schema] = compiled
        return compiled

    def matchers(self, schema: str, rows: int) -> list[Any]:
        """``rows`` fresh matchers of ``schema``."""
        compiled = self.compile(schema)
        xgr = xgrammar()
        return [xgr.GrammarMatcher(compiled) for _ in range(rows)]

    def fill(self, matcher: Any, bitmask: torch.Tensor, index: int) -> None:
        """Write into ``bitmask[index]`` (CPU int32 `[*, W]`) the tokens ``matcher`` allows next and
        strict JSON may contain."""
        matcher.fill_next_token_bitmask(bitmask, index)
        bitmask[index] &= self.json_tokens

    @staticmethod
    def advance(matcher: Any, token: int, row: int) -> bool:
        """Feed a sampled ``token`` to ``row``'s matcher; whether its grammar is complete (its EOS accepted)."""
        if not matcher.accept_token(token):
            raise RuntimeError(f"xgrammar refused token {token} of row {row} although its mask allowed it")
        return bool(matcher.is_terminated())


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to ``-inf``, in place, the logits of every token ``bitmask`` does not allow.

    Args:
        logits: `[B, V]` float32, on any device.
        bitmask: `[B, W]` int32 packed (bit ``t % 32`` of word ``t // 32``): xgrammar's layout.
    """
    if logits.device.type == "cpu" and bitmask.device.type == "cpu":
        xgrammar().apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], backend="cpu")
        return
    if importlib.util.find_spec("triton") is not None:  # xgrammar's own GPU kernel
        xgrammar().apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=logits.shape[-1],
                                               backend="triton")
        return
    logits.masked_fill_(~unpack_bitmask(bitmask.to(logits.device), logits.shape[-1]), float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[B, W]` int32 packed bits -> `[B, V]` bool (torch ops only: captured in a CUDA graph)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [B, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()
