"""The FAISS embedding index (reflexdb/index.py) and ``reflexdb similar``, on real PostgreSQL.

The reference everywhere is cosine similarity computed in float64 numpy from the vectors as
read back from the ``embeddings`` table.
"""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from reflexdb import NotFound, ReflexdbError
from reflexdb import index as index_mod
from reflexdb.config import ConfigError, FaissConfig, parse_config
from reflexdb.db import connect_raw
from reflexdb.index import EmbeddingIndex, Neighbor, build_ivf, database_identity
from tests.factories import make_group, setup_run

DIM = 16


# ---------------------------------------------------------------------------- helpers


def write_groups(store, run: int, tasks: list[int], rng: np.random.Generator, n: int, *, dim: int = DIM,
                 size: int = 4, texts: bool = False) -> list[int]:
    """Write ``n`` groups with random embeddings of very different norms; return trajectory ids."""
    ids = []
    for g in range(n):
        group = make_group(rng, run, tasks[g % len(tasks)], size=size, dim=dim)
        for i, t in enumerate(group.trajectories):
            # Norms from 0.1 to 10: inner product without normalisation would rank differently.
            t.embedding = t.embedding * np.float32(rng.uniform(0.1, 10.0))
            if texts:
                t.turns[1].text = f"response g{g} t{i}"
        ids += store.write_group(group).trajectory_ids
    return ids


def table_vectors(store, ids) -> tuple[np.ndarray, np.ndarray]:
    """Ids (sorted) and their vectors `[N, D]` as stored in PostgreSQL."""
    ids = sorted(ids)
    trajs = store.read_trajectories(ids, payloads=False, turns=False, embeddings=True)
    return np.array(ids, dtype=np.int64), np.stack([t.embedding for t in trajs])


def numpy_top_k(ids: np.ndarray, vectors: np.ndarray, query: np.ndarray, k: int,
                exclude=()) -> tuple[list[int], np.ndarray]:
    """Exact top-k by cosine in float64: (ids, cosines), ties by smaller id."""
    x = vectors.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = query.astype(np.float64) / np.linalg.norm(query)
    cos = x @ q
    keep = ~np.isin(ids, list(exclude))
    ids, cos = ids[keep], cos[keep]
    order = np.lexsort((ids, -cos))[:k]
    return ids[order].tolist(), cos[order]


def assert_matches_numpy(hits: list[Neighbor], expected: tuple[list[int], np.ndarray]) -> None:
    assert [h.trajectory_id for h in hits] == expected[0]
    np.testing.assert_allclose([h.cosine for h in hits], expected[1], atol=1e-5)


def all_neighbours(index: EmbeddingIndex, k: int) -> dict[int, list[Neighbor]]:
    return {int(t): index.search_trajectory(int(t), k) for t in index.ids()}


def insert_group_raw(conn, run: int, task: int, vectors: list[np.ndarray]) -> list[int]:
    """Insert a group with embeddings through ``conn`` without committing; return trajectory ids."""
    gid = conn.execute(
        "INSERT INTO groups (run_id, task_id, policy_version, size) VALUES (%s, %s, 0, %s) RETURNING id",
        (run, task, len(vectors)),
    ).fetchone()[0]
    ids = []
    for i, v in enumerate(vectors):
        tid = conn.execute(
            "INSERT INTO trajectories (group_id, run_id, task_id, index_in_group, policy_version, response_length)"
            " VALUES (%s, %s, %s, %s, 0, 1) RETURNING id",
            (gid, run, task, i),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO embeddings (trajectory_id, model, layer, dim, vector, run_id) VALUES (%s, 'test', -1, %s, %b, %s)",
            (tid, v.shape[0], np.asarray(v, dtype=np.float32), run),
        )
        ids.append(tid)
    return ids


def sql(db_url: str, query: str, params=()) -> None:
    with connect_raw(db_url) as conn:
        conn.execute(query, params)


# ---------------------------------------------------------------------------- correctness


