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

from ..errors import UnknownName
from .base import Engine, Prompt, Sample, SamplingParams, ScoreResult, encode_prompt

EngineFactory = Callable[..., Engine]
_ENGINES: dict[str, EngineFactory] = {}


def register_engine(name: str, factory: EngineFactory, *, replace: bool = False) -> None:
    """Make ``make_engine(name, ...)`` call ``factory(...)``."""
    if name in _ENGINES and not replace:
        raise ValueError(f"engine {name!r} is already registered")
    _ENGINES[name] = factory


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine registered as ``name`` (``hf``, ``sglang``) with keyword arguments for
    its constructor."""
    try:
        factory = _ENGINES[name]
    except KeyError:
        raise UnknownName("engine", name, list(_ENGINES)) from None
    return factory(**kwargs)


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def _hf(**kwargs: Any) -> Engine:
    from .hf import HFEngine

    return HFEngine(**kwargs)


def _sglang(**kwargs: Any) -> Engine:
    from .sglang import SGLangEngine

    return SGLangEngine(**kwargs)


register_engine("hf", _hf)
register_engine("sglang", _sglang)

__all__ = [
    "Engine", "Prompt", "Sample", "SamplingParams", "ScoreResult", "encode_prompt", "engine_names",
    "make_engine", "register_engine",
]
