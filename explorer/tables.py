"""The explorer's grids: prompt, completion, reward, advantage and answer in one table, as W&B's
rollout tables show them, on the trajectory list, a group's page and a learner step's page.

- **Completions, bounded.** A row's completion is its assistant text (turns of role
  ``assistant``): the grid shows the first assistant turn's first line, and on expanding (a
  ``<details>``, no script) the episode's assistant turns in order, cut at
  :data:`COMPLETION_CHARS` characters with a note and a link to the trajectory's page. The text
  is read cut (block ``completions``: ``left()`` reads a slice of a long text, ``octet_length``
  its stored size), so a completion of a megabyte costs a list page what one of a line does.
- **Sorting by any column.** ``?sort=<column>&dir=asc|desc``; each sortable column maps to a
  fixed SQL expression (:data:`SORTS`), so no parameter's text reaches SQL. The list pages by
  keyset on (sort value, id), never OFFSET: the next page's link carries the last row's id
  (``after``) and sort value (``key``). NULLs come last in both directions: the rows with a value
  are read first (``expr IS NOT NULL AND (expr, t.id) > (key, after)``), then, once they run out,
  the NULLs by id, each a query of its own (two shapes an index on ``(run_id, expr, id)`` would
  serve). The group and step pages hold all their rows and sort them here, by the same names.
- **The total of a filtered list**: exact when cheap, else bounded (:func:`count`): counted up
  to :data:`COUNT_CAP` (then "10,000+"), for :data:`COUNT_BUDGET_MS` at most (then "1,234+":
  as many as it found so far; the planner's estimate of a free-text filter was off a
  thousandfold). An unfiltered list past the cap: "about 1,000,000", its table's statistics.
- **Downloads**: the filtered, sorted list as CSV or Parquet (:func:`export`), streamed by
  ``reflexdb export``'s own code (reflexdb/ops/export.py) on the explorer's read-only session;
  its CSV neutralises cells a spreadsheet would run as formulas.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import psycopg

from .data import FILTERS, BadFilter, Explorer, _where, in_range, read_int

#: the most characters of a completion (and of a prompt) a grid holds; the trajectory's page has all
COMPLETION_CHARS = 2000
#: the most assistant turns a grid's completion reads
COMPLETION_TURNS = 50
#: the most characters of the first line a grid shows before expanding
FIRST_LINE_CHARS = 160
#: the most characters of an answer a grid shows
ANSWER_CHARS = 200
#: a text column sorts by its first characters (and a page's link carries that many)
TEXT_KEY_CHARS = 200
#: a filtered list is counted up to this many rows ("10,000+" beyond)
COUNT_CAP = 10_000
#: ... and for this long at most; then the page says how many it found so far ("1,234+")
COUNT_BUDGET_MS = 200
#: rows counted by the count's cursor's first move; each next move counts twice as many, up to 4,096
COUNT_STEP = 256
#: the downloads' formats
DOWNLOADS = ("csv", "parquet")

# The two sort values that are not a trajectory's column, each in two forms of the same value: on a
# whole run, one pass over the run's records joined by hash (a few seconds at a million rows);
# with a filter, a probe per row the filters keep (milliseconds for a step's or a task's rows).
#: the advantage after the last stage that the newest step training the row gave it
_ADVANTAGE = """(SELECT c.advantages[array_upper(c.advantages, 1)]::float8 FROM consumption c
                 JOIN learner_steps s ON s.id = c.step_id
                 WHERE c.trajectory_id = t.id AND c.run_id = t.run_id ORDER BY s.step DESC LIMIT 1)"""
_ADVANTAGE_JOIN = """
LEFT JOIN (SELECT DISTINCT ON (c.trajectory_id) c.trajectory_id,
                  c.advantages[array_upper(c.advantages, 1)]::float8 AS value
           FROM consumption c JOIN learner_steps s ON s.id = c.step_id
           WHERE c.run_id = %(run_id)s AND s.run_id = %(run_id)s
           ORDER BY c.trajectory_id, s.step DESC) adv ON adv.trajectory_id = t.id"""
#: the first assistant turn's first characters
_COMPLETION = f"""(SELECT left(u.text, {TEXT_KEY_CHARS}) COLLATE "C" FROM turns u
                   WHERE u.trajectory_id = t.id AND u.run_id = t.run_id AND u.role = 'assistant'
                   ORDER BY u.turn_index LIMIT 1)"""
_COMPLETION_JOIN = f"""
LEFT JOIN (SELECT DISTINCT ON (u.trajectory_id) u.trajectory_id, left(u.text, {TEXT_KEY_CHARS}) COLLATE "C" AS value
           FROM turns u WHERE u.run_id = %(run_id)s AND u.role = 'assistant'
           ORDER BY u.trajectory_id, u.turn_index) cmp ON cmp.trajectory_id = t.id"""


@dataclass(frozen=True)
class Sort:
    """A sortable column of the trajectory list: how its value parses (``int``, ``float``,
    ``bool``, ``text``), its SQL expression (``t`` the trajectory, ``g`` its group, ``k`` its
    task), whether it may be NULL, and the join it needs besides ``g`` and ``k``. Text sorts by
    its bytes (``COLLATE "C"``: code point order, as Python's sort of the group and step pages;
    a locale's collation made a sort by prompt three times slower at a million rows) and by its
    first :data:`TEXT_KEY_CHARS` characters. An integer column names the column it is
    (``column``): a cursor's value must be one its type holds."""

    kind: str
    expr: str
    nullable: bool
    join: str = ""
    #: on an unfiltered list, the same value as (expression, join) read in one pass
    whole_run: tuple[str, str] | None = None
    #: an integer sort's column (``<table>.<column>``, reflexdb/schema.py)
    column: str = ""

    def sql(self, filtered: bool) -> tuple[str, str]:
        """(expression, join) for a list with or without filters."""
        return (self.expr, self.join) if filtered or self.whole_run is None else self.whole_run


SORTS: dict[str, Sort] = {
    "id": Sort("int", "t.id", False, column="trajectories.id"),
    "origin": Sort("text", 't.origin COLLATE "C"', False),
    "kind": Sort("text", 'g.kind COLLATE "C"', False),
    "version": Sort("int", "t.policy_version", False, column="trajectories.policy_version"),
    "prompt": Sort("text", f'left(k.prompt, {TEXT_KEY_CHARS}) COLLATE "C"', False),
    # a scan of the run's assistant turns (as the filter "response" is)
    "completion": Sort("text", _COMPLETION, True, whole_run=("cmp.value", _COMPLETION_JOIN)),
    "reward": Sort("float", "t.reward", True),
    "advantage": Sort("float", _ADVANTAGE, True, whole_run=("adv.value", _ADVANTAGE_JOIN)),
    "correct": Sort("bool", "t.correct", True),
    "answer": Sort("text", f'left(t.extracted_answer, {TEXT_KEY_CHARS}) COLLATE "C"', True),
    "confidence": Sort("float", "t.confidence", True),
    "tokens": Sort("int", "t.response_length", False, column="trajectories.response_length"),
    "turns": Sort("int", "t.num_turns", False, column="trajectories.num_turns"),
}

#: each grid's columns, in order
LIST_COLUMNS = ("id", "origin", "kind", "version", "prompt", "completion", "reward", "advantage", "correct", "answer",
                "confidence", "tokens", "turns")
GROUP_COLUMNS = ("index", "id", "origin", "version", "prompt", "completion", "reward", "advantage", "correct",
                 "answer", "confidence", "tokens", "turns", "parent")
STEP_COLUMNS = ("index", "id", "origin", "version", "staleness", "prompt", "completion", "reward", "advantage",
                "correct", "answer", "confidence", "tokens")

#: a row's value of each column the group and step pages sort by (all their rows are loaded)
_ROW_VALUE = {"index": "index_in_group", "id": "id", "group": "group_id", "origin": "origin", "kind": "kind",
              "version": "policy_version", "staleness": "staleness", "prompt": "prompt", "completion": "completion",
              "reward": "reward", "advantage": "advantage", "correct": "correct", "answer": "answer",
              "confidence": "confidence", "tokens": "response_length", "turns": "num_turns",
              "parent": "parent_trajectory_id"}

# The page's rows are chosen by a narrow query (the trajectory, and a group or task only where a
# filter or the sort reads it), then joined to what the grid shows: the joins and the cut texts
# cost 50 rows, not the run's million.
_PAGE = """
SELECT p.id, t.group_id, t.task_id, t.origin, g.kind, t.policy_version, t.reward, t.correct, t.confidence,
       t.response_length, t.num_turns, left(t.extracted_answer, %(chars)s + 1) AS answer, t.created_at, t.error,
       left(k.prompt, %(chars)s + 1) AS prompt, p.sort_key, last.step AS advantage_step, last.advantages
FROM (SELECT t.id, {expr} AS sort_key
      FROM trajectories t{join}
      WHERE t.run_id = %(run_id)s{keyset}{where}
      ORDER BY {expr} {dir}, t.id {dir} LIMIT %(limit)s) p
JOIN trajectories t ON t.id = p.id AND t.run_id = %(run_id)s
JOIN groups g ON g.id = t.group_id JOIN tasks k ON k.id = t.task_id
LEFT JOIN LATERAL (SELECT s.step, c.advantages FROM consumption c JOIN learner_steps s ON s.id = c.step_id
                   WHERE c.trajectory_id = p.id AND c.run_id = %(run_id)s ORDER BY s.step DESC LIMIT 1) last ON true
ORDER BY p.sort_key {dir}, p.id {dir}"""

_COUNT = "SELECT 1 FROM trajectories t{join} WHERE t.run_id = %(run_id)s{where}"
#: the run's rows as its partition's statistics have them (-1: never analysed), as the runs page reads them
_ESTIMATE = "SELECT c.reltuples::bigint AS n FROM pg_class c WHERE c.relname = 'trajectories_r' || %(run_id)s"

_EXPORT = """
SELECT t.id AS trajectory_id, t.group_id, t.task_id, t.index_in_group, t.origin, g.kind, g.workflow, t.policy_version,
       t.reward, t.correct, t.extracted_answer, t.confidence, t.response_length, t.num_turns, t.finish_reason,
       t.parent_trajectory_id, t.error, t.created_at, last.step AS advantage_step, last.advantages
FROM trajectories t JOIN groups g ON g.id = t.group_id JOIN tasks k ON k.id = t.task_id{join}
LEFT JOIN LATERAL (SELECT s.step, c.advantages FROM consumption c JOIN learner_steps s ON s.id = c.step_id
                   WHERE c.trajectory_id = t.id AND c.run_id = t.run_id ORDER BY s.step DESC LIMIT 1) last ON true
WHERE t.run_id = %(run_id)s{where}
ORDER BY {expr} {dir} NULLS LAST, t.id {dir}"""


@dataclass(frozen=True)
class Order:
    """A grid's order, and for the trajectory list where its page starts: after the row ``after``
    (an id) whose sort value was ``key`` (``key_null``: it had none)."""

    column: str = "id"
    desc: bool = True
    after: int | None = None
    key: Any = None
    key_null: bool = False

    @property
    def dir(self) -> str:
        return "desc" if self.desc else "asc"


def parse_order(query: dict[str, str], columns: tuple[str, ...], default: Order, *,
                paged: bool = False) -> Order:
    """The order a page's query string asks for (``sort``, ``dir``; on the list, the cursor:
    ``after`` and ``key``, or the newest-first list's ``before``).

    Raises:
        BadFilter: an unknown column or direction, a cursor that cannot be read, naming the parameter.
    """
    column = (query.get("sort") or "").strip() or default.column
    if column not in columns:
        raise BadFilter(f"'sort': {column[:80]!r} is not a column this page sorts by; "
                        f"one of {', '.join(columns)}")
    direction = (query.get("dir") or "").strip().lower()
    if direction not in ("", "asc", "desc"):
        raise BadFilter(f"'dir': {direction[:80]!r} is not asc or desc")
    desc = default.desc if not direction else direction == "desc"
    if not paged:
        return Order(column, desc)
    before, after, key = _id(query, "before"), _id(query, "after"), query.get("key")
    if before is not None:
        if (column, desc) != ("id", True) or after is not None:
            raise BadFilter("'before' pages the list newest first; a sorted list's next page is 'after' and 'key'")
        return Order(column, desc, before)
    if after is None:
        return Order(column, desc)
    if column == "id":
        return Order(column, desc, after)
    if not key:
        raise BadFilter("'after' needs 'key', the sort value of the row the page starts after")
    if key == "n":
        return Order(column, desc, after, None, True)
    if not key.startswith("v"):
        raise BadFilter(f"'key': {key[:80]!r} is not a sort value (v<value>, or n for none)")
    return Order(column, desc, after, _key(key[1:], SORTS[column]))


def _id(query: dict[str, str], name: str) -> int | None:
    """A cursor's trajectory id (``before``, ``after``), one a bigint holds."""
    return read_int(query.get(name), repr(name), "trajectories.id")


def _key(raw: str, sort: Sort) -> Any:
    """A cursor's sort value, read as its column's kind (an integer: one its column's type holds)."""
    kind = sort.kind
    try:
        if kind == "int":
            value: Any = int(raw)
        elif kind == "float":
            value = float(raw)
            if math.isnan(value):
                raise ValueError
        elif kind == "bool":
            value = {"true": True, "false": False}[raw]
        else:
            if "\x00" in raw or len(raw) > TEXT_KEY_CHARS:
                raise ValueError
            value = raw
    except (ValueError, KeyError):
        raise BadFilter(f"'key': {raw[:80]!r} is not a sort value of this column") from None
    return in_range(value, "'key'", sort.column) if kind == "int" else value


def encode_key(value: Any) -> str:
    """A sort value as a page link carries it (:func:`_key` reads it back)."""
    if value is None:
        return "n"
    if isinstance(value, bool):
        return "vtrue" if value else "vfalse"
    return "v" + (repr(value) if isinstance(value, float) else str(value))


# ---------------------------------------------------------------------------------- the list


def page(db: Explorer, run_id: int, filters: dict[str, Any], order: Order, limit: int) -> list[dict[str, Any]]:
    """The trajectory list's page: up to ``limit`` rows in ``order`` after its cursor."""
    s = SORTS[order.column]
    op = "<" if order.desc else ">"
    params = {**filters, "run_id": run_id, "chars": COMPLETION_CHARS, "after": order.after, "key": order.key,
              "limit": limit}
    where = _where(filters, FILTERS)
    expr, sort_join = s.sql(bool(filters))
    join = _joins(where + expr) + sort_join

    def run(keyset: str, n: int) -> list[dict[str, Any]]:
        sql = _PAGE.format(expr=expr, join=join, keyset=keyset, where=where, dir=order.dir.upper())
        return db.rows(sql, {**params, "limit": n})

    if order.column == "id":
        return run("" if order.after is None else f" AND t.id {op} %(after)s", limit)
    rows: list[dict[str, Any]] = []
    if not order.key_null:  # the rows with a value, after the cursor's
        keyset = f" AND {expr} IS NOT NULL" if s.nullable else ""
        if order.after is not None:
            keyset += f" AND ({expr}, t.id) {op} (%(key)s, %(after)s)"
        rows = run(keyset, limit)
    if s.nullable and len(rows) < limit:  # then the NULLs, by id
        keyset = f" AND {expr} IS NULL" + (f" AND t.id {op} %(after)s" if order.key_null else "")
        rows += run(keyset, limit - len(rows))
    return rows


def _joins(sql: str) -> str:
    """The joins a filter's or a sort's fragments need: its group (``g``), its task (``k``)."""
    return (" JOIN groups g ON g.id = t.group_id" if re.search(r"\bg\.", sql) else "") + \
        (" JOIN tasks k ON k.id = t.task_id" if re.search(r"\bk\.", sql) else "")


def next_url(path: str, query: dict[str, str], rows: list[dict[str, Any]], order: Order, page_size: int) -> str | None:
    """The next page's address (keyset: after the last row shown), or None on the last page."""
    if len(rows) <= page_size:
        return None
    last = rows[page_size - 1]
    params = {k: v for k, v in query.items() if k not in ("before", "after", "key") and v != ""}
    if (order.column, order.desc) == ("id", True):
        params["before"] = str(last["id"])
    else:
        params["after"] = str(last["id"])
        if order.column != "id":
            params["key"] = encode_key(last["sort_key"])
    return f"{path}?{urlencode(params)}"


@dataclass(frozen=True)
class Count:
    """How many rows a filtered list has: ``n`` exactly; or more than :data:`COUNT_CAP`
    (``capped``); or at least ``n``, all that were counted in :data:`COUNT_BUDGET_MS` (``partial``)."""

    n: int
    capped: bool = False
    partial: bool = False
    budget_ms: int = 0
    estimated: bool = False

    @property
    def text(self) -> str:
        if self.estimated:
            return f"about {self.n:,}"
        return f"{self.n:,}+" if self.capped or self.partial else f"{self.n:,}"

    @property
    def note(self) -> str:
        if self.estimated:
            return "the run's table statistics"
        if self.capped:
            return f"counted up to {self.n:,}"
        return f"as many as {self.budget_ms / 1000:.1f} s of counting found" if self.partial else ""


def count(db: Explorer, run_id: int, filters: dict[str, Any], at_least: int = 0) -> Count:
    """The number of rows the filters keep, counted up to :data:`COUNT_CAP`, for
    :data:`COUNT_BUDGET_MS` at most: a cursor over the filtered rows moved on by
    :data:`COUNT_STEP` rows, then twice as many each time, each move stopped when the time is
    up, so a filter that keeps few rows of a big run (its count reads all of it) says how many it
    found so far (or ``at_least``, what the page already knows, if that is more). An unfiltered
    list of more than :data:`COUNT_CAP` rows says about how many its run has, from its table's
    statistics (the runs page's number)."""
    if not filters:
        run_rows = (db.one(_ESTIMATE, {"run_id": run_id}) or {}).get("n")
        if run_rows is not None and run_rows > COUNT_CAP:
            return Count(int(run_rows), estimated=True)
    where = _where(filters, FILTERS)
    sql = _COUNT.format(join=_joins(where), where=where)
    deadline = time.monotonic() + COUNT_BUDGET_MS / 1000
    n, step = 0, COUNT_STEP
    with db.engine.connect() as conn:
        raw = conn.connection.driver_connection
        try:
            raw.execute(f"DECLARE explorer_count NO SCROLL CURSOR FOR {sql}", {**filters, "run_id": run_id})
            while n <= COUNT_CAP:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    return Count(max(n, at_least), partial=True, budget_ms=COUNT_BUDGET_MS)
                raw.execute(f"SET LOCAL statement_timeout = {left_ms}")
                step = min(step, COUNT_CAP + 1 - n)
                try:
                    moved = raw.execute(f"MOVE FORWARD {int(step)} IN explorer_count").rowcount
                except psycopg.errors.QueryCanceled:
                    return Count(max(n, at_least), partial=True, budget_ms=COUNT_BUDGET_MS)
                n += moved
                if moved < step:
                    return Count(n)
                step = min(2 * step, 4096)
            return Count(COUNT_CAP, capped=True)
        finally:
            raw.rollback()  # the cursor and SET LOCAL end with the transaction


# ---------------------------------------------------------------------------------- completions


def add_completions(db: Explorer, run_id: int, rows: list[dict[str, Any]]) -> None:
    """Give each row (with ``id``, and ``prompt`` read cut at ``COMPLETION_CHARS + 1``) what the
    grid shows of its prompt, completion and answer: ``*_first`` (the first line), the text up to
    :data:`COMPLETION_CHARS`, ``*_cut`` (there is more), ``completion_size`` (all the assistant
    text's size), ``advantage`` (after the last stage) and ``answer`` (cut at :data:`ANSWER_CHARS`)."""
    found = {c["id"]: c for c in db.named("completions", ids=[r["id"] for r in rows], run_id=run_id,
                                          chars=COMPLETION_CHARS, turns=COMPLETION_TURNS)} if rows else {}
    for r in rows:
        c = found.get(r["id"]) or {}
        text = c.get("text")
        r["completion_cut"] = text is not None and (len(text) > COMPLETION_CHARS or c["turns"] > COMPLETION_TURNS)
        r["completion"] = None if text is None else text[:COMPLETION_CHARS]
        r["completion_first"] = first_line(c.get("first_turn"))
        r["completion_size"] = _size(c.get("bytes"))
        prompt = r.get("prompt")
        r["prompt_cut"] = prompt is not None and len(prompt) > COMPLETION_CHARS
        r["prompt"] = None if prompt is None else prompt[:COMPLETION_CHARS]
        r["prompt_first"] = first_line(prompt)
        answer = r["answer"] if "answer" in r else r.get("extracted_answer")
        r["answer"] = None if answer is None else _cut(answer, ANSWER_CHARS)
        adv = r.get("advantages")
        r["advantage"] = float(adv[-1]) if adv is not None and len(adv) and adv[-1] is not None else None


def first_line(text: str | None) -> str | None:
    """The first line of ``text`` that is not blank, cut at :data:`FIRST_LINE_CHARS` (None for no text)."""
    if text is None:
        return None
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return _cut(line, FIRST_LINE_CHARS)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n].rstrip() + "…"


