"""Per-call control groups for the tool sandbox (collector/sandbox.py, docs/sandbox.md).

An rlimit bounds one process; a tool call may start several, and memory it maps through SysV
shared memory, ``memfd_create`` or files in its tmpfs belongs to no process's address space. A
memory cgroup charges every page the call's processes touch, shared and file pages included, so
one limit holds for the whole call. Each call gets its own cgroup (one per controller on cgroup
v1, one directory on v2) under ``reflexdb-sandbox/`` beside the collector's own cgroup:

- **memory**: ``memory_mb`` for everything the call holds (no swap); past it the kernel's OOM
  killer ends the call, and the call's ``oom_kill`` count says so;
- **pids**: ``processes`` processes and threads (plus nsjail itself);
- **cpu**: a quota of ``cpus`` CPUs, and the CPU time of all its processes (``cpuacct`` on v1,
  ``cpu.stat`` on v2), which the sandbox reads while the call runs to stop it at ``cpu_s``.

The nsjail process joins the call's cgroup before it executes (:meth:`CallCgroup.enter`, run in
the forked child), so nothing of the call ever runs outside it. After the call the accounting is
read, anything left in the cgroup is killed, and the cgroup removed.

Which hierarchy: cgroup v2 when the unified hierarchy offers the memory, pids and cpu
controllers (a pure v2 machine, or a hybrid one that moved them there), else the v1 hierarchies
of memory, pids, cpu and cpuacct. ``REFLEXDB_SANDBOX_CGROUP`` names the parent directory to use
instead (a cgroup delegated to the collector's user, as systemd's ``Delegate=yes`` gives).
Where none can be created, :class:`CgroupUnavailable` says why in one line: the sandbox then
refuses to start (there is no weaker fallback).

We manage the cgroups ourselves rather than through nsjail's ``--cgroup_*`` flags: nsjail removes
its cgroup when the call ends, before its accounting (peak memory, OOM kills, CPU time) could be
read, and those numbers are what makes a call's status exact and what each call records.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

#: The directory created under the collector's own cgroup (per controller on v1).
PARENT = "reflexdb-sandbox"
ENV = "REFLEXDB_SANDBOX_CGROUP"
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
V2_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000

_counter = itertools.count()


class CgroupUnavailable(Exception):
    """No per-call cgroup can be made on this machine; the message says why, in one line."""


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    pids: int
    cpus: float


@dataclass(frozen=True)
class Usage:
    """What a call's cgroup accounted for."""

    cpu_s: float  # CPU time of every process of the call (user + system)
    memory_peak_bytes: int | None  # the most memory it held at once (None: the kernel does not say)
    oom_kills: int  # processes the memory limit killed
    pids_refused: int  # forks and thread starts refused by the process limit


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _mounts(mountinfo: str) -> tuple[dict[str, Path], Path | None]:
    """``({v1 controller: mount point}, v2 mount point)`` from /proc/self/mountinfo."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = point
        elif fstype == "cgroup":
            for c in options:
                if c in V1_CONTROLLERS:
                    v1.setdefault(c, point)
    return v1, v2


def _own_paths(proc_cgroup: str) -> tuple[dict[str, str], str]:
    """``({v1 controller: this process's cgroup}, its v2 cgroup)`` from /proc/self/cgroup."""
    v1: dict[str, str] = {}
    v2 = "/"
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        for c in controllers.split(","):
            v1[c] = path
    return v1, v2


def _inside(mount: Path, path: str) -> Path:
    """The directory of cgroup ``path`` under ``mount`` (the mount itself when that directory is
    not visible, as in a container whose cgroup namespace hides its ancestors)."""
    d = mount / path.lstrip("/")
    return d if d.is_dir() else mount


class Cgroups:
    """Creates one cgroup per call under a parent made once; see the module docstring."""

    def __init__(self, *, mountinfo: str | None = None, proc_cgroup: str | None = None,
                 parent: str | None = None):
        mountinfo = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
        proc_cgroup = Path("/proc/self/cgroup").read_text() if proc_cgroup is None else proc_cgroup
        parent = os.environ.get(ENV) if parent is None else parent
        v1_mounts, v2_mount = _mounts(mountinfo)
        v1_own, v2_own = _own_paths(proc_cgroup)
        if parent:
            self.version, self.parents = self._explicit(Path(parent), v2_mount)
        elif v2_mount is not None and set(V2_CONTROLLERS) <= self._available(v2_mount):
            base = _inside(v2_mount, v2_own)
            self.version, self.parents = 2, {"": self._make_v2_parent(base)}
        elif set(V1_CONTROLLERS) <= set(v1_mounts):
            self.version = 1
            self.parents = {c: self._mkdir(_inside(v1_mounts[c], v1_own.get(c, "/")) / PARENT)
                            for c in V1_CONTROLLERS}
        else:
            missing = sorted(set(V1_CONTROLLERS) - set(v1_mounts))
            raise CgroupUnavailable(
                "no cgroup hierarchy with the memory, pids and cpu controllers is mounted "
                f"(cgroup v1 lacks {', '.join(missing)}; cgroup v2 "
                f"{'is not mounted' if v2_mount is None else 'does not offer them'})")
        self._sweep()

    # ------------------------------------------------------------------ set-up

    @staticmethod
    def _available(v2_mount: Path) -> set[str]:
        try:
            return set(_read(v2_mount / "cgroup.controllers").split())
        except OSError:
            return set()

    @staticmethod
    def _mkdir(path: Path) -> Path:
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create the cgroup {path}: {exc.strerror}"
                                    f"{' (run the collector as root, or delegate a cgroup to its user and name it in ' + ENV + ')' if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ''}") from None
        return path

    def _make_v2_parent(self, base: Path) -> Path:
        parent = self._mkdir(base / PARENT)
        self._enable(base)
        self._enable(parent)
        return parent

    @staticmethod
    def _enable(directory: Path) -> None:
        """Turn the three controllers on for ``directory``'s children (v2's subtree_control)."""
        control = directory / "cgroup.subtree_control"
        try:
            on = set(_read(control).split())
            want = [c for c in V2_CONTROLLERS if c not in on]
            if want:
                _write(control, " ".join(f"+{c}" for c in want))
        except OSError as exc:
            hint = (" (the cgroup holds processes, so cgroup v2 cannot enable controllers below it: give the "
                    f"collector a delegated cgroup and name it in {ENV})" if exc.errno == errno.EBUSY else "")
            raise CgroupUnavailable(f"cannot enable the memory, pids and cpu controllers in {control}: "
                                    f"{exc.strerror}{hint}") from None

    def _explicit(self, parent: Path, v2_mount: Path | None) -> tuple[int, dict[str, Path]]:
        if not parent.is_dir():
            raise CgroupUnavailable(f"{ENV}={parent}: no such cgroup directory")
        if not (parent / "cgroup.controllers").exists():
            raise CgroupUnavailable(f"{ENV}={parent}: not a cgroup v2 directory (v1 uses the collector's own cgroups)")
        missing = set(V2_CONTROLLERS) - self._available(parent)
        if missing:
            raise CgroupUnavailable(f"{ENV}={parent}: the {', '.join(sorted(missing))} controller(s) are not "
                                    "available there")
        self._enable(parent)
        return 2, {"": parent}

    def _sweep(self) -> None:
        """Remove empty call cgroups a killed collector left behind."""
        for parent in self.parents.values():
            for d in parent.glob("call-*"):
                try:
                    d.rmdir()
                except OSError:
                    pass

    # ------------------------------------------------------------------ per call

    def create(self, limits: CgroupLimits) -> CallCgroup:
        name = f"call-{os.getpid()}-{next(_counter)}"
        dirs = {c: p / name for c, p in self.parents.items()}
        made = []
        try:
            for d in dirs.values():
                d.mkdir()
                made.append(d)
            cg = CallCgroup(self.version, dirs)
            cg.set_limits(limits)
        except OSError as exc:
            for d in made:
                try:
                    d.rmdir()
                except OSError:
                    pass
            raise CgroupUnavailable(f"cannot create a call's cgroup under {next(iter(self.parents.values()))}: "
                                    f"{exc.strerror or exc}") from None
        return cg

    def describe(self) -> str:
        return f"cgroup v{self.version} at {', '.join(str(p) for p in self.parents.values())}"


class CallCgroup:
    """One call's cgroup: limits, joining it, accounting, and removal."""

    def __init__(self, version: int, dirs: dict[str, Path]):
        self.version = version
        self.dirs = dirs
        self._procs = [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for d in dirs.values()]

    def _dir(self, controller: str) -> Path:
        return self.dirs[""] if self.version == 2 else self.dirs[controller]

    def set_limits(self, limits: CgroupLimits) -> None:
        quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
        if self.version == 2:
            d = self.dirs[""]
            _write(d / "memory.max", str(limits.memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(limits.pids))
            _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            mem = self.dirs["memory"]
            _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():  # no swap either (memsw >= the limit)
                _write(mem / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            _write(self.dirs["pids"] / "pids.max", str(limits.pids))
            _write(self.dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(quota))

    def limits(self) -> CgroupLimits:
        """The limits as the kernel holds them (read back: what ``check()`` compares)."""
        if self.version == 2:
            d = self.dirs[""]
            memory = int(_read(d / "memory.max"))
            pids = int(_read(d / "pids.max"))
            quota, period = _read(d / "cpu.max").split()
        else:
            memory = int(_read(self.dirs["memory"] / "memory.limit_in_bytes"))
            pids = int(_read(self.dirs["pids"] / "pids.max"))
            quota = _read(self.dirs["cpu"] / "cpu.cfs_quota_us").strip()
            period = _read(self.dirs["cpu"] / "cpu.cfs_period_us").strip()
        return CgroupLimits(memory, pids, int(quota) / int(period))

    def enter(self) -> None:
        """Move the calling process into the cgroup. Runs in the forked child before it executes
        nsjail (``Popen(preexec_fn=...)``): only ``os.write`` on descriptors opened beforehand."""
        for fd in self._procs:
            os.write(fd, b"0")

    def cpu_seconds(self) -> float:
        """CPU time used so far by every process of the call."""
        try:
            if self.version == 2:
                return _keyed(_read(self.dirs[""] / "cpu.stat")).get("usage_usec", 0) / 1e6
            return int(_read(self.dirs["cpuacct"] / "cpuacct.usage")) / 1e9
        except (OSError, ValueError):
            return 0.0

    def usage(self) -> Usage:
        """The call's accounting; what the kernel does not say (an older kernel, a file gone) is
        ``None`` or 0, never an exception."""
        try:
            return self._usage()
        except (OSError, ValueError):
            return Usage(self.cpu_seconds(), None, 0, 0)

    def _usage(self) -> Usage:
        if self.version == 2:
            d = self.dirs[""]
            peak = int(_read(d / "memory.peak")) if (d / "memory.peak").exists() else None
            oom = _keyed(_read(d / "memory.events")).get("oom_kill", 0)
            refused = _keyed(_read(d / "pids.events")).get("max", 0)
        else:
            mem = self.dirs["memory"]
            peak = int(_read(mem / "memory.max_usage_in_bytes"))
            oom = _keyed(_read(mem / "memory.oom_control")).get("oom_kill", 0)
            refused = _keyed(_read(self.dirs["pids"] / "pids.events")).get("max", 0) \
                if (self.dirs["pids"] / "pids.events").exists() else 0
        return Usage(self.cpu_seconds(), peak, oom, refused)

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs.values():
            try:
                out |= {int(p) for p in _read(d / "cgroup.procs").split()}
            except OSError:
                pass
        return sorted(out)

    def kill(self) -> None:
        """SIGKILL every process still in the cgroup (a double-forked daemon included)."""
        if self.version == 2 and (self.dirs[""] / "cgroup.kill").exists():
            try:
                _write(self.dirs[""] / "cgroup.kill", "1")
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Kill what is left, then remove the cgroup (retried while exiting processes leave it).
        Whether it is gone; a cgroup that stays is swept at the next start."""
        for fd in self._procs:
            os.close(fd)
        self._procs = []
        deadline = time.monotonic() + timeout_s
        pending = list(self.dirs.values())
        while pending:
            self.kill()
            left = []
            for d in pending:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            pending = left
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        return not pending
