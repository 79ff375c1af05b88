"""Publish-to-load latency of one version: through S3 (``learner.checkpoint_url``) and through the
local path, at the quickstart's model size (SmolLM2-135M) and at a 1.7 GB checkpoint of synthetic
weights (issue 54).

For each size and repetition, alternating the two paths so both see the same machine:

- **local**: the version's files are written as ``export_hf`` writes them (each file written, its
  sha256 taken, flushed with fsync), then loaded from that directory as a collector does
  (``file://``: in place);
- **s3**: the same write, then ``reflexdb.storage.upload`` to a local S3 server (moto's, in its
  own process: ``benchmarks/s3server.py``), then ``CheckpointCache.fetch`` into a collector's
  cache (download with ranged reads, every file and the weights' sha256 checked), then the load.

The load is the ``hf`` engine's ``load_weights`` for SmolLM2, and ``safetensors.torch.load_file``
of every file, each tensor read once, for the synthetic checkpoint (it is no model)::

    python benchmarks/publish_url_bench.py --reps 3 --json-out /tmp/publish_url.json

It needs no database. The S3 server runs on this machine: the figures are the cost of reflexdb's
path (hashing, the S3 protocol, copying), not of a network.
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

from machine import host_facts

SYNTHETIC_BYTES = 1_700_000_000


def write_version(src: Path, dst: Path) -> str:
    """Write ``src``'s files to ``dst`` as ``export_hf`` does (then sha256 of the weights, fsync);
    return that sha256."""
    from reflexdb.storage import weights_sha256
    from reflexdb.trainer.engine import fsync_tree

    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copyfile(f, dst / f.name)
    sha = weights_sha256(dst)
    fsync_tree(dst)
    return sha


def synthetic(root: Path, nbytes: int) -> Path:
    """A safetensors checkpoint of ``nbytes`` of random float32 weights in 2 shards, and a config."""
    import numpy as np
    from safetensors.numpy import save_file

    d = root / "synthetic"
    d.mkdir()
    rng = np.random.default_rng(0)
    per_shard = nbytes // 2 // 4
    for i in range(2):
        rows = per_shard // 4096
        save_file({f"layer{i}.weight": rng.standard_normal((rows, 4096), dtype=np.float32)},
                  str(d / f"model-0000{i + 1}-of-00002.safetensors"))
    (d / "config.json").write_text(json.dumps({"synthetic": True}))
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="smollm2,synthetic", help="comma-separated: smollm2, synthetic")
    ap.add_argument("--synthetic-bytes", type=int, default=SYNTHETIC_BYTES)
    ap.add_argument("--dir", help="where to write (default: a temporary directory)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from s3server import S3Server

    from reflexdb import storage

    root = Path(tempfile.mkdtemp(prefix="publish-url-bench-", dir=args.dir))
    server = S3Server(root / "moto.log")
    server.make_bucket("bench")
    os.environ.update(server.env())
    load_avg = [os.getloadavg()]
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        for size in args.sizes.split(","):
            if size == "smollm2":
                from reflexdb.collector.engines import make_engine
                from reflexdb.models import resolve_model

                src = Path(resolve_model("smollm2"))
                engine = make_engine("hf", model=src, device="cpu")

                def load(path, engine=engine):
                    engine.load_weights(path)
            else:
                from safetensors.torch import load_file

                src = synthetic(root, args.synthetic_bytes)
                engine = None

                def load(path):  # every weight read (load_file alone maps the file)
                    for f in sorted(Path(path).glob("*.safetensors")):
                        for t in load_file(str(f)).values():
                            t.sum()
            nbytes = sum(f.stat().st_size for f in src.iterdir() if f.is_file())
            results[size] = {"local": [], "s3": [], "bytes": nbytes}
            for rep in range(args.reps):
                for path in ("local", "s3") if rep % 2 == 0 else ("s3", "local"):
                    version = f"v{rep}-{path}"
                    t0 = time.perf_counter()
                    sha = write_version(src, root / "learner" / size / version)
                    t = {"write_s": time.perf_counter() - t0}
                    local_dir = root / "learner" / size / version
                    if path == "s3":
                        uri = f"s3://bench/{size}/{version}"
                        t1 = time.perf_counter()
                        storage.upload(local_dir, uri, None, limit_s=60)
                        t["upload_s"] = time.perf_counter() - t1
                        t1 = time.perf_counter()
                        cache = storage.CheckpointCache(root / "cache" / size, keep=1)
                        local_dir = cache.fetch(uri, rep, sha)
                        t["fetch_s"] = time.perf_counter() - t1
                    t1 = time.perf_counter()
                    load(local_dir)
                    t["load_s"] = time.perf_counter() - t1
                    t["total_s"] = time.perf_counter() - t0
                    results[size][path].append(t)
                    print(f"{size} rep {rep} {path:5s}: " + ", ".join(f"{k} {v:6.2f}" for k, v in t.items()),
                          flush=True)
                    shutil.rmtree(root / "learner" / size / version)
                    if path == "s3":  # moto keeps objects in memory
                        fs, p = storage.filesystem(uri)
                        fs.rm(p, recursive=True)
                    load_avg.append(os.getloadavg())
            if engine is not None:
                engine.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for size, r in results.items():
        med = {p: {k: statistics.median(x[k] for x in r[p]) for k in r[p][0]} for p in ("local", "s3")}
        med["ratio_s3_to_local"] = med["s3"]["total_s"] / med["local"]["total_s"]
        med["added_s"] = med["s3"]["total_s"] - med["local"]["total_s"]
        med["bytes"] = r["bytes"]
        summary[size] = med
        print(f"{size} ({r['bytes'] / 2**20:,.0f} MiB): publish-to-load median {med['local']['total_s']:.2f} s local, "
              f"{med['s3']['total_s']:.2f} s through S3 ({med['ratio_s3_to_local']:.2f}x, +{med['added_s']:.2f} s: "
              f"upload {med['s3']['upload_s']:.2f} s, fetch {med['s3']['fetch_s']:.2f} s)")
    print(f"load average {load_avg[0][0]:.1f} -> {load_avg[-1][0]:.1f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                        **host_facts()},
            "load": load_avg, "reps": args.reps, "runs": results, "median": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
