"""Two pages of one episode or two (docs/explorer.md): two trajectories side by side, turn by turn
(``/trajectories/<a>/vs/<b>``, and ``/diff?a=&b=`` for the group page's form), and the trace of an
episode (``/trajectories/<id>/trace``): its turns and tool calls as spans with their durations.

What is read is bounded whatever a row holds: each side's first :data:`MAX_TURNS` turns, at most
:data:`PAGE_CHARS` characters of their text in all (a single turn up to :data:`TURN_CHARS`), and the
diff of each pair is bounded as explorer/diff.py says. The trace reads :data:`MAX_SPANS` turns'
first characters and counts the rest in SQL.

Durations are what the store holds: each tool call's sandbox record (``turns.tool_call``: ``wall_s``,
``cpu_s``, collector/sandbox.py ``ToolResult.record``), and for a generation the engine call that
sampled it (``meta.generations``: ``attempt``, ``tokens``, ``wall_s``, ``rows``; collector/engines
``EngineCall``). The engine samples a turn of every episode of a batch in one call, so a
generation's time is its call's, shared with the call's other rows: the page says how many. A
generation with no record that matches its attempt and token count (rows written before the
collector recorded calls, imported rows, rows a workflow rebuilt) is an untimed span with its
token count rather than an invented duration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .data import BadFilter, Explorer, fits, int_type
from .diff import SHOW_CHARS, Budget, TextDiff, align, diff_text, one_side

#: Turns of each side compared; the page says how many more there are.
MAX_TURNS = 200
#: Characters of turn text read for each side of a comparison, all turns together ...
PAGE_CHARS = 4 * 1024 * 1024
#: ... and of one turn at most (a megabyte turn is compared whole).
TURN_CHARS = 2 * 1024 * 1024
#: Characters shown of each side, all pairs together (each pair shows at least 2,000).
SHOW_PAGE = 1_000_000
#: Turns drawn as spans on the trace; the page counts the rest and their tool time.
MAX_SPANS = 200
#: Characters of each turn's text the trace shows as its label.
PREVIEW_CHARS = 160
#: Characters of an answer or an error shown in the facts table.
FACT_CHARS = 2_000
#: A trajectory id is a bigint: a larger number names nothing.
MAX_ID = int_type("trajectories.id")[2]

#: The facts compared side by side: label, column.
FACTS = (("origin", "origin"), ("policy version", "policy_version"), ("reward", "reward"), ("correct", "correct"),
         ("answer", "extracted_answer"), ("ground truth", "ground_truth"), ("finish", "finish_reason"),
         ("confidence", "confidence"), ("response tokens", "response_length"), ("turns", "num_turns"),
         ("error", "error"), ("parent", "parent_trajectory_id"), ("group", "group_id"), ("task", "task_id"),
         ("run", "run"), ("written", "created_at"))


def routes(db: Explorer, render: Callable[..., Response]) -> list[Route]:
    """The pages' routes; ``render(request, template, status=200, **context)`` is the app's."""

    def side_by_side(request: Request) -> Response:
        a, b = _id(request.path_params["a"]), _id(request.path_params["b"])
        if a == b:
            raise HTTPException(400, f"trajectory {a} compared with itself: choose two different trajectories")
        page = compare(db, a, b)
        return render(request, "side.html", title=f"trajectory {a} vs {b}", **page)

    def pick(request: Request) -> Response:
        """The group page's form: ``/diff?a=<id>&b=<id>`` -> the side-by-side page."""
        ids = []
        for key in ("a", "b"):
            value = (request.query_params.get(key) or "").strip()
            if not value:
                raise BadFilter(f"{key!r}: choose a trajectory for each side (?a=<id>&b=<id>)")
            if not value.isascii() or not value.isdigit() or len(value) > 30 or not fits(int(value), "trajectories.id"):
                raise BadFilter(f"{key!r}: {value[:80]!r} is not a trajectory id (a whole number, at most {MAX_ID})")
            ids.append(int(value))
        return RedirectResponse(f"/trajectories/{ids[0]}/vs/{ids[1]}", 303)

    def trace_page(request: Request) -> Response:
        tid = _id(request.path_params["id"])
        page = trace(db, tid)
        return render(request, "trace.html", title=f"trace of trajectory {tid}", **page)

    # {x:digits}: explorer/app.py's (a whole number of at most 1,000 digits)
    return [Route("/trajectories/{a:digits}/vs/{b:digits}", side_by_side), Route("/diff", pick),
            Route("/trajectories/{id:digits}/trace", trace_page)]


def _id(value: int) -> int:
    """A trajectory id from the path: past a bigint it names no row (404 before any SQL)."""
    if value > MAX_ID:
        raise HTTPException(404, f"no trajectory {str(value)[:40]}: trajectories.id (bigint) holds at most {MAX_ID}")
    return value


def _trajectory(db: Explorer, tid: int) -> dict[str, Any]:
    t = db.one(db.q["trajectory"], {"id": tid})
    if t is None:
        raise HTTPException(404, f"no trajectory {tid}")
    t["totals"] = db.one(db.q["turn_totals"], {"id": tid, "run_id": t["run_id"]})
    return t


