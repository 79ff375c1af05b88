"""Published weights in object storage: the learner uploads a version, collectors fetch it.

``learner.checkpoint_url`` names where versions go. A path or a ``file://`` URL is the local
directory of old (``learner.checkpoint_dir``): nothing here is used, and the row says
``file://<path>``. Any other URL (``s3://bucket/run/``, ``gs://...``; the ``s3`` and ``gcs``
extras install their fsspec filesystems) is written through fsspec:

- **Upload** (:func:`upload`): the learner writes a version's files locally as always, then puts
  each under ``<prefix>/v<K>/`` and, last, ``manifest.json`` (each file's name, size and sha256).
  Only then does it record the ``policy_versions`` row, with ``<prefix>/v<K>``, the sha256 of the
  weights (:func:`weights_sha256`) and the sha256 of the manifest's bytes (``manifest_sha256``),
  so a collector never sees a version that is not wholly uploaded. Errors are retried with backoff
  for ``learner.upload_retry_s``.
- **One prefix per run**: ``<prefix>`` is ``<url>/<name>.r<id>`` (:func:`run_prefix`), and its
  marker :data:`OWNER_FILE` names the run (:class:`Owner`). Upload claims it (:func:`claim`),
  prune and delete check it (:func:`check_owner`): a run never writes into, prunes or deletes
  another run's versions, though their configs name the same URL. Versions recorded before
  (``<url>/v<K>``) are deleted only while their weights are the recorded ones
  (:func:`remove_if_recorded`).
- **Fetch** (:class:`CheckpointCache`): what a bucket holds is hostile input. A collector reads the
  manifest (at most 1 MiB) and checks it against the row's ``manifest_sha256`` before anything
  else, then its form (:func:`parse_manifest`), the total it lists against what the run's model can
  be (:func:`size_bound`) and each listed object's size; it downloads only the listed files into
  ``$REFLEXDB_HOME/cache/<run>/v<K>.partial/``, each through ``<name>.part`` with ranged reads, so
  a broken download resumes where it stopped; checks every file against the manifest and the
  weights against the row's sha256; then renames the directory to ``v<K>`` and keeps the newest
  few versions. The database's digests are what is trusted: storage only carries bytes. A version
  refused for its bytes (:class:`Rejected`) is not downloaded again until its row or its objects
  change. A version published before revision 0029 has no ``manifest_sha256``: its weights alone
  are checked against the database, its other files against its manifest (callers warn).
- **Credentials** come from the environment and the library's own sources (AWS variables,
  profiles, instance roles; ``AWS_ENDPOINT_URL``), never from the config, which is stored with the
  run (``runs.config``), logged to MLflow and printed by ``reflexdb check``. So
  ``learner.checkpoint_storage_options`` are refused, at any depth, where an option's *name* looks
  like a credential (its words, camelCase split: ``key``, ``SSECustomerKey``, ``sessionToken``,
  ``Authorization``, ``proxy_auth``, ``sas_token``, ...; :func:`check_options`) or a *value* holds
  one (a URL with a user or password, ``http://u:p@proxy:3128``, or a signed query; an HTTP
  ``Basic``/``Bearer`` value); and a checkpoint URL with a user, password or signed query is
  refused (:func:`check_url`). Every URL printed goes through :func:`mask`.
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
#: how much one ranged read (download) asks for. One read after another, 128 MiB fetched SmolLM2's
#: 0.5 GiB from moto's S3 server in 5.8 s, 32 MiB in 10.2 s (docs/benchmarks.md, issue 54); with
#: FETCH_CONCURRENCY reads in flight (issue 62) host memory holds at most that many ranges
CHUNK = 64 << 20
#: ranged reads in flight at once while a version downloads (``collector.checkpoint_fetch_concurrency``)
FETCH_CONCURRENCY = 8
#: schemes that are a local path: the collector reads the directory itself, nothing is copied
LOCAL_SCHEMES = ("", "file", "local")
#: the extra that installs each scheme's filesystem (``pip install -e '.[s3]'`` in reflexdb's clone)
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
#: s3fs's own tries of a call, at most: its ranged reads nest them (``cat_file`` with a range tries
#: its read 5 times, each read a call that tries 5 times), so through a 30 s outage a marker or a
#: manifest read hung about 2 minutes and then succeeded, where every other call fails within
#: seconds and reflexdb's own retries (with backoff and a time budget: learner.upload_retry_s, the
#: collectors' fetch) ride the outage out and say so. 2 x 2 tries is 4 reads at most.
S3_TRIES = 2
#: schemes fsspec can read but not write (a collector may load from them; the learner cannot publish there)
READ_ONLY = ("http", "https")

#: words that make an option, header or query parameter name a secret (``aws_secret_access_key``,
#: ``key``, ``token``, ``X-Amz-Signature``, ``sig``, ``SSECustomerKey``, ``Authorization``, ...)
_SECRET_WORDS = frozenset({"key", "secret", "token", "password", "passwd", "pwd", "passphrase", "credential",
                           "credentials", "creds", "signature", "sig", "sas", "auth", "authorization", "session",
                           "cookie", "cookies", "username"})
#: parts that make a word a secret wherever they stand in it (``apikey``, ``clientsecret``, ``tokens``)
_SECRET_PARTS = ("secret", "password", "passwd", "token", "credential", "apikey")
#: names that are a secret though no word of theirs is (adlfs' ``connection_string`` holds ``AccountKey=``)
_SECRET_PHRASES = (("connection", "string"), ("conn", "str"))
#: documented options whose names hold such a word but which are no credential: botocore's
#: ``signature_version`` (``s3v4``) and ``auth_scheme_preference`` (scheme names), S3's
#: ``SSEKMSKeyId`` (the id or ARN of a KMS key, not its material), gcsfs' ``session_kwargs`` (options
#: of its HTTP session, each checked in turn)
_NOT_SECRET = frozenset({"signature_version", "auth_scheme_preference", "SSEKMSKeyId", "session_kwargs"})
#: a name's words: split at anything not a letter or digit, and at camelCase (SSECustomerKey: SSE Customer Key)
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: an HTTP Authorization value (``Basic dXNlcjpwdw==``, ``Bearer eyJ...``, ``Digest username=...``,
#: SigV4's ``AWS4-HMAC-SHA256 Credential=...``), not words that start so (``Basic run``)
_AUTH_VALUE = re.compile(r"\s*(?:(?:basic|bearer|negotiate|ntlm)\s+[\w\-.~+/]{8,}=*(?=\s|$)"
                         r"|(?:digest|aws4-hmac-sha256)\s+\w+=)", re.IGNORECASE)
#: a string that is one URL (a scheme, then no blank): what :func:`mask_all` masks
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
_QUERY_PARAM = re.compile(r"([?&])([^=&#]+)=([^&#]*)")


class StorageError(ReflexdbError):
    """Object storage could not be written or read (after the retries the setting allows)."""

    exit_code = 8


class FetchFailed(StorageError):
    """A version could not be downloaded or did not match its recorded sha256."""


def _is_secret_name(name: str) -> bool:
    """Whether an option, header or query parameter named ``name`` looks like it holds a credential:
    one of its words (camelCase split) is a secret word or holds a secret part, or it is a secret
    phrase; the names of :data:`_NOT_SECRET` are not."""
    if name in _NOT_SECRET:
        return False
    words = [w.lower() for w in _WORD.findall(name)]
    if any(w in _SECRET_WORDS or any(p in w for p in _SECRET_PARTS) for w in words):
        return True
    return any(tuple(words[i:i + len(p)]) == p for p in _SECRET_PHRASES for i in range(len(words)))


def _bare_user(url: str) -> str | None:
    """The user part of ``url`` when it has one without a password (``https://TOKEN@host/``,
    ``s3://AKIA...@bucket``): a user alone can be the credential (a token as the user name). Only an
    '@' before the first '/' counts, so a path like ``s3://b/runs/alice@corp/`` holds none."""
    _, sep, tail = url.partition("://")
    end = min([i for i in (tail.find(c) for c in "/?#") if i >= 0], default=len(tail))
    at = tail.rfind("@", 0, end)
    if not sep or at < 0 or ":" in tail[:at]:  # no user part, or one with a password (mask_url's case)
        return None
    return tail[:at]


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
    """``url`` with any credentials replaced by ``***``: its user part (the password of
    ``https://u:p@host``; a user with no password, ``https://TOKEN@host``, whole) and secret query
    parameters (a presigned URL's ``X-Amz-Signature``, ``X-Amz-Credential``,
    ``X-Amz-Security-Token``; ``sig``, ``token``, ...). Safe to print."""
    masked = mask_url(url) if "://" in url else url
    user = _bare_user(masked)
    if user is not None:
        head, _, tail = masked.partition("://")
        masked = f"{head}://***{tail[len(user):]}"
    return _QUERY_PARAM.sub(lambda m: f"{m[1]}{m[2]}=***" if _is_secret_name(m[2]) else m[0], masked)


def mask_all(data: Any) -> Any:
    """``data`` (a config as plain data) with every string that is a URL masked (:func:`mask`), at
    any depth: what is stored, logged or printed holds no credential a URL carried."""
    if isinstance(data, dict):
        return {k: mask_all(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [mask_all(v) for v in data]
    return mask(data) if isinstance(data, str) and _URL.fullmatch(data) else data


def scrub(text: str, url: str) -> str:
    """``text`` (a library's error message) with the secrets of ``url`` replaced by ``***``."""
    from .settings import scrub as scrub_password

    text = scrub_password(text, url)
    user = _bare_user(url)
    if user is not None and len(user) >= 4:
        text = text.replace(user, "***")
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
    """Refuse storage options that hold a credential, at any depth (in dicts and lists); return them.

    The rule (the config is stored with the run, logged to MLflow and printed, so credentials come
    only from the environment):

    - a **name** that looks like a credential (:func:`_is_secret_name`: ``key``, ``secret``,
      ``token``, ``aws_secret_access_key``, ``SSECustomerKey``, ``sessionToken``, ``Authorization``,
      ``proxy_auth``, ``sas_token``, ``connection_string``, ...) is refused whatever it holds, unless
      its value is ``true``, ``false`` or empty (``s3_disable_express_session_auth: true``);
    - a **value** that carries one is refused under any name: a URL with a user or password
      (``endpoint_url: http://u:p@host``, ``proxies: {https: http://u:p@proxy:3128}``) or a signed
      query (:func:`mask` changes it), or an HTTP Authorization value (``Basic ...``, ``Bearer ...``).

    Raises:
        ValueError: naming each refused option by its dotted path (URLs masked; never the secret).
    """
    def walk(node: Any, path: str) -> Iterator[str]:
        if isinstance(node, dict):
            for k, v in node.items():
                dotted = f"{path}.{k}"
                if _is_secret_name(str(k)) and not (v is None or isinstance(v, bool) or v in ("", {}, [])):
                    yield f"{dotted}: looks like a credential"
                else:
                    yield from walk(v, dotted)
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")
        elif isinstance(node, str):
            if "://" in node and mask(node) != node:
                yield f"{path}: {mask(node)} holds credentials (a user or password in the URL, or a signed query)"
            elif _AUTH_VALUE.match(node):
                yield f"{path}: holds an HTTP Authorization value"

    bad = list(walk(options, where))
    if bad:
        raise ValueError("; ".join(bad) + ". The config is stored with the run, logged to MLflow and printed: give "
                         "credentials through the environment or the library's own sources (AWS_* variables, "
                         "AWS_PROFILE or `profile: NAME`, ~/.aws/credentials, an instance role; "
                         "GOOGLE_APPLICATION_CREDENTIALS; HTTPS_PROXY for a proxy that needs a login)")
    return options


def filesystem(url: str, options: dict[str, Any] | None = None):
    """``(fsspec filesystem, path)`` for ``url``; a missing extra is a clear error.

    Raises:
        StorageError: the scheme's filesystem is not installed.
    """
    import fsspec.core

    try:
        fs, path = fsspec.core.url_to_fs(url, **(options or {}))
    except ImportError as exc:
        extra = EXTRAS.get(scheme(url))
        hint = f"pip install -e '.[{extra}]' in reflexdb's clone" if extra else "install the fsspec filesystem for it"
        raise StorageError(f"{mask(url)} needs a filesystem that is not installed ({exc}): {hint}") from None
    if isinstance(getattr(fs, "retries", None), int) and fs.retries > S3_TRIES:
        fs.retries = S3_TRIES  # s3fs: see S3_TRIES
    return fs, path


def reason(exc: BaseException, url: str = "") -> str:
    """One line saying why a storage call failed, with no secret in it."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return scrub(text, url) if url else text


def weights_sha256(directory: str | Path) -> str:
    """sha256 over the directory's ``*.safetensors`` files, in name order (``policy_versions.sha256``).

    One definition for every version, sharded or not: shards are named ``model-00001-of-0000N``, so
    name order is shard order. It is one serial pass (about 1 GB/s with SHA-NI); a version's
    ``manifest.json`` also holds each file's own sha256, which readers check in parallel
    (:func:`verify_version`)."""
    h = hashlib.sha256()
    for f in sorted(Path(directory).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(HASH_READ), b""):
                h.update(chunk)
    return h.hexdigest()


#: bytes read per call while hashing (hashlib releases the GIL on large updates: threads hash in parallel)
HASH_READ = 4 << 20
#: files hashed at once (:func:`_digests`): each is one thread reading and hashing a file
HASH_WORKERS = max(1, min(8, os.cpu_count() or 1))


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(HASH_READ), b""):
            h.update(chunk)
    return h.hexdigest()


def _digests(directory: Path, names: list[str], *, weights: bool = True,
             workers: int | None = None) -> tuple[dict[str, str], str | None]:
    """Each file's sha256 and (``weights``) the weights' (:func:`weights_sha256`: the top-level
    ``*.safetensors`` in name order), ``None`` without it. The files are hashed in parallel
    (``workers`` threads, default :data:`HASH_WORKERS`), the weights' serial digest in a thread of
    its own beside them, so the whole takes about as long as that one serial pass."""
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(names)
    shards = [directory / n for n in names if "/" not in n and n.endswith(".safetensors")]

    def concat() -> str:
        h = hashlib.sha256()
        for f in shards:
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(HASH_READ), b""):
                    h.update(chunk)
        return h.hexdigest()

    with ThreadPoolExecutor(max_workers=workers or HASH_WORKERS, thread_name_prefix="sha256") as pool:
        whole = pool.submit(concat) if weights else None
        # the largest first, so the pool ends together
        order = sorted(names, key=lambda n: -(directory / n).stat().st_size)
        futures = {n: pool.submit(_file_sha256, directory / n) for n in order}
        out = {n: futures[n].result() for n in names}
        return out, (whole.result() if whole is not None else None)


def manifest(directory: Path) -> dict[str, Any]:
    """What :func:`upload` writes last and :func:`write_manifest` writes beside a version's files:
    each file's name (relative, ``/``-separated), size and sha256, and the weights' sha256
    (:func:`weights_sha256`). A ``manifest.json`` already there is not listed."""
    names = sorted(rel for p in directory.rglob("*") if p.is_file()
                   and (rel := p.relative_to(directory).as_posix()) != MANIFEST)
    digests, weights = _digests(directory, names)
    return {"files": [{"name": n, "size": (directory / n).stat().st_size, "sha256": digests[n]} for n in names],
            "weights_sha256": weights}


def write_manifest(directory: Path) -> tuple[str, str]:
    """Write ``directory/manifest.json`` (:func:`manifest`); ``(the weights' sha256, the sha256 of
    the manifest's bytes)``: ``policy_versions.sha256`` and ``manifest_sha256``. The learner writes
    it with every version (export_hf, before the files are flushed and renamed into place), so a
    collector reading the version in place, from shared memory or through storage checks every
    file through one digest the database holds. Written under a temporary name and renamed."""
    directory = Path(directory)
    man = manifest(directory)
    body = json.dumps(man, indent=1).encode()
    tmp = directory / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_bytes(body)
    os.replace(tmp, directory / MANIFEST)
    return man["weights_sha256"], hashlib.sha256(body).hexdigest()


def manifest_digest(directory: Path) -> tuple[str | None, str | None]:
    """``(weights' sha256, manifest sha256)`` of the ``manifest.json`` a version's directory holds
    (written by :func:`write_manifest`); ``(None, None)`` when it holds none."""
    try:
        body = (Path(directory) / MANIFEST).read_bytes()
    except FileNotFoundError:
        return None, None
    return json.loads(body).get("weights_sha256"), hashlib.sha256(body).hexdigest()


def _retrying(limit_s: float, what: str, url: str, echo: Callable[[str], None]):
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    def before_sleep(state) -> None:
        echo(f"{what} failed ({reason(state.outcome.exception(), url)}); retrying in "
             f"{state.next_action.sleep:.0f} s (for up to {limit_s:.0f} s in all)")

    def retried(e: BaseException) -> bool:  # not: nothing there, a missing extra, a version storage holds
        # other than published (Rejected: waiting does not change its bytes); a FetchFailed is: a new try
        return not isinstance(e, (NotFound, KeyboardInterrupt, Rejected)) and (
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
           echo: Callable[[str], None] = print, owner: Owner | None = None) -> str:
    """Put the files of ``directory`` under ``url`` (``<prefix>/v<K>``), then its manifest (its own
    ``manifest.json`` when it has one, :func:`write_manifest`; else made here), retrying
    for ``limit_s`` seconds with backoff. With ``owner``, the prefix is claimed for that run first
    (:func:`claim`) and an upload into another run's prefix is refused. Whatever lay at ``url``
    before is removed first: no row names it (a version is recorded only after its upload).
    Returns the sha256 of the manifest's bytes as uploaded (``policy_versions.manifest_sha256``:
    collectors check every file through it).

    Raises:
        PrefixOwned: the prefix is another run's; nothing was written.
        StorageError: it kept failing for ``limit_s`` seconds; the message names the URL and the last cause.
    """
    from fsspec.implementations.local import LocalFileSystem

    fs, root = filesystem(url, options)
    root = root.rstrip("/")
    local = isinstance(fs, LocalFileSystem)
    try:  # the one the learner wrote beside the files (write_manifest): its digest is the row's
        body = (directory / MANIFEST).read_bytes()
        man = json.loads(body)
    except FileNotFoundError:
        man = manifest(directory)
        body = json.dumps(man, indent=1).encode()
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
        fs.pipe_file(f"{root}/{MANIFEST}", body)
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
    return hashlib.sha256(body).hexdigest()


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

#: the most bytes a ``manifest.json`` may hold, read with one ranged read (a larger one is refused
#: unread): the learner's lists a version's files in a few KiB (about 120 bytes a file)
MANIFEST_MAX_BYTES = 1 << 20
#: the most files a manifest may list (a 70B model in 30 shards with its tokenizer lists about 40)
MANIFEST_MAX_FILES = 4096
#: what a version may hold besides its weights (:func:`size_bound`): config, tokenizer and chat
#: template files (Gemma's tokenizer.json, the largest we know, is 34 MB), the shards' index
NON_WEIGHT_BYTES = 256 << 20
#: the fields of a storage object's info that change when it is rewritten (S3's ETag, a local
#: file's mtime, ...): what says that a refused version's objects changed (:class:`Rejected`)
_IDENTITY = ("ETag", "etag", "LastModified", "last_modified", "mtime", "created", "generation", "md5Hash", "size")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Rejected(FetchFailed):
    """What storage holds for a version is not what was published, or cannot be: a manifest that
    is not the recorded one (``policy_versions.manifest_sha256``) or cannot be read, a file that
    fails its sha256 or is not the size listed, more bytes than the run's model can be. The cache
    does not download it again until the version's row or its objects change; a caller that retries
    waits for that (``again``: this try found them unchanged since they were refused, and
    downloaded nothing)."""

    def __init__(self, message: str, *, again: bool = False):
        super().__init__(message)
        self.again = again


def size_bound(model: str | Path | None) -> int | None:
    """The most bytes a published version of a run of ``model`` (the run's base model directory)
    can hold: each of its parameters at 4 bytes (float32, the widest dtype the learner writes), a
    quarter more (an export that stores a tied embedding twice, headers), and
    :data:`NON_WEIGHT_BYTES` for its config and tokenizer files. The parameters are counted from the
    safetensors headers (nothing is loaded); pickled weights alone (``*.bin``) count as at least 2
    bytes a parameter. ``None`` when ``model`` is not a directory with weights (then only the
    manifest's own limits apply)."""
    import math

    d = Path(model) if model is not None else None
    if d is None or not d.is_dir():
        return None
    params = 0
    shards = sorted(d.glob("*.safetensors"))
    if shards:
        from safetensors import safe_open

        for f in shards:
            with safe_open(f, framework="numpy") as fh:  # reads the header only
                params += sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    else:
        params = sum(f.stat().st_size for f in d.iterdir() if f.suffix in (".bin", ".pt", ".pth")) // 2
    if params == 0:
        return None
    return params * 4 * 5 // 4 + NON_WEIGHT_BYTES


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _unsafe(name: str) -> str | None:
    """Why ``name`` (a file a manifest lists) is not a plain path inside the version; ``None`` if it is."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "not UTF-8"
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        return "outside the version"
    if "" in parts or "." in parts or "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "not a plain relative path"
    if any(p.startswith(".") for p in parts) or name.endswith(".part"):
        return "a name the cache keeps for itself (hidden, or *.part)"
    if len(name) > 1024 or any(len(p.encode()) > 255 for p in parts):
        return "too long a name"
    return None


def parse_manifest(data: bytes, where: str) -> tuple[list[tuple[str, int, str]], str | None]:
    """The files a ``manifest.json`` lists, as ``(name, size, sha256)``, and its ``weights_sha256``
    (``None`` if absent). ``where``: the manifest's URL, masked, for the messages.

    Raises:
        Rejected: one line naming ``where`` and what is wrong (not UTF-8, not JSON, a key missing,
            a value of the wrong type, a name outside the version, too many files).
    """
    def bad(why: str) -> Rejected:
        return Rejected(f"{where}: {why}")

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    try:
        man = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg}: line {e.lineno} column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # an integer of 5,000 digits; [[[[... nested too deep
        raise bad(f"not valid JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(man, dict):
        raise bad(f"holds {_kind(man)}, not an object with a 'files' list")
    if "files" not in man:
        raise bad("has no key 'files'")
    files = man["files"]
    if not isinstance(files, list):
        raise bad(f"'files' is {_kind(files)}, not a list")
    if not files:
        raise bad("lists no file")
    if len(files) > MANIFEST_MAX_FILES:
        raise bad(f"lists {len(files):,} files, more than the {MANIFEST_MAX_FILES:,} a version may have")
    out: list[tuple[str, int, str]] = []
    names: set[str] = set()
    for i, f in enumerate(files):
        at = f"files[{i}]"
        if not isinstance(f, dict):
            raise bad(f"{at} is {_kind(f)}, not an object with name, size and sha256")
        for key in ("name", "size", "sha256"):
            if key not in f:
                raise bad(f"{at} has no key {key!r}")
        name, size, digest = f["name"], f["size"], f["sha256"]
        if not isinstance(name, str):
            raise bad(f"{at}.name is {_kind(name)}, not a string")
        if (problem := _unsafe(name)) is not None:
            raise bad(f"names {_show(name)}, {problem}")
        if type(size) is not int or size < 0:
            raise bad(f"{at}.size is {_show(size)}, not a whole number of bytes")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise bad(f"{at}.sha256 is {_show(digest)}, not 64 lower-case hex digits")
        if name in names:
            raise bad(f"names {_show(name)} twice")
        names.add(name)
        out.append((name, size, digest))
    folders = {n.rsplit("/", i)[0] for n in names for i in range(1, n.count("/") + 1)}
    if clash := sorted(names & folders):
        raise bad(f"names {_show(clash[0])} both as a file and as a folder")
    weights = man.get("weights_sha256")
    if weights is not None and (not isinstance(weights, str) or not _SHA256.fullmatch(weights)):
        raise bad(f"weights_sha256 is {_show(weights)}, not 64 lower-case hex digits")
    return out, weights


def cache_root(run: str) -> Path:
    """``$REFLEXDB_HOME/cache/<run>``: where a collector keeps the versions it fetched."""
    from .settings import home

    return home() / "cache" / re.sub(r"[^A-Za-z0-9._-]", "_", run).lstrip(".")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


class CheckpointCache:
    """The versions a collector (or ``reflexdb eval``) fetched from storage, under ``root``.

    ``v<K>/`` is a whole, verified version (its ``.source`` says the URL and digests it was fetched
    for) holding only the files its manifest lists; ``v<K>.partial/`` a download under way or broken
    off, resumed by the next :meth:`fetch`; ``.v<K>.rejected`` what was refused of a version (see
    :class:`Rejected`). A lock file per version lets collectors that share a home fetch it once.
    ``max_bytes``: the most a version may hold (:func:`size_bound`), checked before downloading;
    ``concurrency``: ranged reads in flight at once (``collector.checkpoint_fetch_concurrency``:
    across a version's files and within a large one).
    """

    def __init__(self, root: Path, options: dict[str, Any] | None = None, *, keep: int = 2,
                 max_bytes: int | None = None, concurrency: int = FETCH_CONCURRENCY):
        self.root, self.options, self.keep, self.max_bytes = Path(root), options or {}, keep, max_bytes
        self.concurrency = max(1, int(concurrency))

    def path(self, version: int) -> Path:
        return self.root / f"v{version}"

    @staticmethod
    def _source(uri: str, sha256: str | None, manifest_sha256: str | None) -> str:
        return json.dumps({"uri": uri, "sha256": sha256, "manifest_sha256": manifest_sha256})

    def cached(self, uri: str, version: int, sha256: str | None, manifest_sha256: str | None = None) -> Path | None:
        """The directory of version ``version`` if the cache holds it whole, fetched and verified for
        this row (``uri`` and its digests); ``None`` if not."""
        final = self.path(version)
        return final if self._whole(final, self._source(uri, sha256, manifest_sha256)) else None

    def versions(self) -> list[int]:
        """The versions the cache holds whole, oldest first (for which rows: :meth:`cached`)."""
        return sorted(int(p.name[1:]) for p in self.root.glob("v*") if p.name[1:].isdigit() and p.is_dir())

    def fetch(self, uri: str, version: int, sha256: str | None, manifest_sha256: str | None = None) -> Path:
        """The local directory of version ``version`` published at ``uri`` with ``sha256`` (of its
        weights) and ``manifest_sha256`` (of its manifest; ``None``: a version published before
        revision 0029, whose weights alone are checked against the database), downloaded (or its
        download resumed) and verified if the cache lacks it.

        The manifest is read first (at most :data:`MANIFEST_MAX_BYTES`) and checked against
        ``manifest_sha256`` before anything else; then its form, the size it lists against
        ``max_bytes``, and each listed object's size in storage; only listed files are downloaded,
        each checked against the manifest's sha256, and nothing else is kept.

        Raises:
            NotFound: nothing is published at ``uri`` (pruned, or deleted).
            Rejected: storage holds something other than what was published (see the class); it is
                not downloaded again until the row or the objects change.
            FetchFailed: a listed object is missing, or the cache's disk has no room; try again later.
            Exception: the storage library's error (unreachable, denied, timed out): try again later.
        """
        from .settings import make_dirs

        make_dirs(self.root)
        source = self._source(uri, sha256, manifest_sha256)
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
            self._download(uri, partial, sha256, manifest_sha256, source, self.root / f".v{version}.rejected")
            os.replace(partial, final)
        self._prune(version)
        return final

    @staticmethod
    def _whole(path: Path, source: str) -> bool:
        try:
            return (path / ".source").read_text() == source
        except OSError:
            return False

    def _download(self, uri: str, partial: Path, sha256: str | None, manifest_sha256: str | None, source: str,
                  refused: Path) -> None:
        fs, root = filesystem(uri, self.options)
        root = root.rstrip("/")
        where = mask(uri)
        fs.invalidate_cache()
        data = self._manifest(fs, root, uri)
        digest = hashlib.sha256(data).hexdigest()
        if manifest_sha256 is not None and digest != manifest_sha256:
            raise Rejected(f"{where}/{MANIFEST}: sha256 {digest[:12]}… is not the recorded {manifest_sha256[:12]}… "
                           "(policy_versions.manifest_sha256): the files in storage are not the version that was "
                           "published; nothing it lists was read")
        files, weights = parse_manifest(data, f"{where}/{MANIFEST}")
        if sha256 is not None and weights is not None and weights != sha256:
            raise Rejected(f"{where}: the weights' sha256 {weights[:12]}… in its {MANIFEST} is not the recorded "
                           f"{sha256[:12]}… (policy_versions.sha256): the files in storage are not the version that "
                           "was published; nothing it lists was read")
        total = sum(size for _, size, _ in files)
        if self.max_bytes is not None and total > self.max_bytes:
            raise Rejected(f"{where}/{MANIFEST} lists {total:,} bytes ({_gib(total)}) in {len(files)} file(s), more "
                           f"than a version of this run's model can hold ({_gib(self.max_bytes)}: its parameters at "
                           f"4 bytes, a quarter more, and {NON_WEIGHT_BYTES >> 20} MiB for config and tokenizer "
                           "files); refused before downloading anything")
        objects = {}
        for name, size, _ in files:  # one HEAD each: the size in storage, and what says it changed
            try:
                info = fs.info(f"{root}/{name}")
            except FileNotFoundError:
                raise FetchFailed(f"{where}/{name}: listed in {MANIFEST} but not in storage (deleted, or pruned "
                                  "meanwhile)") from None
            held = info.get("size")
            if held is not None and int(held) != size:
                raise Rejected(f"{where}/{name} holds {int(held):,} bytes, {MANIFEST} lists {size:,}: not the file "
                               "that was published; refused before downloading it")
            objects[name] = {k: str(info[k]) for k in _IDENTITY if info.get(k) is not None}
        fingerprint = hashlib.sha256(data + json.dumps(objects, sort_keys=True).encode()).hexdigest()
        try:
            before = json.loads(refused.read_text())
        except (OSError, ValueError):
            before = None
        if isinstance(before, dict) and before.get("source") == source and before.get("fingerprint") == fingerprint:
            raise Rejected(f"{before.get('why')} (its row and objects are unchanged since: nothing was downloaded "
                           "again)", again=True)
        try:
            self._files(fs, root, where, partial, files, sha256)
        except Rejected as exc:
            refused.write_text(json.dumps({"source": source, "fingerprint": fingerprint, "why": str(exc)}))
            raise
        refused.unlink(missing_ok=True)

    @staticmethod
    def _manifest(fs, root: str, uri: str) -> bytes:
        """The bytes of ``manifest.json``, at most :data:`MANIFEST_MAX_BYTES` (one ranged read)."""
        try:
            data = fs.cat_file(f"{root}/{MANIFEST}", start=0, end=MANIFEST_MAX_BYTES + 1)
        except FileNotFoundError:
            if not fs.exists(root):
                raise NotFound(f"nothing is published at {mask(uri)} (pruned by learner.keep_policies, or "
                               "deleted)") from None
            raise FetchFailed(f"{mask(uri)} has no {MANIFEST}: its upload did not finish") from None
        if len(data) > MANIFEST_MAX_BYTES:
            raise Rejected(f"{mask(uri)}/{MANIFEST} holds more than {MANIFEST_MAX_BYTES >> 20} MiB (the learner "
                           "writes a few KiB): refused unread")
        return data

    def _files(self, fs, root: str, where: str, partial: Path, files: list[tuple[str, int, str]],
               sha256: str | None) -> None:
        """Download the listed files into ``partial`` (resuming ``.part`` files with ranged reads),
        remove anything else there, and check each against the manifest and the weights against
        ``sha256``."""
        listed = {name for name, _, _ in files}
        for p in sorted(partial.rglob("*"), reverse=True):  # what no manifest of this row lists: never kept
            rel = p.relative_to(partial).as_posix()
            if (p.is_file() or p.is_symlink()) and rel != ".source" and rel.removesuffix(".part") not in listed:
                p.unlink()
            elif p.is_dir() and not p.is_symlink() and not any(p.iterdir()):
                p.rmdir()

        def have(name: str, size: int) -> int:
            dest = partial / name
            if dest.is_file() and dest.stat().st_size == size:
                return size
            part = dest.with_name(dest.name + ".part")
            return min(part.stat().st_size, size) if part.is_file() else 0

        need = sum(size - have(name, size) for name, size, _ in files)
        free = shutil.disk_usage(partial).free
        if need > free:
            raise FetchFailed(f"{where}: needs {_gib(need)} more in {partial.parent}, which has {_gib(free)} free; "
                              "free space there (collector.checkpoint_cache_versions keeps fewer versions)")
        self._ranges(fs, root, where, partial, files)
        names = [name for name, _, _ in files]
        digests, weights = _digests(partial, names, weights=sha256 is not None)
        wrong = [(name, want) for name, _, want in files if digests[name] != want]
        for name, _ in wrong:
            (partial / name).unlink()
        if wrong:
            name, want = wrong[0]
            more = f" (and {len(wrong) - 1} other file(s))" if len(wrong) > 1 else ""
            raise Rejected(f"{where}/{name}: sha256 {digests[name][:12]}… is not the manifest's {want[:12]}…{more}; "
                           "removed, and not downloaded again until the version's objects in storage change")
        if sha256 is not None and weights != sha256:
            for name in names:
                if name.endswith(".safetensors"):
                    (partial / name).unlink()
            raise Rejected(f"{where}: the weights' sha256 {weights[:12]}… is not the recorded {sha256[:12]}… "
                           "(policy_versions.sha256): the files in storage are not the version that was published")

    def _ranges(self, fs, root: str, where: str, partial: Path, files: list[tuple[str, int, str]]) -> None:
        """Download what ``partial`` lacks of ``files`` with ranged reads of at most :data:`CHUNK`,
        ``concurrency`` of them in flight at once (a thread pool), written in order: each file's
        ``.part`` stays the prefix it has downloaded, so a broken download resumes from its end
        (the ranges read past the one that failed are dropped). Host memory holds at most
        ``concurrency`` ranges."""
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        ranges: list[tuple[str, int, int, int]] = []  # (name, start, end, size), files in order, each from its .part
        for name, size, _ in files:
            dest = partial / name
            if dest.is_file() and dest.stat().st_size == size:
                continue  # downloaded whole by an earlier try (checked later with the others)
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_name(dest.name + ".part")
            offset = part.stat().st_size if part.exists() else 0
            if offset > size:
                part.unlink()
                offset = 0
            if offset == size:  # whole already (or empty): only the rename is left
                part.touch()
                os.replace(part, dest)
                continue
            ranges += [(name, start, min(start + CHUNK, size), size) for start in range(offset, size, CHUNK)]

        def read(name: str, start: int, end: int) -> bytes:
            try:
                return fs.cat_file(f"{root}/{name}", start=start, end=end)
            except FileNotFoundError:
                raise FetchFailed(f"{where}/{name}: listed in {MANIFEST} but gone from storage (deleted, or pruned "
                                  "meanwhile)") from None

        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="fetch-range")
        queue: deque = deque()
        todo = iter(ranges)
        out, writing = None, None

        def submit() -> None:
            job = next(todo, None)
            if job is not None:
                queue.append((job, pool.submit(read, *job[:3])))

        try:
            for _ in range(self.concurrency):
                submit()
            while queue:
                (name, start, end, size), future = queue.popleft()
                data = future.result()
                submit()
                dest = partial / name
                part = dest.with_name(dest.name + ".part")
                if writing != name:
                    out, writing = open(part, "ab"), name  # noqa: SIM115 - closed when the file ends, or below
                if len(data) != end - start:
                    out.close()
                    out = None
                    part.unlink()
                    raise FetchFailed(f"{where}/{name}: asked for bytes {start}-{end}, got {len(data)}: the object is "
                                      f"not the {size:,} bytes {MANIFEST} lists (rewritten meanwhile?), or the server "
                                      "does not honour ranged reads")
                out.write(data)
                if end == size:
                    out.close()
                    out, writing = None, None
                    os.replace(part, dest)
        finally:
            if out is not None:
                out.close()
            pool.shutdown(wait=False, cancel_futures=True)  # reads in flight after a failure: dropped

    def _prune(self, newest: int) -> None:
        """Keep the newest ``keep`` whole versions (and partial ones newer than those)."""
        whole = self.versions()
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
        for p in self.root.glob(".v*.rejected"):
            stem = p.name[1:].removesuffix(".rejected")
            if stem[1:].isdigit() and int(stem[1:]) < floor:
                p.unlink(missing_ok=True)


def fetch_with_retries(cache: CheckpointCache, uri: str, version: int, sha256: str | None, *, limit_s: float,
                       manifest_sha256: str | None = None, echo: Callable[[str], None] = print) -> Path:
    """:meth:`CheckpointCache.fetch`, retried with backoff for ``limit_s`` seconds (``reflexdb eval``);
    a :class:`Rejected` version is not retried (its bytes will not change by waiting).

    Raises:
        NotFound: nothing is published there.
        Rejected: storage holds something other than what was published.
        StorageError: it kept failing; the message names the URL and the last cause.
    """
    t0 = time.monotonic()
    try:
        for tried in _retrying(limit_s, f"fetching policy v{version} from {mask(uri)}", uri, echo):
            with tried:
                return cache.fetch(uri, version, sha256, manifest_sha256)
    except (NotFound, StorageError):
        raise
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"fetching policy v{version} from {mask(uri)} failed for "
                           f"{time.monotonic() - t0:.0f} s: {reason(exc, uri)}") from None
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------- a version read in place

#: the index ``save_pretrained`` writes beside the shards of a sharded version: tensor -> shard
INDEX = "model.safetensors.index.json"


class TornVersion(ReflexdbError):
    """A published version's files where a collector reads them in place (the learner's directory,
    or its shared-memory copy) are not the ones its row recorded: a shard missing, truncated or
    changed, a shard nothing lists, a manifest missing or not the recorded one. Nothing of it is
    loaded; the collector keeps its weights."""

    exit_code = 8


def _index_shards(directory: Path, where: str) -> list[str]:
    """The shard files ``directory``'s :data:`INDEX` names (``[]`` without one).

    Raises:
        TornVersion: the index is not one ``save_pretrained`` writes.
    """
    try:
        data = (directory / INDEX).read_bytes()
    except FileNotFoundError:
        return []
    try:
        weight_map = json.loads(data)["weight_map"]
        shards = sorted({str(v) for v in weight_map.values()})
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise TornVersion(f"{where}/{INDEX}: not an index of shards ({type(exc).__name__})") from None
    if bad := [s for s in shards if _unsafe(s) is not None or "/" in s]:
        raise TornVersion(f"{where}/{INDEX}: names {_show(bad[0])}, not a file of the version")
    return shards


def verify_version(directory: str | Path, sha256: str | None, manifest_sha256: str | None, *,
                   workers: int | None = None) -> str:
    """Check a version read in place (``file://``: the learner's directory; or its shared-memory
    copy) against what its row recorded, before anything of it is loaded; return what was checked,
    for the log line.

    With ``manifest_sha256`` (the learner writes a ``manifest.json`` with every version since
    issue 62: :func:`write_manifest`), in this order, so a missing or truncated shard is named
    before anything is hashed:

    1. ``manifest.json`` (at most :data:`MANIFEST_MAX_BYTES`) against ``manifest_sha256``, then its
       form (:func:`parse_manifest`) and its ``weights_sha256`` against ``sha256``;
    2. every ``*.safetensors`` in the directory is listed (a stray shard would be loaded too), and
       every shard the index (:data:`INDEX`) names is listed;
    3. each listed file is there, with its listed size;
    4. each file's sha256 against the manifest, hashed in parallel (``workers`` threads).

    The weights' serial digest is not computed again: the manifest is the one the database
    recorded, it says the weights' digest is the row's, and each file is the one it lists.
    Without ``manifest_sha256`` (a version published before): every shard the index names is
    there, and the weights' sha256 (one serial pass) is ``sha256``. With neither recorded (a row
    written by hand): nothing to check against.

    Raises:
        TornVersion: one line naming the file and what is wrong with it.
    """
    directory = Path(directory)
    where = str(directory)
    if not directory.is_dir():
        raise TornVersion(f"{where}: no such directory on this machine (pruned, deleted, or on a disk this "
                          "machine does not mount)")
    if manifest_sha256 is None:
        for shard in _index_shards(directory, where):
            if not (directory / shard).is_file():
                raise TornVersion(f"{where}/{shard}: missing ({INDEX} names it)")
        if sha256 is None:
            return "no sha256 recorded: nothing checked"
        got = weights_sha256(directory)
        if got != sha256:
            raise TornVersion(f"{where}: the weights' sha256 {got[:12]}… is not the recorded {sha256[:12]}… "
                              "(policy_versions.sha256): a shard is missing, truncated or changed")
        return f"weights' sha256 {sha256[:12]}… verified"
    try:
        with open(directory / MANIFEST, "rb") as fh:
            data = fh.read(MANIFEST_MAX_BYTES + 1)
    except FileNotFoundError:
        raise TornVersion(f"{where}/{MANIFEST}: missing (the version's files are incomplete)") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest_sha256:
        raise TornVersion(f"{where}/{MANIFEST}: sha256 {digest[:12]}… is not the recorded {manifest_sha256[:12]}… "
                          "(policy_versions.manifest_sha256)")
    try:
        files, weights = parse_manifest(data, f"{where}/{MANIFEST}")
    except Rejected as exc:
        raise TornVersion(str(exc)) from None
    if sha256 is not None and weights != sha256:
        raise TornVersion(f"{where}/{MANIFEST}: the weights' sha256 {str(weights)[:12]}… is not the recorded "
                          f"{sha256[:12]}… (policy_versions.sha256)")
    listed = {name: size for name, size, _ in files}
    for p in sorted(directory.glob("*.safetensors")):
        if p.name not in listed:
            raise TornVersion(f"{where}/{p.name}: a shard {MANIFEST} does not list (it would be loaded with the others)")
    for shard in _index_shards(directory, where):
        if shard not in listed:
            raise TornVersion(f"{where}/{INDEX}: names {shard}, which {MANIFEST} does not list")
    for name, size, _ in files:
        try:
            held = (directory / name).stat().st_size
        except FileNotFoundError:
            raise TornVersion(f"{where}/{name}: missing (listed in {MANIFEST}, {size:,} bytes)") from None
        if held != size:
            raise TornVersion(f"{where}/{name}: holds {held:,} bytes, {MANIFEST} lists {size:,} (truncated, or "
                              "written over)")
    try:
        digests, _ = _digests(directory, list(listed), weights=False, workers=workers)
    except OSError as exc:
        raise TornVersion(f"{where}: could not read it ({reason(exc)})") from None
    wrong = [(name, want) for name, _, want in files if digests[name] != want]
    if wrong:
        name, want = wrong[0]
        more = f" (and {len(wrong) - 1} other file(s))" if len(wrong) > 1 else ""
        raise TornVersion(f"{where}/{name}: sha256 {digests[name][:12]}… is not the manifest's {want[:12]}…{more}")
    return f"manifest sha256 {manifest_sha256[:12]}… verified, and every file against it"
