"""The ``fast`` engine: continuous batching over a paged KV cache, for GPUs (and CPUs).

Four small parts, nano-vllm's way:

* **block manager** (:mod:`.blocks`): fixed-size KV blocks with reference counts, a free list and a
  cache of full blocks by content;
* **scheduler** (:mod:`.scheduler`): rows waiting, being prefilled (in chunks of
  ``prefill_chunk`` tokens between decode steps) and decoding; admission while slots and blocks
  last; kept conversations; preemption (recompute) when the pool runs short;
* **model runner** (:mod:`.paged`): the decoder's forward over block tables, for prefill chunks
  and for one decode step; Llama, SmolLM2, Qwen2, Mistral and Qwen3;
* **sampler** (:mod:`.sampling`): the sampler, draws, stop strings and grammar masks the ``hf``
  engine uses too.

This module ties them: ``max_batch_size`` *slots* decode one token each per step, a fixed-shape
function of fixed buffers (:func:`_decode_step`), run as a CUDA graph on CUDA (one per bucket of
block-table width) and eagerly on a CPU. Sampling, EOS and stop-token detection, the response
buffers and the embedding sums stay on the device; the host looks every ``check_every`` steps to
harvest ended rows, match stop strings, admit waiting rows and give rows blocks for the next steps
(every step while a ``json_schema`` row decodes: its grammar's matcher advances on the host, and
the next token's bitmask goes to the device before the step samples).

What a sample holds is the ``hf`` engine's, number for number (``tests/unit/test_fast_engine.py``
checks token ids, log-probs and embeddings in float32): the same sampling function with each row's
own settings, the same counter-based uniforms per (seed, row, step), the same stop rules and
grammars. Multi-turn episodes: while ``keep_kv`` is on (the rollout driver sets it), a row that
ends keeps its blocks, and the next turn of its episode prefills only the tokens the environment
added (``hf``'s kept caches, in blocks). :meth:`FastEngine.generate_batch` decodes rows of several
calls (other sampling settings, a ``json_schema`` or none) in one batch.

Two differences from ``hf``: a row's room is its own prompt's (``hf`` leaves every row of a chunk
the room of its longest prompt), and the context is at most what the pool holds for one row.
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

from .base import Prompt, Sample, SamplingParams, encode_prompt
from .blocks import BlockManager
from .model import LoadedModel, ModelFacade
from .paged import SUPPORTED, KVPool, PagedModel, UnsupportedModel
from .sampling import (
    Grammars, RowSampling, call_seed, counter_uniforms, first_stop, make_sample, sample_tokens, stop_window,
    unpack_bitmask, xgrammar,
)
from .scheduler import Job, Row, Scheduler

log = logging.getLogger(__name__)

__all__ = ["SUPPORTED", "FastEngine", "StepGraph", "UnsupportedModel", "plan_pool"]


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
        # run on real buffers: the caller saves and restores them around the capture.
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


@dataclass
class _Buffers:
    """Everything one decode step reads and writes, per slot (`S` rows)."""

    logits: torch.Tensor  # [S, V] float32: the distribution of each slot's next token
    hidden: torch.Tensor  # [S, D] float32: the state that produced it
    pos: torch.Tensor  # [S] int64: position the next token is fed at
    n: torch.Tensor  # [S] int64: tokens sampled so far
    limit: torch.Tensor  # [S] int64: the most tokens the row may sample
    row: torch.Tensor  # [S] int64: the row of its call (prompt * n + sample)
    seed: torch.Tensor  # [S] int64: its call's seed
    live: torch.Tensor  # [S] bool: decoding
    stopped: torch.Tensor  # [S] bool: ended by EOS or a stop token
    tokens: torch.Tensor  # [S, T] int64 response so far
    logprobs: torch.Tensor  # [S, T] float32
    emb: torch.Tensor  # [S, D] float32 sum of the hidden states that produced the tokens
    ring: torch.Tensor  # [S, k, D] float32: hidden state of token t at [t % k]
    stop_ids: torch.Tensor  # [S, E] int64: each slot's stop tokens, padded with -1
    temperature: torch.Tensor  # [S] float32 (1 on greedy rows)
    top_p: torch.Tensor  # [S] float32
    greedy: torch.Tensor  # [S] bool
    bitmask: torch.Tensor  # [S, W] int32: tokens each row may sample (all bits set: any)
    table: torch.Tensor  # [S, Bcap] int64: block table


def _decode_step(model: PagedModel, forward: Callable[..., torch.Tensor], pool: KVPool, width: int,
                 masked: bool, any_top_p: bool, any_greedy: bool, b: _Buffers) -> None:
    """One token for every slot (what a CUDA graph captures: fixed shapes, no host reads); slots
    that are not live compute too and change nothing the host reads. ``width``: the block-table
    columns read (the bucket); ``masked``: apply each row's grammar bitmask before sampling."""
    S, T = b.tokens.shape
    slot = torch.arange(S, device=b.n.device)
    if masked:
        b.logits.masked_fill_(~unpack_bitmask(b.bitmask, b.logits.shape[1]), float("-inf"))
    settings = RowSampling(b.temperature, b.top_p, b.greedy, any_top_p, any_greedy)
    tok, lp = sample_tokens(b.logits, settings, uniforms=counter_uniforms(b.seed, b.row, b.n))
    col = b.n.clamp(max=T - 1)
    was_live = b.live.clone()
    b.tokens[slot, col] = torch.where(was_live, tok, b.tokens[slot, col])
    b.logprobs[slot, col] = torch.where(was_live, lp, b.logprobs[slot, col])
    state = b.hidden * was_live[:, None]
    b.emb.add_(state)
    b.ring[slot, b.n % b.ring.shape[1]] = state
    b.n.add_(was_live.long())
    hit = (tok[:, None] == b.stop_ids).any(dim=1) & was_live
    b.stopped.logical_or_(hit)
    b.live.logical_and_(~hit & (b.n < b.limit))
    bs = pool.block_size
    blocks = b.table.gather(1, (b.pos // bs).clamp(max=b.table.shape[1] - 1)[:, None])[:, 0]
    write = torch.where(was_live, blocks * bs + b.pos % bs, torch.full_like(b.pos, pool.scratch))
    hidden = forward(tok[:, None], b.pos[:, None], write[:, None], b.table[:, :width], pool)[:, 0]  # [S, D]
    b.logits.copy_(model.logits(hidden))
    b.hidden.copy_(hidden.float())
    b.pos.add_(b.live.long())  # a row that ended stays put: its position must stay inside the context


def bucket(blocks: int) -> int:
    """The block-table width a decode step reads for rows of at most ``blocks`` blocks: rounded up to
    a multiple of ``2 ** (bit_length - 3)`` (1, 2, 3, 4, ..., 8, 10, 12, 14, 16, 20, ...): each row
    reads its table to that width, so the bucket is what a step costs beyond the rows' own blocks,
    and each bucket is one captured graph."""
    q = 1 << max(0, blocks.bit_length() - 3)
    return max(1, -(-blocks // q) * q)


def plan_pool(model: PagedModel, dtype: torch.dtype, device: torch.device, block_size: int, *,
              kv_tokens: int | None, kv_memory_fraction: float) -> int:
    """Blocks of the KV pool: ``kv_tokens`` when given; on CUDA, ``kv_memory_fraction`` of the
    memory free once the model is loaded; on a CPU, 16,384 tokens' worth (memory is committed only
    as blocks are written)."""
    per_token = model.bytes_per_token(dtype)
    if kv_tokens is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            kv_tokens = int(free * kv_memory_fraction) // per_token
        else:
            kv_tokens = 16384
    return max(1, kv_tokens // block_size)


class FastEngine(ModelFacade):
    """Continuous-batching engine over a paged KV cache; see the module docstring and
    :class:`~reflexdb.collector.engines.base.Engine`.

    Args:
        model, device, dtype, max_batch_size, score_token_budget, cache_dir: as
            :class:`~.hf.HFEngine` (``max_batch_size``: slots, rows decoded together; default 256 on
            CUDA, 32 on a CPU).
        keep_kv_tokens: most tokens of conversations kept while ``keep_kv`` is on (their blocks
            stay held; at most half the pool; dropped oldest first, and before any row is preempted).
        share_prefixes, min_shared_prefix: accepted for the ``hf`` engine's options; prefixes are
            always shared here, by block.
        check_every: decode steps between the host's looks (harvest, stop strings, admission): a row
            that ends decodes up to ``check_every - 1`` discarded tokens.
        cuda_graphs: capture the decode step as a CUDA graph on CUDA (off: run it eagerly).
        compile: ``torch.compile`` the model's part of the decode step (fused kernels; each process's
            first call of a shape 10-44 s longer; on an H100 1.75x the tokens/s at 256 rows,
            docs/benchmarks.md).
        block_size: token slots per KV block.
        kv_tokens: token slots in the KV pool (default: ``kv_memory_fraction`` of the free GPU
            memory; 16,384 on a CPU).
        kv_memory_fraction: the share of the GPU memory free after loading the model that the
            pool takes (the rest: activations, the sampler's `[slots, V]` buffers).
        prefill_chunk: most prompt tokens prefilled in one forward pass; longer prompts are
            prefilled in chunks between decode steps.
    """

    kind = "fast"

    def __init__(
        self,
        model: str | Path | LoadedModel | None = None,
        *,
        device: str | None = None,
        dtype: str | torch.dtype = "auto",
        max_batch_size: int | None = None,
        score_token_budget: int = 2048,
        cache_dir: Path | None = None,
        share_prefixes: bool = True,
        min_shared_prefix: int = 64,
        keep_kv_tokens: int = 65536,
        check_every: int = 8,
        cuda_graphs: bool = True,
        compile: bool = False,
        block_size: int = 16,
        kv_tokens: int | None = None,
        kv_memory_fraction: float = 0.6,
        prefill_chunk: int = 2048,
    ):
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        if block_size < 1 or prefill_chunk < 1:
            raise ValueError(f"block_size and prefill_chunk must be >= 1, got {block_size} and {prefill_chunk}")
        if not 0 < kv_memory_fraction < 1:
            raise ValueError(f"kv_memory_fraction must be in (0, 1), got {kv_memory_fraction}")
        self.lm = LoadedModel.of(model, device=device, dtype=dtype, cache_dir=cache_dir)
        dev = self.lm.device
        self.max_batch_size = max_batch_size or (256 if dev.type == "cuda" else 32)
        self.score_token_budget = score_token_budget
        self.share_prefixes, self.min_shared_prefix = share_prefixes, min_shared_prefix
        self.check_every = check_every
        self.cuda_graphs = cuda_graphs
        self.compiled = compile
        self.block_size = block_size
        self.prefill_chunk = prefill_chunk
        self.runner = PagedModel(self.lm.model)
        num_blocks = plan_pool(self.runner, self.lm.dtype, dev, block_size, kv_tokens=kv_tokens,
                               kv_memory_fraction=kv_memory_fraction)
        self.pool = self.runner.allocate(num_blocks, block_size, self.lm.dtype, dev)
        self.scheduler = Scheduler(BlockManager(num_blocks, block_size), self.pool.copy_block, keep_kv_tokens)
        #: the longest row (prompt and response) the engine takes: the model's context or the pool
        self.context = min(self.lm.max_positions, num_blocks * block_size)
        self.grammars = Grammars(self.lm.tokenizer, self.lm.vocab_size, self.lm.eos_ids)
        #: while true, rows that end keep their blocks: a later prompt that continues one prefills
        #: only its new tokens (the rollout driver's multi-turn episodes)
        self.keep_kv = False
        self._forward: Callable[..., torch.Tensor] | None = None
        self._buffers: _Buffers | None = None
        self._graphs: dict[tuple, StepGraph] = {}
        #: decode steps run and slot-steps that carried a live row (their ratio: slot occupancy)
        self.steps = self.live_slot_steps = 0
        #: prompt tokens of every row asked for, and those actually prefilled (docs/benchmarks.md)
        self.prompt_tokens = self.prefill_tokens = 0
        gib = num_blocks * block_size * self.runner.bytes_per_token(self.lm.dtype) / 2**30
        #: what the memory planner chose, said at start (the collector prints it)
        self.plan = (f"KV pool: {num_blocks:,} blocks of {block_size} tokens = {num_blocks * block_size:,} tokens "
                     f"({gib:.2f} GiB): {self.max_batch_size} rows of {num_blocks * block_size // self.max_batch_size:,} "
                     f"tokens each at once, a row of at most {self.context:,} tokens (the context)")
        log.info(self.plan)

    # -- the hf engine's kept caches, by another name -------------------------------------------

    @property
    def keep_kv_tokens(self) -> int:
        return self.scheduler.keep_kv_tokens

    @keep_kv_tokens.setter
    def keep_kv_tokens(self, tokens: int) -> None:
        self.scheduler.keep_kv_tokens = tokens

    @property
    def max_positions(self) -> int:
        return self.context

    def forget_kv(self) -> None:
        """Drop every kept conversation (the rollout driver calls it after a batch of episodes)."""
        self.scheduler.forget()

    def load_weights(self, path: str | Path) -> None:
        """New weights in place: no rebuild, no graph recapture; cached blocks hold the old
        weights' keys and values, so they are forgotten."""
        self.lm.load_weights(path)
        self.clear_prefix_cache()

    def clear_prefix_cache(self) -> None:
        """Forget every kept conversation and every cached block (a benchmark's arms start equal)."""
        self.scheduler.forget()
        bm = self.scheduler.bm
        bm.by_hash.clear()
        bm.content.clear()

    def close(self) -> None:
        self._buffers = None
        self._graphs.clear()
        self.pool = None  # type: ignore[assignment]
        self.lm.close()

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, params: SamplingParams = SamplingParams()
    ) -> list[list[Sample]]:
        return self.generate_batch([(prompts, n, params)])[0]

    def generate_batch(
        self, calls: Sequence[tuple[Sequence[Prompt], int, SamplingParams]]
    ) -> list[list[list[Sample]]]:
        """Several calls decoded in one batch: ``result[c]`` is what ``generate(*calls[c])`` returns,
        number for number (each row's draws depend on its call's seed and its row in that call)."""
        rows, jobs = self._plan(calls)
        if not rows:
            return [[[] for _ in range(len(prompts))] for prompts, _, _ in calls]
        with torch.inference_mode():
            results = self._run(rows, jobs)
        out: list[list[list[Sample]]] = []
        for c, (prompts, n, _) in enumerate(calls):
            out.append([[results[(c, i * n + j)] for j in range(n)] for i in range(len(prompts))])
        return out

    def _plan(self, calls: Sequence[tuple[Sequence[Prompt], int, SamplingParams]]) -> tuple[list[Row], list[Job]]:
        """Every call's rows and prefill jobs (one per prompt), refusing bad input before any forward
        pass: an empty prompt, one that leaves no room in the context, a schema xgrammar refuses."""
        rows: list[Row] = []
        jobs: list[Job] = []
        for c, (prompts, n, params) in enumerate(calls):
            if n < 1:
                raise ValueError(f"n must be >= 1, got {n}")
            ids = [encode_prompt(self.lm.tokenizer, p) for p in prompts]
            if any(not p for p in ids):
                raise ValueError("empty prompt")
            longest = max((len(p) for p in ids), default=0)
            if self.context - longest < 1:
                raise ValueError(f"prompt of {longest} tokens leaves no room in the context of {self.context}"
                                 + (f" (the KV pool's {self.scheduler.bm.num_blocks * self.block_size} tokens; "
                                    "engine_options kv_tokens or kv_memory_fraction make it larger)"
                                    if self.context < self.lm.max_positions else ""))
            if params.json_schema is not None:
                self.grammars.compile(params.json_schema)  # a schema xgrammar refuses costs nothing
            seed = call_seed(params)
            self.prompt_tokens += sum(len(p) for p in ids) * n
            for i, p in enumerate(ids):
                group = []
                for j in range(n):
                    matcher = self.grammars.matchers(params.json_schema, 1)[0] if params.json_schema else None
                    group.append(Row(call=c, index=i * n + j, prompt=p, seed=seed, params=params,
                                     limit=min(params.max_new_tokens, self.context - len(p)), matcher=matcher))
                rows.extend(group)
                jobs.append(Job(group, list(p)))
        return rows, jobs

    # -- the loop ------------------------------------------------------------------------------

    def _run(self, rows: list[Row], jobs: list[Job]) -> dict[tuple[int, int], Sample]:
        sch = self.scheduler
        sch.waiting.extend(jobs)
        b = self._buffers_for(max(r.params.max_new_tokens for r in rows),
                              max(len(set(self.lm.eos_ids) | set(r.params.stop_token_ids)) for r in rows))
        b.live.zero_()
        b.stopped.zero_()
        S = self.max_batch_size
        holder: list[Row | None] = [None] * S
        results: dict[tuple[int, int], Sample] = {}
        n_host = np.zeros(S, dtype=np.int64)  # tokens of each slot at the last look
        emb_at_look = b.emb.clone()
        try:
            while sch.waiting or sch.prefilling or any(h is not None for h in holder):
                self._admit(holder)
                if sch.prefilling:
                    for row, logits, hidden in self._prefill_chunk():
                        self._seat(b, holder, row, logits, hidden, n_host)
                    emb_at_look.copy_(b.emb)
                live_rows = [h for h in holder if h is not None]
                if not live_rows:
                    if not sch.prefilling and sch.waiting:
                        self._nothing_fits(sch.waiting[0])
                    continue
                constrained = any(r.matcher is not None for r in live_rows)
                k = 1 if constrained else self.check_every
                self._grow(b, holder, n_host, k)
                if constrained:
                    self._fill_masks(b, holder)
                graph = self._graph(b, holder, k, constrained)
                for _ in range(k):
                    graph()
                self.steps += k
                self._look(b, holder, n_host, emb_at_look, results, constrained)
        except BaseException:
            for row in (h for h in holder if h is not None):  # give every block back: the engine stays usable
                sch.bm.release_all(row.blocks)
                row.blocks = []
            for job in sorted(sch.prefilling, key=lambda j: j.admitted, reverse=True):
                sch.unreserve(job)
            sch.waiting.clear()
            b.live.zero_()
            raise
        return results

    def _nothing_fits(self, job: Job) -> None:
        """No row decodes, none is prefilled, and the next job still finds no room: make room by
        dropping kept conversations, or say why the pool can never hold it."""
        sch = self.scheduler
        if sch.drop_session():
            return
        if sch.reserve(job):  # without the headroom admission keeps for decoding rows: there are none
            sch.waiting.popleft()
            job.admitted = sch.next_order()
            sch.prefilling.append(job)
            return
        need = sch.bm.blocks_for(len(job.tokens))
        raise RuntimeError(f"a prompt of {len(job.tokens)} tokens with {len(job.rows)} sample(s) needs {need} KV "
                           f"blocks of {self.block_size} tokens; the pool holds {sch.bm.num_blocks} "
                           "(engine_options kv_tokens or kv_memory_fraction make it larger)")

    def _admit(self, holder: list[Row | None]) -> None:
        """Waiting jobs into prefill while slots (one per row) and blocks last, oldest first."""
        sch = self.scheduler
        free = sum(h is None for h in holder) - sum(len(j.rows) for j in sch.prefilling)
        decoding = sum(h is not None for h in holder)
        while sch.waiting and free > 0:
            job = sch.waiting[0]
            if len(job.rows) > free:  # the samples that fit now; the others wait (and find the full blocks cached)
                sch.waiting[0] = Job(job.rows[free:], job.tokens)
                job = Job(job.rows[:free], job.tokens)
                sch.waiting.appendleft(job)
            if not sch.reserve(job, headroom=decoding + len(job.rows)):
                return
            sch.waiting.popleft()
            job.admitted = sch.next_order()
            sch.prefilling.append(job)
            free -= len(job.rows)
            decoding += len(job.rows)

    def _prefill_chunk(self) -> list[tuple[Row, torch.Tensor, torch.Tensor]]:
        """One forward pass over up to ``prefill_chunk`` tokens of the jobs being prefilled, oldest
        first; the jobs it completes are forked into their rows, returned ready to decode with the
        distribution of their next token `[V]` and the state that produced it `[D]`."""
        sch, bs, dev = self.scheduler, self.block_size, self.lm.device
        budget = self.prefill_chunk
        parts: list[tuple[Job, int, int]] = []  # (job, start, tokens)
        for job in sch.prefilling:
            m = min(len(job.tokens) - job.cached, budget)
            if m > 0:
                parts.append((job, job.cached, m))
                budget -= m
            if budget <= 0:
                break
        R, M = len(parts), max(m for _, _, m in parts)
        width = max(sch.bm.blocks_for(start + m) for _, start, m in parts)
        ids = torch.full((R, M), self.lm.pad_id, dtype=torch.long)
        pos = torch.zeros((R, M), dtype=torch.long)
        write = torch.full((R, M), self.pool.scratch, dtype=torch.long)
        table = torch.zeros((R, width), dtype=torch.long)
        for r, (job, start, m) in enumerate(parts):
            t = torch.arange(start, start + m)
            blocks = torch.tensor(job.blocks, dtype=torch.long)
            ids[r, :m] = torch.tensor(job.tokens[start : start + m], dtype=torch.long)
            pos[r, :m] = t
            write[r, :m] = blocks[t // bs] * bs + t % bs
            table[r, : min(width, len(job.blocks))] = blocks[:width]
        hidden = self.runner.forward(ids.to(dev), pos.to(dev), write.to(dev), table.to(dev), self.pool)  # eager: shapes vary
        self.prefill_tokens += sum(m for _, _, m in parts)
        sch.prefilled += sum(m for _, _, m in parts)
        ready: list[tuple[Row, torch.Tensor, torch.Tensor]] = []
        for r, (job, start, m) in enumerate(parts):
            job.cached = start + m
            if job.cached == len(job.tokens):
                sch.prefilling.remove(job)
                logits = self.runner.logits(hidden[r, m - 1][None])[0]
                ready.extend((row, logits, hidden[r, m - 1].float()) for row in sch.fork(job))
        return ready

    def _seat(self, b: _Buffers, holder: list[Row | None], row: Row, logits: torch.Tensor, hidden: torch.Tensor,
              n_host: np.ndarray) -> None:
        """A prefilled row takes a free slot: its distribution, position, settings, tokens so far
        (a preempted row's), block table."""
        s = holder.index(None)
        holder[s] = row
        row.slot = s
        n = len(row.tokens)
        b.logits[s] = logits
        b.hidden[s] = hidden
        b.pos[s] = len(row.prompt) + n
        b.n[s] = n
        b.limit[s] = row.limit
        b.row[s] = row.index
        b.seed[s] = row.seed
        b.live[s] = n < row.limit
        b.stopped[s] = False
        p = row.params
        b.temperature[s] = 1.0 if p.greedy else p.temperature
        b.top_p[s] = 1.0 if p.greedy else p.top_p
        b.greedy[s] = p.greedy
        stops = sorted(set(self.lm.eos_ids) | set(p.stop_token_ids))
        b.stop_ids[s] = -1
        b.stop_ids[s, : len(stops)] = torch.tensor(stops, dtype=torch.long)
        b.bitmask[s] = -1
        if n:
            b.tokens[s, :n] = torch.tensor(row.tokens, dtype=torch.long)
            b.logprobs[s, :n] = torch.tensor(row.logprobs, dtype=torch.float32)
        b.emb[s] = torch.from_numpy(row.emb) if row.emb is not None else 0.0
        self._set_table(b, s, row.blocks)
        n_host[s] = n

    def _set_table(self, b: _Buffers, s: int, blocks: list[int]) -> None:
        b.table[s] = 0
        b.table[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.long)

    def _grow(self, b: _Buffers, holder: list[Row | None], n_host: np.ndarray, k: int) -> None:
        """Blocks for the next ``k`` tokens of every decoding row, preempting the newest rows when
        the pool is short."""
        sch = self.scheduler
        order = sorted((h for h in holder if h is not None), key=lambda r: r.admitted)
        for row in order:
            if row.slot is None:  # preempted below, for an older row
                continue
            need = len(row.prompt) + min(int(n_host[row.slot]) + k, row.limit)
            before = len(row.blocks)
            while not sch.grow(row, need):
                victim = self._victim(holder)
                if victim is None:  # only this row holds blocks, and they cannot grow
                    raise RuntimeError(f"a row of {need} tokens needs {sch.bm.blocks_for(need)} KV blocks; the pool "
                                       f"holds {sch.bm.num_blocks} (engine_options kv_tokens make it larger)")
                if victim is row:
                    break
            if row.slot is not None and len(row.blocks) != before:
                self._set_table(b, row.slot, row.blocks)

    def _victim(self, holder: list[Row | None]) -> Row | None:
        """Preempt the newest admitted job or row (vLLM's order); returns the row preempted
        (``None``: nothing else to preempt)."""
        sch = self.scheduler
        decoding = [h for h in holder if h is not None]
        newest_job = max(sch.prefilling, key=lambda j: j.admitted, default=None)
        newest_row = max(decoding, key=lambda r: r.admitted, default=None)
        if newest_job is not None and (newest_row is None or newest_job.admitted > newest_row.admitted):
            sch.unreserve(newest_job)
            return newest_job.rows[0]
        if newest_row is None or len(decoding) == 1:
            return None
        self._preempt(holder, newest_row)
        return newest_row

    def _preempt(self, holder: list[Row | None], row: Row) -> None:
        """Copy ``row``'s tokens, log-probs and embedding sum to the host, give its blocks back and
        put it first in line (it is at a look: the device's counts are the host's)."""
        b = self._buffers
        assert b is not None and row.slot is not None
        s = row.slot
        n = int(b.n[s])
        row.tokens = b.tokens[s, :n].tolist()
        row.logprobs = b.logprobs[s, :n].tolist()
        row.emb = b.emb[s].cpu().numpy().copy()
        b.live[s] = False
        holder[s] = None
        self.scheduler.preempt(row)

    def _fill_masks(self, b: _Buffers, holder: list[Row | None]) -> None:
        """The next token's bitmask of every constrained row, from its matcher (on the host)."""
        xgr = xgrammar()
        rows = [(s, r) for s, r in enumerate(holder) if r is not None and r.matcher is not None]
        scratch = xgr.allocate_token_bitmask(len(rows), self.lm.vocab_size)
        for i, (_, r) in enumerate(rows):
            self.grammars.fill(r.matcher, scratch, i)
        idx = torch.tensor([s for s, _ in rows], dtype=torch.long, device=b.bitmask.device)
        b.bitmask.index_copy_(0, idx, scratch.to(b.bitmask.device))

    def _graph(self, b: _Buffers, holder: list[Row | None], k: int, masked: bool) -> StepGraph:
        """The decode step for this look's shapes: the block-table width rounded up to a multiple of
        a quarter of its power of two (at most a third read in vain, four graphs per doubling)."""
        need = max(len(h.blocks) for h in holder if h is not None)
        width = min(bucket(need), b.table.shape[1])
        any_top_p = any(h.params.top_p < 1 and not h.params.greedy for h in holder if h is not None)
        any_greedy = any(h.params.greedy for h in holder if h is not None)
        key = (width, masked, any_top_p, any_greedy)
        graph = self._graphs.get(key)
        if graph is None:
            if self._forward is None:
                # torch.compile fuses the model's small kernels (norms, rotary, activations); the
                # sampler stays eager: Inductor cannot generate its float64 cumulative sum (torch 2.11).
                self._forward = (torch.compile(self.runner.forward, dynamic=False) if self.compiled
                                 else self.runner.forward)
            fn = functools.partial(_decode_step, self.runner, self._forward, self.pool, width, masked, any_top_p,
                                   any_greedy, b)
            graph = StepGraph(fn, self.lm.device, enabled=self.cuda_graphs)
            self._graphs[key] = graph
        if graph.enabled and graph.graph is None:
            self._capture_safely(b, graph)
        return graph

    def _capture_safely(self, b: _Buffers, graph: StepGraph) -> None:
        """Capture the step (its warm-up runs it for real): on copies of the live state, restored
        after; the pool's writes of the warm-up go to slots the live rows own and rewrite next."""
        saved = {f: getattr(b, f).clone() for f in ("logits", "hidden", "pos", "n", "live", "stopped", "tokens",
                                                      "logprobs", "emb", "ring")}
        slots = self._live_slots(b)
        kept = [(K[slots].clone(), V[slots].clone()) for K, V in self.pool.layers]
        graph._capture()
        for f, t in saved.items():
            getattr(b, f).copy_(t)
        for (K, V), (K0, V0) in zip(self.pool.layers, kept):
            K[slots] = K0
            V[slots] = V0

    def _live_slots(self, b: _Buffers) -> torch.Tensor:
        """The pool slots the next steps of the live rows write (all their blocks' slots)."""
        bs = self.block_size
        blocks = torch.unique(b.table[b.live])
        return (blocks[:, None] * bs + torch.arange(bs, device=blocks.device)).reshape(-1)

    def _look(self, b: _Buffers, holder: list[Row | None], n_host: np.ndarray, emb_at_look: torch.Tensor,
              results: dict[tuple[int, int], Sample], constrained: bool) -> None:
        """The host's look (one synchronisation): advance grammars, find stop strings, harvest the
        rows that ended."""
        S = self.max_batch_size
        live, stopped, counts = torch.stack([b.live.long(), b.stopped.long(), b.n]).cpu().numpy()
        live, stopped = live.astype(bool), stopped.astype(bool)
        held = [s for s in range(S) if holder[s] is not None]
        self.live_slot_steps += int(sum(counts[s] - n_host[s] for s in held))
        ended: dict[int, tuple[int, str, str | None]] = {}  # slot -> (tokens, reason, stop string)
        if constrained:  # one step since the last look: each row's newest token goes to its matcher
            newest = b.tokens.gather(1, (b.n - 1).clamp(min=0)[:, None])[:, 0].cpu().numpy()
            for s in held:
                row = holder[s]
                if row.matcher is not None and counts[s] > n_host[s]:
                    if self.grammars.advance(row.matcher, int(newest[s]), row.index) and live[s]:
                        ended[s] = (int(counts[s]), "stop", None)
        with_stops = [s for s in held if holder[s].params.stop and s not in ended]
        if with_stops:
            rows_np = b.tokens[with_stops].cpu().numpy()
            for idx, s in enumerate(with_stops):
                stop = holder[s].params.stop
                last = int(counts[s]) - (1 if stopped[s] else 0)  # hf looks for strings only when no stop token ended it
                hit = first_stop(self.lm.tokenizer, rows_np[idx], int(n_host[s]), last, stop, stop_window(stop))
                if hit is not None:
                    ended[s] = (hit[0], "stop", hit[1])
        for s in held:
            if not live[s] and s not in ended:
                ended[s] = (int(counts[s]), "stop" if stopped[s] else "length", None)
        if ended:
            self._harvest(b, holder, ended, n_host, emb_at_look, results)
        n_host[:] = counts
        emb_at_look.copy_(b.emb)

    def _harvest(self, b: _Buffers, holder: list[Row | None], ended: dict[int, tuple[int, str, str | None]],
                 n_host: np.ndarray, emb_at_look: torch.Tensor, results: dict[tuple[int, int], Sample]) -> None:
        """Copy the ended slots' responses out: tokens and log-probs up to where each ended, the
        embedding from the sum at the last look plus the ring's states up to that point; their blocks
        are kept (``keep_kv``) or given back."""
        slots = sorted(ended)
        idx = torch.tensor(slots, dtype=torch.long, device=b.n.device)
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
            ids = tokens[a, :t]
            results[(row.call, row.index)] = make_sample(self.lm.tokenizer, row.prompt, ids, logprobs[a, :t], reason,
                                                         emb / np.float32(max(t, 1)), matched)
            self.scheduler.finish(row, row.prompt + ids.tolist(), keep=self.keep_kv)
            holder[s] = None
            row.slot = None

    # -- buffers -------------------------------------------------------------------------------

    def _buffers_for(self, T: int, stops: int) -> _Buffers:
        """The decode buffers, reused while the response length and stop-token count fit."""
        S, dev = self.max_batch_size, self.lm.device
        T = -(-T // 64) * 64
        E = max(8, 1 << (stops - 1).bit_length())
        b = self._buffers
        if b is not None and b.tokens.shape[1] >= T and b.stop_ids.shape[1] >= E:
            return b
        self._buffers, self._graphs = None, {}  # free the old buffers (and graphs) first
        D, V, W = self.lm.hidden_size, self.lm.vocab_size, self.grammars.words
        bcap = self.scheduler.bm.blocks_for(self.context)

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=dev)

        self._buffers = _Buffers(
            logits=zeros(S, V), hidden=zeros(S, D), pos=zeros(S, dtype=torch.long), n=zeros(S, dtype=torch.long),
            limit=zeros(S, dtype=torch.long), row=zeros(S, dtype=torch.long), seed=zeros(S, dtype=torch.long),
            live=zeros(S, dtype=torch.bool), stopped=zeros(S, dtype=torch.bool), tokens=zeros(S, T, dtype=torch.long),
            logprobs=zeros(S, T), emb=zeros(S, D), ring=zeros(S, self.check_every, D),
            stop_ids=torch.full((S, E), -1, dtype=torch.long, device=dev), temperature=torch.ones(S, device=dev),
            top_p=torch.ones(S, device=dev), greedy=zeros(S, dtype=torch.bool),
            bitmask=torch.full((S, W), -1, dtype=torch.int32, device=dev), table=zeros(S, bcap, dtype=torch.long),
        )
        return self._buffers
