"""The learner's checkpoints: publish, prune, resume.

A version is what its ``policy_versions`` row says. Files come first, the row last: each version's
learner state (``states/vK``: DeepSpeed's model, optimizer and client state) and weights (``vK``:
HF safetensors, what collectors load) are new directories, written under temporary names, flushed
and renamed into place when complete, so a published version's files are never rewritten and a
publish that is killed or fails leaves no row, only temporary files that the next start removes.

Each version's weights are the module's dtype in shards with their index and a ``manifest.json``
(each file's size and sha256; ``export_hf``); the row records the manifest's digest
(``manifest_sha256``) with the weights', so collectors check every file, wherever they read it,
before loading it. With shared memory (``shared``: ``learner.shared_memory_publish``,
:mod:`reflexdb.shm`) each version is also copied there before its row, which says where and on
which machine; collectors on this machine load it from there. The newest two copies are kept,
and removed by :meth:`Checkpointer.close`.

Resume starts from the newest version with a learner state (``learner.state_every``); steps
recorded after it are rolled back (:meth:`reflexdb.Store.roll_back_steps`), so nothing is consumed
twice or skipped.

Only rank 0 writes rows and removes files (``main``); every rank writes its share of the state.

A publish of weights alone (no learner state) can go on in the background (``background``,
``learner.publish_in_background``): the learner copies the weights to host memory, and a writer
thread writes the files, records the row and prunes, in the same order, while the next step
trains. One write is in flight at a time: the next publish, a publish with the state, a clean
stop and :meth:`Checkpointer.wait` wait for it first, and raise its error there
(:class:`PublishFailed`, or the database's).

With a remote ``learner.checkpoint_url`` (``url``: ``s3://...``), the version's files are written
locally as always, then uploaded to ``<url>/vK/`` (reflexdb/storage.py, retried for
``upload_retry_s``; in the writer thread when in the background), and only then is the row
recorded, naming ``<url>/vK`` and the sha256 of the uploaded ``manifest.json`` (every file of the
version is checked through it): a collector never sees a version that is not wholly uploaded.
Storage that stays down past ``upload_retry_s`` is a :class:`PublishFailed` naming the URL and the
cause. Pruning deletes old versions in storage too.

Each run has places of its own: the learner gives its checkpointer ``<checkpoint_dir>/<name>.r<id>``
and ``<checkpoint_url>/<name>.r<id>`` (:func:`reflexdb.storage.run_prefix`), and each holds a
marker naming the run (``reflexdb-run.json``): :meth:`Checkpointer.prepare` claims the directory,
the first upload claims the prefix, and pruning checks it, so a run never publishes into, or
prunes, another run's versions (:class:`PublishFailed` names the other run). Versions a run
recorded before it had places of its own (``<url>/vK``, ``<checkpoint_dir>/vK``) are pruned only
while their weights are still the ones its rows record (another run may have written over them).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reflexdb import Store, drill, runs, shm, storage
from reflexdb.errors import ReflexdbError
from reflexdb.records import PolicyVersion
from reflexdb.settings import make_dirs

from . import ranks
from .engine import StateUnreadable, TrainingEngine, clean_partial_files


class PublishFailed(ReflexdbError):
    """Writing a version's files failed (disk full, I/O error); nothing was recorded for it."""

    exit_code = 8


def _write_error(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def _free_space(path: Path) -> str:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 2**20:,.0f} MiB free in {path}"
    except OSError:
        return f"free space in {path} unknown"


def run_places(run_id: int, run: str, directory: Path, url: str | None = None,
               read_url: str | None = None) -> tuple[Path, str | None, str | None]:
    """The run's own places under the configured ones: ``(<directory>/<name>.r<id>,
    <url>/<name>.r<id>, <read_url>/<name>.r<id>)`` (:func:`reflexdb.storage.run_prefix`; ``None``
    stays ``None``), so runs that share a ``checkpoint_dir`` or ``checkpoint_url`` never share versions."""
    key = storage.run_key(run_id, run)
    return (Path(directory) / key, storage.run_prefix(url, run_id, run) if url else None,
            storage.run_prefix(read_url, run_id, run) if read_url else None)


