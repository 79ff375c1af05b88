"""The ``fast`` engine's block manager and scheduler (collector/engines/blocks.py, scheduler.py):
host bookkeeping only, checked without a model."""

from __future__ import annotations

import pytest
from reflexdb.collector.engines.base import SamplingParams
from reflexdb.collector.engines.blocks import ROOT, BlockManager, OutOfBlocks, chain
from reflexdb.collector.engines.scheduler import Job, Row, Scheduler


def test_blocks_are_counted_freed_oldest_first_and_refused_when_none_is_left():
    bm = BlockManager(3, 4)
    a, b, c = bm.allocate(), bm.allocate(), bm.allocate()
    assert (a, b, c) == (0, 1, 2) and bm.free_blocks == 0
    with pytest.raises(OutOfBlocks, match="all 3 blocks of 4 tokens are held"):
        bm.allocate()
    bm.hold(b)  # a second holder
    bm.release(b)
    assert bm.free_blocks == 0  # still held once
    bm.release(c)
    bm.release(b)
    assert list(bm.free) == [c, b]  # least recently freed first
    assert bm.allocate() == c
    with pytest.raises(RuntimeError, match="released more often than held"):
        bm.release(c) or bm.release(c)
    assert bm.blocks_for(0) == 0 and bm.blocks_for(1) == 1 and bm.blocks_for(8) == 2 and bm.blocks_for(9) == 3
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(0, 4)


def test_full_blocks_are_found_by_their_tokens_and_everything_before_them():
    bm = BlockManager(8, 2)
    tokens = [5, 6, 7, 8, 9]
    b0, b1, b2 = bm.allocate(), bm.allocate(), bm.allocate()
    h0 = bm.register(b0, ROOT, tokens[0:2])
    h1 = bm.register(b1, h0, tokens[2:4])
    assert h1 == chain(chain(ROOT, [5, 6]), [7, 8])
    with pytest.raises(ValueError, match="only full blocks"):
        bm.register(b2, h1, [9])
    assert bm.match(tokens) == ([b0, b1], [h0, h1])
    assert bm.match([5, 6, 7, 9, 9]) == ([b0], [h0])  # the second block's tokens differ
    assert bm.match([7, 8, 5, 6]) == ([], [])  # the same tokens after another prefix are another block
    # freed, a cached block stays findable until it is handed out again
    bm.release(b1)
    assert bm.match(tokens)[0] == [b0, b1]
    for _ in range(bm.free_blocks):
        bm.allocate()
    assert bm.match(tokens)[0] == [b0]  # b1 was handed out again: forgotten


def test_a_hash_collision_is_not_a_match(monkeypatch):
    import reflexdb.collector.engines.blocks as blocks

    monkeypatch.setattr(blocks, "chain", lambda parent, tokens: 42)  # every block collides
    bm = BlockManager(4, 2)
    b = bm.allocate()
    bm.register(b, ROOT, [1, 2])
    assert bm.find(ROOT, [1, 2]) == b and bm.find(ROOT, [3, 4]) is None


def _scheduler(blocks=16, bs=4, keep=1000):
    copies = []
    sch = Scheduler(BlockManager(blocks, bs), lambda src, dst, n: copies.append((src, dst, n)), keep)
    return sch, copies


def _row(prompt, index=0):
    return Row(call=0, index=index, prompt=list(prompt), seed=1, params=SamplingParams(), limit=32)


def test_the_samples_of_a_prompt_share_its_full_blocks_and_copy_its_partial_one():
    sch, copies = _scheduler()
    prompt = list(range(10))  # 2 full blocks of 4 and a partial one of 2
    job = Job([_row(prompt, i) for i in range(3)], prompt)
    assert sch.reserve(job) and job.cached == 0 and len(job.blocks) == 3
    rows = sch.fork(job)
    full = job.blocks[:2]
    assert [r.blocks[:2] for r in rows] == [full] * 3
    assert rows[0].blocks[2] == job.blocks[2] and len({r.blocks[2] for r in rows}) == 3  # own partial blocks
    assert copies == [(job.blocks[2], rows[1].blocks[2], 2), (job.blocks[2], rows[2].blocks[2], 2)]
    assert [sch.bm.ref[b] for b in full] == [3, 3]
    # a later prompt with the same start finds the full blocks: only the rest is prefilled
    later = Job([_row(prompt + [99, 98])], prompt + [99, 98])
    assert sch.reserve(later) and later.cached == 8 and later.blocks[:2] == full


