"""Two trajectories side by side and the trace of an episode in a real headless Chromium (issue 53),
on the explorer's fixture database (tests/explorer_data.py) plus a pair of its own whose turns hold
what a model can write: ``<script>``, an ``<img onerror>``, emoji (a ZWJ sequence among them) and a
long text with one change in its middle. The pages are reached as a person reaches them: the
lineage's "compare side by side", the group page's form, the trajectory page's "trace view".

With REFLEXDB_EXPLORER_SCREENSHOTS=<folder>, explorer-diff.png and explorer-trace.png are written there.
"""

# ruff: noqa: F811 - the tests take the fixtures imported from test_explorer_browser as arguments

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_explorer_browser import _css, _open, _shot, browser, data, site  # noqa: F401 - fixtures
from tests.explorer_data import HOSTILE, HOSTILE_PROMPT

EMOJI = "😀👩\u200d💻🇫🇷"
#: the long turn: numbered lines of code, the same on both sides but for one line in the middle
LONG = "".join(f"total = total + {i}  # step {i}\n" for i in range(4_000))


def _hostile_pair(store, run: int) -> tuple[int, int]:
    """Two rows of one group: a long first turn that differs in one line, a tool call each (one
    failed), and answers holding HOSTILE, HOSTILE_PROMPT and emoji."""
    from reflexdb import GroupIn, TaskIn, TrajectoryIn, TurnIn

    [task] = store.add_tasks(run, [TaskIn(f"Sum it, then repeat {HOSTILE_PROMPT} {EMOJI}", "42",
                                          dataset="side-by-side")])
    ids = []
    for k, (changed, status, wall) in enumerate(((f"total = total + {HOSTILE}\n", "error", 0.2503),
                                                 (f"total = total + 2000  # {EMOJI}\n", "ok", 0.0721))):
        text = f"{EMOJI} Let me add them up.\n```python\n" + LONG.replace("total = total + 2000  # step 2000\n",
                                                                          changed) + "```"
        output = f"NameError: {HOSTILE}" if status == "error" else f"7998000 {EMOJI}"
        turns = [TurnIn("user", f"Sum it, then repeat {HOSTILE_PROMPT} {EMOJI}"),
                 TurnIn("assistant", text, 0, 10, attempt=0),
                 TurnIn("tool", output, 10, 14, tool_error=status == "error", attempt=0,
                        tool_call={"status": status, "exit_code": int(status != "ok"), "detail": None, "wall_s": wall,
                                   "cpu_s": round(wall * 0.8, 4), "memory_peak_mb": 9.5}),
                 TurnIn("assistant", f"The answer is {HOSTILE if k == 0 else EMOJI} \\boxed{{42}}", 14, 20, attempt=1)]
        ids.append(TrajectoryIn(prompt_ids=np.arange(4, dtype=np.int32), response_ids=np.arange(20, dtype=np.int32) + 9,
                                logprobs=-np.full(20, 0.2, np.float32), reward=float(k), correct=bool(k), turns=turns,
                                extracted_answer=HOSTILE if k == 0 else f"42 {EMOJI}", origin="base",
                                # the second row's engine calls timed, as a collector records them
                                meta={} if k == 0 else {"generations": [
                                    {"attempt": 0, "tokens": 10, "wall_s": 0.412, "rows": 16},
                                    {"attempt": 1, "tokens": 6, "wall_s": 0.118, "rows": 3}]}))
    w = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=ids, workflow="group",
                                  kind="fresh"))
    return w.trajectory_ids[0], w.trajectory_ids[1]


@pytest.fixture(scope="module")
def pair(data) -> tuple[int, int]:
    """The hostile pair (:func:`_hostile_pair`), written into the same database."""
    from reflexdb import Store

    url, made = data
    store = Store.open(url)
    try:
        return _hostile_pair(store, made.tools_run_id)
    finally:
        store.close()


def _follow(driver, element, url_end: str) -> None:
    """Click ``element`` (a link, a form's button) and wait for the page it opens, ending in ``url_end``."""
    from selenium.webdriver.support.ui import WebDriverWait

    element.click()
    WebDriverWait(driver, 30).until(lambda b: b.current_url.endswith(url_end)
                                    and b.execute_script("return document.readyState") == "complete")


def _no_script_ran(driver) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - nothing ran
    assert not _css(driver, "img"), "a model's <img onerror> became an element"
    assert not _css(driver, "#turn-pairs b, #side-facts b, #trace b"), "a model's <b> became an element"


def test_a_child_and_its_parent_side_by_side_from_the_lineage(browser, site, data):
    _, d = data
    _open(browser, site, f"/trajectories/{d.purified}")
    [link] = [a for a in _css(browser, "#lineage a.side-by-side")
              if a.get_attribute("href").endswith(f"/trajectories/{d.raw}/vs/{d.purified}")]
    _follow(browser, link, f"/trajectories/{d.raw}/vs/{d.purified}")
    assert "was made from trajectory" in browser.find_element("css selector", "#relation").text
    differs = _css(browser, "#side-facts tr.differs")
    assert any(r.text.startswith("origin") for r in differs)
    # the failed call and its error are only on the left; the changed words are marked on both sides
    assert any("NameError" in e.text for e in _css(browser, "#turn-pairs tr.how-only"))
    assert any(e.is_displayed() and e.text.strip() for e in _css(browser, "#turn-pairs del"))
    assert any(e.is_displayed() and e.text.strip() for e in _css(browser, "#turn-pairs ins"))
    # identical turns are folded: their text is there, closed
    assert _css(browser, "#turn-pairs tr.how-same details:not([open])")
    _shot(browser, "explorer-diff.png", 1500)


