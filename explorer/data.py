"""The explorer's reads: named queries run read-only, under the role that can only read.

Every query is a block of ``reflexdb/sql/explorer.sql`` or of a method package's
``sql/explorer.sql``; what a person types into a filter reaches PostgreSQL only as a parameter.
The list queries' WHERE clauses are put together here from fixed fragments (:data:`FILTERS`), one
per filter a person set, each with its own parameter; nothing else is ever pasted into SQL text.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import dict_row
from sqlalchemy import BigInteger, Integer, SmallInteger, event

from reflexdb import schema
from reflexdb.errors import ReflexdbError
from reflexdb.sqlfile import folders, load_queries, parse_queries

log = logging.getLogger(__name__)

#: the role the explorer's sessions take (``reflexdb db roles``; reflexdb/sql/roles.sql, block reader)
READER = "reflexdb_reader"
#: a page's query that runs longer is stopped, and the page says so (narrow the filter)
STATEMENT_TIMEOUT_MS = 15_000
#: rows per page of a list
PAGE = 50
#: a run's filter options are read again from this many ids below the newest read before: a row
#: committed late, under an id lower than one already read, is still found
RESEEN_IDS = 1000
#: the most learner steps a run's curves read (evenly spaced beyond it; explorer/charts.py decimates further)
CURVE_ROWS = 2000

#: The filters of the trajectory list: name -> (parse, SQL fragment). The fragment reads only its
#: own parameter; ``t`` is the trajectory, ``g`` its group, ``k`` its task. An integer filter's
#: parse is ``int:<table>.<column>``, the column it is compared with: its value must be one that
#: column's type can hold (:func:`read_int`).
FILTERS: dict[str, tuple[str, str]] = {
    "origin": ("text", "t.origin = %(origin)s"),
    "method": ("text", "(g.workflow = %(method)s OR t.origin IN (SELECT name FROM origins WHERE method = %(method)s)"
                       " OR g.kind IN (SELECT name FROM group_kinds WHERE method = %(method)s))"),
    "kind": ("text", "g.kind = %(kind)s"),
    "reward_min": ("float", "t.reward >= %(reward_min)s"),
    "reward_max": ("float", "t.reward <= %(reward_max)s"),
    "correct": ("tristate", "t.correct IS NOT DISTINCT FROM %(correct)s"),
    "version": ("int:trajectories.policy_version", "t.policy_version = %(version)s"),
    "task": ("int:trajectories.task_id", "t.task_id = %(task)s"),
    "group": ("int:trajectories.group_id", "t.group_id = %(group)s"),
    "step": ("int:learner_steps.step",
             "t.id IN (SELECT c.trajectory_id FROM consumption c JOIN learner_steps s ON s.id = c.step_id"
             " WHERE s.run_id = %(run_id)s AND s.step = %(step)s AND c.run_id = %(run_id)s)"),
    "imported_from": ("text", "t.meta ->> 'imported_from' = %(imported_from)s"),
    # free text: the prompt (a task's) or the extracted answer, one cheap test per row; the tasks
    # that match are found once, not per row
    "q": ("pattern", "(t.task_id IN (SELECT x.id FROM tasks x WHERE x.run_id = %(run_id)s AND x.prompt ILIKE %(q)s)"
                     " OR t.extracted_answer ILIKE %(q)s)"),
    # text anywhere in what the model wrote: one scan of the run's assistant turns
    "response": ("pattern", "t.id IN (SELECT u.trajectory_id FROM turns u WHERE u.run_id = %(run_id)s"
                            " AND u.role = 'assistant' AND u.text ILIKE %(response)s)"),
}
GROUP_FILTERS: dict[str, tuple[str, str]] = {
    "kind": ("text", "g.kind = %(kind)s"),
    "method": ("text", "(g.workflow = %(method)s OR g.kind IN (SELECT name FROM group_kinds WHERE method = %(method)s))"),
    "version": ("int:groups.policy_version", "g.policy_version = %(version)s"),
    "task": ("int:groups.task_id", "g.task_id = %(task)s"),
    "q": ("pattern", "k.prompt ILIKE %(q)s"),
}

_GROUPS = """
SELECT g.id, g.task_id, g.kind, g.workflow, g.policy_version, g.size, g.created_at, left(k.prompt, 100) AS prompt,
       x.mean_reward, x.n_correct, x.n,
       (SELECT array_agg(DISTINCT s.step ORDER BY s.step) FROM consumption c JOIN learner_steps s ON s.id = c.step_id
        WHERE c.group_id = g.id AND c.run_id = g.run_id) AS steps