def test_search_equals_numpy_cosine(store, reflexdb_home):
    rng = np.random.default_rng(1)
    run, tasks = setup_run(store)
    ids = write_groups(store, run, tasks, rng, 15)
    index = EmbeddingIndex.open(store, run)
    assert index.dim is None and len(index) == 0

    assert index.catch_up() == len(ids)
    assert index.dim == DIM and len(index) == len(ids)
    tids, vectors = table_vectors(store, ids)

    queries = rng.standard_normal((5, DIM)).astype(np.float32) * 3
    batched = index.search(queries, 7)
    for q, hits in zip(queries, batched):
        assert_matches_numpy(hits, numpy_top_k(tids, vectors, q, 7))
        assert index.search(q, 7) == [hits]  # a [D] query is a batch of one

    # search_trajectory: the stored vector as query, the trajectory itself left out
    for t in tids[:10]:
        hits = index.search_trajectory(int(t), 5)
        assert int(t) not in [h.trajectory_id for h in hits]
        assert_matches_numpy(hits, numpy_top_k(tids, vectors, vectors[tids == t][0], 5, exclude=[t]))

    # exclude; k larger than the index
    first = batched[0][0].trajectory_id
    hits = index.search(queries[0], 3, exclude=[first])[0]
    assert_matches_numpy(hits, numpy_top_k(tids, vectors, queries[0], 3, exclude=[first]))
    assert len(index.search(queries[0], 1000)[0]) == len(ids)


def test_rebuild_equals_incremental_catch_ups(store, db_url, reflexdb_home, tmp_path):
    rng = np.random.default_rng(2)
    run, tasks = setup_run(store)
    index = EmbeddingIndex.open(store, run)
    expected: set[int] = set()
    for step in range(3):  # several catch-ups, with a deletion between two of them
        ids = write_groups(store, run, tasks, rng, 6)
        expected |= set(ids)
        if step == 1:
            deleted = [min(expected), ids[2]]
            sql(db_url, "DELETE FROM trajectories WHERE id = ANY(%s)", (deleted,))
            expected -= set(deleted)
        assert index.catch_up() == len(ids) - (step == 1)
        assert set(index.ids().tolist()) == expected

    rebuilt = EmbeddingIndex.open(store, run, tmp_path / "elsewhere")
    assert len(rebuilt) == 0
    rebuilt.rebuild()
    assert rebuilt.ids().tolist() == index.ids().tolist()
    assert all_neighbours(rebuilt, 6) == all_neighbours(index, 6)  # same ids, bit-identical cosines

    # rebuilding in place changes nothing either
    before = all_neighbours(index, 6)
    index.rebuild()
    assert all_neighbours(index, 6) == before


def test_catch_up_sees_smaller_ids_committed_late(store, db_url, reflexdb_home):
    """Ids come from a sequence, commits come in any order: a max-id watermark would miss these."""
    rng = np.random.default_rng(3)
    run, tasks = setup_run(store)
    write_groups(store, run, tasks, rng, 2)
    index = EmbeddingIndex.open(store, run)
    assert index.catch_up() == 8

    twin = rng.standard_normal(DIM).astype(np.float32)
    late = connect_raw(db_url)  # takes its ids first, commits last
    try:
        small = insert_group_raw(late, run, tasks[0], [twin, rng.standard_normal(DIM).astype(np.float32)])
        big_group = make_group(rng, run, tasks[1], size=3)
        # Same direction as small[0] (powers of two scale exactly): three equal cosines.
        big_group.trajectories[0].embedding = twin * 2
        big_group.trajectories[1].embedding = twin * 4
        big = store.write_group(big_group).trajectory_ids
        assert max(small) < min(big)

        assert index.catch_up() == 3  # the uncommitted group is invisible
        assert all(b in index for b in big) and not any(s in index for s in small)
        late.commit()
    finally:
        late.close()

    assert index.catch_up() == 2
    assert all(s in index for s in small)
    assert len(index) == 13
    # Ties are broken by the smaller id although the larger ones were indexed first, even when
    # more tied vectors than k + 1 compete for the last place...
    [[first]] = index.search(twin, 1)
    assert first.trajectory_id == small[0]
    [hits] = index.search(twin, 3)
    assert [h.trajectory_id for h in hits] == [small[0], big[0], big[1]]
    assert len({h.cosine for h in hits}) == 1
    # ...and a rebuild (which adds them in id order) agrees.
    before = all_neighbours(index, 4)
    index.rebuild()
    assert all_neighbours(index, 4) == before


