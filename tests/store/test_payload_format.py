"""Token payloads as little-endian bytea (revision 0014): exact round trips, the views and SQL
functions that give the arrays back to people, and the migration's conversion both ways."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from reflexdb import migrate
from reflexdb.db import make_engine
from tests.factories import make_group, make_trajectory, setup_run

# float32 values whose bits the SQL decoder must rebuild exactly: signed zeros, the smallest
# subnormal, a subnormal, the smallest normal, a value that is not a short decimal, large ones.
SPECIAL_LOGPROBS = np.array([-0.0, 0.0, -1.4e-45, -3e-40, -1.1754944e-38, -1 / 3, -80.5, -3.4028235e38],
                            dtype=np.float32)


def _groups(rng, run, task):
    specials = make_trajectory(rng, T=SPECIAL_LOGPROBS.size, dim=None, logprobs=SPECIAL_LOGPROBS,
                               token_policy_versions=np.array([0, 1, 2, 3, 4, 5, 6, 2**31 - 1]))
    empty = make_trajectory(rng, T=0, P=0, dim=None, turns=[])
    imported = make_trajectory(rng, T=20, dim=None, logprobs=None, origin="imported")
    return [make_group(rng, run, task, size=4),
            make_group(rng, run, task, size=3, T=700),  # over toast_tuple_target: stored out of line
            _group_of(run, task, [specials, empty]),
            _group_of(run, task, [imported], kind="imported")]


def _group_of(run, task, trajectories, **kw):
    from reflexdb import GroupIn

    return GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=trajectories, **kw)


def _stored(store, ids):
    return {t.id: (t.prompt_ids, t.response_ids, t.logprobs, t.token_policy_versions, t.loss_mask)
            for t in store.read_trajectories(ids, turns=False)}


def _same(a, b):
    """Arrays equal bit for bit (NULLs as None); float32 compared by their bits."""
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return np.array_equal(a.astype(np.float32).view(np.uint32), b.astype(np.float32).view(np.uint32))
    return a.shape == b.shape and np.array_equal(a, b)


def _view_rows(store, view, ids):
    with store.engine.connect() as conn:
        rows = conn.execute(text(f"SELECT trajectory_id, prompt_ids, response_ids, logprobs, token_policy_versions, "
                                 f"loss_mask FROM {view} WHERE trajectory_id = ANY(:ids)"), {"ids": ids}).all()
    return {r[0]: tuple(None if v is None else np.asarray(v) for v in r[1:]) for r in rows}


def _write(store):
    rng = np.random.default_rng(11)
    run, (task, *_) = setup_run(store)
    ids = [i for g in _groups(rng, run, task) for i in store.write_group(g).trajectory_ids]
    return run, ids


def test_arrays_round_trip_exactly_and_come_back_writable(store):
    run, ids = _write(store)
    stored = _stored(store, ids)
    specials = next(v for v in stored.values() if v[2] is not None and v[2].size == SPECIAL_LOGPROBS.size)
    assert _same(specials[2], SPECIAL_LOGPROBS)
    assert specials[3].tolist() == [0, 1, 2, 3, 4, 5, 6, 2**31 - 1]
    dtypes = {a.dtype for v in stored.values() for a in v if a is not None}
    assert dtypes == {np.dtype("<i4"), np.dtype("<f4"), np.dtype(bool)}
    assert all(a.flags.writeable for v in stored.values() for a in v if a is not None)
    assert sum(v[2] is None for v in stored.values()) == 1  # the imported trajectory's unknown log-probs
    assert any(v[1].size == 0 for v in stored.values())


def test_views_give_the_arrays_back_bit_for_bit(store):
    run, ids = _write(store)
    stored = _stored(store, ids)
    for view in ("token_payloads", "trajectory_tokens"):
        rows = _view_rows(store, view, ids)
        assert rows.keys() == stored.keys()
        for tid, arrays in stored.items():
            assert all(_same(a, b) for a, b in zip(arrays, rows[tid])), (view, tid)
    with store.engine.connect() as conn:
        lengths = conn.execute(text("SELECT trajectory_id, n_prompt_tokens, n_response_tokens, run_id "
                                    "FROM trajectory_tokens WHERE trajectory_id = ANY(:ids)"), {"ids": ids}).all()
    assert {r[0]: (r[1], r[2]) for r in lengths} == {t: (v[0].size, v[1].size) for t, v in stored.items()}
    assert {r[3] for r in lengths} == {run}


def test_sql_functions_decode_edge_values(store):
    bits = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001, 0x80000000, 0x3F800000], dtype="<u4")
    with store.engine.connect() as conn:
        floats, ints, flags, empty = conn.execute(text(
            "SELECT float4_array(:f), int4_array(:i), bool_array(:b), int4_array(''::bytea)"),
            {"f": bits.tobytes(), "i": np.array([-1, 0, 2**31 - 1, -2**31], "<i4").tobytes(),
             "b": bytes([0, 1, 1, 0])}).one()
    got = np.asarray(floats, dtype=np.float32)
    assert got[:2].tolist() == [np.inf, -np.inf] and np.isnan(got[2])
    assert _same(got[3:], bits[3:].view("<f4"))
    assert ints == [-1, 0, 2**31 - 1, -2**31] and flags == [False, True, True, False] and empty == []


def test_length_checks_refuse_a_bad_row(store):
    run, ids = _write(store)
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM token_bytes WHERE trajectory_id = :t"), {"t": ids[0]})
    with pytest.raises(Exception, match="ck_token_bytes_mask_length"), store.engine.begin() as conn:
        conn.execute(text("INSERT INTO token_bytes VALUES (:t, '', '\\x01000000', NULL, '\\x01000000', '', :r)"),
                     {"t": ids[0], "r": run})


def test_migration_converts_rows_both_ways(store, db_url):
    """Down to 0013 (bytea -> native arrays in SQL) and up again (native -> bytea with numpy):
    every array comes back as written, bit for bit."""
    run, ids = _write(store)
    stored = _stored(store, ids)
    engine = make_engine(db_url)
    try:
        migrate.downgrade(engine, "0013")
        with engine.connect() as conn:
            kind = conn.execute(text("SELECT relkind FROM pg_class WHERE relname = 'token_payloads'")).scalar()
            assert kind == "r"  # a table again, with native arrays
            rows = conn.execute(text("SELECT trajectory_id, prompt_ids, response_ids, logprobs, "
                                     "token_policy_versions, loss_mask FROM token_payloads")).all()
        assert {r[0] for r in rows} == set(stored)
        for r in rows:
            assert all(_same(a, None if b is None else np.asarray(b)) for a, b in zip(stored[r[0]], r[1:])), r[0]
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    assert _stored(store, ids).keys() == stored.keys()
    for tid, arrays in _stored(store, ids).items():
        assert all(_same(a, b) for a, b in zip(arrays, stored[tid])), tid
