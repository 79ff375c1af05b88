"""What a collection workflow is, and what the collector offers it.

A workflow is a small class::

    @register_workflow("my_workflow")
    class MyWorkflow:
        def __init__(self, ctx: CollectContext, **options): ...
        def claim(self, want: int) -> list: ...            # claim up to `want` items of work; [] = none now
        def collect(self, items: list) -> list[GroupIn]: ...  # turn them into complete groups
        def release(self) -> None: ...                    # stop: give back unfinished claims
        def exhausted(self) -> bool: ...                  # no work will ever come again

The collector writes each returned group in one transaction (``GroupIn.complete_claim``
semantics: the claim is completed in the same transaction) and keeps the statistics; a workflow
never writes groups itself. ``release`` and ``exhausted`` are optional.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from reflexdb import GroupIn, Store, TrajectoryIn
    from reflexdb.config import Config

    from ..engines import Engine, Sample


class CollectContext(Protocol):
    """What a workflow may use of its collector (``collector/runner.py``)."""

    cfg: Config
    store: Store
    run_id: int
    name: str  # the collector's name: claims are held under it
    engine: Engine
    version: int  # the policy version currently loaded
    embedding_model: str
    rng: np.random.Generator

    def db(self, fn) -> Any: ...  # a database call, retried through an outage (collector.db_retry_s)

    def echo(self, msg: str) -> None: ...

    def prompt(self, text: str) -> list[dict]: ...  # the chat messages of a task prompt (the run's template)

    def sample(self, prompts: list[list[dict]], n: int) -> list[list[Sample]]: ...  # n samples each, seeded

    def score(self, ground_truth: str | None, prompt: list[dict], samples: list[Sample]) -> list[TrajectoryIn]: ...


class Workflow(Protocol):
    name: str

    def claim(self, want: int) -> list: ...

    def collect(self, items: list) -> list[GroupIn]: ...
