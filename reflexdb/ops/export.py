"""``reflexdb export``: any view, table or query to Parquet, JSONL or CSV, streamed in bounded memory.

Rows are read through a server-side cursor in batches of ``batch_size`` inside one read-only
transaction (one consistent snapshot), and each batch is written before the next is read, so
memory holds one batch whatever the result's size.

A result with a ``trajectory_id`` column also gets each trajectory's text and tokens, under the
column names Hugging Face ``datasets`` and TRL use:

- ``prompt``, ``completion``: the prompt turns' text and the response's (every turn with a token
  span: the model's turns and, in an episode, the environment's), or with ``chat=True``
  ``messages``: every turn as ``{"role", "content"}``;
- ``prompt_ids``, ``completion_ids``: token ids, as lists;
- ``logprobs``: the behaviour log-probs of the completion tokens (NULL when not known, e.g.
  imported rows).

Column types come from PostgreSQL's (so every batch has the same Parquet schema): integers, floats,
booleans, text, timestamps and arrays map to their Arrow types; JSON and anything else is text.

CSV is for spreadsheets, so a text cell that a spreadsheet would read as a formula (one starting
with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return: OWASP's "CSV injection") is written
with a ``'`` before it (:func:`csv_cell`): model text is hostile input. Numbers, booleans and
timestamps are written as they are; arrays and JSON as JSON text; NULL as an empty cell.

The explorer's downloads (``/runs/<run>/trajectories.csv`` and ``.parquet``) run the same code
on their own read-only session: :func:`query_batches` reads, :class:`Encoder` writes to any
binary file object.
"""

from __future__ import annotations

import csv
import io
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..errors import ReflexdbError

FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".csv": "csv"}
#: each format's media type (the explorer's downloads)
MEDIA_TYPES = {"parquet": "application/vnd.apache.parquet", "jsonl": "application/x-ndjson",
               "csv": "text/csv; charset=utf-8"}
#: what a spreadsheet reads as the start of a formula: a text cell starting so gets a ' before it
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_SQL = re.compile(r"^\s*(select|with|values|table)\b", re.IGNORECASE)

# PostgreSQL type OIDs -> Arrow type names (pg_type; arrays are their element's list).
_SCALARS = {16: "bool", 20: "int64", 21: "int64", 23: "int64", 26: "int64", 700: "float64", 701: "float64",
            1700: "float64", 25: "string", 1043: "string", 1042: "string", 19: "string", 114: "json", 3802: "json",
            1184: "timestamp_tz", 1114: "timestamp", 1082: "date", 2950: "string", 1186: "string", 17: "binary"}
_ARRAYS = {1000: "bool", 1016: "int64", 1005: "int64", 1007: "int64", 1021: "float64", 1022: "float64",
           1231: "float64", 1009: "string", 1015: "string"}


class ExportError(ReflexdbError):
    """The source or the output path cannot be exported (the message says which and why)."""

    exit_code = 2


@dataclass(frozen=True)
class ExportStats:
    rows: int
    batches: int
    path: Path
    columns: list[str]


def source_query(source: str) -> str:
    """``source`` as a query: SQL as given, a view or table name as ``SELECT * FROM name``."""
    if _SQL.match(source):
        return source.strip().rstrip(";")
    if _NAME.match(source.strip()):
        return f"SELECT * FROM {source.strip()}"
    raise ExportError(f"export: {source!r} is neither a view or table name nor a query (SELECT/WITH ...)")


def output_format(path: Path, fmt: str | None = None) -> str:
    if fmt is not None:
        if fmt not in FORMATS.values():
            raise ExportError(f"export: format {fmt!r} is not one of {', '.join(FORMATS.values())}")
        return fmt
    if path.suffix.lower() not in FORMATS:
        raise ExportError(f"export: cannot tell the format of {path} from its suffix; use .parquet, .jsonl or "
                          ".csv (or --format)")
    return FORMATS[path.suffix.lower()]