def test_two_rows_of_a_group_from_its_form(browser, site, data):
    from selenium.webdriver.support.ui import Select

    _, d = data
    _open(browser, site, f"/groups/{d.plain_group}")
    Select(browser.find_element("css selector", "#side-pick select[name=a]")).select_by_value(str(d.plain[0]))
    Select(browser.find_element("css selector", "#side-pick select[name=b]")).select_by_value(str(d.plain[2]))
    _follow(browser, browser.find_element("css selector", "#side-pick button"),
            f"/trajectories/{d.plain[0]}/vs/{d.plain[2]}")
    assert f"two rows of group {d.plain_group}" in browser.find_element("css selector", "#relation").text
    answers = [r for r in _css(browser, "#side-facts tr") if r.text.startswith("answer")]
    assert answers and "168" in answers[0].text and "21" in answers[0].text  # the last attempts' answers
    # and "the best row against each other row"
    _open(browser, site, f"/groups/{d.plain_group}")
    best = d.plain[d.plain_rewards.index(1.0)]
    vs = [a.get_attribute("href") for a in _css(browser, "#side-best a.vs-best")]
    assert len(vs) == len(d.plain) - 1 and all(f"/trajectories/{best}/vs/" in h for h in vs)


def test_hostile_text_and_emoji_are_text_side_by_side(browser, site, data, pair):
    _, d = data
    left, right = pair
    _open(browser, site, f"/trajectories/{left}/vs/{right}")
    pairs = browser.find_element("css selector", "#turn-pairs")
    assert HOSTILE in pairs.text and EMOJI in pairs.text
    # the prompt is the same on both sides: folded, its text there as text
    assert HOSTILE_PROMPT in pairs.get_attribute("textContent") and HOSTILE_PROMPT not in pairs.text
    facts = browser.find_element("css selector", "#side-facts").text
    assert HOSTILE in facts and f"42 {EMOJI}" in facts
    _no_script_ran(browser)
    # the long turn: its one changed line is shown, marked, with the unchanged lines around it cut
    changed = [e.text for e in _css(browser, "#turn-pairs del")]
    assert any(HOSTILE in t for t in changed), changed
    assert any(EMOJI in e.text for e in _css(browser, "#turn-pairs ins"))
    assert any("unchanged characters" in e.text for e in _css(browser, "#turn-pairs .skipped"))
    # the fixture's own row of <script> against its sibling
    _open(browser, site, f"/groups/{d.script_group}")
    [link] = _css(browser, "#side-best a.vs-best")  # the right answer against the row of <script>
    assert link.get_attribute("href").endswith(f"/vs/{d.script}")
    _follow(browser, link, f"/vs/{d.script}")
    assert '<script>alert("x")</script>' in browser.find_element("css selector", "#turn-pairs").text
    _no_script_ran(browser)


def test_the_trace_of_an_episode_from_its_page(browser, site, data):
    _, d = data
    _open(browser, site, f"/trajectories/{d.raw}")
    _follow(browser, browser.find_element("css selector", "#trace-link"), f"/trajectories/{d.raw}/trace")
    assert browser.find_element("css selector", "#tool-total").text == "79.8 ms"
    bars = _css(browser, "#trace .span-row.kind-tool .bar")
    assert len(bars) == 2 and all(b.is_displayed() and b.size["width"] > 10 for b in bars)
    # the failed call's bar is drawn first, longer than the second (41.2 ms and 38.6 ms)
    assert bars[0].location["x"] < bars[1].location["x"] and bars[0].size["width"] > bars[1].size["width"]
    assert _css(browser, "#trace .span-row.kind-tool.failed")
    generations = _css(browser, "#trace .span-row.kind-generation")
    assert len(generations) == 3 and all("not timed" in g.text and "tokens" in g.text for g in generations)
    assert all(m.is_displayed() for m in _css(browser, "#trace .untimed-mark"))


def test_a_trace_with_timed_engine_calls(browser, site, pair):
    _, right = pair
    _open(browser, site, f"/trajectories/{right}/trace")
    assert browser.find_element("css selector", "#tool-total").text == "72.1 ms"
    assert browser.find_element("css selector", "#generation-total").text == "530 ms"  # 412 + 118 ms
    generations = _css(browser, "#trace .span-row.kind-generation")
    assert [g.find_element("css selector", ".span-time").text.split("\n") for g in generations] == [
        ["412 ms", "a call of 16 rows"], ["118 ms", "a call of 3 rows"]]
    bars = [r.find_element("css selector", ".bar") for r in generations + _css(browser, "#trace .span-row.kind-tool")]
    assert all(b.is_displayed() and b.size["width"] > 5 for b in bars)
    # in turn order along the axis: the first generation, its tool call, the second generation
    assert bars[0].location["x"] < bars[2].location["x"] < bars[1].location["x"]
    assert not _css(browser, "#trace .untimed-mark")
    _shot(browser, "explorer-trace.png", 900)


def test_hostile_text_is_text_in_the_trace(browser, site, pair):
    left, _ = pair
    _open(browser, site, f"/trajectories/{left}/trace")
    labels = browser.find_element("css selector", "#trace").text
    assert EMOJI in labels and "NameError: " + HOSTILE in labels
    assert browser.find_element("css selector", "#tool-total").text == "250 ms"
    _no_script_ran(browser)
