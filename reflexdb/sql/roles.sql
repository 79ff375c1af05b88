-- Least-privilege roles (reflexdb.roles; `reflexdb db roles`, docs/operations.md "Roles").
-- Three group roles (NOLOGIN): people and machines log in as their own roles, members of one.
-- Roles belong to the server; the grants below are made on the current database (and must be
-- made again after a migration adds tables: `reflexdb db upgrade` does it when the roles exist).
-- Blocks run in file order, then the block "grants" of each installed method's own roles.sql
-- (<package>/sql/roles.sql: its tables and views). Views run with their owner's rights, so
-- granting a view exposes exactly its columns.

-- name: create_roles
-- The three roles, created once per server.
DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['reflexdb_collector', 'reflexdb_learner', 'reflexdb_reader'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;  -- created meanwhile
            END;
        END IF;
    END LOOP;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO reflexdb_collector, reflexdb_learner, reflexdb_reader',
                   current_database());
END $$;

-- name: reset
-- Start from no privileges on this database's tables and sequences (the grants are re-made whole).
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM reflexdb_collector, reflexdb_learner, reflexdb_reader;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM reflexdb_collector, reflexdb_learner, reflexdb_reader;
GRANT USAGE ON SCHEMA public TO reflexdb_collector, reflexdb_learner, reflexdb_reader;

-- name: reader
-- People with psql: read everything, change nothing.
GRANT SELECT ON ALL TABLES IN SCHEMA public TO reflexdb_reader;

-- name: collector
-- Collectors on other machines: claim tasks and replay requests, write groups, read policy
-- versions and the settings admission control needs. Never: DELETE anything; UPDATE trained data
-- (groups, trajectories, payloads, embeddings, turns); read another run's config (runs.config);
-- touch the learner's tables (learner_steps, consumption, policy_versions beyond reading); INSERT
-- or UPDATE runs (a run's config names where `reflexdb runs delete` used to delete: the learner
-- creates the run and records its embedding dimension, and a collector waits for both).
GRANT SELECT ON alembic_version, policy_versions, run_settings, tasks, groups, trajectories, turns,
                token_bytes, token_payloads, trajectory_tokens, embeddings, collectors, origins, group_kinds
    TO reflexdb_collector;
GRANT SELECT (id, name, algorithm, embedding_dim, embedding_model, created_at) ON runs TO reflexdb_collector;
GRANT INSERT ON tasks, groups, trajectories, turns, token_bytes, embeddings, collectors TO reflexdb_collector;
GRANT UPDATE (claimed_by, claimed_at, times_collected, times_passed) ON tasks TO reflexdb_collector;
GRANT UPDATE (host, pid, engine, model, policy_version, status, started_at, last_seen, stopped_at, groups_written,
              trajectories_written, tokens_generated, reward_errors, skipped_rows, rejected_groups, last_rejection,
              unverified_rewards, phase_seconds)
    ON collectors TO reflexdb_collector;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO reflexdb_collector;

-- name: learner
-- The learner (and `reflexdb eval` on its machine): read everything; record steps and their
-- consumption and token signals (and delete unpublished ones on resume); publish versions; set run settings; post
-- replay requests; write evaluation groups. Never DELETE or UPDATE collected data beyond the
-- times_sampled counter its own records keep.
GRANT SELECT ON ALL TABLES IN SCHEMA public TO reflexdb_learner;
GRANT INSERT (name, algorithm, config) ON runs TO reflexdb_learner;
GRANT UPDATE (embedding_dim, embedding_model) ON runs TO reflexdb_learner;
GRANT INSERT, UPDATE ON run_settings TO reflexdb_learner;
GRANT INSERT, UPDATE, DELETE ON learner_steps, consumption, token_signals TO reflexdb_learner;
GRANT UPDATE (times_sampled) ON trajectories TO reflexdb_learner;
GRANT INSERT ON policy_versions TO reflexdb_learner;
GRANT INSERT ON tasks, groups, trajectories, turns, token_bytes, embeddings TO reflexdb_learner;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO reflexdb_learner;