def _plain(value: Any) -> Any:
    """A value as JSON/Arrow take it (numpy arrays and scalars as lists and numbers)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def _arrow_type(oid: int):
    import pyarrow as pa

    base = {"bool": pa.bool_(), "int64": pa.int64(), "float64": pa.float64(), "string": pa.string(), "binary": pa.binary(),
            "json": pa.string(), "timestamp_tz": pa.timestamp("us", tz="UTC"), "timestamp": pa.timestamp("us"),
            "date": pa.date32()}
    if oid in _SCALARS:
        return base[_SCALARS[oid]]
    if oid in _ARRAYS:
        return pa.list_(base[_ARRAYS[oid]])
    return pa.string()


def _trajectory_columns(chat: bool, tokens: bool = True):
    import pyarrow as pa

    text = [("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))] if chat else \
        [("prompt", pa.string()), ("completion", pa.string())]
    if not tokens:
        return text
    return text + [("prompt_ids", pa.list_(pa.int64())), ("completion_ids", pa.list_(pa.int64())),
                   ("logprobs", pa.list_(pa.float32()))]


def _add_trajectories(conn, rows: list[dict], chat: bool, tokens: bool = True) -> None:
    """Add each row's trajectory texts and, with ``tokens``, its token ids and log-probs (rows with
    a NULL trajectory_id get NULLs)."""
    ids = sorted({int(r["trajectory_id"]) for r in rows if r.get("trajectory_id") is not None})
    payloads, turns = {}, {}
    if ids:
        from ..store import payload_arrays

        # token_bytes, not the view token_payloads: numpy decodes the little-endian bytes at memory
        # speed, where the view would decode every element in SQL.
        if tokens:
            for tid, *raw in conn.execute(
                    "SELECT trajectory_id, prompt_ids, response_ids, logprobs FROM token_bytes "
                    "WHERE trajectory_id = ANY(%s)", (ids,), binary=True).fetchall():
                payloads[int(tid)] = tuple(_plain(a) for a in payload_arrays(raw))
        for tid, role, text, start in conn.execute(
                "SELECT trajectory_id, role, text, token_start FROM turns WHERE trajectory_id = ANY(%s) "
                "ORDER BY trajectory_id, turn_index", (ids,)).fetchall():
            turns.setdefault(int(tid), []).append((role, text, start))
    for r in rows:
        tid = r.get("trajectory_id")
        tid = None if tid is None else int(tid)
        ts = turns.get(tid, [])
        if chat:
            r["messages"] = [{"role": role, "content": text} for role, text, _ in ts] if tid in turns else None
        else:
            r["prompt"] = "\n\n".join(t for _, t, s in ts if s is None) if tid in turns else None
            r["completion"] = "".join(t for _, t, s in ts if s is not None) if tid in turns else None
        if tokens:
            r["prompt_ids"], r["completion_ids"], r["logprobs"] = payloads.get(tid, (None, None, None))


def csv_cell(value: Any) -> str:
    """``value`` as a CSV cell: NULL empty, booleans ``true``/``false``, numbers and timestamps as
    written, arrays and JSON as JSON text; text as it is, except that a text cell starting with
    one of :data:`FORMULA_START` gets a ``'`` before it, so a spreadsheet shows it instead of
    running it as a formula (``=HYPERLINK(...)`` a model wrote; an answer ``-5`` reads ``'-5``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, ensure_ascii=False, default=_json_default)
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


class Encoder:
    """Rows of one schema written as Parquet (a row group per :meth:`write`), JSONL or CSV (a
    header, then a line per row) to ``out``: a path or a binary file object (only ``write`` is
    needed, and ``tell`` for Parquet). :meth:`close` ends the file (Parquet's footer); it does not
    close ``out``."""

    def __init__(self, out: Any, fmt: str, schema):
        self.fmt, self.schema, self.out = fmt, schema, out
        if fmt == "parquet":
            import pyarrow.parquet as pq

            self.parquet = pq.ParquetWriter(out if hasattr(out, "write") else str(out), schema)
        elif fmt == "csv":
            self._csv([csv_cell(name) for name in schema.names])

    def _csv(self, *lines: list[str]) -> None:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\r\n")
        w.writerows(lines)
        self.out.write(buf.getvalue().encode("utf-8"))

    def write(self, rows: list[dict]) -> None:
        if self.fmt == "parquet":
            import pyarrow as pa

            self.parquet.write_table(pa.Table.from_pylist(rows, schema=self.schema))
        elif self.fmt == "csv":
            self._csv(*([csv_cell(r.get(name)) for name in self.schema.names] for r in rows))
        else:
            self.out.write("".join(json.dumps(r, ensure_ascii=False, default=_json_default) + "\n"
                                   for r in rows).encode("utf-8"))

    def close(self) -> None:
        if self.fmt == "parquet":
            self.parquet.close()


class _Writer:
    """An :class:`Encoder` to a file that appears complete or not at all (``.<name>.partial`` first)."""

    def __init__(self, path: Path, fmt: str, schema):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.partial")
        self.file = None if fmt == "parquet" else open(self.tmp, "wb")
        self.encoder = Encoder(self.tmp if self.file is None else self.file, fmt, schema)

    def write(self, rows: list[dict]) -> None:
        self.encoder.write(rows)

    def close(self, ok: bool) -> None:
        try:
            self.encoder.close()
        finally:
            if self.file is not None:
                self.file.close()
        if ok:
            self.tmp.replace(self.path)  # the file appears complete or not at all
        else:
            self.tmp.unlink(missing_ok=True)


@dataclass
class Batches:
    """A query's result being read: its Arrow ``schema`` and ``rows``, an iterator of batches."""

    schema: Any
    columns: list[str]
    rows: Iterator[list[dict]]


def query_batches(conn, query: str, params: dict | None = None, *, batch_size: int = 1000, chat: bool = False,
                  with_trajectories: bool = True, tokens: bool = True, json_as_text: bool = False,
                  cursor_name: str = "reflexdb_export") -> Batches:
    """Run ``query`` through a server-side cursor on ``conn`` (a psycopg connection, inside a
    transaction the caller holds open while it reads) and read its rows ``batch_size`` at a time.

    Args:
        with_trajectories: a result with a ``trajectory_id`` column gets each trajectory's texts
            (and, with ``tokens``, its token ids and log-probs) as the module docstring says.
        json_as_text: JSON columns as JSON text (Parquet's and CSV's type for them).

    Raises:
        ExportError: the query returns no rows to export (not a SELECT).
    """
    cur = conn.cursor(name=cursor_name)
    cur.execute(query, params)
    first = cur.fetchmany(batch_size)
    if cur.description is None:
        raise ExportError("export: the query returns no rows to export (not a SELECT?)")
    import pyarrow as pa

    columns = [d.name for d in cur.description]
    with_traj = with_trajectories and "trajectory_id" in columns
    fields = [(d.name, _arrow_type(d.type_code)) for d in cur.description]
    if with_traj:
        fields += [f for f in _trajectory_columns(chat, tokens) if f[0] not in columns]
    as_text = [d.name for d in cur.description if _SCALARS.get(d.type_code) == "json"] if json_as_text else []

    def rows() -> Iterator[list[dict]]:
        chunk = first
        while chunk:
            batch = [{c: _plain(v) for c, v in zip(columns, r)} for r in chunk]
            for r in batch:
                for name in as_text:
                    if r[name] is not None:
                        r[name] = json.dumps(r[name])
            if with_traj:
                _add_trajectories(conn, batch, chat, tokens)
            yield batch
            chunk = cur.fetchmany(batch_size)
        cur.close()

    return Batches(pa.schema(fields), columns, rows())


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def export(url: str | None, source: str, path: Path, *, fmt: str | None = None, batch_size: int = 1000,
           chat: bool = False, on_batch: Callable[[int], None] | None = None,
           with_trajectories: bool = True) -> ExportStats:
    """Export ``source`` (a view or table name, or a query) to ``path``; see the module docstring.

    Args:
        on_batch: called with the rows written so far after each batch (a progress display).
        with_trajectories: add each trajectory's text and tokens to a result with a
            ``trajectory_id`` column (``False``: the columns of the result only, as ``reflexdb db
            archive`` writes tables).

    Raises:
        ExportError: bad source, format or path; a query error (nothing is left at ``path``).
    """
    import psycopg

    from .admin import _engine

    path = Path(path)
    fmt = output_format(path, fmt)
    query = source_query(source)
    if batch_size < 1:
        raise ExportError(f"export: batch size must be at least 1, got {batch_size}")
    if not path.parent.is_dir():
        raise ExportError(f"export: directory {path.parent} does not exist")
    engine = _engine(url)
    writer, n, batches, ok, schema = None, 0, 0, False, None
    try:
        with engine.connect() as sa_conn:
            conn = sa_conn.connection.driver_connection
            try:
                with conn.transaction():
                    conn.execute("SET TRANSACTION READ ONLY")
                    # JSON columns become text in Parquet and CSV (their Arrow type); JSONL keeps the objects.
                    result = query_batches(conn, query, batch_size=batch_size, chat=chat,
                                           with_trajectories=with_trajectories, json_as_text=fmt != "jsonl")
                    schema = result.schema
                    writer = _Writer(path, fmt, schema)
                    for rows in result.rows:
                        writer.write(rows)
                        n += len(rows)
                        batches += 1
                        if on_batch:
                            on_batch(n)
                    ok = True
            except psycopg.Error as exc:
                msg = (exc.diag.message_primary if getattr(exc, "diag", None) else None) or str(exc)
                raise ExportError(f"export: SQL error: {msg}") from None
    finally:
        if writer is not None:
            writer.close(ok)
        engine.dispose()
    return ExportStats(n, batches, path, list(schema.names))


__all__ = ["FORMATS", "FORMULA_START", "MEDIA_TYPES", "Batches", "Encoder", "ExportError", "ExportStats", "csv_cell",
           "export", "output_format", "query_batches", "source_query"]
