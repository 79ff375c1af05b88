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

import inspect
import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .base import Prompt, Sample, SamplingParams, encode_prompt
from .model import LoadedModel, ModelFacade
from .sampling import (  # noqa: F401 - re-exported: the sampler's old home
    Grammars, RowSampling, apply_bitmask, call_seed, counter_uniforms, find_stop, make_sample, sample_tokens,
    stop_window, xgrammar,
)

log = logging.getLogger(__name__)


class HFEngine(ModelFacade):
    """Transformers engine; see :class:`~reflexdb.collector.engines.base.Engine`.

    Args:
        model: a model directory, ``"smollm2"`` (default, converted once from the GGUF wheel) or
            ``"tiny"`` (random 2-layer model for tests); see :func:`~reflexdb.models.resolve_model`;
            or a :class:`~.model.LoadedModel` (a model already in memory).
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
        model: str | Path | LoadedModel | None = None,
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
        self.lm = LoadedModel.of(model, device=device, dtype=dtype, cache_dir=cache_dir)
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
        #: json_schema decoding, set up on first use (xgrammar's compiler, one grammar per schema)
        self.grammars = Grammars(self.lm.tokenizer, self.lm.vocab_size, self.lm.eos_ids)

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, params: SamplingParams = SamplingParams()
    ) -> list[list[Sample]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        ids = [encode_prompt(self.lm.tokenizer, p) for p in prompts]
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
            self._cache_kw = "cache" if "cache" in inspect.signature(self.lm.model.forward).parameters else "past_key_values"
        if "cache" in kwargs and self._cache_kw != "cache":
            kwargs[self._cache_kw] = kwargs.pop("cache")
        out = self.lm.model(**kwargs, use_cache=True, output_hidden_states=True, logits_to_keep=1)
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
        max_new = min(params.max_new_tokens, self.lm.max_positions - P)
        if max_new < 1:
            raise ValueError(f"prompt of {P} tokens leaves no room in the context of {self.lm.max_positions}")
        B = len(prompts) * n
        # Before any forward pass, so that a schema xgrammar refuses costs nothing.
        grammars = self.grammars.matchers(params.json_schema, B) if params.json_schema is not None else None

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
        stop_ids = torch.tensor(sorted(set(self.lm.eos_ids) | set(params.stop_token_ids)), dtype=torch.long, device=dev)
        window = stop_window(params.stop)
        rows = torch.arange(B, device=dev)  # original index of each row still decoding
        sampling = RowSampling.of(params, B, dev)  # every row's settings: the call's
        # [B, ceil(V / 32)] int32: which tokens each row's grammar allows next
        bitmask = xgrammar().allocate_token_bitmask(B, self.lm.vocab_size) if grammars is not None else None

        for step in range(max_new):
            # One uniform per (call seed, row of the call, step): a row's draws depend neither on
            # which other rows are still decoding nor on how the call was cut into chunks.
            uniforms = counter_uniforms(seed, rows + first_row, step)
            if grammars is not None:  # before sampling: `lp` is then the masked distribution's
                self._mask_logits(logits, grammars, rows, bitmask)
            tok, lp = sample_tokens(logits, sampling[rows], uniforms=uniforms)  # [b], [b]
            tokens[rows, step] = tok
            logprobs[rows, step] = lp
            emb_sum[rows] += hidden  # the state that produced `tok`
            n_tokens[rows] += 1
            done = torch.isin(tok, stop_ids)  # [b]
            if grammars is not None:
                done |= torch.tensor([self.grammars.advance(grammars[r], t, r) for r, t in zip(rows.tolist(), tok.tolist())],
                                    dtype=torch.bool, device=dev)
            if params.stop:
                done = done.cpu()
                for j, r in enumerate(rows.tolist()):
                    if done[j]:
                        continue
                    hit = find_stop(self.lm.tokenizer, tokens[r], step + 1, params.stop, window)
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
        return [[make_sample(self.lm.tokenizer, p, tokens_np[r, : int(lengths_np[r])], logprobs_np[r, : int(lengths_np[r])],
                             reason[r], emb_np[r], matched[r]) for r in range(i * n, (i + 1) * n)]
                for i, p in enumerate(prompts)]

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.lm.left_pad(prompts)

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

    def _mask_logits(self, logits: torch.Tensor, matchers: list[Any], rows: torch.Tensor,
                     bitmask: torch.Tensor) -> None:
        """Set to ``-inf``, in place, the logits of every token a row's grammar does not allow next,
        and of every token with a raw control character (:func:`~.sampling.json_token_bitmask`).

        Args:
            logits: `[b, V]` float32 logits of the rows still decoding.
            matchers: one xgrammar matcher per original row (`B` of them).
            rows: `[b]` original index of each row of ``logits``.
            bitmask: `[B, ceil(V / 32)]` int32 CPU scratch; its first ``b`` rows are overwritten.
        """
        for j, r in enumerate(rows.tolist()):
            self.grammars.fill(matchers[r], bitmask, j)
        apply_bitmask(logits, bitmask[: len(rows)])

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
