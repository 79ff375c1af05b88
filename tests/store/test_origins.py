"""Origins as data (migration 0018; reflexdb/origins.py): a table that a method's migration fills,
which ``trajectories.origin`` refers to, and whose facts the store, the collector and the learner
read instead of deciding by a name."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
import torch
from sqlalchemy import text

from reflexdb.db import libpq_url
from reflexdb.errors import InvalidGroup
from reflexdb.origins import GroupKind, Origin, matching
from reflexdb.trainer.batch import pack
from tests.factories import make_group, release_origins, setup_run
from tests.processes import rows

#: What a method's own revision would insert (here: a self-verification turn's row).
NEW = ("verified", "stored", False, True, "selfcheck", "a second turn in which the model checks its own answer")


def test_the_table_holds_the_release_s_origins_and_their_facts(store):
    assert store.origins() == release_origins()
    facts = store.origins()
    assert matching(facts, pi_old="learner") == {"imported"}
    assert matching(facts, pass_at_1=True) == {"base", "purified", "raw"}
    assert matching(facts, sampled=False) == {"distilled", "imported", "purified", "replayed"}


def test_an_origin_added_by_a_migration_is_written_and_read_by_its_facts(store):
    rng = np.random.default_rng(0)
    run, (task, _, _) = setup_run(store)
    store.origins()  # read before the insert: the store reads the table again for a name new to it
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO origins VALUES (:n, :p, :a, :s, :m, :d)"),
                     dict(zip("npasmd", NEW)))
    g = make_group(rng, run, task, size=3, dim=None)
    g.trajectories[2].origin = "verified"
    written = store.write_group(g)
    assert store.origins()["verified"] == Origin(*NEW)
    assert rows(store, "SELECT origin FROM trajectories WHERE group_id = :g ORDER BY index_in_group",
                g=written.group_id) == [("base",), ("base",), ("verified",)]
    # the learner's batch reads the facts: π_old stored, not in pass@1
    batch = pack(store.read_groups([written.group_id], turns=False), pad_id=0, origins=store.origins())
    assert batch.where_origin(pi_old="stored").tolist() == [False, False, True]
    assert batch.where_origin(pass_at_1=True).tolist() == [True, True, False]
    assert batch.of_origin("verified").tolist() == [False, False, True]
    # a micro-batch keeps each row's origin
    part = batch.by_length().rows(slice(0, 2))
    assert len(part.origins) == 2 and part.where_origin(pi_old="stored").shape == torch.Size([2])


def test_an_unknown_origin_is_refused_naming_the_field_and_the_table(store):
    rng = np.random.default_rng(1)
    run, (task, _, _) = setup_run(store)
    g = make_group(rng, run, task, size=2, dim=None)
    g.trajectories[1].origin = "nope"
    with pytest.raises(InvalidGroup, match=r"trajectories\[1\].origin: 'nope' is not an origin of this database "
                                           r"\(table origins: base, distilled, .*replayed\)"):
        store.write_group(g)
    assert rows(store, "SELECT count(*) FROM trajectories") == [(0,)]


def test_plain_sql_cannot_bypass_the_table_in_a_run_made_after_it(store, db_url):
    """The foreign key is on the partitioned table: a run's partition made after 0018 has it too."""
    rng = np.random.default_rng(2)
    run, (task, _, _) = setup_run(store, "after-0018")
    written = store.write_group(make_group(rng, run, task, size=1, dim=None))
    with psycopg.connect(libpq_url(db_url)) as conn, pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute("UPDATE trajectories SET origin = 'nope' WHERE group_id = %s", (written.group_id,))



def _of_kind(group, kind):
    group.kind = kind
    return group


def test_group_kinds_are_rows_with_facts_and_a_method_adds_its_own(store, db_url):
    """Group kinds as data (revision 0020): the release's six, their facts; a method's revision adds
    a kind by inserting a row; an unknown kind is refused naming the table, by the store and by the
    foreign key under plain SQL."""
    kinds = store.group_kinds()
    assert set(kinds) == {"eval", "fresh", "hinted", "imported", "replay", "retry"}
    assert {k for k, v in kinds.items() if not v.trained} == {"eval", "retry"}
    assert {k for k, v in kinds.items() if not v.pass_at_1} == {"retry"}
    rng = np.random.default_rng(3)
    run, (task, _, _) = setup_run(store)
    with pytest.raises(InvalidGroup, match=r"kind: 'verify' is not a group kind of this database "
                                           r"\(table group_kinds: eval, fresh, .*retry\)"):
        store.write_group(_of_kind(make_group(rng, run, task, size=1, dim=None), "verify"))
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO group_kinds VALUES ('verify', false, false, 'selfcheck', 'a check')"))
    written = store.write_group(_of_kind(make_group(rng, run, task, size=1, dim=None), "verify"))
    assert store.group_kinds()["verify"] == GroupKind("verify", False, False, "selfcheck", "a check")
    assert rows(store, "SELECT kind FROM groups WHERE id = :g", g=written.group_id) == [("verify",)]
    # never handed to the learner as a group (revision 0022), never counted untrained (0021)
    assert rows(store, "SELECT eligible, reason FROM learner_eligible WHERE group_id = :g", g=written.group_id) == [
        (False, "auxiliary")]
    assert rows(store, "SELECT count(*) FROM untrained_groups WHERE group_id = :g", g=written.group_id) == [(0,)]
    with psycopg.connect(libpq_url(db_url)) as conn, pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute("UPDATE groups SET kind = 'nope' WHERE id = %s", (written.group_id,))
