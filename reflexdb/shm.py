"""Published versions in shared memory: a collector on the learner's machine loads a version
without reading it back from disk or fetching it from storage.

The learner writes each version to its durable place as always (``checkpoint_dir``, and
``checkpoint_url``), and with ``learner.shared_memory_publish`` (``auto``: when the directory's
parent exists, e.g. ``/dev/shm`` on Linux; ``on``; ``off``) it also copies the version's files into
``<shared_memory_dir>/<home>/<name>.r<id>/v<K>/`` (default ``/dev/shm/reflexdb``, a tmpfs: memory),
under a temporary name renamed when whole, **before** it records the row. The row's ``meta`` then
says where, and on which machine (:data:`META_KEY`: the path, the kernel's boot id and the host
name). A collector whose boot id and host name are the row's loads from there (the engine's
``load_weights`` maps each shard with safetensors' ``safe_open``: from a tmpfs that is memory, no
disk); any other collector, or one that finds the copy gone or torn, reads the durable place as
before. Either way the files are checked against the row's digests first
(:func:`reflexdb.storage.verify_version`).

The copies take memory: the learner keeps the newest :data:`KEEP` (the one collectors load and
the one before it, which a collector may be loading), checks that the tmpfs has room for a new one
first (``no room``: that version goes without a copy, and says so), and removes its copies when it
stops. ``<home>`` (a digest of ``$REFLEXDB_HOME``) keeps the runs of different homes apart (their
run ids can be the same); a learner removes the folders of homes that no longer exist.

Why files in shared memory and not CUDA IPC handles (verl, AReaL): docs/design.md, "Weights in
seconds".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import storage
from .errors import ReflexdbError

#: where the learner's copies go by default (``learner.shared_memory_dir``)
DEFAULT_DIR = Path("/dev/shm/reflexdb")
#: the key of ``policy_versions.meta`` that says where a version's copy is
META_KEY = "shared_memory"
#: copies a learner keeps: the newest version and the one before it
KEEP = 2
#: free memory left in the tmpfs after a copy, at least
MARGIN = 64 << 20
#: what a home's folder holds: the home's path (a learner removes the folders of homes gone)
HOME_FILE = "home.txt"
#: what a run's folder holds: its learner's process id and boot id (a learner gone leaves copies to remove)
LEARNER_FILE = "learner.json"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_TMP = ".tmp-"


class SharedMemoryUnavailable(ReflexdbError):
    """``learner.shared_memory_publish: on``, and the directory cannot be used."""

    exit_code = 8


def boot_id() -> str | None:
    """This boot of this machine's kernel (Linux); ``None`` where there is none."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def identity() -> dict[str, str | None]:
    """Which machine (and which boot of it) a copy in shared memory is on."""
    return {"boot_id": boot_id(), "host": socket.gethostname()}


def home_folder(root: Path) -> Path:
    """``<root>/<digest of $REFLEXDB_HOME>``: the runs of one home."""
    from .settings import home

    return Path(root) / hashlib.sha256(str(home()).encode()).hexdigest()[:12]


def usable(root: Path) -> bool:
    """Whether ``root`` exists, or its parent does (``/dev/shm`` for the default): ``auto``'s test."""
    root = Path(root)
    return root.is_dir() or root.parent.is_dir()


def locate(meta: dict[str, Any] | None) -> Path | None:
    """The shared-memory copy a ``policy_versions`` row's ``meta`` names, when it is on this
    machine, this boot (the row's boot id and host name are this machine's) and still there;
    ``None`` otherwise (then the collector reads the durable place)."""
    info = (meta or {}).get(META_KEY)
    if not isinstance(info, dict):
        return None
    path, boot, host = info.get("path"), info.get("boot_id"), info.get("host")
    if not (isinstance(path, str) and isinstance(boot, str) and isinstance(host, str)):
        return None
    if boot != boot_id() or host != socket.gethostname():
        return None
    p = Path(path)
    return p if p.is_absolute() and p.is_dir() else None


