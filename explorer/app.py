"""The explorer's web app: Starlette routes rendering Jinja2 templates, no JavaScript.

Pages (docs/explorer.md): runs -> a run (its learner steps) -> its trajectories or groups, each
list paged and filtered in SQL; a trajectory (the conversation with per-token shading, lineage,
what each method knows of it, the raw row); a group; a learner step (its rows, their advantages
after every stage, staleness, the loss terms); a task across policy versions (compare).

Model text is hostile input: the templates autoescape everything, and every response carries a
Content-Security-Policy that runs no script at all, so a ``<script>`` a model wrote is shown as
text and could not run even if it were not escaped.

A request is hostile input too: every integer parameter is checked against its column's type
before any SQL runs (explorer/data.py, :func:`~reflexdb.explorer.data.read_int`), a path or a
parameter holding a character PostgreSQL cannot store is refused before any page reads it, and a
page that fails all the same answers 500 with the security headers (:class:`Guard`, inside
:class:`SecurityHeaders`), logged with the request's text escaped (:func:`printable`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import time
import traceback
import zlib
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import numpy as np
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.convertors import IntegerConvertor, register_url_convertor
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from reflexdb.errors import DatabaseUnavailable

from . import side, tables
from .charts import ChartCache, RunCurves, run_charts
from .data import FILTERS, GROUP_FILTERS, PAGE, BadFilter, Explorer, int_type, parse_filters, read_int
from .tokens import (COLOUR_MAPS, MAX_SHADED, ColourMap, colour_map, masked_out, piece_marks, pieces, shown,
                     tokenizer_for, tokens)

log = logging.getLogger(__name__)
HERE = Path(__file__).parent

#: every page: no script may run, nothing is framed, content types are not guessed
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
#: the most runs whose curves a run page draws beside its own (``?with=``)
MAX_BESIDE = 4
#: the most digits a number in a path may have (``{x:digits}``): Starlette's ``int`` reads any
#: number of them, and Python refuses to read more than 4,300 (a 500); no id has more than 19
MAX_DIGITS = 1000


class Digits(IntegerConvertor):
    """``{x:digits}``: a whole number of at most :data:`MAX_DIGITS` digits (a longer one matches no
    number route, so it is a 404, not Python's "Exceeds the limit (4300 digits)")."""

    regex = f"[0-9]{{1,{MAX_DIGITS}}}"


register_url_convertor("digits", Digits())

#: a lone surrogate: no character (UTF-8 and PostgreSQL refuse it)
_SURROGATE = re.compile("[\ud800-\udfff]")
#: what :func:`printable` escapes: C0 and C1 controls, DEL, lone surrogates, the Unicode line and
#: paragraph separators, and the marks that turn text round (bidi overrides, isolates)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, limit: int = 300, *, newlines: bool = False) -> str:
    """``text`` as a log line may hold it: its first ``limit`` characters, each control character,
    lone surrogate and line separator written as an escape (``\\x00``, ``\\n``, ``\\ud800``), so
    that nothing a request carries can end a log line, start a false one or move a terminal's
    cursor (``newlines``: keep ``\\n``, for a traceback's own lines)."""
    cut = text[:limit] + (f"… ({len(text) - limit:,} more characters)" if len(text) > limit else "")

    def escape(m: re.Match[str]) -> str:
        c = m.group()
        return c if newlines and c == "\n" else ascii(c)[1:-1]

    return _UNPRINTABLE.sub(escape, cut)


def unreadable(text: str) -> str | None:
    """Why PostgreSQL could not take ``text`` (a NUL character, a lone surrogate), or None."""
    if "\x00" in text:
        return "contains a NUL character (%00), which PostgreSQL cannot store and no name or value holds"
    found = _SURROGATE.search(text)
    if found:
        return f"contains a lone surrogate ({ascii(found.group())[1:-1]}), which is no character"
    return None


def refused(scope: dict[str, Any]) -> str | None:
    """Why a request cannot be answered as asked, naming the part of it: its path, a parameter's
    name or a parameter's value holds what no name or number stored can (:func:`unreadable`)."""
    path = scope.get("path") or ""
    why = unreadable(path)
    if why:
        return f"the path {path[:200]!r}: {why}"
    for name, value in Request(scope).query_params.multi_items():
        why = unreadable(name)
        if why:
            return f"a parameter's name {name[:80]!r}: {why}"
        why = unreadable(value)
        if why:
            return f"{name[:80]!r}: {why}"
    return None


def _trace(exc: BaseException) -> str:
    """``exc``'s traceback for the log: the frames (code lines, as written), each exception's own
    text escaped (:func:`printable`: a message may quote what the request sent)."""
    chain: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and len(chain) < 5 and at not in chain:
        chain.append(at)
        at = at.__cause__ or (None if at.__suppress_context__ else at.__context__)
    parts = []
    for e in reversed(chain):
        if parts:
            parts.append("\nwhich led to:\n")
        parts.append("Traceback (most recent call last):\n")
        parts.extend(printable(line, 2000, newlines=True) for line in traceback.format_tb(e.__traceback__))
        parts.append(f"{type(e).__module__}.{type(e).__qualname__}: {printable(str(e), 2000)}")
    return "".join(parts)


def _fmt(value: Any, digits: int = 3) -> str:
    """A value as a page shows it: numbers with ``digits`` decimals (a NUMERIC from SQL, a Decimal,
    too: ``avg()`` of integers gives one with 20 of them), None as a dash, booleans as yes/no."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (Decimal, np.floating)):
        value = float(value)
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.{digits}f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _sig(value: Any, digits: int = 4) -> str:
    """A loss or a metric with ``digits`` significant digits: ``-3.2e-06``, ``0.2500``, ``41.33``
    (fixed decimals printed a GRPO step's loss as ``-0.0000``). Anything not a number as :func:`_fmt`."""
    if isinstance(value, (Decimal, np.floating)):
        value = float(value)
    if not isinstance(value, float) or not math.isfinite(value):
        return _fmt(value)
    if value == 0:
        return "0"
    text = f"{value:#.{digits}g}"
    if "e" in text:  # 3.200e-06 -> 3.2e-06: the trailing zeros say nothing beside an exponent
        mantissa, exponent = text.split("e")
        text = f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"
    return text.removesuffix(".")  # 12346. -> 12346


def _json(value: Any) -> str:
    def default(o: Any) -> Any:
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, (np.integer, np.floating)):
            return o.item()
        return str(o)

    return json.dumps(value, indent=2, default=default, ensure_ascii=False)


class MlflowLinks:
    """Links into the MLflow UI: a reflexdb run's learner run (found by its experiment, cached).

    The pages never call it: they link to ``/runs/<run>/mlflow``, which finds the run when
    clicked and redirects. Importing MLflow and opening its store took the first run page 6-8 s."""

    def __init__(self, ui_url: str | None, tracking_uri: str | None):
        self.ui_url = ui_url.rstrip("/") if ui_url else None
        self.tracking_uri = tracking_uri
        self._cache: dict[str, tuple[float, str | None]] = {}

    @property
    def enabled(self) -> bool:
        """Whether this server knows an MLflow UI and its store (``reflexdb ui`` passes both)."""
        return bool(self.ui_url and self.tracking_uri)

    def warm(self) -> None:
        """Import MLflow's client (seconds), so that the first click on a run's MLflow link is quick."""
        if not self.enabled:
            return
        try:
            from mlflow.tracking import MlflowClient  # noqa: F401
        except Exception as exc:  # the link says so when clicked
            log.debug("MLflow not warmed: %s", exc)

    def run(self, name: str) -> str | None:
        if not self.enabled:
            return None
        hit = self._cache.get(name)
        if hit and time.monotonic() - hit[0] < 60:
            return hit[1]
        link = None
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.tracking_uri)
            exp = client.get_experiment_by_name(f"reflexdb/{name}")
            if exp is not None:
                link = f"{self.ui_url}/#/experiments/{exp.experiment_id}"
                found = client.search_runs([exp.experiment_id], filter_string="tags.`reflexdb.role` = 'learner'",
                                           max_results=1, order_by=["attributes.start_time DESC"])
                if found:
                    link += f"/runs/{found[0].info.run_id}"
        except Exception as exc:  # no MLflow store here: the pages go on without the link
            log.debug("no MLflow link for run %r: %s", name, exc)
        self._cache[name] = (time.monotonic(), link)
        return link


