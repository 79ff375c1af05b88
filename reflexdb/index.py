"""FAISS index of trajectory embeddings, one per run, kept in step with PostgreSQL.

The ``embeddings`` table is the source of truth; the index is a cache of it on local disk::

    index = EmbeddingIndex.open(store, run_id)     # the persisted index, or an empty one
    index.catch_up()                               # add vectors committed since, drop deleted ones
    [hits] = index.search(vector, k=5)             # cosine similarity (approximate past the threshold)
    hits = index.search_trajectory(tid, k=5, restrict_to=failure_ids)   # always exact

Vectors are L2-normalised and keyed by trajectory id, so inner product is cosine similarity. A
run's index starts exact, ``IndexIDMap2(IndexFlatIP(D))``: an index caught up in many steps and
one rebuilt from the table return the same neighbours. Once it holds ``faiss.ann_threshold``
vectors it is replaced by a trained ``IndexIVFFlat`` (inner product, ids in its lists, a hashtable
direct map for ``reconstruct``/``remove_ids``): unrestricted search then scans ``faiss.nprobe``
lists (approximate); restricted search scans every list, or brute-forces the subset, and stays
exact with the same results as the flat index. Ties in cosine are broken by the smaller trajectory
id, so results do not depend on the order vectors were added.

Files live in ``$REFLEXDB_HOME/faiss/<database>/run-<id>.faiss`` with a JSON sidecar
``run-<id>.json`` naming the database and run they were built from (see docs/faiss.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import psycopg

from . import settings
from .config import FaissConfig, parse_section
from .errors import NotFound, ReflexdbError

log = logging.getLogger(__name__)

#: Version of the on-disk layout; a sidecar with another version is ignored (and rebuilt).
#: 2: the index may be IVF-Flat; the sidecar records ``kind`` and ``trained_size``.
FORMAT_VERSION = 2
#: Restricted searches over fewer ids than this reconstruct the subset and brute-force it;
#: larger subsets scan the whole index with an ``IDSelectorBatch``.
BRUTE_FORCE_MAX = 16384
#: Rows of ``embeddings`` fetched per query while catching up.
FETCH_CHUNK = 4096
#: FAISS warns when k-means has fewer training points than this per centroid; nlist is capped so
#: that it never does.
MIN_POINTS_PER_LIST = 39
#: Seed of the k-means training sample and of k-means itself: same vectors, same centroids.
TRAIN_SEED = 1234
#: GPU indexes take k and nprobe up to this; larger searches run on the CPU index.
GPU_MAX_K = 2048

# Inline rather than in reflexdb/sql/: these are index plumbing, not part of the query surface.
_SQL_SYSTEM_ID = "SELECT system_identifier FROM pg_control_system()"
_SQL_DATABASE = "SELECT current_database(), (SELECT oid FROM pg_database WHERE datname = current_database())"
_SQL_RUN = "SELECT created_at, config -> 'faiss' FROM runs WHERE id = %(run_id)s"
# array_agg keeps millions of ids to one binary value (decoded straight into numpy by codecs).
# embeddings carries its trajectory's run_id (its partition key, 0015): one partition is read.
_SQL_RUN_IDS = """
    SELECT coalesce(array_agg(e.trajectory_id), '{}'::int8[])
    FROM embeddings e
    WHERE e.run_id = %(run_id)s
"""
_SQL_VECTORS = "SELECT trajectory_id, vector FROM embeddings WHERE trajectory_id = ANY(%(ids)s) AND run_id = %(run_id)s"
_SQL_TRAJECTORY = """
    SELECT t.run_id, e.vector
    FROM trajectories t LEFT JOIN embeddings e ON e.trajectory_id = t.id
    WHERE t.id = %(id)s
