"""The explorer's reads and pages over HTTP, without a browser (tests/e2e/test_explorer_browser.py
drives them in Chromium): read-only under the reader role, filters as parameters only, model
text escaped, clear errors for bad input."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from reflexdb import roles
from reflexdb.explorer.app import SECURITY_HEADERS, create_app
from reflexdb.explorer.data import FILTERS, BadFilter, Explorer, Plugins, parse_filters
from tests.factories import make_group, setup_run

HOSTILE = '<script>alert("x")</script><b>bold</b>'


@pytest.fixture
def explorer(store, db_url):
    roles.apply(store.engine)
    db = Explorer(db_url)
    yield db
    db.close()


def _served(db):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(db), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the explorer did not start"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


def _get(url: str) -> tuple[int, str, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


@pytest.fixture
def site(store, explorer, model_cache):
    rng = np.random.default_rng(0)
    run, tasks = setup_run(store, "ex", n_tasks=2)
    written = [store.write_group(make_group(rng, run, t, size=4, version=v, text=HOSTILE))
               for v in (0, 2) for t in tasks]
    ids = [i for w in written[:2] for i in w.trajectory_ids]
    store.record_step(run, 1, 1, ids, loss=0.25, metrics={"loss/policy": 0.25, "reward/mean": 0.5})
    server, thread, base = _served(explorer)
    yield {"base": base, "run": run, "tasks": tasks, "written": written}
    server.should_exit = True
    thread.join(10)


def test_sessions_take_the_reader_role_and_cannot_write(explorer):
    assert explorer.role_taken
    who = explorer.one("SELECT current_user AS u, current_setting('transaction_read_only') AS ro")
    assert who == {"u": "reflexdb_reader", "ro": "on"}
    import psycopg

    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        explorer.rows("INSERT INTO runs (name) VALUES ('nope')")


def test_filters_are_parsed_and_refused_by_name():
    got = parse_filters({"version": " 3 ", "correct": "null", "reward_min": "0.5", "q": "50%_off\\", "origin": ""},
                        FILTERS)
    # free text is a literal: its %, _ and \ escaped for ILIKE
    assert got == {"version": 3, "correct": None, "reward_min": 0.5, "q": "%50\\%\\_off\\\\%"}
    for query, says in (({"version": "abc"}, "filter 'version': 'abc' is not an integer"),
                        ({"reward_max": "nan"}, "filter 'reward_max': 'nan' is not a number"),
                        ({"correct": "maybe"}, "filter 'correct': 'maybe' is not true, false or null"),
                        ({"task": str(2**63)}, "is not an integer"),
                        ({"q": "x" * 1001}, "longer than 1000 characters"),
                        ({"origin": "a\x00b"}, "NUL")):
        with pytest.raises(BadFilter, match=says.replace("(", r"\(")):
            parse_filters(query, FILTERS)


def test_a_filter_value_reaches_sql_only_as_a_parameter(site, explorer):
    run = site["run"]
    for evil in ("'; DROP TABLE runs; --", "x' OR '1'='1", "%", "_", "\\"):
        rows = explorer.trajectories(run, parse_filters({"q": evil, "response": evil, "origin": evil}, FILTERS), None)
        assert rows == []
    assert explorer.one("SELECT count(*) AS n FROM runs")["n"] == 1
    # the literal text of a response finds its rows; of a prompt, its task's
    rows = explorer.trajectories(run, parse_filters({"response": '<script>alert("x")'}, FILTERS), None)
    assert len(rows) == 16
    rows = explorer.trajectories(run, parse_filters({"q": "What is 1+3"}, FILTERS), None)
    assert len(rows) == 8 and {r["prompt"] for r in rows} == {"What is 1+3?"}


def test_pages_answer_escape_model_text_and_carry_the_policy(site):
    base, run = site["base"], site["written"][0]
    tid = run.trajectory_ids[0]
    for path in ("/", "/runs/ex", "/runs/ex/trajectories", "/runs/ex/trajectories?correct=true&version=2&q=bold",
                 "/runs/ex/groups", f"/groups/{run.group_id}", f"/trajectories/{tid}", f"/trajectories/{tid}/raw",
                 "/runs/ex/steps/1", f"/runs/ex/tasks/{site['tasks'][0]}"):
        status, body, headers = _get(base + path)
        assert status == 200, (path, body[:500])
        assert headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
        if not path.endswith("/raw"):
            assert "<script>" not in body and "<b>bold" not in body, path
    status, body, _ = _get(f"{base}/trajectories/{tid}")
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in body
    # the step page: its loss terms and each row's staleness (learner v1 - the row's version 0)
    status, body, _ = _get(f"{base}/runs/ex/steps/1")
    assert "loss/policy" in body and "0.25000" in body and f"/trajectories/{tid}" in body


@pytest.mark.parametrize("path, status, says", [
    ("/runs/ex/trajectories?version=abc", 400, "filter &#39;version&#39;: &#39;abc&#39; is not an integer"),
    ("/runs/ex/trajectories?before=zz", 400, "&#39;before&#39;: &#39;zz&#39; is not an integer"),
    ("/runs/nope", 404, "no run named &#39;nope&#39;"),
    ("/trajectories/999999", 404, "no trajectory 999999"),
    ("/runs/ex/steps/77", 404, "has no learner step 77"),
    ("/groups/0", 404, "no group 0"),
])
def test_bad_requests_get_a_page_that_names_the_problem(site, path, status, says):
    got, body, _ = _get(site["base"] + path)
    assert got == status and says in body, body[:800]


def test_the_next_page_starts_before_the_last_row_shown(store, explorer):
    rng = np.random.default_rng(1)
    run, tasks = setup_run(store, "many", n_tasks=1)
    for _ in range(14):  # 56 rows: a first page of 50, a second of 6
        store.write_group(make_group(rng, run, tasks[0], size=4))
    first = explorer.trajectories(run, {}, None, 51)
    assert len(first) == 51
    second = explorer.trajectories(run, {}, first[49]["id"], 51)
    assert len(second) == 6 and max(r["id"] for r in second) < first[49]["id"]
    assert {r["id"] for r in first[:50]} | {r["id"] for r in second} == {
        r["id"] for r in explorer.rows("SELECT id FROM trajectories WHERE run_id = %(r)s", {"r": run})}


def test_a_method_explorer_file_with_an_unknown_block_is_refused(tmp_path, monkeypatch):
    from reflexdb import plugins

    (tmp_path / "explorer.sql").write_text("-- name: link\nSELECT 1;\n")
    monkeypatch.setattr(plugins.SQL, "items", lambda: [("oops", tmp_path)])
    with pytest.raises(Exception, match="unknown block\\(s\\) link; an explorer file has the blocks links, panels and marks"):
        Plugins.load()
