"""Every built-in method end to end as processes, and every kind of collector work killed mid-way.

One parametrised end-to-end test runs ``reflexdb run`` (a collector and a learner process that meet
only in the database; the tiny model; one learner step unless the method needs more; no
evaluation) for each built-in method with a workflow, rows or hooks of its own, and GRPO, then
checks the method's own rows and lineage in SQL; the baselines that are only a loss (LOSS_ONLY)
take their step in process in tests/store/test_learn.py. One
parametrised kill test holds a real ``reflexdb collect`` where each kind of work is in flight (a
plain group inside its transaction, an LTE hint stage, an R3L retry, CLEANER's rescoring), kills it
there with SIGKILL, checks that nothing of the work was written, and lets another collector take
it once its claim's TTL has passed.

The method's inner mechanics (rigged reflections, hint stages with correct rollouts, purified
rows of scripted episodes, replay pairs) are tested in process in tests/store, where a test can
script the model; here the processes and the database are real and the model is random.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml

from reflexdb.config import load_config, parse_config
from tests.processes import REFLEXDB, child_env, kill_when_held, rows

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: What every run shares: the tiny model, small groups and steps, short turns; the collector's waits
#: 1 s long (default 10: a collector waiting for the learner's next version, as it is when the learner
#: stops, noticed the launcher's SIGTERM only when its wait ran out, up to 10 s per run).
SMALL = ["model=tiny", "collector.group_size=4", "collector.tasks_per_batch=2", "collector.sampling.max_new_tokens=8",
         "learner.groups_per_step=2", "learner.micro_batch_size=4", "learner.keep_states=1", "learner.keep_policies=2",
         "tasks.eval_size=2", "learner.eval_samples=2", "collector.progress_every_s=1"]


@dataclass(frozen=True)
class Case:
    example: str
    sets: tuple[str, ...] = ()
    steps: int = 1
    prepare: Callable | None = None  # (store, cfg) before the run starts
    check: Callable | None = None  # (store, metrics of the last step, env, args)
    extra: dict = field(default_factory=dict)


def _metrics(store) -> dict:
    [(m,)] = rows(store, "SELECT metrics FROM learner_steps ORDER BY step DESC LIMIT 1")
    return m


def _loss_finite(store) -> bool:
    return all(loss is not None and math.isfinite(loss) for (loss,) in rows(store, "SELECT loss FROM learner_steps"))


def _consumed_origins(store) -> dict[str, int]:
    return dict(rows(store, "SELECT t.origin, count(*) FROM consumption c JOIN trajectories t ON t.id = c.trajectory_id "
                            "GROUP BY 1"))


def check_plain(store, m, env, args):
    """A loss-only method: fresh groups of base rows, each step's rows consumed, a finite loss."""
    assert rows(store, "SELECT DISTINCT kind FROM groups") == [("fresh",)]
    assert _consumed_origins(store) == {"base": 8}
    assert _loss_finite(store) and m["reward/pass_at_1"] == 0.0


