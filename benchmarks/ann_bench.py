"""Exact against approximate (IVF-Flat) search of the embedding index, on synthetic trajectory embeddings.

The indexes are built by reflexdb.index's own functions, on numpy arrays (no database):
``exact_index`` + ``add_with_ids`` for the flat index, ``train_ivf`` (on a sample) + ``add_with_ids``
for IVF, with the nlist that ``ivf_lists`` gives for the ``faiss`` config; searches go through
``EmbeddingIndex.search_trajectory`` (what ``reflexdb similar`` and NexGRPO call).

The data: ``--n`` vectors of D = 576 (SmolLM2-135M's hidden size), laid out like one run:
tasks collected ``--groups-per-task`` times (default 1: one pass over a large dataset), one
group of 8 samples each time, ids in collection order, tasks in shuffled order. Each vector is a
sum of independent Gaussian parts, written as (expected squared norm):

- a direction every vector shares (1.0): hidden states are anisotropic; unrelated ones still
  have cosine ~0.4;
- the task's topic (0.5) and the task itself (0.5), both in one rank-64 subspace: tasks of one
  dataset share directions; 32 tasks per topic;
- the group (0.15, full rank): one collection of a task, at one policy version;
- the sample (0.25 x ``--noise``², full rank).

With ``--noise 1``: cosine ~0.90 within a group, ~0.83 between groups of one task, ~0.62 between
tasks of one topic, ~0.42 otherwise. With one group per task a sample's 10 nearest neighbours are
its 7 group mates and 3 samples of other tasks of its topic; with more groups per task all 10 are
its task's, and recall is higher still. This is the structure an IVF index exploits; real
embeddings have it in some measure, random Gaussian vectors (``--data gaussian``) not at all, and
there every approximate index has poor recall. The report prints the measured cosines so a reader
can compare with real data.

Measured: exact build (add), IVF train and add (rebuilt at N, and trained at N/retrain_growth
then grown to N: the coarsest lists before a retrain), per-query latency (one query at a time,
p50/p99), recall@10 against the exact answer, RSS growth, the IVF file's size and write/read
time, and restricted search (one task's failures; 5000 and 50000 ids) on both indexes, which must
return identical neighbours and cosines.

Quick (50k vectors, well under a minute)::

    python benchmarks/ann_bench.py --quick

Full (1M vectors; about 8 GB of RAM at the peak: the data, the flat and one IVF index, a training sample)::

    python benchmarks/ann_bench.py --json-out benchmarks/results/ann_1m.json --report benchmarks/results/ann_1m.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import faiss
import numpy as np

from reflexdb.config import FaissConfig
from reflexdb.index import EmbeddingIndex, exact_index, ivf_lists, train_ivf

DIM = 576
GROUP_SIZE = 8
RANK = 64
TASKS_PER_TOPIC = 32
# expected squared norm of each part of a vector (see the module docstring)
SHARED, TOPIC, TASK, GROUP, SAMPLE = 1.0, 0.5, 0.5, 0.15, 0.25


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def synthesise(n: int, *, groups_per_task: int, noise: float, data: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Trajectory-like vectors `[n, DIM]` float32 and each one's task `[n]` (module docstring)."""
    rng = np.random.default_rng(seed)
    if data == "gaussian":
        return rng.standard_normal((n, DIM), dtype=np.float32), np.full(n, -1, dtype=np.int64)
    per_task = GROUP_SIZE * groups_per_task
    n_tasks = -(-n // per_task)
    n_topics = -(-n_tasks // TASKS_PER_TOPIC)
    shared = rng.standard_normal(DIM)
    shared *= np.sqrt(SHARED) / np.linalg.norm(shared)
    basis, _ = np.linalg.qr(rng.standard_normal((DIM, RANK)))  # [DIM, RANK] orthonormal columns
    topics = rng.standard_normal((n_topics, RANK)) * np.sqrt(TOPIC / RANK)
    # a dataset is drawn in shuffled order: consecutive tasks are of unrelated topics
    topic_of = rng.permutation(np.arange(n_tasks) // TASKS_PER_TOPIC)
    tasks = topics[topic_of] + rng.standard_normal((n_tasks, RANK)) * np.sqrt(TASK / RANK)
    centres = (shared + tasks @ basis.T).astype(np.float32)  # [n_tasks, DIM]
    # collection order: epoch e visits every task once, one group of GROUP_SIZE samples each
    row = np.arange(n)
    group_no = row // GROUP_SIZE
    task_of = group_no % n_tasks
    out = np.empty((n, DIM), dtype=np.float32)
    step = 65536
    for s in range(0, n, step):
        g = group_no[s : s + step]
        first, last = g[0], g[-1]
        group_offsets = rng.standard_normal((last - first + 1, DIM), dtype=np.float32)
        group_offsets *= np.float32((GROUP / DIM) ** 0.5)
        sample = rng.standard_normal((g.size, DIM), dtype=np.float32) * np.float32(noise * (SAMPLE / DIM) ** 0.5)
        out[s : s + step] = centres[task_of[s : s + step]] + group_offsets[g - first] + sample
    return out, task_of


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def machine() -> dict:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gib = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    return {"cpus": os.cpu_count(), "cpu": cpu, "mem_gib": mem_gib,
            "platform": platform.platform(), "python": platform.python_version(), "faiss": faiss.__version__,
            "faiss_threads": faiss.omp_get_max_threads(), "loadavg_start": os.getloadavg()}


def wrap(index: faiss.Index, config: FaissConfig, trained_size: int | None) -> EmbeddingIndex:
    """The product's search code over a built index, without a database."""
    return EmbeddingIndex(None, 0, Path(), {}, index=index, config=config, trained_size=trained_size)


def latency(index: EmbeddingIndex, query_ids: np.ndarray, k: int, **kw) -> tuple[list[float], list[list[int]]]:
    """Per-query milliseconds of ``search_trajectory`` (one query at a time) and the ids found."""
    for t in query_ids[:5]:  # warm-up
        index.search_trajectory(int(t), k, **kw)
    times, found = [], []
    for t in query_ids:
        start = time.perf_counter()
        hits = index.search_trajectory(int(t), k, **kw)
        times.append((time.perf_counter() - start) * 1000)
        found.append([h.trajectory_id for h in hits])
    return times, found


def recall(found: list[list[int]], truth: list[list[int]], k: int) -> float:
    return float(np.mean([len(set(f) & set(t)) / k for f, t in zip(found, truth)]))


def run(args) -> dict:
    config = FaissConfig(**({"nlist": args.nlist} if args.nlist else {}), train_per_list=args.train_per_list,
                         retrain_growth=args.retrain_growth)
    k = args.k
    results = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
               "machine": machine(), "n": args.n, "dim": DIM, "k": k, "data": args.data, "noise": args.noise,
               "groups_per_task": args.groups_per_task, "config": config.model_dump()}
    log(f"synthesising {args.n:,} x {DIM} ({args.data}) ...")
    unit, task_of = synthesise(args.n, groups_per_task=args.groups_per_task, noise=args.noise, data=args.data,
                               seed=args.seed)
    faiss.normalize_L2(unit)  # in place: what EmbeddingIndex._add stores
    ids = np.arange(1, args.n + 1, dtype=np.int64)
    rng = np.random.default_rng(args.seed + 1)
    query_ids = np.sort(rng.choice(ids, args.queries, replace=False))

    # ---- exact
    rss0 = rss_mb()
    start = time.perf_counter()
    flat = exact_index(DIM)
    flat.add_with_ids(unit, ids)
    exact = wrap(flat, config, None)
    results["exact"] = {"add_s": round(time.perf_counter() - start, 2), "rss_mb": round(rss_mb() - rss0)}
    log(f"exact: added in {results['exact']['add_s']} s")
    start = time.perf_counter()
    truth_hits = exact.search(unit[query_ids - 1], k + 1)  # batched; drop the query itself below
    truth = [[h.trajectory_id for h in hits if h.trajectory_id != t][:k] for t, hits in zip(query_ids, truth_hits)]
    cos = np.array([[h.cosine for h in hits if h.trajectory_id != t][:k] for t, hits in zip(query_ids, truth_hits)])
    same_task = np.mean([np.mean(task_of[np.array(t) - 1] == task_of[q - 1]) for q, t in zip(query_ids, truth)])
    same_task = None if args.data == "gaussian" else round(float(same_task), 3)
    results["data_stats"] = {"cos_1st_mean": round(float(cos[:, 0].mean()), 3),
                             "cos_10th_mean": round(float(cos[:, -1].mean()), 3), "top10_same_task": same_task}
    log(f"ground truth for {len(query_ids)} queries in {time.perf_counter() - start:.1f} s; {results['data_stats']}")
    times, found = latency(exact, query_ids[: args.exact_queries], k)
    assert found == truth[: args.exact_queries], "batched and single exact searches disagree"
    results["exact"].update(queries=len(times), p50_ms=round(pct(times, 50), 2), p99_ms=round(pct(times, 99), 2))
    log(f"exact: p50 {pct(times, 50):.1f} ms, p99 {pct(times, 99):.1f} ms")

    # ---- approximate: rebuilt at N, and trained at N / retrain_growth then grown to N
    results["ivf"] = []
    trained_at = {"trained at N/growth": int(args.n / config.retrain_growth), "rebuilt at N": args.n}
    for label, n_train in trained_at.items():  # the last one is kept for what follows
        nlist = ivf_lists(n_train, config.nlist)
        ivf = index = None  # free the previous one first
        rss0 = rss_mb()
        start = time.perf_counter()
        ivf = train_ivf(unit[:n_train], nlist, config.train_per_list)
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        ivf.add_with_ids(unit, ids)
        add_s = time.perf_counter() - start
        entry = {"index": label, "trained_on": n_train, "nlist": nlist, "train_s": round(train_s, 2),
                 "add_s": round(add_s, 2), "rss_mb": round(rss_mb() - rss0), "search": []}
        sample = min(n_train, nlist * config.train_per_list)
        log(f"ivf {label}: nlist {nlist}, trained in {train_s:.1f} s on {sample:,}, added in {add_s:.1f} s")
        for nprobe in args.nprobe:
            if nprobe > nlist:
                continue
            index = wrap(ivf, config.model_copy(update={"nprobe": nprobe}), n_train)
            times, found = latency(index, query_ids, k)
            entry["search"].append({"nprobe": nprobe, "p50_ms": round(pct(times, 50), 2),
                                    "p99_ms": round(pct(times, 99), 2),
                                    "recall_at_10": round(recall(found, truth, k), 4)})
            log(f"  nprobe {nprobe}: p50 {pct(times, 50):.2f} ms, p99 {pct(times, 99):.2f} ms, "
                f"recall@{k} {recall(found, truth, k):.4f}")
        results["ivf"].append(entry)

    # ---- persistence of the IVF index (what EmbeddingIndex.open reads)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path = Path(tmp) / "run.faiss"
        start = time.perf_counter()
        faiss.write_index(ivf, str(path))
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        faiss.read_index(str(path))
        read_s = time.perf_counter() - start
        results["ivf_file"] = {"mb": round(path.stat().st_size / 2**20), "write_s": round(write_s, 2),
                               "read_s": round(read_s, 2)}
    log(f"ivf file: {results['ivf_file']}")

    # ---- restricted search stays exact: both indexes give identical neighbours and cosines
    # one task's failures: the second half of each of its groups (as tests/factories.make_group)
    failing = np.arange(args.n) % GROUP_SIZE >= GROUP_SIZE // 2
    failures = [ids[(task_of == task_of[q - 1]) & failing] for q in query_ids]
    approx = wrap(ivf, config, args.n)
    cases = {"one task's failures": lambda i: failures[i], "5000 ids": lambda i: rng.choice(ids, 5000, replace=False),
             "50000 ids": lambda i: rng.choice(ids, min(50000, args.n), replace=False)}
    results["restricted"] = {}
    m = args.restricted_queries
    for name, make in cases.items():
        subsets = [make(i) for i in range(m)]
        out = {}
        for label, index in (("exact", exact), ("ivf", approx)):
            lat = []
            for t, sub in zip(query_ids[:m], subsets):
                start = time.perf_counter()
                hits = index.search_trajectory(int(t), k, restrict_to=sub)
                lat.append((time.perf_counter() - start) * 1000)
                out.setdefault(label + "_hits", []).append(hits)
            out[label] = {"p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2)}
        identical = out.pop("exact_hits") == out.pop("ivf_hits")
        results["restricted"][name] = {**out, "queries": m, "identical": identical}
        log(f"restricted, {name}: exact p50 {out['exact']['p50_ms']} ms, ivf p50 {out['ivf']['p50_ms']} ms, "
            f"identical: {identical}")
    results["machine"]["loadavg_end"] = os.getloadavg()
    return results


def markdown(r: dict) -> str:
    m = r["machine"]
    c = r["config"]
    same_task = r["data_stats"]["top10_same_task"]
    out = [f"ANN benchmark {r['date']}: `{r['command']}`", "",
           f"{m['cpus']} CPUs ({m['cpu']}), {m['mem_gib']} GiB RAM, faiss {m['faiss']} ({m['faiss_threads']} threads); "
           f"load average at start {m['loadavg_start'][0]:.2f}, at end {m['loadavg_end'][0]:.2f}.", "",
           f"{r['n']:,} vectors of {r['dim']} ({r['data']} data, noise {r['noise']}, "
           f"{r['groups_per_task']} groups of 8 per task); train_per_list {c['train_per_list']}, "
           f"retrain_growth {c['retrain_growth']}. Exact top-10: "
           f"mean cosine of the 1st {r['data_stats']['cos_1st_mean']}, of the 10th {r['data_stats']['cos_10th_mean']}; "
           f"{'-' if same_task is None else format(same_task, '.0%')} from the query's task.", "",
           "| index | nlist | nprobe | train s | add s | RSS MB | p50 ms | p99 ms | recall@10 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    e = r["exact"]
    out.append(f"| exact (flat) | | | | {e['add_s']} | {e['rss_mb']} | {e['p50_ms']} | {e['p99_ms']} | 1 |")
    for entry in r["ivf"]:
        for s in entry["search"]:
            out.append(f"| IVF, {entry['index']} ({entry['trained_on']:,}) | {entry['nlist']} | {s['nprobe']} | "
                       f"{entry['train_s']} | {entry['add_s']} | {entry['rss_mb']} | {s['p50_ms']} | {s['p99_ms']} | "
                       f"{s['recall_at_10']} |")
    f = r["ivf_file"]
    out += ["", f"IVF file (rebuilt at N): {f['mb']} MB, write {f['write_s']} s, read {f['read_s']} s.", "",
            "| restricted search | exact p50 ms | exact p99 ms | IVF p50 ms | IVF p99 ms | identical |",
            "|---|---:|---:|---:|---:|---|"]
    for name, x in r["restricted"].items():
        out.append(f"| {name} ({x['queries']} queries) | {x['exact']['p50_ms']} | {x['exact']['p99_ms']} | "
                   f"{x['ivf']['p50_ms']} | {x['ivf']['p99_ms']} | {x['identical']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="vectors (default 1M)")
    ap.add_argument("--quick", action="store_true", help="50k vectors, fewer queries")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=500, help="queries for latency and recall")
    ap.add_argument("--exact-queries", type=int, default=30, help="single exact queries timed (each a full scan)")
    ap.add_argument("--restricted-queries", type=int, default=30)
    ap.add_argument("--nprobe", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="comma-separated nprobe values to measure (default: 16,32,64 and the config default)")
    ap.add_argument("--nlist", type=int, default=None, help="faiss.nlist (default: 4·√N)")
    ap.add_argument("--train-per-list", type=int, default=FaissConfig().train_per_list)
    ap.add_argument("--retrain-growth", type=float, default=FaissConfig().retrain_growth)
    ap.add_argument("--groups-per-task", type=int, default=1,
                    help="times each task was collected (1: 3 of a sample's 10 neighbours are other tasks')")
    ap.add_argument("--noise", type=float, default=1.0, help="scale of the per-sample noise")
    ap.add_argument("--data", choices=["clustered", "gaussian"], default="clustered")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="directory for the IVF file written and read back")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--report", type=Path, help="write the markdown table here")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.queries, args.exact_queries, args.restricted_queries = 50_000, 200, 30, 20
    args.nprobe = sorted(set(args.nprobe or [16, 32, 64, FaissConfig().nprobe]))
    results = run(args)
    text = markdown(results)
    print(text)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
