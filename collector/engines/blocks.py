"""The ``fast`` engine's block manager: fixed-size KV blocks, reference counts, a free list and a
cache of full blocks by content (vLLM's and nano-vllm's "automatic prefix caching").

A row's keys and values live in blocks of ``block_size`` token slots; its *block table* lists
them in order. Blocks are shared by reference count, never written while shared:

- the ``n`` samples of a prompt share its full blocks (its last, partial block is copied for each
  sample that writes after it);
- a **full** block is known by the hash of its tokens and of everything before it
  (:func:`chain`), so a later row whose tokens start the same way (the same system prompt, the
  next turn of an episode, a preempted row coming back) reuses it instead of computing it again;
- a block whose count falls to 0 goes to the free list but stays findable until it is handed out
  again, oldest first (least recently freed).

The manager holds no tensors: it only hands out block numbers. The pool they index is the model
runner's (:class:`~.paged.KVPool`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: the chain hash of the empty prefix
ROOT = 0


def chain(parent: int, tokens: Sequence[int]) -> int:
    """The hash of a block holding ``tokens`` after the prefix whose hash is ``parent``.

    Python's hash of a tuple of ints is a pure function of the values (no per-process salt, unlike
    ``str``), so two rows with the same prefix get the same chain; a collision is caught by
    comparing the tokens too (:meth:`BlockManager.find`)."""
    return hash((parent, tuple(tokens)))


class OutOfBlocks(RuntimeError):
    """No free block: the scheduler evicts kept conversations, then preempts a row."""


class BlockManager:
    """Block numbers ``0 .. num_blocks - 1``, each with a reference count.

    Args:
        num_blocks: blocks in the pool.
        block_size: token slots per block.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV pool needs at least one block of one token, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref = [0] * num_blocks
        #: blocks nobody holds, least recently freed first (those handed out first)
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        #: full blocks by content: chain hash -> block, and each such block's (hash, parent, tokens)
        self.by_hash: dict[int, int] = {}
        self.content: dict[int, tuple[int, int, tuple[int, ...]]] = {}

    # -- counts --------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return len(self.free)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` token slots."""
        return -(-tokens // self.block_size)

    # -- handing out and taking back -----------------------------------------------------------

    def allocate(self) -> int:
        """A block for one holder (its count 1); a cached full block handed out again is forgotten.

        Raises:
            OutOfBlocks: none is free.
        """
        if not self.free:
            raise OutOfBlocks(f"all {self.num_blocks} blocks of {self.block_size} tokens are held")
        block, _ = self.free.popitem(last=False)
        self.forget(block)
        self.ref[block] = 1
        return block

    def hold(self, block: int) -> int:
        """One more holder of ``block`` (a shared prefix, a kept conversation); returns it."""
        if self.ref[block] == 0:
            del self.free[block]
        self.ref[block] += 1
        return block

    def release(self, block: int) -> None:
        """One holder fewer; at none the block is free (and, if full, still findable)."""
        if self.ref[block] <= 0:
            raise RuntimeError(f"block {block} released more often than held")
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.free[block] = None

    def release_all(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            self.release(b)

    # -- the cache of full blocks --------------------------------------------------------------

    def register(self, block: int, parent: int, tokens: Sequence[int]) -> int:
        """Make ``block`` (holding exactly ``tokens`` after the prefix ``parent``) findable;
        returns its chain hash. A block of the same content already registered stays the one found."""
        tokens = tuple(tokens)
        if len(tokens) != self.block_size:
            raise ValueError(f"only full blocks are cached: {len(tokens)} tokens in a block of {self.block_size}")
        h = chain(parent, tokens)
        if h not in self.by_hash and block not in self.content:
            self.by_hash[h] = block
            self.content[block] = (h, parent, tokens)
        return h

    def find(self, parent: int, tokens: Sequence[int]) -> int | None:
        """The cached full block holding ``tokens`` after ``parent``, or ``None``."""
        h = chain(parent, tokens)
        block = self.by_hash.get(h)
        if block is None:
            return None
        _, p, t = self.content[block]
        return block if p == parent and t == tuple(tokens) else None

    def match(self, tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """The longest run of cached full blocks that ``tokens`` starts with: ``(blocks, hashes)``
        (``hashes[i]``: the chain hash after block ``i``). Not held: the caller holds what it keeps."""
        blocks, hashes, parent = [], [], ROOT
        bs = self.block_size
        for start in range(0, len(tokens) - bs + 1, bs):
            block = self.find(parent, tokens[start : start + bs])
            if block is None:
                break
            parent = chain(parent, tokens[start : start + bs])
            blocks.append(block)
            hashes.append(parent)
        return blocks, hashes

    def forget(self, block: int) -> None:
        """``block`` is no longer findable by its content (handed out again, or never computed)."""
        entry = self.content.pop(block, None)
        if entry is not None and self.by_hash.get(entry[0]) == block:
            del self.by_hash[entry[0]]
