"""The ``hf`` engine: Hugging Face transformers on CPU or one GPU, batched.

Generation is a plain KV-cache loop rather than ``model.generate``, so that the numbers stored
with every trajectory are computed here, in one place, and mean what ``docs/collector-engines.md``
says: the log-prob of each sampled token under the exact distribution it was drawn from, and the
final-norm hidden state at the position that produced it. Prompts are left-padded; the ``n``
samples of a prompt share one prefill (the KV cache is repeated); rows leave the batch as soon as
they finish, so a long straggler does not make the finished rows cost compute. With
``SamplingParams.json_schema`` every row has an xgrammar matcher whose token bitmask masks the
logits before sampling (constrained decoding).
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import logging
import re
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reflexdb.logprobs import token_logprobs

from ..errors import CheckpointMismatch, MissingDependency, ModelUnavailable
from reflexdb.models import model_display_name, resolve_model
from .base import Prompt, Sample, SamplingParams, ScoreResult, checkpoint_path, encode_prompt

log = logging.getLogger(__name__)


def _resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype)


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return it with its log-prob under the sampling distribution.

    Args:
        logits: `[B, V]` float32 next-token logits.
        generator: source of randomness when ``uniforms`` is not given.
        uniforms: `[B]` float64 uniform draws in [0, 1), one per row (inverse-CDF sampling).
    Returns:
        tokens `[B]` int64 and logprobs `[B]` float32: ``log q(token)`` with
        ``q = renormalise(top_p(softmax(logits / temperature)))``; greedy rows (temperature 0)
        get the untempered ``log_softmax(logits)``.
    """
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)  # [B, V]
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)  # [B, V]
    if params.top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_lp.exp()
        # Drop a token once the mass strictly before it exceeds top_p (SGLang's rule); the most
        # likely token always stays.
        drop = (probs.cumsum(dim=-1) - probs) > params.top_p
        sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_lp)
        logp = logp - torch.logsumexp(logp, dim=-1, keepdim=True)  # renormalise the nucleus
    # Inverse-CDF draw (much faster than torch.multinomial on CPU): the first index with
    # cdf > u, for u uniform in [0, cdf[-1]), always has non-zero probability.
    cdf = logp.exp().double().cumsum(dim=-1)  # [B, V]
    if uniforms is None:
        uniforms = torch.rand(cdf.shape[0], generator=generator, device=cdf.device, dtype=torch.float64)
    tokens = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True).squeeze(1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(1)


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
        seed: the call's seed, ``0 <= seed < 2**63``.
        row: ``[B]`` int64 index of each sample in the call (``prompt * n + sample``).
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


def _xgrammar() -> Any:
    """The ``xgrammar`` module, imported only when a call asks for ``json_schema``."""
    try:
        import xgrammar
    except ImportError as exc:
        raise MissingDependency(
            "json_schema decoding needs the xgrammar package: pip install --no-deps xgrammar apache-tvm-ffi"
        ) from exc
    return xgrammar


def _json_token_bitmask(decoded_vocab: list[bytes], vocab_size: int, keep: list[int]) -> torch.Tensor:
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


class HFEngine:
    """Transformers engine; see :class:`~reflexdb.collector.engines.base.Engine`.

    Args:
        model: a model directory, ``"smollm2"`` (default, converted once from the GGUF wheel) or
            ``"tiny"`` (random 2-layer model for tests); see :func:`~reflexdb.models.resolve_model`.
        device: ``cpu``, ``cuda``, ``cuda:1``...; default CUDA when available.
        dtype: ``auto`` (float32 on CPU, bfloat16 on GPUs that support it) or a torch dtype
            name. Log-probs are always computed in float32 from the logits.
        max_batch_size: most sequences decoded together (prompts × n).
        score_token_budget: most (rows × padded length) tokens in one scoring forward pass;
            bounds the memory of the logits and hidden states it materialises.
        cache_dir: model cache for the built-in models (default :func:`~reflexdb.models.model_cache_dir`).
        share_prefixes: prefill a prefix shared by several prompts of one call once (the turns of
            multi-turn episodes share their task's prompt and the system prompt) when that saves at
            least ``min_shared_prefix`` tokens; the ``n`` samples of one prompt always share it.
        keep_kv_tokens: most tokens of conversation caches kept while ``keep_kv`` is on (the rollout
            driver turns it on for multi-turn episodes: turn k + 1 then prefills only the
            environment's tokens). SmolLM2-135M: 45 KiB a token in float32.
    """

    kind = "hf"

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str | None = None,
        dtype: str | torch.dtype = "auto",
        max_batch_size: int = 32,
        score_token_budget: int = 2048,
        cache_dir: Path | None = None,
        share_prefixes: bool = True,
        min_shared_prefix: int = 64,
        keep_kv_tokens: int = 65536,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        location = resolve_model(model, cache_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = _resolve_dtype(dtype, self.device)
        self.max_batch_size = max_batch_size
        self.score_token_budget = score_token_budget
        self.share_prefixes, self.min_shared_prefix = share_prefixes, min_shared_prefix
        #: prompt tokens of every row asked for, and those actually prefilled (docs/benchmarks.md)
        self.prompt_tokens = self.prefill_tokens = 0
        #: while true, each generated row's cache is kept (up to ``keep_kv_tokens`` tokens, oldest
        #: dropped first) and a later prompt that continues it prefills only its new tokens.
        self.keep_kv = False
        self.keep_kv_tokens = keep_kv_tokens
        self._kv: OrderedDict[tuple[int, ...], list] = OrderedDict()
        self._kv_tokens = 0
        self._cache_kw: str | None = None  # the forward's name for the KV cache (set on first use)
        try:
            self._model = AutoModelForCausalLM.from_pretrained(location, dtype=self.dtype)
            self._tokenizer = AutoTokenizer.from_pretrained(location)
        except OSError as exc:
            raise ModelUnavailable(f"cannot load model {location}: {exc}") from exc
        self._model.to(self.device).eval()
        self._model_name = model_display_name(location)
        #: the checkpoint the current weights came from.
        self.checkpoint = str(location)

        config = self._model.config
        eos = getattr(self._model.generation_config, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
        eos_ids.add(self._tokenizer.eos_token_id)
        self._eos_ids = sorted(int(t) for t in eos_ids if t is not None)
        pad = self._tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else self._eos_ids[0] if self._eos_ids else 0)
        self._max_positions = int(getattr(config, "max_position_embeddings", 1 << 30))
        # json_schema decoding, set up on first use: xgrammar's compiler (it holds the tokenizer's
        # vocabulary), the bitmask of tokens strict JSON may contain, and one compiled grammar per
        # distinct schema string.
        self._grammar_compiler: Any = None
        self._json_tokens: torch.Tensor | None = None
        self._grammars: dict[str, Any] = {}

    # -- properties --------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def hidden_size(self) -> int:
        return int(self._model.config.hidden_size)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def model(self) -> torch.nn.Module:
        """The underlying transformers model (for tests and tools; do not keep references)."""
        return self._model

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, params: SamplingParams = SamplingParams()
    ) -> list[list[Sample]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        ids = [encode_prompt(self._tokenizer, p) for p in prompts]
        seed = call_seed(params)
        per_chunk = max(1, self.max_batch_size // n)
        out: list[list[Sample]] = []
        for start in range(0, len(ids), per_chunk):
            out.extend(self._generate_chunk(ids[start : start + per_chunk], n, params, seed, first_row=start * n))
        return out

    def _forward(self, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One forward pass; returns the last position's float32 logits `[B, V]`, its final-norm
        hidden state `[B, D]` and the KV cache."""
        if self._cache_kw is None:  # transformers >= 5.24 names the KV cache `cache`, older ones `past_key_values`
            self._cache_kw = "cache" if "cache" in inspect.signature(self._model.forward).parameters else "past_key_values"
        if "cache" in kwargs and self._cache_kw != "cache":
            kwargs[self._cache_kw] = kwargs.pop("cache")
        out = self._model(**kwargs, use_cache=True, output_hidden_states=True, logits_to_keep=1)
        cache = out["cache"] if self._cache_kw == "cache" else out["past_key_values"]  # no deprecation warning
        return out.logits[:, -1].float(), out.hidden_states[-1][:, -1].float(), cache

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], n: int, params: SamplingParams, seed: int, first_row: int = 0
    ) -> list[list[Sample]]:
        dev = self.device
        lengths = [len(p) for p in prompts]
        if min(lengths) == 0:
            raise ValueError("empty prompt")
        P = max(lengths)
        max_new = min(params.max_new_tokens, self._max_positions - P)
        if max_new < 1:
            raise ValueError(f"prompt of {P} tokens leaves no room in the context of {self._max_positions}")
        B = len(prompts) * n
        # Before any forward pass, so that a schema xgrammar refuses costs nothing.
        grammars = self._grammar_matchers(params.json_schema, B) if params.json_schema is not None else None

        input_ids, mask, positions = self._left_pad(prompts)
        hits = [self._recall(p) for p in prompts] if self.keep_kv and self._kv else []
        plan = None
        if not (hits and all(hits)):
            hits = []
            plan = self._prefix_plan(prompts) if self.share_prefixes else None
        self.prompt_tokens += sum(lengths) * n
        if hits:  # every prompt continues a conversation whose cache an earlier call kept
            logits, hidden, cache, mask = self._prefill_suffixes(prompts, [h[1] for h in hits], [h[0] for h in hits])
        elif plan is None:
            self.prefill_tokens += sum(lengths)
            logits, hidden, cache = self._forward(input_ids=input_ids, attention_mask=mask, position_ids=positions)
        else:
            logits, hidden, cache, mask = self._prefill_shared(prompts, plan)
        next_pos = torch.tensor(lengths, dtype=torch.long, device=dev)  # [B0]
        if n > 1:  # one prefill per prompt, then n copies of its cache
            cache.batch_repeat_interleave(n)
            logits, hidden = logits.repeat_interleave(n, 0), hidden.repeat_interleave(n, 0)
            mask, next_pos = mask.repeat_interleave(n, 0), next_pos.repeat_interleave(n, 0)

        tokens = torch.zeros((B, max_new), dtype=torch.long, device=dev)  # [B, T_max]
        logprobs = torch.zeros((B, max_new), dtype=torch.float32, device=dev)
        emb_sum = torch.zeros((B, hidden.shape[-1]), dtype=torch.float32, device=dev)  # [B, D]
        n_tokens = torch.zeros(B, dtype=torch.long, device=dev)
        reason = ["length"] * B
        matched: list[str | None] = [None] * B
        stop_ids = torch.tensor(sorted(set(self._eos_ids) | set(params.stop_token_ids)), dtype=torch.long, device=dev)
        window = stop_window(params.stop)
        rows = torch.arange(B, device=dev)  # original index of each row still decoding
        # [B, ceil(V / 32)] int32: which tokens each row's grammar allows next
        bitmask = _xgrammar().allocate_token_bitmask(B, self._vocab_size) if grammars is not None else None

        for step in range(max_new):
            # One uniform per (call seed, row of the call, step): a row's draws depend neither on
            # which other rows are still decoding nor on how the call was cut into chunks.
            uniforms = counter_uniforms(seed, rows + first_row, step)
            if grammars is not None:  # before sampling: `lp` is then the masked distribution's
                self._mask_logits(logits, grammars, rows, bitmask)
            tok, lp = sample_tokens(logits, params, uniforms=uniforms)  # [b], [b]
            tokens[rows, step] = tok
            logprobs[rows, step] = lp
            emb_sum[rows] += hidden  # the state that produced `tok`
            n_tokens[rows] += 1
            done = torch.isin(tok, stop_ids)  # [b]
            if grammars is not None:
                done |= torch.tensor(self._advance_grammars(grammars, rows, tok), device=dev)
            if params.stop:
                done = done.cpu()
                for j, r in enumerate(rows.tolist()):
                    if done[j]:
                        continue
                    hit = find_stop(self._tokenizer, tokens[r], step + 1, params.stop, window)
                    if hit is not None:
                        done[j], matched[r] = True, hit
                done = done.to(dev)
            for r in rows[done].tolist():
                reason[r] = "stop"
            keep = ~done
            last = not bool(keep.any()) or step == max_new - 1
            if self.keep_kv:  # a row that ends here may be continued by a later call (the next turn)
                ending = torch.ones_like(done) if last else done
                for j in ending.nonzero().squeeze(1).tolist():
                    r = int(rows[j])
                    self._remember(tuple(prompts[r // n]) + tuple(tokens[r, :step].tolist()), cache, j, mask[j])
            if last:
                break
            if bool(done.any()):  # drop finished rows from the batch
                idx = keep.nonzero().squeeze(1)
                cache.batch_select_indices(idx)
                rows, mask, next_pos, tok = rows[idx], mask[idx], next_pos[idx], tok[idx]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=dev)], dim=1)
            logits, hidden, cache = self._forward(
                input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], cache=cache
            )
            next_pos = next_pos + 1

        tokens_np, logprobs_np = tokens.cpu().numpy(), logprobs.cpu().numpy()
        emb_np = (emb_sum / n_tokens.clamp(min=1)[:, None].float()).cpu().numpy()
        lengths_np = n_tokens.cpu().numpy()
        out: list[list[Sample]] = []
        for i, p in enumerate(prompts):
            prompt_arr = np.asarray(p, dtype=np.int32)
            group = []
            for r in range(i * n, (i + 1) * n):
                t = int(lengths_np[r])
                ids = tokens_np[r, :t].astype(np.int32)
                group.append(
                    Sample(
                        prompt_ids=prompt_arr,
                        token_ids=ids,
                        logprobs=logprobs_np[r, :t].astype(np.float32),
                        finish_reason=reason[r],  # type: ignore[arg-type]
                        text=self._tokenizer.decode(ids.tolist(), skip_special_tokens=True),
                        embedding=emb_np[r].astype(np.float32),
                        stop=matched[r],
                    )
                )
            out.append(group)
        return out

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask and position_ids `[B, P]` with every row's last token in the last column."""
        P = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), P), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), P), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                input_ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, P - len(p) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def _prefix_plan(self, prompts: list[list[int]]) -> list[tuple[int, list[int]]] | None:
        """Families of rows that share a prefix worth prefilling once: ``[(prefix_length, rows)]``
        covering every row, or ``None`` when sharing would save fewer than ``min_shared_prefix``
        tokens. Rows are sorted so that rows with long common prefixes are neighbours; a row joins
        the family before it while that saves at least as many tokens as it costs."""
        if len(prompts) < 2:
            return None
        order = sorted(range(len(prompts)), key=lambda i: prompts[i])

        def lcp(a: list[int], b: list[int]) -> int:
            n = min(len(a), len(b))
            i = 0
            while i < n and a[i] == b[i]:
                i += 1
            return i

        families: list[tuple[int, list[int]]] = []
        prefix, rows = len(prompts[order[0]]) - 1, [order[0]]
        for i in order[1:]:
            shared = min(lcp(prompts[rows[-1]], prompts[i]), prefix, len(prompts[i]) - 1)
            if len(rows) * shared >= (len(rows) - 1) * prefix and shared > 0:
                prefix, rows = shared, rows + [i]
            else:
                families.append((prefix, rows))
                prefix, rows = len(prompts[i]) - 1, [i]
        families.append((prefix, rows))
        saved = sum((len(r) - 1) * p for p, r in families)
        if saved < self.min_shared_prefix or any(p < 1 for p, _ in families):
            return None
        return families

    def _prefill_shared(self, prompts: list[list[int]], plan: list[tuple[int, list[int]]]):
        """Prefill each family's prefix once, then every row's own suffix on top of its family's
        cache (:meth:`_prefill_suffixes`)."""
        prefixes = [prompts[rows[0]][:p] for p, rows in plan]
        ids, pmask, ppos = self._left_pad(prefixes)
        _, _, cache = self._forward(input_ids=ids, attention_mask=pmask, position_ids=ppos)
        self.prefill_tokens += sum(len(p) for p in prefixes)
        per_row: list = [None] * len(prompts)
        lengths = [0] * len(prompts)
        for f, (p, rows) in enumerate(plan):
            kv = self._row_kv(cache, f, pmask[f])
            for r in rows:
                per_row[r], lengths[r] = kv, p
        return self._prefill_suffixes(prompts, per_row, lengths)

    def _prefill_suffixes(self, prompts: list[list[int]], prefix_kv: list, prefix_len: list[int]):
        """Each row's prompt from the cache of its first ``prefix_len`` tokens (``prefix_kv``: one
        ``[(K, V) per layer]`` each, ``[H, L, D]``): the prefixes' caches are left-padded into one
        batch cache, then every row's own suffix is prefilled on top. Row layout:
        ``[pad | prefix | pad | suffix]``; the attention mask hides both pads and position ids count
        real tokens only, so each row sees exactly its prompt. Returns the last position's logits
        and hidden state, the cache and the attention mask."""
        from transformers import DynamicCache

        dev = self.device
        B, Lp = len(prompts), max(prefix_len)
        pmask = torch.zeros((B, Lp), dtype=torch.long, device=dev)
        layers = []
        for layer in range(len(prefix_kv[0])):
            k0, v0 = prefix_kv[0][layer]
            K = k0.new_zeros((B, k0.shape[0], Lp, k0.shape[2]))
            V = v0.new_zeros((B, v0.shape[0], Lp, v0.shape[2]))
            for i, (kv, n) in enumerate(zip(prefix_kv, prefix_len)):
                K[i, :, Lp - n :], V[i, :, Lp - n :] = kv[layer]
            layers.append((K, V))
        for i, n in enumerate(prefix_len):
            pmask[i, Lp - n :] = 1
        cache = DynamicCache(layers)
        suffixes = [p[k:] for p, k in zip(prompts, prefix_len)]
        sids, smask, _ = self._left_pad(suffixes)
        start = torch.tensor(prefix_len, dtype=torch.long, device=dev)[:, None]
        spos = (start + (smask.cumsum(-1) - 1).clamp(min=0)) * smask + start * (1 - smask)
        mask = torch.cat([pmask, smask], dim=1)
        self.prefill_tokens += sum(len(x) for x in suffixes)
        logits, hidden, cache = self._forward(input_ids=sids, attention_mask=mask, position_ids=spos,
                                              cache=cache)
        return logits, hidden, cache, mask

    # -- constrained decoding (json_schema) ----------------------------------------------------

    @property
    def _vocab_size(self) -> int:
        """``V``: the width of the logits, which the grammar's bitmask must cover."""
        return int(self._model.get_output_embeddings().weight.shape[0])

    def _grammar_matchers(self, schema: str, rows: int) -> list[Any]:
        """``rows`` fresh xgrammar matchers of ``schema``, compiled once per engine and schema."""
        xgr = _xgrammar()
        compiled = self._grammars.get(schema)
        if compiled is None:
            if self._grammar_compiler is None:
                # The grammar may end only with a token the decode loop takes for EOS.
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._eos_ids or None
                )
                self._grammar_compiler = xgr.GrammarCompiler(info)
                self._json_tokens = _json_token_bitmask(info.decoded_vocab, self._vocab_size, self._eos_ids)
            try:
                # No free whitespace (xgrammar's fixed ", " and ": " separators): given the choice, a
                # weak model can loop on spaces and newlines.
                compiled = self._grammar_compiler.compile_json_schema(schema, any_whitespace=False)
            except RuntimeError as exc:
                # xgrammar's C++ messages start with "[time] file.cc:line: ".
                reason = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(exc).strip())
                raise ValueError(f"json_schema cannot be compiled: {reason}") from None
            self._grammars[schema] = compiled
        return [xgr.GrammarMatcher(compiled) for _ in range(rows)]

    def _mask_logits(
        self, logits: torch.Tensor, matchers: list[Any], rows: torch.Tensor, bitmask: torch.Tensor
    ) -> None:
        """Set to ``-inf``, in place, the logits of every token a row's grammar does not allow next,
        and of every token with a raw control character (see :func:`_json_token_bitmask`).

        Args:
            logits: `[b, V]` float32 logits of the rows still decoding.
            matchers: one xgrammar matcher per original row (`B` of them).
            rows: `[b]` original index of each row of ``logits``.
            bitmask: `[B, ceil(V / 32)]` int32 CPU scratch; its first ``b`` rows are overwritten.
        """
        xgr = _xgrammar()
        for j, r in enumerate(rows.tolist()):
            matchers[r].fill_next_token_bitmask(bitmask, j)
        mask = bitmask[: len(rows)]
        mask &= self._json_tokens
        if logits.device.type == "cpu":
            backend = "cpu"
        else:
            # xgrammar's default GPU kernel is Triton's; without triton, plain torch ops do it.
            mask = mask.to(logits.device)
            backend = "triton" if importlib.util.find_spec("triton") else "torch_native"
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[-1], backend=backend)

    @staticmethod
    def _advance_grammars(matchers: list[Any], rows: torch.Tensor, tok: torch.Tensor) -> list[bool]:
        """Feed each row's sampled token to its matcher; whether each row's grammar is complete
        (its EOS accepted)."""
        ended = []
        for r, t in zip(rows.tolist(), tok.tolist()):
            if not matchers[r].accept_token(t):
                raise RuntimeError(f"xgrammar refused token {t} of row {r} although its mask allowed it")
            ended.append(matchers[r].is_terminated())
        return ended

    # -- the cache of conversations that may continue (multi-turn episodes) -------------------

    @staticmethod
    def _row_kv(cache: Any, row: int, mask_row: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row``'s keys and values at its real (unmasked) columns, per layer: ``[H, L, D]``."""
        cols = mask_row.nonzero().squeeze(1)
        return [(layer.keys[row][:, cols].clone(), layer.values[row][:, cols].clone()) for layer in cache.layers]

    def _remember(self, key: tuple[int, ...], cache: Any, row: int, mask_row: torch.Tensor) -> None:
        """Keep the cache of the conversation ``key`` (prompt + the tokens fed after it), newest last;
        the oldest go once more than ``keep_kv_tokens`` tokens are kept."""
        if key in self._kv:
            self._kv.move_to_end(key)
            return
        self._kv[key] = self._row_kv(cache, row, mask_row)
        self._kv_tokens += len(key)
        while self._kv_tokens > self.keep_kv_tokens and self._kv:
            old, _ = self._kv.popitem(last=False)
            self._kv_tokens -= len(old)

    def _recall(self, prompt: list[int]) -> tuple[int, list] | None:
        """The longest kept conversation that ``prompt`` continues (at least one new token)."""
        best = None
        for key, kv in self._kv.items():
            n = len(key)
            if n < len(prompt) and (best is None or n > best[0]) and tuple(prompt[:n]) == key:
                best = (n, kv)
        return best

    def forget_kv(self) -> None:
        """Drop every kept conversation cache (the rollout driver calls it after a batch of episodes)."""
        self._kv.clear()
        self._kv_tokens = 0

    # -- scoring -----------------------------------------------------------------------------

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[ScoreResult]:
        """Teacher-forced log-probs and embeddings; see :class:`~reflexdb.collector.engines.base.Engine`.

        ``temperature`` divides the logits before the softmax (1 = the model's own distribution);
        no top-p truncation is applied.
        """
        if len(prompt_ids) != len(response_ids):
            raise ValueError("prompt_ids and response_ids must have the same length")
        if temperature <= 0:
            raise ValueError("score temperature must be > 0")
        pairs = [([int(t) for t in p], [int(t) for t in r]) for p, r in zip(prompt_ids, response_ids)]
        for p, r in pairs:
            if not p or not r:
                raise ValueError("score needs a non-empty prompt and response")
            if len(p) + len(r) > self._max_positions:
                raise ValueError(f"sequence of {len(p) + len(r)} tokens exceeds the context of {self._max_positions}")
        # Similar lengths together: less padding. Results go back in input order.
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        results: list[ScoreResult | None] = [None] * len(pairs)
        chunk: list[int] = []
        for i in order:
            cand = chunk + [i]
            P = max(len(pairs[j][0]) for j in cand)
            T = max(len(pairs[j][1]) for j in cand)
            if chunk and (len(cand) > self.max_batch_size or len(cand) * (P + T) > self.score_token_budget):
                self._score_chunk([pairs[j] for j in chunk], chunk, temperature, results)
                chunk = [i]
            else:
                chunk = cand
        if chunk:
            self._score_chunk([pairs[j] for j in chunk], chunk, temperature, results)
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _score_chunk(
        self,
        pairs: list[tuple[list[int], list[int]]],
        index: list[int],
        temperature: float,
        results: list[ScoreResult | None],
    ) -> None:
        # Prompts left-padded to P, responses right-padded to T: response token t of every row
        # sits in column P + t and is predicted from column P + t - 1.
        P = max(len(p) for p, _ in pairs)
        T = max(len(r) for _, r in pairs)
        b = len(pairs)
        input_ids = torch.full((b, P + T), self._pad_id, dtype=torch.long)
        mask = torch.zeros((b, P + T), dtype=torch.long)
        for i, (p, r) in enumerate(pairs):
            input_ids[i, P - len(p) : P + len(r)] = torch.tensor(p + r, dtype=torch.long)
            mask[i, P - len(p) : P + len(r)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self._model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=T + 1,  # columns P-1 .. P+T-1; the last one predicts nothing we need
        )
        # out.logits[:, t] (column P-1+t) predicts response token t (column P+t).
        token_lp, _ = token_logprobs(out.logits[:, :T], input_ids[:, P : P + T], temperature=temperature)
        token_lp = token_lp.cpu().numpy()  # [b, T]
        hidden = out.hidden_states[-1][:, P - 1 : P - 1 + T].float().cpu().numpy()  # [b, T, D]
        for i, (_, r) in enumerate(pairs):
            t = len(r)
            results[index[i]] = ScoreResult(
                logprobs=token_lp[i, :t].astype(np.float32),
                embedding=hidden[i, :t].mean(axis=0).astype(np.float32),
            )

    # -- weights -----------------------------------------------------------------------------

    def load_weights(self, path: str | Path) -> None:
        """Copy the weights of a safetensors checkpoint (a directory written by
        ``save_pretrained``, sharded or not, or one ``.safetensors`` file) into the model in place.

        Every parameter must be present with the same shape (tied weights count once); otherwise
        :class:`~reflexdb.collector.errors.CheckpointMismatch` is raised and the model is unchanged.
        """
        from safetensors import safe_open

        path = checkpoint_path(path)
        files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelUnavailable(f"no .safetensors files in checkpoint {path}")
        params = dict(self._model.named_parameters(remove_duplicate=False))
        shapes: dict[str, tuple[Path, tuple[int, ...]]] = {}
        for f in files:
            with safe_open(str(f), framework="pt", device="cpu") as fh:
                for key in fh.keys():
                    shapes[key] = (f, tuple(fh.get_slice(key).get_shape()))
        unexpected = sorted(k for k in shapes if k not in params)
        covered = {id(params[k]) for k in shapes if k in params}
        missing = sorted(k for k, v in self._model.named_parameters() if id(v) not in covered)
        wrong = sorted(k for k, (_, s) in shapes.items() if k in params and tuple(params[k].shape) != s)
        if unexpected or missing or wrong:
            raise CheckpointMismatch(
                f"checkpoint {path} does not fit the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}, wrong shape {wrong[:5]}"
            )
        with torch.no_grad():
            for f in files:
                with safe_open(str(f), framework="pt", device="cpu") as fh:
                    for key in fh.keys():
                        params[key].copy_(fh.get_tensor(key))
        self.checkpoint = str(path)
        log.info("loaded weights from %s", path)

    def close(self) -> None:
        self._model = None  # type: ignore[assignment]
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
