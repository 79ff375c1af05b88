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

# Calls the seccomp filter must refuse, with harmless arguments, by number on each machine nsjail
# runs on. The first five are the kernel's riskiest; the next five are calls a deny list forgets
# (newer than the list, or a sibling of a refused call): an allow list refuses them with EPERM
# (issue 50). The last is a number no kernel has yet: ENOSYS, so a library would fall back.
_SHARED = {"quotactl_fd": (443, (-1, 0, 0, 0)), "set_mempolicy_home_node": (450, (0, 0, 0, 0)),
           "statmount": (457, (0, 0, 0, 0)), "listmount": (458, (0, 0, 0, 0)),
           "open_tree_attr": (467, (-1, 0, 0, 0, 0)), "a call newer than the filter": (500, ())}
SYSCALLS = {
    "x86_64": {"keyctl": (250, (0, 0)), "unshare": (272, (0x10000000,)), "io_uring_setup": (425, (1, 0)),
               "bpf": (321, (0, 0, 0)), "add_key": (248, (b"user", b"probe", b"x", 1, -3)),
               "socket(AF_INET)": (41, (2, 1, 0)), "socket(AF_NETLINK)": (41, (16, 3, 0)), **_SHARED},
    "aarch64": {"keyctl": (219, (0, 0)), "unshare": (97, (0x10000000,)), "io_uring_setup": (425, (1, 0)),
                "bpf": (280, (0, 0, 0)), "add_key": (217, (b"user", b"probe", b"x", 1, -3)),
                "socket(AF_INET)": (198, (2, 1, 0)), "socket(AF_NETLINK)": (198, (16, 3, 0)), **_SHARED},
}
#: What each refused call must answer: EPERM, but ENOSYS for a call newer than the filter.
EXPECTED = {name: errno.ENOSYS if name == "a call newer than the filter" else errno.EPERM
            for name in SYSCALLS["x86_64"]}


def refused_syscalls():
    """``{name: errno}`` of a harmless call of each; 0: it was allowed."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return {"unknown architecture": platform.machine()}
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    for name, (number, args) in numbers.items():
        ctypes.set_errno(0)
        ret = libc.syscall(number, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
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


def interfaces():
    """The network interfaces of this network namespace (``/proc/net/dev``: listing them through
    ``socket.if_nameindex`` needs a netlink socket, which the filter refuses)."""
    try:
        with open("/proc/net/dev") as f:
            return [line.split(":")[0].strip() for line in f.readlines()[2:] if ":" in line]
    except OSError as exc:
        return [f"unreadable: {errno.errorcode.get(exc.errno or 0, exc)}"]


def network():
    facts = {"interfaces": interfaces()}
    try:
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", 5432))
            facts["database_port"] = "connected"
        finally:
            s.close()
    except OSError as exc:
        facts["database_port"] = errno.errorcode.get(exc.errno or 0, str(exc))
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