def find_resume(store: Store, run_id: int, run: str,
                db: Callable[[Callable[[], Any]], Any]) -> tuple[PolicyVersion | None, PolicyVersion | None]:
    """``(newest version, newest version with a learner state)`` of the run (``None``: none yet).

    Raises:
        ReflexdbError: the state directory the row names is missing (nothing is changed).
    """
    latest = db(lambda: store.latest_policy(run_id))
    stateful = latest if latest is None or latest.meta.get("learner_state") else \
        db(lambda: store.latest_policy(run_id, with_state=True))
    if stateful is not None:
        state = Path(stateful.meta["learner_state"]) / stateful.meta["state_tag"]
        if not state.is_dir():
            raise ReflexdbError(
                f"cannot resume run {run!r}: the learner state of policy v{stateful.version} "
                f"({state}) is missing. Nothing was changed; restore the directory, or start a new run name."
            )
    return latest, stateful


class Checkpointer:
    """Publishes a learner's versions, prunes old files and restores the state it resumes from.

    ``version``: the newest published version; ``published_step``: the step it was published at
    (a clean stop publishes only past it); ``last_has_state``: whether the newest version has a
    learner state.
    """

    def __init__(self, store: Store, run_id: int, run: str, directory: Path, engine: TrainingEngine, *,
                 state_every: int, keep_states: int, keep_policies: int | None, main: bool,
                 db: Callable[[Callable[[], Any]], Any], echo: Callable[[str], None], background: bool = False,
                 url: str | None = None, storage_options: dict | None = None, upload_retry_s: float = 600.0,
                 read_url: str | None = None, shared: shm.SharedCopies | None = None):
        self.store, self.run_id, self.run, self.dir, self.engine = store, run_id, run, directory, engine
        # where versions are uploaded before they are recorded (None: the local directory, read in place)
        self.url, self.storage_options, self.upload_retry_s = url, storage_options or {}, upload_retry_s
        self.read_url = read_url  # the same versions as collectors reach them (learner.checkpoint_read_url)
        self.shared = shared  # copies in shared memory for collectors on this machine (learner.shared_memory_publish)
        self.state_every, self.keep_states, self.keep_policies = state_every, keep_states, keep_policies
        self.main, self.db, self.echo = main, db, echo
        # weights-only publishes written by a thread (ZeRO-3 gathers the weights collectively: never)
        self.background = background and engine.settings.zero_stage < 3
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None  # the background write in flight
        self.version = 0
        self.published_step = 0
        self.published_any = False  # whether any version exists (the first publish is version 0)
        self.since_state = 0  # publishes since the last one that wrote the learner state
        self.last_has_state = True
        self.owner: storage.Owner | None = None  # the run, as the markers of its places name it (prepare)
        # versions recorded at other places than this run's own (before runs had their own): pruned when verified
        self._elsewhere: list[tuple[int, str, str | None]] = []

    def prepare(self) -> None:
        """Create the directory, claim it for the run (refused when its marker names another run),
        and remove what publishes that were killed or failed left there.

        Raises:
            PublishFailed: the directory is another run's; nothing in it was touched.
        """
        if self.main:
            make_dirs(self.dir)
            self.owner = self.db(lambda: runs.owner(self.store, self.run_id))
            try:  # before anything is removed there: the temporary files could be another run's
                storage.claim(str(self.dir), None, self.owner)
            except storage.PrefixOwned as exc:
                raise PublishFailed(f"learner.checkpoint_dir: {exc}") from None
            self._elsewhere = [(v, (meta or {}).get("stored_at") or uri, sha)
                               for v, uri, sha, meta in self.db(lambda: runs.published(self.store, self.run_id))
                               if not self._own((meta or {}).get("stored_at") or uri)]
            for path in clean_partial_files(self.dir):
                self.echo(f"removed {path}, left by a publish that did not finish")
            if self.url is not None:
                try:  # a missing extra (s3fs) stops here, before any step
                    storage.filesystem(self.url, self.storage_options)
                except storage.StorageError as exc:
                    raise PublishFailed(f"learner.checkpoint_url: {exc}") from None
            if self.shared is not None:
                self._prepare_shared()

    def _prepare_shared(self) -> None:
        """Claim the run's folder in shared memory; one that cannot be used stops the learner with
        ``on`` and is said (then not used) with ``auto``."""
        try:
            self.shared.prepare(self.owner)
        except (OSError, storage.StorageError) as exc:
            why = storage.reason(exc) if isinstance(exc, OSError) else str(exc)
            if self.shared.required:
                raise shm.SharedMemoryUnavailable(
                    f"learner.shared_memory_publish is on, but {self.shared.directory} cannot be used ({why}): give "
                    "learner.shared_memory_dir a tmpfs this user may write, or set shared_memory_publish: auto") from None
            self.echo(f"shared memory: {self.shared.directory} cannot be used ({why}); collectors on this machine read "
                      f"versions from {self.url or self.dir}")
            self.shared = None

    def _own(self, uri: str) -> bool:
        """Whether ``uri`` lies in this run's own places (its directory, or its prefix in storage)."""
        if storage.is_remote(uri):
            return any(base is not None and uri.startswith(base.rstrip("/") + "/") for base in (self.url, self.read_url))
        return storage.local_path(uri).is_relative_to(self.dir)

    def restore(self, latest: PolicyVersion, stateful: PolicyVersion) -> tuple[int, int]:
        """Load ``stateful``'s learner state into the engine and roll back the steps recorded after
        it; return ``(step, steps rolled back)``."""
        try:
            client = self.engine.load_state(stateful.meta["learner_state"], stateful.meta["state_tag"])
        except StateUnreadable as exc:
            raise ReflexdbError(
                f"cannot resume run {self.run!r}: the learner state of policy v{stateful.version} is damaged "
                f"({exc}). Nothing was changed; restore the directory from a backup, or start a new run name."
            ) from None
        step = int(client["step"])
        self.version, self.published_step, self.published_any = latest.version, step, True
        return step, self.roll_back_after(step)

    def adopt(self, latest: PolicyVersion) -> None:
        """Versions exist but none has a learner state (another writer recorded them): the next
        publish follows the newest."""
        self.version, self.published_any = latest.version, True

    def roll_back_after(self, step: int) -> int:
        return self.db(lambda: self.store.roll_back_steps(self.run_id, step)) if self.main else 0

    def publish(self, step: int, *, state: bool | None = None, tracker=None) -> int:
        """Save the HF weights and (see ``state``) the learner state, then record the policy version
        (the commit point); return the version.

        ``state``: write the learner state too; by default at version 0 and every ``state_every``-th
        publish (weights alone are what collectors need: the state, with the AdamW moments, is
        about three times their size).

        Raises:
            PublishFailed: the files could not be written (disk full, I/O error); no row was written.
            DatabaseUnavailable: the row could not be written within ``learner.db_retry_s``.
        """
        self.wait()
        version = self.version + 1 if self.published_any else 0
        if state is None:
            state = version == 0 or self.since_state + 1 >= self.state_every
        t0 = time.monotonic()
        drill.phase("publish")
        previous = (self.version, self.published_step)
        if state or not self.background:
            self._write(step, version, state, previous, tracker, None, t0)
        elif self.main:
            snapshot = self.engine.snapshot_weights()
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
            future = self._writer.submit(self._write, step, version, False, previous, tracker, snapshot, t0)
            self._pending = future
        # the learner's own count moves on at once: the version is what it trains from now
        self.version, self.published_step, self.published_any = version, step, True
        self.since_state = 0 if state else self.since_state + 1
        self.last_has_state = state
        if tracker is not None and self._pending is not None:
            tracker.log_metrics({"perf/publish_blocked_seconds": time.monotonic() - t0}, step)
        return version

    def wait(self) -> None:
        """Wait for the background write in flight, if any; raise its error (:class:`PublishFailed`,
        or the database's) here."""
        if self._pending is None:
            return
        future, self._pending = self._pending, None
        future.result()

    def close(self) -> None:
        """Wait for the write in flight (its error raised) and stop the writer thread; remove the
        copies in shared memory (collectors read the versions from their durable place)."""
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None
            if self.shared is not None and self.main:
                self.shared.remove()

    def _write(self, step: int, version: int, state: bool, previous: tuple[int, int], tracker,
               snapshot: dict | None, t0: float) -> None:
        """Files, then the row, then pruning: one version's publish (the caller's thread or the writer's)."""
        tag = f"v{version}"
        states = self.dir / "states"
        weights = self.dir / f"v{version}"
        with self._writing(f"publishing policy v{version} at step {step}",
                           f"Nothing was recorded for v{version}. Free space, then run the same command: the "
                           f"learner resumes from policy v{previous[0]} (step {previous[1]}).",
                           states / tag, weights):
            if state:
                self.engine.save_state(states, tag, {"step": step, "version": version})
            sha = self.engine.export_hf(weights, state_dict=snapshot)
            if self.main:  # every version's manifest.json (export_hf writes it; an engine that did not, here):
                # the row's manifest_sha256 checks each file wherever a collector reads it
                manifest_sha = storage.manifest_digest(weights)[1] or storage.write_manifest(weights)[1]
        uri, shared = f"file://{weights}", None
        if self.main:
            meta = {"mlflow_run_id": getattr(tracker, "run_id", None)}
            shared = self._share(weights, version)  # before the row: a collector on this machine may load it at once
            if shared is not None:
                meta[shm.META_KEY] = shared
            if self.url is not None:  # uploaded whole before the row names it
                uri, stored, manifest_sha = self._upload(weights, version, step, previous)
                if stored != uri:  # read by collectors elsewhere (read_url): where `runs delete` deletes it
                    meta["stored_at"] = stored
            if state:
                meta.update(learner_state=str(states), state_tag=tag)
            self.db(lambda: self.store.publish_policy(self.run_id, version, uri, sha256=sha,
                                                      step=step, meta=meta, manifest_sha256=manifest_sha))
            if state:
                self._prune_states(states)
            self._prune_policies(version)
            if self.shared is not None:
                self.shared.prune(version)
        drill.phase("published")
        if tracker is not None:
            tracker.log_metrics({"perf/publish_seconds": time.monotonic() - t0, "policy/version": version}, step)
        self.echo(f"published policy v{version} at step {step} ({storage.mask(uri) if self.url else weights}"
                  + ("; in shared memory for collectors on this machine" if shared is not None else "")
                  + ")" + (" in the background" if snapshot is not None else ""))

    def _share(self, weights: Path, version: int) -> dict | None:
        """Copy the version into shared memory (:class:`reflexdb.shm.SharedCopies`); what the row's
        meta says of the copy, or ``None`` (none configured, no room, or the copy failed: said, and
        the version is published without one, its durable place being what every collector can read)."""
        if self.shared is None:
            return None
        try:
            return self.shared.place(weights, version)
        except OSError as exc:
            self.echo(f"shared memory: could not copy policy v{version} to {self.shared.directory} "
                      f"({storage.reason(exc)}); collectors on this machine read it from its durable place")
            return None

    def _upload(self, weights: Path, version: int, step: int, previous: tuple[int, int]) -> tuple[str, str, str]:
        """Upload version ``version``'s weights to ``<url>/vK`` (retried for ``upload_retry_s``) once
        the prefix is this run's (its marker); ``(the URI the row names, the URI uploaded to, the
        sha256 of the uploaded manifest)``: the first is ``<read_url>/vK`` with a ``read_url``; the
        last is ``policy_versions.manifest_sha256`` (collectors check every file through it).

        Raises:
            PublishFailed: the prefix is another run's, or storage kept failing; nothing was recorded
                for the version.
        """
        uri = storage.version_uri(self.url, version)
        drill.phase("upload")
        try:
            manifest_sha = storage.upload(weights, uri, self.storage_options, limit_s=self.upload_retry_s, echo=self.echo,
                           owner=self.owner)
        except storage.PrefixOwned as exc:
            raise PublishFailed(f"publishing policy v{version} at step {step} failed: {exc}. Nothing was recorded "
                                f"for v{version}.") from None
        except storage.StorageError as exc:
            raise PublishFailed(f"publishing policy v{version} at step {step} failed: {exc}. Nothing was recorded "
                                f"for v{version}. When the storage answers again, run the same command: the learner "
                                f"resumes from policy v{previous[0]} (step {previous[1]}).") from None
        return (storage.version_uri(self.read_url, version) if self.read_url else uri), uri, manifest_sha

    def finish(self, step: int, *, tracker=None) -> None:
        """On a clean stop: publish the steps trained since the last publish, with the learner
        state; if none, and the last publish wrote no state (``state_every``), write it for that
        version, so that a resume loses no step."""
        self.wait()
        if step > self.published_step:
            self.publish(step, state=True, tracker=tracker)
        elif not self.last_has_state:
            self.attach_state(step)
        self.close()

    def attach_state(self, step: int) -> None:
        """Write the learner state of the newest version (published without one) and record it."""
        self.wait()  # the version's row first
        states, tag = self.dir / "states", f"v{self.version}"
        with self._writing(f"writing the learner state of policy v{self.version}",
                           "A resume starts from the newest version with a state.", states / tag):
            self.engine.save_state(states, tag, {"step": step, "version": self.version})
        if self.main:
            self.db(lambda: self.store.attach_state(self.run_id, self.version, str(states), tag))
            self._prune_states(states)
        self.last_has_state = True
        self.echo(f"wrote the learner state of policy v{self.version} (step {step})")

    @contextlib.contextmanager
    def _writing(self, what: str, then: str, *partial: Path):
        """Run a checkpoint write; on failure remove what it left (``partial``: no row names those
        files) and raise :class:`PublishFailed` saying ``what`` failed, why, the free space, and
        ``then``. torch.save reports a full disk as RuntimeError, not OSError, so any error counts."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - any write error (see above) becomes PublishFailed
            clean_partial_files(self.dir)
            if self.main:
                for path in partial:
                    shutil.rmtree(path, ignore_errors=True)
            if ranks.peer_failure(exc) and ranks.rank_and_world()[1] > 1:
                raise  # another rank is gone, not the disk: every rank stops with one line (trainer/ranks.py)
            raise PublishFailed(f"{what} failed: {_write_error(exc)} ({_free_space(self.dir)}). {then}") from None

    def _prune_states(self, states: Path) -> None:
        """Delete learner states except those of the newest ``keep_states`` versions (resume reads
        the newest; the rows say which directory is whose, whatever its name)."""
        keep = self.db(lambda: self.store.recent_state_tags(self.run_id, self.keep_states))
        for old in states.iterdir():
            if old.is_dir() and old.name not in keep and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)

    def _prune_policies(self, newest: int) -> None:
        """Delete published weight directories older than the newest ``keep_policies`` versions.

        Collectors load only the newest version, and resume reads the DeepSpeed state, so old
        ``vK`` directories are only needed by ``reflexdb eval --checkpoint vK``.
        """
        if self.keep_policies is None:
            return
        for d in self.dir.glob("v*"):
            if d.is_dir() and d.name[1:].isdigit() and int(d.name[1:]) <= newest - self.keep_policies:
                shutil.rmtree(d, ignore_errors=True)
        if self.url is not None:  # and in storage (a failure there is reported; the next publish prunes again)
            storage.prune(self.url, self.storage_options, newest, self.keep_policies, echo=self.echo,
                          owner=self.owner)
        self._prune_elsewhere(newest - self.keep_policies)

    def _prune_elsewhere(self, floor: int) -> None:
        """Delete the versions up to ``floor`` that the run recorded before it had places of its own
        (``<url>/vK``, ``<checkpoint_dir>/vK``), each only if its weights are still the ones recorded
        (:func:`reflexdb.storage.remove_if_recorded`): a run that shared the URL or the directory may
        have written over them. A failure is reported; the next publish tries again."""
        left = []
        for version, uri, sha in self._elsewhere:
            if version > floor or storage.scheme(uri) in storage.READ_ONLY:  # https://: nothing to delete through
                left.append((version, uri, sha))
                continue
            options = self.storage_options if self.url is not None and \
                storage.scheme(uri) == storage.scheme(self.url) else None
            try:
                storage.remove_if_recorded(uri, sha, options)
            except Exception as exc:  # noqa: BLE001 - housekeeping: never stops a publish
                self.echo(f"could not prune policy v{version} at {storage.mask(uri)} ({storage.reason(exc, uri)}); "
                          "the next publish tries again")
                left.append((version, uri, sha))
        self._elsewhere = left