def test_deletions_are_reflected(store, db_url, reflexdb_home):
    rng = np.random.default_rng(4)
    run, tasks = setup_run(store)
    ids = write_groups(store, run, tasks, rng, 5)
    index = EmbeddingIndex.open(store, run)
    index.catch_up()

    gone = ids[:4]  # the first group, through ON DELETE CASCADE
    sql(db_url, "DELETE FROM groups WHERE id = (SELECT group_id FROM trajectories WHERE id = %s)", (gone[0],))
    assert index.catch_up() == 0
    assert len(index) == len(ids) - 4
    returned = {h.trajectory_id for hits in index.search(np.eye(DIM, dtype=np.float32), 100) for h in hits}
    assert returned == set(ids[4:])
    assert len(EmbeddingIndex.open(store, run)) == len(ids) - 4  # persisted too

    # A vector deleted and inserted again (same id, new vector) comes back with the new vector.
    tid = ids[5]
    new = np.zeros(DIM, dtype=np.float32)
    new[3] = 1.0
    sql(db_url, "DELETE FROM embeddings WHERE trajectory_id = %s", (tid,))
    assert index.catch_up() == 0 and tid not in index
    sql(db_url, "INSERT INTO embeddings VALUES (%s, 'test', -1, %s, %b, %s)", (tid, DIM, new, run))
    assert index.catch_up() == 1
    [[best]] = index.search(new, 1)
    assert best.trajectory_id == tid and best.cosine == pytest.approx(1.0)


def test_restricted_search_paths_agree(store, reflexdb_home):
    rng = np.random.default_rng(5)
    run, tasks = setup_run(store)
    ids = write_groups(store, run, tasks, rng, 30)
    index = EmbeddingIndex.open(store, run)
    index.catch_up()
    tids, vectors = table_vectors(store, ids)

    # one task's failures (make_group: the second half of each group is incorrect)
    trajs = store.read_trajectories(ids, payloads=False, turns=False)
    failures = [t.id for t in trajs if t.task_id == tasks[0] and not t.correct]
    assert len(failures) == 20
    queries = rng.standard_normal((4, DIM)).astype(np.float32)
    restrict = failures + [10**9]  # ids not in the index are ignored

    index.brute_force_max = 10**6  # reconstruct the subset, brute-force it
    brute = index.search(queries, 5, restrict_to=restrict, exclude=[failures[0]])
    index.brute_force_max = 0  # IDSelectorBatch over the whole index
    selected = index.search(queries, 5, restrict_to=restrict, exclude=[failures[0]])
    assert brute == selected  # same ids, bit-identical cosines

    sub = np.isin(tids, failures[1:])
    for q, hits in zip(queries, brute):
        assert {h.trajectory_id for h in hits} <= set(failures[1:])
        assert_matches_numpy(hits, numpy_top_k(tids[sub], vectors[sub], q, 5))

    for limit in (10**6, 0):
        index.brute_force_max = limit
        hits = index.search_trajectory(failures[0], 3, restrict_to=failures)
        assert_matches_numpy(hits, numpy_top_k(tids[sub], vectors[sub], vectors[tids == failures[0]][0], 3))
        assert index.search(queries, 3, restrict_to=[10**9]) == [[]] * 4
        assert len(index.search(queries[0], 50, restrict_to=failures)[0]) == 20


def test_restricted_paths_bit_identical_for_large_batches(store, reflexdb_home):
    """Past FAISS's BLAS threshold (queries x D >= 128000) a plain brute force rounds differently."""
    rng = np.random.default_rng(6)
    run, tasks = setup_run(store)
    dim = 512
    ids = write_groups(store, run, tasks, rng, 25, dim=dim)
    index = EmbeddingIndex.open(store, run)
    index.catch_up()
    queries = rng.standard_normal((400, dim)).astype(np.float32)
    subset = ids[::2]
    index.brute_force_max = 10**6
    brute = index.search(queries, 8, restrict_to=subset)
    index.brute_force_max = 0
    assert index.search(queries, 8, restrict_to=subset) == brute


# ---------------------------------------------------------------------------- files


