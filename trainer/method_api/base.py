"""What a learner method is: a few named components, assembled, no subclass of the learner.

A :class:`Method` says

- which collection **workflows** its collectors run, in priority order (``collector/workflows/``);
- which groups a batch takes (``select``: a view behind a query; default: the oldest eligible
  groups of ``learner_eligible``), and any auxiliary rows beside them (``Selection.extra``);
- which groups it never trains (``drops``: a view), so that collectors' admission control counts
  only the groups a step can take;
- how advantages are computed: the group scale and the **transforms** after it;
- its **loss terms**: each a registered loss (``trainer/losses/registry.py``) applied to a subset
  of the batch's rows (and, optionally, of their loss tokens), with that loss's own normaliser and
  a weight;
- the **run settings** it publishes (the views read them) and the **metrics** it adds;
- its typed **config section** (top-level key = the method's name) and cross-key checks;
- optionally **hooks**: a stateful learner-side part (NexGRPO's replay planner) built once per
  learner, called at setup and after each step.

``trainer/learner.py`` and ``collector/runner.py`` only ever call these; they name no method.
docs/design.md "Adding a method" walks through writing one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the declarations stay importable without torch
    from pydantic import BaseModel
    from torch import Tensor

    from reflexdb import Group, Store
    from reflexdb.config import Config

    from ..batch import Batch, Selection
    from ..scoring import Scorer


@dataclass(frozen=True)
class WorkflowUse:
    """A collection workflow a method's collectors run, with its options (keyword arguments)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


#: ``rows(batch) -> [B] bool``: the rows a loss term applies to.
RowSelector = Callable[["Batch"], "Tensor"]
#: ``mask(batch) -> [B, T] bool``: the loss tokens a term keeps (ANDed with the stored loss mask).
TokenMask = Callable[["Batch"], "Tensor"]


def valid_rows(batch: Batch) -> Tensor:
    """Every row whose reward is known (a NULL reward — the reward function raised — carries no loss)."""
    return batch.valid


def best_of_group(batch: Batch) -> Tensor:
    """One row per group: the highest reward among its valid rows (the first of equals). RAFT's
    selection (Dong et al., 2023, Sec. 3: rank the K samples of a prompt, keep the best)."""
    import torch

    rewards = torch.where(batch.valid, batch.rewards.double(), torch.tensor(float("-inf"), dtype=torch.float64))
    keep = torch.zeros(batch.size, dtype=torch.bool)
    for g in torch.unique(batch.group_index):
        rows = (batch.group_index == g).nonzero().flatten()
        best = rows[int(torch.argmax(rewards[rows]))]  # argmax returns the first maximum
        keep[best] = bool(batch.valid[best])
    return keep


@dataclass(frozen=True)
class LossTerm:
    """One term of a method's loss: ``weight · loss(rows, tokens)``.

    Attributes:
        name: the term's name; metrics are ``loss/<field>`` for the first term and
            ``loss/<name>/<field>`` for the others.
        loss: a registered loss family (``trainer/losses/registry.py``).
        params: that family's typed parameters (``LossSpec.parse``).
        rows: which rows of the batch it applies to.
        weight: its coefficient in the step's loss.
        mask: which of those rows' loss tokens it keeps (``None``: every one); its normaliser
            counts the kept tokens only.
    """

    name: str
    loss: str
    params: BaseModel
    rows: RowSelector = valid_rows
    weight: float = 1.0
    mask: TokenMask | None = None


class LearnerContext(Protocol):
    """What the learner offers a method's hooks (and nothing else): the ``learner`` argument of
    ``Method.hooks(cfg, learner)``.

    ``cfg`` is the run's config, ``store`` the experience store, ``run_id`` the run's id (table
    ``runs``), ``step_no`` the number of steps trained so far (the step just recorded, in
    ``after_step``), ``version`` the newest published policy version, ``world`` the number of
    ranks (data parallel).
    """

    cfg: Config
    store: Store
    run_id: int
    step_no: int
    version: int
    main: bool  # rank 0: the only rank that writes to the store
    world: int

    def db(self, fn: Callable[[], Any]) -> Any: ...  # a database call, retried through an outage

    def echo(self, msg: str) -> None: ...  # a line of the learner's log (rank 0's; other ranks' are dropped)

    scorer: Scorer  # ℓ_θ of stored trajectories under the current weights (trainer/scoring.py)

    def log_step_metrics(self, metrics: dict[str, float]) -> None: ...  # MLflow + the step's row


