"""The ``fast`` engine's scheduler: which rows hold which blocks, who is admitted, prefilled,
preempted, and which conversations are kept for the next turn. Host bookkeeping only (no
tensors): :class:`~.fast.FastEngine` moves the numbers it decides onto the device.

Vocabulary (nano-vllm's and vLLM's):

- a **row** is one sample being generated (:class:`Row`);
- a **job** is a prefill: tokens whose keys and values some rows need before they decode — the
  prompt of the ``n`` samples of one prompt (prefilled once, then *forked*: the samples share its
  full blocks and each gets a copy of its last, partial block), or a preempted row's prompt and
  the tokens it had sampled (:class:`Job`);
- a **session** is a conversation kept while ``keep_kv`` is on: a row that ended keeps its blocks,
  so the next turn of its episode, whose prompt continues it, prefills only what the environment
  added (:class:`Session`);
- **preemption**: when the pool has no block for a decoding row, kept sessions are dropped first
  (least recently used), then the newest admitted row gives its blocks back and waits to be
  recomputed (its prompt and tokens prefilled again; its draws depend only on (seed, row, step),
  so it samples what it would have).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import SamplingParams
from .blocks import ROOT, BlockManager, OutOfBlocks, chain


@dataclass(eq=False)
class Row:
    """One sample: its call, its place in the call, and what it has sampled so far.

    ``tokens``, ``logprobs`` and ``emb`` are the host's copy: complete for a row that waits to be
    (re)admitted, stale while it decodes (the device holds the truth until it ends or is preempted).
    """

    call: int  # its call in the batch
    index: int  # its row in the call (prompt * n + sample): the counter draws' row
    prompt: list[int]
    seed: int
    params: SamplingParams
    limit: int  # most tokens it may sample
    matcher: Any = None  # xgrammar matcher of a json_schema call
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    emb: np.ndarray | None = None  # sum of the hidden states that produced its tokens
    blocks: list[int] = field(default_factory=list)
    slot: int | None = None
    admitted: int = -1  # admission order: the newest is preempted first
    preempted: int = 0  # times it gave its blocks back

    @property
    def fed(self) -> list[int]:
        """The tokens whose keys and values it needs before it samples the next one."""
        return self.prompt + self.tokens


@dataclass(eq=False)
class Job:
    """A prefill: ``tokens`` for ``rows`` (which all continue exactly these tokens)."""

    rows: list[Row]
    tokens: list[int]
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose keys and values are already in ``blocks``
    admitted: int = -1


@dataclass(eq=False)
class Session:
    """A kept conversation: ``blocks`` (held) hold the keys and values of ``tokens``."""

    tokens: tuple[int, ...]
    blocks: list[int]


class Scheduler:
    """Blocks, admission, preemption and kept conversations over one :class:`BlockManager`.

    Args:
        blocks: the block manager.
        copy_block: ``copy_block(src, dst, tokens)``: copy the first ``tokens`` slots of block
            ``src`` into ``dst`` on the device (copy on write).
        keep_kv_tokens: most tokens of kept conversations (oldest dropped first), at most half the pool.
    """

    def __init__(self, blocks: BlockManager, copy_block: Callable[[int, int, int], None], keep_kv_tokens: int):
        self.bm = blocks
        self.copy_block = copy_block
        self.keep_kv_tokens = keep_kv_tokens
        self.waiting: deque[Job] = deque()
        self.prefilling: list[Job] = []
        #: kept conversations by (chain hash of their full blocks, the tokens of their last partial block)
        self.sessions: OrderedDict[tuple[int, tuple[int, ...]], Session] = OrderedDict()
        self.session_tokens = 0
        self._order = 0
        #: counters (docs/benchmarks.md): rows preempted, tokens prefilled, tokens found in the cache
        self.preemptions = self.prefilled = self.reused = 0

    # -- admission ---------------------------------------------------------------------------

    def reserve(self, job: Job, headroom: int = 0) -> bool:
        """Give ``job`` the blocks of its tokens: cached full blocks (held), a kept conversation's
        last partial block (copied), new blocks for the rest; ``False`` (nothing held) when the pool
        cannot also keep ``headroom`` blocks free for the rows decoding."""
        bs = self.bm.block_size
        tokens = job.tokens
        found, hashes = self.bm.match(tokens)
        if len(found) * bs >= len(tokens):  # at least the last token is computed: its logits are needed
            found, hashes = found[:-1], hashes[:-1]
        cached = len(found) * bs
        tail: tuple[int, Session] | None = None  # (tokens of a session's partial block reused, session)
        parent = hashes[-1] if hashes else ROOT
        for r in range(min(bs - 1, len(tokens) - 1 - cached), 0, -1):
            session = self.sessions.get((parent, tuple(tokens[cached : cached + r])))
            if session is not None:
                tail = (r, session)
                self.sessions.move_to_end((parent, tuple(tokens[cached : cached + r])))
                break
        need = self.bm.blocks_for(len(tokens)) - len(found)
        if self.bm.free_blocks - need < headroom:
            return False
        job.blocks = [self.bm.hold(b) for b in found] + [self.bm.allocate() for _ in range(need)]
        # Its own full blocks are findable at once, before they are computed: a job admitted after it
        # that starts the same way (the same system prompt) holds them instead of computing them
        # again. It reads them only after this job wrote them: prefill goes in admission order, and a
        # chunk's keys are written, layer by layer, before any row of the chunk reads (paged.py).
        # Preemption takes the newest job first, so the readers of a block go before its writer.
        for i in range(len(found), len(tokens) // bs):
            parent = self.bm.register(job.blocks[i], parent, tokens[i * bs : (i + 1) * bs])
        if tail is not None:
            r, session = tail
            self.copy_block(session.blocks[len(found)], job.blocks[len(found)], r)
            cached += r
        job.cached = cached
        self.reused += cached * len(job.rows)
        return True

    def next_order(self) -> int:
        self._order += 1
        return self._order

    # -- after a prefill -----------------------------------------------------------------------

    def register(self, tokens: Sequence[int], blocks: Sequence[int], upto: int | None = None) -> list[int]:
        """Make the full blocks of ``tokens`` (held in ``blocks``, the first ``upto`` tokens' keys and
        values computed) findable; returns the chain hash after each full block."""
        bs = self.bm.block_size
        upto = len(tokens) if upto is None else upto
        hashes, parent = [], ROOT
        for i in range(upto // bs):
            parent = self.bm.register(blocks[i], parent, tokens[i * bs : (i + 1) * bs])
            hashes.append(parent)
        return hashes

    def fork(self, job: Job) -> list[Row]:
        """Hand a prefilled job's blocks to its rows: the first takes them, each other holds the full
        ones and gets a copy of the partial last one. Rows that find no block for their copy go back
        to waiting (they will find the full blocks cached). Returns the rows that can decode."""
        bs = self.bm.block_size
        self.register(job.tokens, job.blocks)
        full, partial = divmod(len(job.tokens), bs)
        ready = [job.rows[0]]
        job.rows[0].blocks = job.blocks
        for row in job.rows[1:]:
            if partial:
                try:
                    copy = self.bm.allocate()
                except OutOfBlocks:
                    self.waiting.appendleft(Job([row], row.fed))
                    continue
                self.copy_block(job.blocks[full], copy, partial)
                row.blocks = [self.bm.hold(b) for b in job.blocks[:full]] + [copy]
            else:
                row.blocks = [self.bm.hold(b) for b in job.blocks]
            ready.append(row)
        for row in ready:
            row.admitted = job.admitted
        return ready

    # -- while decoding ------------------------------------------------------------------------

    def grow(self, row: Row, tokens: int) -> bool:
        """Blocks for ``tokens`` slots in all for ``row``; ``False`` if the pool has none left even
        after dropping kept conversations."""
        while len(row.blocks) < self.bm.blocks_for(tokens):
            if not self.bm.free_blocks and not self.drop_session():
                return False
            row.blocks.append(self.bm.allocate())
        return True

    def finish(self, row: Row, fed: Sequence[int], keep: bool) -> None:
        """``row`` ended with the keys and values of ``fed`` in its blocks: register its full blocks,
        then keep them as a session (``keep``) or give them back."""
        bs = self.bm.block_size
        hashes = self.register(fed, row.blocks)
        used = self.bm.blocks_for(len(fed))
        self.bm.release_all(row.blocks[used:])
        blocks, row.blocks = row.blocks[:used], []
        if not keep or not fed or len(fed) > self.session_budget:
            self.bm.release_all(blocks)
            return
        full = len(fed) // bs
        key = (hashes[full - 1] if full else ROOT, tuple(fed[full * bs :]))
        old = self.sessions.pop(key, None)
        if old is not None:
            self._drop(old)
        self.sessions[key] = Session(tuple(fed), blocks)
        self.session_tokens += len(fed)
        while self.session_tokens > self.session_budget:
            self.drop_session()

    @property
    def session_budget(self) -> int:
        """Tokens kept conversations may hold: ``keep_kv_tokens``, and at most half the pool (the
        rest is for the rows decoding)."""
        return min(self.keep_kv_tokens, self.bm.num_blocks * self.bm.block_size // 2)

    def drop_session(self) -> bool:
        """Drop the least recently used kept conversation; ``False`` if none is kept."""
        if not self.sessions:
            return False
        _, session = self.sessions.popitem(last=False)
        self._drop(session)
        return True

    def _drop(self, session: Session) -> None:
        self.bm.release_all(session.blocks)
        self.session_tokens -= len(session.tokens)

    def forget(self) -> None:
        """Drop every kept conversation."""
        while self.drop_session():
            pass

    def preempt(self, row: Row) -> None:
        """``row`` gives its blocks back (its fed tokens' full blocks stay findable) and waits, first
        in line, to be prefilled again."""
        self.register(row.fed, row.blocks)
        self.bm.release_all(row.blocks)
        row.blocks, row.slot = [], None
        row.preempted += 1
        self.preemptions += 1
        self.waiting.appendleft(Job([row], row.fed))

    def unreserve(self, job: Job) -> None:
        """A job being prefilled gives its blocks back and waits again (preempted before decoding);
        its blocks not computed yet are no longer findable."""
        bs = self.bm.block_size
        for i, b in enumerate(job.blocks):
            if (i + 1) * bs > job.cached:
                self.bm.forget(b)
        self.bm.release_all(job.blocks)
        job.blocks, job.cached = [], 0
        self.prefilling.remove(job)
        self.preemptions += len(job.rows)
        self.waiting.appendleft(job)


__all__ = ["Job", "OutOfBlocks", "Row", "Scheduler", "Session", "chain"]
