"""Check a group before it is written; every problem names the offending field.

Nothing is written when a check fails: :meth:`Store.write_group` validates the whole group first.
The result is a :class:`PreparedGroup` whose arrays have their stored dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from .errors import InvalidGroup
from .records import GroupIn, Sibling, TrajectoryIn, TurnIn
from .schema import FINISH_REASONS, ROLES

_INT32 = np.iinfo(np.int32)


@dataclass
class PreparedTrajectory:
    src: TrajectoryIn
    prompt_ids: np.ndarray  # [P] int32
    response_ids: np.ndarray  # [T] int32
    logprobs: np.ndarray | None  # [T] float32; None: unknown (imported)
    token_policy_versions: np.ndarray  # [T] int32
    loss_mask: np.ndarray  # [T] bool
    embedding: np.ndarray | None  # [D] float32
    policy_version: int
    truncated: bool
    confidence: float | None
    reward: float | None
    turns: list[TurnIn]


@dataclass
class PreparedGroup:
    src: GroupIn
    trajectories: list[PreparedTrajectory]
    embedding_dim: int | None


def _is_integer(dtype: np.dtype) -> bool:
    # The kind test is the fast path; np.issubdtype keeps the accepted set exactly as it was.
    return dtype.kind in "iu" or np.issubdtype(dtype, np.integer)


def _always_fits_int32(dtype: np.dtype) -> bool:
    """Every value of ``dtype`` fits in int32, so the min/max scan can be skipped."""
    return (dtype.kind == "i" and dtype.itemsize <= 4) or (dtype.kind == "u" and dtype.itemsize <= 2)


def _int_array(value, where: str) -> np.ndarray:
    a = np.asarray(value)
    if a.size == 0:
        return np.empty(0, dtype=np.int32)
    if a.ndim != 1:
        raise InvalidGroup(where, f"must be a 1-D array, got shape {a.shape}")
    if not _is_integer(a.dtype):
        raise InvalidGroup(where, f"must hold integers, got dtype {a.dtype}")
    if not _always_fits_int32(a.dtype) and (a.min() < _INT32.min or a.max() > _INT32.max):
        raise InvalidGroup(where, "values do not fit in int32")
    return a.astype(np.int32, copy=False)


def _float_array(value, where: str) -> np.ndarray:
    a = np.asarray(value)
    if a.size == 0:
        return np.empty(0, dtype=np.float32)
    if a.ndim != 1:
        raise InvalidGroup(where, f"must be a 1-D array, got shape {a.shape}")
    if not (a.dtype.kind == "f" or np.issubdtype(a.dtype, np.floating) or _is_integer(a.dtype)):
        raise InvalidGroup(where, f"must hold numbers, got dtype {a.dtype}")
    a = a.astype(np.float32, copy=False)
    finite = np.isfinite(a)
    if not finite.all():
        bad = ~finite
        raise InvalidGroup(where, f"non-finite value {a[bad][0]} at index {int(np.argmax(bad))}")
    return a


def _finite(value, where: str) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidGroup(where, f"must be a number or None, got {value!r}") from None
    if not math.isfinite(x):
        raise InvalidGroup(where, f"must be finite, got {x}")
    return x


def _turns(turns: list[TurnIn], n_tokens: int, where: str) -> list[TurnIn]:
    out = []
    for i, turn in enumerate(turns):
        w = f"{where}.turns[{i}]"
        if turn.role not in ROLES:
            raise InvalidGroup(f"{w}.role", f"{turn.role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(turn.text, str):
            raise InvalidGroup(f"{w}.text", "must be a string")
        if "\x00" in turn.text:
            raise InvalidGroup(f"{w}.text", "contains a NUL character, which PostgreSQL text cannot store")
        if (turn.token_start is None) != (turn.token_end is None):
            raise InvalidGroup(f"{w}.token_start", "token_start and token_end must both be set or both be None")
        if turn.token_start is not None and not (0 <= turn.token_start <= turn.token_end <= n_tokens):
            raise InvalidGroup(
                f"{w}.token_end",
                f"span [{turn.token_start}, {turn.token_end}) does not lie in the {n_tokens} response tokens",
            )
        trainable = turn.role == "assistant" if turn.trainable is None else bool(turn.trainable)
        if turn.attempt is not None and not 0 <= int(turn.attempt) <= 32767:
            raise InvalidGroup(f"{w}.attempt", f"must lie in [0, 32767], got {turn.attempt}")
        if turn.answer is not None and "\x00" in str(turn.answer):
            raise InvalidGroup(f"{w}.answer", "contains a NUL character")
        if turn.tool_call is not None and not isinstance(turn.tool_call, dict):
            raise InvalidGroup(f"{w}.tool_call", f"must be a dict or None, got {type(turn.tool_call).__name__}")
        out.append(TurnIn(turn.role, turn.text, turn.token_start, turn.token_end, trainable, bool(turn.tool_error),
                          None if turn.attempt is None else int(turn.attempt),
                          None if turn.answer is None else str(turn.answer),
                          None if turn.correct is None else bool(turn.correct),
                          _finite(turn.reward, f"{w}.reward"), turn.tool_call))
    return out


def prepare_trajectory(t: TrajectoryIn, where: str, group_version: int,
                       origins: Collection[str] | None = None) -> PreparedTrajectory:
    response_ids = _int_array(t.response_ids, f"{where}.response_ids")
    n = response_ids.shape[0]
    prompt_ids = _int_array(t.prompt_ids, f"{where}.prompt_ids")
    if t.logprobs is None:  # unknown behaviour log-probs: only imported trajectories (stored as NULL)
        if t.origin != "imported":
            raise InvalidGroup(f"{where}.logprobs", "missing; only imported trajectories (origin 'imported') "
                                                    "may have unknown behaviour log-probs")
        logprobs = None
    else:
        logprobs = _float_array(t.logprobs, f"{where}.logprobs")
        if logprobs.shape[0] != n:
            raise InvalidGroup(f"{where}.logprobs", f"length {logprobs.shape[0]} != response_ids length {n}")
        if n and logprobs.max() > 1e-4:
            raise InvalidGroup(f"{where}.logprobs", f"log-probabilities must be <= 0, got {logprobs.max()}")

    version = group_version if t.policy_version is None else int(t.policy_version)
    if t.token_policy_versions is None:
        token_versions = np.full(n, version, dtype=np.int32)
    else:
        token_versions = _int_array(t.token_policy_versions, f"{where}.token_policy_versions")
        if token_versions.shape[0] != n:
            raise InvalidGroup(
                f"{where}.token_policy_versions", f"length {token_versions.shape[0]} != response_ids length {n}"
            )
        if n and token_versions.min() < 0:
            raise InvalidGroup(f"{where}.token_policy_versions", "versions must be >= 0")
        if t.policy_version is None and n:
            version = int(token_versions.min())  # the oldest version that produced a token
    if version < 0:
        raise InvalidGroup(f"{where}.policy_version", f"must be >= 0, got {version}")

    turns = _turns(t.turns, n, where)
    spans = [u for u in turns if u.token_start is not None]
    # The model's own tokens: the trainable turns' spans (every token when no turn has a span).
    # The loss mask defaults to them (what the learner trains) and may only narrow them (R3L's
    # pivotal credit masks a retry's shared prefix): never an environment token.
    own = np.ones(n, dtype=bool)
    if spans:
        own[:] = False
        for u in spans:
            if u.trainable:
                own[u.token_start : u.token_end] = True
    if t.loss_mask is None:
        loss_mask = own
    else:
        loss_mask = np.asarray(t.loss_mask)
        if loss_mask.ndim != 1 or loss_mask.shape[0] != n:
            raise InvalidGroup(f"{where}.loss_mask", f"shape {loss_mask.shape} != ({n},)")
        if loss_mask.dtype != np.bool_:
            if not np.isin(loss_mask, (0, 1)).all():
                raise InvalidGroup(f"{where}.loss_mask", "must hold booleans (0/1)")
            loss_mask = loss_mask.astype(bool)
        outside = np.flatnonzero(loss_mask & ~own)
        if outside.size:
            raise InvalidGroup(f"{where}.loss_mask", f"marks token {int(outside[0])}, which lies in no trainable "
                               "turn's span (an environment's or the prompt's token never carries loss)")

    embedding = None
    if t.embedding is not None:
        embedding = _float_array(t.embedding, f"{where}.embedding")
        if embedding.shape[0] == 0:
            raise InvalidGroup(f"{where}.embedding", "is empty")

    if t.finish_reason not in FINISH_REASONS:
        raise InvalidGroup(f"{where}.finish_reason", f"{t.finish_reason!r} is not one of {', '.join(FINISH_REASONS)}")
    if origins is not None and t.origin not in origins:  # the rows of table origins (reflexdb/origins.py)
        raise InvalidGroup(f"{where}.origin", f"{t.origin!r} is not an origin of this database (table origins: "
                           f"{', '.join(sorted(origins))}); a method adds its own with a migration")

    reward = _finite(t.reward, f"{where}.reward")
    confidence = _finite(t.confidence, f"{where}.confidence")
    if confidence is None and n and logprobs is not None:
        if own.all():
            # == np.mean(logprobs, dtype=np.float64) (the same reduction), without np.mean's overhead
            confidence = float(np.exp(np.add.reduce(logprobs, axis=None, dtype=np.float64) / n))
        elif own.any():  # an episode: the model's own tokens only, not the environment's
            confidence = float(np.exp(np.add.reduce(logprobs[own], axis=None, dtype=np.float64) / own.sum()))
    if confidence is not None and not 0.0 <= confidence <= 1.0:
        raise InvalidGroup(f"{where}.confidence", f"must lie in [0, 1], got {confidence}")
    truncated = t.finish_reason == "length" if t.truncated is None else bool(t.truncated)
    for name in ("extracted_answer", "error"):
        value = getattr(t, name)
        if value is not None and "\x00" in str(value):
            raise InvalidGroup(f"{where}.{name}", "contains a NUL character")
    return PreparedTrajectory(
        t, prompt_ids, response_ids, logprobs, token_versions, loss_mask, embedding, version, truncated,
        confidence, reward, turns,
    )


def prepare_group(group: GroupIn, origins: Collection[str] | None = None,
                  kinds: Collection[str] | None = None) -> PreparedGroup:
    """Validate ``group`` and convert its arrays; raise :class:`InvalidGroup` on the first problem.

    ``origins``, ``kinds``: the names a trajectory's origin and the group's kind may take (the
    store passes its tables of origins and group kinds; None leaves the check to the database's
    foreign keys)."""
    if not group.trajectories:
        raise InvalidGroup("trajectories", "a group needs at least one trajectory")
    if len(group.trajectories) > 32767:
        raise InvalidGroup("trajectories", "a group holds at most 32767 trajectories")
    if kinds is not None and group.kind not in kinds:
        raise InvalidGroup("kind", f"{group.kind!r} is not a group kind of this database "
                                   f"(table group_kinds: {', '.join(sorted(kinds))})")
    if int(group.policy_version) < 0:
        raise InvalidGroup("policy_version", f"must be >= 0, got {group.policy_version}")
    prepared = [
        prepare_trajectory(t, f"trajectories[{i}]", int(group.policy_version), origins)
        for i, t in enumerate(group.trajectories)
    ]
    dims = {p.embedding.shape[0] for p in prepared if p.embedding is not None}
    if len(dims) > 1:
        first = prepared[0].embedding.shape[0] if prepared[0].embedding is not None else min(dims)
        for i, p in enumerate(prepared):
            if p.embedding is not None and p.embedding.shape[0] != first:
                raise InvalidGroup(
                    f"trajectories[{i}].embedding",
                    f"dimension {p.embedding.shape[0]} differs from the group's other vectors ({first})",
                )
    return PreparedGroup(group, prepared, dims.pop() if dims else None)


def check_siblings(prepared: list[PreparedGroup]) -> None:
    """Every :class:`Sibling` parent names a trajectory of the same write (``InvalidGroup`` otherwise)."""
    for k, p in enumerate(prepared):
        for i, t in enumerate(p.trajectories):
            ref = t.src.parent_trajectory_id
            if isinstance(ref, Sibling) and not (0 <= ref.group < len(prepared)
                                                 and 0 <= ref.index < len(prepared[ref.group].trajectories)):
                where = f"trajectories[{i}].parent_trajectory_id" if len(prepared) == 1 else \
                    f"groups[{k}].trajectories[{i}].parent_trajectory_id"
                raise InvalidGroup(where, f"{ref} names no trajectory of this write of {len(prepared)} group(s)")
