"""Issue 53's rough edges of the explorer, over HTTP (items 1-5, 7, 9, 11 and the MLflow links;
tests/e2e/test_explorer_rough_edges_browser.py has what only a browser or a server process shows):
each test failed on the code before the fix.

The database is tests/explorer_data.py's (stand-in token ids: no tokenizer is needed here), plus a
CLEANER row whose failed call no correction could replace (:func:`_unrecovered`), a run whose
learner step has a loss of -3.2e-06 and a run that grows while the explorer serves it.
"""

from __future__ import annotations

import dataclasses
import html
import http.client
import re
import socket
import threading
import time
from contextlib import contextmanager
from decimal import Decimal
from urllib.parse import urlsplit

import numpy as np
import pytest

from reflexdb.explorer import app as app_module
from reflexdb.explorer.app import _fmt, create_app
from reflexdb.explorer.data import Explorer
from tests.conftest import _drop_database, _new_database
from tests.factories import make_group, setup_run

TINY_LOSS = -3.2e-06


@dataclasses.dataclass(frozen=True)
class Extra:
    unrecovered: int  # a purified row (explorer-tools) whose one rollback was not recovered
    unrecovered_raw: int  # its raw twin
    unrecovered_turn: int  # the turn_index of its purifications row: the failed call, kept
    tiny_run: str  # a run with one learner step, loss TINY_LOSS
    growing_run: tuple[str, int, int]  # (name, run id, task id): a run of one plain group


def _unrecovered(store, d) -> tuple[int, int, int]:
    """A CLEANER episode whose failed call no correction fixed (methods/cleaner/saar.py, "K
    corrections failed"): the purified row commits the failed call with its error and a note to
    try a different approach; the raw twin holds the call, its error and each failed correction."""
    from reflexdb import GroupIn, Sibling, TaskIn
    from reflexdb.collector.tasks import tool_use
    from reflexdb.methods.cleaner.rollbacks import PurificationIn, Purifications, Rollback
    from tests.explorer_data import COLLECTOR, EMBEDDING_MODEL, _Data, _Episode, _messages, _Tokens, _tool_record

    data = _Data(_Tokens(False))
    question = "What is 2 to the power of 10?"
    [task] = store.add_tasks(d.tools_run_id, [TaskIn(question, "1024", dataset="explorer-tools")])
    prompt = _messages("tool_python", question)
    failed = "print(pow(2, n))"
    tries = ["print(pow(2, m))", "print(2 ** k)", "print(two ** 10)"]
    error = "Traceback (most recent call last):\n  File \"/tmp/call.py\", line 1, in <module>\nNameError: name 'n' is not defined"
    turn_text = f"I will compute it with Python.\n```python\n{failed}\n```"
    answer = "Without running code: 2^10 = \\boxed{1024}."
    raw_ep = _Episode(data, prompt, 0)
    raw_ep.say(turn_text)
    raw_ep.hear(tool_use.observation(error, True), role="tool", tool_error=True, tool_call=_tool_record(failed, "error", 0.04, error))
    for code in tries:
        raw_ep.say(f"```python\n{code}\n```")
        raw_ep.hear(tool_use.observation(error, True), role="tool", tool_error=True,
                    tool_call=_tool_record(code, "error", 0.04, error))
    raw_ep.say(answer, answer="1024", correct=True, reward=1.0)
    raw = raw_ep.trajectory(reward=1.0, correct=True, answer="1024", embedding=False, origin="raw")
    pure_ep = _Episode(data, prompt, 0)
    pure_ep.say(turn_text)
    shown = tool_use.observation(error, True)
    pure_ep.hear(f"{shown}\n{tool_use.TRY_DIFFERENT}", role="tool", tool_error=True,
                 tool_call=_tool_record(failed, "error", 0.04, error))
    pure_ep.say(answer, answer="1024", correct=True, reward=1.0)
    pure = pure_ep.trajectory(reward=1.0, correct=True, answer="1024", origin="purified",
                              meta={"saar": True, "rollbacks": 1, "recovered": 0})
    pure.parent_trajectory_id = Sibling(1, 0)
    n_prompt = sum(u.token_start is None for u in pure.turns)
    rollback = Rollback(0, 3, False, None, None, shown, "error", failed, tries[-1])
    train = GroupIn(run_id=d.tools_run_id, task_id=task, policy_version=0, trajectories=[pure], workflow="cleaner",
                    kind="fresh", collector=COLLECTOR, embedding_model=EMBEDDING_MODEL, embedding_layer=-1,
                    attachments=[Purifications((PurificationIn(0, n_prompt + rollback.turn, rollback),))])
    twins = GroupIn(run_id=d.tools_run_id, task_id=task, policy_version=0, trajectories=[raw], workflow="cleaner",
                    kind="retry", collector=COLLECTOR, embedding_model=EMBEDDING_MODEL, embedding_layer=-1)
    train_w, twins_w = store.write_groups([train, twins])
    return train_w.trajectory_ids[0], twins_w.trajectory_ids[0], n_prompt + rollback.turn


