"""The explorer answers hostile requests with a 4xx naming the problem, never a 5xx (issue 60, item 4):
integers past their column's type, NUL characters and lone surrogates in a path or a parameter,
10,000-character values, ``..`` and ``/`` in path segments. A page that fails all the same
answers 500 with the security headers, and its log line holds nothing raw from the request.

The app is called in-process as an ASGI application (:func:`asgi_get`: the scope uvicorn would
hand it, so a path may hold what ``%00`` decodes to), on a small database of its own.
"""

from __future__ import annotations

import asyncio
import logging
import re
from urllib.parse import quote

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reflexdb.explorer.app import SECURITY_HEADERS, create_app
from reflexdb.explorer.data import FILTERS, GROUP_FILTERS, Explorer
from tests.conftest import _drop_database, _new_database
from tests.factories import make_group, setup_run

RUN = "R"
INT8_PAST = "99999999999999999999"  # past int8: psycopg sends it as a numeric
INT4_PAST = "1000000000000"  # an int8, past int4


def asgi_get(app, path: str, query: str | bytes = "") -> tuple[int, dict[str, str], str]:
    """GET ``path`` (decoded, as an ASGI server hands it: ``%00`` is a NUL) with ``query`` (the raw
    query string) from ``app``: (status, headers, body). An exception out of the app fails the test:
    a server would log it with whatever the request held."""
    raw_path = quote(path.encode("utf-8", "surrogatepass"), safe="/").encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": raw_path, "root_path": "",
             "query_string": query.encode() if isinstance(query, str) else query,
             "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
    sent: list[dict] = []

    async def call() -> None:
        done, asked = asyncio.Event(), False

        async def receive():
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()  # the client goes once the whole response is in
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await app(scope, receive, send)

    asyncio.run(call())
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body.decode("utf-8", "replace")


def q(**params: str) -> bytes:
    """A raw query string: each value percent-encoded (a lone surrogate as the bytes it would be)."""
    return "&".join(f"{quote(k.encode('utf-8', 'surrogatepass'), safe='')}="
                    f"{quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for k, v in params.items()).encode()


@pytest.fixture(scope="module")
def data(pg_server_url, template_db):
    """A run of 3 groups (12 rows) and 2 learner steps: every page has something to show."""
    from reflexdb import Store, roles

    name, url = _new_database(pg_server_url, template_db)
    store = Store.open(url)
    try:
        roles.apply(store.engine)
        rng = np.random.default_rng(0)
        run, tasks = setup_run(store, RUN, n_tasks=2)
        written = [store.write_group(make_group(rng, run, tasks[i % 2], size=4, version=i)) for i in range(3)]
        for step in (1, 2):
            store.record_step(run, step, step, list(written[step - 1].trajectory_ids), loss=0.5,
                              metrics={"loss/policy": 0.5})
        ids = {"task": tasks[0], "group": written[0].group_id, "trajectory": written[0].trajectory_ids[0],
               "other": written[0].trajectory_ids[1]}
    finally:
        store.close()
    yield url, ids
    _drop_database(pg_server_url, name)


@pytest.fixture(scope="module")
def db(data):
    explorer = Explorer(data[0])
    yield explorer
    explorer.close()


@pytest.fixture(scope="module")
def app(db):
    # no tokenizer: a trajectory page shows token ids (tests/store/test_explorer_tokens.py has the
    # texts); loading SmolLM2's took this module 8 s
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("reflexdb.explorer.app.tokenizer_for", lambda model: None)
        yield create_app(db)


def _says(body: str) -> str:
    """The error page's message, unescaped."""
    import html

    found = re.search(r'<p class="error" id="message">(.*?)</p>', body, re.S)
    return html.unescape(found.group(1) if found else body)


# ------------------------------------------------------------------------------ what the issue found


@pytest.mark.parametrize("path, query, says", [
    # the run page's ?before= is a learner step (int4): "integer out of range" from SQL before
    (f"/runs/{RUN}", f"before={INT4_PAST}", "'before': '1000000000000' is not an integer learner_steps.step"),
    (f"/runs/{RUN}", f"before={INT8_PAST}", "'before'"),
    # the groups page's is a group id (int8): "bigint out of range"
    (f"/runs/{RUN}/groups", f"before={INT8_PAST}", "'before': '99999999999999999999' is not an integer groups.id"),
    # every other integer parameter, against its own column
    (f"/runs/{RUN}/trajectories", f"before={INT8_PAST}", "'before'"),
    (f"/runs/{RUN}/trajectories", f"version={INT4_PAST}", "filter 'version'"),
    (f"/runs/{RUN}/trajectories", f"step={INT4_PAST}", "filter 'step'"),
    (f"/runs/{RUN}/trajectories", f"task={INT8_PAST}", "filter 'task'"),
    (f"/runs/{RUN}/trajectories", f"group={INT8_PAST}", "filter 'group'"),
    (f"/runs/{RUN}/trajectories.csv", f"version={INT4_PAST}", "filter 'version'"),
    (f"/runs/{RUN}/trajectories", "sort=turns&after=1&key=v40000",
     "'key': '40000' is not an integer trajectories.num_turns can hold (smallint: -32768 to 32767)"),
    (f"/runs/{RUN}/trajectories", f"sort=tokens&after=1&key=v{INT4_PAST}", "'key'"),
    (f"/runs/{RUN}/trajectories", f"sort=version&after={INT8_PAST}&key=v1", "'after'"),
    (f"/runs/{RUN}/groups", f"version={INT4_PAST}", "filter 'version'"),
    (f"/runs/{RUN}/groups", f"task={INT8_PAST}", "filter 'task'"),
    ("/diff", f"a={INT8_PAST}&b=1", "'a'"),
    # a NUL anywhere: the path, a parameter's value, its name
    ("/runs/a\x00b", "", "contains a NUL character"),
    ("/runs/a\x00b/groups", "", "contains a NUL character"),
    ("/trajectories/1\x00", "", "contains a NUL character"),
    ("/static/explorer.css\x00", "", "contains a NUL character"),
    (f"/runs/{RUN}", "sort=a%00b", "'sort': contains a NUL character"),
    (f"/runs/{RUN}/trajectories", "origin=%00", "'origin': contains a NUL character"),
    (f"/runs/{RUN}/trajectories", "x%00y=1", "contains a NUL character"),
    ("/compare", "run=%00", "'run': contains a NUL character"),
    # a lone surrogate (no character: PostgreSQL and UTF-8 refuse it)
    ("/runs/a\ud800b", "", "lone surrogate"),
])
def test_what_the_issue_found_is_a_400_naming_it(app, path, query, says):
    status, headers, body = asgi_get(app, path, query)
    assert status == 400, (status, _says(body)[:300])
    assert says in _says(body), _says(body)[:300]
    assert headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]


