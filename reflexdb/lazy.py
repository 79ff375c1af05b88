"""Modules imported on first use. ``torch``: the config's loss families (``trainer/losses``) are
imported by commands that never compute (``reflexdb check`` validates loss parameters) and
importing torch takes seconds of a command meant to take one. ``lazy(name)``: the CLI's modules
name the heavy ones they need (SQLAlchemy, the store, FAISS), so that every command does not
import what one command uses.

    from reflexdb.lazy import torch   # in place of `import torch`; torch.where(...) works as usual
    admin = lazy("reflexdb.ops.admin")    # in place of `from reflexdb.ops import admin`

(``importlib.util.LazyLoader`` cannot do this: ``import torch`` of a lazy module in ``sys.modules``
reads its ``__spec__``, which loads it.)
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _Lazy:
    """A module proxy: the first attribute read imports the module, every read is forwarded."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{'' if self._module is None else ' (imported)'}>"


def lazy(name: str) -> Any:
    """Module ``name``, imported when an attribute of it is first read."""
    return _Lazy(name)


torch: Any = _Lazy("torch")