@pytest.fixture(scope="module")
def data(pg_server_url, template_db, model_cache):
    from reflexdb import Store, roles
    from tests.explorer_data import populate

    name, url = _new_database(pg_server_url, template_db)
    store = Store.open(url)
    try:
        roles.apply(store.engine)
        d = populate(store, real_tokens=False)
        unrecovered, raw, turn = _unrecovered(store, d)
        rng = np.random.default_rng(0)
        tiny, tasks = setup_run(store, "tiny-loss", n_tasks=1)
        ids = store.write_group(make_group(rng, tiny, tasks[0], size=2)).trajectory_ids
        store.record_step(tiny, 1, 1, list(ids), loss=TINY_LOSS, metrics={"loss/policy": TINY_LOSS, "grad_norm": 0.000123})
        growing, grow_tasks = setup_run(store, "growing", n_tasks=1)
        store.write_group(make_group(rng, growing, grow_tasks[0], size=2))
    finally:
        store.close()
    yield url, d, Extra(unrecovered, raw, turn, "tiny-loss", ("growing", growing, grow_tasks[0]))
    _drop_database(pg_server_url, name)


@pytest.fixture(scope="module")
def explorer(data):
    db = Explorer(data[0])
    yield db
    db.close()


@contextmanager
def _served(app):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the explorer did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def site(explorer):
    with _served(create_app(explorer)) as base:
        yield base


