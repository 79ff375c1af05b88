"""The run page's curves in a real headless Chromium (issue 53, "curves on the run page", "two runs'
curves on one chart"): the charts render as inline SVG under the explorer's Content-Security-Policy
with nothing blocked (the browser's console stays free of errors), a metric name holding markup
stays text, and another run's curves are drawn on the same charts by the run page's form and by
the runs list's, as a person would use them (no script: a GET form and a redirect).

The database is the browser test's (tests/explorer_data.py) plus two runs of 240 learner steps with
the metrics a learner records, a method's own prefix, a hostile metric name and held-out
evaluations. With REFLEXDB_EXPLORER_SCREENSHOTS=<folder>, writes explorer-run.png and
explorer-run-compare.png there (docs/explorer.md).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.test_explorer_browser import CHROMEDRIVER, CHROMIUM, _css, _open, _shot, data, site  # noqa: F401
from tests.explorer_data import HOSTILE, HOSTILE_PROMPT

STEPS = 240
HOSTILE_METRIC = f"{HOSTILE}/{HOSTILE_PROMPT}"


def _metrics(rng: np.random.Generator, step: int, lift: float) -> dict[str, float]:
    """A learner step's metrics, shaped like a run's: reward rising with noise, small losses."""
    p = 0.25 + lift * (1 - math.exp(-step / 80)) + rng.normal(0, 0.03)
    return {
        "reward/mean": round(p + rng.normal(0, 0.02), 5), "reward/pass_at_1": round(p - 0.03, 5),
        "reward/missing": float(rng.integers(0, 2)),
        "loss/policy": float(rng.normal(0, 3e-3)), "loss/kl": round(2e-4 * step ** 0.5 + rng.normal(0, 1e-4), 7),
        "staleness/mean": round(1 + rng.random(), 3), "staleness/max": float(rng.integers(2, 4)),
        "perf/tokens_per_s": round(2100 + rng.normal(0, 120), 1), "perf/step_seconds": round(4 + rng.random(), 3),
        "groups/none_pass": float(rng.integers(0, 8)), "groups/all_pass": float(rng.integers(0, 8)),
        "policy/entropy": round(0.9 - step / 600 + rng.normal(0, 0.02), 4),
        "aux/share": round(0.2 + 0.1 * math.sin(step / 20), 4),
        HOSTILE_METRIC: 1.0,
    }


@pytest.fixture(scope="module")
def runs(data):
    """Two runs of STEPS learner steps ("curves-a" learns faster) with held-out evaluations."""
    from reflexdb import GroupIn, Store, TaskIn
    from tests.factories import make_group, make_trajectory

    url, _ = data
    store = Store.open(url)
    rng = np.random.default_rng(7)
    try:
        for name, lift in (("curves-a", 0.5), ("curves-b", 0.3)):
            run = store.create_run(name, algorithm="grpo", config={"model": "smollm2"})
            [task, held_out] = store.add_tasks(run, [TaskIn(prompt="What is 2+3?", ground_truth="5"),
                                                     TaskIn(prompt="What is 9+9?", ground_truth="18", split="eval")])
            ids = store.write_group(make_group(rng, run, task, size=4)).trajectory_ids
            for step in range(1, STEPS + 1):
                # each step consumes the same 4 rows: the curves need steps, not data
                store.record_step(run, step, step - 1, ids, loss=float(rng.normal(0, 3e-3)),
                                  metrics=_metrics(rng, step, lift))
            for version in range(0, STEPS + 1, 40):
                solved = 0.25 + lift * (1 - math.exp(-version / 80))
                trajs = [make_trajectory(rng, correct=bool(rng.random() < solved)) for _ in range(16)]
                store.write_group(GroupIn(run_id=run, task_id=held_out, policy_version=version, workflow="eval",
                                          kind="eval", trajectories=trajs))
    finally:
        store.close()
    return "curves-a", "curves-b"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium as the browser test's, with the console's messages kept (CSP reports)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("these tests need Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,1000", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _console_errors(browser) -> list[str]:
    """The console's errors and warnings since the last call (a CSP violation is logged as one), but
    for the favicon the explorer does not serve."""
    return [e["message"] for e in browser.get_log("browser")
            if e["level"] in ("SEVERE", "WARNING") and "/favicon.ico" not in e["message"]]


def _wait_for(browser, url_part: str) -> None:
    """Until the page the browser shows is one whose address holds ``url_part`` (a form's GET)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 30).until(lambda b: url_part in b.current_url
                                      and b.execute_script("return document.readyState") == "complete")


def _series(chart) -> list[str]:
    return [g.get_attribute("data-name") for g in chart.find_elements("css selector", "g.series")]


