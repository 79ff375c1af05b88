"""The explorer's grids in headless Chromium (issue 53, "completions in the tables";
explorer/tables.py, templates/_grid.html): the trajectory list and a group's page show prompt,
completion, reward, advantage and answer in one grid; what a model wrote (`<script>`, `<b>`, an
`<img onerror>` in a prompt, emoji, a very long text) shows as text; a completion's `<details>`
expands without script; a header link sorts. The server, the browser and the database of
tests/e2e/test_explorer_browser.py (its fixtures, a database of this module's own), plus run
``explorer-grid`` written here (a long completion, emoji, formulas).

With REFLEXDB_EXPLORER_SCREENSHOTS=<folder>: explorer-trajectories.png and explorer-group.png.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.e2e.test_explorer_browser import _css, _open, _shot, browser, data, site  # noqa: F401 - the fixtures
from tests.explorer_data import HOSTILE, HOSTILE_PROMPT

GRID = "explorer-grid"
LONG = 30_000  # characters of the long completion
EMOJI = "Thumbs up 👍🏽, family 👨‍👩‍👧, flag 🇺🇦: the answer is 42."


@pytest.fixture(scope="module")
def extra(data):  # noqa: F811
    """Run ``explorer-grid``: a completion of LONG characters, one with emoji, one starting with
    a formula; their ids by name."""
    from reflexdb import GroupIn, Store, TaskIn, TrajectoryIn, TurnIn

    url, _ = data
    store = Store.open(url)
    try:
        rng = np.random.default_rng(3)
        run = store.create_run(GRID)
        [task] = store.add_tasks(run, [TaskIn(f"Say it back: {HOSTILE_PROMPT}", "42")])
        texts = {"long": "A long answer begins here.\n" + "word " * (LONG // 5), "emoji": EMOJI,
                 "formula": '=HYPERLINK("http://evil.example/","click")\n' + HOSTILE}

        def row(text: str, reward: float | None) -> TrajectoryIn:
            return TrajectoryIn(response_ids=rng.integers(0, 49152, 6), logprobs=-rng.random(6).astype(np.float32),
                                prompt_ids=[1, 2, 3], reward=reward, correct=None if reward is None else reward > 0,
                                turns=[TurnIn("user", "q"), TurnIn("assistant", text, 0, 6)], extracted_answer="42",
                                error=None if reward is not None else "no reward")

        w = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0,
                                      trajectories=[row(texts["long"], 0.0), row(texts["emoji"], 1.0),
                                                    row(texts["formula"], None)]))
    finally:
        store.close()
    return dict(zip(("long", "emoji", "formula"), w.trajectory_ids)) | {"group": w.group_id}


def _row(driver, tid: int, table: str = "#trajectories"):
    """The grid's row of trajectory ``tid`` (the one whose link to it reads its id)."""
    for tr in _css(driver, f"{table} tbody tr"):
        if any(a.text == str(tid) for a in tr.find_elements("css selector", f'a[href="/trajectories/{tid}"]')):
            return tr
    raise AssertionError(f"no row of trajectory {tid} in {table}")


def _cell(tr, column: str):
    return tr.find_element("css selector", f"td.{column}")


def test_the_grid_shows_model_text_as_text_and_expands_without_script(browser, site, data):  # noqa: F811
    from selenium.common.exceptions import NoAlertPresentException

    _, d = data
    _open(browser, site, f"/runs/{d.run}/trajectories")
    heads = [h.text.split("\n")[0] for h in _css(browser, "#trajectories thead th")]
    assert heads[:9] == ["trajectory ▼", "origin", "kind", "version", "prompt", "completion", "reward", "advantage",
                         "correct"] and "answer" in heads
    script = _row(browser, d.script)
    assert _cell(script, "completion").text.startswith("Here it is as plain text: \\boxed{" + HOSTILE)
    assert HOSTILE in _cell(script, "answer").text
    assert not _css(browser, "#trajectories td b, #trajectories td script, img"), "model text became an element"
    hostile_prompt = _css(browser, "#trajectories td.prompt summary, #trajectories td.prompt .text")
    assert any(HOSTILE_PROMPT in e.text for e in hostile_prompt)
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - nothing ran
    # a multi-turn episode: the first line, then every assistant turn on expanding (<details>, no script)
    base = _row(browser, d.base)
    details = _cell(base, "completion").find_element("css selector", "details")
    full = details.find_element("css selector", ".full")
    assert details.find_element("css selector", "summary").text.startswith("Each of the 3 boxes holds 12 pencils")
    assert not full.is_displayed()
    details.find_element("css selector", "summary").click()
    assert full.is_displayed() and "Let me recount: 3 + 12 = 15 pencils" in full.text
    assert "(step 1)" in _cell(base, "advantage").text and "→" in _cell(base, "advantage").text
    if os.environ.get("REFLEXDB_EXPLORER_SCREENSHOTS"):  # the top of the list, its first completion expanded
        browser.execute_script("window.scrollTo(0, 0)")
        _css(browser, "#trajectories td.completion details summary")[0].click()
        _shot(browser, "explorer-trajectories.png", 1000)