def test_an_integer_parameter_in_its_range_still_answers(app, data):
    _, ids = data
    for path, query in ((f"/runs/{RUN}", "before=2147483647"), (f"/runs/{RUN}/groups", "before=9223372036854775807"),
                        (f"/runs/{RUN}/trajectories", "version=-2147483648&task=9223372036854775807"),
                        (f"/runs/{RUN}/trajectories", "sort=turns&after=1&key=v32767"),
                        (f"/trajectories/{ids['trajectory']}", "")):
        status, _, body = asgi_get(app, path, query)
        assert status == 200, (path, query, _says(body)[:300])


@pytest.mark.parametrize("path", [f"/runs/{RUN}/steps/3000000000", f"/runs/{RUN}/tasks/{INT8_PAST}",
                                  f"/groups/{INT8_PAST}", f"/trajectories/{INT8_PAST}",
                                  f"/trajectories/{INT8_PAST}/raw", f"/trajectories/{INT8_PAST}/trace",
                                  f"/trajectories/1/vs/{INT8_PAST}", "/trajectories/" + "9" * 5000])
def test_an_id_in_the_path_past_its_column_names_nothing(app, path):
    """A number in the path past its column's type is no row: 404, found before any SQL runs."""
    status, _, body = asgi_get(app, path)
    assert status == 404, (status, _says(body)[:300])
    assert "at most" in _says(body) or len(path) > 1000  # past {x:digits}' 1,000 digits: no route


# ------------------------------------------------------------------------------ a page that fails


#: what a failing page's exception says: a NUL, a forged log line, a terminal's escape, a surrogate
FORGED = "bad \x00 byte\nERROR:fake:a line the request wrote \x1b[31m\ud800"
#: a log line holds none of these raw: C0 controls but the newline, DEL, C1 controls, lone surrogates
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def boom(*_a, **_k):
    raise RuntimeError(FORGED)


def test_a_page_that_fails_answers_500_with_the_security_headers_and_an_escaped_log(app, db, monkeypatch, caplog):
    monkeypatch.setattr(db, "runs", boom)
    with caplog.at_level(logging.ERROR, logger="reflexdb.explorer"):
        status, headers, body = asgi_get(app, "/", "x=\x1b%0Afake")  # the app itself must not raise
    assert status == 500 and "this page failed" in _says(body)
    for name in ("Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy"):
        assert headers[name.lower()] == SECURITY_HEADERS[name], name
    [record] = [r for r in caplog.records if r.name.startswith("reflexdb.explorer")]
    text = logging.Formatter("%(levelname)s:%(name)s:%(message)s").format(record)
    assert "RuntimeError" in text and "boom" in text  # the traceback is there ...
    assert not RAW.search(text), text  # ... nothing raw in it
    assert not any(line.startswith("ERROR:fake") for line in text.splitlines()), text


