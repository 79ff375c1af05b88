"""The trajectory page's token view in headless Chromium (issue 53): the legend is drawn and
visible, choosing a colour map by its link reshades the tokens and redraws the legend, an emoji
split across byte-level tokens renders as the emoji (rough edge 6), the learner signals are in
the tooltips, and a model's ``<script>`` in the conversation is shown as text and never runs.

The server is `reflexdb ui`'s (tests/e2e/test_explorer_browser.py's ``site`` and ``browser``
fixtures) on a database of its own: the rows of tests/store/test_explorer_tokens.py. With
REFLEXDB_EXPLORER_SCREENSHOTS=docs the test writes docs/explorer-tokens.png.
"""

from __future__ import annotations

import pytest

from tests.conftest import _drop_database, _new_database
from tests.e2e.test_explorer_browser import _css, _open, _shot, browser, site  # noqa: F401 (fixtures)
from tests.store.test_explorer_tokens import EMOJI_TEXT, token_rows


@pytest.fixture(scope="module")
def data(pg_server_url, template_db, model_cache):
    """The database ``site`` serves (this module's, in place of the explorer browser test's)."""
    from reflexdb import Store, roles

    name, url = _new_database(pg_server_url, template_db)
    store = Store.open(url)
    try:
        roles.apply(store.engine)
        made = token_rows(store)
    finally:
        store.close()
    yield url, made
    _drop_database(pg_server_url, name)


def _backgrounds(browser) -> list[str]:
    return [el.value_of_css_property("background-color") for el in _css(browser, "#conversation .tokens .tok")]


def test_the_legend_is_visible_and_each_colour_map_reshades_the_tokens(browser, site, data):
    from selenium.webdriver.common.by import By

    made = data[1]
    _open(browser, site, f"/trajectories/{made['emoji']}")
    (legend,) = _css(browser, "#legend")
    assert legend.is_displayed() and legend.get_attribute("data-color") == "logprob"
    bar = legend.find_element(By.TAG_NAME, "svg")
    assert bar.size["width"] >= 300 and bar.size["height"] >= 30  # drawn, not an empty box
    assert "≤ −8" in bar.text and "log-prob" in legend.text
    by_logprob = _backgrounds(browser)
    assert len(by_logprob) >= 10 and len(set(by_logprob)) > 3  # shades, not one colour
    _shot(browser, "explorer-tokens.png", height=960)

    browser.find_element(By.CSS_SELECTOR, '#color-maps a[data-color="advantage"]').click()
    assert browser.current_url.endswith("color=advantage&step=1#conversation-head")
    assert _css(browser, "#legend")[0].get_attribute("data-color") == "advantage"
    assert "≥ 2" in _css(browser, "#legend svg")[0].text
    by_advantage = _backgrounds(browser)
    assert set(by_advantage) == {"rgba(37, 99, 235, 0.32)", "rgba(0, 0, 0, 0)"}  # +0.75; none out of the mask
    assert by_advantage != by_logprob

    browser.find_element(By.CSS_SELECTOR, '#color-maps a[data-color="entropy"]').click()
    assert _css(browser, "#legend")[0].get_attribute("data-color") == "entropy"
    assert _css(browser, '#color-maps strong[aria-current="true"]')[0].text == "entropy"
    tips = [el.get_attribute("title") for el in _css(browser, "#conversation .tokens .tok")]
    assert all("learner: advantage" in t for t in tips) and any("clipped, entropy" in t for t in tips)


def test_an_emoji_split_across_tokens_renders_as_the_emoji(browser, site, data):
    made = data[1]
    _open(browser, site, f"/trajectories/{made['emoji']}")
    spans = _css(browser, "#conversation .tokens .tok")
    shown = "".join(el.get_attribute("textContent") for el in spans)
    assert shown == EMOJI_TEXT and "\ufffd" not in shown
    joined = {el.get_attribute("textContent").strip(): el for el in _css(browser, "#conversation .tokens .tok.joined")}
    assert {"🎉", "😀", "你", "好"} <= set(joined)
    party = joined["🎉"]
    assert party.size["width"] > 0 and party.get_attribute("title").startswith("tokens ")
    assert party.get_attribute("title").count("\ntoken ") >= 2  # each of its tokens in the tooltip


def test_a_models_script_in_the_token_view_is_text(browser, site, data):
    from selenium.webdriver.common.by import By

    made = data[1]
    _open(browser, site, f"/trajectories/{made['hostile']}?color=prob")
    tokens = browser.find_element(By.CSS_SELECTOR, "#conversation .role-assistant .tokens").text
    assert "<script>" in tokens and "<b>bold</b>" in tokens  # shown as written
    assert _css(browser, "#conversation script, #conversation b, #conversation img") == []
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):  # the model's alert("x") never ran
        browser.switch_to.alert.text  # noqa: B018
    assert "This row has no learner signals" not in browser.page_source  # probability needs none
    assert [el.text for el in _css(browser, "#color-maps .unavailable")] == ["entropy", "advantage", "ratio", "clipped"]