def test_persisted_beside_the_data_and_reopened(store, reflexdb_home):
    rng = np.random.default_rng(7)
    run, tasks = setup_run(store)
    ids = write_groups(store, run, tasks, rng, 5)
    index = EmbeddingIndex.open(store, run)
    index.catch_up()
    before = all_neighbours(index, 4)

    folder = reflexdb_home / "faiss" / database_identity(store).folder
    assert index.path == folder / f"run-{run}.faiss" and index.path.exists()
    meta = json.loads((folder / f"run-{run}.json").read_text())
    assert meta["dim"] == DIM and meta["count"] == len(ids) and meta["stamp"]["run_id"] == run
    assert sorted(p.name for p in folder.iterdir()) == [f"run-{run}.faiss", f"run-{run}.json"]  # no temp files

    reopened = EmbeddingIndex.open(store, run)
    assert len(reopened) == len(ids) and reopened.dim == DIM
    assert all_neighbours(reopened, 4) == before
    assert reopened.catch_up() == 0  # nothing re-added

    # Files from another incarnation of the run (or database) are ignored, then replaced.
    meta["stamp"]["run_created_at"] = "2001-01-01T00:00:00+00:00"
    index.sidecar_path.write_text(json.dumps(meta))
    stale = EmbeddingIndex.open(store, run)
    assert len(stale) == 0
    assert stale.catch_up() == len(ids)
    assert all_neighbours(stale, 4) == before
    assert len(EmbeddingIndex.open(store, run)) == len(ids)

    # A damaged file is ignored too.
    index.path.write_bytes(b"not an index")
    damaged = EmbeddingIndex.open(store, run)
    assert len(damaged) == 0 and damaged.catch_up() == len(ids)


def test_database_folder_identity(store, monkeypatch):
    identity = database_identity(store)
    assert identity == database_identity(store)
    assert identity.folder.startswith(identity.name + "-")
    # Without permission to read pg_control_system(), the host/port address is hashed instead.
    monkeypatch.setattr(index_mod, "_SQL_SYSTEM_ID", "SELECT system_identifier FROM no_such_function()")
    fallback = database_identity(store)
    assert fallback.name == identity.name and fallback.oid == identity.oid
    assert fallback.folder != identity.folder and fallback.folder == database_identity(store).folder


# ---------------------------------------------------------------------------- errors and empty runs


def test_empty_run_and_clear_errors(store, reflexdb_home):
    rng = np.random.default_rng(8)
    run, tasks = setup_run(store)
    [plain] = [store.write_group(make_group(rng, run, tasks[0], size=1, dim=None)).trajectory_ids]
    index = EmbeddingIndex.open(store, run)
    assert index.catch_up() == 0
    assert index.dim is None and len(index) == 0 and not index.path.exists()
    assert index.search(np.ones(DIM), 3) == [[]]
    with pytest.raises(NotFound, match="has no embedding"):
        index.search_trajectory(plain[0], 3)

    ids = write_groups(store, run, tasks, rng, 1)
    other_run, other_tasks = setup_run(store, "other")
    [other] = [write_groups(store, other_run, other_tasks, rng, 1)]
    assert index.catch_up() == 4
    with pytest.raises(ReflexdbError, match="dimension 15, but run .* dimension 16"):
        index.search(np.ones(15), 3)
    with pytest.raises(ReflexdbError, match="NaN"):
        index.search(np.full(DIM, np.nan), 3)
    with pytest.raises(NotFound, match="no trajectory with id 987654"):
        index.search_trajectory(987654, 3)
    with pytest.raises(NotFound, match=f"belongs to run {other_run}"):
        index.search_trajectory(other[0], 3)
    with pytest.raises(NotFound, match="no run with id 987654"):
        EmbeddingIndex.open(store, 987654)
    assert {h.trajectory_id for h in index.search_trajectory(ids[0], 10)} == set(ids[1:])


def test_search_trajectory_before_catch_up_reads_the_table(store, reflexdb_home):
    rng = np.random.default_rng(9)
    run, tasks = setup_run(store)
    old = write_groups(store, run, tasks, rng, 3)
    index = EmbeddingIndex.open(store, run)
    index.catch_up()
    [new] = [write_groups(store, run, tasks, rng, 1)]
    tids, vectors = table_vectors(store, old)
    _, [query] = table_vectors(store, [new[0]])
    assert_matches_numpy(index.search_trajectory(new[0], 4), numpy_top_k(tids, vectors, query, 4))


# ---------------------------------------------------------------------------- approximate search (IVF)

