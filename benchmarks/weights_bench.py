"""Publish-to-generating seconds (issue 62): from the learner's publish of a version until a
collector's engine has its weights in place and has generated, by the route the collector takes:

- **local**: the learner's directory, read in place (``file://``; the default);
- **shm**: the learner's copy in shared memory (``learner.shared_memory_publish``, a collector on
  the same machine);
- **s3**: ``learner.checkpoint_url: s3://…``: the upload, then the collector's fetch with ranged
  reads in flight (``collector.checkpoint_fetch_concurrency``) into its cache; here moto's server
  on this machine (``benchmarks/s3server.py``), so the protocol's and moto's costs, not a network's.

Each is the product's own code, step by step: ``TrainingEngine.export_hf`` (the weights in the
training dtype, sharded by ``learner.publish_shard_mb``, the manifest with every file's sha256,
fsync, rename), ``SharedCopies.place`` (shm), ``storage.upload`` and ``CheckpointCache.fetch``
(s3), ``storage.verify_version`` (local, shm: what a collector checks before loading a version in
place), the engine's ``load_weights`` (in place), one ``generate`` call. Not included: the
``policy_versions`` row, its NOTIFY and the collector noticing it (no database here; milliseconds
on a live run), and the learner's gather of ZeRO-3 shards.

The measurement is a function, :func:`publish_to_generating`, for the GPU suite's ``scale`` stage
(a CUDA collector engine and a learner of Qwen2.5-1.5B's shapes); the script runs it on the CPU::

    python benchmarks/weights_bench.py --models tiny,smollm2 --reps 3 --json-out /tmp/weights.json

The anchor (issue 62): verl's checkpoint engine syncs 7B over NCCL in 0.02 s between processes
that already hold the weights on their GPUs (docs/benchmarks.md says how close this gets and why
the file path is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROUTES = ("local", "shm", "s3")
PHASES = ("export", "share", "upload", "fetch", "verify", "load", "generate")


def publish_to_generating(trainer, engine, route: str, work: Path, version: int, *, s3_url: str | None = None,
                          shm_root: Path | None = None, concurrency: int = 8, new_tokens: int = 8,
                          sync=None) -> dict[str, float]:
    """Publish ``trainer``'s weights as ``version`` and bring them into ``engine`` by ``route``;
    seconds of each phase (:data:`PHASES`, 0 where the route has none), ``total`` and ``bytes``
    (of the version's files).

    Args:
        trainer: a :class:`reflexdb.trainer.engine.TrainingEngine` (its ``export_hf``, its settings'
            ``publish_shard_bytes`` and ``fsync``).
        engine: a collector engine (``hf``, ``fast``): ``load_weights`` and ``generate``.
        route: ``local``, ``shm`` or ``s3`` (``s3_url``: a prefix the caller's credentials may
            write, e.g. ``s3://bench/weights``).
        work: a directory for the learner's files and the collector's cache (one per call is fine;
            the caller removes it).
        sync: called at the end of each phase (``torch.cuda.synchronize`` on a GPU).
    """
    from reflexdb import shm, storage
    from reflexdb.collector.engines import SamplingParams

    sync = sync or (lambda: None)
    t: dict[str, float] = dict.fromkeys(PHASES, 0.0)
    durable = work / "learner" / f"v{version}"
    durable.parent.mkdir(parents=True, exist_ok=True)

    def phase(name: str, fn):
        t0 = time.perf_counter()
        out = fn()
        sync()
        t[name] = time.perf_counter() - t0
        return out

    start = time.perf_counter()
    sha = phase("export", lambda: trainer.export_hf(durable))
    _, man_sha = storage.manifest_digest(durable)
    path = durable
    if route == "shm":
        copies = shm.SharedCopies(shm_root or shm.DEFAULT_DIR, f"weights-bench.{os.getpid()}", echo=print)
        copies.directory.mkdir(parents=True, exist_ok=True)
        meta = phase("share", lambda: copies.place(durable, version))
        if meta is None:
            raise RuntimeError(f"no room in {copies.directory} for the copy")
        path = shm.locate({shm.META_KEY: meta})
    elif route == "s3":
        uri = storage.version_uri(s3_url, version)
        phase("upload", lambda: storage.upload(durable, uri, None, limit_s=600))
        cache = storage.CheckpointCache(work / "cache", keep=1, concurrency=concurrency)
        path = phase("fetch", lambda: cache.fetch(uri, version, sha, man_sha))  # every file checked on the way
    elif route != "local":
        raise ValueError(f"route {route!r}: one of {ROUTES}")
    if route != "s3":
        phase("verify", lambda: storage.verify_version(path, sha, man_sha))
    phase("load", lambda: engine.load_weights(path))
    phase("generate", lambda: engine.generate(["1 + 1 ="], n=1, params=SamplingParams(
        temperature=0, max_new_tokens=new_tokens)))
    t["total"] = time.perf_counter() - start
    t["bytes"] = float(sum(p.stat().st_size for p in durable.rglob("*") if p.is_file()))
    if route == "shm":
        copies.remove()
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2, or a model directory")
    ap.add_argument("--routes", default=",".join(ROUTES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", help="the learner's dtype (bfloat16: as on a GPU)")
    ap.add_argument("--shard-mb", type=int, default=1024, help="learner.publish_shard_mb")
    ap.add_argument("--concurrency", type=int, default=8, help="collector.checkpoint_fetch_concurrency")
    ap.add_argument("--no-fsync", action="store_true", help="learner.fsync_publish: false")
    ap.add_argument("--dir", help="where to write (default: a temporary directory)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from machine import host_facts
    from reflexdb.collector.engines import make_engine
    from reflexdb.models import resolve_model
    from reflexdb.trainer.engine import EngineSettings, TrainingEngine

    routes = args.routes.split(",")
    root = Path(tempfile.mkdtemp(prefix="weights-bench-", dir=args.dir))
    server = None
    if "s3" in routes:
        from s3server import S3Server

        server = S3Server(root / "moto.log")
        server.make_bucket("bench")
        os.environ.update(server.env())
    load_avg = [os.getloadavg()]
    results: dict[str, dict] = {}
    try:
        for model in args.models.split(","):
            src = resolve_model(model)
            torch.manual_seed(0)
            trainer = TrainingEngine(src, EngineSettings(micro_batch_size=1, dtype=args.dtype, fsync=not args.no_fsync,
                                                         publish_shard_bytes=args.shard_mb << 20), say=lambda m: None)
            engine = make_engine("hf", model=src, device="cpu")
            from reflexdb.collector.engines import SamplingParams

            engine.generate(["1 + 1 ="], n=1, params=SamplingParams(temperature=0, max_new_tokens=8))  # warm
            runs: dict[str, list] = {r: [] for r in routes}
            version = 0
            for rep in range(args.reps):
                for route in (routes if rep % 2 == 0 else routes[::-1]):  # alternated: each sees the same machine
                    version += 1
                    with torch.no_grad():  # a new version: the weights move a little
                        for p in trainer.ds.module.parameters():
                            p.add_(1e-3)
                    work = root / "work" / f"{model.replace('/', '_')}-{version}"
                    r = publish_to_generating(trainer, engine, route, work, version, s3_url="s3://bench/weights",
                                              concurrency=args.concurrency)
                    runs[route].append(r)
                    print(f"{model} rep {rep} {route:5s}: " + ", ".join(
                        f"{k} {v:.3f}" for k, v in r.items() if k != "bytes" and v) + f" ({r['bytes'] / 2**20:,.1f} MiB)",
                          flush=True)
                    shutil.rmtree(work, ignore_errors=True)
                    if route == "s3":  # moto keeps objects in memory
                        from reflexdb import storage

                        fs, p = storage.filesystem("s3://bench/weights")
                        fs.rm(p, recursive=True)
                    load_avg.append(os.getloadavg())
            engine.close()
            shards = len(list((Path(src)).glob("*.safetensors")))
            results[model] = {"runs": runs, "source_files": shards,
                              "median": {r: {k: statistics.median(x[k] for x in runs[r]) for k in runs[r][0]}
                                         for r in routes}}
            del trainer
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    for model, res in results.items():
        for route, med in res["median"].items():
            gbps = med["bytes"] / med["total"] / 1e9
            print(f"{model} {route}: publish-to-generating median {med['total']:.2f} s ({med['bytes'] / 2**20:,.1f} MiB, "
                  f"{gbps:.2f} GB/s): " + ", ".join(f"{k} {med[k]:.2f}" for k in PHASES if med[k]))
    print(f"load average {load_avg[0][0]:.1f} -> {load_avg[-1][0]:.1f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                        **host_facts()},
            "settings": vars(args), "load": load_avg, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
