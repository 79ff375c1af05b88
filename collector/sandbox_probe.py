"""The start-up probe of the tool sandbox: run *inside* the jail by ``PythonSandbox.check()``.

It reports what tool code can see and do, as one JSON line on stdout; the collector's side
(``collector/sandbox.py``, :func:`~reflexdb.collector.sandbox.isolation_problems`) decides whether
that is isolated enough. The probe only observes: it asserts nothing itself, so a wrapper that
isolates nothing still gets every question asked. Runs on the system's Python 3 (3.8+), standard
library only; it is sent to the interpreter on stdin, never imported by the collector.
"""

import ctypes
import errno
import json
import os
import platform
import socket

# Syscall numbers of the calls the seccomp policy refuses, for the machines nsjail runs on.
SYSCALLS = {
    "x86_64": {"keyctl": 250, "unshare": 272, "io_uring_setup": 425, "bpf": 321, "add_key": 248},
    "aarch64": {"keyctl": 219, "unshare": 97, "io_uring_setup": 425, "bpf": 280, "add_key": 217},
}
CLONE_NEWUSER = 0x10000000


def refused_syscalls():
    """``{name: errno}`` of a harmless call of each; 0: it was allowed."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return {"unknown architecture": platform.machine()}
    libc = ctypes.CDLL(None, use_errno=True)
    args = {"keyctl": (0, 0), "unshare": (CLONE_NEWUSER,), "io_uring_setup": (1, 0), "bpf": (0, 0, 0),
            "add_key": (b"user", b"probe", b"x", 1, -3)}
    out = {}
    for name, number in numbers.items():
        ctypes.set_errno(0)
        ret = libc.syscall(number, *args[name])
        out[name] = ctypes.get_errno() if ret == -1 else 0
    return out


def mounts():
    """``{top-level entry of /: read-only?}``."""
    out = {}
    for entry in sorted(os.listdir("/")):
        try:
            out[entry] = bool(os.statvfs("/" + entry).f_flag & os.ST_RDONLY)
        except OSError:
            out[entry] = None
    return out


def network():
    facts = {"interfaces": [name for _, name in socket.if_nameindex()]}
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect(("127.0.0.1", 5432))
        facts["database_port"] = "connected"
    except OSError as exc:
        facts["database_port"] = errno.errorcode.get(exc.errno or 0, str(exc))
    finally:
        s.close()
    try:  # a server and a client of our own on loopback: usable only where loopback is up
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client = socket.create_connection(server.getsockname(), timeout=1)
        client.close()
        server.close()
        facts["loopback"] = "usable"
    except OSError as exc:
        facts["loopback"] = errno.errorcode.get(exc.errno or 0, str(exc))
    return facts


def status_fields():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Seccomp", "NoNewPrivs", "CapEff"):
                fields[key] = value.strip()
    return fields


def main():
    held = b"x" * (24 * 1024 * 1024)  # touched pages: the call's cgroup must account for them
    facts = {
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
        "uid_map": open("/proc/self/uid_map").read().split(),
        "mounts": mounts(),
        "tmp_writable": os.access("/tmp", os.W_OK),
        "environment": sorted(os.environ),
        "status": status_fields(),
        "refused": refused_syscalls(),
        "held_bytes": len(held),
    }
    facts.update(network())
    print(json.dumps(facts))


if __name__ == "__main__":  # on the jail's stdin; importing it runs nothing
    main()