#: A small IVF setup: switch at 2,000 vectors, 16 lists, 4 of them probed, retrain at 2,500.
ANN = FaissConfig(ann_threshold=2000, nlist=16, nprobe=4, retrain_growth=1.25)
ANN_DIM = 32


def write_clustered(store, run: int, tasks: list[int], rng: np.random.Generator, n_groups: int,
                    centres: np.ndarray) -> list[int]:
    """Groups of 8 whose vectors cluster as trajectory embeddings do: each group around one of
    ``centres`` (a topic) plus a group offset, each sample a little noise on that; return ids."""
    groups = []
    for g in range(n_groups):
        group = make_group(rng, run, tasks[g % len(tasks)], size=8, dim=ANN_DIM, T=4, P=2)
        middle = centres[rng.integers(len(centres))] + 0.5 * rng.standard_normal(ANN_DIM)
        for t in group.trajectories:
            t.embedding = (middle + 0.3 * rng.standard_normal(ANN_DIM)).astype(np.float32)
        groups.append(group)
    return [tid for start in range(0, n_groups, 50)
            for written in store.write_groups(groups[start : start + 50]) for tid in written.trajectory_ids]


def sidecar(index: EmbeddingIndex) -> dict:
    return json.loads(index.sidecar_path.read_text())


def test_unrestricted_search_switches_to_ivf_restricted_stays_exact(store, reflexdb_home, tmp_path):
    rng = np.random.default_rng(20)
    run, tasks = setup_run(store)
    centres = rng.standard_normal((40, ANN_DIM))
    ids = write_clustered(store, run, tasks, rng, 240, centres)
    index = EmbeddingIndex.open(store, run, config=ANN)
    assert index.catch_up() == 1920
    assert not index.approximate and sidecar(index)["kind"] == "exact"  # below the threshold: exact

    ids += write_clustered(store, run, tasks, rng, 10, centres)
    assert index.catch_up() == 80  # 2,000 vectors: trained and switched
    meta = sidecar(index)
    assert index.approximate and meta["kind"] == "ivf" and meta["trained_size"] == 2000
    assert meta["index"].startswith("IVF16,")

    # unrestricted: recall@10 against exact cosine
    tids, vectors = table_vectors(store, ids)
    anchors = rng.choice(tids, 100, replace=False)
    found = [{h.trajectory_id for h in index.search_trajectory(int(t), 10)} for t in anchors]
    truth = [set(numpy_top_k(tids, vectors, vectors[tids == t][0], 10, exclude=[t])[0]) for t in anchors]
    assert np.mean([len(f & e) / 10 for f, e in zip(found, truth)]) >= 0.95
    queries = rng.standard_normal((5, ANN_DIM)).astype(np.float32)
    faiss.normalize_L2(queries)
    _, probed = index._index.search(queries, 10, params=faiss.SearchParametersIVF(nprobe=ANN.nprobe))
    assert [[h.trajectory_id for h in hits] for hits in index.search(queries, 10)] == probed.tolist()

    # restricted: identical to an exact index (same ids, bit-identical cosines) on both paths
    exact = EmbeddingIndex.open(store, run, tmp_path / "exact", config=FaissConfig())
    exact.catch_up()
    assert not exact.approximate
    trajs = store.read_trajectories(ids, payloads=False, turns=False)
    failures = [t.id for t in trajs if t.task_id == tasks[0] and not t.correct]
    queries = rng.standard_normal((30, ANN_DIM)).astype(np.float32)
    for limit in (10**6, 0):  # brute force over the subset; selector over every IVF list
        index.brute_force_max = exact.brute_force_max = limit
        for subset in (failures, tids[::2]):
            assert index.search(queries, 8, restrict_to=subset) == exact.search(queries, 8, restrict_to=subset)
            for t in anchors[:10]:
                hits = index.search_trajectory(int(t), 5, restrict_to=subset)
                assert hits == exact.search_trajectory(int(t), 5, restrict_to=subset)
        sub = np.isin(tids, failures)
        assert_matches_numpy(index.search(queries[0], 5, restrict_to=failures)[0],
                             numpy_top_k(tids[sub], vectors[sub], queries[0], 5))