FROM groups g JOIN tasks k ON k.id = g.task_id
CROSS JOIN LATERAL (SELECT avg(t.reward) AS mean_reward, count(*) FILTER (WHERE t.correct) AS n_correct,
                           count(*) AS n
                    FROM trajectories t WHERE t.group_id = g.id AND t.run_id = g.run_id) x
WHERE g.run_id = %(run_id)s AND (%(before)s::bigint IS NULL OR g.id < %(before)s) {where}
ORDER BY g.id DESC LIMIT %(limit)s"""


class BadFilter(ReflexdbError):
    """A filter's value cannot be read (shown on the page with the filter's name; HTTP 400)."""


@cache
def int_type(column: str) -> tuple[str, int, int]:
    """The SQL type of the integer column ``<table>.<column>`` as reflexdb/schema.py declares it
    (``smallint``, ``integer`` or ``bigint``), and the least and the greatest value it holds."""
    table, name = column.split(".")
    declared = schema.metadata.tables[table].c[name].type
    for kind, sql, bits in ((BigInteger, "bigint", 64), (SmallInteger, "smallint", 16), (Integer, "integer", 32)):
        if isinstance(declared, kind):
            return sql, -2 ** (bits - 1), 2 ** (bits - 1) - 1
    raise TypeError(f"{column} is a {declared}, not an integer column")


def fits(value: int, column: str) -> bool:
    """Whether ``value`` is one that the integer ``column`` (``<table>.<column>``) can hold."""
    _, low, high = int_type(column)
    return low <= value <= high


def in_range(value: int, name: str, column: str) -> int:
    """``value`` (of the parameter ``name``, as a page names it) if ``column`` can hold it.

    Raises:
        BadFilter: it cannot (PostgreSQL would answer "integer out of range" or, past a bigint,
            compare it as a numeric), naming the parameter, the column and its range.
    """
    if not fits(value, column):
        sql, low, high = int_type(column)
        raise BadFilter(f"{name}: {str(value)[:80]!r} is not an integer {column} can hold ({sql}: {low} to {high})")
    return value


def read_int(raw: str | None, name: str, column: str) -> int | None:
    """A page's integer parameter ``name`` (its text ``raw``; empty: None), compared in SQL with
    ``column``, checked against that column's type before any SQL runs.

    Raises:
        BadFilter: not an integer, or one the column cannot hold, naming the parameter.
    """
    text = (raw or "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:  # not digits, or more of them than Python reads (4,300)
        raise BadFilter(f"{name}: {text[:80]!r} is not an integer") from None
    return in_range(value, name, column)


def _like(text: str) -> str:
    """``text`` as a literal substring pattern for ILIKE (its own %, _ and \\ escaped)."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def parse_filters(query: dict[str, str], table: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """The filters set in ``query`` (a page's query string), parsed; empty values are unset.

    Raises:
        BadFilter: a value of the wrong type, naming the filter and the value.
    """
    out: dict[str, Any] = {}
    for name, (kind, _) in table.items():
        raw = (query.get(name) or "").strip()
        if not raw:
            continue
        if len(raw) > 1000:
            raise BadFilter(f"filter {name!r}: longer than 1000 characters")
        if kind.startswith("int:"):
            out[name] = read_int(raw, f"filter {name!r}", kind.removeprefix("int:"))
            continue
        try:
            if kind == "float":
                value: Any = float(raw)
                if not math.isfinite(value):
                    raise ValueError
            elif kind == "tristate":
                value = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False,
                         "null": None, "none": None}[raw.lower()]
            elif kind == "pattern":
                value = _like(raw)
            else:
                value = raw
        except (ValueError, KeyError):
            expected = {"float": "a number", "tristate": "true, false or null"}.get(kind, kind)
            raise BadFilter(f"filter {name!r}: {raw[:80]!r} is not {expected}") from None
        if "\x00" in str(value):
            raise BadFilter(f"filter {name!r}: contains a NUL character")
        out[name] = value
    return out


def _where(filters: dict[str, Any], table: dict[str, tuple[str, str]]) -> str:
    return "".join(f" AND {table[name][1]}" for name in table if name in filters)


def _array(data: bytes | None, dtype: str) -> np.ndarray | None:
    return None if data is None else np.frombuffer(bytes(data), dtype=dtype)


@dataclass
class Plugins:
    """The ``links``, ``panels`` and ``marks`` blocks of each method package's ``sql/explorer.sql``."""

    links: list[tuple[str, str]] = field(default_factory=list)
    panels: list[tuple[str, str]] = field(default_factory=list)
    marks: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def load(cls) -> Plugins:
        found = cls()
        for owner, folder in folders()[1:]:
            path = folder / "explorer.sql"
            if not path.is_file():
                continue
            blocks = parse_queries(path.read_text())
            unknown = set(blocks) - {"links", "panels", "marks"}
            if unknown:
                raise ReflexdbError(f"{path} ({owner}): unknown block(s) {', '.join(sorted(unknown))}; "
                                    "an explorer file has the blocks links, panels and marks")
            for name, sql in blocks.items():
                getattr(found, name).append((owner, sql))
        return found


@dataclass
class Seen:
    """What a run's rows hold, as far as the explorer has read them: the origins of its
    trajectories, its groups' kinds and workflows, and the newest trajectory and group id read."""

    origins: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)
    workflows: set[str] = field(default_factory=set)
    trajectory: int = 0
    group: int = 0


