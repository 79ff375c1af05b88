"""The README's quickstart in a short mode, end to end, with the real SmolLM2-135M-Instruct:

    reflexdb run examples/arithmetic-grpo.yaml --max-steps 3 --set ... (a small batch)

It evaluates the base model, trains with a collector and a learner process, evaluates again, and
prints where to look. Checked: policy versions published and reloaded by the collector, both
evaluations stored as eval groups of the run, the collector stopped with no claim left, every
consumed trajectory traceable to its group, policy version and step, the MLflow run holding the
documented metrics, and the SQL queries it suggests running. (This is also the test of `reflexdb run`
starting both processes and evaluating before and after: tests/e2e/test_learn.py ran the same on
the tiny model before, one `reflexdb run` more for the same checks.)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.processes import REFLEXDB, child_env, rows

ROOT = Path(__file__).parents[2]
SHORT = ["collector.group_size=4", "collector.tasks_per_batch=1", "collector.sampling.max_new_tokens=12",
         "learner.groups_per_step=1", "learner.micro_batch_size=4", "learner.eval_samples=2", "tasks.eval_size=2",
         "learner.keep_states=1", "learner.keep_policies=2", "run=quickstart-short",
         # the collector's waits 1 s long, not 10: waiting for the learner's next version when the learner
         # stops, it notices the launcher's SIGTERM only when its wait runs out
         "collector.progress_every_s=1"]


def documented_metrics() -> set[str]:
    """The per-step learner metrics of docs/metrics.md's first table (GRPO-λ-only ones left out)."""
    text = (ROOT / "docs" / "metrics.md").read_text().split(" also log, per step")[0]
    keys = set(re.findall(r"^\| `([a-z_]+/[a-z_0-9]+)`", text, re.M))
    keys |= set(re.findall(r"^\| `[a-z_]+/[a-z_0-9]+`, `([a-z_]+/[a-z_0-9]+)`", text, re.M))
    return keys - {"loss/trace_mean", "loss/adv_clamped_frac"}


def test_quickstart_short_mode_end_to_end(store, db_url, tmp_path, model_cache):
    env = child_env(db_url, tmp_path, model_cache)
    cmd = REFLEXDB + ["run", str(ROOT / "examples" / "arithmetic-grpo.yaml"), "--max-steps", "3"]
    for s in SHORT:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-4000:]
    # It says how it went and where to look.
    assert "run 'quickstart-short': 3 learner steps, policy v3" in out
    m = re.search(r"held-out pass@1 \(2 eval tasks x 2 samples\): base ([\d.]+) -> v3 ([\d.]+) \(([+-][\d.]+) points\)",
                  out)
    assert m, out
    assert "reflexdb ui" in out
    queries = re.findall(r'^  reflexdb sql "(.+)"$', out, re.M)
    assert len(queries) == 3
    # Live progress from both processes (steps, reward, pass@1, trajectories/s, version, staleness).
    assert re.search(r"\[learn\] step 3/3 \| loss .* reward .* pass@1 .* staleness .* \| v2 \| [\d.]+ traj/s", err)
    assert re.search(r"\[collect\] policy v\d+ \| groups \d+ \| trajectories \d+ \([\d.]+/s\)", err)
    # Policy versions 0..3 published; the collector reloaded the first two new ones.
    assert rows(store, "SELECT version, step FROM policy_versions ORDER BY 1") == [(0, 0), (1, 1), (2, 2), (3, 3)]
    loaded = {int(v) for v in re.findall(r"loaded policy v(\d+)", err)}
    assert {1, 2} <= loaded, err[-3000:]
    assert rows(store, "SELECT count(DISTINCT policy_version) >= 3 FROM groups WHERE kind = 'fresh'") == [(True,)]
    # Evaluated before (base) and after (v3), both as eval groups of the run; the collector stopped
    # cleanly and left no claim behind.
    assert rows(store, "SELECT meta->>'label', count(*) FROM groups WHERE kind = 'eval' GROUP BY 1 ORDER BY 1") == [
        ("base", 2), ("v3", 2)]
    assert rows(store, "SELECT status FROM collectors") == [("stopped",)]
    assert rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]
    # Every consumed trajectory traces to its group, the policy version that produced it, and its step.
    traced = rows(store, """
        SELECT count(*), count(g.id), count(s.id), bool_and(t.policy_version = g.policy_version),
               bool_and(s.policy_version - g.policy_version BETWEEN 0 AND 1), count(DISTINCT s.step)
        FROM consumption c JOIN trajectories t ON t.id = c.trajectory_id JOIN groups g ON g.id = t.group_id
        JOIN learner_steps s ON s.id = c.step_id""")
    assert traced == [(12, 12, 12, True, True, 3)]  # 3 steps x 1 group x 4 trajectories
    # The MLflow run holds the documented metrics; the evaluations have their own runs.
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    [exp] = [e for e in client.search_experiments() if e.name == "reflexdb/quickstart-short"]
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    learner = runs["quickstart-short-learner"]
    missing = documented_metrics() - set(learner.data.metrics)
    assert not missing, missing
    assert len(client.get_metric_history(learner.info.run_id, "reward/pass_at_1")) == 3
    for label in ("base", "v3"):
        assert "eval/pass_at_1" in runs[f"quickstart-short-eval-{label}"].data.metrics
    # ... and the learner's run shows held-out pass@1 too, before (step 0) and after (step 3)
    assert [m.step for m in client.get_metric_history(learner.info.run_id, "eval/pass_at_1")] == [0, 3]
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"
    # A clean run prints no library chatter: no warnings, no deprecations, no library progress bars.
    chatter = [line for line in err.splitlines()
               if re.search(r"Warning|deprecated|built successfully|it/s\]|Converting and de-quantizing", line)]
    assert not chatter, chatter
    # The suggested queries run.
    for q in queries:
        res = subprocess.run(REFLEXDB + ["sql", q], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and re.search(r"\(\d+ rows?\)", res.stdout), res.stderr