def test_ivf_restricted_paths_bit_identical_for_large_batches(tmp_path):
    """Past FAISS's BLAS threshold: the IVF selector scan and the brute force still agree."""
    rng = np.random.default_rng(21)
    vectors = rng.standard_normal((3000, 512)).astype(np.float32)
    faiss.normalize_L2(vectors)
    ids = np.arange(1, 3001, dtype=np.int64)
    index = EmbeddingIndex(None, 0, tmp_path, {}, index=build_ivf(ids, vectors, ANN), config=ANN,
                           trained_size=3000)
    queries = rng.standard_normal((400, 512)).astype(np.float32)
    index.brute_force_max = 10**6
    brute = index.search(queries, 8, restrict_to=ids[::2])
    index.brute_force_max = 0
    assert index.search(queries, 8, restrict_to=ids[::2]) == brute


def test_gpu_copy_serves_unrestricted_search_until_the_index_changes(tmp_path, monkeypatch):
    """The plumbing around gpu_copy, with a CPU clone standing in for the GPU (none here)."""
    rng = np.random.default_rng(23)
    vectors = rng.standard_normal((2100, ANN_DIM)).astype(np.float32)
    faiss.normalize_L2(vectors)
    ids = np.arange(1, 2101, dtype=np.int64)
    copies = []

    def fake_gpu_copy(index):
        copies.append(faiss.clone_index(index))
        return copies[-1]

    monkeypatch.setattr(index_mod, "gpu_copy", fake_gpu_copy)
    index = EmbeddingIndex(None, 0, tmp_path, {}, index=build_ivf(ids[:2000], vectors[:2000], ANN), config=ANN,
                           trained_size=2000)
    first = index.search(vectors[:3], 5)
    assert index.search(vectors[:3], 5) == first and len(copies) == 1  # one copy, reused
    index.search(vectors[0], 5, restrict_to=ids[:100])
    assert len(copies) == 1  # restricted search stays on the CPU index
    index._add(ids[2000:], vectors[2000:])
    [[hit]] = index.search(vectors[2050], 1)
    assert hit.trajectory_id == 2051 and len(copies) == 2  # a change drops the copy; a new one is made


def test_ivf_is_persisted_caught_up_and_rebuilt(store, db_url, reflexdb_home, monkeypatch):
    rng = np.random.default_rng(22)
    run, tasks = setup_run(store)
    centres = rng.standard_normal((40, ANN_DIM))
    ids = write_clustered(store, run, tasks, rng, 250, centres)
    index = EmbeddingIndex.open(store, run, config=ANN)
    index.catch_up()
    assert index.approximate
    anchors = [int(t) for t in rng.choice(ids, 30, replace=False)]
    subset = ids[::3]

    def results(idx: EmbeddingIndex) -> tuple:
        return ([idx.search_trajectory(t, 10) for t in anchors],
                [idx.search_trajectory(t, 10, restrict_to=subset) for t in anchors])

    before = results(index)

    # Reopened: the trained IVF index is loaded, not retrained; catch-ups add to its lists.
    real_train = index_mod.train_ivf
    monkeypatch.setattr(index_mod, "train_ivf", lambda *a, **k: pytest.fail("retrained"))
    reopened = EmbeddingIndex.open(store, run, config=ANN)
    assert reopened.approximate and isinstance(reopened._index, faiss.IndexIVFFlat) and len(reopened) == 2000
    assert results(reopened) == before and reopened.catch_up() == 0
    new = write_clustered(store, run, tasks, rng, 10, centres)
    assert reopened.catch_up() == 80  # 2,080 < 1.25 x 2,000: no retraining
    assert sidecar(reopened)["trained_size"] == 2000 and all(t in reopened for t in new)
    _, new_vectors = table_vectors(store, new)
    for t, v in zip(new, new_vectors):  # a vector's own list is the first one probed
        assert reopened.search(v, 1)[0][0].trajectory_id == t

    # Deleted rows are removed.
    gone = ids[:8]
    sql(db_url, "DELETE FROM groups WHERE id = (SELECT group_id FROM trajectories WHERE id = %s)", (gone[0],))
    assert reopened.catch_up() == 0 and len(reopened) == 2072
    assert not any(t in reopened for t in gone)
    returned = {h.trajectory_id for hits in reopened.search(np.asarray(new_vectors), 50) for h in hits}
    assert not returned & set(gone)
    assert len(EmbeddingIndex.open(store, run, config=ANN)) == 2072  # persisted

    # Grown 1.25 times since training: retrained on everything.
    monkeypatch.setattr(index_mod, "train_ivf", real_train)
    write_clustered(store, run, tasks, rng, 60, centres)
    assert reopened.catch_up() == 480
    assert sidecar(reopened)["trained_size"] == 2552 and reopened.approximate
    after = results(reopened)

    # Files lost: rebuilt from PostgreSQL, trained on the same vectors, so the same results.
    reopened.path.unlink()
    reopened.sidecar_path.unlink()
    rebuilt = EmbeddingIndex.open(store, run, config=ANN)
    assert len(rebuilt) == 0
    assert rebuilt.catch_up() == 2552
    assert rebuilt.approximate and sidecar(rebuilt)["trained_size"] == 2552
    assert results(rebuilt) == after


