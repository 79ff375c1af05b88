"""Text and JSON as PostgreSQL stores them: what a model or a tool writes, made storable.

PostgreSQL's ``text`` holds no NUL character and its UTF-8 no lone surrogate (a Python ``str``
may hold both: a tool printing ``\\0``, JSON with ``"\\ud800"``); ``jsonb`` holds neither, nor NaN
or an infinity. The store refuses such values with a clear error (:mod:`reflexdb.validate`);
a collector, which must never stop on what a model wrote, makes them storable first: each such
character becomes U+FFFD (the replacement character) and each such float ``None``. Token ids,
which are what trains, are never touched.
"""

from __future__ import annotations

import math
from typing import Any

REPLACEMENT = "\ufffd"


def storable_text(value: str | None) -> str | None:
    """``value`` with NUL and lone surrogates replaced by U+FFFD (``None`` stays ``None``)."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return value


def storable_json(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string storable
    (:func:`storable_text`, keys too) and every non-finite float ``None``."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {storable_text(k) if isinstance(k, str) else k: storable_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable_json(v) for v in value]
    return value


__all__ = ["REPLACEMENT", "storable_json", "storable_text"]