def test_a_header_link_sorts_the_list_and_turns_round(browser, site, data):  # noqa: F811
    _, d = data
    _open(browser, site, f"/runs/{d.run}/trajectories")
    [link] = [a for a in _css(browser, "#trajectories thead a.sort") if a.text == "reward"]
    link.click()
    assert "sort=reward&dir=asc" in browser.current_url

    def rewards() -> list[str]:
        return [td.text.split(" ")[0] for td in _css(browser, "#trajectories tbody td.reward")]

    got = rewards()
    valued = [float(r) for r in got if r != "—"]
    assert valued == sorted(valued) and got[len(valued):] == ["—"] * (len(got) - len(valued)) and len(valued) < len(got)
    [link] = [a for a in _css(browser, "#trajectories thead a.sort") if a.text == "reward"]
    link.click()
    assert "sort=reward&dir=desc" in browser.current_url
    got = rewards()
    valued = [float(r) for r in got if r != "—"]
    assert valued == sorted(valued, reverse=True) and got[-1] == "—"  # no value last, this way too


def test_the_group_page_shows_its_responses_and_which_step_gave_the_advantages(browser, site, data):  # noqa: F811
    _, d = data
    _open(browser, site, f"/groups/{d.plain_group}")
    [adv] = [h for h in _css(browser, "#members thead th") if h.text.startswith("advantage")]
    assert "step 1" in adv.text and "group → positive_amplification" in adv.text
    completions = [c.text for c in _css(browser, "#members td.completion")]
    assert any(c.startswith("Average speed is distance divided by time") for c in completions)
    if os.environ.get("REFLEXDB_EXPLORER_SCREENSHOTS"):  # its first completion expanded
        _css(browser, "#members td.completion details summary")[0].click()
        _shot(browser, "explorer-group.png", 800)
    _open(browser, site, f"/groups/{d.compare_groups[1]}")
    [adv] = [h for h in _css(browser, "#members thead th") if h.text.startswith("advantage")]
    assert "not trained yet" in adv.text
    _open(browser, site, f"/groups/{d.script_group}")
    assert any(HOSTILE in c.text for c in _css(browser, "#members td.completion"))
    assert not _css(browser, "#members td b, img")


def test_long_text_is_cut_with_a_link_and_emoji_and_formulas_show_as_written(browser, site, extra):  # noqa: F811
    _open(browser, site, f"/groups/{extra['group']}")
    rows = {tr.find_element("css selector", "td:nth-child(2) a").text: tr for tr in _css(browser, "#members tbody tr")}
    long = rows[str(extra["long"])]
    details = _cell(long, "completion").find_element("css selector", "details")
    assert details.find_element("css selector", "summary").text == "A long answer begins here."
    details.find_element("css selector", "summary").click()
    note = details.find_element("css selector", ".cut")
    assert note.is_displayed() and "cut at 2,000 characters of 30.0 kB" in note.text
    assert note.find_element("css selector", "a").get_attribute("href").endswith(f"/trajectories/{extra['long']}")
    assert len(details.find_element("css selector", ".full").text) <= 2_000
    assert _cell(rows[str(extra["emoji"])], "completion").text == EMOJI
    formula = _cell(rows[str(extra["formula"])], "completion")
    assert formula.text.startswith('=HYPERLINK("http://evil.example/","click")')
    assert not _css(browser, "#members td b, img")