def test_a_prompt_wholly_cached_still_computes_its_last_block():
    sch, _ = _scheduler()
    prompt = list(range(8))
    job = Job([_row(prompt)], prompt)
    sch.reserve(job)
    sch.fork(job)
    again = Job([_row(prompt)], prompt)
    assert sch.reserve(again) and again.cached == 4  # the last token's logits are needed


def test_a_kept_conversation_gives_the_next_turn_its_blocks_and_a_copy_of_its_last_one():
    sch, copies = _scheduler(keep=100)
    prompt = list(range(6))
    job = Job([_row(prompt)], prompt)
    sch.reserve(job)
    [row] = sch.fork(job)
    sch.grow(row, 10)
    fed = prompt + [50, 51, 52, 53]  # 10 tokens: 2 full blocks, 2 in the third
    sch.finish(row, fed, keep=True)
    assert len(sch.sessions) == 1 and sch.session_tokens == 10 and row.blocks == []
    [session] = sch.sessions.values()
    turn = Job([_row(fed + [7, 7, 7])], fed + [7, 7, 7])
    assert sch.reserve(turn) and turn.cached == 10  # only the environment's 3 tokens are left to prefill
    assert turn.blocks[:2] == session.blocks[:2] and copies[-1] == (session.blocks[2], turn.blocks[2], 2)
    # a turn that goes back into the conversation (a rollback) reuses only what it shares
    back = Job([_row(prompt + [50, 9, 9])], prompt + [50, 9, 9])
    assert sch.reserve(back) and back.cached == 4
    # dropped: the blocks go back to the free list (still findable by content)
    sch.forget()
    assert not sch.sessions and sch.session_tokens == 0


def test_kept_conversations_past_their_budget_are_dropped_oldest_first():
    sch, _ = _scheduler(keep=12)
    for start in (0, 100):
        prompt = list(range(start, start + 6))
        job = Job([_row(prompt)], prompt)
        sch.reserve(job)
        [row] = sch.fork(job)
        sch.finish(row, prompt, keep=True)
    assert sch.session_tokens == 12 and len(sch.sessions) == 2
    prompt = list(range(200, 206))
    job = Job([_row(prompt)], prompt)
    sch.reserve(job)
    [row] = sch.fork(job)
    sch.finish(row, prompt, keep=True)
    assert len(sch.sessions) == 2 and [s.tokens[0] for s in sch.sessions.values()] == [100, 200]


def test_a_preempted_row_waits_first_with_what_it_sampled_and_finds_its_blocks_cached():
    sch, _ = _scheduler(blocks=6, bs=4)
    prompt = list(range(8))
    job = Job([_row(prompt)], prompt)
    sch.reserve(job)
    [row] = sch.fork(job)
    row.tokens, row.logprobs = [40, 41, 42, 43], [-1.0] * 4
    assert sch.grow(row, 12)
    held = list(row.blocks)
    sch.preempt(row)
    assert row.blocks == [] and sch.bm.free_blocks == 6 and sch.preemptions == 1
    [back] = sch.waiting
    assert back.rows == [row] and back.tokens == prompt + [40, 41, 42, 43]
    assert sch.reserve(back) and back.cached == 8 and back.blocks[:2] == held[:2]  # the last block is recomputed


def test_reserve_keeps_headroom_for_the_decoding_rows():
    sch, _ = _scheduler(blocks=4, bs=4)
    job = Job([_row(range(8))], list(range(8)))
    assert not sch.reserve(job, headroom=3)  # 2 blocks leave 2 free, not 3
    assert sch.bm.free_blocks == 4  # nothing held
    assert sch.reserve(job, headroom=2)


def test_the_decode_steps_block_table_width_wastes_at_most_a_quarter():
    from reflexdb.collector.engines.fast import bucket

    assert [bucket(n) for n in (1, 2, 3, 8, 9, 17, 33, 72, 1000)] == [1, 2, 3, 8, 10, 20, 40, 80, 1024]
    for n in range(1, 5000):
        assert n <= bucket(n) < n * 1.25 + 1  # rounded up to a multiple of 2 ** (bit_length - 3)
    assert len({bucket(n) for n in range(1, 4097)}) <= 4 * 13  # a few graphs per doubling
