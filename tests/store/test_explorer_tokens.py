"""The trajectory page's token view over HTTP (issue 53): the colour map is a choice with a legend
and a range that does not paint temperature-1.0 text all red (rough edge 12), the tooltips carry
the learner signals a step recorded (revision 0028), and an emoji split across byte-level tokens
shows as the emoji, not as replacement characters (rough edge 6). Both rough-edge tests fail on
the code before this change: its page has no legend, ignores ``?color=`` and shades by
``1 − p`` (alpha 0.73 at log-prob −2), and draws each byte-level token alone (``������``)."""

from __future__ import annotations

import html
import re
import statistics

import numpy as np
import pytest

from reflexdb import GroupIn, TaskIn, TrajectoryIn, TurnIn, roles
from reflexdb.explorer.data import Explorer
from reflexdb.records import TokenSignals
from tests.explorer_data import HOSTILE, HOSTILE_PROMPT
from tests.store.test_explorer import _get, _served

#: What the emoji row says: two emoji and two CJK characters, each split across 2-3 byte-level tokens.
EMOJI_TEXT = ("Each box holds 12 apples and there are 7 boxes, so 12 × 7 = 84 apples. Party 🎉 time 😀! "
              "<answer>84</answer> (你好 means hello.)")
#: A step's signals on the emoji row (first two tokens out of the loss: no advantage, no ratio).
ADVANTAGE = 0.75


def _tokenize(text: str) -> np.ndarray:
    from reflexdb.explorer.tokens import tokenizer_for

    tok = tokenizer_for("smollm2")
    return np.asarray(tok.encode(text, add_special_tokens=False), dtype=np.int32)


def _row(text: str, rng, reward: float, mask: np.ndarray | None = None) -> TrajectoryIn:
    ids = _tokenize(text)
    # log-probs as a small model samples at temperature 1.0: mostly between −3 and 0, a tail below
    logprobs = -np.abs(rng.normal(1.2, 1.3, len(ids))).astype(np.float32)
    return TrajectoryIn(prompt_ids=_tokenize("What is new?"), response_ids=ids, logprobs=logprobs, reward=reward,
                        correct=reward > 0, loss_mask=mask,
                        turns=[TurnIn("user", HOSTILE_PROMPT), TurnIn("assistant", text, 0, len(ids))])


def token_rows(store) -> dict[str, int]:
    """A run whose rows the token view is tested on: ``emoji`` (trained by step 1, which recorded
    its signals), ``hostile`` (trained by step 1, no signals: HOSTILE's ``<script>``), ``untrained``."""
    rng = np.random.default_rng(7)
    run = store.create_run("tokens", algorithm="grpo", config={"model": "smollm2"})
    (task,) = store.add_tasks(run, [TaskIn("What is new?", "hello")])
    n = len(_tokenize(EMOJI_TEXT))
    mask = np.ones(n, bool)
    mask[:2] = False
    rows = [_row(EMOJI_TEXT, rng, 1.0, mask), _row(f"I say {HOSTILE} and 42", rng, 0.0),
            _row("nothing trained here", rng, 0.0)]
    emoji, hostile, untrained = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0,
                                                          trajectories=rows)).trajectory_ids
    advantage = np.where(mask, ADVANTAGE, np.nan)
    log_ratio = np.where(mask, np.linspace(-0.3, 0.3, n), np.nan)  # the ends beyond the clip range
    clipped = mask & (np.abs(log_ratio) > 0.2)
    signals = {emoji: TokenSignals(advantage, log_ratio, clipped, np.linspace(0.5, 4.0, n))}
    store.record_step(run, 1, 1, [emoji, hostile], advantages={emoji: [ADVANTAGE], hostile: [-ADVANTAGE]},
                      advantage_stages=["group"], token_signals=signals)
    return {"run": run, "emoji": emoji, "hostile": hostile, "untrained": untrained, "tokens": n}


@pytest.fixture
def site(store, db_url, model_cache):
    roles.apply(store.engine)
    made = token_rows(store)
    db = Explorer(db_url)
    server, thread, base = _served(db)
    yield {"base": base, **made}
    server.should_exit = True
    thread.join(10)
    db.close()


def _token_spans(page: str) -> list[tuple[str, str, str]]:
    """``(class, background, text)`` of each token span of the conversation."""
    return re.findall(r'<span class="(tok[^"]*)" style="background: ([^"]*)" title="[^"]*">([^<]*)</span>', page)


