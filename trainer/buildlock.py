"""Never wait silently on torch's extension build lock.

DeepSpeed JIT-builds a small op (``deepspeed_shm_comm``) when it starts on CPU; torch serialises
builds with a lock file, ``<extensions dir>/<op>/lock`` (``torch.utils.file_baton.FileBaton``),
taken at *every* start while ninja checks that the op is up to date. A process killed in that
window (well under a second) leaves the file behind, and every later start waits for it forever,
printing nothing.

The holder of a live lock keeps the file open (``FileBaton`` holds its descriptor until it
releases), so a lock file that no process has open was left by a dead one. While DeepSpeed
starts, :class:`BuildLockWatch` looks every second: a lock no process holds, twice in a row, is
removed with a line saying so; a lock another process holds is named once (who, which file) so
the wait is never silent. Where other processes' descriptors cannot be read (``/proc`` missing or
not ours), it says which file it waits on and how to remove it.

The first start on a machine builds the op (a minute or so, printing nothing of its own): the
watch says so as it starts, naming the folder and that it happens once (:func:`op_to_build`).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Callable


def extensions_root() -> Path:
    """Where torch builds JIT extensions: ``$TORCH_EXTENSIONS_DIR``, else its default per Python/accelerator."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    if torch.version.hip is not None:
        accel = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accel = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accel = "cpu"
    return Path(get_default_build_root()) / f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}_{accel}"


def op_to_build(root: Path, builder: str = "ShareMemCommBuilder") -> tuple[str, Path] | None:
    """The op DeepSpeed's start will JIT-build here (``builder``: its op builder's class name; by
    default the communication op, or ``CPUAdamBuilder`` for an offloaded optimizer), and the folder
    it builds it in (``root/<op>``); ``None`` when it builds none: no such op on this accelerator
    (CUDA), one installed prebuilt with DeepSpeed, or one built already (its ``.so`` is there)."""
    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import installed_ops

        builder = get_accelerator().create_op_builder(builder)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            return None
        if installed_ops.get(builder.NAME, False):
            return None
    except Exception:  # noqa: BLE001 - another DeepSpeed: the line is a courtesy, never a failure
        return None
    folder = root / builder.NAME
    if (folder / f"{builder.NAME}.so").exists():
        return None
    return builder.NAME, folder


def lock_holders(lock: Path) -> set[int] | None:
    """PIDs with ``lock`` open, or ``None`` if that cannot be known here (no /proc, no permission)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    target = os.path.realpath(lock)
    holders: set[int] = set()
    unknown = False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except PermissionError:
            unknown = True
            continue
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue  # exited meanwhile
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    holders.add(int(entry.name))
                    break
            except OSError:
                continue
    if not holders and unknown:
        return None
    return holders


class BuildLockWatch:
    """Watch torch's extension build locks while DeepSpeed starts (a context manager).

    Args:
        say: where the lines go (the learner's echo).
        builder: the op builder whose first build is announced (:func:`op_to_build`).
        root: the extensions directory (default: :func:`extensions_root`).
        interval: seconds between looks.
    """

    def __init__(self, say: Callable[[str], None], *, builder: str = "ShareMemCommBuilder", root: Path | None = None,
                 interval: float = 1.0):
        self.say = say
        self.builder = builder
        self.root = root
        self.interval = interval
        self._stop = threading.Event()
        self._told: set[tuple[Path, int | None]] = set()
        self.removed: list[Path] = []

    def __enter__(self) -> BuildLockWatch:
        self.root = self.root or extensions_root()
        building = op_to_build(self.root, self.builder)
        if building:  # the first start on this machine: a minute or so that would be silent
            name, folder = building
            self.say(f"building DeepSpeed's {name} extension in {folder} (once: a minute or so; later starts "
                     "reuse it)")
        self.check()  # before DeepSpeed looks: a lock left long ago is removed at once
        self._thread = threading.Thread(target=self._run, name="reflexdb-buildlock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def check(self) -> None:
        """One look at every ``<root>/*/lock``; a lock nobody holds is looked at again 0.5 s later
        (a live holder leaves it unheld only between its close() and unlink(), microseconds)."""
        if self.root is None or not self.root.is_dir():
            return
        unheld = []
        for lock in sorted(self.root.glob("*/lock")):
            holders = lock_holders(lock)
            if holders is None:
                self._tell(lock, None, f"waiting for torch's extension build lock {lock}; if no process is building "
                                       "a torch extension, a killed one left it: delete the file")
            elif holders - {os.getpid()}:
                pid = min(holders - {os.getpid()})
                self._tell(lock, pid, f"waiting for process {pid}, which is building DeepSpeed's "
                                      f"{lock.parent.name} extension (lock {lock})")
            elif not holders:
                unheld.append(lock)
        if not unheld or self._stop.wait(0.5):
            return
        for lock in unheld:
            if lock.exists() and lock_holders(lock) == set():
                try:
                    lock.unlink()
                except FileNotFoundError:
                    continue
                self.removed.append(lock)
                self.say(f"removed a stale build lock left by a killed process: {lock}")

    def _tell(self, lock: Path, pid: int | None, line: str) -> None:
        if (lock, pid) not in self._told:
            self._told.add((lock, pid))
            self.say(line)
