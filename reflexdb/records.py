"""Typed records going into and coming out of the store.

Inputs (``*In``) are what collectors build; the store validates them (:mod:`reflexdb.validate`)
before anything is written. Outputs are frozen dataclasses with token payloads as numpy arrays.
Shapes: ``T`` = response tokens, ``P`` = prompt tokens, ``D`` = embedding dimension.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np


@dataclass
class TurnIn:
    """One turn of a trajectory.

    Args:
        role: ``system`` | ``user`` | ``assistant`` | ``tool`` | ``observation``.
        text: the turn's text.
        token_start, token_end: the turn's span ``[start, end)`` in ``response_ids``; ``None`` for
            turns inside the prompt.
        trainable: whether the turn's tokens may carry loss (assistant turns, by default).
        tool_error: the turn is a tool call whose execution failed (CLEANER).
        attempt: the attempt of a multi-turn episode the turn belongs to (0-based; an assistant
            turn and the environment's feedback on it share it); ``None`` for prompt turns.
        answer, correct, reward: on an assistant turn, the environment's verdict on it.
        tool_call: on a tool turn, the call's record (status, exit code, wall and CPU time, bytes
            of output, the code's size and SHA-256: ``ToolResult.record()``; view ``tool_calls``).
    """

    role: str
    text: str
    token_start: int | None = None
    token_end: int | None = None
    trainable: bool | None = None
    tool_error: bool = False
    attempt: int | None = None
    answer: str | None = None
    correct: bool | None = None
    reward: float | None = None
    tool_call: dict[str, Any] | None = None


@dataclass(frozen=True)
class Sibling:
    """Lineage to a trajectory of the same write whose id is not known yet: the ``index``-th
    trajectory of the ``group``-th group given to ``Store.write_groups`` (groups a workflow writes
    together, e.g. a retry that refers to the base episode of the same transaction)."""

    group: int
    index: int


@dataclass
class TrajectoryIn:
    """One sampled trajectory, as a collector hands it to :meth:`Store.write_group`.

    Args:
        response_ids: `[T]` int token ids generated (and, in multi-turn trajectories, the
            observation tokens between assistant turns; ``loss_mask`` tells them apart).
        logprobs: `[T]` float log pi_beh of each response token under the sampling distribution;
            ``None`` only for origin ``imported`` (unknown, stored as NULL).
        prompt_ids: `[P]` int prompt token ids.
        reward: the scalar reward, or ``None`` if the reward function failed (give ``error``).
        correct: whether the answer was verified correct (``None`` if unknown).
        turns: the conversation; spans index ``response_ids``.
        token_policy_versions: `[T]` policy version that produced each token; defaults to the
            trajectory's ``policy_version`` (or the group's).
        loss_mask: `[T]` bool, tokens that may carry loss; defaults to the trainable turns' spans,
            or every token when no turn has a span.
        embedding: `[D]` float mean-pooled last-layer hidden state over the response tokens.
        confidence: defaults to ``exp(mean(logprobs))`` (NexGRPO's l(o)).
        origin: where the trajectory comes from: a row of table ``origins`` (``base``: sampled
            by the policy for the task's plain prompt; the table says what each other origin
            means for the collector and the learner; a method's migration adds its own).
        parent_trajectory_id: lineage; may be a :class:`Sibling` (a trajectory written in the same
            transaction). A method's own links (a reflection, a hint) are rows of its tables,
            written by the group's attachments (reflexdb/attachments.py).
    """

    response_ids: Any
    logprobs: Any
    prompt_ids: Any = ()
    reward: float | None = None
    correct: bool | None = None
    turns: list[TurnIn] = field(default_factory=list)
    truncated: bool | None = None
    finish_reason: str = "stop"
    extracted_answer: str | None = None
    confidence: float | None = None
    origin: str = "base"
    parent_trajectory_id: int | Sibling | None = None
    policy_version: int | None = None
    token_policy_versions: Any = None
    loss_mask: Any = None
    embedding: Any = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class GroupIn:
    """A group of trajectories sampled for one task, written atomically.

    Args:
        run_id, task_id: where it belongs.
        policy_version: the version that generated the group's on-policy samples.
        trajectories: the members, in order (``index_in_group`` is their position).
        workflow: the workflow that produced it (``group``, or a method's workflow).
        kind: a row of table ``group_kinds`` (``fresh``, ``eval``, ...; a method's revision adds its own).
        embedding_model, embedding_layer: where the trajectories' embeddings come from.
        attachments: what the group's transaction writes besides it (``reflexdb/attachments.py``):
            the claimed work item it completes, if not its task's claim, and rows that refer to
            (or are referred to by) its trajectories. Each method's module implements its own.
        write_key: chosen once per group (a fresh UUID by default). Writing the same ``GroupIn``
            again after an attempt whose commit was not acknowledged (the connection dropped)
            returns the group the first attempt wrote instead of writing it twice.
    """

    run_id: int
    task_id: int
    policy_version: int
    trajectories: list[TrajectoryIn]
    workflow: str = "group"
    kind: str = "fresh"
    collector: str | None = None
    embedding_model: str = "unknown"
    embedding_layer: int = -1
    meta: dict[str, Any] = field(default_factory=dict)
    attachments: list[Any] = field(default_factory=list)
    write_key: uuid.UUID = field(default_factory=uuid.uuid4)


@dataclass
class TaskIn:
    """A task to add to a run."""

    prompt: str
    ground_truth: str | None = None
    dataset: str = "default"
    split: str = "train"
    task_key: str | None = None  # defaults to a hash of the prompt
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WrittenGroup:
    """Ids assigned to a group written by :meth:`Store.write_group`."""

    group_id: int
    trajectory_ids: tuple[int, ...]


@dataclass(frozen=True)
class Turn:
    """A stored turn (a row of table ``turns``); its fields are :class:`TurnIn`'s."""

    turn_index: int
    role: str
    text: str
    token_start: int | None
    token_end: int | None
    trainable: bool
    tool_error: bool
    attempt: int | None = None
    answer: str | None = None
    correct: bool | None = None
    reward: float | None = None
    tool_call: dict[str, Any] | None = None


@dataclass(frozen=True)
class Trajectory:
    """A stored trajectory. Payload fields are ``None`` unless read with ``payloads=True``."""

    id: int
    group_id: int
    run_id: int
    task_id: int
    index_in_group: int
    origin: str
    parent_trajectory_id: int | None
    policy_version: int
    reward: float | None
    correct: bool | None
    truncated: bool
    finish_reason: str
    extracted_answer: str | None
    confidence: float | None
    num_turns: int
    response_length: int
    times_sampled: int
    error: str | None
    meta: dict[str, Any]
    created_at: datetime
    prompt_ids: np.ndarray | None = None  # [P] int32
    response_ids: np.ndarray | None = None  # [T] int32
    logprobs: np.ndarray | None = None  # [T] float32
    token_policy_versions: np.ndarray | None = None  # [T] int32
    loss_mask: np.ndarray | None = None  # [T] bool
    embedding: np.ndarray | None = None  # [D] float32
    turns: tuple[Turn, ...] = ()


@dataclass(frozen=True)
class Group:
    """A stored group (a row of table ``groups``) with its trajectories, as ``Store.read_groups``
    returns it (what a method's ``Hooks.metrics`` receives)."""

    id: int
    run_id: int
    task_id: int
    workflow: str
    kind: str
    policy_version: int
    size: int
    collector: str | None
    meta: dict[str, Any]
    created_at: datetime
    trajectories: tuple[Trajectory, ...] = ()


@dataclass(frozen=True)
class PolicyVersion:
    run_id: int
    version: int
    checkpoint_uri: str
    sha256: str | None
    step: int
    meta: dict[str, Any]
    created_at: datetime
    #: the sha256 of the version's ``manifest.json`` in object storage (revision 0029); ``None`` for a
    #: local directory and for versions published before it (their weights alone are checked)
    manifest_sha256: str | None = None


@dataclass(frozen=True)
class TokenSignals:
    """What a learner step's loss used at each response token of one consumed row (table
    ``token_signals``, revision 0028; trainer/losses/signals.py). Every array has the row's ``T``
    response tokens; the store keeps the floats as float16.

    Args:
        advantage: ``[T]`` float, the advantage that multiplied each token's term, NaN where the
            loss gave the token none; ``None`` when it gave the row none at all (SFT).
        log_ratio: ``[T]`` float, log of the importance ratio that entered the clip, NaN where
            none; ``None`` when the loss has no ratio.
        clipped: ``[T]`` bool, where the clipped branch of the surrogate was active.
        entropy: ``[T]`` float, the entropy (nats) of the policy's distribution at each token.
    """

    advantage: np.ndarray | None
    log_ratio: np.ndarray | None
    clipped: np.ndarray
    entropy: np.ndarray
