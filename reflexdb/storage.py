"""Published weights in object storage: the learner uploads a version, collectors fetch it.

``learner.checkpoint_url`` names where versions go. A path or a ``file://`` URL is the local
directory of old (``learner.checkpoint_dir``): nothing here is used, and the row says
``file://<path>``. Any other URL (``s3://bucket/run/``, ``gs://...``; the ``s3`` and ``gcs``
extras install their fsspec filesystems) is written through fsspec:

- **Upload** (:func:`upload`): the learner writes a version's files locally as always, then puts
  each under ``<prefix>/v<K>/`` and, last, ``manifest.json`` (each file's name, size and sha256).
  Only then does it record the ``policy_versions`` row, with ``<prefix>/v<K>`` and the sha256 of the
  weights (:func:`weights_sha256`), so a collector never sees a version that is not wholly
  uploaded. Errors are retried with backoff for ``learner.upload_retry_s``.
- **One prefix per run**: ``<prefix>`` is ``<url>/<name>.r<id>`` (:func:`run_prefix`), and its
  marker :data:`OWNER_FILE` names the run (:class:`Owner`). Upload claims it (:func:`claim`),
  prune and delete check it (:func:`check_owner`): a run never writes into, prunes or deletes
  another run's versions, though their configs name the same URL. Versions recorded before
  (``<url>/v<K>``) are deleted only while their weights are the recorded ones
  (:func:`remove_if_recorded`).
- **Fetch** (:class:`CheckpointCache`): a collector downloads a version into
  ``$REFLEXDB_HOME/cache/<run>/v<K>.partial/``, each file through ``<name>.part`` with ranged
  reads, so a broken download resumes where it stopped; checks every file against the manifest
  and the weights against the row's sha256; then renames the directory to ``v<K>`` and keeps the
  newest few versions. The database's sha256 is what is trusted: storage only carries bytes.
- **Credentials** come from the environment and the library's own sources (AWS variables,
  profiles, instance roles; ``AWS_ENDPOINT_URL``), never from the config:
  ``learner.checkpoint_storage_options`` holds only non-secret keys (``endpoint_url``,
  ``client_kwargs: {region_name: ...}``, ``profile``, ``config_kwargs``), and a URL with a password
  or a signed query is refused (:func:`check_url`). Every URL printed goes through :func:`mask`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import NotFound, ReflexdbError
from .settings import mask_url

MANIFEST = "manifest.json"
#: how much one ranged read (download) asks for: a broken download resumes at a multiple of it.
#: 128 MiB fetched SmolLM2's 0.5 GiB from moto's S3 server in 5.8 s, 32 MiB in 10.2 s (docs/benchmarks.md)
CHUNK = 128 << 20
#: schemes that are a local path: the collector reads the directory itself, nothing is copied
LOCAL_SCHEMES = ("", "file", "local")
#: the extra that installs each scheme's filesystem (``pip install 'reflexdb[s3]'``)
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
#: schemes fsspec can read but not write (a collector may load from them; the learner cannot publish there)
READ_ONLY = ("http", "https")

#: words that make an option or query parameter a secret (``aws_secret_access_key``, ``key``,
#: ``token``, ``X-Amz-Signature``, ``sig``, ...)
_SECRET_WORDS = {"key", "secret", "token", "password", "passwd", "credential", "credentials", "signature", "sig",
                 "sas", "auth", "authorization", "session"}
_QUERY_PARAM = re.compile(r"([?&])([^=&#]+)=([^&#]*)")


class StorageError(ReflexdbError):
    """Object storage could not be written or read (after the retries the setting allows)."""

    exit_code = 8


class FetchFailed(StorageError):
    """A version could not be downloaded or did not match its recorded sha256."""


def _is_secret_name(name: str) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return any(w in _SECRET_WORDS or "secret" in w or "password" in w or "token" in w for w in words)


def scheme(url: str) -> str:
    """The URL's scheme, lower case; ``''`` for a plain path."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_remote(uri: str) -> bool:
    """Whether ``uri`` (a ``policy_versions.checkpoint_uri`` or ``learner.checkpoint_url``) names
    storage other than a local path: then it is fetched into the cache, not read in place."""
    return scheme(uri) not in LOCAL_SCHEMES


