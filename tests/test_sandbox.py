"""The tool sandbox (collector/sandbox.py): every hostile case of issue 24 is contained, reported to
the episode as a tool error, and the caller (standing in for the collector) keeps running with its
files, environment and database intact."""

from __future__ import annotations

import os
import time

import pytest

from reflexdb.collector.sandbox import PythonSandbox, SandboxLimits, SandboxUnavailable, ToolResult

pytestmark = pytest.mark.timeout(120)

# Short limits keep the suite fast; the defaults (4 s, 256 MB, 16 processes) behave the same way.
LIMITS = SandboxLimits(timeout_s=1.5, cpu_s=2, memory_mb=256, processes=16, output_bytes=64 * 1024, scratch_mb=8)
SECRET = "postgresql://reflexdb:hunter2-secret@127.0.0.1:5432/test"


@pytest.fixture(scope="module")
def sandbox():
    box = PythonSandbox(LIMITS, max_concurrency=4)
    box.check()
    return box


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """The collector's side: a home with a config and a secret in the environment."""
    (tmp_path / "config.yaml").write_text(f"database_url: {SECRET}\n")
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path))
    monkeypatch.setenv("REFLEXDB_DATABASE_URL", SECRET)
    return tmp_path


def _contained(res: ToolResult, *statuses: str) -> None:
    assert res.status in statuses, res
    assert res.failed
    assert res.observation()  # the episode always gets something to read


def test_plain_code_runs_and_prints(sandbox):
    res = sandbox.run("print(sum(i * i for i in range(10)))")
    assert res.status == "ok" and res.exit_code == 0 and res.stdout == "285\n" and not res.failed
    assert res.observation() == "285"


def test_an_exception_is_an_error_with_its_traceback(sandbox):
    res = sandbox.run("x = 1\ny = x / 0\n")
    _contained(res, "error")
    assert res.exit_code == 1
    assert "ZeroDivisionError" in res.stderr and "ZeroDivisionError" in res.observation()


def test_infinite_loop_times_out(sandbox):
    t0 = time.monotonic()
    res = sandbox.run("while True:\n    pass\n")
    _contained(res, "timeout", "limit")
    assert time.monotonic() - t0 < LIMITS.timeout_s + 2
    assert "Timed out" in res.observation() or "CPU" in res.observation()


def test_fork_bomb_is_held_to_the_process_limit(sandbox):
    counted = sandbox.run(
        "import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(1)\n        os._exit(0)\n"
        "    n += 1\nprint(n)\n")
    assert counted.status == "ok" and int(counted.stdout) < LIMITS.processes, counted
    bomb = sandbox.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    _contained(bomb, "timeout", "limit", "error")
    assert sandbox.run("print('after')").stdout == "after\n"  # nothing left behind holds the slots


def test_allocating_10_gb_fails_inside(sandbox):
    res = sandbox.run("x = bytearray(10 * 1024 ** 3)\n")
    _contained(res, "error")
    assert "MemoryError" in res.stderr


def test_writing_outside_the_scratch_directory_is_refused(sandbox, home):
    for target in ("/usr/evil", "/lib/evil", f"{home}/evil", "/etc/passwd"):
        res = sandbox.run(f"open({target!r}, 'w').write('x')\n")
        _contained(res, "error")
        assert not os.path.exists(f"{home}/evil")
    ok = sandbox.run("import os\nopen('notes.txt', 'w').write('hi')\nprint(os.getcwd(), open('/tmp/notes.txt').read())")
    assert ok.stdout == "/tmp hi\n"
    assert sandbox.run("import os; print(os.listdir('/tmp'))").stdout == "[]\n"  # fresh per call


def test_a_file_beyond_the_scratch_limit_is_refused(sandbox):
    res = sandbox.run("open('big', 'wb').write(b'x' * (64 * 1024 * 1024))\n")
    _contained(res, "error", "limit")


def test_the_collectors_files_and_environment_are_invisible(sandbox, home):
    res = sandbox.run(
        "import os\nprint(sorted(os.listdir('/')))\n"
        f"print(os.path.exists({str(home)!r}), os.path.exists('/etc'), os.path.exists('/root'), os.path.exists('/work'))\n"
        "print(sorted(os.environ))\nprint(open('/proc/self/environ', 'rb').read())\n")
    assert res.status == "ok", res
    lines = res.stdout.splitlines()
    assert lines[0] == "['bin', 'lib', 'lib64', 'proc', 'tmp', 'usr']"
    assert lines[1] == "False False False False"
    assert "REFLEXDB_DATABASE_URL" not in res.stdout and "hunter2" not in res.stdout
    assert "REFLEXDB_HOME" not in res.stdout
    read = sandbox.run(f"print(open({str(home / 'config.yaml')!r}).read())")
    _contained(read, "error")
    assert "FileNotFoundError" in read.stderr and "hunter2" not in read.stdout + read.stderr