def _get(url: str) -> tuple[int, str, dict[str, str]]:
    """One request, redirects not followed: (status, body, headers with lower-case names)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def _section(body: str, element_id: str) -> str:
    """The HTML of the element with ``id`` (up to its table's or section's end)."""
    start = body.index(f'id="{element_id}"')
    end = min(i for i in (body.find("</table>", start), body.find("</section>", start)) if i != -1)
    return body[start:end]


def _options(body: str, name: str) -> list[str]:
    select = re.search(rf'<select name="{name}">(.*?)</select>', body, re.S).group(1)
    return [html.unescape(v) for v in re.findall(r'<option value="([^"]*)"', select) if v]


# ---------------------------------------------------------------------- 1. a pass rate, 20 decimals


def test_a_pass_rate_from_sql_prints_like_any_number(site, data):
    _, d, _ = data
    status, body, _ = _get(f"{site}/runs/{d.run}/tasks/{d.task_compare}")
    assert status == 200
    versions = _section(body, "versions")
    # avg(correct::int) is a NUMERIC: a Decimal of 20 decimals reached the page as 0.33333333333333333333
    assert not re.search(r"\d\.\d{4,}", versions), versions
    assert ">0.333<" in versions and ">1.000<" in versions
    assert _fmt(Decimal("0.12500000000000000000")) == "0.125" and _fmt(np.float32(0.5)) == "0.500"


# ---------------------------------------------------------------------- 2. the first run page waited for MLflow


def test_a_run_page_never_calls_mlflow_its_link_resolves_when_clicked(explorer, data, tmp_path, monkeypatch):
    from reflexdb.config import parse_config
    from reflexdb.tracking import Tracker

    _, d, _ = data
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    learner = Tracker(parse_config({"run": d.run, "model": "tiny", "learner": {"tracking_uri": uri}}))
    experiment = learner.mlflow.get_experiment_by_name(f"reflexdb/{d.run}").experiment_id
    calls: list[str] = []
    looked_up = app_module.MlflowLinks.run

    def recorded(self, name):
        calls.append(name)
        return looked_up(self, name)

    monkeypatch.setattr(app_module.MlflowLinks, "run", recorded)
    with _served(create_app(explorer, mlflow_url="http://mlflow.test:5600", tracking_uri=uri)) as base:
        pages = {path: _get(base + path) for path in (
            f"/runs/{d.run}", f"/runs/{d.run}/steps/{d.steps[0]}", f"/runs/{d.run}/trajectories",
            f"/runs/{d.run}/groups", f"/runs/{d.run}/tasks/{d.task_compare}")}
        assert calls == [], "a page waited for MLflow (importing it and opening its store took 6-8 s)"
        for path, (status, body, _) in pages.items():
            assert status == 200, (path, body[:300])
            # the page links to the explorer's own address for it, which asks MLflow only when clicked
            assert f'class="mlflow" href="/runs/{d.run}/mlflow"' in body, path
        status, _, headers = _get(f"{base}/runs/{d.run}/mlflow")
        assert status == 302 and calls == [d.run]
        assert headers["location"] == f"http://mlflow.test:5600/#/experiments/{experiment}/runs/{learner.run_id}"
        status, body, _ = _get(f"{base}/runs/{d.tools_run}/mlflow")  # no learner has logged this run
        assert status == 404 and f"no MLflow experiment &#39;reflexdb/{d.tools_run}&#39;" in body
    # an explorer started without MLflow shows no link, and its address says why
    with _served(create_app(explorer)) as base:
        status, body, _ = _get(f"{base}/runs/{d.run}")
        assert status == 200 and 'class="mlflow"' not in body
        status, body, _ = _get(f"{base}/runs/{d.run}/mlflow")
        assert status == 404 and "started without MLflow" in body


# ---------------------------------------------------------------------- 3. every installed origin in the dropdowns


def test_the_filters_offer_what_the_run_has(site, data, explorer):
    _, d, _ = data
    for run, run_id in ((d.run, d.run_id), (d.tools_run, d.tools_run_id)):
        has = explorer.one("SELECT array_agg(DISTINCT t.origin) AS origins, array_agg(DISTINCT g.kind) AS kinds "
                           "FROM trajectories t JOIN groups g ON g.id = t.group_id WHERE t.run_id = %(r)s", {"r": run_id})
        status, body, _ = _get(f"{site}/runs/{run}/trajectories")
        assert status == 200
        assert _options(body, "origin") == sorted(has["origins"]), run
        assert _options(body, "kind") == sorted(has["kinds"]), run
        status, body, _ = _get(f"{site}/runs/{run}/groups")
        assert _options(body, "kind") == sorted(has["kinds"]), run
    # CLEANER's run: its own origins and kinds, its method; nothing of R3L, LTE or NexGRPO
    status, body, _ = _get(f"{site}/runs/{d.tools_run}/trajectories")
    assert _options(body, "origin") == ["purified", "raw"]
    assert _options(body, "method") == ["cleaner"]
    # a value typed into the address that the run has none of stays selected, and says so
    status, body, _ = _get(f"{site}/runs/{d.tools_run}/trajectories?origin=hinted")
    assert status == 200 and '<option value="hinted" selected>hinted (none in this run)</option>' in body


def test_the_filters_follow_a_run_that_grows(site, data):
    from reflexdb import Store

    url, _, extra = data
    name, run, task = extra.growing_run
    assert _options(_get(f"{site}/runs/{name}/trajectories")[1], "kind") == ["fresh"]
    store = Store.open(url)
    try:  # the rows written after the first visit: read from the ids above the last one read
        g = make_group(np.random.default_rng(1), run, task, size=2)
        store.write_group(dataclasses.replace(g, kind="eval", workflow="eval"))
    finally:
        store.close()
    assert _options(_get(f"{site}/runs/{name}/trajectories")[1], "kind") == ["eval", "fresh"]


# ---------------------------------------------------------------------- 4. /steps/-1 read as a run's name


@pytest.mark.parametrize("path, status, says", [
    ("/runs/explorer/steps/-1", 404, "run &#39;explorer&#39; has no learner step -1"),
    ("/runs/explorer/steps/abc", 400, "&#39;abc&#39; is not a learner step of run &#39;explorer&#39;"),
    ("/runs/explorer/tasks/-1", 404, "run &#39;explorer&#39; has no task -1"),
    ("/runs/explorer/tasks/1.5", 400, "&#39;1.5&#39; is not a task of run &#39;explorer&#39;"),
    ("/runs/nope/steps/-1", 404, "no run named &#39;nope&#39;"),
])
def test_a_step_or_task_that_is_not_a_number_is_named(site, path, status, says):
    got, body, _ = _get(site + path)
    assert got == status and says in body, body[:800]
    assert "steps/-1&#39;" not in body and "tasks/-1&#39;" not in body  # never the whole path as a run's name


# ---------------------------------------------------------------------- 5. "compare across versions" was text


def test_compare_across_versions_links_to_the_task_page(site, data):
    _, d, _ = data
    status, body, _ = _get(f"{site}/trajectories/{d.base}")
    link = re.search(r'<a [^>]*href="([^"]+)"[^>]*>compare across versions</a>', body)
    assert status == 200 and link, "'compare across versions' is not a link"
    assert link.group(1) == f"/runs/{d.run}/tasks/{d.task_r3l}"
    assert _get(site + link.group(1))[0] == 200


# ---------------------------------------------------------------------- 7. losses as -0.0000


def test_losses_are_printed_with_significant_digits(site, data):
    _, _, extra = data
    status, body, _ = _get(f"{site}/runs/{extra.tiny_run}")
    steps = _section(body, "steps")
    assert status == 200 and ">-3.2e-06<" in steps and "-0.0000" not in steps
    status, body, _ = _get(f"{site}/runs/{extra.tiny_run}/steps/1")
    terms = _section(body, "loss-terms")
    assert status == 200 and terms.count(">-3.2e-06<") == 2 and "0.00000" not in terms
    assert ">0.0001230<" in _section(body, "metrics")  # 4 significant digits, not 0.0001
    from reflexdb.explorer.app import _sig

    assert [_sig(v) for v in (TINY_LOSS, 0.25, 0.41325, 0.0, 12345.678, None)] == [
        "-3.2e-06", "0.2500", "0.4133", "0", "1.235e+04", "—"]
    assert _sig(0.25, 5) == "0.25000" and _sig(12345.678, 5) == "12346"


# ---------------------------------------------------------------------- 9. "rolled back" on a call that was not


def _turn(body: str, index: int) -> str:
    """The HTML of the conversation's turn ``index``, from its opening tag (its classes) on."""
    start = body.rindex('<div class="turn ', 0, body.index(f'id="turn-{index}"'))
    end = body.find('<div class="turn ', start + 1)
    return body[start:end if end != -1 else len(body)]


