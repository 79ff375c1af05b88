"""Fetching published versions from object storage while the collector keeps sampling.

A version whose ``checkpoint_uri`` is remote (``s3://...``: ``learner.checkpoint_url``) is
downloaded into the collector's cache (:class:`reflexdb.storage.CheckpointCache`: resumed if broken
off, checked against the recorded sha256) by a background thread, so generation goes on with the
current policy meanwhile. The collector asks :meth:`Fetcher.ready` between groups; once the
download is whole it loads it. A fetch that fails is reported (a log line, the counter
``fetch_failures``) and tried again after a backoff (2 s doubling to 60 s); the collector never
stops for it: admission control keeps what it samples within the staleness bound. A version whose
bytes storage holds other than published (:class:`reflexdb.storage.Rejected`: a manifest or file
that fails its digest, sizes beyond the run's model) is checked again only every 60 s, and the
cache downloads nothing of it until its row or its objects change; the same refusal is said once,
then only logged.

A version read in place (``file://``, or the learner's copy in shared memory on this machine) is
checked against its row before it is loaded (:class:`InPlace`): a torn one is never loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from reflexdb import storage
from reflexdb.records import PolicyVersion

log = logging.getLogger("reflexdb.collect")

BACKOFF_S = (2.0, 60.0)  # the first retry's wait, and the longest


class _Job:
    """One download in a daemon thread (a stop never waits for it: a broken download resumes)."""

    def __init__(self, fn: Callable[[], Path]):
        self.path: Path | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(fn,), name="fetch", daemon=True).start()

    def _run(self, fn: Callable[[], Path]) -> None:
        t0 = time.monotonic()
        try:
            self.path = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the collector's thread
            self.error = exc
        finally:
            self.seconds = time.monotonic() - t0
            self.done.set()


class Fetcher:
    """The collector's downloads of remote versions: one at a time, in the background.

    ``failures``: fetches that failed so far; ``seconds``: time spent fetching (in the background,
    overlapping generation).
    """

    def __init__(self, cache: storage.CheckpointCache, echo: Callable[[str], None]):
        self.cache, self.echo = cache, echo
        self.failures = 0
        self.seconds = 0.0
        self._job: tuple[PolicyVersion, _Job] | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_S[0]
        self._said: tuple | None = None  # the last refusal said: (version, why, meanwhile); not said again

    def ready(self, policy: PolicyVersion, current: int | None, *, wait: bool = False,
              sampling: bool = True) -> Path | None:
        """The local directory of ``policy`` once it is fetched and verified; ``None`` while it
        downloads or after a failure (reported; tried again after the backoff).
        ``current``: the version the collector keeps meanwhile (``None``: none yet, start-up);
        ``sampling``: whether it samples with it (``False``: admission control holds new groups),
        for the report. ``wait``: block until this try ends (start-up)."""
        if self._job is not None and self._job[0].version != policy.version and not self._job[1].done.is_set():
            return None  # an older version is still downloading: its files are on their way, let it finish
        if self._job is None or self._job[0].version != policy.version:
            if self._job is not None:
                self._finish()  # an older version's result, superseded
            if time.monotonic() < self._retry_at:
                return None
            self._job = (policy, _Job(lambda: self.cache.fetch(policy.checkpoint_uri, policy.version, policy.sha256,
                                                               policy.manifest_sha256)))
        policy, job = self._job
        if wait:
            job.done.wait()
        if not job.done.is_set():
            return None
        return self._finish(current, sampling)

    def _finish(self, current: int | None = None, sampling: bool = True) -> Path | None:
        policy, job = self._job
        self._job = None
        self.seconds += job.seconds
        if job.error is None:
            self._backoff = BACKOFF_S[0]
            return job.path
        self.failures += 1
        rejected = isinstance(job.error, storage.Rejected)
        wait_s = BACKOFF_S[1] if rejected else self._backoff  # its bytes will not change soon: no fast retries
        self._retry_at = time.monotonic() + wait_s
        self._backoff = min(self._backoff * 2, BACKOFF_S[1])
        why = storage.reason(job.error, policy.checkpoint_uri)
        log.warning("fetching policy v%s failed: %s", policy.version, why)
        if current is None:
            meanwhile = ""
        elif sampling:
            meanwhile = f"; sampling with policy v{current} meanwhile"
        else:
            meanwhile = (f"; policy v{current} stays loaded, but nothing is sampled meanwhile: admission control "
                         "holds new groups until a newer version loads")
        if rejected and self._said == (policy.version, why, meanwhile):
            return None  # said already (the log has each try)
        self._said = (policy.version, why, meanwhile) if rejected else None
        again = "checking again" if rejected else "retrying"
        self.echo(f"could not fetch policy v{policy.version} from {storage.mask(policy.checkpoint_uri)} ({why})"
                  f"{meanwhile}, {again} in {wait_s:.0f} s ({self.failures} failed fetch(es) so far)")
        return None


#: how long a version refused for its files (read in place) waits before it is checked again
RECHECK_S = 60.0


class InPlace:
    """Versions a collector reads in place: the learner's directory (``file://``), or its copy in
    shared memory on this machine (:mod:`reflexdb.shm`). Each is checked against its row
    (:func:`reflexdb.storage.verify_version`: the manifest's digest, every shard there, whole and
    the one listed) before anything of it is loaded; one that is torn is refused: the collector
    keeps its weights, says why once (naming the version and the file), and checks it again every
    :data:`RECHECK_S` seconds (an operator may put the files back; the next version is checked as
    soon as it is published). A torn copy in shared memory is said once and the durable place read
    instead.

    ``refusals``: versions refused so far (each counted once).
    """

    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo
        self.refusals = 0
        self._refused: dict[int, tuple[float, str]] = {}  # version -> (check again at, why)
        self._torn_copies: set[int] = set()  # versions whose copy in shared memory was torn

    def shared(self, policy: PolicyVersion) -> tuple[Path, str] | None:
        """``(the copy's directory, what was checked)`` when ``policy`` has a whole copy in shared
        memory on this machine; ``None`` otherwise (then the durable place is read)."""
        from reflexdb import shm

        if policy.version in self._torn_copies:
            return None
        path = shm.locate(policy.meta)
        if path is None:
            return None
        try:
            return path, storage.verify_version(path, policy.sha256, policy.manifest_sha256)
        except storage.TornVersion as exc:
            self._torn_copies.add(policy.version)
            self.echo(f"policy v{policy.version}: its copy in shared memory is torn ({exc}); reading it from "
                      f"{storage.mask(policy.checkpoint_uri)} instead")
            return None

    def check(self, policy: PolicyVersion, path: Path, current: int, *, sampling: bool = True) -> str | None:
        """What was checked of ``policy`` at ``path`` (its directory, read in place), or ``None``
        when it is refused (said) or still waits to be checked again; ``current``: the version the
        collector keeps meanwhile, ``sampling``: whether it samples with it."""
        now = time.monotonic()
        refused = self._refused.get(policy.version)
        if refused is not None and now < refused[0]:
            return None
        try:
            checked = storage.verify_version(path, policy.sha256, policy.manifest_sha256)
        except storage.TornVersion as exc:
            why = str(exc)
            self._refused[policy.version] = (now + RECHECK_S, why)
            log.warning("not loading policy v%s: %s", policy.version, why)
            if refused is not None and refused[1] == why:
                return None  # said already
            if refused is None:
                self.refusals += 1
            meanwhile = (f"sampling with policy v{current} meanwhile" if sampling else
                         f"policy v{current} stays loaded, but nothing is sampled meanwhile: admission control holds "
                         "new groups until a newer version loads")
            self.echo(f"not loading policy v{policy.version} from {storage.mask(policy.checkpoint_uri)}: {why}; "
                      f"{meanwhile}, checking again in {RECHECK_S:.0f} s")
            return None
        self._refused.pop(policy.version, None)
        return checked
