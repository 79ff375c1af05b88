"""The run page's curves over HTTP (issue 53, "curves on the run page", "two runs' curves on one
chart"): server-rendered SVG drawn from learner_steps and the held-out evaluations, with the
points the database holds; hostile metric names escaped; odd values (NaN, a JSON number past a
float, text) left out and counted; a run of thousands of steps read as evenly spaced steps and
drawn with at most 1,000 points a curve; another run's curves on the same charts, and an unknown
one refused by name.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from reflexdb import GroupIn, TaskIn
from reflexdb.explorer.charts import MAX_POINTS
from tests.factories import make_group, make_trajectory, setup_run
from tests.store.test_explorer import _get, _served, explorer  # noqa: F401 - the fixture

HOSTILE_KEY = '<script>alert("k")</script>/x&y'
#: run a: step -> metrics (and the loss column); step 3's loss is NaN (a skipped step)
A_STEPS = {
    1: {"reward/mean": 0.25, "reward/pass_at_1": 0.125, "loss/policy": -3.2e-06, "loss/kl": 0.01,
        "staleness/mean": 0.5, "staleness/max": 1.0, "perf/tokens_per_s": 1500.0, "probe/share": 0.1,
        HOSTILE_KEY: 1.0},
    2: {"reward/mean": 0.5, "reward/pass_at_1": 0.25, "loss/policy": 0.02, "loss/kl": 0.02,
        "staleness/mean": 1.5, "staleness/max": 3.0, "perf/tokens_per_s": 1700.0, "probe/share": 0.2,
        "probe/text": "not a number", "probe/null": None},
    3: {"reward/mean": 0.75, "reward/pass_at_1": 0.5, "loss/policy": 0.03, "staleness/mean": 1.0,
        "staleness/max": 2.0, "perf/tokens_per_s": 1600.0, "probe/share": 0.3},
}
A_LOSS = {1: 0.125, 2: 0.5, 3: float("nan")}
B_STEPS = {1: {"reward/mean": 0.0, "loss/policy": 0.5}, 2: {"reward/mean": 1.0, "loss/policy": 0.25}}


def _eval_group(store, rng, run, task, version, n_correct, attempts=None):
    trajs = [make_trajectory(rng, reward=float(i < n_correct), correct=i < n_correct) for i in range(4)]
    meta = {} if attempts is None else {"attempts": attempts}
    store.write_group(GroupIn(run_id=run, task_id=task, policy_version=version, workflow="eval", kind="eval",
                              trajectories=trajs, meta=meta))


@pytest.fixture
def curves(store, explorer):  # noqa: F811
    rng = np.random.default_rng(0)
    a, tasks = setup_run(store, "curves-a", n_tasks=1)
    ids = [i for _ in A_STEPS for i in store.write_group(make_group(rng, a, tasks[0], size=2)).trajectory_ids]
    for n, metrics in A_STEPS.items():
        store.record_step(a, n, n - 1, ids[2 * (n - 1):2 * n], loss=A_LOSS[n], metrics=metrics)
    # a JSON number no float holds (PostgreSQL's numeric keeps it; Python reads inf)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE learner_steps SET metrics = metrics || '{\"probe/share\": 1e400}' "
                             f"WHERE run_id = {a} AND step = 3")
    [held_out] = store.add_tasks(a, [TaskIn(prompt="What is 9+9?", ground_truth="18", split="eval")])
    _eval_group(store, rng, a, held_out, 0, 1)  # pass@1 0.25 at v0
    _eval_group(store, rng, a, held_out, 2, 3)  # 0.75 at v2
    _eval_group(store, rng, a, held_out, 2, 4, attempts=3)  # within 3 attempts: 1.0 at v2
    _eval_group(store, rng, a, held_out, 1, 2, attempts="three")  # not an integer: counted as 1 attempt
    b, tasks_b = setup_run(store, "curves-b", n_tasks=1)
    ids_b = store.write_group(make_group(rng, b, tasks_b[0], size=4)).trajectory_ids
    for n, metrics in B_STEPS.items():
        store.record_step(b, n, n - 1, ids_b[2 * (n - 1):2 * n], loss=0.1 * n, metrics=metrics)
    empty, _ = setup_run(store, "curves-empty", n_tasks=1)
    server, thread, base = _served(explorer)
    yield {"base": base, "a": a, "b": b, "empty": empty, "explorer": explorer, "store": store}
    server.should_exit = True
    thread.join(10)


def _svgs(body: str) -> dict[str, ET.Element]:
    """Each chart of a page by its id, parsed as XML (so each is well-formed)."""
    found = {}
    for m in re.finditer(r"<svg\b.*?</svg>", body, re.S):
        root = ET.fromstring(m.group(0))
        found[root.get("id")] = root
    return found


NS = "{http://www.w3.org/2000/svg}"


def _series(svg: ET.Element) -> dict[str, list[tuple[str, str]]]:
    """name -> the (x, value) of each point marker (a series of up to 60 points has one each)."""
    out = {}
    for g in svg.iter(f"{NS}g"):
        if g.get("class") != "series":
            continue
        points = []
        for c in g.iter(f"{NS}circle"):
            title = c.find(f"{NS}title").text
            m = re.search(r": (?:step|policy version) (\S+), (\S+)$", title)
            points.append((m.group(1), m.group(2)))
        out[g.get("data-name")] = points
    return out


def _note(svg: ET.Element) -> str:
    return " ".join(t.text or "" for t in svg.iter(f"{NS}text") if t.get("class") == "note")


def test_the_run_page_draws_each_curve_from_the_database(curves):
    status, body, headers = _get(curves["base"] + "/runs/curves-a")
    assert status == 200, body[:800]
    assert "script-src" not in headers["content-security-policy"]
    charts = _svgs(body)
    assert _series(charts["chart-reward"]) == {"reward/mean": [("1", "0.25"), ("2", "0.5"), ("3", "0.75")]}
    assert _series(charts["chart-pass-at-1"]) == {"reward/pass_at_1": [("1", "0.125"), ("2", "0.25"), ("3", "0.5")]}
    # the loss column (NaN at step 3: a gap, counted) and every loss/ term, the column first
    loss = _series(charts["chart-loss"])
    assert list(loss) == ["loss", "loss/kl", "loss/policy"]
    assert loss["loss"] == [("1", "0.125"), ("2", "0.5")]
    assert loss["loss/policy"] == [("1", "-3.2e-06"), ("2", "0.02"), ("3", "0.03")]
    assert loss["loss/kl"] == [("1", "0.01"), ("2", "0.02")]
    assert "1 value not drawn" in _note(charts["chart-loss"])
    assert _series(charts["chart-staleness"]) == {"staleness/max": [("1", "1"), ("2", "3"), ("3", "2")],
                                                  "staleness/mean": [("1", "0.5"), ("2", "1.5"), ("3", "1")]}
    assert _series(charts["chart-tokens-per-s"]) == {"perf/tokens_per_s": [("1", "1500"), ("2", "1700"), ("3", "1600")]}
    # held-out pass@1 by policy version: one attempt (a non-integer attempts counts as one), and within 3
    assert _series(charts["chart-evaluations"]) == {"pass@1": [("0", "0.25"), ("1", "0.5"), ("2", "0.75")],
                                                    "solved within 3 attempts": [("2", "1")]}
    # every other numeric metric by prefix: text and null left out, 1e400 (inf) counted as not drawn
    [probe] = [svg for cid, svg in charts.items() if cid.startswith("chart-metrics-probe")]
    assert _series(probe) == {"probe/share": [("1", "0.1"), ("2", "0.2")]}
    assert "1 value not drawn" in _note(probe)


def test_a_metric_name_with_markup_is_text_in_the_chart(curves):
    _, body, _ = _get(curves["base"] + "/runs/curves-a")
    assert "<script>" not in body
    charts = _svgs(body)
    [hostile] = [svg for svg in charts.values() if HOSTILE_KEY in _series(svg)]
    assert _series(hostile)[HOSTILE_KEY] == [("1", "1")]
    # the legend shows its first characters as text, its tooltip all of it
    assert any("".join(t.itertext()).startswith('<script>alert("k")') for t in hostile.iter(f"{NS}text"))
    assert any(HOSTILE_KEY in (t.text or "") for t in hostile.iter(f"{NS}title"))


def test_two_runs_curves_on_one_chart(curves):
    base = curves["base"]
    status, body, _ = _get(base + "/runs/curves-a?with=curves-b")
    assert status == 200, body[:800]
    charts = _svgs(body)
    assert _series(charts["chart-reward"]) == {
        "curves-a · reward/mean": [("1", "0.25"), ("2", "0.5"), ("3", "0.75")],
        "curves-b · reward/mean": [("1", "0"), ("2", "1")]}
    loss = _series(charts["chart-loss"])
    assert loss["curves-b · loss/policy"] == [("1", "0.5"), ("2", "0.25")]
    assert loss["curves-b · loss"] == [("1", "0.1"), ("2", "0.2")]
    assert "curves-a · loss/policy" in loss
    # the run page links to the other run, and offers every other run to draw beside it
    assert 'href="/runs/curves-b"' in body and '<option value="curves-b" selected>' in body
    status, body, _ = _get(base + "/runs/curves-a")
    assert '<select name="with">' in body and '<option value="curves-b">' in body
    # the runs list's form: /compare?run=a&with=b opens a's page with b beside it
    status, body, _ = _get(base + "/")
    assert 'action="/compare"' in body
    status, body, _ = _get(base + "/compare?run=curves-a&with=curves-b")
    assert status == 200 and "curves-b · reward/mean" in body


def test_compare_redirects_to_the_run_page(curves):
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(curves["base"])
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/compare?run=curves-a&with=curves-b")
    resp = conn.getresponse()
    assert resp.status == 303 and resp.getheader("location") == "/runs/curves-a?with=curves-b#curves"


@pytest.mark.parametrize("path, status, says", [
    ("/runs/curves-a?with=nope", 404, "no run named &#39;nope&#39; to draw beside run &#39;curves-a&#39;"),
    ("/runs/curves-a?with=%3Cscript%3E", 404, "no run named &#39;&lt;script&gt;&#39;"),
    ("/runs/curves-a?with=a%00b", 400, "&#39;with&#39;: contains a NUL character"),
    ("/runs/curves-a?with=x1&with=x2&with=x3&with=x4&with=x5", 400, "at most 4 runs can be drawn beside"),
    ("/compare?run=curves-a&with=nope", 404, "no run named &#39;nope&#39; to draw beside run &#39;curves-a&#39;"),
    ("/compare?run=nope&with=curves-a", 404, "no run named &#39;nope&#39;"),
    ("/compare?with=curves-a", 400, "&#39;run&#39;: choose the run whose page to open"),
])
def test_an_unknown_other_run_is_refused_by_name(curves, path, status, says):
    got, body, _ = _get(curves["base"] + path)
    assert got == status and says in body, body[:800]


def test_the_same_run_beside_itself_or_an_empty_with_draws_it_alone(curves):
    for query in ("?with=curves-a", "?with=", "?with=+"):
        status, body, _ = _get(curves["base"] + "/runs/curves-a" + query)
        assert status == 200 and set(_series(_svgs(body)["chart-reward"])) == {"reward/mean"}, query


def test_a_run_without_steps_and_a_run_of_one_step(curves):
    status, body, _ = _get(curves["base"] + "/runs/curves-empty")
    assert status == 200
    charts = _svgs(body)
    assert {"chart-reward", "chart-loss", "chart-evaluations"} <= set(charts)
    assert all("no value recorded" in "".join(svg.itertext()) for svg in charts.values())
    # one step beside none: a point, drawn as a marker
    store, rng = curves["store"], np.random.default_rng(2)
    one, tasks = setup_run(store, "curves-one", n_tasks=1)
    ids = store.write_group(make_group(rng, one, tasks[0], size=2)).trajectory_ids
    store.record_step(one, 7, 0, ids, loss=None, metrics={"reward/mean": 1e300})
    status, body, _ = _get(curves["base"] + "/runs/curves-one?with=curves-empty")
    assert status == 200
    assert _series(_svgs(body)["chart-reward"]) == {"curves-one · reward/mean": [("7", "1e+300")]}


def test_thousands_of_steps_are_read_evenly_spaced_and_drawn_bounded(curves):
    store, explorer = curves["store"], curves["explorer"]
    run, _ = setup_run(store, "curves-long", n_tasks=1)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO learner_steps (run_id, step, policy_version, loss, metrics) "
            f"SELECT {run}, s, s, sin(s), jsonb_build_object('reward/mean', s, 'loss/policy', cos(s)) "
            "FROM generate_series(1, 5000) s")
    rows = explorer.curve_steps(run, rows=100)
    steps = [r["step"] for r in rows]
    assert len(steps) == 100 and steps[0] == 1 and steps[-1] == 5000 and steps == sorted(set(steps))
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    assert gaps <= {50, 51}, gaps  # evenly spaced
    assert [r["step"] for r in explorer.curve_steps(run, rows=5000)] == list(range(1, 5001))
    status, body, _ = _get(curves["base"] + "/runs/curves-long")
    assert status == 200
    for svg in _svgs(body).values():
        for g in svg.iter(f"{NS}g"):
            if g.get("class") == "series":
                assert 0 < int(g.get("data-points")) <= MAX_POINTS
    # the decimated reward curve keeps the first and the last value read (min and max per bucket)
    reward = _svgs(body)["chart-reward"]
    assert any(t.text == "reward/mean: last 5000" for t in reward.iter(f"{NS}title"))


def test_a_new_step_or_metrics_merged_into_the_last_show_at_once(curves):
    """The charts are kept by what they were drawn from: a step recorded since, a method's metrics
    merged into the last step, or a new evaluation draws them again."""
    store, base = curves["store"], curves["base"]
    series = lambda: _series(_svgs(_get(base + "/runs/curves-b")[1])["chart-reward"])  # noqa: E731
    assert series() == {"reward/mean": [("1", "0"), ("2", "1")]}
    assert series() == {"reward/mean": [("1", "0"), ("2", "1")]}  # drawn again from the cache
    store.add_step_metrics(curves["b"], 2, {"reward/mean": 0.5})
    assert series() == {"reward/mean": [("1", "0"), ("2", "0.5")]}
    rng = np.random.default_rng(3)
    [task] = store.add_tasks(curves["b"], [TaskIn(prompt="What is 1+1?", ground_truth="2")])
    ids = store.write_group(make_group(rng, curves["b"], task, size=2)).trajectory_ids
    store.record_step(curves["b"], 3, 2, ids, loss=0.3, metrics={"reward/mean": 0.75})
    assert series() == {"reward/mean": [("1", "0"), ("2", "0.5"), ("3", "0.75")]}
    assert not _series(_svgs(_get(base + "/runs/curves-b")[1])["chart-evaluations"])
    [held_out] = store.add_tasks(curves["b"], [TaskIn(prompt="What is 7+7?", ground_truth="14", split="eval")])
    _eval_group(store, rng, curves["b"], held_out, 2, 2)
    assert _series(_svgs(_get(base + "/runs/curves-b")[1])["chart-evaluations"]) == {"pass@1": [("2", "0.5")]}
