"""Bad input gets a clear error that names the problem, and loses nothing."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from sqlalchemy import text

from reflexdb import (
    DatabaseUnavailable,
    GroupIn,
    InvalidGroup,
    SchemaOutdated,
    Store,
    TurnIn,
    migrate,
)
from reflexdb.db import make_engine
from tests.factories import make_group, make_trajectory, setup_run

REFLEXDB = [sys.executable, "-m", "reflexdb.cli.main"]


def _bad(rng, **override):
    t = make_trajectory(rng)
    for k, v in override.items():
        setattr(t, k, v)
    return t


BAD = {
    "logprobs shorter": (lambda rng: _bad(rng, logprobs=np.zeros(49, np.float32)), "trajectories[1].logprobs",
                         "length 49 != response_ids length 50"),
    "logprob NaN": (lambda rng: _bad(rng, logprobs=np.r_[np.zeros(49, np.float32), np.nan]),
                    "trajectories[1].logprobs", "non-finite"),
    "positive logprob": (lambda rng: _bad(rng, logprobs=np.full(50, 0.5, np.float32)), "trajectories[1].logprobs",
                         "<= 0"),
    "reward NaN": (lambda rng: _bad(rng, reward=float("nan")), "trajectories[1].reward", "finite"),
    "reward inf": (lambda rng: _bad(rng, reward=float("inf")), "trajectories[1].reward", "finite"),
    "reward text": (lambda rng: _bad(rng, reward="high"), "trajectories[1].reward", "number"),
    "vector NaN": (lambda rng: _bad(rng, embedding=np.r_[np.ones(15, np.float32), np.nan]),
                   "trajectories[1].embedding", "non-finite"),
    "vector 2-D": (lambda rng: _bad(rng, embedding=np.ones((4, 4), np.float32)), "trajectories[1].embedding",
                   "1-D"),
    "vector dim differs in group": (lambda rng: _bad(rng, embedding=np.ones(8, np.float32)),
                                    "trajectories[1].embedding", "differs"),
    "ids float": (lambda rng: _bad(rng, response_ids=np.ones(50) * 1.5), "trajectories[1].response_ids",
                  "integers"),
    "ids overflow": (lambda rng: _bad(rng, response_ids=np.full(50, 2**40)), "trajectories[1].response_ids",
                     "int32"),
    "versions length": (lambda rng: _bad(rng, token_policy_versions=np.zeros(3, np.int32)),
                        "trajectories[1].token_policy_versions", "length 3"),
    "mask length": (lambda rng: _bad(rng, loss_mask=np.ones(3, bool)), "trajectories[1].loss_mask", "shape"),
    "turn span": (lambda rng: _bad(rng, turns=[TurnIn("assistant", "x", 0, 51)]), "trajectories[1].turns[0].token_end",
                  "does not lie"),
    "turn role": (lambda rng: _bad(rng, turns=[TurnIn("robot", "x")]), "trajectories[1].turns[0].role", "robot"),
    "NUL text": (lambda rng: _bad(rng, turns=[TurnIn("assistant", "a\x00b")]), "trajectories[1].turns[0].text",
                 "NUL"),
    "finish reason": (lambda rng: _bad(rng, finish_reason="eos"), "trajectories[1].finish_reason", "eos"),
    "origin": (lambda rng: _bad(rng, origin="magic"), "trajectories[1].origin", "magic"),
    "confidence": (lambda rng: _bad(rng, confidence=1.5), "trajectories[1].confidence", "[0, 1]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_inconsistent_group_rejected_and_nothing_written(store, case):
    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(0)
    store.write_group(make_group(rng, run, task))  # the run already holds data
    before = store.table_counts()
    build, field, words = BAD[case]
    group = GroupIn(run_id=run, task_id=task, policy_version=0,
                    trajectories=[make_trajectory(rng), build(rng), make_trajectory(rng)])
    with pytest.raises(InvalidGroup) as err:
        store.write_group(group)
    assert err.value.field == field
    assert words in str(err.value)
    assert store.table_counts() == before


def test_group_level_errors(store):
    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidGroup, match="at least one trajectory"):
        store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[]))
    with pytest.raises(InvalidGroup, match="kind: 'weird' is not a group kind of this database"):
        store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[make_trajectory(rng)],
                                  kind="weird"))
    with pytest.raises(InvalidGroup) as err:
        store.write_group(GroupIn(run_id=run, task_id=10**9, policy_version=0, trajectories=[make_trajectory(rng)]))
    assert err.value.field == "task_id"
    assert store.table_counts()["groups"] == 0


def test_reward_none_with_error_is_accepted(store):
    run, (task, *_) = setup_run(store)
    t = make_trajectory(np.random.default_rng(0), reward=None, correct=None, error="ZeroDivisionError: boom")
    w = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[t]))
    [got] = store.read_trajectories(w.trajectory_ids)
    assert got.reward is None and got.error == "ZeroDivisionError: boom"


def test_unreachable_server_names_url_without_password():
    url = "postgresql://alice:s3cret@127.0.0.1:1/nowhere"
    with pytest.raises(DatabaseUnavailable) as err:
        Store.open(url)
    msg = str(err.value)
    assert "127.0.0.1:1/nowhere" in msg and "alice:***@" in msg and "s3cret" not in msg


def test_schema_missing_or_old_says_upgrade(empty_db_url, db_url):
    with pytest.raises(SchemaOutdated, match="run `reflexdb db upgrade`"):
        Store.open(empty_db_url)
    engine = make_engine(db_url)
    with engine.begin() as conn:  # pretend the database was migrated by an older release
        conn.execute(text("DELETE FROM alembic_version"))  # a row per branch head (the methods' branches)
        conn.execute(text("INSERT INTO alembic_version VALUES ('0000')"))
    with pytest.raises(SchemaOutdated, match="does not know"):
        Store.open(db_url)
    engine.dispose()


def test_schema_behind_head_says_upgrade(empty_db_url):
    engine = make_engine(empty_db_url)
    migrate.upgrade(engine, "0001")  # a database left by an older release
    head = migrate.head_revision()
    assert head != "0001"
    with pytest.raises(SchemaOutdated, match=f"at revision 0001 but this code needs {head}: run `reflexdb db upgrade`"):
        Store.open(empty_db_url)
    migrate.upgrade(engine)
    Store.open(empty_db_url).close()
    engine.dispose()


def test_create_schema_only_in_an_empty_database(empty_db_url):
    """collect / learn / eval create the schema in a new database, but never migrate an old one."""
    engine = make_engine(empty_db_url)
    with Store.open(empty_db_url, create_schema=True) as s:  # a new database: schema created
        assert s.create_run("x") > 0
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
    migrate.downgrade(engine, "0001")
    with pytest.raises(SchemaOutdated, match="at revision 0001 but this code needs"):
        Store.open(empty_db_url, create_schema=True)  # an old schema: upgrading stays explicit
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == "0001"
    engine.dispose()
