"""Issue 53's rough edges of the explorer that a browser or a server process shows (the HTTP ones
are tests/store/test_explorer_rough_edges.py): the outcome table's values aligned (item 10), the
"compare across versions" link followed (item 5), and MLflow's links to the explorer leading to
the explorer `reflexdb ui --port` serves, whatever port (the "Also" paragraph). In Debian's
headless Chromium, on tests/explorer_data.py's database (hostile strings included), with the
fixtures of tests/e2e/test_explorer_browser.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import _drop_database, _new_database
from tests.e2e.test_explorer_browser import _css, _free_port, _open, browser, data, site  # noqa: F401 - fixtures

#: the text of each cell: its left edge and its first line's top and bottom (a Range over the cell's
#: contents; WebDriver's script runs outside the page's Content-Security-Policy, the page runs none)
CELLS = """
const out = [];
for (const row of document.querySelectorAll(arguments[0] + ' tr')) {
  const cells = [];
  for (const cell of row.children) {
    const range = document.createRange();
    range.selectNodeContents(cell);
    const first = range.getClientRects()[0];
    cells.push({tag: cell.tagName, text: cell.textContent.trim(), left: range.getBoundingClientRect().left,
                top: first ? first.top : null, bottom: first ? first.bottom : null});
  }
  out.push(cells);
}
return out;
"""


def test_the_outcome_tables_values_start_at_one_edge(browser, site, data):  # noqa: F811
    _, d = data
    # the hostile row (its answer and ground truth are HTML a model wrote), the row whose reward
    # function failed (NULL reward, an error), a CLEANER row, an imported one
    for tid in (d.script, d.null_reward, d.purified, d.imported):
        _open(browser, site, f"/trajectories/{tid}")
        rows = browser.execute_script(CELLS, "#outcome")
        values = [r[1] for r in rows]
        assert len(values) >= 6 and {v["tag"] for v in values} == {"TD"}
        # the reward and the confidence (numbers) began at the right edge, the rest at the left
        lefts = {round(v["left"]) for v in values}
        assert len(lefts) == 1, (tid, [(v["text"][:20], round(v["left"])) for v in values])
        for key, value in rows:  # each key beside its value's first line
            assert abs(key["bottom"] - value["bottom"]) <= 2, (tid, key["text"], value["text"][:40])
    _open(browser, site, f"/trajectories/{d.script}")
    assert browser.find_element("css selector", "#answer").text == '<script>alert("x")</script><b>bold</b>'
    assert not _css(browser, "#outcome b, img")


def test_compare_across_versions_is_a_link_to_the_task_page(browser, site, data):  # noqa: F811
    _, d = data
    _open(browser, site, f"/trajectories/{d.plain[0]}")
    [link] = [a for a in _css(browser, "#where a") if a.text == "compare across versions"]
    link.click()
    assert browser.find_element("css selector", "h1").text == f"Task {d.task_compare} across policy versions"
    assert f"version {d.last_version}" in browser.find_element("css selector", "#last-answer").text


def test_mlflow_links_lead_to_the_explorer_ui_serves_on_any_port(browser, pg_server_url, template_db, tmp_path):  # noqa: F811
    """The learner wrote its MLflow run's links for the default address (:5001); `reflexdb ui
    --port P --explorer-port E` later points them at E, and the link opens the run's page."""
    from mlflow.tracking import MlflowClient

    from reflexdb import Store
    from reflexdb.config import parse_config
    from reflexdb.tracking import Tracker
    from tests.factories import setup_run

    home = tmp_path / "home"
    home.mkdir()
    uri = f"sqlite:///{home / 'mlflow.db'}"  # the store `reflexdb ui` serves by default
    name, url = _new_database(pg_server_url, template_db)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "REFLEXDB_EXPLORER_URL")}
    env["REFLEXDB_HOME"] = str(home)
    proc = None
    try:
        store = Store.open(url)
        setup_run(store, "linked <b>run</b>", n_tasks=1)  # a name that must be quoted and escaped
        store.close()
        code = ("from reflexdb.config import parse_config; from reflexdb.tracking import Tracker; "
                f"Tracker(parse_config({{'run': 'linked <b>run</b>', 'model': 'tiny', "
                f"'learner': {{'tracking_uri': {uri!r}}}}}))")
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)  # the learner, at training time
        client = MlflowClient(tracking_uri=uri)
        [run] = client.search_runs([client.get_experiment_by_name("reflexdb/linked <b>run</b>").experiment_id])
        assert run.data.tags["reflexdb.explorer"] == "http://127.0.0.1:5001/runs/linked%20%3Cb%3Erun%3C%2Fb%3E"

        port, explorer_port = _free_port(), _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "reflexdb.cli.main", "ui", "--port", str(port),
                                 "--explorer-port", str(explorer_port), "--url", url], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        want = f"http://127.0.0.1:{explorer_port}/runs/linked%20%3Cb%3Erun%3C%2Fb%3E"
        deadline = time.monotonic() + 180
        while client.get_run(run.info.run_id).data.tags["reflexdb.explorer"] != want:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "`reflexdb ui` did not point the MLflow run at its explorer"
            time.sleep(1)
        note = client.get_run(run.info.run_id).data.tags["mlflow.note.content"]
        assert f"]({want}/trajectories)" in note and "5001" not in note
        with urllib.request.urlopen(want, timeout=30) as resp:
            assert resp.status == 200
        _open(browser, "", want)
        assert browser.find_element("css selector", "h1").text == "Run linked <b>run</b>"
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        _drop_database(pg_server_url, name)