def test_a_rollback_says_what_the_purified_row_holds(site, data):
    _, d, extra = data
    # not recovered: the purified row's turn IS the failed call, its error follows; the mark says so
    status, body, _ = _get(f"{site}/trajectories/{extra.unrecovered}")
    assert status == 200
    turn = _turn(body, extra.unrecovered_turn)
    assert "print(pow(2, n))" in turn and 'class="mark mark-warn"' in turn
    assert "not rolled back: this turn is the failed call as sampled (error); 3 correction(s) failed too" in turn
    assert f"the raw twin #{extra.unrecovered_raw} holds the corrections tried" in turn
    assert "tool-error" in _turn(body, extra.unrecovered_turn + 1)
    assert "replaced a failed call" not in body and "the correction that replaced it" not in body
    panel = body[body.index("CLEANER rollback"):]
    assert "not rolled back, every correction failed" in panel and "no: no correction ran" in panel
    assert "the failed call itself, as sampled" in panel and "the last correction tried (it failed too)" in panel
    # the raw twin's panel says the same of its purified row
    status, body, _ = _get(f"{site}/trajectories/{extra.unrecovered_raw}")
    assert f"what purified #{extra.unrecovered} holds at turn {extra.unrecovered_turn}" in body
    assert "the failed call itself, as sampled" in body
    # recovered: "rolled back", the correction that replaced it, the raw twin that keeps the error
    status, body, _ = _get(f"{site}/trajectories/{d.purified}")
    turn = _turn(body, d.purification_turn)
    assert 'class="mark mark-rollback"' in turn and "rolled back: this turn replaced a failed call (error) with a " \
        "correction that ran (" in turn and f"the raw twin #{d.raw} keeps the failed call and its error" in turn
    assert "yes: a correction ran" in body and "the correction that replaced it" in body