def _size(n: int | None) -> str | None:
    if n is None:
        return None
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:,} bytes"


def sort_rows(rows: list[dict[str, Any]], order: Order) -> list[dict[str, Any]]:
    """The rows of a group or step page in ``order``: by the column's value, ties by id in the
    same direction, NULLs last in both directions."""
    field = _ROW_VALUE[order.column]
    valued = [r for r in rows if r.get(field) is not None]
    nulls = [r for r in rows if r.get(field) is None]
    valued.sort(key=lambda r: (r[field], r["id"]), reverse=order.desc)
    nulls.sort(key=lambda r: r["id"], reverse=order.desc)
    return valued + nulls


def sort_links(path: str, query: dict[str, str], columns: tuple[str, ...], order: Order,
               sortable: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What a grid's header needs: the column sorted by, its direction, and for each sortable
    column the link that sorts by it (ascending first; the current column's link turns it round)."""
    base = {k: v for k, v in query.items() if k not in ("sort", "dir", "before", "after", "key") and v != ""}
    links = {}
    for c in columns:
        if sortable is not None and c not in sortable:
            continue
        d = ("asc" if order.desc else "desc") if c == order.column else "asc"
        links[c] = f"{path}?{urlencode({**base, 'sort': c, 'dir': d})}"
    return {"column": order.column, "desc": order.desc, "links": links}


# ---------------------------------------------------------------------------------- downloads


def download_query(query: dict[str, str]) -> str:
    """The page's filters and order as a download's query string (no cursor: the whole list)."""
    return urlencode({k: v for k, v in query.items() if k not in ("before", "after", "key") and v != ""})


def export(db: Explorer, run_id: int, filters: dict[str, Any], order: Order, fmt: str) -> Iterator[bytes]:
    """The filtered list in ``order`` as a file of format ``fmt`` (``csv`` or ``parquet``), in
    chunks, read by ``reflexdb export``'s code through a server-side cursor in one read-only
    transaction of the explorer's session (the reader role). Each row has the list's columns, the
    newest training step's advantages, and export's ``prompt`` and ``completion`` (the prompt
    turns' text; the response's, every turn with a token span); Parquet also the token ids and
    log-probs. The query runs before the first chunk is given (an error is still a page)."""
    from reflexdb.ops.export import Encoder, query_batches

    expr, join = SORTS[order.column].sql(bool(filters))
    sql = _EXPORT.format(join=join, where=_where(filters, FILTERS), expr=expr, dir=order.dir.upper())
    params = {**filters, "run_id": run_id}
    with db.engine.connect() as conn:
        raw = conn.connection.driver_connection
        try:
            with raw.transaction():
                try:
                    result = query_batches(raw, sql, params, batch_size=500, tokens=fmt == "parquet",
                                           json_as_text=True, cursor_name="explorer_download")
                except psycopg.errors.QueryCanceled:
                    raise BadFilter("the download's query ran too long and was stopped: narrow the filter") from None
                sink = _Chunks()
                encoder = Encoder(sink, fmt, result.schema)
                yield sink.take()
                for rows in result.rows:
                    encoder.write(rows)
                    yield sink.take()
                encoder.close()
                yield sink.take()
        finally:
            if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raw.rollback()


class _Chunks:
    """A binary file object that keeps what is written until :meth:`take` hands it on."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.written = 0

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        self.written += len(data)
        return len(data)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


__all__ = ["COMPLETION_CHARS", "COUNT_CAP", "DOWNLOADS", "GROUP_COLUMNS", "LIST_COLUMNS", "SORTS", "STEP_COLUMNS",
           "Count", "Order", "add_completions", "count", "download_query", "encode_key", "export", "first_line",
           "next_url", "page", "parse_order", "sort_links", "sort_rows"]
