"""GRPO vs NexGRPO on the built-in arithmetic task with SmolLM2-135M-Instruct on CPU.

Both runs use the same config except ``algorithm`` (and the run name): same seed, same tasks,
same learner settings, the same number of learner steps (``--steps``) and the same wall-clock
budget (``--max-seconds``, whichever ends first). Each run is exactly what a user would type::

    reflexdb run CONFIG --no-eval --max-steps N --max-seconds S   # a collector and a learner process
    reflexdb eval -c CONFIG --checkpoint latest -k K      # held-out pass@1 / pass@k

plus one ``reflexdb eval --checkpoint base`` for the starting point (the same for both: same
model, same eval tasks, same sampling seed). Afterwards the script reads, from the experience
database, every learner step's metrics (on-policy pass@1, replay share, replayed-negative
confidence stored and refreshed) and the MLflow run ids, and writes them as JSON and as the
markdown tables of docs/experiments.md.

    python benchmarks/experiments/nexgrpo_vs_grpo.py --home /tmp/nx-exp --steps 20 --max-seconds 1500 \\
        --json-out /tmp/nx-exp/results.json

``--home`` becomes ``REFLEXDB_HOME`` (embedded PostgreSQL, checkpoints, MLflow); reuse it to
re-render (``--report``). Torch threads per process: ``--threads`` (default 1: the collector and
the learner share 2 cores; see docs/benchmarks.md on OpenMP spinning).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from arms import CLI, home_env, md_table, report_or_run


def config(name: str, algorithm: str, args) -> dict:
    return {
        "run": name,
        "algorithm": algorithm,
        "model": "smollm2",
        "max_staleness": 1,
        "seed": args.seed,
        "tasks": {"source": "arithmetic", "level": 1, "train_size": 80, "eval_size": 8, "template": "plain",
                  "seed": args.seed},
        "collector": {"group_size": 8, "tasks_per_batch": 4,
                      "sampling": {"temperature": 1.0, "max_new_tokens": args.max_new_tokens}},
        "learner": {"groups_per_step": args.groups, "micro_batch_size": 16, "lr": args.lr,
                    "eval_samples": args.eval_samples, "publish_every": 1},
        "nexgrpo": {"conf_low": 0.2, "conf_high": 0.9, "replay_ratio": 0.5, "start_pass_at_1": 0.35,
                    "retire_prob": 0.05},
    }


def run_name(algo: str, args) -> str:
    return f"exp-{algo}-s{args.seed}{args.tag}"


def sh(cmd: list[str], env: dict, log: Path) -> tuple[int, float, str]:
    t0 = time.monotonic()
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        fh.write(proc.stdout)
    return proc.returncode, time.monotonic() - t0, proc.stdout


def parse_eval(out: str) -> dict:
    m = re.search(r"(\S+): pass@1 ([\d.]+)\s+pass@(\d+) ([\d.]+)\s+\((\d+) \S+ tasks x (\d+) samples; MLflow run (\w+)\)", out)
    if not m:
        raise RuntimeError(f"could not parse the eval output:\n{out[-2000:]}")
    return {"label": m.group(1), "pass_at_1": float(m.group(2)), "k": int(m.group(3)),
            "pass_at_k": float(m.group(4)), "tasks": int(m.group(5)), "samples": int(m.group(6)),
            "mlflow_run_id": m.group(7)}


def _rows(url: str, query: str, run: str) -> list[tuple]:
    """The rows of ``query`` (one parameter: the run's name) on the experiment's database."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return conn.execute(query, (run,)).fetchall()


def step_metrics(url: str, run: str) -> list[dict]:
    # t: seconds since the run's policy v0 was published (the learner's start)
    keys = ["reward/pass_at_1", "replay/share", "replay/negative_confidence", "replay/negative_confidence_refreshed",
            "replay/pair_cosine", "replay/refresh_discard_rate", "replay/retired_tasks", "perf/step_seconds"]
    rows = _rows(url, "SELECT s.step, s.policy_version, extract(epoch FROM s.created_at - p.created_at), s.metrics "
                      "FROM learner_steps s JOIN runs r ON r.id = s.run_id "
                      "JOIN policy_versions p ON p.run_id = r.id AND p.version = 0 WHERE r.name = %s ORDER BY s.step", run)
    return [{"step": st, "version": v, "t": float(t), **{k: m.get(k) for k in keys}} for st, v, t, m in rows]


def counts(url: str, run: str) -> dict:
    [row] = _rows(url, """
        SELECT (SELECT count(*) FROM groups g WHERE g.run_id = r.id AND g.kind = 'fresh'),
               (SELECT count(*) FROM groups g WHERE g.run_id = r.id AND g.kind = 'replay'),
               (SELECT count(DISTINCT c.group_id) FROM consumption c JOIN groups g ON g.id = c.group_id
                 WHERE g.run_id = r.id AND g.kind = 'replay'),
               (SELECT count(*) FROM replay_requests q WHERE q.run_id = r.id),
               (SELECT DISTINCT meta->>'mlflow_run_id' FROM policy_versions p WHERE p.run_id = r.id LIMIT 1)
        FROM runs r WHERE r.name = %s""", run)
    return dict(zip(["fresh_groups", "replay_groups", "replay_groups_consumed", "replay_requests",
                     "mlflow_learner_run_id"], row))


def done_steps(url: str, run: str) -> int:
    [row] = _rows(url, "SELECT max(s.step) FROM learner_steps s JOIN runs r ON r.id = s.run_id WHERE r.name = %s", run)
    return int(row[0] or 0)


def logged_eval(home: Path, run: str, label: str) -> dict | None:
    """An evaluation already logged to MLflow (``reflexdb eval`` names its run RUN-eval-LABEL)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name(f"reflexdb/{run}")
    if exp is None:
        return None
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == f"{run}-eval-{label}"]
    if not runs:
        return None
    r = runs[0]
    k = int(r.data.params["eval.k"])
    return {"label": label, "pass_at_1": r.data.metrics["eval/pass_at_1"], "k": k,
            "pass_at_k": r.data.metrics["eval/pass_at_k"], "tasks": int(r.data.metrics["eval/tasks"]), "samples": k,
            "mlflow_run_id": r.info.run_id}


def report(res: dict) -> str:
    base = res["base_eval"]
    runs = []
    for algo in ("grpo", "nexgrpo"):
        r = res["runs"].get(algo)
        if not r:
            continue
        e = r["eval"]
        runs.append([algo, len(r["steps"]), f"{r['steps'][-1]['t']:.0f}", f"{base['pass_at_1']:.3f}",
                     f"{e['pass_at_1']:.3f}", f"{e['pass_at_1'] - base['pass_at_1']:+.3f}", f"{e['pass_at_k']:.3f}",
                     r["counts"]["replay_groups_consumed"], f"`{r['counts']['mlflow_learner_run_id']}`",
                     f"`{e['mlflow_run_id']}`"])
    g = {s["step"]: s for s in res["runs"].get("grpo", {}).get("steps", [])}
    n = {s["step"]: s for s in res["runs"].get("nexgrpo", {}).get("steps", [])}

    def f(x):
        return "" if x is None else f"{x:.3f}"

    steps = []
    for step in sorted(set(g) | set(n)):
        a, b = g.get(step, {}), n.get(step, {})
        retired = b.get("replay/retired_tasks")
        steps.append([step, f(a.get("reward/pass_at_1")), f(b.get("reward/pass_at_1")), f(b.get("replay/share")),
                      f(b.get("replay/negative_confidence")), f(b.get("replay/negative_confidence_refreshed")),
                      "" if retired is None else int(retired)])
    out = md_table(["run", "learner steps", "training s", "held-out pass@1 before", "after", "change",
                    f"pass@{base['k']} after", "replay groups consumed", "MLflow learner run", "MLflow eval run"],
                   runs, "lrrrrrrr")
    out += ["", ("Per step (on-policy batch pass@1; NexGRPO: replay share, replayed negatives' stored confidence, "
                 "refreshed confidence of the b* planned that step):"), ""]
    out += md_table(["step", "GRPO pass@1", "NexGRPO pass@1", "replay share", "b* confidence (stored)",
                     "b* confidence (refreshed)", "retired tasks"], steps, "rrrrrrr")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=1500)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--eval-samples", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=["grpo", "nexgrpo"], default=None)
    ap.add_argument("--tag", default="", help="appended to the run names (a second run of the same seed)")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--report", type=Path, help="re-render the tables of a results file and exit")
    args = ap.parse_args()
    report_or_run(args, lambda: experiment(args), report)


def experiment(args: argparse.Namespace) -> dict:
    """Both runs (or ``--only`` one) and their evaluations, resumed from ``--json-out``: the results."""
    args.home.mkdir(parents=True, exist_ok=True)
    env = dict(home_env(args.home), OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    log = args.home / "experiment.log"
    res = json.loads(args.json_out.read_text()) if args.json_out and args.json_out.exists() else {"runs": {}}
    res.update({"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "started": datetime.now(timezone.utc).isoformat(), "args": {k: str(v) for k, v in vars(args).items()}})
    os.environ.update(REFLEXDB_HOME=str(args.home))
    os.environ.pop("REFLEXDB_DATABASE_URL", None)
    from reflexdb import Store, migrate

    # This process holds the embedded server open: it stops when its last user exits, which would
    # be between the children otherwise.
    store = Store.open(check_schema=False)
    migrate.upgrade(store.engine)
    url = store.url
    cfgs = {}
    for algo in ("grpo", "nexgrpo"):
        path = args.home / f"{algo}{args.tag}.yaml"
        path.write_text(yaml.safe_dump(config(run_name(algo, args), algo, args), sort_keys=False))
        cfgs[algo] = path
    if "base_eval" not in res:
        res["base_eval"] = logged_eval(args.home, f"exp-grpo-s{args.seed}", "base") or logged_eval(
            args.home, run_name("grpo", args), "base")
    if not res.get("base_eval"):
        code, _, out = sh(CLI + ["eval", "-c", str(cfgs["grpo"]), "--checkpoint", "base"], env, log)
        if code:
            raise SystemExit(f"base eval failed; see {log}")
        res["base_eval"] = parse_eval(out)
        print("base:", res["base_eval"], flush=True)
    for algo in ("grpo", "nexgrpo"):
        if args.only and algo != args.only:
            continue
        name = run_name(algo, args)
        with open(args.home / "load.txt", "a") as fh:
            fh.write(f"{algo} start {os.getloadavg()}\n")
        wall = None
        if done_steps(url, name) < args.steps:  # else: trained by an earlier invocation; collect its results
            code, wall, _ = sh(CLI + ["run", str(cfgs[algo]), "--no-eval", "--max-steps", str(args.steps),
                                      "--max-seconds", str(args.max_seconds)], env, log)
            if code:
                raise SystemExit(f"{algo} run failed (exit {code}); see {log}")
        n = done_steps(url, name)
        evaluated = logged_eval(args.home, name, f"v{n}")
        if evaluated is None:
            code, _, out = sh(CLI + ["eval", "-c", str(cfgs[algo]), "--checkpoint", "latest"], env, log)
            if code:
                raise SystemExit(f"{algo} eval failed; see {log}")
            evaluated = parse_eval(out)
        res["runs"][algo] = {"wall_s": wall, "eval": evaluated, "steps": step_metrics(url, name),
                             "counts": counts(url, name), "load_after": os.getloadavg()}
        print(algo, res["runs"][algo]["eval"], flush=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(res, indent=1, default=str))
    res["finished"] = datetime.now(timezone.utc).isoformat()
    if args.json_out:
        args.json_out.write_text(json.dumps(res, indent=1, default=str))
    store.close()
    return res


if __name__ == "__main__":
    main()
