"""Text and JSON as PostgreSQL stores them: what a model or a tool writes, made storable.

PostgreSQL's ``text`` holds no NUL character and its UTF-8 no lone surrogate (a Python ``str``
may hold both: a tool printing ``\\0``, JSON with ``"\\ud800"``); ``jsonb`` holds neither, nor NaN
or an infinity. The store refuses such values with a clear error (:mod:`reflexdb.validate`);
a collector, which must never stop on what a model wrote, makes them storable first: each such
character becomes U+FFFD (the replacement character) and each such float ``None``. Token ids,
which are what trains, are never touched.

:func:`printable` is the other direction, text made safe to *show*: model and tool text without
terminal control sequences, for the model's next prompt and a researcher's terminal.
"""

from __future__ import annotations

import math
import re
from typing import Any

REPLACEMENT = "\ufffd"
#: Dicts and lists nested deeper than this become ``None`` in :func:`storable_json`: psycopg's
#: ``Jsonb`` (``json.dumps``) and every recursive reader stop near Python's recursion limit (1000
#: frames), and nothing a collector means to keep is nested this deep.
MAX_JSON_DEPTH = 256


#: Terminal control sequences and control characters (ECMA-48): OSC (clipboard
#: writes, hyperlinks, titles) to its BEL or ST, DCS/SOS/PM/APC strings to their ST, CSI sequences
#: (colours, cursor moves, screen clears), other escapes, and every C0 and C1 control but tab and
#: newline. Each branch is one greedy class with an optional end, so a scan never backtracks: linear
#: in the output's size, terminated or not. A carriage return becomes a newline.
_CONTROLS = re.compile(
    r"(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC ... BEL | ST (7- or 8-bit)
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC ... ST
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI: parameters, intermediates, final
    r"|\x1b[ -/]*[0-~]?"  # any other escape
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # the other C0 and C1 controls (tab and newline stay)
)


def printable(text: str) -> tuple[str, int]:
    """``text`` without terminal control sequences, and how many were removed (carriage returns,
    which become newlines, are not counted). Tool output goes into the model's next prompt, and
    model text onto a researcher's terminal (``reflexdb sql``): an escape that clears a screen,
    writes the clipboard (OSC 52) or hides a link (OSC 8) belongs in neither."""
    return _CONTROLS.subn("", text.replace("\r\n", "\n").replace("\r", "\n"))


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
    (:func:`storable_text`, keys too) and every non-finite float ``None``; a dict or list nested
    deeper than :data:`MAX_JSON_DEPTH` becomes ``None``.

    Walked with a stack of its own, not by recursion: JSON a model wrote 500 levels deep (which
    ``json.loads`` reads) must not raise ``RecursionError`` here, and each value is visited once.
    """
    root = [value]
    todo = [(root, 0, 0)]  # (container, key, depth) of each value not converted yet
    while todo:
        parent, key, depth = todo.pop()
        v = parent[key]
        if isinstance(v, str):
            parent[key] = storable_text(v)
        elif isinstance(v, float):
            parent[key] = v if math.isfinite(v) else None
        elif isinstance(v, (dict, list, tuple)):
            parent[key] = None if depth >= MAX_JSON_DEPTH else _shallow_copy(v, todo, depth + 1)
    return root[0]


def _shallow_copy(value: dict | list | tuple, todo: list, depth: int) -> dict | list:
    """A new dict (keys made storable) or list holding ``value``'s items as they are, each queued
    on ``todo`` to be converted. Two keys that become equal keep the first's place and the last's
    value, as a dict comprehension does; the key is queued once."""
    if isinstance(value, dict):
        out: dict = {}
        for k, v in value.items():
            k = storable_text(k) if isinstance(k, str) else k
            if k not in out:
                todo.append((out, k, depth))
            out[k] = v
        return out
    items = list(value)
    todo.extend((items, i, depth) for i in range(len(items)))
    return items


__all__ = ["MAX_JSON_DEPTH", "REPLACEMENT", "printable", "storable_json", "storable_text"]
