"""Generation engines behind one interface (:class:`Engine`) and a registry to build them by name.

::

    from reflexdb.collector.engines import make_engine, SamplingParams

    engine = make_engine("hf", model="tiny")
    groups = engine.generate([[{"role": "user", "content": "What is 2 + 3?"}]], n=4,
                             params=SamplingParams(temperature=1.0, max_new_tokens=32))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reflexdb.plugins import ENGINES
from .base import Engine, EngineCall, Prompt, Sample, SamplingParams, ScoreResult, encode_prompt, timed

EngineFactory = Callable[..., Engine]


def register_engine(name: str, factory: EngineFactory, *, replace: bool = False) -> None:
    """Make ``make_engine(name, ...)`` call ``factory(...)``."""
    ENGINES.register(name, factory, replace=replace)


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine registered as ``name`` (``hf``, ``fast``, ``sglang``) with keyword arguments for
    its constructor."""
    return ENGINES.get(name)(**kwargs)  # UnknownName lists the known ones


def engine_names() -> list[str]:
    return ENGINES.names()


def _hf(**kwargs: Any) -> Engine:
    from .hf import HFEngine

    return HFEngine(**kwargs)


def _fast(**kwargs: Any) -> Engine:
    from .fast import FastEngine

    return FastEngine(**kwargs)


def _sglang(**kwargs: Any) -> Engine:
    from .sglang import SGLangEngine

    return SGLangEngine(**kwargs)


register_engine("hf", _hf)
register_engine("fast", _fast)
register_engine("sglang", _sglang)

__all__ = [
    "Engine", "EngineCall", "Prompt", "Sample", "SamplingParams", "ScoreResult", "encode_prompt", "engine_names",
    "make_engine", "register_engine", "timed",
]
