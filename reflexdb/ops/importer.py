"""``reflexdb import``: rows of prompt + completion (+ reward) from JSONL or Parquet become stored
trajectories of origin ``imported``, beside the run's own, for SQL, export and inspection.

Each row is one trajectory:

    prompt       the user's text, or a list of chat messages ({"role", "content"})
    completion   the response's text (or a list holding one assistant message)
    messages     instead of prompt + completion: a chat ending with the assistant's message
    reward       optional number (or null); correct: optional bool (default: reward >= 1 when given)
    ground_truth, task_key: optional, for the task
    prompt_ids, completion_ids: optional token ids (as reflexdb export writes them); used as given
                 when both are present, else the text is tokenised with the run's tokenizer and
                 chat template (the prompt as the collector renders it, the completion followed
                 by the end-of-turn token)

Rows with the same prompt share a task (dataset ``--dataset``, split ``train``), and within a
batch one group of kind ``imported``: GRPO's group, whose rewards give each other's advantages.
The rows of the prompt a batch ends with are carried into the next batch, so that a file with a
prompt's completions on consecutive lines (as rollouts are written) keeps each prompt's
completions in one group whatever the batch size (only a run of more than ``MAX_GROUP_ROWS``
consecutive rows of one prompt is split).
Behaviour log-probs are unknown: stored as NULL and marked by the origin. The learner trains
imported groups only when asked (``learner.imported_per_step`` > 0; view ``learner_eligible``,
reason ``imported`` otherwise), with π_old its own weights. A bad row is reported as
``FILE:LINE: problem`` and skipped; the rest of its batch is written in one transaction.
Re-running an import writes nothing twice, whatever its batch size: each group's write key is
derived from its rows, and groups already written are skipped and counted (``already``).
The file is checked (it exists, its suffix, Parquet's footer) before anything is written; a JSONL
line that is not UTF-8 is a bad row like any other.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ReflexdbError
from ..records import GroupIn, TaskIn, TrajectoryIn, TurnIn
from ..schema import ROLES

_NAMESPACE = uuid.UUID("6f1c1b8e-3f6a-4a53-9d2e-2b1f1f0c9a10")
#: consecutive rows of one prompt kept in one group across batches; a longer run is split here
MAX_GROUP_ROWS = 1024


class ImportFailed(ReflexdbError):
    """The file cannot be read at all (missing, unknown format, not JSONL/Parquet)."""

    exit_code = 2


@dataclass
class ImportStats:
    rows: int = 0
    imported: int = 0
    groups: int = 0
    already: int = 0  # rows an earlier import of the same file wrote (skipped)
    bad: list[str] = field(default_factory=list)  # "FILE:LINE: problem"


class BadRow(ValueError):
    pass


def check_file(path: Path) -> str:
    """The file's format (``jsonl`` or ``parquet``), checked before anything is written.

    Raises:
        ImportFailed: the file is missing, not a regular file, of an unknown suffix, or not Parquet.
    """
    path = Path(path)
    if not path.exists():
        raise ImportFailed(f"import: {path} does not exist")
    if not path.is_file():
        raise ImportFailed(f"import: {path} is not a file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pq.ParquetFile(str(path))
        except Exception as exc:  # pyarrow raises ArrowInvalid and friends
            raise ImportFailed(f"import: {path} is not a Parquet file ({exc})") from None
        return "parquet"
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    raise ImportFailed(f"import: cannot tell the format of {path} from its suffix {suffix or '(none)'!r}; "
                       "use .jsonl or .parquet (see docs/export.md for the rows)")


def read_rows(path: Path, batch_size: int) -> Iterator[list[tuple[int, Any]]]:
    """Batches of ``(line, row)`` from a JSONL (line = the file's line) or Parquet file (line = row
    number from 1), read a batch at a time. A JSONL line that is not UTF-8 or not JSON is a
    :class:`BadRow` in its place."""
    if check_file(path) == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(str(path))
        line = 0
        for batch in pf.iter_batches(batch_size=batch_size):
            rows = batch.to_pylist()
            yield [(line + i + 1, r) for i, r in enumerate(rows)]
            line += len(rows)
        return
    out: list[tuple[int, Any]] = []
    with open(path, "rb") as f:
        for no, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                out.append((no, BadRow(f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")))
            else:
                if not text.strip():
                    continue
                try:
                    out.append((no, json.loads(text)))
                except json.JSONDecodeError as exc:
                    out.append((no, BadRow(f"not JSON ({exc.msg} at column {exc.colno})")))
                except (ValueError, RecursionError) as exc:  # an integer of 5000 digits, [[[[...]]]] 10^5 deep
                    out.append((no, BadRow(f"not JSON this importer reads ({type(exc).__name__}: {exc})"[:300])))
            if len(out) >= batch_size:
                yield out
                out = []
    if out:
        yield out


def _messages(value: Any, what: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise BadRow(f"{what} must be a non-empty list of messages")
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRow(f"{what}: every message needs a string 'role' and 'content'")
        if m["role"] not in ROLES:
            raise BadRow(f"{what}: role {m['role'][:40]!r} is not one of {', '.join(ROLES)}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


#: The longest task_key (bytes): the store's unique index on tasks holds keys of up to ~2.7 kB.
MAX_KEY_BYTES = 1024
#: The longest prompt message or completion a row may hold (about a million tokens): the tokenizer,
#: a third-party parser, reads every imported text, at 1-5 s a megabyte here.
MAX_TEXT_CHARS = 4_000_000


def _storable(text: str, what: str) -> None:
    """PostgreSQL text holds no NUL and no lone surrogate (BadRow naming ``what`` otherwise)."""
    if "\x00" in text:
        raise BadRow(f"{what} contains a NUL character, which PostgreSQL text cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRow(f"{what} contains a lone surrogate (\\u{ord(text[exc.start]):04x}), which is not UTF-8") from None


def _ids(value: Any, what: str, vocab: int | None) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise BadRow(f"{what} must be a list of integers")
    if vocab is not None and any(not 0 <= x < vocab for x in value):
        raise BadRow(f"{what} holds an id outside the tokenizer's vocabulary (0..{vocab - 1})")
    return value


@dataclass(frozen=True)
class Parsed:
    prompt_messages: list[dict]
    completion: str
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    reward: float | None
    correct: bool | None
    ground_truth: str | None
    task_key: str | None

    @property
    def prompt_text(self) -> str:
        return "\n\n".join(m["content"] for m in self.prompt_messages)


def parse_row(row: Any, *, vocab: int | None = None) -> Parsed:
    """One row as a trajectory's parts; raise :class:`BadRow` naming the problem."""
    if isinstance(row, BadRow):
        raise row
    if not isinstance(row, dict):
        raise BadRow("a row must be an object")
    if row.get("messages") is not None and row.get("prompt") is None:
        msgs = _messages(row["messages"], "messages")
        if msgs[-1]["role"] != "assistant" or len(msgs) < 2:
            raise BadRow("messages must end with the assistant's message, after at least one other")
        prompt, completion = msgs[:-1], msgs[-1]["content"]
    else:
        p, c = row.get("prompt"), row.get("completion")
        if p is None or c is None:
            raise BadRow("needs 'prompt' and 'completion' (or 'messages')")
        prompt = [{"role": "user", "content": p}] if isinstance(p, str) else _messages(p, "prompt")
        if isinstance(c, list):
            cm = _messages(c, "completion")
            if len(cm) != 1 or cm[0]["role"] != "assistant":
                raise BadRow("completion as messages must hold exactly one assistant message")
            c = cm[0]["content"]
        if not isinstance(c, str):
            raise BadRow("completion must be a string")
        completion = c
    for text in [completion] + [m["content"] for m in prompt]:
        if len(text) > MAX_TEXT_CHARS:  # before the tokenizer sees it (issue 50)
            raise BadRow(f"a text of the row is {len(text):,} characters; at most {MAX_TEXT_CHARS:,}")
        _storable(text, "the text")
    pi, ci = row.get("prompt_ids"), row.get("completion_ids")
    if (pi is None) != (ci is None):
        raise BadRow("give both prompt_ids and completion_ids, or neither")
    if pi is not None:
        pi, ci = _ids(pi, "prompt_ids", vocab), _ids(ci, "completion_ids", vocab)
    reward = _reward(row.get("reward"))
    correct = row.get("correct")
    if correct is not None and not isinstance(correct, bool):
        raise BadRow(f"correct must be true, false or null, got {_brief(correct)}")
    if correct is None and reward is not None:
        correct = reward >= 1.0
    gt, key = row.get("ground_truth"), row.get("task_key")
    gt, key = None if gt is None else str(gt), None if key is None else str(key)
    for value, what in ((gt, "ground_truth"), (key, "task_key")):
        if value is not None:
            _storable(value, what)
    if key is not None and len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise BadRow(f"task_key is {len(key.encode('utf-8'))} bytes; at most {MAX_KEY_BYTES}")
    return Parsed(prompt, completion, pi, ci, reward, correct, gt, key)


