"""Linear time on hostile text where a database is needed (issue 50): the explorer's trajectory
page for a turn of a megabyte of a model's text over a million tokens (an imported row may hold
that many). tests/unit/test_linear_text_core.py has the functions behind it."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from reflexdb import roles
from reflexdb.explorer.data import Explorer
from reflexdb.explorer.tokens import MAX_SHADED, tokenizer_for
from reflexdb.records import GroupIn, TrajectoryIn, TurnIn
from reflexdb.storable import storable_text
from tests.factories import setup_run
from tests.hostile_text import MB, corpus
from tests.store.test_explorer import _get, _served

#: Seconds the page may take (1-2 s here): reading 12 MB of token arrays, escaping 1 MB of text
#: twice, sending 5-7 MB. Before the caps (MAX_SHADED) the page built a span per token, about
#: 10 µs each, and wrote the raw row's 3 million numbers one a line: over a minute and 65 MB.
PAGE_BUDGET_S = 5.0


@pytest.fixture
def explorer(store, db_url):
    roles.apply(store.engine)
    db = Explorer(db_url)
    yield db
    db.close()


@pytest.mark.parametrize("name", ["mixed scripts", "repeated '\\x1b]52;c;'"])
def test_the_page_of_a_megabyte_turn_renders_in_bounded_time(store, explorer, name, model_cache):
    text = storable_text(corpus()[name])
    rng = np.random.default_rng(0)
    run, (task,) = setup_run(store, "long", n_tasks=1)
    T = MB  # one token per byte: the most a megabyte of text tokenizes to
    t = TrajectoryIn(prompt_ids=[1, 2, 3], response_ids=rng.integers(0, 49152, T),
                     logprobs=-rng.random(T).astype(np.float32), reward=0.0, correct=False,
                     turns=[TurnIn("user", "q"), TurnIn("assistant", text, 0, T)])
    (tid,) = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[t])).trajectory_ids
    tokenizer_for(None)  # loaded once per process (the server does it at start), not timed here
    server, thread, base = _served(explorer)
    try:
        t0 = time.perf_counter()
        status, page, _ = _get(f"{base}/trajectories/{tid}")
        seconds = time.perf_counter() - t0
    finally:
        server.should_exit = True
        thread.join(10)
    assert status == 200
    # 20,000 shaded tokens, not 1,048,576: a line each in the tooltips (a run of byte-level tokens
    # decoded together is one span whose tooltip lists each of its tokens, issue 53)
    assert len(re.findall(r"token \d+: id \d+", page)) == MAX_SHADED
    assert f"… {T - MAX_SHADED} more tokens, not shaded" in page  # 1,028,576 more
    assert f"… {T - MAX_SHADED} more: the raw JSON file has them all" in page  # the raw row's arrays
    assert seconds < PAGE_BUDGET_S, f"the page took {seconds:.1f} s"