@pytest.mark.parametrize("section,expected", [
    ({"nprobe": 0}, "faiss.nprobe: Input should be greater than or equal to 1"),
    ({"ann_threshold": "many"}, "faiss.ann_threshold: Input should be a valid integer"),
    ({"retrain_growth": 1.0}, "faiss.retrain_growth: Input should be greater than 1"),
    ({"train_per_list": 10}, "faiss.train_per_list: Input should be greater than or equal to 39"),
    ({"nlist": 16, "nprobe": 32}, "faiss.nprobe (32) is more than faiss.nlist (16)"),
    ({"ann_treshold": 5}, "faiss.ann_treshold: unknown key (did you mean faiss.ann_threshold?)"),
])
def test_faiss_config_errors_name_the_field(section, expected):
    with pytest.raises(ConfigError) as err:
        parse_config({"run": "r", "faiss": section})
    assert expected in str(err.value)


def test_index_reads_the_runs_faiss_section(store, reflexdb_home):
    run = store.create_run("configured", config={"run": "configured", "faiss": {"ann_threshold": 5000, "nprobe": 8}})
    index = EmbeddingIndex.open(store, run)
    assert (index.config.ann_threshold, index.config.nprobe) == (5000, 8)
    assert EmbeddingIndex.open(store, setup_run(store)[0]).config == FaissConfig()  # no section: defaults
    assert EmbeddingIndex.open(store, run, config=ANN).config == ANN  # given: used as it is
    bad = store.create_run("bad", config={"faiss": {"nprobe": 0}})
    with pytest.raises(ConfigError, match="faiss.nprobe: Input should be greater than or equal to 1"):
        EmbeddingIndex.open(store, bad)


def test_vectors_decode_from_arrays_and_bytes():
    v = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    raw = v.astype("<f4").tobytes()
    for value in (v, raw, memoryview(raw), bytearray(raw)):
        out = index_mod._as_vector(value)
        assert out.dtype == np.float32 and np.array_equal(out, v)


# ---------------------------------------------------------------------------- the CLI


def test_cli_similar_prints_the_nearest(store, db_url, reflexdb_home):
    from reflexdb.cli.main import app

    rng = np.random.default_rng(10)
    run, tasks = setup_run(store)
    ids = write_groups(store, run, tasks, rng, 6, texts=True)
    tids, vectors = table_vectors(store, ids)
    expected, _ = numpy_top_k(tids, vectors, vectors[0], 3, exclude=[ids[0]])

    result = CliRunner().invoke(app, ["similar", str(ids[0]), "-k", "3"],
                                env={"REFLEXDB_DATABASE_URL": db_url, "REFLEXDB_HOME": str(reflexdb_home)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"nearest to trajectory {ids[0]} among {len(ids)} embeddings of run {run}" in lines[0]
    assert [c.strip() for c in lines[1].split("|")] == ["trajectory_id", "cosine", "reward", "correct", "task_id",
                                                        "response"]
    body = lines[3:-1]
    assert [int(r.split("|")[0]) for r in body] == expected
    trajs = {t.id: t for t in store.read_trajectories(expected, payloads=False)}
    for row, tid in zip(body, expected):
        cells = [c.strip() for c in row.split("|")]
        assert cells[3] == str(trajs[tid].correct) and cells[4] == str(trajs[tid].task_id)
        assert cells[5] == trajs[tid].turns[1].text  # the assistant turn
    assert lines[-1] == "(3 rows)"
    assert list((reflexdb_home / "faiss").glob(f"*/run-{run}.faiss"))  # caught up and persisted
