"""Least-privilege roles (`reflexdb db roles`, `reflexdb db user`) and passwords kept out of output."""

from __future__ import annotations

import subprocess

import psycopg
import pytest
from sqlalchemy.engine import make_url

from reflexdb import Store

from reflexdb.ops import admin
from tests.processes import REFLEXDB, child_env, rows
from tests.store.test_learn import _learner, seed_groups

PASSWORD = "pw-Nobody-Should-See-7"


def _as(db_url: str, user: str, password: str | None = PASSWORD) -> str:
    return make_url(db_url).set(username=user, password=password).render_as_string(hide_password=False)


def _refused(url: str, statements: list[str]) -> list[str]:
    """The statements the server refused for lack of privilege (each in its own transaction)."""
    refused = []
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        for sql in statements:
            try:
                conn.execute(sql)
            except psycopg.errors.InsufficientPrivilege:
                refused.append(sql)
            finally:
                conn.rollback()
    return refused


@pytest.fixture
def roles(db_url, tmp_path):
    """The three roles on this database, and a login in each (via the command, password from the environment)."""
    env = child_env(db_url, tmp_path, tmp_path)
    out = subprocess.run(REFLEXDB + ["db", "roles"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    logins = {}
    for role in ("collector", "learner", "reader"):
        name = f"reflexdb_t_{role}"
        made = subprocess.run(REFLEXDB + ["db", "user", name, "--role", role, "--password-env", "NEW_PW"],
                              env=dict(env, NEW_PW=PASSWORD), capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        assert f"login role {name!r} is a member of reflexdb_{role}" in made.stdout
        assert PASSWORD not in made.stdout + made.stderr and ":***@" in made.stdout
        logins[role] = _as(db_url, name)
    return logins


def test_the_password_is_sent_hashed(roles, store):
    [(stored,)] = rows(store, "SELECT rolpassword FROM pg_authid WHERE rolname = 'reflexdb_t_collector'")
    assert stored.startswith("SCRAM-SHA-256$") and PASSWORD not in stored


def test_a_learner_steps_under_its_role(roles, store, tmp_path, monkeypatch, model_cache):
    seed_groups(store, "learn-test", 4)
    learner_store = Store.open(roles["learner"])
    try:
        lr, _ = _learner(learner_store, tmp_path, monkeypatch)
        lr.setup()
        lr.run(max_steps=2)
    finally:
        learner_store.close()
    assert rows(store, "SELECT (SELECT max(step) FROM learner_steps), (SELECT max(version) FROM policy_versions)") == [(2, 2)]
    # the role wrote each step's advantage stages and its rows' advantages (revision 0023)
    assert rows(store, "SELECT DISTINCT advantage_stages FROM learner_steps") == [(["group"],)]
    assert rows(store, "SELECT count(*), count(advantages) FROM consumption") == [(16, 16)]
    assert rows(store, "SELECT count(*) FROM token_signals") == [(16,)]  # and what its loss used per token (0028)
    refused = ["DELETE FROM trajectories", "DELETE FROM groups", "UPDATE trajectories SET reward = 0",
               "UPDATE groups SET kind = 'eval'", "DROP TABLE consumption"]
    assert _refused(roles["learner"], refused) == refused


def test_the_collector_role_may_not_create_or_change_runs(roles, store):
    """A run's config once named the directory `reflexdb runs delete` removed (issue 60): a
    collector's login creates no run and changes none; the learner's creates them and records the
    embedding dimension collectors wait for."""
    planted = ("INSERT INTO runs (name, config) VALUES ('planted', "
               "'{\"learner\": {\"checkpoint_dir\": \"/srv/other-run\"}}')")
    refused = [planted, "INSERT INTO runs (name) VALUES ('p')", "UPDATE runs SET embedding_dim = 1",
               "UPDATE runs SET config = '{}'", "UPDATE runs SET embedding_model = 'x'"]
    assert _refused(roles["collector"], refused) == refused
    assert _refused(roles["learner"], [planted, "UPDATE runs SET embedding_dim = 1"]) == []
    run = Store.open(roles["learner"])
    try:
        run_id = run.create_run("made-by-the-learner")
        assert run.record_embedding_dim(run_id, 64, "tiny") == 64 and run.record_embedding_dim(run_id, 32, "x") == 64
    finally:
        run.close()


def test_upgrade_regrants_when_the_roles_exist(roles, db_url):
    """A migration that adds a table would leave it ungranted; `db upgrade` grants again."""
    from reflexdb.db import make_engine

    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("REVOKE ALL ON policy_versions FROM reflexdb_collector")
    assert _refused(roles["collector"], ["SELECT * FROM policy_versions"]) != []
    admin.downgrade(db_url, "0004")
    admin.upgrade(db_url)
    assert _refused(roles["collector"], ["SELECT * FROM policy_versions"]) == []
    engine.dispose()


def test_each_method_grants_its_own_tables(roles, store):
    """A method's grants come from its package (<package>/sql/roles.sql), run after reflexdb's own:
    collectors write R3L's reflections, CLEANER's rollbacks and LTE's stages and hints, and claim
    NexGRPO's replay requests, but never post one (the learner does) or delete any."""
    from reflexdb.roles import method_grants

    assert len(method_grants()) >= 4  # nexgrpo, lte, r3l, cleaner
    checks = [("reflexdb_collector", "reflections", "INSERT", True),
              ("reflexdb_collector", "trajectory_reflections", "INSERT", True),
              ("reflexdb_collector", "purifications", "INSERT", True),
              ("reflexdb_collector", "hints", "INSERT", True),
              ("reflexdb_collector", "trajectory_hints", "INSERT", True),
              ("reflexdb_collector", "lte_stages", "INSERT", True),
              ("reflexdb_collector", "lte_hint_pool", "SELECT", True),
              ("reflexdb_collector", "lte_group_drops", "SELECT", True),  # LTE's Method.drops: admission reads it
              ("reflexdb_collector", "nexgrpo_retired_tasks", "SELECT", True),
              ("reflexdb_collector", "replay_requests", "INSERT", False),
              ("reflexdb_collector", "reflections", "DELETE", False),
              ("reflexdb_learner", "replay_requests", "INSERT", True),
              ("reflexdb_learner", "lte_stages", "UPDATE", True),
              ("reflexdb_reader", "reflections", "SELECT", True),
              ("reflexdb_reader", "lte_stages", "UPDATE", False)]
    got = [(role, table, priv, rows(store, f"SELECT has_table_privilege('{role}', '{table}', '{priv}')")[0][0])
           for role, table, priv, _ in checks]
    assert got == checks
    claim = ("UPDATE lte_stages SET status = 'claimed', claimed_by = 'c', claimed_at = now(), mode = 'hint', "
             "hint_id = NULL, lte_group_id = NULL, n_sampled = 0, n_correct = 0, completed_at = now()")
    assert _refused(roles["collector"], [claim, "UPDATE replay_requests SET status = 'done'"]) == []
    assert _refused(roles["collector"], ["UPDATE lte_stages SET run_id = 0"]) == ["UPDATE lte_stages SET run_id = 0"]
    assert _refused(roles["collector"], ["SELECT group_id FROM lte_group_drops"]) == []