def _alpha(background: str) -> float:
    found = re.fullmatch(r"rgba\(\d+, \d+, \d+, ([0-9.]+)\)", background)
    return float(found.group(1)) if found else 0.0


def test_the_default_colour_map_is_log_prob_with_a_legend_and_leaves_most_text_light(site):
    """Rough edge 12: at temperature 1.0 most tokens' log-probs lie between −3 and 0; shaded over
    the fixed range [−8, 0] they are light (alpha 0.85·|lp|/8: 0.21 at −2), where 1 − p gave 0.73."""
    status, page, _ = _get(f"{site['base']}/trajectories/{site['emoji']}")
    assert status == 200
    assert 'id="legend" data-color="logprob"' in page and 'aria-label="colour scale of log-prob"' in page
    assert "≤ −8" in page and ">0</text>" in page  # the legend's range, drawn server-side
    spans = _token_spans(page)
    assert len(spans) >= 10
    alphas = [_alpha(bg) for _, bg, _ in spans]
    assert statistics.median(alphas) < 0.4, alphas
    assert sum(a >= 0.8 for a in alphas) <= len(alphas) // 10, alphas
    # every choice is offered; the current one is marked
    for name in ("logprob", "prob", "entropy", "advantage", "ratio", "clipped"):
        assert f'data-color="{name}"' in page
    assert '<strong class="chosen" data-color="logprob" aria-current="true">' in page


@pytest.mark.parametrize("name,tick", [("prob", "0.75"), ("logprob", "−4"), ("entropy", "≥ 6 nats"),
                                       ("advantage", "≥ 2"), ("ratio", "1.2"), ("clipped", "clipped")])
def test_each_colour_map_is_chosen_by_the_query_and_draws_its_legend(site, name, tick):
    status, page, _ = _get(f"{site['base']}/trajectories/{site['emoji']}?color={name}")
    assert status == 200
    assert f'id="legend" data-color="{name}"' in page and f">{html.escape(tick)}</text>" in page
    assert f'<strong class="chosen" data-color="{name}" aria-current="true">' in page
    backgrounds = {bg for _, bg, _ in _token_spans(page)}
    if name == "advantage":  # +0.75 on the loss tokens: blue at 0.85·0.75/2 = 0.32; none on the two masked out
        assert backgrounds == {"rgba(37, 99, 235, 0.32)", "transparent"}
    if name == "clipped":  # the ends of the ratio ramp, beyond [0.8, 1.2] (|log| > 0.2)
        assert "rgba(234, 88, 12, 0.75)" in backgrounds and "transparent" in backgrounds


def test_an_unknown_colour_map_or_step_is_a_400_naming_it(site):
    status, page, _ = _get(f"{site['base']}/trajectories/{site['emoji']}?color=%3Cscript%3E")
    assert status == 400
    assert "&#39;color&#39;" in page and "logprob" in page and "<script>" not in page.split("<main")[-1]
    status, page, _ = _get(f"{site['base']}/trajectories/{site['emoji']}?step=7")
    assert status == 400 and "step 7 recorded no learner signals" in page and "steps with signals: 1" in page
    status, _, _ = _get(f"{site['base']}/trajectories/{site['emoji']}?step=x")
    assert status == 400


def test_tooltips_show_the_learner_signals_of_the_step(site):
    status, page, _ = _get(f"{site['base']}/trajectories/{site['emoji']}?color=ratio")
    assert status == 200
    titles = [html.unescape(t) for t in re.findall(r'<span class="tok[^"]*" style="[^"]*" title="([^"]*)"', page)]
    # the last token: in the loss, advantage 0.75, log-ratio 0.3 (float16: 1229/4096 = 0.30005), past the clip
    assert re.search(r"learner: advantage 0\.750, ratio 1\.350 \(log 0\.3000\), clipped, entropy 4\.00 nats",
                     titles[-1]), titles[-1]
    assert "out of the loss mask; learner: advantage —, ratio —, not clipped" in titles[0]
    assert 'Learner signals of <a href="/runs/tokens/steps/1">step 1</a>' in page