# ---------------------------------------------------------------------- 11. `reflexdb run` pointed only to MLflow


def test_reflexdb_run_ends_with_the_explorer_address_of_the_run(monkeypatch):
    from reflexdb.cli.launch import RunResult, summary

    monkeypatch.delenv("REFLEXDB_EXPLORER_URL", raising=False)
    said = summary("arithmetic-grpo", RunResult(exit_code=0, steps=3, version=3))
    assert "reflexdb ui   (then open http://127.0.0.1:5001/runs/arithmetic-grpo)" in said
    assert "http://127.0.0.1:5000" in said  # MLflow still
    monkeypatch.setenv("REFLEXDB_EXPLORER_URL", "https://lab.example/explorer/")
    assert "https://lab.example/explorer/runs/a%20b%2Fc)" in summary("a b/c", RunResult(exit_code=0))


# ---------------------------------------------------------------------- also: MLflow's links written at training time


def test_ui_points_the_mlflow_runs_links_at_the_address_it_serves(tmp_path, monkeypatch):
    from reflexdb.config import parse_config
    from reflexdb.tracking import EXPLORER_NOTE, Tracker, point_runs_at_explorer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("REFLEXDB_EXPLORER_URL", raising=False)
    learner = Tracker(parse_config({"run": "a b/c", "model": "tiny", "learner": {"tracking_uri": uri}}))
    evaluation = Tracker(parse_config({"run": "a b/c", "model": "tiny", "learner": {"tracking_uri": uri}}),
                         run_name="a b/c-eval-v1")
    edited = Tracker(parse_config({"run": "mine", "model": "tiny", "learner": {"tracking_uri": uri}}))
    edited.client.set_tag(edited.run_id, "mlflow.note.content", "my own notes")  # a person's description
    tags = learner.client.get_run(learner.run_id).data.tags
    assert tags["reflexdb.explorer"] == "http://127.0.0.1:5001/runs/a%20b%2Fc"  # written at training time

    # `reflexdb ui --port 5600` later: the explorer on 5601, and the links with it
    assert point_runs_at_explorer(uri, "http://127.0.0.1:5601") == 3
    for run in (learner, evaluation):
        tags = learner.client.get_run(run.run_id).data.tags
        assert tags["reflexdb.explorer"] == "http://127.0.0.1:5601/runs/a%20b%2Fc"
        assert tags["mlflow.note.content"].startswith(EXPLORER_NOTE)
        assert "(http://127.0.0.1:5601/runs/a%20b%2Fc/trajectories)" in tags["mlflow.note.content"]
        assert "5001" not in tags["mlflow.note.content"]
    tags = learner.client.get_run(edited.run_id).data.tags
    assert tags["reflexdb.explorer"] == "http://127.0.0.1:5601/runs/mine" and tags["mlflow.note.content"] == "my own notes"
    assert point_runs_at_explorer(uri, "http://127.0.0.1:5601") == 0  # nothing left to change