def test_no_network_to_the_database(sandbox, db_url):
    tcp = sandbox.run("import socket\nsocket.create_connection(('127.0.0.1', 5432), timeout=1)\n")
    _contained(tcp, "error")
    assert "Error" in tcp.stderr
    # the embedded server listens on a unix socket under REFLEXDB_HOME or /tmp: neither is mounted,
    # and abstract sockets belong to the network namespace
    from urllib.parse import parse_qs, urlsplit

    url = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    host = parse_qs(urlsplit(url).query).get("host", ["/var/run/postgresql"])[0]
    if not host.startswith("/"):
        host = "/var/run/postgresql"
    path = f"{host}/.s.PGSQL.{urlsplit(url).port or 5432}"
    unix = sandbox.run(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\n")
    _contained(unix, "error")
    assert "FileNotFoundError" in unix.stderr or "ConnectionRefusedError" in unix.stderr
    abstract = sandbox.run("import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0reflexdb')\n")
    _contained(abstract, "error")


def test_printing_100_mb_is_cut_off(sandbox):
    t0 = time.monotonic()
    res = sandbox.run("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1024 * 1024)\n")
    _contained(res, "limit")
    assert "output over" in res.detail
    assert len(res.stdout) <= LIMITS.output_bytes and time.monotonic() - t0 < LIMITS.timeout_s + 2
    assert len(res.observation()) <= 2000


def test_killing_its_parent_reaches_nothing_outside(sandbox):
    me = os.getpid()
    for code in ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')\n",
                 "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
                 f"import os, signal\nos.kill({me}, signal.SIGKILL)\n",
                 f"import os, signal\nos.kill({os.getppid()}, signal.SIGKILL)\n"):
        sandbox.run(code)
    assert os.getpid() == me  # we are still running, and so is our parent
    os.kill(os.getppid(), 0)


def test_exit_codes_are_errors(sandbox):
    res = sandbox.run("import sys\nprint('partial')\nsys.exit(3)\n")
    _contained(res, "error")
    assert res.exit_code == 3 and res.stdout == "partial\n"
    assert "partial" in res.observation()
    thread = sandbox.run("import os, threading, time\nthreading.Thread(target=lambda: os._exit(7)).start()\n"
                         "time.sleep(1)\nprint('not reached')\n")
    _contained(thread, "error")
    assert thread.exit_code == 7 and "not reached" not in thread.stdout
    assert sandbox.run("import sys; sys.exit(0)").status == "ok"


def test_calls_run_concurrently_and_in_order(sandbox):
    codes = [f"import time\ntime.sleep(0.5)\nprint({i})" for i in range(8)]
    t0 = time.monotonic()
    results = sandbox.run_many(codes)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert time.monotonic() - t0 < 8 * 0.5  # not one at a time (bound 4: two waves)


def test_hostile_calls_leave_the_caller_and_its_data_intact(sandbox, home, db_url):
    import psycopg

    url = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url) as conn:
        before = conn.execute("SELECT 1").fetchone()
    hostile = ["while True: pass", "x = bytearray(10 * 1024 ** 3)", "import os\nwhile True:\n    os.fork()",
               "import sys\nsys.stdout.write('x' * 10 ** 8)", "import os; os.kill(-1, 9)",
               f"open({str(home / 'config.yaml')!r}, 'w').write('')"]
    results = sandbox.run_many(hostile)
    assert all(r.failed for r in results), results
    assert (home / "config.yaml").read_text() == f"database_url: {SECRET}\n"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == before


def test_limits_are_validated():
    with pytest.raises(ValueError, match="sandbox.timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="sandbox.processes"):
        SandboxLimits(processes=-1)


def test_no_sandbox_means_a_one_line_error_never_a_fallback(monkeypatch, tmp_path):
    with pytest.raises(SandboxUnavailable, match="no interpreter"):
        PythonSandbox(python=str(tmp_path / "nope"))
    fake = tmp_path / "nsjail"
    fake.write_text("#!/bin/sh\necho '[E][x] clone(flags=CLONE_NEWUSER) failed: Operation not permitted' >&2\nexit 255\n")
    fake.chmod(0o755)
    monkeypatch.setenv("NSJAIL", str(fake))
    box = PythonSandbox(LIMITS)
    with pytest.raises(SandboxUnavailable) as err:
        box.check()
    msg = str(err.value)
    assert "\n" not in msg and "Operation not permitted" in msg and "never run unsandboxed" in msg
