"""What a publish costs on SmolLM2, and how much of it is the flush that makes it durable.

A publish writes the learner state (DeepSpeed: weights and AdamW moments, taken after one
optimizer step so the moments exist) and the HF weights, each under a temporary name, flushes
every file (``fsync``) and renames it into place (docs/reliability.md). This script times
``save_state`` and ``export_hf`` as the learner calls them, with the flush
(``learner.fsync_publish: true``, the default) and without it, alternating the two so both see
the same machine::

    python benchmarks/publish_bench.py --reps 3 --json-out /tmp/publish.json

It needs no database: the engine is built directly (DeepSpeed on CPU, gloo), in a temporary
directory on the same disk as ``$REFLEXDB_HOME`` unless ``--dir`` says otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", help="where to write (default: a temporary directory under $REFLEXDB_HOME)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from reflexdb.models import resolve_model
    from reflexdb.settings import ensure_home
    from reflexdb.trainer.engine import EngineSettings, TrainingEngine

    model = resolve_model(args.model)
    eng = TrainingEngine(model, EngineSettings(micro_batch_size=1))
    # One optimizer step, so the state holds AdamW's moments as a learner's does (they are created lazily).
    import torch

    ids = torch.randint(0, 1000, (1, 16))
    logprobs, _ = eng.token_logprobs(ids, torch.ones_like(ids), torch.tensor([8]), torch.tensor([8]))
    eng.backward(-logprobs.sum())
    eng.step()
    root = Path(args.dir or tempfile.mkdtemp(prefix="publish-bench-", dir=ensure_home()))
    times: dict[str, list[dict]] = {"fsync": [], "no fsync": []}
    load = [os.getloadavg()]
    try:
        for rep in range(args.reps):
            for variant in ("fsync", "no fsync"):
                eng.settings = dataclasses.replace(eng.settings, fsync=variant == "fsync")
                out = root / f"{variant.replace(' ', '-')}-{rep}"
                t0 = time.perf_counter()
                eng.save_state(out / "states", "v1", {"step": 1, "version": 1})
                t1 = time.perf_counter()
                eng.export_hf(out / "v1")
                t2 = time.perf_counter()
                size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
                times[variant].append({"state_s": t1 - t0, "weights_s": t2 - t1, "total_s": t2 - t0,
                                       "bytes": size})
                print(f"rep {rep} {variant:9s}: state {t1 - t0:6.2f} s, weights {t2 - t1:6.2f} s, "
                      f"{size / 2**30:.2f} GiB", flush=True)
                shutil.rmtree(out)
                load.append(os.getloadavg())
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    summary = {v: {k: statistics.median(r[k] for r in rows) for k in ("state_s", "weights_s", "total_s")}
               for v, rows in times.items()}
    ratio = summary["fsync"]["total_s"] / summary["no fsync"]["total_s"]
    print(f"median publish: {summary['fsync']['total_s']:.2f} s with fsync, {summary['no fsync']['total_s']:.2f} s "
          f"without ({ratio:.2f}x); load {load[0][0]:.1f} -> {load[-1][0]:.1f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "model": args.model,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "load": load, "runs": times, "median": summary, "ratio_fsync_to_none": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
