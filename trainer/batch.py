"""Batch assembly: eligible groups from the ``learner_eligible`` view, as padded tensors.

The learner asks the view for the oldest eligible groups (FIFO), reads them with their token
payloads through :meth:`Store.read_groups`, and packs them into right-padded tensors:

    input_ids [B, L]  = prompt ⊕ response, padded;  attention_mask [B, L]
    response_mask [B, T] (loss mask over response positions), old/behaviour logprobs [B, T]

with ``B`` trajectories (groups × G), ``L = max(P_i + T_i)`` and ``T = max(T_i)``. With
``learner.packing`` the engine feeds each micro-batch's rows to the model concatenated instead
(:func:`concat_rows`); everything else keeps this layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from reflexdb import Group, Store, Trajectory
from reflexdb.origins import Origin, matching
from reflexdb.sqlfile import load_queries, relation

Q = load_queries()


@dataclass
class Batch:
    """A learner batch. Shapes: ``B`` trajectories, ``L`` padded sequence, ``T`` padded response."""

    group_ids: list[int]
    trajectory_ids: list[int]
    group_index: torch.Tensor  # [B] int64: which group (0..n_groups-1) each row belongs to
    rewards: torch.Tensor  # [B] float32 (NULL rewards become 0 and are masked out)
    correct: torch.Tensor  # [B] bool
    valid: torch.Tensor  # [B] bool: reward present
    truncated: torch.Tensor  # [B] bool
    input_ids: torch.Tensor  # [B, L] int64
    attention_mask: torch.Tensor  # [B, L] int64
    prompt_lengths: torch.Tensor  # [B] int64
    response_lengths: torch.Tensor  # [B] int64
    response_mask: torch.Tensor  # [B, T] bool: loss mask (response tokens that carry loss)
    behaviour_logprobs: torch.Tensor  # [B, T] float32
    policy_versions: torch.Tensor  # [B] int64: producing version of each trajectory
    confidence: torch.Tensor  # [B] float32: stored confidence exp(mean behaviour log-prob) (NaN if unknown)
    group_versions: list[int]
    group_kinds: list[str]
    meta: list[dict] = field(default_factory=list)  # [B] each trajectory's meta (a method's per-row facts)
    origins: list[str] = field(default_factory=list)  # [B] each row's origin (a name of table origins)
    origin_table: Mapping[str, Origin] = field(default_factory=dict)  # the store's table of origins

    @property
    def size(self) -> int:
        """``B``, the number of rows."""
        return len(self.trajectory_ids)

    def _origin_in(self, names: set[str] | tuple[str, ...]) -> torch.Tensor:
        return torch.tensor([o in names for o in self.origins], dtype=torch.bool).reshape(self.size)

    def of_origin(self, *names: str) -> torch.Tensor:
        """``[B]`` bool: rows whose origin is one of ``names`` (reflexdb/origins.py)."""
        return self._origin_in(names)

    def where_origin(self, **wanted: object) -> torch.Tensor:
        """``[B]`` bool: rows whose origin has these attributes in the table of origins, e.g.
        ``where_origin(pi_old="stored")`` or ``where_origin(pass_at_1=True)``."""
        return self._origin_in(matching(self.origin_table, **wanted))

    @property
    def replayed(self) -> torch.Tensor:
        """``[B]`` bool: stored trajectories replayed in this group (origin ``replayed``)."""
        return self.of_origin("replayed")

    @property
    def imported(self) -> torch.Tensor:
        """``[B]`` bool: imported rows (origin ``imported``): no behaviour log-probs (0 here), no version."""
        return self.of_origin("imported")

    @property
    def auxiliary(self) -> torch.Tensor:
        """``[B]`` bool: a method's auxiliary rows (kind :data:`AUXILIARY`: e.g. R3L's SFT pairs, each
        a group of its own, trained by a term of their own)."""
        return torch.tensor([self.group_kinds[g] == AUXILIARY for g in self.group_index.tolist()], dtype=torch.bool)

    def per_trajectory(self, values: torch.Tensor) -> dict[int, list[float]]:
        """``values [B, S]`` by trajectory id, for the rows of the step's groups: a method's
        auxiliary rows (kind :data:`AUXILIARY`) are left out, and a trajectory in the batch twice
        keeps its first such row."""
        kinds = [self.group_kinds[g] for g in self.group_index.tolist()]
        out: dict[int, list[float]] = {}
        for tid, kind, row in zip(self.trajectory_ids, kinds, values.detach().cpu().tolist()):
            if kind != AUXILIARY:
                out.setdefault(int(tid), row)
        return out

    def by_length(self, ranks: int = 1) -> Batch:
        """The same rows, shortest prompt ⊕ response first, so that each micro-batch (a slice of
        rows, padding trimmed) holds rows of similar lengths and pads less. Row order changes no
        result: advantages go by ``group_index``, and micro-batches are weighted by their share of
        the whole step's normaliser.

        With ``ranks`` > 1 each rank takes a contiguous share (``ceil(B / ranks)`` rows): the rows,
        shortest first, are dealt to the shares in turn, so every share holds short and long rows
        alike (the ranks stay even) and is itself ordered by length.
        """
        order = torch.argsort(self.prompt_lengths + self.response_lengths, stable=True).tolist()
        if ranks > 1:
            per = -(-self.size // ranks)
            room = [max(0, min(per, self.size - r * per)) for r in range(ranks)]
            shares: list[list[int]] = [[] for _ in range(ranks)]
            r = 0
            for i in order:
                while len(shares[r]) >= room[r]:
                    r = (r + 1) % ranks
                shares[r].append(i)
                r = (r + 1) % ranks
            order = [i for share in shares for i in share]
        idx = torch.tensor(order, dtype=torch.long)
        taken = {k: v[idx] for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}
        return Batch(group_ids=self.group_ids, trajectory_ids=[self.trajectory_ids[i] for i in order],
                     group_versions=self.group_versions, group_kinds=self.group_kinds,
                     meta=[self.meta[i] for i in order] if self.meta else [],
                     origins=[self.origins[i] for i in order] if self.origins else [],
                     origin_table=self.origin_table, **taken)

    def rows(self, idx: slice) -> Batch:
        """A micro-batch: rows ``idx`` (tensors sliced, padding trimmed)."""
        sl = {k: v[idx] for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}
        L = int((sl["prompt_lengths"] + sl["response_lengths"]).max())
        T = int(sl["response_lengths"].max())
        sl["input_ids"], sl["attention_mask"] = sl["input_ids"][:, :L], sl["attention_mask"][:, :L]
        sl["response_mask"], sl["behaviour_logprobs"] = sl["response_mask"][:, :T], sl["behaviour_logprobs"][:, :T]
        return Batch(group_ids=self.group_ids, trajectory_ids=self.trajectory_ids[idx], group_versions=self.group_versions,
                     group_kinds=self.group_kinds, meta=self.meta[idx] if self.meta else [],
                     origins=self.origins[idx] if self.origins else [], origin_table=self.origin_table, **sl)


@dataclass(frozen=True)
class Selection:
    """The groups chosen for a step, and what the choosing query could see.

    ``snapshot`` is ``pg_current_snapshot()`` of that query (PostgreSQL's text form): recorded
    with the step, it tells which groups were committed when the learner chose (view
    ``untrained_groups``).

    ``extra`` are trajectory ids a method adds to the step beside its groups (auxiliary rows, e.g.
    R3L's SFT pairs from its views): packed after the groups' rows, each as a group of its own, and
    recorded as consumed by the step like the others.
    """

    group_ids: list[int]
    snapshot: str | None = None
    extra: list[int] = field(default_factory=list)


def eligible_group_ids(store: Store, run_id: int, n: int, *, min_version: int | None = None,
                       drops: str | None = None) -> Selection:
    """The ``n`` oldest eligible groups of the run (see the view ``learner_eligible``).

    Args:
        min_version: the oldest policy version a group may have and still be eligible (the
            learner's version minus ``max_staleness``). Only a bound that makes the query read
            the groups of the staleness window (index ``groups (run_id, policy_version)``)
            instead of the whole run: the view decides eligibility. Staleness only grows, so no
            eligible group is ever below it. (A bound on group *ids* was used once, and skipped
            groups whose writers committed after newer ids had been trained: ids are handed out
            at INSERT, not at COMMIT.)
        drops: the view of the groups the method never trains (``Method.drops``, column
            ``group_id``): left out. ``None``: none is.

    Returns:
        The ids in increasing order, and the query's snapshot.
    """
    from psycopg import sql

    params = {"run_id": run_id, "n": n, "min_version": min_version if min_version is not None else -2**31}
    query = sql.SQL(Q["eligible_groups"]).format(drops=relation(drops, "group_id"))
    with store.transaction() as conn:
        ids, snapshot = conn.execute(query, params).fetchone()
    return Selection([int(g) for g in ids or ()], snapshot)


def eligible_imported_ids(store: Store, run_id: int, n: int) -> list[int]:
    """The ``n`` oldest eligible imported groups of the run (view ``learner_eligible``: only while
    ``learner.imported_per_step`` > 0, no staleness rule, at most ``max_reuse`` steps each)."""
    if n <= 0:
        return []
    with store.transaction() as conn:
        (ids,) = conn.execute(Q["eligible_imported_groups"], {"run_id": run_id, "n": n}).fetchone()
    return [int(g) for g in ids]



def pack_sequences(pairs: list[tuple], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad ``(prompt_ids, response_ids)`` pairs: input_ids `[B, L]`, attention_mask `[B, L]`,
    prompt_lengths `[B]`, response_lengths `[B]`."""
    P = np.array([len(p) for p, _ in pairs])
    T = np.array([len(r) for _, r in pairs])
    L = int((P + T).max())
    input_ids = np.full((len(pairs), L), pad_id, dtype=np.int64)
    attn = np.zeros((len(pairs), L), dtype=np.int64)
    for i, (p, r) in enumerate(pairs):
        input_ids[i, :len(p)] = p
        input_ids[i, len(p):len(p) + len(r)] = r
        attn[i, :len(p) + len(r)] = 1
    return (torch.from_numpy(input_ids), torch.from_numpy(attn), torch.from_numpy(P.astype(np.int64)),
            torch.from_numpy(T.astype(np.int64)))


def concat_rows(input_ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows as one packed sequence: the rows concatenated, no padding.

    The model tells the rows apart by their positions, which restart at 0 for each row: with no
    attention mask, transformers builds a causal mask that also stays inside each row
    (``masking_utils.find_packed_sequence_indices``; docs/design.md).

    Args:
        input_ids: `[B, L]` right-padded rows.
        lengths: `[B]` each row's real tokens (prompt ⊕ response).

    Returns:
        ids `[1, N]` and position_ids `[1, N]` (N = Σ lengths), and starts `[B]`: where each row
        begins in them.
    """
    lengths = lengths.to(input_ids.device)
    real = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :] < lengths[:, None]  # [B, L]
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)  # [B, L]
    starts = torch.cumsum(lengths, 0) - lengths  # [B]
    return input_ids[real][None], positions[real][None], starts


#: ``Batch.group_kinds`` of a method's auxiliary rows (``Selection.extra``): each is a group of its own.
AUXILIARY = "auxiliary"


def pack(groups: list[Group], pad_id: int, extra: Sequence[Trajectory] = (), *,
         origins: Mapping[str, Origin]) -> Batch:
    """Pack groups (read with payloads) into a right-padded :class:`Batch`.

    ``origins``: the store's table of origins (``Store.origins()``): what each row's origin means.

    ``extra``: a method's auxiliary rows (:attr:`Selection.extra`, read with payloads), packed after
    the groups' rows, each a group of its own of kind :data:`AUXILIARY` (a group of one: advantage 0).
    """
    trajs = [(gi, t) for gi, g in enumerate(groups) for t in g.trajectories]
    trajs += [(len(groups) + k, t) for k, t in enumerate(extra)]
    B = len(trajs)
    input_ids, attn, P, T = pack_sequences([(t.prompt_ids, t.response_ids) for _, t in trajs], pad_id)
    Tm = int(T.max())
    rmask = np.zeros((B, Tm), dtype=bool)
    blp = np.zeros((B, Tm), dtype=np.float32)
    for i, (_, t) in enumerate(trajs):
        rmask[i, :len(t.response_ids)] = t.loss_mask
        if t.logprobs is not None:  # None: imported, behaviour unknown (π_old is then always recomputed)
            blp[i, :len(t.response_ids)] = t.logprobs
    rewards = np.array([t.reward if t.reward is not None else 0.0 for _, t in trajs], dtype=np.float32)
    valid = np.array([t.reward is not None for _, t in trajs])
    rmask &= valid[:, None]  # a trajectory whose reward failed carries no loss
    return Batch(
        group_ids=[g.id for g in groups],
        trajectory_ids=[t.id for _, t in trajs],
        group_index=torch.tensor([gi for gi, _ in trajs], dtype=torch.int64),
        rewards=torch.from_numpy(rewards),
        correct=torch.tensor([bool(t.correct) for _, t in trajs]),
        valid=torch.from_numpy(valid),
        truncated=torch.tensor([t.truncated for _, t in trajs]),
        input_ids=input_ids,
        attention_mask=attn,
        prompt_lengths=P,
        response_lengths=T,
        response_mask=torch.from_numpy(rmask),
        behaviour_logprobs=torch.from_numpy(blp),
        policy_versions=torch.tensor([t.policy_version for _, t in trajs], dtype=torch.int64),
        confidence=torch.tensor([t.confidence if t.confidence is not None else float("nan") for _, t in trajs],
                                dtype=torch.float32),
        group_versions=[g.policy_version for g in groups] + [t.policy_version for t in extra],
        group_kinds=[g.kind for g in groups] + [AUXILIARY] * len(extra),
        meta=[t.meta for _, t in trajs],
        origins=[t.origin for _, t in trajs],
        origin_table=origins,
    )