# ---------------------------------------------------------------------------- side by side


def compare(db: Explorer, a_id: int, b_id: int) -> dict[str, Any]:
    """The side-by-side page's context: both rows' facts, how they are related, the turn pairs."""
    a, b = _trajectory(db, a_id), _trajectory(db, b_id)
    for t in (a, b):
        key = {"id": t["id"], "run_id": t["run_id"], "limit": MAX_TURNS}
        lengths = [u["chars"] for u in db.named("episode_turns", chars=0, **key)]
        t["chars_read"] = read_cap(lengths, PAGE_CHARS, TURN_CHARS)
        t["turns"] = db.named("episode_turns", chars=t["chars_read"], **key)
    pairs = align([(u["role"], u["text"]) for u in a["turns"]], [(u["role"], u["text"]) for u in b["turns"]])
    show = max(2_000, min(SHOW_CHARS, SHOW_PAGE // max(1, len(pairs))))
    budget = Budget()
    rows = []
    for i, j in pairs:
        u = None if i is None else a["turns"][i]
        v = None if j is None else b["turns"][j]
        if u is not None and v is not None:
            d = diff_text(u["text"], v["text"], budget=budget, show=show)
        elif u is not None:
            d = one_side(u["text"], show)
        else:
            d = _mirror(one_side(v["text"], show))
        rows.append({"a": u, "b": v, "diff": d, "cut": [_cut(u), _cut(v)]})
    facts = [{"label": label, "a": _fact(a.get(key)), "b": _fact(b.get(key)), "differs": a.get(key) != b.get(key)}
             for label, key in FACTS]
    return {"a": a, "b": b, "rows": rows, "facts": facts, "relation": _relation(a, b),
            "hows": sorted({r["diff"].how for r in rows} - {"same", "only"}),
            "more": [max(0, t["totals"]["turns"] - len(t["turns"])) for t in (a, b)]}


def read_cap(lengths: list[int], budget: int, most: int) -> int:
    """The most characters to read of each turn so that all of them together read at most
    ``budget`` (and none more than ``most``): short turns are read whole, and what they leave is
    shared among the long ones, so one megabyte turn among short ones is read whole."""
    left = budget
    for k, n in enumerate(sorted(lengths)):
        share = left // (len(lengths) - k)
        if n > share:
            return min(most, share)
        left -= n
    return most


def _mirror(d: TextDiff) -> TextDiff:
    return TextDiff(d.right, d.left, d.how, d.ratio, d.right_more, d.left_more)


def _cut(u: dict[str, Any] | None) -> int:
    """Characters of a turn past what was read (not compared)."""
    return 0 if u is None else max(0, u["chars"] - len(u["text"]))


def _fact(value: Any) -> Any:
    if isinstance(value, str) and len(value) > FACT_CHARS:
        return f"{value[:FACT_CHARS]}… ({len(value) - FACT_CHARS:,} more characters)"
    return value


def _relation(a: dict[str, Any], b: dict[str, Any]) -> str:
    """How the two rows are related, in words."""
    if b["parent_trajectory_id"] == a["id"]:
        return f"trajectory {b['id']} ({b['origin']}) was made from trajectory {a['id']} ({a['origin']}): its child"
    if a["parent_trajectory_id"] == b["id"]:
        return f"trajectory {a['id']} ({a['origin']}) was made from trajectory {b['id']} ({b['origin']}): its child"
    if a["run_id"] != b["run_id"]:
        return f"rows of two runs ({a['run']} and {b['run']}): tasks and policy versions are each run's own"
    if a["group_id"] == b["group_id"]:
        return f"two rows of group {a['group_id']}"
    if a["task_id"] == b["task_id"]:
        return f"two rows of task {a['task_id']}, in groups {a['group_id']} and {b['group_id']}"
    return f"rows of two tasks ({a['task_id']} and {b['task_id']}) of run {a['run']}"


# ---------------------------------------------------------------------------- trace


def seconds(value: Any) -> float | None:
    """A duration from a stored record: a finite, non-negative number of seconds, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def duration(value: float | None) -> str:
    """``41.2 ms``, ``1.23 s``, ``2 min 3 s``; a dash when not measured."""
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.3g} ms"
    if value < 120:
        return f"{value:.3g} s"
    return f"{int(value // 60)} min {value % 60:.0f} s"


def trace(db: Explorer, tid: int) -> dict[str, Any]:
    """The trace page's context: the episode's spans (turns, tool calls nested under the
    generation that made them) placed on the time axis of the measured tool time."""
    t = _trajectory(db, tid)
    totals = t["totals"]
    turns = db.named("episode_turns", id=tid, run_id=t["run_id"], chars=PREVIEW_CHARS, limit=MAX_SPANS)
    calls, generation_s = _generation_calls(t["meta"])
    tool_s = seconds(totals["wall_s"]) or 0.0
    total = tool_s + generation_s
    spans: list[dict[str, Any]] = []
    at, shown_wall, generation = 0.0, 0.0, None
    for u in turns:
        record = u["tool_call"] if isinstance(u["tool_call"], dict) else None
        wall = seconds(record.get("wall_s")) if record else None
        cpu = seconds(record.get("cpu_s")) if record else None
        call = None
        if u["token_start"] is None:
            kind, depth = "prompt", 1
        elif u["role"] == "assistant":
            kind, depth = "generation", 1
            call = calls.get((u["attempt"], _tokens(u)))
            record, wall = None, None if call is None else call["wall_s"]
        elif record is not None:
            kind, depth = "tool", 2 if generation is not None else 1
        else:
            kind, depth = "environment", 1
        span = {"turn": u, "kind": kind, "depth": depth, "wall": wall, "cpu": cpu, "record": record,
                "label": _preview(u["text"], u["chars"]), "tokens": _tokens(u), "under": None,
                "status": None if record is None else record.get("status"), "call": call,
                "left": None, "width": None, "cpu_width": None, "mark": None}
        if kind == "generation":
            generation = span
        elif kind == "tool" and generation is not None:
            span["under"] = generation["turn"]["turn_index"]
        if total > 0:
            position = min(100.0, 100 * at / total)
            if wall is not None:
                span["left"] = position
                span["width"] = max(0.25, min(100.0 - position, 100 * wall / total))
                span["cpu_width"] = None if cpu is None or wall == 0 else min(100.0, 100 * cpu / wall)
            elif kind != "prompt":
                span["mark"] = position
        if wall is not None:
            at += wall
            shown_wall += wall
        span["wall_text"], span["cpu_text"] = duration(wall), duration(cpu)
        spans.append(span)
    more = max(0, totals["turns"] - len(turns))
    listed = _listed_calls(t["meta"])
    axis = [(f"{100 * k / 4:g}", duration(total * k / 4)) for k in range(5)] if total > 0 else []
    return {"t": t, "spans": spans, "axis": axis, "totals": totals, "total": duration(total) if total else None, "more": more,
            "tool_total": duration(tool_s) if tool_s else None,
            "generation_total": duration(generation_s) if calls else None, "timed_calls": len(calls),
            "more_wall": duration(max(0.0, total - shown_wall)) if more else None, "listed": listed,
            "listed_seconds": duration(listed["seconds"]) if listed else None,
            "cpu_total": duration(seconds(totals["cpu_s"])),
            "generations": sum(s["kind"] == "generation" for s in spans)}


def _preview(text: str, chars: int) -> str:
    """The turn's first characters on one line (its blanks collapsed), marked when there are more."""
    line = " ".join(text.split())
    return line[:PREVIEW_CHARS] + ("…" if chars > len(text) or len(line) > PREVIEW_CHARS else "")


def _tokens(u: dict[str, Any]) -> int | None:
    if u["token_start"] is None or u["token_end"] is None:
        return None
    return u["token_end"] - u["token_start"]


#: Engine-call records read from a trajectory's ``meta.generations`` (a longer list is cut here).
MAX_CALLS = 100_000


def _generation_calls(meta: Any) -> tuple[dict[tuple[Any, int], dict[str, Any]], float]:
    """The episode's timed generations (``meta.generations``), by (attempt, tokens): what a generation
    span is matched on; and their seconds in all. A record that is not a dict with an integer or
    null ``attempt``, an integer ``tokens`` and ``rows`` and a duration is skipped, as is a key
    that two records share (which of them timed the turn is unknown)."""
    records = meta.get("generations") if isinstance(meta, dict) else None
    if not isinstance(records, list):
        return {}, 0.0
    calls: dict[tuple[Any, int], dict[str, Any]] = {}
    shared: set[tuple[Any, int]] = set()
    for r in records[:MAX_CALLS]:
        if not isinstance(r, dict):
            continue
        attempt, tokens, rows, wall = r.get("attempt"), r.get("tokens"), r.get("rows"), seconds(r.get("wall_s"))
        if wall is None or not all(isinstance(v, int) and not isinstance(v, bool) for v in (tokens, rows)) or (
                attempt is not None and (not isinstance(attempt, int) or isinstance(attempt, bool))):
            continue
        key = (attempt, tokens)
        if key in calls:
            shared.add(key)
        calls[key] = {"wall_s": min(wall, 1e9), "rows": rows}
    for key in shared:
        del calls[key]
    return calls, sum(c["wall_s"] for c in calls.values())


def _listed_calls(meta: Any) -> dict[str, Any] | None:
    """The episode's own list of its sandbox calls (``meta.tool_calls``, tool_python), when it has one:
    how many and their seconds. It may count calls no turn holds (calls a workflow took back)."""
    calls = meta.get("tool_calls") if isinstance(meta, dict) else None
    if not isinstance(calls, list) or not calls:
        return None
    secs = [seconds(c.get("seconds")) for c in calls[:100_000] if isinstance(c, dict)]
    return {"n": len(calls), "seconds": sum(s for s in secs if s is not None)}


__all__ = ["MAX_CALLS", "MAX_SPANS", "MAX_TURNS", "compare", "duration", "read_cap", "routes", "seconds", "trace"]