"""

_EMPTY_IDS = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Neighbor:
    """One search result: a trajectory and its cosine similarity to the query."""

    trajectory_id: int
    cosine: float


@dataclass(frozen=True)
class DatabaseIdentity:
    """Which database an index was built from.

    Attributes:
        folder: directory name under ``$REFLEXDB_HOME/faiss``: the database name and a short
            hash of the cluster's system identifier (or of host/port when that is not readable).
        name: ``current_database()``.
        oid: the database's oid; it changes when a database is dropped and created again under
            the same name, which must not reuse the old index.
    """

    folder: str
    name: str
    oid: int


# ---------------------------------------------------------------------------- database plumbing


@contextmanager
def _snapshot(store) -> Iterator[psycopg.Cursor]:
    """A binary cursor inside one read-only REPEATABLE READ transaction.

    Every query through it sees the same committed state, so one catch-up moves the index from
    one consistent state of the table to another. ``float4[]``/``int8[]`` load as numpy arrays.
    """
    conn = store.engine.connect().execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
    with conn:
        cur = conn.connection.driver_connection.cursor(binary=True)
        try:
            yield cur
        finally:
            cur.close()


def database_identity(store) -> DatabaseIdentity:
    """Identify the database behind ``store`` (see :class:`DatabaseIdentity`)."""
    with store.engine.connect() as conn:
        raw = conn.connection.driver_connection
        try:
            system_id = str(raw.execute(_SQL_SYSTEM_ID).fetchone()[0])
        except psycopg.Error:
            # pg_control_system() can be revoked from ordinary roles: fall back to the address.
            raw.rollback()
            url = store.engine.url
            system_id = f"{url.host or 'localhost'}:{url.port or 5432}"
        name, oid = raw.execute(_SQL_DATABASE).fetchone()
        raw.rollback()
    digest = hashlib.sha256(f"{system_id}/{name}".encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40] or "db"
    return DatabaseIdentity(folder=f"{safe}-{digest}", name=name, oid=int(oid))


def default_directory(store) -> Path:
    """``$REFLEXDB_HOME/faiss/<database>``: where a database's run indexes live by default."""
    return settings.home() / "faiss" / database_identity(store).folder


def run_of_trajectory(store, trajectory_id: int) -> int:
    """The run a trajectory belongs to.

    Raises:
        NotFound: no trajectory has this id.
    """
    with _snapshot(store) as cur:
        row = cur.execute(_SQL_TRAJECTORY, {"id": int(trajectory_id)}).fetchone()
    if row is None:
        raise NotFound(f"no trajectory with id {trajectory_id}")
    return row[0]


def _run_embedding_ids(cur: psycopg.Cursor, run_id: int) -> np.ndarray:
    """Sorted ids of the run's trajectories that have an embedding, as seen by ``cur``'s snapshot."""
    ids = cur.execute(_SQL_RUN_IDS, {"run_id": run_id}).fetchone()[0]
    return np.unique(np.asarray(ids, dtype=np.int64))


def _as_ids(ids: Iterable[int] | np.ndarray | None) -> np.ndarray:
    """Sorted unique int64 ids from any iterable of integers."""
    if ids is None:
        return _EMPTY_IDS
    if not isinstance(ids, np.ndarray):
        ids = np.fromiter((int(i) for i in ids), dtype=np.int64)
    return np.unique(ids.astype(np.int64, copy=False))


def _as_vector(value: Any) -> np.ndarray:
    """A vector `[D]` float32 from ``embeddings.vector`` as fetched: a numpy array (``float4[]``
    through reflexdb's codecs) or the raw little-endian float32 bytes (``bytea``)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(value, dtype="<f4").astype(np.float32, copy=False)
    return np.asarray(value, dtype=np.float32)


def _normalised(vectors: Any) -> np.ndarray:
    """A C-contiguous float32 copy of ``vectors`` `[N, D]` with unit rows (zero rows stay zero)."""
    x = np.array(vectors, dtype=np.float32, order="C", copy=True)
    faiss.normalize_L2(x)
    return x


def _write_atomically(path: Path, write: Callable[[str], None]) -> None:
    """Write ``path`` through a temporary file in the same directory and ``os.replace`` it.

    Readers see the old file or the new one, never a partial write; concurrent writers each
    replace the file whole (the last one wins, and both wrote a consistent state).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------- building indexes