def origin_class(origin: str) -> str:
    """The CSS class of an origin's badge: ``o-base`` for the policy's plain samples, else one of
    five colours chosen by the name's CRC-32, so any method's origins get a stable colour without
    the explorer naming them."""
    return "o-base" if origin == "base" else f"o-{zlib.crc32(str(origin).encode()) % 5 + 1}"


def create_app(db: Explorer, *, mlflow_url: str | None = None, tracking_uri: str | None = None) -> Starlette:
    import jinja2

    # autoescape everywhere: every text on a page may be a model's
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    templates = Jinja2Templates(env=env)
    env.filters["fmt"] = _fmt
    env.filters["sig"] = _sig
    env.filters["json"] = _json
    env.filters["q"] = lambda s: quote(str(s), safe="")
    env.filters["origin_class"] = origin_class
    env.globals["PAGE"] = PAGE
    env.globals["COMPLETION_CHARS"] = tables.COMPLETION_CHARS
    env.globals["COLUMNS"] = {"list": tables.LIST_COLUMNS, "group": tables.GROUP_COLUMNS, "step": tables.STEP_COLUMNS}
    mlflow = MlflowLinks(mlflow_url, tracking_uri)
    curve_cache = ChartCache()  # the run pages' charts, by the steps and evaluations they were drawn from
    env.globals["mlflow_links"] = mlflow.enabled  # each run's pages link to /runs/<run>/mlflow

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("title", "reflexdb explorer")
        context["role_note"] = None if db.role_taken else (
            "not under the read-only role (reflexdb_reader does not exist or this login may not take it: "
            "run `reflexdb db roles`); sessions are still read-only")
        resp = templates.TemplateResponse(request, name, context, status_code=status)
        return resp

    def _run(name: str) -> dict[str, Any]:
        run = db.run(name)
        if run is None:
            raise HTTPException(404, f"no run named {name[:200]!r}")
        return run

    def _path_id(request: Request, key: str, column: str, missing: str) -> int:
        """The number ``key`` of the path, compared in SQL with ``column``: one past what the
        column's type holds names no row (404 before any SQL, ``missing`` and the bound)."""
        value = request.path_params[key]
        sql, low, high = int_type(column)
        if not low <= value <= high:
            raise HTTPException(404, f"{missing} {str(value)[:40]}: {column} ({sql}) holds at most {high}")
        return value

    def _next(request: Request, rows: list[dict[str, Any]], key: str) -> str | None:
        """The next page's URL (keyset: before the last row shown), or None on the last page."""
        if len(rows) <= PAGE:
            return None
        params = {k: v for k, v in request.query_params.items() if k != "before" and v != ""}
        params["before"] = str(rows[PAGE - 1][key])
        return f"{request.url.path}?{urlencode(params)}"

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    def runs(request: Request) -> Response:
        return render(request, "runs.html", runs=db.runs())

    def run(request: Request) -> Response:
        r = _run(request.path_params["name"])
        before = read_int(request.query_params.get("before"), "'before'", "learner_steps.step")
        steps = db.steps(r["id"], before, PAGE + 1)
        return render(request, "run.html", title=f"run {r['name']}", run=r, steps=steps[:PAGE],
                      next_page=_next(request, steps, "step"), **_curves(request, r))

    def _curves(request: Request, r: dict[str, Any]) -> dict[str, Any]:
        """The run page's curves (explorer/charts.py): the run's own, and those of each run named by a
        ``with`` parameter drawn on the same charts (404 naming a run that does not exist)."""
        others: list[dict[str, Any]] = []
        names = _beside(request, r["name"])
        if len(names) > MAX_BESIDE:
            raise BadFilter(f"'with': at most {MAX_BESIDE} runs can be drawn beside run {r['name']!r}")
        for name in names:
            other = db.run(name)
            if other is None:
                raise HTTPException(404, f"no run named {name[:200]!r} to draw beside run {r['name']!r}")
            others.append(other)
        drawn = [r, *others]
        evaluations = [db.curve_evaluations(x["id"]) for x in drawn]
        # the same runs with the same steps and evaluations: the charts drawn last time (a few index
        # probes instead of reading and drawing every step again)
        key = tuple((x["id"], x["name"], db.curve_mark(x["id"]), tuple(tuple(e.values()) for e in ev))
                    for x, ev in zip(drawn, evaluations))
        charts = curve_cache.get(key)
        if charts is None:
            runs = [RunCurves(x["name"], db.curve_steps(x["id"]), ev) for x, ev in zip(drawn, evaluations)]
            charts = [{"id": c.id, "title": c.title, "svg": Markup(c.svg), "keys": c.keys, "kind": c.kind}
                      for c in run_charts(runs)]  # Markup: line_chart escaped every text it holds
            curve_cache.put(key, charts)
        return {"charts": [c for c in charts if c["kind"] == "main"],
                "metric_charts": [c for c in charts if c["kind"] == "prefix"], "beside": [x["name"] for x in others],
                "run_names": [n for n in db.run_names() if n != r["name"]]}

    def _beside(request: Request, name: str) -> list[str]:
        """The run names of the ``with`` parameters, once each, without ``name`` itself."""
        found = []
        for value in dict.fromkeys(v.strip() for v in request.query_params.getlist("with")):
            if "\x00" in value:
                raise BadFilter("'with': contains a NUL character")
            if value and value != name:
                found.append(value)
        return found

    def compare(request: Request) -> Response:
        """The runs list's compare form: ``?run=a&with=b`` -> the run page of a with b's curves beside."""
        name = (request.query_params.get("run") or "").strip()
        if not name:
            raise BadFilter("'run': choose the run whose page to open")
        if "\x00" in name:
            raise BadFilter("'run': contains a NUL character")
        _run(name)
        beside = _beside(request, name)
        for other in beside:
            if db.run(other) is None:
                raise HTTPException(404, f"no run named {other[:200]!r} to draw beside run {name!r}")
        query = urlencode([("with", v) for v in beside])
        return RedirectResponse(f"/runs/{quote(name, safe='')}" + (f"?{query}" if query else "") + "#curves", 303)

    def trajectories(request: Request) -> Response:
        """The run's trajectories as a grid (explorer/tables.py): filtered, sorted by any column,
        paged by keyset, counted, and downloadable as CSV or Parquet with the same filters."""
        r = _run(request.path_params["name"])
        query = dict(request.query_params)
        filters = parse_filters(query, FILTERS)
        order = tables.parse_order(query, tables.LIST_COLUMNS, tables.Order(), paged=True)
        t0 = time.perf_counter()
        rows = db.trajectories(r["id"], filters, None, PAGE + 1, order=order)
        ms = (time.perf_counter() - t0) * 1000
        shown = rows[:PAGE]
        tables.add_completions(db, r["id"], shown)
        # a first page with no next one holds the whole list: its count is its length
        total = tables.Count(len(rows)) if order.after is None and len(rows) <= PAGE else \
            tables.count(db, r["id"], filters, at_least=len(rows) if order.after is None else 0)
        path = f"/runs/{quote(r['name'], safe='')}/trajectories"
        return render(request, "trajectories.html", title=f"trajectories of {r['name']}", run=r, rows=shown,
                      filters=query, choices=db.choices(r), query_ms=ms, total=total, order=order,
                      sorting=tables.sort_links(path, query, tables.LIST_COLUMNS, order),
                      downloads={f: f"{path}.{f}?{tables.download_query(query)}" for f in tables.DOWNLOADS},
                      next_page=tables.next_url(path, query, rows, order, PAGE))

    def download(request: Request) -> Response:
        """The trajectory list as a file (``trajectories.csv``, ``.parquet``): its filters and order,
        every page, streamed (explorer/tables.py, export)."""
        fmt = request.path_params["fmt"]
        if fmt not in tables.DOWNLOADS:
            raise HTTPException(404, f"no download as {fmt[:40]!r}: trajectories.csv or trajectories.parquet")
        r = _run(request.path_params["name"])
        query = dict(request.query_params)
        filters = parse_filters(query, FILTERS)
        order = tables.parse_order(query, tables.LIST_COLUMNS, tables.Order())
        chunks = tables.export(db, r["id"], filters, order, fmt)
        first = next(chunks)  # the query runs here, so that its error is still a page
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", r["name"])[:100] + f"-trajectories.{fmt}"
        from reflexdb.ops.export import MEDIA_TYPES

        return StreamingResponse(itertools.chain([first], chunks), media_type=MEDIA_TYPES[fmt],
                                 headers={"Content-Disposition": f'attachment; filename="{name}"'})

    def groups(request: Request) -> Response:
        r = _run(request.path_params["name"])
        filters = parse_filters(dict(request.query_params), GROUP_FILTERS)
        before = read_int(request.query_params.get("before"), "'before'", "groups.id")
        rows = db.groups(r["id"], filters, before, PAGE + 1)
        return render(request, "groups.html", title=f"groups of {r['name']}", run=r, rows=rows[:PAGE],
                      filters=dict(request.query_params), choices=db.choices(r), next_page=_next(request, rows, "id"))

    def step(request: Request) -> Response:
        r = _run(request.path_params["name"])
        number = _path_id(request, "step", "learner_steps.step", f"run {r['name'][:200]!r} has no learner step")
        s = db.step(r["id"], number)
        if s is None:
            raise HTTPException(404, f"run {r['name']!r} has no learner step {request.path_params['step']}")
        metrics = s["metrics"] or {}
        loss_terms = {k: v for k, v in sorted(metrics.items()) if k.startswith("loss/")}
        other = {k: v for k, v in sorted(metrics.items()) if not k.startswith("loss/")}
        query = dict(request.query_params)
        columns = ("group", *tables.STEP_COLUMNS)
        order = tables.parse_order(query, columns, tables.Order("index", False))
        tables.add_completions(db, r["id"], s["rows"])
        by_group: dict[int, list[dict[str, Any]]] = {}
        for row in s["rows"]:
            by_group.setdefault(row["group_id"], []).append(row)
        stale = [row["staleness"] for row in s["rows"] if row["staleness"] is not None]
        path = f"/runs/{quote(r['name'], safe='')}/steps/{s['step']}"
        return render(request, "step.html", title=f"step {s['step']} of {r['name']}", run=r, step=s,
                      loss_terms=loss_terms, metrics=other, by_group=by_group,
                      # sorted: one grid of all the step's rows; else a grid per group
                      sorted_rows=tables.sort_rows(s["rows"], order) if query.get("sort") else None,
                      sorting=tables.sort_links(path, query, columns, order),
                      staleness={"min": min(stale, default=None), "max": max(stale, default=None),
                                 "mean": (sum(stale) / len(stale)) if stale else None})

    def mlflow_run(request: Request) -> Response:
        """The run's MLflow run, found when the link is clicked (never while a page renders)."""
        r = _run(request.path_params["name"])
        if not mlflow.enabled:
            raise HTTPException(404, "this explorer was started without MLflow to link to (`reflexdb ui` starts "
                                     "both and links them)")
        link = mlflow.run(r["name"])
        if link is None:
            raise HTTPException(404, f"no MLflow experiment 'reflexdb/{r['name']}' in the MLflow store "
                                     f"{mlflow.tracking_uri} (its learner has not started?)")
        return RedirectResponse(link, status_code=302)

    def group(request: Request) -> Response:
        g = db.group(_path_id(request, "id", "groups.id", "no group"))
        if g is None:
            raise HTTPException(404, f"no group {request.path_params['id']}")
        stages = next((s["advantage_stages"] for s in reversed(g["steps"]) if s["advantage_stages"]), None)
        query = dict(request.query_params)
        order = tables.parse_order(query, tables.GROUP_COLUMNS, tables.Order("index", False))
        for row in g["rows"]:  # a row's prompt is its task's, the group's
            row["prompt"] = g["prompt"][:tables.COMPLETION_CHARS + 1]
        tables.add_completions(db, g["run_id"], g["rows"])
        return render(request, "group.html", title=f"group {g['id']}", group=g, stages=stages,
                      rows=tables.sort_rows(g["rows"], order), newest=g["steps"][-1] if g["steps"] else None,
                      sorting=tables.sort_links(f"/groups/{g['id']}", query, tables.GROUP_COLUMNS, order))

    def trajectory(request: Request) -> Response:
        t = db.trajectory(_path_id(request, "id", "trajectories.id", "no trajectory"))
        if t is None:
            raise HTTPException(404, f"no trajectory {request.path_params['id']}")
        colour = colour_map(request.query_params.get("color"))  # the token view's colour map (explorer/tokens.py)
        step = read_int(request.query_params.get("step"), "'step'", "learner_steps.step")
        learner = db.token_signals(t["id"], t["run_id"], step) \
            if t["tokens"] else {"steps": [], "step": None, "signals": None}
        run = db.run(t["run"])
        tok = tokenizer_for((run or {}).get("config", {}).get("model")) if t["tokens"] else None
        turns = _conversation(t, tok, colour=colour, signals=learner["signals"])
        return render(request, "trajectory.html", title=f"trajectory {t['id']}", t=t, turns=turns,
                      raw=_json(_page_raw(t)), tokenizer=tok is not None, colour=colour,
                      colours=list(COLOUR_MAPS.values()), legend=colour.legend(), learner=learner)

    def raw(request: Request) -> Response:
        t = db.trajectory(_path_id(request, "id", "trajectories.id", "no trajectory"))
        if t is None:
            raise HTTPException(404, f"no trajectory {request.path_params['id']}")
        return Response(_json(_raw(t)), media_type="application/json")

    def task(request: Request) -> Response:
        r = _run(request.path_params["name"])
        k = db.task(r["id"], _path_id(request, "task", "tasks.id", f"run {r['name'][:200]!r} has no task"))
        if k is None:
            raise HTTPException(404, f"run {r['name']!r} has no task {request.path_params['task']}")
        return render(request, "task.html", title=f"task {k['id']} of {r['name']}", run=r, task=k)

    def not_a_number(what: str, key: str):
        """``/runs/<run>/steps/-1`` and the like: the number routes take digits only, so without this
        the run's own route took the whole path as a run's name ("no run named 'x/steps/-1'")."""

        def page(request: Request) -> Response:
            name, value = request.path_params["name"], request.path_params[key]
            if db.run(f"{name}/{key}s/{value}") is not None:  # a run whose name reads like that
                request.scope["path_params"] = {"name": f"{name}/{key}s/{value}"}
                return run(request)
            r = _run(name)
            try:
                if not (value.isascii() and value.isdigit()):  # digits past what {x:digits} reads: no such row
                    int(value)
            except ValueError:
                raise BadFilter(f"{value[:80]!r} is not a {what} of run {r['name']!r}: a {what} is a whole "
                                f"number, as in /runs/{quote(r['name'], safe='')}/{key}s/1") from None
            raise HTTPException(404, f"run {r['name']!r} has no {what} {value[:80]}")

        return page

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return render(request, "error.html", status=exc.status_code, title="not found" if exc.status_code == 404
                      else "error", message=exc.detail)

    async def on_bad_filter(request: Request, exc: Exception) -> Response:
        return render(request, "error.html", status=400, title="bad request", message=str(exc))

    async def on_database(request: Request, exc: Exception) -> Response:
        return render(request, "error.html", status=503, title="database unavailable", message=str(exc))

    def error_page(request: Request, status: int, message: str) -> Response:
        """The error page :class:`Guard` answers with (plain text if even that cannot be drawn)."""
        try:
            return render(request, "error.html", status=status, title="bad request" if status == 400 else "error",
                          message=message)
        except Exception as exc:
            log.error("the error page could not be drawn: %s", _trace(exc))
            return PlainTextResponse(message, status_code=status)

    routes = [
        Route("/", runs),
        Route("/health", health),
        # a run's name may hold a slash: the specific routes first, its own page last
        Route("/runs/{name:path}/trajectories", trajectories),
        Route("/runs/{name:path}/trajectories.{fmt}", download),
        Route("/runs/{name:path}/groups", groups),
        Route("/runs/{name:path}/steps/{step:digits}", step),
        Route("/runs/{name:path}/tasks/{task:digits}", task),
        Route("/runs/{name:path}/steps/{step}", not_a_number("learner step", "step")),
        Route("/runs/{name:path}/tasks/{task}", not_a_number("task", "task")),
        Route("/runs/{name:path}/mlflow", mlflow_run),
        Route("/runs/{name:path}", run),
        Route("/compare", compare),
        Route("/groups/{id:digits}", group),
        Route("/trajectories/{id:digits}", trajectory),
        Route("/trajectories/{id:digits}/raw", raw),
        *side.routes(db, render),  # /trajectories/<a>/vs/<b>, /diff, /trajectories/<id>/trace
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    # Guard inside SecurityHeaders: its 400s and 500s carry the headers too (Starlette's own handler
    # of Exception sits outside every middleware, and re-raises to the server, which logs it raw)
    app = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders), Middleware(Guard, page=error_page)],
                    exception_handlers={HTTPException: on_http, BadFilter: on_bad_filter,
                                        DatabaseUnavailable: on_database})
    app.state.db = db
    app.state.mlflow = mlflow
    return app