class Explorer:
    """The explorer's database: a small pool of read-only sessions under :data:`READER`."""

    def __init__(self, url: str, *, role: str | None = READER, pool_size: int = 4):
        from reflexdb.db import make_engine

        self.url = url
        self.role = role
        self.engine = make_engine(url, pool_size=pool_size)
        self.role_taken = self._check_role()

        @event.listens_for(self.engine, "connect")
        def _read_only(dbapi_conn, _record):
            with dbapi_conn.cursor() as cur:
                if self.role_taken:
                    cur.execute(f'SET ROLE "{self.role}"')
                cur.execute("SET default_transaction_read_only = on")
                cur.execute(f"SET statement_timeout = {int(STATEMENT_TIMEOUT_MS)}")
            dbapi_conn.commit()

        self.engine.dispose()  # the connection the check made had none of that: open new ones
        self.q = load_queries("explorer.sql")
        self.plugins = Plugins.load()
        self._seen: dict[int, Seen] = {}
        self._seen_lock = threading.Lock()

    def _check_role(self) -> bool:
        """Whether this login may take the read-only role (it exists, and we are a member or a superuser)."""
        if not self.role:
            return False
        with self.engine.connect() as conn:
            raw = conn.connection.driver_connection
            # a member of the role, and the role granted on this database (`reflexdb db roles` was run here)
            ok = raw.execute("SELECT pg_has_role(current_user, r.oid, 'MEMBER') "
                             "AND has_table_privilege(r.oid, 'trajectories', 'SELECT') "
                             "FROM pg_roles r WHERE r.rolname = %s", (self.role,)).fetchone()
        return bool(ok and ok[0])

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ running queries

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            raw = conn.connection.driver_connection
            try:
                with raw.cursor(row_factory=dict_row) as cur:
                    cur.execute(sql, params or {})
                    return cur.fetchall()
            except psycopg.errors.QueryCanceled:
                raw.rollback()
                raise BadFilter(f"the query ran longer than {STATEMENT_TIMEOUT_MS / 1000:.0f} s and was stopped: "
                                "narrow the filter (a version, a task, an origin)") from None
            finally:
                if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    raw.rollback()

    def one(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def named(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return self.rows(self.q[name], params)

    # ------------------------------------------------------------------ pages' data

    def runs(self) -> list[dict[str, Any]]:
        return self.named("runs")

    def run(self, name: str) -> dict[str, Any] | None:
        return self.one(self.q["run"], {"name": name})

    def choices(self, run: dict[str, Any]) -> dict[str, list[str]]:
        """What the filters of a run's lists offer: the origins and group kinds its rows have, and
        the methods that own them (and the run's algorithm, when its groups' workflow).

        Read whole once per server (a scan of the run: about 1 s at a million trajectories;
        ``reflexdb ui``'s server does it at start-up), then only the rows added since, through
        the id indexes: a few index probes a page."""
        with self._seen_lock:  # one read at a time: a page waits for the start-up's whole read
            seen = self._seen.setdefault(run["id"], Seen())
            row = self.one(self.q["run_seen"], {"run_id": run["id"],
                                                "after_trajectory": max(0, seen.trajectory - RESEEN_IDS),
                                                "after_group": max(0, seen.group - RESEEN_IDS)}) or {}
            seen.origins.update(row.get("origins") or [])
            seen.kinds.update(row.get("kinds") or [])
            seen.workflows.update(row.get("workflows") or [])
            seen.trajectory = max(seen.trajectory, row.get("last_trajectory") or 0)
            seen.group = max(seen.group, row.get("last_group") or 0)
            origins, kinds, workflows = sorted(seen.origins), sorted(seen.kinds), sorted(seen.workflows)
        methods = self.one(self.q["run_methods"], {"origins": origins, "kinds": kinds, "workflows": workflows,
                                                   "algorithm": run["algorithm"]}) or {}
        return {"origins": origins, "kinds": kinds, "methods": list(methods.get("methods") or [])}

    def steps(self, run_id: int, before: int | None, limit: int = PAGE) -> list[dict[str, Any]]:
        return self.named("steps", run_id=run_id, before=before, limit=limit)

    def curve_steps(self, run_id: int, rows: int = CURVE_ROWS) -> list[dict[str, Any]]:
        """A run's learner steps for its curves, oldest first: all of them up to ``rows``, else
        ``rows`` evenly spaced ones (block ``curve_steps``)."""
        return self.named("curve_steps", run_id=run_id, rows=rows)

    def curve_mark(self, run_id: int, rows: int = CURVE_ROWS) -> tuple[Any, ...]:
        """What a run's curves would be read from now (block ``curve_mark``): equal marks, equal curves."""
        return tuple((self.one(self.q["curve_mark"], {"run_id": run_id, "rows": rows}) or {}).values())

    def curve_evaluations(self, run_id: int) -> list[dict[str, Any]]:
        return self.named("curve_evaluations", run_id=run_id)

    def run_names(self) -> list[str]:
        return [r["name"] for r in self.named("run_names")]

    def trajectories(self, run_id: int, filters: dict[str, Any], before: int | None,
                     limit: int = PAGE, order: Any = None) -> list[dict[str, Any]]:
        """A page of the run's trajectory list: newest first before id ``before``, or in ``order``
        (an :class:`explorer.tables.Order`, sort and cursor) as the grid sorts it."""
        from .tables import Order, page

        return page(self, run_id, filters, order or Order(after=before), limit)

    def groups(self, run_id: int, filters: dict[str, Any], before: int | None,
               limit: int = PAGE) -> list[dict[str, Any]]:
        sql = _GROUPS.format(where=_where(filters, GROUP_FILTERS))
        return self.rows(sql, {**filters, "run_id": run_id, "before": before, "limit": limit})

    def trajectory(self, tid: int) -> dict[str, Any] | None:
        t = self.one(self.q["trajectory"], {"id": tid})
        if t is None:
            return None
        key = {"id": tid, "run_id": t["run_id"]}
        t["turns"] = self.named("turns", **key)
        tok = self.one(self.q["tokens"], key)
        t["tokens"] = None if tok is None else {
            "prompt_ids": _array(tok["prompt_ids"], "<i4"),
            "response_ids": _array(tok["response_ids"], "<i4"),
            "logprobs": _array(tok["logprobs"], "<f4"),
            "versions": _array(tok["token_policy_versions"], "<i4"),
            "loss_mask": _array(tok["loss_mask"], "u1"),
        }
        t["trained_in"] = self.named("trained_in", **key)
        meta = t["meta"] or {}
        imported = meta.get("imported_from")
        params = {**key, "parent": t["parent_trajectory_id"], "group_id": t["group_id"], "task_id": t["task_id"],
                  "imported_from": None if imported is None else str(imported),
                  "line": None if meta.get("line") is None else str(meta.get("line"))}
        t["links"] = [{**r, "owner": None} for r in self.rows(self.q["links"], params)] + self._plugin_rows("links", params)
        t["panels"] = self._panels(params)
        t["marks"] = self._plugin_rows("marks", params)
        return t

    def token_signals(self, tid: int, run_id: int, step: int | None = None) -> dict[str, Any]:
        """The learner steps that recorded a trajectory's per-token signals (revision 0028), and the
        signals of ``step`` (None: the newest of them) as ``reflexdb.records.TokenSignals``.

        Raises:
            BadFilter: ``step`` recorded none for this trajectory.
        """
        from reflexdb.store import signal_arrays

        key = {"id": tid, "run_id": run_id}
        steps = [r["step"] for r in self.named("signal_steps", **key)]
        if step is not None and step not in steps:
            have = ", ".join(map(str, steps)) or "none"
            raise BadFilter(f"'step': step {step} recorded no learner signals for trajectory {tid} (steps with "
                            f"signals: {have})")
        chosen = step if step is not None else (steps[-1] if steps else None)
        row = None if chosen is None else self.one(self.q["token_signals"], {**key, "step": chosen})
        signals = None if row is None else signal_arrays(
            (row["advantage"], row["log_ratio"], row["clipped"], row["entropy"]))
        return {"steps": steps, "step": chosen, "signals": signals}

    def _plugin_rows(self, block: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for owner, sql in getattr(self.plugins, block):
            for row in self.rows(sql, params):
                out.append({**row, "owner": owner})
        return out

    def _panels(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The methods' panels: rows (title, name, value, style) folded into one panel per title."""
        panels: dict[str, dict[str, Any]] = {}
        for row in self._plugin_rows("panels", params):
            if row.get("value") is None:
                continue
            p = panels.setdefault(row["title"], {"title": row["title"], "owner": row["owner"], "fields": []})
            p["fields"].append(row)
        return list(panels.values())

    def step(self, run_id: int, step: int) -> dict[str, Any] | None:
        s = self.one(self.q["step"], {"run_id": run_id, "step": step})
        if s is None:
            return None
        s["rows"] = self.named("step_rows", step_id=s["id"], run_id=run_id, learner_version=s["policy_version"])
        return s

    def group(self, gid: int) -> dict[str, Any] | None:
        g = self.one(self.q["group"], {"id": gid})
        if g is None:
            return None
        g["rows"] = self.named("group_rows", id=gid, run_id=g["run_id"])
        g["steps"] = self.named("group_steps", id=gid, run_id=g["run_id"])
        return g

    def task(self, run_id: int, task_id: int) -> dict[str, Any] | None:
        k = self.one(self.q["task"], {"id": task_id, "run_id": run_id})
        if k is None:
            return None
        k["versions"] = self.named("task_versions", id=task_id, run_id=run_id)
        if k["versions"]:
            first, last = k["versions"][0], k["versions"][-1]
            k["first"] = self.one(self.q["answer"], {"id": first["first_id"], "run_id": run_id})
            k["last"] = self.one(self.q["answer"], {"id": last["last_id"], "run_id": run_id})
        return k

    @cached_property
    def version(self) -> str:
        return str((self.one("SELECT current_setting('server_version') AS v") or {}).get("v"))


__all__ = ["FILTERS", "GROUP_FILTERS", "PAGE", "READER", "BadFilter", "Explorer", "Seen", "fits", "in_range",
           "int_type", "parse_filters", "read_int"]