def _reward(value: Any) -> float | None:
    """A row's reward as a float; BadRow unless a finite number or null (an integer too large for
    a float, which JSON allows, is not finite)."""
    if value is None:
        return None
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            reward = float(value)
        except OverflowError:
            reward = math.inf
        if math.isfinite(reward):
            return reward
    raise BadRow(f"reward must be a finite number or null, got {_brief(value)}")


def _brief(value: Any) -> str:
    """A bad value as a message names it: a string's first 40 characters, a number, or a list or
    an object by its type (a row's value may be a megabyte, or nested 900 deep)."""
    if isinstance(value, str):
        return repr(value[:40]) + ("…" if len(value) > 40 else "")
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)[:40]
    return f"a {type(value).__name__}"


class Tokenizer:
    """The run's tokenizer and chat template, as the collector renders prompts."""

    def __init__(self, model_dir):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.vocab = len(self.tok)
        self.end = self.tok.eos_token_id

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def completion_ids(self, text: str) -> list[int]:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return ids + ([self.end] if self.end is not None else [])


def import_file(store, run_id: int, path: Path, tokenizer: Tokenizer, *, dataset: str | None = None,
                batch_size: int = 500, on_batch: Callable[[ImportStats], None] | None = None) -> ImportStats:
    """Import ``path`` into run ``run_id``; see the module docstring. Returns the counts and the
    bad rows (``FILE:LINE: problem``)."""
    path = Path(path)
    dataset = dataset or path.stem
    stats = ImportStats()
    carried: list[tuple[int, Parsed]] = []  # the rows of the last prompt of the batch before

    def write(rows: list[tuple[int, Parsed]]) -> None:
        groups = _groups(store, run_id, rows, tokenizer, dataset, path.name)
        # Groups an earlier import of this file wrote (same content, same write_key) are skipped,
        # however the batches fell then (another --batch-size).
        done = store.written_keys([g.write_key for g in groups])
        stats.already += sum(len(g.trajectories) for g in groups if g.write_key in done)
        groups = [g for g in groups if g.write_key not in done]
        if groups:
            store.write_groups(groups)
        stats.imported += sum(len(g.trajectories) for g in groups)
        stats.groups += len(groups)

    for batch in read_rows(path, batch_size):
        good = carried
        for line, row in batch:
            stats.rows += 1
            try:
                good.append((line, parse_row(row, vocab=tokenizer.vocab)))
            except BadRow as exc:
                stats.bad.append(f"{path}:{line}: {exc}")
        tail = len(good)  # where the run of rows of the last prompt starts
        while tail > 0 and _key(good[tail - 1][1]) == _key(good[-1][1]):
            tail -= 1
        if tail > 0:  # carry the last prompt's rows into the next batch
            good, carried = good[:tail], good[tail:]
        elif len(good) <= MAX_GROUP_ROWS:  # one prompt only: keep collecting (the group does not depend
            good, carried = [], good     # on the batch size, nor does its write key)
        else:  # one prompt with more rows than a group may hold: its group is split here
            carried = []
        if good:
            write(good)
        if on_batch:
            on_batch(stats)
    if carried:
        write(carried)
        if on_batch:
            on_batch(stats)
    return stats