def _gone(learner_file: Path) -> bool:
    """Whether the learner a run's :data:`LEARNER_FILE` names has stopped (this boot: its process is
    not running; another boot: every process of that one has)."""
    try:
        got = json.loads(learner_file.read_text())
        pid, boot = int(got["pid"]), got.get("boot_id")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if boot != boot_id():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: running
        return False
    return False


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _copy_tree(src: Path, dst: Path, workers: int) -> None:
    """Copy ``src``'s files into ``dst``, several at once (``shutil.copyfile`` copies in the kernel)."""
    from concurrent.futures import ThreadPoolExecutor

    files = sorted((p for p in src.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)
    for p in files:
        (dst / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shm-copy") as pool:
        for f in [pool.submit(shutil.copyfile, p, dst / p.relative_to(src)) for p in files]:
            f.result()


class SharedCopies:
    """A learner's copies of its versions in shared memory, in the run's own folder
    ``<root>/<home>/<name>.r<id>/`` (marked as the run's, as its checkpoint directory is).

    ``required``: ``learner.shared_memory_publish: on`` (a directory that cannot be used stops the
    learner at start; ``auto`` goes on without copies and says so).
    """

    def __init__(self, root: Path, run_key: str, *, required: bool = False, echo: Callable[[str], None] = print):
        self.root = Path(root)
        self.directory = home_folder(self.root) / run_key
        self.required, self.echo = required, echo
        self._said_room = False

    def prepare(self, owner: storage.Owner) -> None:
        """Create and claim the run's folder; remove what an earlier learner of the run left there
        (its copies: collectors read those versions from the durable place) and the folders of
        homes that no longer exist.

        Raises:
            OSError: the folder cannot be made or written.
            storage.PrefixOwned: another run's marker is there.
        """
        from .settings import home

        folder = self.directory.parent
        folder.mkdir(parents=True, exist_ok=True)
        (folder / HOME_FILE).write_text(str(home()))
        storage.claim(str(self.directory), None, owner)
        for p in self.directory.iterdir():
            if p.is_dir() and p.name.startswith("v"):
                shutil.rmtree(p, ignore_errors=True)
        (self.directory / LEARNER_FILE).write_text(json.dumps({"pid": os.getpid(), "boot_id": boot_id()}))
        self._sweep(folder)

    def _sweep(self, folder: Path) -> None:
        """Remove what learners that are gone left: the folders of homes that no longer exist, and
        the copies of runs whose learner (:data:`LEARNER_FILE`) is no longer running on this boot."""
        for other in self.root.iterdir():
            try:
                marker = other / HOME_FILE
                if other != folder and marker.is_file() and not Path(marker.read_text().strip()).exists():
                    shutil.rmtree(other, ignore_errors=True)
                    continue
                for run in other.iterdir():
                    if run != self.directory and (run / LEARNER_FILE).is_file() and _gone(run / LEARNER_FILE):
                        for p in run.glob("v*"):
                            shutil.rmtree(p, ignore_errors=True)
            except OSError:
                continue

    def place(self, src: Path, version: int, *, workers: int | None = None) -> dict[str, Any] | None:
        """Copy version ``version``'s files from ``src`` (its durable directory, whole) to
        ``v<K>/``, under a temporary name renamed when whole; return what the row's ``meta`` says of
        it (:data:`META_KEY`), or ``None`` when the tmpfs has no room for it (said once)."""
        self.prune(version - 1, keep=KEEP - 1)  # room first: the newest recorded version stays
        need = _size(src)
        free = shutil.disk_usage(self.directory).free
        if need + MARGIN > free:
            if not self._said_room:
                self.echo(f"shared memory: no room for policy v{version} in {self.directory} ({need / 2**20:,.0f} MiB "
                          f"needed and {MARGIN >> 20} MiB to spare, {free / 2**20:,.0f} MiB free): collectors on this "
                          "machine read versions from their durable place until there is (said once)")
                self._said_room = True
            return None
        final = self.directory / f"v{version}"
        tmp = self.directory / f"v{version}{_TMP}{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)  # a copy no row names (a publish that did not finish)
        try:
            tmp.mkdir()
            _copy_tree(src, tmp, workers or storage.HASH_WORKERS)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return {"path": str(final), **identity()}

    def prune(self, newest: int, *, keep: int = KEEP) -> None:
        """Remove the copies older than the newest ``keep`` up to ``newest`` (and temporary ones
        left by a publish that did not finish). A collector loading one keeps its mapping."""
        for p in self.directory.glob("v*"):
            stem = p.name.split(_TMP)[0]
            if not stem[1:].isdigit():
                continue
            if _TMP in p.name or int(stem[1:]) <= newest - keep:
                shutil.rmtree(p, ignore_errors=True)

    def remove(self) -> None:
        """Remove every copy of the run (the learner stops: collectors read the durable place), and
        the home's folder when no other run of the home has one there."""
        shutil.rmtree(self.directory, ignore_errors=True)
        folder = self.directory.parent
        try:
            if [p.name for p in folder.iterdir()] == [HOME_FILE]:
                (folder / HOME_FILE).unlink()
                folder.rmdir()
        except OSError:  # another learner of the home came meanwhile
            pass


def for_run(mode: str, root: Path | None, run_key: str, echo: Callable[[str], None] = print) -> SharedCopies | None:
    """The learner's :class:`SharedCopies` for ``learner.shared_memory_publish`` ``mode`` (``auto``,
    ``on``, ``off``) and ``shared_memory_dir`` ``root`` (``None``: :data:`DEFAULT_DIR`); ``None``
    when off, or ``auto`` where the directory's parent does not exist (no ``/dev/shm``)."""
    root = Path(root) if root is not None else DEFAULT_DIR
    if mode == "off" or (mode == "auto" and not usable(root)):
        return None
    return SharedCopies(root, run_key, required=mode == "on", echo=echo)