def test_the_run_page_draws_its_curves_under_the_policy(browser, site, runs):
    a, _ = runs
    _console_errors(browser)
    _open(browser, site, f"/runs/{a}")
    charts = _css(browser, "#curves figure.chart svg")
    assert len(charts) >= 6 + 4  # the fixed six and a chart per other prefix (aux, groups, perf, policy, ...)
    for svg in charts:
        assert svg.is_displayed() and svg.size["width"] > 300 and svg.size["height"] > 150
    by_id = {svg.get_attribute("id"): svg for svg in charts}
    for cid in ("chart-reward", "chart-pass-at-1", "chart-evaluations", "chart-loss", "chart-staleness",
                "chart-tokens-per-s"):
        assert by_id[cid].find_elements("css selector", "polyline"), cid
    assert _series(by_id["chart-loss"]) == ["loss", "loss/kl", "loss/policy"]
    assert _series(by_id["chart-evaluations"]) == ["pass@1"]
    aux = [svg for svg in charts if _series(svg) == ["aux/share"]]
    assert aux and aux[0].find_elements("css selector", "polyline")
    # the run's steps table is still there, below
    assert _css(browser, "#steps tbody tr")
    assert _console_errors(browser) == []
    _shot(browser, "explorer-run.png", 1250)


def test_a_metric_name_with_markup_stays_text(browser, site, runs):
    from selenium.common.exceptions import NoAlertPresentException

    a, _ = runs
    _open(browser, site, f"/runs/{a}")
    [hostile] = [svg for svg in _css(browser, "#curves svg") if HOSTILE_METRIC in _series(svg)]
    assert '<script>alert("x")' in hostile.text  # the legend's text, as written
    assert not _css(browser, "#curves script, #curves img, #curves b")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - nothing ran
    assert _console_errors(browser) == []


def test_another_runs_curves_on_the_same_charts_from_the_run_page(browser, site, runs):
    from selenium.webdriver.support.ui import Select

    a, b = runs
    _open(browser, site, f"/runs/{a}")
    Select(browser.find_element("css selector", "#curves form.beside select[name=with]")).select_by_value(b)
    browser.find_element("css selector", "#curves form.beside button").click()
    _wait_for(browser, f"with={b}")
    reward = browser.find_element("css selector", "svg#chart-reward")
    assert _series(reward) == [f"{a} · reward/mean", f"{b} · reward/mean"]
    assert len(reward.find_elements("css selector", "polyline")) == 2
    colours = {p.get_attribute("stroke") for p in reward.find_elements("css selector", "polyline")}
    assert len(colours) == 2
    assert set(_series(browser.find_element("css selector", "svg#chart-evaluations"))) == {
        f"{a} · pass@1", f"{b} · pass@1"}
    assert _console_errors(browser) == []
    _shot(browser, "explorer-run-compare.png", 900)
    # back to the run alone
    browser.find_element("link text", "this run alone").click()
    _wait_for(browser, f"/runs/{a}#curves")
    assert _series(browser.find_element("css selector", "svg#chart-reward")) == ["reward/mean"]


def test_the_runs_list_opens_two_runs_curves(browser, site, runs):
    from selenium.webdriver.support.ui import Select

    a, b = runs
    _open(browser, site, "/")
    form = browser.find_element("css selector", "form#compare-runs")
    Select(form.find_element("css selector", "select[name=run]")).select_by_value(b)
    Select(form.find_element("css selector", "select[name=with]")).select_by_value(a)
    form.find_element("css selector", "button").click()
    _wait_for(browser, f"/runs/{b}?with={a}")
    assert _series(browser.find_element("css selector", "svg#chart-reward")) == [f"{b} · reward/mean",
                                                                                    f"{a} · reward/mean"]
    # an unknown run is refused by name
    _console_errors(browser)
    browser.get(f"{site}/runs/{a}?with=no-such-run")
    assert "no run named 'no-such-run' to draw beside run 'curves-a'" in browser.find_element("id", "message").text


def test_the_fixture_runs_pages_draw_their_few_steps(browser, site, data):
    _, d = data
    _open(browser, site, f"/runs/{d.run}")
    reward = browser.find_element("css selector", "svg#chart-reward")
    assert len(reward.find_elements("css selector", "circle")) == len(d.steps)  # a marker per step
    evaluations = browser.find_element("css selector", "svg#chart-evaluations")
    assert evaluations.find_elements("css selector", "circle")  # the eval group at version 2
    _open(browser, site, f"/runs/{d.tools_run}")  # no learner step: every chart says so
    assert all("no value recorded" in svg.text for svg in _css(browser, "#curves svg"))
