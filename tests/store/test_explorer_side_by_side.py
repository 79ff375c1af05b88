"""Two trajectories side by side and the trace of an episode, over HTTP on the explorer's fixture
database (tests/explorer_data.py) plus one long pair of its own: a parent and its child, two rows
of a group, the group page's form, model text escaped, a megabyte turn and a thousand-turn episode
answered in bounded time and size, 404 for unknown ids and 400 for a row compared with itself
(issue 53, "side by side" and "a trace view of an episode")."""

from __future__ import annotations

import re
import time
import urllib.request

import numpy as np
import pytest

from tests.conftest import _drop_database, _new_database
from tests.explorer_data import HOSTILE, HOSTILE_PROMPT
from tests.store.test_explorer import _get, _served

#: turns of the long episodes (past explorer/side.py's MAX_SPANS and MAX_TURNS, 200)
LONG_TURNS = 1_000
MB = 1024 * 1024


def _long_pair(store, run: int) -> tuple[int, int]:
    """Two rows of one group of ``run``: each a 1 MB first answer (hostile, differing in the middle)
    and then 999 turns, tool calls with a sandbox record each."""
    from reflexdb import GroupIn, TaskIn, TrajectoryIn, TurnIn
    from tests.hostile_text import corpus

    [task] = store.add_tasks(run, [TaskIn("Count the braces.", "0", dataset="side-by-side")])
    big = HOSTILE + corpus()["unclosed nested braces"][: MB - len(HOSTILE)]
    rows = []
    for k, first in enumerate((big, big[: MB // 2] + HOSTILE_PROMPT + big[MB // 2:])):
        turns = [TurnIn("user", "Count the braces.")]
        for i in range(LONG_TURNS - 1):
            if i % 2 == 0:
                turns.append(TurnIn("assistant", first if i == 0 else f"```python\nprint({i} + {k})\n```", i, i + 1,
                                    attempt=i // 2))
            else:
                turns.append(TurnIn("tool", f"{i + k}", i, i + 1, tool_error=False, attempt=i // 2,
                                    tool_call={"status": "ok", "exit_code": 0, "detail": None, "wall_s": 0.01,
                                               "cpu_s": 0.005}))
        n = LONG_TURNS - 1
        rows.append(TrajectoryIn(prompt_ids=np.arange(5, dtype=np.int32), response_ids=np.arange(n, dtype=np.int32) + 7,
                                 logprobs=-np.full(n, 0.1, np.float32), reward=float(k), correct=bool(k), turns=turns,
                                 extracted_answer=str(k), origin="base"))
    w = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=rows, workflow="group",
                                  kind="fresh"))
    return w.trajectory_ids[0], w.trajectory_ids[1]


@pytest.fixture(scope="module")
def data(pg_server_url, template_db):
    from reflexdb import Store, roles
    from tests.explorer_data import populate

    name, url = _new_database(pg_server_url, template_db)
    store = Store.open(url)
    try:
        roles.apply(store.engine)
        made = populate(store, real_tokens=False)
        long = _long_pair(store, made.tools_run_id)
    finally:
        store.close()
    yield url, made, long
    _drop_database(pg_server_url, name)


@pytest.fixture(scope="module")
def site(data):
    from reflexdb.explorer.data import Explorer

    url, _, _ = data
    db = Explorer(url)
    server, thread, base = _served(db)
    yield base
    server.should_exit = True
    thread.join(10)
    db.close()


def _page(site: str, path: str, status: int = 200) -> str:
    code, body, headers = _get(site + path)
    assert code == status, (path, code, re.sub(r"\s+", " ", body)[:1500])
    assert "script-src" not in headers["content-security-policy"] and "default-src 'none'" in headers[
        "content-security-policy"]
    return body


def _main(body: str) -> str:
    return body[body.index("<main>"):]


def test_a_parent_and_its_child_side_by_side(site, data):
    _, d, _ = data
    body = _page(site, f"/trajectories/{d.raw}/vs/{d.purified}")
    assert f"trajectory {d.purified} (purified) was made from trajectory {d.raw}" in body
    # the facts of both, and the rows that differ marked
    facts = body[body.index('id="side-facts"'):body.index("</table>", body.index('id="side-facts"'))]
    assert facts.count('class="differs"') >= 2 and "origin" in facts and "reward" in facts
    # the turns paired, the failed call's error only on the left, the words that differ marked
    pairs = body[body.index('id="turn-pairs"'):]
    assert "NameError" in pairs and "<del>" in pairs and "<ins>" in pairs
    assert 'class="pair how-same"' in pairs  # the prompt's turns are identical
    assert 'class="pair how-only"' in pairs  # the raw row's extra turns have no partner


def test_the_lineage_links_to_the_comparison_both_ways(site, data):
    _, d, _ = data
    for tid in (d.raw, d.purified):
        body = _page(site, f"/trajectories/{tid}")
        links = re.findall(r'<a class="side-by-side" href="([^"]+)"', body)
        assert f"/trajectories/{d.raw}/vs/{d.purified}" in links, (tid, links)
    body = _page(site, f"/trajectories/{d.base}")
    links = set(re.findall(r'<a class="side-by-side" href="([^"]+)"', body))
    assert {f"/trajectories/{d.base}/vs/{d.distilled}", f"/trajectories/{d.base}/vs/{d.guided_retry}"} <= links
    for link in links:
        _page(site, link)


def test_two_rows_of_a_group_from_the_group_page(site, data):
    _, d, _ = data
    body = _page(site, f"/groups/{d.plain_group}")
    form = body[body.index('id="side-pick"'):body.index("</form>", body.index('id="side-pick"'))]
    assert 'action="/diff"' in form and 'method="get"' in form
    assert {int(x) for x in re.findall(r'<option value="(\d+)"', form)} == set(d.plain)
    # "the best row against each other row": the best is the one of reward 1.0
    best = d.plain[d.plain_rewards.index(1.0)]
    vs = re.findall(r'<a class="vs-best" href="/trajectories/(\d+)/vs/(\d+)"', body)
    assert {(int(a), int(b)) for a, b in vs} == {(best, t) for t in d.plain if t != best}
    # the form's GET answers with the page (a redirect to /trajectories/<a>/vs/<b>)
    with urllib.request.urlopen(f"{site}/diff?a={d.plain[0]}&b={d.plain[1]}", timeout=30) as resp:
        assert resp.url.endswith(f"/trajectories/{d.plain[0]}/vs/{d.plain[1]}")
        page = resp.read().decode()
    assert f"two rows of group {d.plain_group}" in page
    assert "168" in page and "42" in page  # the two answers, side by side


def test_model_text_is_text_on_both_pages(site, data):
    _, d, _ = data
    other = next(t for t in _rows_of(site, d.script_group) if t != d.script)
    for path in (f"/trajectories/{d.script}/vs/{other}", f"/trajectories/{d.script}/trace"):
        body = _main(_page(site, path))
        assert "<script" not in body and "<img" not in body and "<b>bold" not in body, path
        assert "&lt;script&gt;alert(" in body, path
    body = _main(_page(site, f"/trajectories/{d.script}/vs/{other}"))
    assert "&lt;img src=x onerror=alert(1)&gt;" in body


def _rows_of(site: str, group: int) -> list[int]:
    body = _page(site, f"/groups/{group}")
    form = body[body.index('id="side-pick"'):]
    return sorted({int(x) for x in re.findall(r'<option value="(\d+)"', form)})


def test_rows_of_two_runs_can_be_compared(site, data):
    _, d, _ = data
    body = _page(site, f"/trajectories/{d.plain[1]}/vs/{d.clean_raw}")
    assert f"rows of two runs ({d.run} and {d.tools_run})" in body


@pytest.mark.parametrize("path, status, says", [
    ("/trajectories/{raw}/vs/{raw}", 400, "compared with itself"),
    ("/trajectories/987654321/vs/{raw}", 404, "no trajectory 987654321"),
    ("/trajectories/{raw}/vs/987654321", 404, "no trajectory 987654321"),
    ("/trajectories/99999999999999999999999/vs/{raw}", 404, "no trajectory 99999999999999999999999"),
    ("/trajectories/987654321/trace", 404, "no trajectory 987654321"),
    ("/trajectories/99999999999999999999999/trace", 404, "no trajectory"),
    ("/diff?a=x&b={raw}", 400, "&#39;a&#39;: &#39;x&#39; is not a trajectory id"),
    ("/diff?a={raw}", 400, "&#39;b&#39;: choose a trajectory"),
    ("/diff?a=%3Cscript%3E&b=1", 400, "&#39;a&#39;: &#39;&lt;script&gt;&#39; is not a trajectory id"),
])
def test_bad_requests_get_a_page_that_names_the_problem(site, data, path, status, says):
    _, d, _ = data
    body = _page(site, path.format(raw=d.raw), status)
    assert says in body, re.sub(r"\s+", " ", _main(body))[:600]
    assert "<script>" not in body


def test_the_trace_shows_tool_calls_as_spans_with_their_durations(site, data):
    _, d, _ = data
    body = _page(site, f"/trajectories/{d.raw}/trace")
    # the fixture's calls: a failed one of 41.2 ms (CPU 24.7 ms), then one of 38.6 ms; 79.8 ms in all
    assert re.search(r'id="tool-total">79\.8 ms<', body)
    tools = re.findall(r'<div class="span-row depth-2 kind-tool( failed)?" id="span-(\d+)">', body)
    assert [(bool(f), int(i)) for f, i in tools] == [(True, d.tool_error_turn), (False, d.tool_error_turn + 2)]
    rows = body[body.index('id="trace"'):]
    assert "41.2 ms" in rows and "38.6 ms" in rows and "CPU 24.7 ms" in rows
    # the bars: the first starts at 0 and takes 41.2/79.8 of the axis, the second starts there
    bars = re.findall(r'class="bar kind-tool" style="left: ([\d.]+)%; width: ([\d.]+)%"', body)
    assert [(float(a), float(b)) for a, b in bars] == [(0.0, pytest.approx(51.629, abs=1e-3)),
                                                      (pytest.approx(51.629, abs=1e-3), pytest.approx(48.371, abs=1e-3))]
    # generations are spans with their token counts, said to be untimed, marked where they happened
    assert body.count('kind-generation" id="span-') == 3 and body.count("not timed") >= 3
    assert body.count('class="untimed-mark"') >= 3
    # the trajectory page links to its trace
    assert f'id="trace-link" href="/trajectories/{d.raw}/trace"' in _page(site, f"/trajectories/{d.raw}")


@pytest.fixture(scope="module")
def timed(data):
    """An episode whose engine calls were timed (``meta.generations``, as collectors record them),
    with records a hostile or broken writer could leave beside them."""
    from reflexdb import GroupIn, Store, TaskIn, TrajectoryIn, TurnIn

    url, d, _ = data
    store = Store.open(url)
    try:
        [task] = store.add_tasks(d.tools_run_id, [TaskIn("Add 2 and 3.", "5", dataset="trace")])
        turns = [TurnIn("user", "Add 2 and 3."),
                 TurnIn("assistant", "```python\nprint(2 + 3)\n```", 0, 3, attempt=0),
                 TurnIn("tool", "5", 3, 4, attempt=0, tool_call={"status": "ok", "wall_s": 0.1, "cpu_s": 0.05}),
                 TurnIn("assistant", "It is 6.", 4, 6, attempt=1),
                 TurnIn("user", "Incorrect. Please try again.", 6, 7, attempt=1, trainable=False),
                 TurnIn("assistant", "It is 5, <script>alert(1)</script>", 7, 12, attempt=2)]
        generations = [
            {"attempt": 0, "tokens": 3, "wall_s": 0.3, "rows": 8},   # turn 1: 0.3 s, a call of 8 rows
            {"attempt": 1, "tokens": 2, "wall_s": 0.1, "rows": 1},   # turn 3: 0.1 s, one row
            {"attempt": 2, "tokens": 5, "wall_s": 0.2, "rows": 4},   # turn 5: two records for one key,
            {"attempt": 2, "tokens": 5, "wall_s": 9.0, "rows": 4},   # so which timed it is unknown: untimed
            {"attempt": 1, "tokens": 7, "wall_s": 5.0, "rows": 2},   # no turn of 7 tokens: not drawn
            {"attempt": True, "tokens": 3, "wall_s": 1.0, "rows": 1}, {"attempt": 0, "tokens": "3", "wall_s": 1.0},
            {"attempt": 0, "tokens": 3, "wall_s": "NaN", "rows": 1}, {"attempt": 0, "tokens": 3, "wall_s": -1, "rows": 1},
            "<script>", None, [1, 2]]
        n = 12
        row = TrajectoryIn(prompt_ids=np.arange(4, dtype=np.int32), response_ids=np.arange(n, dtype=np.int32) + 7,
                           logprobs=-np.full(n, 0.1, np.float32), reward=1.0, correct=True, turns=turns,
                           extracted_answer="5", origin="base", meta={"generations": generations})
        w = store.write_group(GroupIn(run_id=d.tools_run_id, task_id=task, policy_version=0, trajectories=[row],
                                      workflow="group", kind="fresh"))
    finally:
        store.close()
    return w.trajectory_ids[0]


def test_the_trace_draws_generations_with_their_engine_calls(site, timed):
    body = _page(site, f"/trajectories/{timed}/trace")
    # valid records of the turns: 0.3 s and 0.1 s; the one of 7 tokens matches no turn but is an engine
    # call of the episode, so it counts in the generation time: 0.3 + 0.1 + 5.0 = 5.4 s; attempt 2's
    # two records cancel; the rest are not records (a bool attempt, a string count, NaN, -1, not dicts)
    assert re.search(r'id="generation-total">5\.4 s<', body) and "(3 engine calls)" in body
    assert re.search(r'id="tool-total">100 ms<', body)
    # the axis is the episode's timed turns end to end, 5.5 s: generation 0.3 s at 0, the tool call 0.1 s
    # after it, generation 0.1 s after that; the untimed generation of attempt 2 and the feedback are marks
    bars = re.findall(r'class="bar kind-(\w+)" style="left: ([\d.]+)%; width: ([\d.]+)%"', body)
    assert [(k, float(a), float(b)) for k, a, b in bars] == [
        ("episode", 0.0, 100.0), ("generation", 0.0, pytest.approx(100 * 0.3 / 5.5, abs=1e-3)),
        ("tool", pytest.approx(100 * 0.3 / 5.5, abs=1e-3), pytest.approx(100 * 0.1 / 5.5, abs=1e-3)),
        ("generation", pytest.approx(100 * 0.4 / 5.5, abs=1e-3), pytest.approx(100 * 0.1 / 5.5, abs=1e-3))]
    rows = body[body.index('id="trace"'):]
    assert "a call of 8 rows" in rows and "a call of 1 row<" in rows
    assert rows.count("not timed") == 2 and rows.count('class="untimed-mark"') == 2
    assert "<script>alert(1)" not in rows and "&lt;script&gt;alert(1)" in rows
    assert 'id="no-timed-spans"' not in body


def test_a_trace_without_tool_calls_says_so(site, data):
    _, d, _ = data
    body = _page(site, f"/trajectories/{d.base}/trace")
    assert 'id="no-timed-spans"' in body and "none measured" in body
    assert "kind-tool" not in body.split('id="trace"')[1].split("</main>")[0].replace("kind-tool {", "")


def test_a_thousand_turn_episode_is_drawn_in_bounded_size(site, data):
    from reflexdb.explorer.side import MAX_SPANS

    _, _, (first, _) = data
    t0 = time.monotonic()
    body = _page(site, f"/trajectories/{first}/trace")
    assert time.monotonic() - t0 < 10
    assert len(body) < 600_000, len(body)
    assert body.count('<div class="span-row depth-') == 1 + MAX_SPANS + 1  # the episode, the spans, "more"
    assert f"… {LONG_TURNS - MAX_SPANS} more turns not drawn" in body
    assert re.search(r'id="tool-total">4\.99 s<', body)  # 499 calls of 10 ms, the undrawn ones counted


def test_megabyte_turns_compare_in_bounded_time_and_size(site, data):
    from reflexdb.explorer.side import MAX_TURNS

    _, _, (first, second) = data
    t0 = time.monotonic()
    body = _page(site, f"/trajectories/{first}/vs/{second}")
    assert time.monotonic() - t0 < 15
    assert len(body) < 3_000_000, len(body)
    assert body.count('<tr class="pair how-') <= 2 * MAX_TURNS
    assert f"its first {MAX_TURNS} are compared here, {LONG_TURNS - MAX_TURNS} more" in body
    # the megabyte turns differ by HOSTILE_PROMPT in the middle: escaped, marked, and the rest counted
    assert "&lt;img src=x onerror=alert(1)&gt;" in body and "<img" not in _main(body)
    assert "more characters not shown" in body