class SecurityHeaders:
    """ASGI middleware: :data:`SECURITY_HEADERS` on every response (pages, errors, static files)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for k, v in SECURITY_HEADERS.items():
                    headers.setdefault(k, v)
            await send(message)

        await self.app(scope, receive, with_headers)


class Guard:
    """ASGI middleware, inside :class:`SecurityHeaders` (what it answers carries the headers):

    - a request whose path, or a parameter's name or value, holds a character PostgreSQL cannot
      store (:func:`refused`) is answered 400 naming it, before any page reads it;
    - an exception out of a page is answered 500 (``page``: the app's error page), logged with the
      request's path and query and the exception's text escaped (:func:`printable`), and goes no
      further: the server would log it again, raw ("Exception in ASGI application"). A response
      already started (a download that failed midway) is cut off instead.
    """

    def __init__(self, app, *, page):
        self.app = app
        self.page = page

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        why = refused(scope)
        if why is not None:
            return await self.page(Request(scope), 400, why)(scope, receive, send)
        started = False

        async def watched(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            query = scope.get("query_string", b"").decode("latin-1")
            log.error("page %s failed: %s", printable(scope.get("path", "") + (f"?{query}" if query else "")),
                      _trace(exc))
            if started:
                return
            message = getattr(getattr(exc, "diag", None), "message_primary", None) or type(exc).__name__
            response = self.page(Request(scope), 500, f"this page failed: {message} (the server's log has the details)")
            await response(scope, receive, send)


def _raw(t: dict[str, Any]) -> dict[str, Any]:
    """The trajectory's rows as stored (token arrays as lists), for the raw view."""
    return {k: v for k, v in t.items() if k not in ("links", "panels", "marks")}


def _page_raw(t: dict[str, Any]) -> dict[str, Any]:
    """The raw rows as the page shows them: each token array's first :data:`MAX_SHADED` items and
    how many more there are (``/raw`` has them all). A million-token row's arrays, indented one
    number a line, made 60 MB of page and most of a minute."""
    raw = _raw(t)
    if raw.get("tokens"):
        raw["tokens"] = {k: _first_items(v) for k, v in raw["tokens"].items()}
    return raw


def _first_items(a: np.ndarray | None) -> Any:
    if a is None or len(a) <= MAX_SHADED:
        return a
    return a[:MAX_SHADED].tolist() + [f"… {len(a) - MAX_SHADED} more: the raw JSON file has them all"]


def _conversation(t: dict[str, Any], tok: Any, *, colour: ColourMap | None = None,
                  signals: Any = None) -> list[dict[str, Any]]:
    """The turns to show, each with its label, its tokens (assistant turns) and the marks on it;
    ``pieces``: the tokens as drawn, shaded by ``colour`` (explorer/tokens.py; default log-prob),
    with the learner ``signals`` of a step (``reflexdb.records.TokenSignals``) when given."""
    colour = colour or colour_map(None)
    marks = t["marks"]
    turn_marks: dict[int, list[dict[str, Any]]] = {}
    token_marks: dict[int, list[dict[str, Any]]] = {}
    for m in marks:
        if m.get("token") is not None:
            token_marks.setdefault(int(m["token"]), []).append(m)
        elif m.get("turn_index") is not None:
            turn_marks.setdefault(int(m["turn_index"]), []).append(m)
    placed: set[int] = set()
    out = []
    for u in t["turns"]:
        toks, unshaded, out_of_mask = [], 0, 0
        if u["token_start"] is not None and t["tokens"] is not None:
            toks = tokens(tok, t["tokens"], u["token_start"], u["token_end"], signals=signals)
            start, end = shown(t["tokens"], u["token_start"], u["token_end"])
            unshaded, out_of_mask = end - start - len(toks), masked_out(t["tokens"], start, end)
        own = turn_marks.get(u["turn_index"], [])
        label = next((m["label"] for m in own if m.get("style") == "label"), u["role"])
        here = {tk.index: token_marks[tk.index] for tk in toks if tk.index in token_marks}
        placed.update(here)
        record = u["tool_call"] if isinstance(u["tool_call"], dict) else None
        drawn = pieces(tok, toks, colour)
        out.append({**u, "label": label, "tokens": toks, "pieces": drawn, "piece_marks": piece_marks(drawn, here),
                    "token_marks": here,
                    "notes": [m for m in own if m.get("style") != "label"], "record": record,
                    "masked_out": out_of_mask, "unshaded": unshaded})
    # a mark at a token no turn shows (e.g. at the end of the response) goes on the last turn
    left = [m for i, ms in token_marks.items() if i not in placed for m in ms]
    if left and out:
        out[-1]["notes"] = out[-1]["notes"] + left
    return out


__all__ = ["Guard", "SecurityHeaders", "create_app", "printable", "refused", "unreadable"]
