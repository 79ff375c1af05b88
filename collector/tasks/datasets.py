"""Load tasks from JSONL or Parquet files with a field mapping.

The default mapping reads GSM8K as it is published: the prompt from ``question`` and the ground
truth from the text after ``#### `` in ``answer`` (the full worked solution is kept in
``meta["solution"]``). A row that lacks a mapped field, is not valid JSON or has an empty prompt
is skipped: a warning names the file and line, and the row is counted in
:attr:`LoadedDataset.skipped`.

::

    ds = load_dataset("/data/gsm8k/train.jsonl")                      # GSM8K out of the box
    ds = load_dataset("math.parquet", fields=FieldMap(prompt="problem", answer="solution",
                                                      answer_format="boxed"))
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import Task

log = logging.getLogger(__name__)

ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "raw")
_GSM8K_MARK = "####"
#: A GSM8K number, thousands separators allowed. Linear: ``\.`` and ``[\d,]`` never match the same
#: character, so a failed full match backtracks once per character.
_GSM8K_NUMBER = re.compile(r"-?[\d,]+(\.\d+)?")


@dataclass(frozen=True)
class FieldMap:
    """Which fields of a row make a task.

    Args:
        prompt: field with the question (dotted paths reach into nested objects: ``a.b``).
        answer: field with the answer or worked solution.
        key: optional field with a stable row id, used as the task key; default: a hash of the
            prompt.
        answer_format: how the ground truth is taken from the answer field: ``gsm8k`` (text after
            ``####``; rows without it are skipped), ``boxed`` (content of the last ``\\boxed{}``;
            rows without one are skipped), ``raw`` (the whole field), or ``auto`` (``####`` if
            present, else the last ``\\boxed{}`` if present, else the whole field).
        meta: extra fields copied into the task's ``meta`` when present.
    """

    prompt: str = "question"
    answer: str = "answer"
    key: str | None = None
    answer_format: str = "auto"
    meta: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {self.answer_format!r}")
        object.__setattr__(self, "meta", tuple(self.meta))


#: GSM8K's published layout.
GSM8K = FieldMap(prompt="question", answer="answer", answer_format="gsm8k")


@dataclass(frozen=True)
class SkippedRow:
    line: int
    reason: str


@dataclass(frozen=True)
class LoadedDataset:
    """Tasks read from one file.

    Attributes:
        tasks: the valid rows, in file order.
        skipped: how many rows were skipped.
        skipped_rows: line (JSONL, 1-based) or row number (Parquet, 1-based) and reason of each.
    """

    path: Path
    tasks: list[Task]
    skipped_rows: list[SkippedRow] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.skipped_rows)

    def __len__(self) -> int:
        return len(self.tasks)


class _Skip(Exception):
    pass


def _get(row: Mapping[str, Any], path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value or value[part] is None:
            raise _Skip(f"missing field {path!r}")
        value = value[part]
    return value


def _text(value: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _Skip(f"field {name!r} is {type(value).__name__}, not text or a number")
    return str(value).strip()


def _after_mark(answer: str) -> str | None:
    """The text after the first ``####``, stripped; None when there is no mark or nothing after it.

    One ``find``, linear in the text: the regex this replaces (``####\\s*(.+?)\\s*$``) tried its
    lazy group at every character of a whitespace run, quadratic in the run's length.
    """
    i = answer.find(_GSM8K_MARK)
    if i < 0 or i + len(_GSM8K_MARK) == len(answer):
        return None
    return answer[i + len(_GSM8K_MARK):].strip()


def ground_truth_from(answer: str, answer_format: str) -> str:
    """The ground truth in an answer field (see :attr:`FieldMap.answer_format`).

    Raises:
        ValueError: the format's marker is missing.
    """
    from ..rewards import extract_boxed

    if answer_format == "raw":
        return answer
    if answer_format in ("gsm8k", "auto"):
        value = _after_mark(answer)
        if value is not None:
            # GSM8K writes plain integers, occasionally with thousands separators.
            return value.replace(",", "") if _GSM8K_NUMBER.fullmatch(value) else value
        if answer_format == "gsm8k":
            raise ValueError("no '#### ' answer line")
    boxed = extract_boxed(answer)
    if boxed is not None:
        return boxed
    if answer_format == "boxed":
        raise ValueError("no \\boxed{} answer")
    return answer


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, row)`` of each non-blank line; a line that is not UTF-8 or not JSON Python reads
    is a :class:`_Skip` in its place (bytes that are not UTF-8 come through ``surrogateescape``
    as lone surrogates, found by encoding the line back)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            yield lineno, _json_row(line)


def _json_row(line: str) -> Any:
    """One JSONL line as a row, or the :class:`_Skip` that says why it is none."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:
        return _Skip(f"not UTF-8 (column {exc.start + 1})")
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        return _Skip(f"invalid JSON ({exc.msg})")
    except (ValueError, RecursionError) as exc:  # an integer of 5,000 digits, [[[[...]]]] 10^5 deep
        return _Skip(f"JSON this reader cannot hold ({type(exc).__name__})")


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pyarrow comes with mlflow/pandas; say so if it is absent
        raise ImportError("reading Parquet needs pyarrow: pip install pyarrow") from exc
    rowno = 0
    for batch in pq.ParquetFile(path).iter_batches():
        for row in batch.to_pylist():
            rowno += 1
            yield rowno, row


def load_dataset(
    path: str | Path,
    *,
    fields: FieldMap = FieldMap(),
    dataset: str | None = None,
    split: str = "train",
    limit: int | None = None,
) -> LoadedDataset:
    """Read tasks from a ``.jsonl`` (optionally ``.gz``) or ``.parquet`` file.

    Args:
        path: the file.
        fields: the field mapping; the default reads GSM8K.
        dataset: the tasks' dataset name; default: the parent directory's name for files called
            like a split (``gsm8k/train.jsonl`` → ``gsm8k``), else the file's stem.
        split: the tasks' split.
        limit: stop after this many valid tasks.
    """
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".parquet"):
        rows = _parquet_rows(path)
    elif name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        rows = _jsonl_rows(path)
    else:
        raise ValueError(f"{path}: unsupported file type (use .jsonl, .jsonl.gz or .parquet)")
    stem = name.split(".")[0]
    if dataset is None:
        dataset = path.parent.name if stem in ("train", "test", "eval", "validation", "dev") else stem

    tasks: list[Task] = []
    skipped: list[SkippedRow] = []
    for lineno, row in rows:
        try:
            if isinstance(row, _Skip):
                raise row
            if not isinstance(row, Mapping):
                raise _Skip(f"row is {type(row).__name__}, not an object")
            prompt = _text(_get(row, fields.prompt), fields.prompt)
            if not prompt:
                raise _Skip(f"field {fields.prompt!r} is empty")
            answer = _text(_get(row, fields.answer), fields.answer)
            try:
                truth = ground_truth_from(answer, fields.answer_format)
            except ValueError as exc:
                raise _Skip(f"field {fields.answer!r}: {exc}") from None
            meta: dict[str, Any] = {"source": str(path), "line": lineno}
            if truth != answer:
                meta["solution"] = answer
            for extra in fields.meta:
                if isinstance(row.get(extra), (str, int, float, bool)):
                    meta[extra] = row[extra]
            key = ""
            if fields.key is not None:
                key = f"{dataset}:{_text(_get(row, fields.key), fields.key)}"
        except _Skip as exc:
            log.warning("%s:%d: skipped row: %s", path, lineno, exc)
            skipped.append(SkippedRow(lineno, str(exc)))
            continue
        tasks.append(Task(prompt=prompt, ground_truth=truth, dataset=dataset, split=split, task_key=key, meta=meta))
        if limit is not None and len(tasks) >= limit:
            break
    if skipped:
        log.warning("%s: skipped %d row(s) of %d", path, len(skipped), len(skipped) + len(tasks))
    return LoadedDataset(path=path, tasks=tasks, skipped_rows=skipped)