def check_multi_attempt(store, m, env, args):
    """GRPO on episodes of three attempts (the random model is never right), then `eval --attempts`."""
    [(consumed, episodes)] = rows(store, "SELECT count(*), count(*) FILTER (WHERE t.meta->>'attempts' = '3') "
                                         "FROM consumption c JOIN trajectories t ON t.id = c.trajectory_id")
    assert consumed == 8 and episodes == 8
    # no environment token carries loss in any stored episode
    assert rows(store, """
        SELECT count(*) FROM turns u JOIN token_payloads p ON p.trajectory_id = u.trajectory_id,
             generate_series(u.token_start, u.token_end - 1) AS i
        WHERE p.loss_mask[i + 1] <> u.trainable""") == [(0,)]
    assert rows(store, "SELECT count(*) > 0 FROM episode_turns WHERE role = 'user' AND attempt = 1") == [(True,)]
    res = subprocess.run(REFLEXDB + ["eval", "-c", args[0], "--attempts", "3", "--json"] + args[1:], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["pass_at_1"] == 0.0 and out["tasks"] == 2
    assert re.search(r"2 eval tasks x 2 samples \(3 attempts each\)", res.stderr)
    assert rows(store, """SELECT count(*), min((t.meta->>'attempts')::int) FROM trajectories t
                          JOIN groups g ON g.id = t.group_id WHERE g.kind = 'eval' AND g.meta->>'attempts' = '3'""") \
        == [(4, 3)]


def prepare_nexgrpo(store, cfg):
    from tests.methods.nexgrpo.store.test_learn import seed_pools

    seed_pools(store, cfg)


def check_nexgrpo(store, m, env, args):
    """Replay requests posted after steps, filled by the collector, trained; lineage to stored originals."""
    done = rows(store, "SELECT g.kind, g.size FROM replay_requests r JOIN groups g ON g.id = r.group_id "
                       "WHERE r.status = 'done'")
    assert done and all(kind == "replay" and size == 4 for kind, size in done)
    assert rows(store, "SELECT count(DISTINCT c.group_id) >= 1 FROM consumption c JOIN groups g ON g.id = c.group_id "
                       "WHERE g.kind = 'replay'") == [(True,)]
    per_step = rows(store, "SELECT s.step, count(DISTINCT c.group_id) FILTER (WHERE g.kind = 'replay') "
                           "FROM learner_steps s JOIN consumption c ON c.step_id = s.id JOIN groups g ON g.id = c.group_id "
                           "GROUP BY 1 ORDER BY 1")
    assert all(n <= 1 for _, n in per_step)  # at most ⌊α·B⌋ = 1 replay group per step
    # every replayed trajectory traces back to a stored original of the same task
    assert rows(store, "SELECT count(*) FROM trajectories t LEFT JOIN trajectories o ON o.id = t.parent_trajectory_id "
                       "WHERE t.origin = 'replayed' AND (o.id IS NULL OR o.task_id <> t.task_id)") == [(0,)]
    assert rows(store, "SELECT max((metrics->>'replay/share')::float8) FROM learner_steps") == [(0.5,)]
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{Path(env['REFLEXDB_HOME']) / 'mlflow.db'}")
    [exp] = [e for e in client.search_experiments() if e.name == "reflexdb/method-nexgrpo"]
    [run] = client.search_runs([exp.experiment_id])
    for key in ("replay/share", "replay/negative_confidence", "replay/pair_cosine", "replay/retired_tasks",
                "replay/refresh_discard_rate", "replay/negative_confidence_refreshed", "replay/active"):
        assert key in run.data.metrics, key


def check_lte(store, m, env, args):
    """None-pass groups held for their hint stage; the collector ran each stage it claimed (the random
    model solves none, so each ends unsolved and its group trains as it is: lte.unsolved)."""
    stages = rows(store, "SELECT status, mode, n_sampled FROM lte_stages ORDER BY group_id")
    assert stages and any(s[0] == "done" and s[1] == "hint" and s[2] == 4 for s in stages), stages
    assert rows(store, "SELECT count(*) FROM lte_stages WHERE status = 'done' AND completed_at IS NULL") == [(0,)]
    assert "lte/unsolved" in m and m["lte/lte_groups"] == 0.0
    assert rows(store, "SELECT count(*) FROM groups WHERE kind = 'hinted'") == [(0,)]


def check_r3l(store, m, env, args):
    """Reflections under constrained decoding (schema-valid JSON even from a random model), each on a
    base episode of its group; every retry refers to its reflection and its base, of the same task."""
    got = rows(store, "SELECT count(*), count(*) FILTER (WHERE decoding = 'json_schema') FROM reflections")
    assert got[0][0] > 0 and got[0][0] == got[0][1], got
    assert rows(store, """
        SELECT count(*) FROM reflections r JOIN trajectories b ON b.id = r.trajectory_id
        WHERE b.origin <> 'base'""") == [(0,)]
    assert rows(store, """
        SELECT count(*) FROM trajectories t
        LEFT JOIN trajectory_reflections l ON l.trajectory_id = t.id AND l.run_id = t.run_id
        LEFT JOIN reflections r ON r.id = l.reflection_id LEFT JOIN trajectories b ON b.id = t.parent_trajectory_id
        WHERE t.origin = 'guided_retry' AND (r.id IS NULL OR b.id IS NULL OR b.task_id <> t.task_id
                                            OR r.trajectory_id <> b.id)""") == [(0,)]
    assert m["r3l/reflections"] > 0 and _loss_finite(store)


def check_cleaner(store, m, env, args):
    """SAAR episodes in the real sandbox: a DAPO step with cleaner/* metrics; every purified row's
    raw twin is in the retry group of the same task; every tool call is recorded."""
    assert m["cleaner/saar_share"] == 1.0 and math.isfinite(m["cleaner/raw_tool_calls_per_traj"])
    assert rows(store, "SELECT DISTINCT workflow FROM groups") == [("cleaner",)]
    assert rows(store, """
        SELECT count(*) FROM trajectories p LEFT JOIN trajectories r ON r.id = p.parent_trajectory_id
        LEFT JOIN groups g ON g.id = r.group_id
        WHERE p.origin = 'purified' AND (r.origin <> 'raw' OR g.kind <> 'retry' OR r.task_id <> p.task_id)""") == [(0,)]
    assert rows(store, "SELECT count(*) FROM turns WHERE role = 'tool' AND tool_call IS NULL") == [(0,)]


def check_grpo_lambda(store, m, env, args):
    check_plain(store, m, env, args)
    assert "loss/kl" in m and math.isfinite(m["loss/trace_mean"])


METHODS = {
    "grpo": Case("arithmetic-multi-attempt.yaml", check=check_multi_attempt),
    "grpo_lambda": Case("arithmetic-grpo-lambda.yaml", check=check_grpo_lambda),
    "nexgrpo": Case("arithmetic-nexgrpo.yaml", ("tasks.train_size=6", "tasks.eval_size=0", "nexgrpo.conf_low=0.0",
                                                "nexgrpo.start_pass_at_1=0.0", "collector.sampling.max_new_tokens=6",
                                                "learner.lr=0.001"),
                    steps=5, prepare=prepare_nexgrpo, check=check_nexgrpo),
    "lte": Case("arithmetic-lte.yaml", check=check_lte),
    "r3l": Case("arithmetic-r3l.yaml", ("r3l.max_tokens=24", "environment.max_attempts=2"), check=check_r3l),
    "cleaner": Case("arithmetic-cleaner.yaml", ("learner.micro_batch_size=3",), check=check_cleaner),
}


#: The baselines that are a loss and nothing else: grpo's workflow and process plumbing, run above as
#: processes; each takes a real step in process in tests/store/test_learn.py (a process run of each
#: cost about 20 s of CI and tested nothing the grpo run does not).
LOSS_ONLY = ("dr_grpo", "dapo", "gspo", "opmd", "raft")


def test_every_built_in_method_is_tested_here():
    from reflexdb.trainer.method_api import get_method, method_names

    assert sorted([*METHODS, *LOSS_ONLY]) == method_names()
    for name in LOSS_ONLY:  # the grpo workflow and fresh groups, nothing of its own
        assert get_method(name).workflows is get_method("grpo").workflows, name


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_trains_end_to_end_as_processes(method, store, db_url, tmp_path, model_cache):
    case = METHODS[method]
    example = str(EXAMPLES / case.example)
    sets = [f"run=method-{method}", *SMALL, *case.sets]
    args = [example] + [a for s in sets for a in ("--set", s)]
    if case.prepare is not None:
        overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in sets)}
        case.prepare(store, load_config(example, overrides=overrides))
    env = child_env(db_url, tmp_path, model_cache)
    proc = subprocess.run(REFLEXDB + ["run", *args, "--max-steps", str(case.steps), "--no-eval"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run 'method-{method}': {case.steps} learner steps, policy v{case.steps}" in proc.stdout, proc.stdout
    assert rows(store, "SELECT algorithm FROM runs") == [(method,)]
    case.check(store, _metrics(store), env, args)


# ---------------------------------------------------------------- kill -9 mid-work


def _killed_config(method: str) -> dict:
    tiny = {"model": "tiny", "max_staleness": 100, "run": f"kill-{method}"}
    collector = {"group_size": 4, "tasks_per_batch": 1, "claim_ttl_s": 3, "sampling": {"max_new_tokens": 6}}
    return {
        "grpo": {**tiny, "algorithm": "grpo", "tasks": {"train_size": 1, "eval_size": 0}, "collector": collector},
        "lte": {**tiny, "algorithm": "lte", "tasks": {"train_size": 6, "eval_size": 0},
                "collector": {**collector, "group_size": 8, "sampling": {"max_new_tokens": 64}},
                "lte": {"hint_timeout_s": 600}},
        "r3l": {**tiny, "algorithm": "r3l", "tasks": {"train_size": 1, "eval_size": 0}, "collector": collector,
                "environment": {"name": "multi_attempt", "max_attempts": 2}, "r3l": {"max_tokens": 16}},
        "cleaner": {**tiny, "algorithm": "cleaner",
                    "environment": {"name": "tool_python", "timeout_s": 2.0, "cpu_s": 2, "max_tool_calls": 3},
                    "tasks": {"source": "arithmetic", "level": 7, "train_size": 1, "eval_size": 0,
                              "template": "tool_python"},
                    "collector": {**collector, "group_size": 2, "sampling": {"max_new_tokens": 8}}},
    }[method]


def _lte_original(store, data):
    """A none-pass group of the run's first task, so the collector's first work is its hint stage."""
    import numpy as np
    from reflexdb.collector.sources import build_tasks

    from tests.factories import make_group

    cfg = parse_config(data)
    run = store.create_run(cfg.run, algorithm="lte")
    tasks = store.add_tasks(run, build_tasks(cfg.tasks)[0])
    rng = np.random.default_rng(0)
    return store.write_group(make_group(rng, run, tasks[0], n_correct=0, dim=None, P=6, T=5,
                                        response_ids=rng.integers(0, 1000, 5), prompt_ids=rng.integers(0, 1000, 6)))


# method -> (the phase the collector is killed in, the tables that must hold nothing of its work)
KILLS = {
    "grpo": ("write", ("groups", "trajectories", "turns")),  # inside the group's transaction
    "lte": ("hint", ("hints",)),  # a hint stage claimed, nothing sampled
    "r3l": ("retry", ("groups", "trajectories", "reflections")),  # reflections written by the model, not stored
    "cleaner": ("rescore", ("groups", "trajectories", "purifications")),  # episodes purified, not stored
}


@pytest.mark.parametrize("method", list(KILLS))
def test_a_collector_killed_mid_work_leaves_nothing_and_its_work_is_done_again(method, store, db_url, tmp_path,
                                                                                 model_cache, monkeypatch):
    phase, empty = KILLS[method]
    data = _killed_config(method)
    original = _lte_original(store, data) if method == "lte" else None
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    drill_dir = tmp_path / "drill"
    drill_dir.mkdir()
    env = dict(child_env(db_url, tmp_path, model_cache), REFLEXDB_DRILL_DIR=str(drill_dir), REFLEXDB_DRILL_HOLD=phase)
    proc = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg_path), "--name", "doomed"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kill_when_held(proc, drill_dir, phase)
    for table in empty:
        if table in ("groups", "trajectories", "turns") and original is not None:
            continue
        assert rows(store, f"SELECT count(*) FROM {table}") == [(0,)], table
    if method == "lte":
        assert rows(store, "SELECT status, claimed_by FROM lte_stages WHERE group_id = :g", g=original.group_id) == [
            ("claimed", "doomed")]
        claimed = "SELECT extract(epoch FROM claimed_at + interval '3 s' - now()) FROM lte_stages"
    else:
        assert rows(store, "SELECT claimed_by, times_collected FROM tasks WHERE split = 'train'") == [("doomed", 0)]
        claimed = "SELECT extract(epoch FROM claimed_at + interval '3 s' - now()) FROM tasks WHERE claimed_by = 'doomed'"
    [(left,)] = rows(store, claimed)
    time.sleep(max(0.0, float(left)) + 0.3)  # until the dead collector's claim has expired

    from reflexdb.collector.runner import Collector

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "heir"))
    heir = Collector(parse_config({**data, "collector": {**data["collector"], "name": "heir"}}), store,
                     echo=lambda m: None)
    heir.setup()
    if method == "lte":  # the heir takes the stage over and finishes it (the random model solves nothing)
        assert heir._claim_and_collect(heir.workflows, 1)
        assert rows(store, "SELECT status, claimed_by FROM lte_stages WHERE group_id = :g", g=original.group_id) == [
            ("done", "heir")]
        return
    heir.run(max_groups=2 if method == "r3l" else 1)  # R3L's exploration group comes with its retry group
    assert rows(store, "SELECT claimed_by, times_collected FROM tasks WHERE split = 'train'") == [(None, 1)]
    kinds = rows(store, "SELECT kind, collector FROM groups ORDER BY id")
    if method == "cleaner":  # the training group, and the raw twins' group when some episode was purified
        assert kinds in ([("fresh", "heir")], [("fresh", "heir"), ("retry", "heir")])
    else:
        assert kinds == ([("fresh", "heir"), ("retry", "heir")] if method == "r3l" else [("fresh", "heir")])
    if method == "cleaner":  # the purified rows' raw twins, linked
        assert rows(store, "SELECT count(*) FROM trajectories p JOIN trajectories r ON r.id = p.parent_trajectory_id "
                           "WHERE p.origin = 'purified' AND r.origin = 'raw'") == \
            rows(store, "SELECT count(*) FROM trajectories WHERE origin = 'purified'")
    if method == "r3l":  # each retry refers to its reflection and its base episode
        assert rows(store, "SELECT count(*) FROM trajectories t JOIN trajectory_reflections l ON l.trajectory_id = t.id "
                           "JOIN reflections r ON r.id = l.reflection_id WHERE t.origin = 'guided_retry' AND r.trajectory_id = t.parent_trajectory_id") == \
            rows(store, "SELECT count(*) FROM trajectories WHERE origin = 'guided_retry'")