def _key(p: Parsed) -> tuple:
    return (p.task_key, p.prompt_text)


def _groups(store, run_id: int, rows: list[tuple[int, Parsed]], tok: Tokenizer, dataset: str,
            source: str) -> list[GroupIn]:
    by_prompt: dict[tuple, list[tuple[int, Parsed]]] = {}
    for line, p in rows:
        by_prompt.setdefault(_key(p), []).append((line, p))
    keys = list(by_prompt)
    task_ids = store.add_tasks(run_id, [TaskIn(prompt=text, ground_truth=by_prompt[(k, text)][0][1].ground_truth,
                                               dataset=dataset, task_key=k) for k, text in keys])
    groups = []
    for (key, text), task_id in zip(keys, task_ids):
        members = by_prompt[(key, text)]
        trajs = []
        for line, p in members:
            pi = p.prompt_ids if p.prompt_ids is not None else tok.prompt_ids(p.prompt_messages)
            ci = p.completion_ids if p.completion_ids is not None else tok.completion_ids(p.completion)
            turns = [TurnIn(m["role"], m["content"]) for m in p.prompt_messages]
            turns.append(TurnIn("assistant", p.completion, 0, len(ci)))
            trajs.append(TrajectoryIn(prompt_ids=pi, response_ids=ci, logprobs=None, reward=p.reward,
                                      correct=p.correct, turns=turns, origin="imported",
                                      meta={"imported_from": source, "line": line}))
        digest = hashlib.sha256(json.dumps([run_id, dataset, [(ln, p.__dict__) for ln, p in members]],
                                           sort_keys=True, default=str).encode()).hexdigest()
        groups.append(GroupIn(run_id=run_id, task_id=task_id, policy_version=0, trajectories=trajs,
                              workflow="import", kind="imported", write_key=uuid.uuid5(_NAMESPACE, digest),
                              meta={"source": source}))
    return groups


__all__ = ["ImportFailed", "ImportStats", "Tokenizer", "check_file", "import_file", "parse_row", "read_rows"]
