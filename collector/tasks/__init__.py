"""Task sources: the built-in arithmetic generator and JSONL / Parquet datasets; prompt templates."""

from __future__ import annotations

from .arithmetic import LEVELS, arithmetic_tasks
from .base import Task
from .datasets import GSM8K, FieldMap, LoadedDataset, SkippedRow, load_dataset
from .templates import (
    PromptTemplate,
    apply_chat_template,
    get_template,
    register_template,
    render_chat,
    template_names,
)
from . import tool_use  # noqa: F401  (registers the prompt template ``tool_python``)

__all__ = [
    "GSM8K", "LEVELS", "FieldMap", "LoadedDataset", "PromptTemplate", "SkippedRow", "Task",
    "apply_chat_template", "arithmetic_tasks", "get_template", "load_dataset", "register_template",
    "render_chat", "template_names",
]
