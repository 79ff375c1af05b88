"""The trajectory explorer in a real headless Chromium (Debian's chromium and chromedriver, driven
by Selenium), served as `reflexdb ui` serves it (its own process, the read-only role), on a
database with rows of every origin and every lineage link (tests/explorer_data.py): each page
renders, lineage links resolve both ways, a tool error and a pivot are visible, a trajectory whose
text holds `<script>` shows it as text.

With REFLEXDB_EXPLORER_SCREENSHOTS=<folder>, the pages' screenshots in docs/ are written there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import _drop_database, _new_database

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = os.environ.get("REFLEXDB_EXPLORER_SCREENSHOTS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data(pg_server_url, template_db, model_cache):
    from reflexdb import Store, roles
    from tests.explorer_data import populate

    name, url = _new_database(pg_server_url, template_db)
    store = Store.open(url)
    try:
        roles.apply(store.engine)
        made = populate(store)
    finally:
        store.close()
    yield url, made
    _drop_database(pg_server_url, name)


@pytest.fixture(scope="module")
def site(data, model_cache, tmp_path_factory):
    url, _ = data
    port = _free_port()
    env = dict(os.environ, REFLEXDB_MODEL_CACHE=str(model_cache))
    log = tmp_path_factory.mktemp("explorer") / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "reflexdb.explorer.serve", "--url", url, "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(base + "/health", timeout=2).read()
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the explorer did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
    yield base
    proc.terminate()
    proc.wait(30)
    print(log.read_text()[-5000:])  # the server's messages, shown with a failure


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("these tests need Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch a driver
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,1000", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _open(browser, base: str, path: str):
    from selenium.webdriver.common.by import By

    browser.get(base + path)
    h1 = browser.find_element(By.TAG_NAME, "h1").text
    assert h1 not in ("not found", "error", "bad request"), (path, browser.find_element(By.TAG_NAME, "main").text[:500])
    return browser


def _css(browser, selector: str):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, selector)


def _shot(browser, name: str, height: int | None = None) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        if height:
            browser.set_window_size(1360, height)
        browser.save_screenshot(str(Path(SHOTS) / name))
        browser.set_window_size(1360, 1000)


def _lineage(browser) -> dict[str, str]:
    """Each lineage link on the page: its href -> its relation text."""
    return {a.get_attribute("href"): a.find_element("xpath", "..").text for a in _css(browser, "#lineage a.lineage")}


def _every_trajectory(d) -> list[int]:
    return [d.base, d.reflection, d.guided_retry, d.distilled, d.other_base, d.other_reflection, d.filled,
            d.hinted, d.hinted_replaces, *d.lte_replayed, d.replayed, d.replay_source, d.replayed_negative,
            d.negative_source, d.script, d.imported, d.raw, d.purified, d.clean_raw, *d.plain]


def test_every_list_page_renders(browser, site, data):
    _, d = data
    origins: set[str] = set()
    for run in (d.run, d.tools_run):
        for path in ("/", f"/runs/{run}", f"/runs/{run}/groups", f"/runs/{run}/trajectories"):
            _open(browser, site, path)
        assert _css(browser, "#trajectories tbody tr .origin"), "no trajectory listed"
        # a run's filter offers the origins its rows have (issue 53)
        origins |= {e.get_attribute("value") for e in _css(browser, "select[name=origin] option")} - {""}
    # every origin is listed in one run or the other, and its filter keeps only its own
    assert len(origins) >= 9
    for origin in sorted(origins):
        shown: set[str] = set()
        for run in (d.run, d.tools_run):
            _open(browser, site, f"/runs/{run}/trajectories?origin={origin}")
            here = {e.text for e in _css(browser, "#trajectories tbody .origin")}
            assert here <= {origin}, (origin, here)
            shown |= here
        assert shown == {origin}, f"no row of origin {origin} in the test data"
    _open(browser, site, f"/runs/{d.run}/groups")
    _shot(browser, "explorer-groups.png", 900)


def test_every_trajectory_page_renders_and_its_lineage_resolves_both_ways(browser, site, data):
    _, d = data
    for tid in _every_trajectory(d):
        _open(browser, site, f"/trajectories/{tid}")
        assert _css(browser, "#conversation .turn"), tid
        for href in _lineage(browser):
            _open(browser, site, href.removeprefix(site))
    pairs = [(d.base, d.distilled), (d.base, d.guided_retry), (d.base, d.reflection), (d.raw, d.purified),
             (d.replay_source, d.replayed)]
    for parent, child in pairs:
        _open(browser, site, f"/trajectories/{child}")
        assert any(h.endswith(f"/trajectories/{parent}") and r.startswith("parent") for h, r in _lineage(browser).items())
        _open(browser, site, f"/trajectories/{parent}")
        assert any(h.endswith(f"/trajectories/{child}") and r.startswith("made from it") for h, r in
                   _lineage(browser).items()), (parent, child, _lineage(browser))
    # R3L: the retry and its twin name each other through their reflection
    _open(browser, site, f"/trajectories/{d.guided_retry}")
    assert any(h.endswith(f"/trajectories/{d.distilled}") and "same reflection" in r for h, r in _lineage(browser).items())
    assert any("R3L reflection" in p.text for p in _css(browser, ".panel h2"))
    # LTE: a hinted rollout -> its hint's group, and back from a row of that group
    _open(browser, site, f"/trajectories/{d.hinted}")
    assert any(h.endswith(f"/groups/{d.hint_group}") for h in _lineage(browser))
    assert any("LTE hint" in p.text for p in _css(browser, ".panel h2"))
    _open(browser, site, f"/groups/{d.hint_group}")
    member = _css(browser, "#members tbody tr td:nth-child(2) a")[0].get_attribute("href")
    _open(browser, site, member.removeprefix(site))
    assert any(h.endswith(f"/trajectories/{d.hinted}") for h in _lineage(browser))
    # an imported row -> the rows of its file, which list it
    _open(browser, site, f"/trajectories/{d.imported}")
    [to_file] = [h for h, r in _lineage(browser).items() if r.startswith("imported from")]
    _open(browser, site, to_file.removeprefix(site))
    assert str(d.imported) in {e.text for e in _css(browser, "#trajectories tbody td:first-child a")}


def test_a_tool_error_and_its_rollback_are_visible(browser, site, data):
    _, d = data
    _open(browser, site, f"/trajectories/{d.raw}")
    failed = _css(browser, ".turn.tool-error")
    assert failed and failed[0].is_displayed()
    assert "tool error" in failed[0].text and "sandbox record: error" in failed[0].text
    [panel] = [p for p in _css(browser, ".panel") if "CLEANER rollback" in p.text]
    assert "failed call" in panel.text and "the correction that replaced it" in panel.text
    _shot(browser, "explorer-rollback.png", 1500)
    _open(browser, site, f"/trajectories/{d.purified}")
    assert any("rolled back" in m.text for m in _css(browser, ".mark-rollback"))


def test_the_pivot_is_marked_at_its_token(browser, site, data):
    _, d = data
    for tid in (d.base, d.distilled):
        _open(browser, site, f"/trajectories/{tid}")
        [pivot] = _css(browser, ".tokens .mark-inline.mark-pivot")
        assert pivot.is_displayed() and "pivot" in pivot.text
    _open(browser, site, f"/trajectories/{d.distilled}")
    _shot(browser, "explorer-trajectory.png", 1700)
    # shading: every assistant token has a background from its log-prob, and the mask is shown
    tokens = _css(browser, ".tokens .tok")
    assert tokens and all("background" in (t.get_attribute("style") or "") for t in tokens)


def test_model_text_with_script_renders_as_text(browser, site, data):
    from selenium.common.exceptions import NoAlertPresentException

    _, d = data
    _open(browser, site, f"/trajectories/{d.script}")
    assert '<script>alert("x")</script>' in browser.find_element("css selector", "#answer").text
    assert '<script>alert("x")</script>' in browser.find_element("css selector", "#conversation").text
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - nothing ran
    assert not _css(browser, "#conversation b, #outcome b"), "the model's <b> became an element"
    assert not _css(browser, "img"), "the task's <img onerror> became an element"
    _open(browser, site, f"/runs/{d.run}/trajectories?q=%3Cscript%3E")
    assert str(d.script) in {e.text for e in _css(browser, "#trajectories tbody td:first-child a")}
    assert not _css(browser, "img")


def test_a_learner_step_shows_its_rows_advantages_and_loss_terms(browser, site, data):
    _, d = data
    step = d.steps[-1]
    _open(browser, site, f"/runs/{d.run}/steps/{step}")
    terms = browser.find_element("css selector", "#loss-terms").text
    assert "loss/policy" in terms
    rows = _css(browser, "table.step-group tbody tr")
    assert rows
    assert any("→" in r.text for r in rows), "no row shows its advantage after each stage"
    _shot(browser, "explorer-step.png", 1300)
    # from the run's page to the step, and from the step to a row
    _open(browser, site, f"/runs/{d.run}")
    link = [a for a in _css(browser, "#steps a") if a.text == str(step)][0].get_attribute("href")
    _open(browser, site, link.removeprefix(site))
    row = _css(browser, "table.step-group tbody td:nth-child(2) a")[0].get_attribute("href")
    _open(browser, site, row.removeprefix(site))
    assert f"step {step}" in browser.find_element("css selector", "#trained-in").text


def test_compare_shows_the_first_and_last_answers_side_by_side(browser, site, data):
    _, d = data
    _open(browser, site, f"/runs/{d.run}/tasks/{d.task_compare}")
    first = browser.find_element("css selector", "#first-answer").text
    last = browser.find_element("css selector", "#last-answer").text
    assert f"version {d.first_version}" in first and f"version {d.last_version}" in last
    _shot(browser, "explorer-compare.png", 1000)