def test_a_row_without_signals_says_why_and_offers_only_its_own_maps(site):
    status, page, _ = _get(f"{site['base']}/trajectories/{site['hostile']}?color=entropy")
    assert status == 200
    assert "did not record them" in page and "This row has no learner signals" in page
    assert '<span class="unavailable" data-color="advantage"' in page
    assert {bg for _, bg, _ in _token_spans(page)} == {"transparent"}
    status, page, _ = _get(f"{site['base']}/trajectories/{site['untrained']}")
    assert status == 200 and "no learner step has trained this row" in page


def test_an_emoji_split_across_byte_level_tokens_is_shown_as_the_emoji(site):
    """Rough edge 6: 🎉 is three tokens of SmolLM2's byte-level vocabulary, each alone U+FFFD; the
    page decodes the run together and draws it as one span whose tooltip lists the three."""
    status, page, _ = _get(f"{site['base']}/trajectories/{site['emoji']}")
    assert status == 200
    conversation = page[page.index('id="conversation"'):page.index('<h2>Raw row</h2>')]
    spans = _token_spans(conversation)
    texts = [html.unescape(t) for _, _, t in spans]
    assert "".join(texts) == EMOJI_TEXT
    assert "\ufffd" not in "".join(texts)
    joined = {t.strip() for (cls, _, _), t in zip(spans, texts) if "joined" in cls}
    assert {"🎉", "😀", "你", "好"} <= joined
    assert re.search(r'title="tokens \d+–\d+, decoded together \(each alone is part of a character\):\ntoken \d+: '
                     r'id \d+', conversation)


def test_model_text_in_the_token_view_is_escaped(site):
    status, page, headers = _get(f"{site['base']}/trajectories/{site['hostile']}")
    assert status == 200 and "script-src" not in headers["content-security-policy"]
    conversation = page[page.index('id="conversation"'):page.index('<h2>Raw row</h2>')]
    assert "<script>" not in conversation and "&lt;script&gt;" in conversation
    assert "<img" not in conversation and "&lt;img src=x onerror=alert(1)&gt;" in conversation


# ------------------------------------------------------------------ linear time (rough edge 6 on a megabyte)


def _page_of(tok, ids: np.ndarray) -> list:
    """The conversation the trajectory page renders for one assistant turn over ``ids``."""
    from reflexdb.explorer.app import _conversation

    n = len(ids)
    payload = {"response_ids": ids, "logprobs": np.full(n, -1.0, np.float32), "versions": np.zeros(n, np.int32),
               "loss_mask": np.ones(n, np.uint8)}
    return _conversation({"turns": [{"turn_index": 0, "role": "assistant", "text": "…", "token_start": 0,
                                     "token_end": n, "tool_call": None}], "tokens": payload, "marks": []}, tok)


def _all_pieces(tok, ids: np.ndarray) -> int:
    """Every token of the response grouped and decoded, not only the shaded ones."""
    from reflexdb.explorer.tokens import colour_map, pieces, tokens

    n = len(ids)
    payload = {"response_ids": ids, "logprobs": np.full(n, -1.0, np.float32), "versions": np.zeros(n, np.int32),
               "loss_mask": np.ones(n, np.uint8)}
    return len(pieces(tok, tokens(tok, payload, 0, n, limit=n), colour_map(None)))


def test_decoding_runs_together_is_linear_on_a_megabyte_response(model_cache):
    """A megabyte of emoji and CJK (every character split across 2-3 byte-level tokens, about
    900,000 tokens): the page shades its first 20,000 within the budget of tests/hostile_text.py,
    and grouping all of them takes seconds (linear; a quadratic grouping would take hours)."""
    from reflexdb.explorer.tokens import MAX_SHADED, tokenizer_for
    from tests.hostile_text import MB, assert_linear

    tok = tokenizer_for("smollm2")
    unit = "🎉😀你好 "
    text = unit * (MB // len(unit.encode()))
    ids = np.asarray(tok.encode(text, add_special_tokens=False), dtype=np.int32)
    assert len(ids) > 500_000
    assert_linear(_page_of, tok, ids, name=f"{len(text.encode()):,} bytes, {len(ids):,} tokens")
    (turn,) = _page_of(tok, ids[:30])
    assert "".join(p.text for p in turn["pieces"]) == tok.decode(ids[:30].tolist())  # whole characters
    assert len(turn["tokens"]) == 30 and len(_page_of(tok, ids)[0]["tokens"]) == MAX_SHADED
    assert_linear(_all_pieces, tok, ids, budget_s=30.0, name=f"all {len(ids):,} tokens")
