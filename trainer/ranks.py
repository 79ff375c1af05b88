"""The learner's ranks agree, and a rank that dies stops every rank with one message.

Data parallel (``torchrun`` or the DeepSpeed launcher): rank 0 chooses each step's groups and
broadcasts them (:func:`from_rank0`); every rank trains its share and DeepSpeed averages the
gradients. Two things can go wrong between the ranks, and both end the same way:

- **a rank dies** (killed, out of memory, a crash, its machine lost): the others find out in their
  next collective. On one machine that is at once (gloo sees the closed connection; torchrun's agent
  stops the other ranks); a rank on a machine that vanished answers nothing, and the others wait
  ``learner.dist_timeout_s`` (torch's NCCL watchdog then stops them with its own message);
- **a rank stops answering** for longer than ``learner.dist_timeout_s``.

Each surviving rank then stops with one line (:class:`RankLost`: which rank, after which step,
what torch said, and how to resume) instead of a page of traceback. Nothing is lost: a step is
recorded by rank 0 only after every rank has trained it, and resume starts from the newest
published version, rolling back the steps recorded after it (trainer/checkpointer.py).

While rank 0 alone waits for groups (collectors still loading a large model, say) the others wait
in its broadcast: rank 0 tells them "still waiting" every quarter of ``learner.dist_timeout_s``,
so that wait, however long, never times out.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from reflexdb.errors import ReflexdbError

T = TypeVar("T")

#: what :func:`from_rank0`'s ``decide`` returns while rank 0 is still deciding
WAITING = "reflexdb.trainer.ranks.WAITING"


class RankLost(ReflexdbError):
    """Another rank of the learner died or stopped answering; this rank stops (the message says
    which step, what torch said and how to resume)."""

    exit_code = 10


def from_rank0(decide: Callable[[float | None], T], *, rank: int, world: int, beat_s: float) -> T:
    """What rank 0 decides, on every rank.

    Rank 0 calls ``decide(until)``, which returns a value, or :data:`WAITING` if it is still deciding
    at ``until`` (a ``time.monotonic()`` instant ``beat_s`` ahead); each answer is broadcast, so the
    other ranks, waiting in the broadcast, hear from rank 0 at least every ``beat_s`` seconds (set
    it well under the collective timeout) and return the value when it comes. With one rank,
    ``decide(None)``: no heartbeat needed.

    Args:
        decide: rank 0's choice (the step's groups; None to stop); called on rank 0 only.
        rank, world: this rank and the number of ranks.
        beat_s: the longest rank 0 stays silent.
    """
    if world == 1:
        return decide(None)
    import torch.distributed

    while True:
        box = [decide(time.monotonic() + beat_s) if rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=0)
        if not (isinstance(box[0], str) and box[0] == WAITING):
            return box[0]


#: What torch says when a peer is gone (besides its DistError types, NCCL's among them): gloo's
#: transport errors, a RuntimeError: the connection closed or reset, a receive or send timed out.
#: Not any gloo error: a mismatched collective (a bug) is a gloo error too, and keeps its traceback.
_PEER = re.compile(r"Connection (closed|reset) by peer|Timed out waiting|Broken pipe|communicator was aborted",
                   re.IGNORECASE)


def peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another rank is gone or silent."""
    try:
        from torch.distributed import DistError
    except ImportError:  # pragma: no cover - torch < 2.2
        DistError = ()
    if DistError and isinstance(exc, DistError):
        return True
    return isinstance(exc, RuntimeError) and bool(_PEER.search(str(exc)))


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of ranks ((0, 1) before torch.distributed is up)."""
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _what_torch_said(exc: BaseException) -> str:
    """The first line of a collective's error, without gloo's source location and chatter."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)  # "[.../pair.cc:553] "
    text = re.sub(r"\s*This is typically caused by.*$", "", text)
    return text[:300].rstrip(" .")


def lost(exc: BaseException, *, rank: int, world: int, steps: int, timeout_s: float) -> RankLost:
    """The one line a rank stops with when ``exc`` (:func:`peer_failure`) ended a collective.

    Args:
        rank, world: this rank and the number of ranks.
        steps: the steps this rank had trained (the learner's step number).
        timeout_s: ``learner.dist_timeout_s``.
    """
    where = f"after step {steps}" if steps else "before its first step"
    return RankLost(
        f"learner rank {rank} of {world} lost another rank {where} ({_what_torch_said(exc)}): a rank died, or "
        f"did not answer for {timeout_s:g} s (learner.dist_timeout_s); every rank stops. The rank that stopped "
        "first says why (its own message above, or the launcher's report of it). Run the same command to resume "
        "from the newest published version: steps recorded after it are rolled back, so nothing is lost or "
        "trained twice")


def raise_if_a_rank_is_lost(exc: BaseException, steps: int, timeout_s: float) -> None:
    """Raise :func:`lost`'s one line (:class:`RankLost`) if ``exc`` is a collective that failed
    because another rank is gone; return for any other error, or one in a single process.

    Args:
        exc: what stopped this rank.
        steps: the steps this rank has trained.
        timeout_s: ``learner.dist_timeout_s``, for the message.
    """
    rank, world = rank_and_world()
    if world > 1 and peer_failure(exc):
        raise lost(exc, rank=rank, world=world, steps=steps, timeout_s=timeout_s) from None


@contextmanager
def stop_if_a_rank_is_lost(steps: Callable[[], int], timeout_s: float) -> Iterator[None]:
    """:func:`raise_if_a_rank_is_lost` around a block (``steps`` asked when it happens)."""
    try:
        yield
    except Exception as exc:
        raise_if_a_rank_is_lost(exc, steps(), timeout_s)
        raise