def exact_index(dim: int) -> faiss.IndexIDMap2:
    """An empty exact index over `dim`-d unit vectors keyed by trajectory id (inner product)."""
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def ivf_lists(n: int, nlist: int | None) -> int:
    """IVF lists for an index trained on ``n`` vectors: ``nlist``, or 4·√n when it is None;
    at most ``n // MIN_POINTS_PER_LIST`` and at least 1."""
    wanted = nlist if nlist is not None else round(4 * math.sqrt(n))
    return max(1, min(wanted, n // MIN_POINTS_PER_LIST))


def train_ivf(vectors: np.ndarray, nlist: int, train_per_list: int) -> faiss.IndexIVFFlat:
    """An empty IVF-Flat index (inner product) with k-means centroids trained on ``vectors``.

    Args:
        vectors: `[N, D]` float32 unit rows, N >= nlist.
        nlist: lists (centroids).
        train_per_list: k-means runs on at most ``train_per_list * nlist`` rows, sampled with a
            fixed seed (FAISS's k-means costs O(sample * nlist * D) per iteration, 10 iterations).

    Returns:
        The trained index, holding no vectors, with a hashtable direct map: ``reconstruct`` and
        ``remove_ids`` by trajectory id work.
    """
    n, dim = vectors.shape
    size = min(n, train_per_list * nlist)
    sample = vectors
    if size < n:
        rows = np.sort(np.random.default_rng(TRAIN_SEED).choice(n, size, replace=False))
        sample = vectors[rows]
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = TRAIN_SEED
    index.train(np.ascontiguousarray(sample))
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    return index


def build_ivf(ids: np.ndarray, vectors: np.ndarray, config: FaissConfig) -> faiss.IndexIVFFlat:
    """A trained IVF-Flat index holding ``vectors`` `[N, D]` (unit rows) under ``ids`` `[N]`."""
    index = train_ivf(vectors, ivf_lists(len(ids), config.nlist), config.train_per_list)
    index.add_with_ids(vectors, ids)
    return index


def gpu_copy(index: faiss.Index) -> faiss.Index | None:
    """A copy of an IVF index on GPU 0 for unrestricted search, or None: no GPU, a CPU-only
    faiss (``faiss.get_num_gpus()`` is 0), or an exact index (which stays on the CPU).

    The CPU index stays the one that is caught up, persisted and used for restricted search (GPU
    indexes take no id selector and cannot remove ids). Untested here: this project's machine
    has no GPU and ``faiss-cpu``; install the ``gpu`` extra for ``faiss-gpu-cu12``.
    """
    if not isinstance(index, faiss.IndexIVFFlat) or faiss.get_num_gpus() == 0:
        return None
    resources = faiss.StandardGpuResources()
    copy = faiss.index_cpu_to_gpu(resources, 0, index)
    copy.referenced_objects = [resources]  # the resources must outlive the copy
    return copy


def _index_ids(index: faiss.Index) -> np.ndarray:
    """The trajectory ids an exact or IVF index holds, unsorted `[N]` int64."""
    if isinstance(index, faiss.IndexIDMap2):
        return faiss.vector_to_array(index.id_map).astype(np.int64)
    lists = index.invlists
    parts = [_EMPTY_IDS]
    for i in range(index.nlist):
        size = lists.list_size(i)
        if size:
            parts.append(faiss.rev_swig_ptr(lists.get_ids(i), size).astype(np.int64))
    return np.concatenate(parts)


# ---------------------------------------------------------------------------- the index


class EmbeddingIndex:
    """Cosine-similarity index over one run's trajectory embeddings: exact, then IVF past
    ``config.ann_threshold`` vectors (see the module docstring).

    Use :meth:`open`. The constructor only wraps a built FAISS index (:func:`exact_index`,
    :func:`build_ivf`) for searching without a database, as benchmarks/ann_bench.py does. Not
    thread-safe; processes may share the files.

    Attributes:
        run_id: the run indexed.
        directory: where ``run-<id>.faiss`` and ``run-<id>.json`` are kept.
        config: the ``faiss`` settings (threshold, nlist, nprobe, retraining).
        brute_force_max: restricted searches over fewer ids brute-force the subset.
    """

    def __init__(self, store, run_id: int, directory: Path, stamp: dict[str, Any], index=None,
                 config: FaissConfig | None = None, trained_size: int | None = None):
        self.store = store
        self.run_id = run_id
        self.directory = directory
        self.config = config or FaissConfig()
        self.brute_force_max = BRUTE_FORCE_MAX
        # What the sidecar must match for the files to be this run's (see _load).
        self._stamp = stamp
        self._index = index
        # Vectors the IVF index was trained on; None while the index is exact.
        self._trained_size = trained_size
        self._sorted_ids: np.ndarray | None = None
        self._gpu = None  # gpu_copy of an IVF index (False: none), made on first unrestricted search

    @classmethod
    def open(cls, store, run_id: int, directory: Path | None = None,
             config: FaissConfig | None = None) -> EmbeddingIndex:
        """The run's persisted index, or an empty one if none was saved (call :meth:`catch_up`).

        Args:
            store: a :class:`~reflexdb.store.Store`.
            run_id: the run whose embeddings to index.
            directory: where the files live; default :func:`default_directory`.
            config: the ``faiss`` settings; default: the ``faiss`` section of the config the run
                was created with (``runs.config``), or the defaults when it has none.

        Raises:
            NotFound: the run does not exist.
            ConfigError: the run's stored ``faiss`` section is invalid.
        """
        run_id = int(run_id)
        identity = database_identity(store)
        with _snapshot(store) as cur:
            row = cur.execute(_SQL_RUN, {"run_id": run_id}).fetchone()
        if row is None:
            raise NotFound(f"no run with id {run_id}")
        created_at, stored = row
        if config is None:
            config = parse_section(FaissConfig, stored, "faiss", f"faiss section of run {run_id}'s config")
        stamp = {"run_id": run_id, "run_created_at": created_at.isoformat(), "database": identity.name,
                 "database_oid": identity.oid}
        directory = Path(directory) if directory is not None else settings.home() / "faiss" / identity.folder
        index = cls(store, run_id, directory, stamp, config=config)
        index._index, index._trained_size = index._load()
        return index

    # ------------------------------------------------------------------ properties

    @property
    def approximate(self) -> bool:
        """Whether unrestricted search is approximate (the index is a trained IVF)."""
        return self._trained_size is not None

    @property
    def dim(self) -> int | None:
        """Dimension of the run's embeddings; ``None`` until the first one is indexed."""
        return None if self._index is None else self._index.d

    @property
    def path(self) -> Path:
        return self.directory / f"run-{self.run_id}.faiss"

    @property
    def sidecar_path(self) -> Path:
        return self.directory / f"run-{self.run_id}.json"

    def __len__(self) -> int:
        return 0 if self._index is None else self._index.ntotal

    def __repr__(self) -> str:
        kind = f"ivf{self._index.nlist}" if self.approximate else "exact"
        return (f"EmbeddingIndex(run_id={self.run_id}, {kind}, dim={self.dim}, size={len(self)}, "
                f"path={str(self.path)!r})")

    def ids(self) -> np.ndarray:
        """Sorted trajectory ids in the index `[N]` int64 (a cached array: do not modify)."""
        if self._sorted_ids is None:
            if self._index is None:
                self._sorted_ids = _EMPTY_IDS
            else:
                self._sorted_ids = np.sort(_index_ids(self._index))
        return self._sorted_ids

    def _members(self, candidates: np.ndarray) -> np.ndarray:
        """The distinct ``candidates`` that are in the index, sorted: O(m log N) binary searches in
        the cached sorted ids (``np.intersect1d`` would re-sort all N ids on every search)."""
        ids = self.ids()
        c = np.unique(candidates)
        if c.size == 0 or ids.size == 0:
            return _EMPTY_IDS
        pos = np.minimum(np.searchsorted(ids, c), ids.size - 1)
        return c[ids[pos] == c]

    def __contains__(self, trajectory_id: int) -> bool:
        ids = self.ids()
        i = int(np.searchsorted(ids, trajectory_id))
        return i < ids.size and int(ids[i]) == int(trajectory_id)

    # ------------------------------------------------------------------ keeping up with the table

    def catch_up(self) -> int:
        """Make the index equal to the run's rows in ``embeddings`` now; persist; return how many were added.

        Compares the full set of ids, not a high-water mark: ids come from a sequence but
        transactions commit in any order, so a smaller id can appear after a larger one was
        indexed. Rows deleted from the table are removed from the index. Vectors are assumed
        immutable (the store only inserts them); after changing one in place, call :meth:`rebuild`.
        New vectors join a trained IVF index's lists; the index is (re)trained only as
        :meth:`_reshape` says.

        Raises:
            ReflexdbError: the run's embeddings have different dimensions.
        """
        with _snapshot(self.store) as cur:
            present = _run_embedding_ids(cur, self.run_id)
            ours = self.ids()
            missing = np.setdiff1d(present, ours, assume_unique=True)
            stale = np.setdiff1d(ours, present, assume_unique=True)
            if stale.size:
                self._remove(stale)
            added = self._add_from_table(cur, missing)
        reshaped = self._reshape()
        if added or stale.size or reshaped or (self._index is not None and not self.path.exists()):
            self._save()
        if added or stale.size:
            log.info("run %d index: +%d -%d, %d vectors", self.run_id, added, stale.size, len(self))
        return added

    def rebuild(self) -> None:
        """Rebuild the index from the table, from scratch (retraining an IVF one), and persist it."""
        self._index, self._trained_size = None, None
        self._changed()
        with _snapshot(self.store) as cur:
            self._add_from_table(cur, _run_embedding_ids(cur, self.run_id))
        self._reshape()
        self._save()

    def _add_from_table(self, cur: psycopg.Cursor, ids: np.ndarray) -> int:
        """Fetch the vectors of ``ids`` in chunks and add them; return how many were added."""
        added = 0
        for start in range(0, ids.size, FETCH_CHUNK):
            chunk = {"ids": ids[start : start + FETCH_CHUNK], "run_id": self.run_id}
            rows = cur.execute(_SQL_VECTORS, chunk).fetchall()
            if not rows:
                continue
            rows.sort(key=lambda r: r[0])  # add in id order: rebuilds lay out the same way
            self._add(np.array([r[0] for r in rows], dtype=np.int64), self._stack(rows))
            added += len(rows)
        return added

    def _stack(self, rows: list[tuple[int, Any]]) -> np.ndarray:
        """Stack fetched vectors into `[N, D]`, checking one dimension across the run."""
        vectors = [_as_vector(r[1]) for r in rows]
        expected = self.dim if len(self) else vectors[0].shape[0]
        for (tid, _), vector in zip(rows, vectors):
            if vector.shape[0] != expected:
                raise ReflexdbError(
                    f"run {self.run_id} mixes embedding dimensions: trajectory {tid} has {vector.shape[0]}, "
                    f"others have {expected}; delete the odd vectors, then rebuild the index"
                )
        return np.stack(vectors)

    def _add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if self._index is None or (self._index.ntotal == 0 and self._index.d != vectors.shape[1]):
            self._index, self._trained_size = exact_index(vectors.shape[1]), None
        self._index.add_with_ids(_normalised(vectors), ids)
        self._changed()

    def _remove(self, ids: np.ndarray) -> None:
        # IVF's hashtable direct map takes only an IDSelectorArray, and looks each id up. The flat
        # index tests every stored id against the selector: IDSelectorBatch's hash set, not a scan.
        selector = faiss.IDSelectorArray(ids) if self.approximate else faiss.IDSelectorBatch(ids)
        self._index.remove_ids(selector)
        self._changed()

    def _changed(self) -> None:
        """Forget what was derived from the index: the sorted ids and the GPU copy."""
        self._sorted_ids = None
        self._gpu = None

    def _reshape(self) -> bool:
        """Train an IVF index in place of the exact one once it holds ``ann_threshold`` vectors,
        and retrain it once it holds ``retrain_growth`` times the vectors it was trained on;
        return whether it did. Otherwise (deletions included) the index keeps its kind.

        The vectors move over as stored (already unit length, not normalised again), so the IVF
        index holds bit-identical vectors and restricted search returns what the flat one did.
        """
        n = len(self)
        if self.approximate:
            due = n >= self.config.retrain_growth * self._trained_size
        else:
            due = n >= self.config.ann_threshold
        if not due:
            return False
        ids = self.ids()
        vectors = self._index.reconstruct_batch(ids)  # [N, D], unit rows
        self._index = None  # hold two copies of the vectors, not three
        started = time.perf_counter()
        self._index = build_ivf(ids, vectors, self.config)
        self._trained_size = n
        self._changed()
        log.info("run %d index: trained IVF with %d lists on %d vectors in %.1f s", self.run_id,
                 self._index.nlist, n, time.perf_counter() - started)
        return True

    # ------------------------------------------------------------------ files

    def _load(self) -> tuple[faiss.Index | None, int | None]:
        """The persisted index and the size it was trained at (None: exact) if its files exist and
        belong to this run of this database, else ``(None, None)``. A trained IVF index is loaded
        as it is: never retrained on open."""
        nothing = (None, None)
        if not self.path.exists():
            return nothing
        try:
            meta = json.loads(self.sidecar_path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: unreadable sidecar (%s); catch_up() will rebuild it", self.path, exc)
            return nothing
        if meta.get("format") != FORMAT_VERSION or meta.get("stamp") != self._stamp:
            log.warning("ignoring %s: built from another database, run or format; catch_up() will rebuild it",
                        self.path)
            return nothing
        try:
            index = faiss.read_index(str(self.path))
        except RuntimeError as exc:
            log.warning("ignoring %s: unreadable (%s); catch_up() will rebuild it", self.path, exc)
            return nothing
        trained = meta.get("trained_size")
        if meta.get("kind") == "exact" and isinstance(index, faiss.IndexIDMap2):
            return index, None
        if (meta.get("kind") == "ivf" and isinstance(index, faiss.IndexIVFFlat) and isinstance(trained, int)
                and index.metric_type == faiss.METRIC_INNER_PRODUCT
                and index.direct_map.type == faiss.DirectMap.Hashtable):
            return index, trained
        log.warning("ignoring %s: not the index its sidecar describes; catch_up() will rebuild it", self.path)
        return nothing

    def _save(self) -> None:
        """:meth:`_persist`, where failing (disk full, read-only directory) is only a warning: the
        files are a cache of the ``embeddings`` table, the index in memory is current, and the next
        open catches up whatever the files miss."""
        try:
            self._persist()
        except OSError as exc:
            log.warning("could not save the FAISS index of run %d to %s (%s); searching goes on from memory "
                        "and the next catch-up rebuilds what the files miss", self.run_id, self.directory, exc)

    def _persist(self) -> None:
        """Write the index, then the sidecar, each atomically (no index: remove stale files)."""
        if self._index is None:
            self.path.unlink(missing_ok=True)
            self.sidecar_path.unlink(missing_ok=True)
            return
        settings.make_dirs(self.directory)
        _write_atomically(self.path, lambda tmp: faiss.write_index(self._index, tmp))
        meta = {
            "format": FORMAT_VERSION,
            "stamp": self._stamp,
            "metric": "cosine",
            "kind": "ivf" if self.approximate else "exact",
            "index": (f"IVF{self._index.nlist},Flat (inner product of L2-normalised vectors; hashtable direct map)"
                      if self.approximate else "IDMap2,Flat (inner product of L2-normalised vectors)"),
            "trained_size": self._trained_size,  # vectors the IVF index was trained on (null: exact)
            "dim": self.dim,
            # informational: the ids inside the .faiss file are authoritative
            "count": len(self),
            "faiss_version": faiss.__version__,
            "written_at": datetime.now(timezone.utc).isoformat(),
        }

        def write_meta(tmp: str) -> None:
            Path(tmp).write_text(json.dumps(meta, indent=2) + "\n")

        _write_atomically(self.sidecar_path, write_meta)

    # ------------------------------------------------------------------ search

    def search(
        self, query: Any, k: int, *, restrict_to: Iterable[int] | None = None, exclude: Iterable[int] = ()
    ) -> list[list[Neighbor]]:
        """The ``k`` nearest indexed trajectories to each query, by cosine similarity.

        Restricted search is exact. Unrestricted search is exact too until the index is trained
        (:attr:`approximate`); then it scans ``config.nprobe`` IVF lists and may miss neighbours.

        Args:
            query: `[D]` or `[Q, D]` float vectors (normalised here; need not be unit length).
            k: neighbours per query; fewer come back when fewer candidates exist.
            restrict_to: only consider these trajectory ids (ids not in the index are ignored).
            exclude: never return these ids.

        Returns:
            One list per query row, best first; equal cosines in increasing trajectory id.

        Raises:
            ReflexdbError: ``k < 1``, or the query's shape or dimension does not fit the index.
        """
        if k < 1:
            raise ReflexdbError(f"k must be at least 1, got {k}")
        q = self._queries(query)
        if len(self) == 0:
            return [[] for _ in range(q.shape[0])]
        excluded = self._members(_as_ids(exclude))
        if restrict_to is None:
            return self._top_k(partial(self._search_all, q), q.shape[0], k, len(self), excluded)
        subset = np.setdiff1d(self._members(_as_ids(restrict_to)), excluded, assume_unique=True)
        if subset.size == 0:
            return [[] for _ in range(q.shape[0])]
        method = self._search_subset if subset.size < self.brute_force_max else self._search_selected
        return self._top_k(partial(method, q, subset=subset), q.shape[0], k, subset.size, _EMPTY_IDS)

    def search_trajectory(
        self, trajectory_id: int, k: int, *, restrict_to: Iterable[int] | None = None
    ) -> list[Neighbor]:
        """The ``k`` trajectories nearest to a stored trajectory's embedding, itself excluded.

        The vector comes from the index, or from the table when the index has not caught up yet.

        Raises:
            NotFound: no such trajectory, it belongs to another run, or it has no embedding.
        """
        return self.search(self._vector_of(int(trajectory_id)), k, restrict_to=restrict_to,
                           exclude=(trajectory_id,))[0]

    def _vector_of(self, trajectory_id: int) -> np.ndarray:
        if trajectory_id in self:
            return self._index.reconstruct(trajectory_id)
        with _snapshot(self.store) as cur:
            row = cur.execute(_SQL_TRAJECTORY, {"id": trajectory_id}).fetchone()
        if row is None:
            raise NotFound(f"no trajectory with id {trajectory_id}")
        run_id, vector = row
        if run_id != self.run_id:
            raise NotFound(f"trajectory {trajectory_id} belongs to run {run_id}, not run {self.run_id}")
        if vector is None:
            raise NotFound(f"trajectory {trajectory_id} has no embedding")
        return _as_vector(vector)

    def _queries(self, query: Any) -> np.ndarray:
        """Check and normalise queries into `[Q, D]` float32."""
        q = np.asarray(query, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if q.ndim != 2:
            raise ReflexdbError(f"a query must be a [D] vector or a [Q, D] matrix, got shape {q.shape}")
        if self.dim is not None and q.shape[1] != self.dim:
            raise ReflexdbError(
                f"query has dimension {q.shape[1]}, but run {self.run_id}'s embeddings have dimension {self.dim}"
            )
        if not np.isfinite(q).all():
            raise ReflexdbError("query contains NaN or infinite values")
        return _normalised(q)

    def _search_all(self, q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Unrestricted search: exact on a flat index; ``nprobe`` lists of an IVF one (on its GPU
        copy when there is one)."""
        if not self.approximate:
            return self._index.search(q, n)
        if self._gpu is None:
            copy = gpu_copy(self._index)
            self._gpu = False if copy is None else copy  # False: checked, no GPU
        on_gpu = self._gpu is not False and max(n, self.config.nprobe) <= GPU_MAX_K
        index = self._gpu if on_gpu else self._index
        return index.search(q, n, params=faiss.SearchParametersIVF(nprobe=self.config.nprobe))

    def _search_selected(self, q: np.ndarray, n: int, subset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Search the whole index, letting through only ``subset`` (sorted ids). Exact on an IVF
        index too: it probes every list, and FAISS scans lists with the same kernel as a flat
        index with a selector, so the cosines are bit-identical."""
        selector = faiss.IDSelectorBatch(subset)  # IndexIDMap2 translates it to internal positions
        if self.approximate:
            params = faiss.SearchParametersIVF(sel=selector, nprobe=self._index.nlist)
        else:
            params = faiss.SearchParameters(sel=selector)
        return self._index.search(q, n, params=params)

    def _search_subset(self, q: np.ndarray, n: int, subset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reconstruct ``subset``'s vectors and brute-force them: much faster for small subsets."""
        vectors = self._index.reconstruct_batch(subset)  # [S, D], stored normalised
        distances = np.empty((q.shape[0], n), dtype=np.float32)
        positions = np.empty((q.shape[0], n), dtype=np.int64)
        # FAISS switches to BLAS once queries x D reaches this threshold; BLAS rounds differently
        # from the kernel that selector searches always use. Staying below it keeps both paths'
        # cosines bit-identical.
        step = max(1, (faiss.cvar.distance_compute_blas_threshold - 1) // q.shape[1])
        for s in range(0, q.shape[0], step):
            distances[s : s + step], positions[s : s + step] = faiss.knn(
                q[s : s + step], vectors, n, metric=faiss.METRIC_INNER_PRODUCT
            )
        return distances, np.where(positions >= 0, subset[positions], -1)

    @staticmethod
    def _top_k(
        raw: Callable[[int], tuple[np.ndarray, np.ndarray]], nq: int, k: int, available: int, excluded: np.ndarray
    ) -> list[list[Neighbor]]:
        """Run ``raw(n)`` (a FAISS-style search for ``n`` results) and cut canonical top-k lists.

        Asks for one more than needed so that a tie straddling the k-th place is seen; then more,
        until the k-th and (k+1)-th cosines differ. Sorting by (cosine desc, id asc) then makes
        equal-cosine neighbours come out the same whatever order the index holds them in. Stops
        early when ``raw`` returned fewer than asked for every row (an IVF probe that reaches
        fewer vectors): asking for more would find no more.

        Args:
            available: how many ids ``raw`` can return at most (excluded ones included).
        """
        n = min(k + excluded.size + 1, available)
        while True:
            distances, labels = raw(n)
            rows = []
            for d_row, l_row in zip(distances, labels):
                keep = (l_row >= 0) & ~np.isin(l_row, excluded)
                rows.append((d_row[keep], l_row[keep]))
            settled = all(d.size > k and d[k - 1] != d[k] for d, _ in rows)
            exhausted = bool((labels < 0).any(axis=1).all())
            if settled or exhausted or n >= available:
                break
            n = min(2 * n, available)
        out = []
        for d_row, l_row in rows:
            order = np.lexsort((l_row, -d_row))[:k]
            out.append([Neighbor(int(l_row[i]), float(d_row[i])) for i in order])
        return out


# ---------------------------------------------------------------------------- `reflexdb similar`


@dataclass(frozen=True)
class SimilarTrajectory:
    """A neighbour as ``reflexdb similar`` shows it."""

    trajectory_id: int
    cosine: float
    reward: float | None
    correct: bool | None
    task_id: int
    response: str  # the assistant turns, joined by newlines


#: Column names of :class:`SimilarTrajectory`, in order (the CLI's table header).
SIMILAR_COLUMNS = ("trajectory_id", "cosine", "reward", "correct", "task_id", "response")


@dataclass(frozen=True)
class SimilarResult:
    trajectory_id: int
    run_id: int
    indexed: int  # vectors in the run's index after catching up
    neighbors: list[SimilarTrajectory]


def similar_trajectories(store, trajectory_id: int, k: int, *, directory: Path | None = None) -> SimilarResult:
    """Catch up the trajectory's run index and describe its ``k`` nearest trajectories.

    Raises:
        NotFound: no such trajectory, or it has no embedding.
    """
    run_id = run_of_trajectory(store, trajectory_id)
    index = EmbeddingIndex.open(store, run_id, directory)
    index.catch_up()
    hits = index.search_trajectory(trajectory_id, k)
    trajs = store.read_trajectories([h.trajectory_id for h in hits], payloads=False, turns=True)
    neighbors = [
        SimilarTrajectory(
            h.trajectory_id, h.cosine, t.reward, t.correct, t.task_id,
            "\n".join(u.text for u in t.turns if u.role == "assistant"),
        )
        for h, t in zip(hits, trajs)
    ]
    return SimilarResult(int(trajectory_id), run_id, len(index), neighbors)


__all__ = [
    "BRUTE_FORCE_MAX", "DatabaseIdentity", "EmbeddingIndex", "Neighbor", "SIMILAR_COLUMNS", "SimilarResult",
    "SimilarTrajectory", "build_ivf", "database_identity", "default_directory", "exact_index", "gpu_copy",
    "ivf_lists", "run_of_trajectory", "similar_trajectories", "train_ivf",
]
