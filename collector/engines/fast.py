"""The ``fast`` engine: continuous batching over a preallocated KV cache, for GPUs.

The ``hf`` engine's loop pays Python and a host synchronisation every token, grows its cache by
concatenation, and idles a chunk's slots once their rows end. This one keeps ``slots`` rows
decoding at once over a cache allocated once per call (``[slots, kv_heads, context, head_dim]``
per layer), and one decode step is a fixed-shape function of fixed buffers:

* **Continuous batching.** A row that ends frees its slot; a waiting sample takes it at the next
  check. The ``n`` samples of a prompt admitted together share one prefill.
* **No host synchronisation per token.** Sampling (:func:`~.hf.sample_tokens` with
  :func:`~.hf.counter_uniforms`), EOS and stop-token detection, the response buffers and the
  embedding sums all stay on the device; the host looks every ``check_every`` steps, to harvest
  ended rows, match stop strings and admit waiting samples.
* **One decode step as a CUDA graph** on CUDA (:class:`StepGraph`), replayed every token; on a
  CPU the same step runs eagerly through the same buffers (the stand-in the tests exercise).

What a sample holds is the ``hf`` engine's, number for number (``tests/unit/test_fast_engine.py``
checks token ids, log-probs and embeddings in float32): the same sampling function, the same
counter-based uniforms per (seed, row, step), the same stop rules — a stop string is looked for at
every token's end, in the window :func:`~.hf.stop_window`, so a row ends where the ``hf`` engine
would end it, and the tokens decoded past that point before the check are dropped, their hidden
states taken back out of the embedding. Two differences: a row's room is its own prompt's
(``hf`` leaves every row of a chunk the room of its longest prompt), and prompts are prefilled
one admission at a time without cross-prompt prefix sharing.

Calls with ``json_schema`` (the grammar's matcher runs on the host every token) and calls while
``keep_kv`` is on (multi-turn episodes keep each row's cache) go to the ``hf`` loop this engine
inherits. The decode step is written for the Llama family (Llama, SmolLM2, Qwen2, Mistral
without sliding windows): a model of another architecture is refused when the engine is built.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from reflexdb.errors import ModelUnavailable

from .base import Prompt, Sample, SamplingParams, encode_prompt
from .hf import HFEngine, call_seed, counter_uniforms, find_stop, sample_tokens, stop_window

log = logging.getLogger(__name__)

#: Architectures whose decoder layers :class:`SlotDecoder` reproduces exactly.
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


class UnsupportedModel(ModelUnavailable, ValueError):
    """The model's architecture is not one the ``fast`` engine's decode step reproduces (exit 7,
    as a model that cannot be loaded)."""


class SlotDecoder:
    """One decode step of a Llama-family model over a slot KV cache.

    Each slot holds one row: its keys and values at positions ``0..pos-1``, written in place; a
    step feeds one token per slot at position ``pos`` and attends to positions ``<= pos``. Rows of
    every length share the step; positions past a row's ``pos`` are masked, whatever they hold.
    """

    def __init__(self, model: torch.nn.Module):
        arch = type(model).__name__
        config = model.config
        if arch not in SUPPORTED:
            raise UnsupportedModel(
                f"the fast engine decodes {', '.join(SUPPORTED)}; this model is {arch}: use engine: hf"
            )
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) and arch != "LlamaForCausalLM":
            raise UnsupportedModel(f"the fast engine has no sliding-window attention ({arch}): use engine: hf")
        self.model = model
        self.layers = list(model.model.layers)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.kv_heads = int(config.num_key_value_heads)
        self.heads = int(config.num_attention_heads)
        self.scaling = float(attn.scaling)

    def allocate(self, slots: int, context: int, dtype: torch.dtype, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A zeroed cache: per layer, keys and values ``[slots, kv_heads, context, head_dim]``."""
        shape = (slots, self.kv_heads, context, self.head_dim)
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in self.layers]

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``tokens`` `[S]` at positions ``pos`` `[S]`; write their keys and values into ``cache``
        and return the next-token float32 logits `[S, V]` and final-norm hidden states `[S, D]`."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        inner = self.model.model
        S = tokens.shape[0]
        context = cache[0][0].shape[2]
        h = inner.embed_tokens(tokens[:, None])  # [S, 1, D]
        cos, sin = inner.rotary_emb(h, pos[:, None])  # [S, 1, hd]
        visible = (torch.arange(context, device=pos.device)[None, :] <= pos[:, None])[:, None, None, :]  # [S, 1, 1, L]
        slot = torch.arange(S, device=pos.device)
        for layer, (K, V) in zip(self.layers, cache):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(S, 1, self.heads, self.head_dim).transpose(1, 2)  # [S, H, 1, hd]
            k = attn.k_proj(x).view(S, 1, self.kv_heads, self.head_dim).transpose(1, 2)  # [S, Hkv, 1, hd]
            v = attn.v_proj(x).view(S, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            K[slot, :, pos] = k[:, :, 0]
            V[slot, :, pos] = v[:, :, 0]
            o = F.scaled_dot_product_attention(q, K, V, attn_mask=visible, scale=self.scaling,
                                               enable_gqa=self.heads != self.kv_heads)  # [S, H, 1, hd]
            h = h + attn.o_proj(o.transpose(1, 2).reshape(S, 1, self.heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = inner.norm(h)
        logits = self.model.lm_head(h)
        return logits[:, 0].float(), h[:, 0].float()


class StepGraph:
    """``fn()`` run as one CUDA graph (captured on first use, replayed after), or eagerly.

    ``fn`` reads and writes only tensors that outlive the graph (the engine's buffers); the host
    changes them in place between replays. On a CPU, or with ``enabled=False``, :meth:`__call__`
    simply calls ``fn``: the bookkeeping around it is the same, which is what the CPU tests check.
    """

    def __init__(self, fn: Callable[[], None], device: torch.device, *, enabled: bool = True, warmup: int = 2):
        self.fn = fn
        self.enabled = enabled and device.type == "cuda"
        self.warmup = warmup
        self.graph: Any = None
        self.replays = 0

    def __call__(self) -> None:
        if not self.enabled:
            self.fn()
            return
        if self.graph is None:
            self._capture()
        self.graph.replay()
        self.replays += 1

    def _capture(self) -> None:
        # Warm-up on a side stream (cuBLAS workspaces, lazy kernels), then capture. The warm-up steps
        # run on real buffers: the caller captures before its first real step, on buffers it resets.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                self.fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.fn()
        self.graph = graph


def _decode_step(forward: Callable[..., tuple[torch.Tensor, torch.Tensor]], params: SamplingParams,
                 logits: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, n: torch.Tensor,
                 limit: torch.Tensor, row: torch.Tensor, live: torch.Tensor, stopped: torch.Tensor,
                 tokens: torch.Tensor, logprobs: torch.Tensor, emb: torch.Tensor, ring: torch.Tensor,
                 seed: torch.Tensor, stop_ids: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The body of one decode step over the :class:`_Buffers` (named there), every tensor passed
    explicitly and changed in place: what ``torch.compile`` traces and a CUDA graph captures."""
    S, T = tokens.shape
    slot = torch.arange(S, device=n.device)
    col = n.clamp(max=T - 1)
    tok, lp = sample_tokens(logits, params, uniforms=counter_uniforms(seed, row, n))
    was_live = live.clone()
    tokens[slot, col] = torch.where(was_live, tok, tokens[slot, col])
    logprobs[slot, col] = torch.where(was_live, lp, logprobs[slot, col])
    state = hidden * was_live[:, None]
    emb.add_(state)
    ring[slot, n % ring.shape[1]] = state
    n.add_(was_live.long())
    hit = (tok[:, None] == stop_ids[None, :]).any(dim=1) & was_live
    stopped.logical_or_(hit)
    live.logical_and_(~hit & (n < limit))
    new_logits, new_hidden = forward(tok, pos, cache)  # SlotDecoder.step, compiled or not
    logits.copy_(new_logits)
    hidden.copy_(new_hidden)
    pos.add_(live.long())  # a row that ended stays put: its position must stay inside the cache


@dataclass
class _Buffers:
    """Everything one decode step reads and writes, per slot (`S` rows)."""

    cache: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor  # [S, V] float32: the distribution of each slot's next token
    hidden: torch.Tensor  # [S, D] float32: the state that produced it
    pos: torch.Tensor  # [S] int64: position the next token is fed at
    n: torch.Tensor  # [S] int64: tokens sampled so far
    limit: torch.Tensor  # [S] int64: the most tokens the row may sample
    row: torch.Tensor  # [S] int64: the row of the call (prompt * n + sample)
    live: torch.Tensor  # [S] bool: decoding
    stopped: torch.Tensor  # [S] bool: ended by EOS or a stop token
    tokens: torch.Tensor  # [S, T] int64 response so far
    logprobs: torch.Tensor  # [S, T] float32
    emb: torch.Tensor  # [S, D] float32 sum of the hidden states that produced the tokens
    ring: torch.Tensor  # [S, k, D] float32: hidden state of token t at [t % k]
    seed: torch.Tensor  # [] int64
    stop_ids: torch.Tensor  # [E] int64


class FastEngine(HFEngine):
    """Continuous-batching engine; see the module docstring and
    :class:`~reflexdb.collector.engines.base.Engine`.

    Args:
        model, device, dtype, score_token_budget, cache_dir, share_prefixes, min_shared_prefix,
            keep_kv_tokens: as :class:`~.hf.HFEngine`.
        max_batch_size: slots: rows decoded together (default 256 on CUDA, 32 on a CPU).
        check_every: decode steps between the host's looks (harvest, stop strings, admission): a row
            that ends decodes up to ``check_every - 1`` discarded tokens.
        cuda_graphs: capture the decode step as a CUDA graph on CUDA (off: run it eagerly).
        compile: ``torch.compile`` the decode step (fused kernels; on a CPU minutes of compiling
            for no gain at CPU batch sizes). Off by default: on an H100 it made a step 1.75x faster (48,323 -> 84,676 tokens/s at 256
            rows) but each process's first call of a shape 10 s longer with a warm Inductor cache
            and 44 s longer with a cold one, and in a run end to end the collector generated 16 %
            of its time, waiting for the learner the rest (docs/benchmarks.md). Turn it on
            (``collector.engine_options: {compile: true}``) where the collector bounds the run.
        context_multiple: the cache's context is the call's longest prompt plus
            ``max_new_tokens``, rounded up to this, so calls of similar sizes reuse one cache and graph.
    """

    kind = "fast"

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        max_batch_size: int | None = None,
        check_every: int = 8,
        cuda_graphs: bool = True,
        compile: bool = False,
        context_multiple: int = 64,
        **kwargs: Any,
    ):
        device = kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        if max_batch_size is None:
            max_batch_size = 256 if torch.device(device).type == "cuda" else 32
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        super().__init__(model, max_batch_size=max_batch_size, **kwargs)
        self.decoder = SlotDecoder(self._model)
        self.check_every = check_every
        self.cuda_graphs = cuda_graphs
        self.compiled = compile
        self._step_fn: Callable[..., None] | None = None
        self.context_multiple = context_multiple
        self._state: tuple[tuple, _Buffers, StepGraph] | None = None
        #: decode steps run and slot-steps that carried a live row (their ratio: slot occupancy)
        self.steps = self.live_slot_steps = 0

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, params: SamplingParams = SamplingParams()
    ) -> list[list[Sample]]:
        if params.json_schema is not None or self.keep_kv:
            return super().generate(prompts, n, params)
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        ids = [encode_prompt(self._tokenizer, p) for p in prompts]
        if any(not p for p in ids):
            raise ValueError("empty prompt")
        longest = max(len(p) for p in ids)
        if self._max_positions - longest < 1:
            raise ValueError(f"prompt of {longest} tokens leaves no room in the context of {self._max_positions}")
        with torch.inference_mode():
            return self._run(ids, n, params)

    def _buffers(self, params: SamplingParams, context: int, T: int, stop_ids: list[int]) -> tuple[_Buffers, StepGraph]:
        """The call's buffers and step, reused from the last call when the shapes and sampling agree."""
        S, dev = self.max_batch_size, self.device
        E = max(8, 1 << (len(stop_ids) - 1).bit_length())  # stop-id slots, padded with -1
        key = (S, context, T, E, params.temperature, params.top_p, params.greedy)
        if self._state is not None and self._state[0] == key:
            b = self._state[1]
            b.stop_ids.fill_(-1)
            b.stop_ids[: len(stop_ids)] = torch.tensor(stop_ids, dtype=torch.long)
            return b, self._state[2]
        self._state = None  # free the old cache (and graph) before allocating a new one
        D = self.hidden_size
        V = self._vocab_size
        b = _Buffers(
            cache=self.decoder.allocate(S, context, self.dtype, dev),
            logits=torch.zeros((S, V), dtype=torch.float32, device=dev),
            hidden=torch.zeros((S, D), dtype=torch.float32, device=dev),
            pos=torch.zeros(S, dtype=torch.long, device=dev),
            n=torch.zeros(S, dtype=torch.long, device=dev),
            limit=torch.zeros(S, dtype=torch.long, device=dev),
            row=torch.zeros(S, dtype=torch.long, device=dev),
            live=torch.zeros(S, dtype=torch.bool, device=dev),
            stopped=torch.zeros(S, dtype=torch.bool, device=dev),
            tokens=torch.zeros((S, T), dtype=torch.long, device=dev),
            logprobs=torch.zeros((S, T), dtype=torch.float32, device=dev),
            emb=torch.zeros((S, D), dtype=torch.float32, device=dev),
            ring=torch.zeros((S, self.check_every, D), dtype=torch.float32, device=dev),
            seed=torch.zeros((), dtype=torch.long, device=dev),
            stop_ids=torch.full((E,), -1, dtype=torch.long, device=dev),
        )
        b.stop_ids[: len(stop_ids)] = torch.tensor(stop_ids, dtype=torch.long)
        graph = StepGraph(lambda: self._step(b, params), dev, enabled=self.cuda_graphs)
        self._state = (key, b, graph)
        return b, graph

    def _step(self, b: _Buffers, params: SamplingParams) -> None:
        """One token for every slot (the function a CUDA graph captures: fixed shapes, no host reads).
        Slots that are not live compute too, and change nothing the host reads."""
        if self._step_fn is None:
            # torch.compile fuses the model's small kernels (norms, rotary, activations) into a few
            # hundred; Dynamo traces once per shape. The sampler stays eager: Inductor cannot
            # generate its float64 cumulative sum (torch 2.11).
            forward = torch.compile(self.decoder.step, dynamic=False) if self.compiled else self.decoder.step
            self._step_fn = functools.partial(_decode_step, forward)
        self._step_fn(params, b.logits, b.hidden, b.pos, b.n, b.limit, b.row, b.live, b.stopped, b.tokens,
                      b.logprobs, b.emb, b.ring, b.seed, b.stop_ids, b.cache)

    def _run(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        dev, S, k = self.device, self.max_batch_size, self.check_every
        T = params.max_new_tokens
        context = max(len(p) for p in prompts) + T
        context = min(-(-context // self.context_multiple) * self.context_multiple, self._max_positions)
        stop_ids = sorted(set(self._eos_ids) | set(params.stop_token_ids))
        b, graph = self._buffers(params, context, T, stop_ids)
        b.seed.fill_(call_seed(params))
        b.live.zero_()
        b.stopped.zero_()
        window = stop_window(params.stop)
        self.prompt_tokens += sum(len(p) for p in prompts) * n

        waiting = [(i, j) for i in range(len(prompts)) for j in range(n)]  # rows not admitted yet
        waiting.reverse()  # popped from the end: prompt order
        holder: list[int | None] = [None] * S  # the row each slot holds
        results: dict[int, Sample] = {}
        n_host = np.zeros(S, dtype=np.int64)  # tokens of each slot at the last look
        emb_at_look = b.emb.clone()
        while True:
            free = [s for s in range(S) if holder[s] is None]
            if waiting and free:
                admitted = [waiting.pop() for _ in range(min(len(free), len(waiting)))]
                self._admit(b, prompts, admitted, free[: len(admitted)], n)
                for s, (i, j) in zip(free, admitted):
                    holder[s] = i * n + j
                    n_host[s] = 0
                emb_at_look.copy_(b.emb)
            if all(h is None for h in holder):
                break
            if graph.enabled and graph.graph is None:
                self._capture_safely(b, graph)
            for _ in range(k):
                graph()
            self.steps += k
            # The look: one synchronisation every k steps.
            live, stopped, counts = torch.stack([b.live.long(), b.stopped.long(), b.n]).cpu().numpy()  # one copy
            live, stopped = live.astype(bool), stopped.astype(bool)
            self.live_slot_steps += int((counts - n_host)[[h is not None for h in holder]].sum())
            ended: dict[int, tuple[int, str, str | None]] = {}  # slot -> (tokens, reason, stop string)
            if params.stop:
                held = [s for s in range(S) if holder[s] is not None]
                rows_np = b.tokens[held].cpu().numpy() if held else None
                for idx, s in enumerate(held):
                    last = int(counts[s]) - (1 if stopped[s] else 0)  # hf looks for strings only when no stop token ended the row
                    hit = self._first_stop(rows_np[idx], int(n_host[s]), last, params.stop, window)
                    if hit is not None:
                        ended[s] = (hit[0], "stop", hit[1])
            for s in range(S):
                if holder[s] is not None and not live[s] and s not in ended:
                    ended[s] = (int(counts[s]), "stop" if stopped[s] else "length", None)
            if ended:
                self._harvest(b, prompts, n, holder, ended, n_host, emb_at_look, results)
                for s in ended:
                    holder[s] = None
            n_host[:] = counts
            emb_at_look.copy_(b.emb)
        return [[results[i * n + j] for j in range(n)] for i in range(len(prompts))]

    def _capture_safely(self, b: _Buffers, graph: StepGraph) -> None:
        """Capture the step (its warm-up runs it for real): on copies of the live state, restored after."""
        saved = {f: getattr(b, f).clone() for f in ("logits", "hidden", "pos", "n", "live", "stopped", "tokens", "logprobs", "emb", "ring")}
        cache = [(K.clone(), V.clone()) for K, V in b.cache]
        graph._capture()
        for f, t in saved.items():
            getattr(b, f).copy_(t)
        for (K, V), (K0, V0) in zip(b.cache, cache):
            K.copy_(K0)
            V.copy_(V0)

    def _first_stop(self, row: np.ndarray, start: int, last: int, stop: Sequence[str], window: int) -> tuple[int, str] | None:
        """The first response length in ``(start, last]`` at which a stop string ends the row, as the
        ``hf`` engine checks after every token; one decode of the span when none is there."""
        if last <= start:
            return None
        text = self._tokenizer.decode(row[max(0, start + 1 - window) : last].tolist())
        if not any(s in text for s in stop):
            return None
        for end in range(start + 1, last + 1):
            hit = find_stop(self._tokenizer, row, end, stop, window)
            if hit is not None:
                return end, hit
        return None

    def _admit(self, b: _Buffers, prompts: list[list[int]], admitted: list[tuple[int, int]], slots: list[int], n: int) -> None:
        """Prefill the admitted rows' prompts (each distinct prompt once) and set up their slots."""
        dev = self.device
        distinct = sorted({i for i, _ in admitted})
        where = {i: d for d, i in enumerate(distinct)}
        batch = [prompts[i] for i in distinct]
        input_ids, mask, positions = self._left_pad(batch)
        logits, hidden, cache = self._forward(input_ids=input_ids, attention_mask=mask, position_ids=positions)
        self.prefill_tokens += sum(len(p) for p in batch)
        P = input_ids.shape[1]
        src = torch.tensor([where[i] for i, _ in admitted], dtype=torch.long, device=dev)  # [A]
        dst = torch.tensor(slots, dtype=torch.long, device=dev)
        lengths = torch.tensor([len(prompts[i]) for i, _ in admitted], dtype=torch.long, device=dev)
        # Left-padded column P - len + t holds token t: gather it into slot column t.
        cols = (P - lengths[:, None] + torch.arange(P, device=dev)[None, :]).clamp(max=P - 1)  # [A, P]
        for (K, V), layer in zip(b.cache, cache.layers):
            for dst_cache, src_cache in ((K, layer.keys), (V, layer.values)):
                rows = src_cache.index_select(0, src)  # [A, Hkv, P, hd]
                idx = cols[:, None, :, None].expand(-1, rows.shape[1], -1, rows.shape[3])
                dst_cache[dst, :, :P] = rows.gather(2, idx).to(dst_cache.dtype)
        b.logits[dst] = logits.index_select(0, src)
        b.hidden[dst] = hidden.index_select(0, src)
        b.pos[dst] = lengths
        b.n[dst] = 0
        room = torch.clamp(self._max_positions - lengths, max=b.tokens.shape[1])
        b.limit[dst] = room
        b.row[dst] = torch.tensor([i * n + j for i, j in admitted], dtype=torch.long, device=dev)
        b.live[dst] = True
        b.stopped[dst] = False
        b.emb[dst] = 0.0

    def _harvest(self, b: _Buffers, prompts: list[list[int]], n: int, holder: list[int | None],
                 ended: dict[int, tuple[int, str, str | None]], n_host: np.ndarray, emb_at_look: torch.Tensor,
                 results: dict[int, Sample]) -> None:
        """Copy the ended slots' responses out: tokens and log-probs up to where each ended, the
        embedding from the sum at the last look plus the ring's states up to that point."""
        slots = sorted(ended)
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        tokens = b.tokens.index_select(0, idx).cpu().numpy()
        logprobs = b.logprobs.index_select(0, idx).cpu().numpy()
        counts = b.n.index_select(0, idx).cpu().numpy()
        sums = b.emb.index_select(0, idx).cpu().numpy()
        base = emb_at_look.index_select(0, idx).cpu().numpy()
        ring = b.ring.index_select(0, idx).cpu().numpy()
        k = ring.shape[1]
        b.live[idx] = False  # a row a stop string ended (found here) decodes no more
        for a, s in enumerate(slots):
            t, reason, matched = ended[s]
            if t == counts[a]:  # ended on the device: its sum is the hf engine's, added in the same order
                emb = sums[a]
            else:  # a stop string ended it at t: the states of the tokens after t come back out
                emb = base[a].copy()
                for u in range(int(n_host[s]), t):
                    emb += ring[a, u % k]
            row = holder[s]
            assert row is not None
            ids = tokens[a, :t].astype(np.int32)
            results[row] = Sample(
                prompt_ids=np.asarray(prompts[row // n], dtype=np.int32),
                token_ids=ids,
                logprobs=logprobs[a, :t].astype(np.float32),
                finish_reason=reason,  # type: ignore[arg-type]
                text=self._tokenizer.decode(ids.tolist(), skip_special_tokens=True),
                embedding=(emb / np.float32(max(t, 1))).astype(np.float32),
                stop=matched,
            )

    def close(self) -> None:
        self._state = None
        super().close()