class Hooks(Protocol):
    """A method's stateful learner-side part, built once per learner by ``Method.hooks(cfg, learner)``;
    every method is optional (the learner calls those the object has)."""

    def setup(self) -> None:
        """Once, after the learner has loaded the model and resumed (``step_no`` is the step it
        resumes at), before the first batch is chosen."""

    def select(self, n: int, min_version: int) -> Selection:
        """The next step's batch (rank 0): up to ``n`` group ids whose policy version is at least
        ``min_version`` (the learner's version minus ``max_staleness``), and any auxiliary rows
        (``Selection.extra``). Fewer than ``n`` ids: the learner waits for new groups and asks
        again. Without it: ``eligible_group_ids``, the oldest eligible groups that ``Method.drops``
        does not list. Every group this leaves out for good must be listed by ``Method.drops``:
        collectors' admission control counts the others as the groups coming steps take."""

    def metrics(self, batch: Batch, groups: Sequence[Group]) -> dict[str, float]:
        """The method's metrics of a step (every rank, after the update): ``batch`` is the step's
        whole batch, ``groups`` its groups as the store read them. Rank 0 logs them to MLflow and
        the step's ``learner_steps.metrics``; name them ``<method>/<metric>``."""

    def after_step(self, metrics: dict[str, float]) -> None:
        """After each step (every rank), once it is recorded and, when due, published: the
        method's work between steps. Only rank 0 (``LearnerContext.main``) may write to the store."""

    def progress(self, metrics: dict[str, float]) -> str: ...  # a part of the step's progress line ("" for none)


def _plain_group(cfg: Config) -> list[WorkflowUse]:
    return [WorkflowUse("group")]


def _no_settings(cfg: Config) -> dict[str, Any]:
    return {}


def _no_check(cfg: Config) -> None:
    return None


@dataclass(frozen=True)
class Method:
    """A registered learner method (``algorithm: <name>``).

    Attributes:
        name: the value of ``algorithm``; also the key of its config section.
        summary: one line for listings and error messages.
        loss: the loss family of its main term (``learner.loss`` overrides it).
        advantage_scale: the default of ``learner.advantage_scale`` (``group``: GRPO's std;
            ``none``: Dr.GRPO's centring only).
        config: the typed config section (a pydantic model with defaults), or ``None``.
        workflows: ``cfg -> [WorkflowUse]``, the collectors' workflows in priority order.
        terms: ``(cfg, main_params) -> [LossTerm]``; default: the main loss on every valid row.
        transforms: ``cfg -> [transform]`` applied to the group advantages, in order.
        settings: ``cfg -> {key: value}`` written to the run's settings at learner start.
        check: ``cfg -> None``; raise ValueError naming the keys when they do not fit together.
        hooks: ``(cfg, learner) -> Hooks``, built once per learner; ``None``: none.
        drops: the view (or table; ``schema.name`` allowed) whose column ``group_id`` lists the
            groups of the method's runs that it never trains; ``None``: it trains every eligible
            group. Collectors' admission control counts only the groups it does not list
            (the n-th group a step can take is consumed by step ``n // groups_per_step``): counted,
            dropped groups make a collector wait at ``max_staleness: 1`` for a version the learner,
            waiting for groups, never trains. The learner's default batch rule (no ``select``
            hook) leaves them out; a ``select`` of the method's own must leave them out too
            (``eligible_group_ids(..., drops=...)`` does). The method's migration branch creates
            the view and its ``sql/roles.sql`` grants ``SELECT`` on it to ``reflexdb_collector``;
            processes refuse to start when they cannot read it. List a group once it is written
            and for good (a rule over its own rows, such as zero reward variance): a group listed
            late was counted meanwhile (a collector waits longer than it must, never starts a
            group too stale). Admission reads the view before each batch, joined on ``group_id``:
            keep that cheap. Made the method's part of the composed view ``group_holds`` (columns
            ``group_id, reason``), it also gives ``untrained_groups`` the reason, where the group
            would otherwise be ``passed_over``, which the failure drill counts as a defect
            (docs/design.md, "Adding a method").
    """

    name: str
    summary: str
    loss: str
    advantage_scale: str = "group"
    config: type[BaseModel] | None = None
    workflows: Callable[[Config], list[WorkflowUse]] = _plain_group
    terms: Callable[[Config, BaseModel], list[LossTerm]] | None = None
    transforms: Callable[[Config], list[Callable]] | None = None
    settings: Callable[[Config], dict[str, Any]] = _no_settings
    check: Callable[[Config], None] = _no_check
    hooks: Callable[[Config, LearnerContext], Hooks] | None = None
    drops: str | None = None

    def __post_init__(self) -> None:
        if self.drops is not None:
            from reflexdb.sqlfile import relation_name_problem

            problem = relation_name_problem(self.drops)
            if problem:
                raise ValueError(f"method {self.name!r}: drops {problem}")

    def loss_terms(self, cfg: Config, main_params: BaseModel) -> list[LossTerm]:
        """The terms of the step's loss: ``terms(cfg, main_params)``, or the main family
        (``learner.loss`` or ``loss``) on every valid row as term ``policy``."""
        if self.terms is not None:
            return self.terms(cfg, main_params)
        return [LossTerm("policy", cfg.learner.loss or self.loss, main_params)]