def local_path(url: str) -> Path:
    """The local directory a path or ``file://`` URL names."""
    return Path(url[len("file://"):] if url.startswith("file://") else url).expanduser()


def local_dir(url: str | None) -> Path | None:
    """The directory a local ``learner.checkpoint_url`` names; ``None`` when unset or remote."""
    return None if url is None or is_remote(url) else local_path(url)


def remote_url(url: str | None) -> str | None:
    """``learner.checkpoint_url`` when it names storage to upload to; ``None`` when unset or local."""
    return url if url is not None and is_remote(url) else None


def options_for(uri: str, url: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The storage options for reading ``uri``: ``learner.checkpoint_storage_options`` are those of
    ``checkpoint_url``'s filesystem, so a version read by another scheme
    (``checkpoint_read_url: https://...``) gets none."""
    return options if url is not None and scheme(uri) == scheme(url) else {}


def version_uri(base: str, version: int) -> str:
    """``<base>/v<K>``: where version ``K`` lies under a run's prefix ``base`` (:func:`run_prefix`)."""
    return f"{base.rstrip('/')}/v{version}"


def run_key(run_id: int, name: str) -> str:
    """``<name>.r<id>``: the folder of one run under ``learner.checkpoint_url`` (and under the local
    checkpoint directory). The name is kept readable but only ``[A-Za-z0-9._-]`` survive (others
    become ``_``, no leading dot, at most 100 characters); the id makes it unique, so two runs
    sharing a URL, or a run deleted and made again under the same name, never share a folder."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100].lstrip(".") or "run"
    return f"{slug}.r{int(run_id)}"


def run_prefix(base: str, run_id: int, name: str) -> str:
    """``<base>/<name>.r<id>``: where run ``run_id`` publishes its versions under ``base``."""
    return f"{base.rstrip('/')}/{run_key(run_id, name)}"


def mask(url: str) -> str:
    """``url`` with any credentials replaced by ``***``: a password in its user part
    (``https://u:p@host``) and secret query parameters (a presigned URL's ``X-Amz-Signature``,
    ``X-Amz-Credential``, ``X-Amz-Security-Token``; ``sig``, ``token``, ...). Safe to print."""
    masked = mask_url(url) if "://" in url else url
    return _QUERY_PARAM.sub(lambda m: f"{m[1]}{m[2]}=***" if _is_secret_name(m[2]) else m[0], masked)


def scrub(text: str, url: str) -> str:
    """``text`` (a library's error message) with the secrets of ``url`` replaced by ``***``."""
    from .settings import scrub as scrub_password

    text = scrub_password(text, url)
    for m in _QUERY_PARAM.finditer(url):
        if _is_secret_name(m[2]) and len(m[3]) >= 4:
            text = text.replace(m[3], "***")
    return text


def check_url(url: str, *, read_only: bool = False) -> str:
    """Refuse a checkpoint URL that carries credentials or that fsspec cannot write (``read_only``:
    read); return it.

    Raises:
        ValueError: the message names the problem (and never the secret).
    """
    if not is_remote(url):
        return url
    masked = mask(url)
    if masked != url:
        raise ValueError(f"{masked}: credentials in the URL are refused (they would be stored in the database "
                         "and printed); give them through the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                         "AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, ...)")
    s = scheme(url)
    if s in READ_ONLY and not read_only:
        raise ValueError(f"{url}: {s}:// is read-only through fsspec; the learner publishes to a path, s3:// or gs://")
    import fsspec

    if s not in fsspec.available_protocols():
        raise ValueError(f"{url}: fsspec knows no filesystem for {s}:// (s3://, gs:// or a path)")
    return url


def check_options(options: dict[str, Any], where: str = "learner.checkpoint_storage_options") -> dict[str, Any]:
    """Refuse storage options whose names look like secrets (``key``, ``secret``, ``token``,
    ``aws_secret_access_key``, ...), at any depth; return them.

    Raises:
        ValueError: naming each refused key.
    """
    def walk(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict):
            for k, v in node.items():
                dotted = f"{prefix}.{k}"
                if _is_secret_name(str(k)):
                    yield dotted
                else:
                    yield from walk(v, dotted)

    bad = list(walk(options, where))
    if bad:
        raise ValueError(f"{', '.join(bad)}: looks like a credential, and the config is stored with the run and "
                         "logged; give credentials through the environment or the library's own sources (AWS_* "
                         "variables, AWS_PROFILE or `profile: NAME`, ~/.aws/credentials, an instance role)")
    return options


def filesystem(url: str, options: dict[str, Any] | None = None):
    """``(fsspec filesystem, path)`` for ``url``; a missing extra is a clear error.

    Raises:
        StorageError: the scheme's filesystem is not installed.
    """
    import fsspec.core

    try:
        return fsspec.core.url_to_fs(url, **(options or {}))
    except ImportError as exc:
        extra = EXTRAS.get(scheme(url))
        hint = f"pip install 'reflexdb[{extra}]'" if extra else "install the fsspec filesystem for it"
        raise StorageError(f"{mask(url)} needs a filesystem that is not installed ({exc}): {hint}") from None


def reason(exc: BaseException, url: str = "") -> str:
    """One line saying why a storage call failed, with no secret in it."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return scrub(text, url) if url else text


def weights_sha256(directory: str | Path) -> str:
    """sha256 over the directory's ``*.safetensors`` files, in name order (``policy_versions.sha256``)."""
    h = hashlib.sha256()
    for f in sorted(Path(directory).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _digests(directory: Path, names: list[str]) -> tuple[dict[str, str], str]:
    """Each file's sha256 and the weights' (:func:`weights_sha256`), in one read of every file."""
    weights = hashlib.sha256()
    out = {}
    for name in sorted(names):
        h = hashlib.sha256()
        with open(directory / name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
                if "/" not in name and name.endswith(".safetensors"):
                    weights.update(chunk)
        out[name] = h.hexdigest()
    return out, weights.hexdigest()


def manifest(directory: Path) -> dict[str, Any]:
    """What :func:`upload` writes last: each file's name (relative, ``/``-separated), size and sha256."""
    names = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    digests, weights = _digests(directory, names)
    return {"files": [{"name": n, "size": (directory / n).stat().st_size, "sha256": digests[n]} for n in names],
            "weights_sha256": weights}


def _retrying(limit_s: float, what: str, url: str, echo: Callable[[str], None]):
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    def before_sleep(state) -> None:
        echo(f"{what} failed ({reason(state.outcome.exception(), url)}); retrying in "
             f"{state.next_action.sleep:.0f} s (for up to {limit_s:.0f} s in all)")

    def retried(e: BaseException) -> bool:  # not: nothing there, a missing extra (a FetchFailed is: a new try)
        return not isinstance(e, (NotFound, KeyboardInterrupt)) and (
            isinstance(e, FetchFailed) or not isinstance(e, StorageError))

    return Retrying(retry=retry_if_exception(retried),
                    stop=stop_after_delay(limit_s), wait=wait_exponential(multiplier=0.5, min=0.5, max=30),
                    before_sleep=before_sleep, reraise=True)


# ---------------------------------------------------------------------- whose prefix it is

#: the marker at the top of a run's prefix (``<url>/<name>.r<id>/``) and of its local directory:
#: which run owns it. Upload, prune and ``runs delete`` read it before they write or delete there.
OWNER_FILE = "reflexdb-run.json"
#: a marker is a few hundred bytes; one longer than this is not reflexdb's
MAX_MARKER = 4096
#: a manifest read to tell whose a version is (:func:`remove_if_recorded`) is at most this long
MAX_MANIFEST = 16 << 20


@dataclass(frozen=True)
class Owner:
    """The run a prefix belongs to, as its marker (:data:`OWNER_FILE`) records it: the name, id and
    creation time (UTC, ISO 8601) of its ``runs`` row. Together they tell a run from one of the same
    name and id in another database, or from one made again under the same name."""

    run: str
    run_id: int
    created_at: str

    @classmethod
    def of(cls, run: str, run_id: int, created_at: datetime) -> Owner:
        return cls(run, int(run_id), created_at.astimezone(timezone.utc).isoformat())

    def __str__(self) -> str:
        return f"run {self.run!r} (id {self.run_id}, created {self.created_at})"


class PrefixOwned(StorageError):
    """A prefix or local directory belongs to another run (its marker says so), or holds a marker
    reflexdb did not write: nothing was written or deleted there."""


def _marker(prefix: str, options: dict[str, Any] | None) -> tuple[Any, str]:
    fs, root = filesystem(prefix, options)
    return fs, f"{root.rstrip('/')}/{OWNER_FILE}"


def read_owner(prefix: str, options: dict[str, Any] | None) -> Owner | None:
    """The run that owns ``prefix`` (a URL or a local directory); ``None`` when it has no marker.

    Raises:
        PrefixOwned: a marker is there, but not one reflexdb wrote (not JSON, fields missing, too long).
    """
    fs, path = _marker(prefix, options)
    fs.invalidate_cache()
    try:
        data = fs.cat_file(path, start=0, end=MAX_MARKER + 1)
    except FileNotFoundError:
        return None
    try:
        if len(data) > MAX_MARKER:
            raise ValueError(f"longer than {MAX_MARKER} bytes")
        got = json.loads(data)
        return Owner(str(got["run"]), int(got["run_id"]), str(got["created_at"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise PrefixOwned(f"{mask(prefix)}/{OWNER_FILE} is not a marker reflexdb wrote ({reason(exc)}): nothing is "
                          "written or deleted there; give the run a learner.checkpoint_url of its own") from None


def claim(prefix: str, options: dict[str, Any] | None, owner: Owner) -> None:
    """Make ``prefix`` (a URL or a local directory) ``owner``'s: write its marker if it has none;
    refuse if it is another run's. Two learners claiming at once: the last write wins and the other
    is refused here or at its next upload.

    Raises:
        PrefixOwned: another run owns it; the message names that run.
    """
    from fsspec.implementations.local import LocalFileSystem

    found = read_owner(prefix, options)
    if found is None:
        fs, path = _marker(prefix, options)
        body = json.dumps(asdict(owner), indent=1).encode()
        if isinstance(fs, LocalFileSystem):  # whole or not at all: a torn marker would refuse the run forever
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(f"{path}.tmp-{os.getpid()}")
            tmp.write_bytes(body)
            os.replace(tmp, path)
        else:
            fs.pipe_file(path, body)
        found = read_owner(prefix, options)
    if found != owner:
        raise PrefixOwned(f"{mask(prefix)} belongs to {found} ({OWNER_FILE} there), not to {owner}: refusing to "
                          "publish there. Another run (of this database or another) uses this learner.checkpoint_url "
                          "or checkpoint_dir; give this run one of its own, or delete that run (`reflexdb runs "
                          "delete NAME` in its database)")


def check_owner(prefix: str, options: dict[str, Any] | None, owner: Owner, doing: str) -> None:
    """Refuse to act on ``prefix`` unless its marker names ``owner`` (``doing``: what is not done,
    ``"not pruning"``, ``"not deleting"``).

    Raises:
        PrefixOwned: no marker, or another run's; the message names it.
    """
    found = read_owner(prefix, options)
    if found != owner:
        holds = f"no {OWNER_FILE}" if found is None else f"the {OWNER_FILE} of {found}"
        raise PrefixOwned(f"{mask(prefix)} holds {holds}, not {owner}'s: {doing} anything there")


def _parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def upload(directory: Path, url: str, options: dict[str, Any] | None, *, limit_s: float,
           echo: Callable[[str], None] = print, owner: Owner | None = None) -> None:
    """Put the files of ``directory`` under ``url`` (``<prefix>/v<K>``), then its manifest, retrying
    for ``limit_s`` seconds with backoff. With ``owner``, the prefix is claimed for that run first
    (:func:`claim`) and an upload into another run's prefix is refused. Whatever lay at ``url``
    before is removed first: no row names it (a version is recorded only after its upload).

    Raises:
        PrefixOwned: the prefix is another run's; nothing was written.
        StorageError: it kept failing for ``limit_s`` seconds; the message names the URL and the last cause.
    """
    from fsspec.implementations.local import LocalFileSystem

    fs, root = filesystem(url, options)
    root = root.rstrip("/")
    local = isinstance(fs, LocalFileSystem)
    man = manifest(directory)
    done: set[str] = set()
    cleared = [False]

    def attempt() -> None:
        if not cleared[0]:  # files of an upload that never recorded its row (a killed learner's)
            if owner is not None:
                claim(_parent(url), options, owner)
            fs.invalidate_cache()
            if fs.exists(root):
                fs.rm(root, recursive=True)
            cleared[0] = True
        for f in man["files"]:
            if f["name"] not in done:
                if local:  # object stores have no directories; a local filesystem (a served tree) does
                    fs.makedirs(f"{root}/{f['name']}".rsplit("/", 1)[0], exist_ok=True)
                fs.put_file(str(directory / f["name"]), f"{root}/{f['name']}")
                done.add(f["name"])
        fs.pipe_file(f"{root}/{MANIFEST}", json.dumps(man, indent=1).encode())
        fs.invalidate_cache(root)

    t0 = time.monotonic()
    try:
        for tried in _retrying(limit_s, f"uploading {directory.name} to {mask(url)}", url, echo):
            with tried:
                attempt()
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any storage error, after the retries
        raise StorageError(f"uploading {directory.name} to {mask(url)} failed for {time.monotonic() - t0:.0f} s "
                           f"(learner.upload_retry_s {limit_s:g}): {reason(exc, url)}") from None


def versions_in(base: str, options: dict[str, Any] | None) -> dict[int, str]:
    """The ``v<K>`` directories under ``base``: version -> path."""
    fs, root = filesystem(base, options)
    fs.invalidate_cache()
    try:
        entries = fs.ls(root.rstrip("/"), detail=False)
    except FileNotFoundError:
        return {}
    out = {}
    for e in entries:
        name = e.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith("v") and name[1:].isdigit():
            out[int(name[1:])] = e
    return out


def prune(base: str, options: dict[str, Any] | None, newest: int, keep: int,
          echo: Callable[[str], None] = print, *, owner: Owner | None = None) -> list[int]:
    """Delete the versions under the run's prefix ``base`` older than the newest ``keep``
    (``learner.keep_policies``); return those deleted. With ``owner``, only when the prefix's
    marker names that run. A failure (or another run's marker) is reported, not raised: the next
    publish prunes again."""
    deleted = []
    try:
        if owner is not None:
            check_owner(base, options, owner, "not pruning")
        fs, _ = filesystem(base, options)
        for version, path in sorted(versions_in(base, options).items()):
            if version <= newest - keep:
                fs.rm(path, recursive=True)
                deleted.append(version)
    except Exception as exc:  # noqa: BLE001 - pruning is housekeeping: never stops a publish
        echo(f"could not prune old versions in {mask(base)} ({reason(exc, base)}); the next publish tries again")
    return deleted


def remove_versions(base: str, options: dict[str, Any] | None, *, owner: Owner) -> list[int]:
    """Delete every version (``v<K>``) under the run's prefix ``base``, then its marker: a deleted
    run's. Only when the marker names ``owner`` (a prefix with neither marker nor versions: nothing
    to do). Other objects under the prefix are left alone. Returns the versions deleted.

    Raises:
        PrefixOwned: the prefix has versions but no marker, or another run's: nothing was deleted.
        StorageError: storage did not answer or refused; the message names the URL and the cause.
    """
    try:
        found = versions_in(base, options)
        marked = read_owner(base, options)
        if marked is None and not found:
            return []
        check_owner(base, options, owner, "not deleting")
        fs, _ = filesystem(base, options)
        for path in found.values():
            fs.rm(path, recursive=True)
        marker_fs, marker = _marker(base, options)
        marker_fs.rm(marker)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any storage error, named
        raise StorageError(f"could not delete the versions in {mask(base)}: {reason(exc, base)}") from None
    return sorted(found)


def remove_if_recorded(uri: str, sha256: str | None, options: dict[str, Any] | None) -> bool:
    """Delete the version at ``uri`` when its weights are the ones recorded (``sha256``): for a
    version published before runs had prefixes of their own (``<url>/v<K>``), which another run
    on the same URL may have written over since. Remote: the manifest's ``weights_sha256``; a local
    directory: its ``*.safetensors`` read again. Returns whether it was deleted (``False``: gone
    already, or not these weights).

    Raises:
        Exception: the storage library's error (unreachable, denied).
    """
    from fsspec.implementations.local import LocalFileSystem

    if not sha256:
        return False
    fs, root = filesystem(uri, options)
    root = root.rstrip("/")
    fs.invalidate_cache()
    if isinstance(fs, LocalFileSystem):
        path = Path(root)
        if not path.is_dir() or not any(path.glob("*.safetensors")) or weights_sha256(path) != sha256:
            return False
        shutil.rmtree(path)
        return True
    try:
        data = fs.cat_file(f"{root}/{MANIFEST}", start=0, end=MAX_MANIFEST)
    except FileNotFoundError:
        return False
    try:
        recorded = json.loads(data).get("weights_sha256")
    except (ValueError, AttributeError):
        return False
    if recorded != sha256:
        return False
    fs.rm(root, recursive=True)
    return True


# ---------------------------------------------------------------------- the collector's cache

def cache_root(run: str) -> Path:
    """``$REFLEXDB_HOME/cache/<run>``: where a collector keeps the versions it fetched."""
    from .settings import home

    return home() / "cache" / re.sub(r"[^A-Za-z0-9._-]", "_", run).lstrip(".")


class CheckpointCache:
    """The versions a collector (or ``reflexdb eval``) fetched from storage, under ``root``.

    ``v<K>/`` is a whole, verified version (its ``.source`` says the URL and sha256 it was fetched
    for); ``v<K>.partial/`` a download under way or broken off, resumed by the next :meth:`fetch`.
    A lock file per version lets collectors that share a home fetch it once.
    """

    def __init__(self, root: Path, options: dict[str, Any] | None = None, *, keep: int = 2):
        self.root, self.options, self.keep = Path(root), options or {}, keep

    def path(self, version: int) -> Path:
        return self.root / f"v{version}"

    def fetch(self, uri: str, version: int, sha256: str | None) -> Path:
        """The local directory of version ``version`` published at ``uri`` with ``sha256``,
        downloaded (or its download resumed) and verified if the cache lacks it.

        Raises:
            NotFound: nothing is published at ``uri`` (pruned, or deleted).
            FetchFailed: a file is missing or differs from the manifest or the recorded sha256
                (the file is removed: the next try downloads it again).
            Exception: the storage library's error (unreachable, denied, timed out): try again later.
        """
        from .settings import make_dirs

        make_dirs(self.root)
        source = json.dumps({"uri": uri, "sha256": sha256})
        final = self.path(version)
        if self._whole(final, source):
            return final
        with open(self.root / f".v{version}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another collector of this home may be fetching it
            if self._whole(final, source):
                return final
            shutil.rmtree(final, ignore_errors=True)  # another URL's (a run recreated under the same name)
            partial = self.root / f"v{version}.partial"
            if (partial / ".source").exists() and (partial / ".source").read_text() != source:
                shutil.rmtree(partial)
            partial.mkdir(exist_ok=True)
            (partial / ".source").write_text(source)
            self._download(uri, partial, sha256)
            os.replace(partial, final)
        self._prune(version)
        return final

    @staticmethod
    def _whole(path: Path, source: str) -> bool:
        try:
            return (path / ".source").read_text() == source
        except OSError:
            return False

    def _download(self, uri: str, partial: Path, sha256: str | None) -> None:
        fs, root = filesystem(uri, self.options)
        root = root.rstrip("/")
        fs.invalidate_cache()
        try:
            man = json.loads(fs.cat_file(f"{root}/{MANIFEST}"))
        except FileNotFoundError:
            if not fs.exists(root):
                raise NotFound(f"nothing is published at {mask(uri)} (pruned by learner.keep_policies, or "
                               "deleted)") from None
            raise FetchFailed(f"{mask(uri)} has no {MANIFEST}: its upload did not finish") from None
        for f in man["files"]:
            name, size = f["name"], int(f["size"])
            if ".." in name.split("/") or name.startswith("/"):
                raise FetchFailed(f"{mask(uri)}: {MANIFEST} names {name!r}, outside the version")
            dest = partial / name
            if dest.exists() and dest.stat().st_size == size:
                continue  # downloaded whole by an earlier try (checked below with the others)
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_name(dest.name + ".part")
            offset = part.stat().st_size if part.exists() else 0
            if offset > size:
                part.unlink()
                offset = 0
            with open(part, "ab") as out:
                while offset < size:  # ranged reads, from where the last try stopped
                    end = min(offset + CHUNK, size)
                    data = fs.cat_file(f"{root}/{name}", start=offset, end=end)
                    if len(data) != end - offset:
                        raise FetchFailed(f"{mask(uri)}/{name}: asked for bytes {offset}-{end}, got {len(data)} "
                                          "(the server does not honour ranged reads?)")
                    out.write(data)
                    offset = end
            os.replace(part, dest)
        names = [f["name"] for f in man["files"]]
        digests, weights = _digests(partial, names)
        for f in man["files"]:
            if digests[f["name"]] != f["sha256"]:
                (partial / f["name"]).unlink()
                raise FetchFailed(f"{mask(uri)}/{f['name']}: sha256 {digests[f['name']][:12]}… is not the "
                                  f"manifest's {f['sha256'][:12]}…; removed, downloaded again at the next try")
        if sha256 is not None and weights != sha256:
            for name in names:
                if name.endswith(".safetensors"):
                    (partial / name).unlink()
            raise FetchFailed(f"{mask(uri)}: the weights' sha256 {weights[:12]}… is not the recorded "
                              f"{sha256[:12]}… (policy_versions.sha256): the files in storage are not the "
                              "version that was published")

    def _prune(self, newest: int) -> None:
        """Keep the newest ``keep`` whole versions (and partial ones newer than those)."""
        whole = sorted(int(p.name[1:]) for p in self.root.glob("v*") if p.name[1:].isdigit() and p.is_dir())
        kept = set(whole[-self.keep:]) | {newest}
        floor = min(kept)
        for p in self.root.glob("v*"):
            stem = p.name.removesuffix(".partial")
            if not stem[1:].isdigit():
                continue
            v = int(stem[1:])
            if (p.name == stem and v not in kept) or (p.name != stem and v < floor):
                shutil.rmtree(p, ignore_errors=True)
                (self.root / f".{stem}.lock").unlink(missing_ok=True)


def fetch_with_retries(cache: CheckpointCache, uri: str, version: int, sha256: str | None, *, limit_s: float,
                       echo: Callable[[str], None] = print) -> Path:
    """:meth:`CheckpointCache.fetch`, retried with backoff for ``limit_s`` seconds (``reflexdb eval``).

    Raises:
        NotFound: nothing is published there.
        StorageError: it kept failing; the message names the URL and the last cause.
    """
    t0 = time.monotonic()
    try:
        for tried in _retrying(limit_s, f"fetching policy v{version} from {mask(uri)}", uri, echo):
            with tried:
                return cache.fetch(uri, version, sha256)
    except (NotFound, StorageError):
        raise
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"fetching policy v{version} from {mask(uri)} failed for "
                           f"{time.monotonic() - t0:.0f} s: {reason(exc, uri)}") from None
    raise AssertionError("unreachable")