def test_the_servers_log_holds_nothing_raw_from_a_request(db, monkeypatch):
    """Through uvicorn as ``python -m reflexdb.explorer.serve`` sets it up (explorer/serve.py): a
    page that fails is logged once, by the explorer, escaped (uvicorn's "Exception in ASGI
    application" printed the exception's text raw), and uvicorn's own records are escaped too."""
    import io
    import socket
    import threading
    import time

    import uvicorn

    from reflexdb.explorer import serve

    monkeypatch.setattr(db, "runs", boom)
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = serve.log_to(stream)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(create_app(db), host="127.0.0.1", port=port, **serve.UVICORN))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the explorer did not start"
            time.sleep(0.02)
        answers = []
        for target in (b"/", b"/?x=\x1b[2J\x85", b"/runs/a%00b%1b[2J", b"/runs/R?before=99999999999999999999"):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
                c.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answers.append(c.makefile("rb").readline())
        server.should_exit = True
        thread.join(10)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert answers[0].startswith(b"HTTP/1.1 500") and answers[2].startswith(b"HTTP/1.1 400"), answers
    assert answers[3].startswith(b"HTTP/1.1 400"), answers
    text = stream.getvalue()
    assert text.count("ERROR:reflexdb.explorer.app:page / failed") >= 1, text
    assert "Exception in ASGI application" not in text, text
    assert not RAW.search(text), text
    # every line is a record's first (its level first) or indented under one
    assert all(line.startswith(("ERROR:", "WARNING:", "CRITICAL:", " ")) for line in text.splitlines()), text


# ------------------------------------------------------------------------------ every route, every parameter

#: What a hostile request puts in a parameter or a path segment.
HOSTILE = st.one_of(
    st.sampled_from(["", "0", "-1", "1", "2", str(2**15), str(2**31 - 1), str(2**31), str(-2**31 - 1), str(2**63 - 1),
                     str(2**63), str(-2**63 - 1), INT8_PAST, "9" * 10_000, "x" * 10_000, "\x00", "a\x00b", "%00",
                     "\ud800", "x\udfff", "..", "../..", "/", "a/b", "/..", "%2F", "nan", "inf", "-0", " 1 ", "1e3",
                     "v1", "v" + "9" * 30, f"v{2**40}", "vtrue", "vnan", "n", "asc", "desc", "csv", "parquet",
                     "reward", "turns", "version", "id", RUN, "true", "null", "entropy", "\x1b[31m", "a\nb"]),
    st.integers(min_value=-2**80, max_value=2**80).map(str),
    st.text(st.characters(codec=None, categories=None, exclude_categories=()), max_size=12),
)
#: Each route's parameters ({} in the path: a segment, the real value or a hostile one).
ROUTES = [
    ("/", ()), ("/health", ()),
    ("/runs/{run}", ("before", "with")),
    ("/runs/{run}/trajectories", (*FILTERS, "sort", "dir", "before", "after", "key")),
    ("/runs/{run}/trajectories.{fmt}", (*FILTERS, "sort", "dir")),
    ("/runs/{run}/groups", (*GROUP_FILTERS, "before")),
    ("/runs/{run}/steps/{step}", ("sort", "dir")),
    ("/runs/{run}/tasks/{task}", ()),
    ("/runs/{run}/mlflow", ()),
    ("/compare", ("run", "with")),
    ("/groups/{group}", ("sort", "dir")),
    ("/trajectories/{trajectory}", ("color", "step")),
    ("/trajectories/{trajectory}/raw", ()),
    ("/trajectories/{trajectory}/vs/{other}", ()),
    ("/trajectories/{trajectory}/trace", ()),
    ("/diff", ("a", "b")),
    ("/static/{file}", ()),
]


@st.composite
def requests(draw, ids):
    template, names = draw(st.sampled_from(ROUTES))
    real = {**{k: str(v) for k, v in ids.items()}, "run": RUN, "step": "1", "fmt": "csv", "file": "explorer.css"}
    # a segment is the real one 3 times in 4, so that most requests reach their page's parameters
    path = re.sub(r"\{(\w+)\}", lambda m: real[m.group(1)] if draw(st.integers(0, 3)) else draw(HOSTILE), template)
    chosen = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    return path, q(**{name: draw(HOSTILE) for name in chosen})


def test_no_request_to_any_route_answers_5xx(app, data):
    """300 requests, a few seconds: about a fifth reach a page with its rows (200), the rest a 4xx."""
    _, ids = data

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(requests(ids))
    def check(request):
        path, query = request
        status, headers, body = asgi_get(app, path, query)
        assert status < 500, (path, query[:200], status, _says(body)[:300])
        assert headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]

    check()
