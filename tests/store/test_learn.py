"""`reflexdb learn` on a real store with the tiny model and real DeepSpeed (CPU, gloo)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from reflexdb import GroupIn, Store, TaskIn, TrajectoryIn, TurnIn
from reflexdb.config import parse_config
from tests.processes import REFLEXDB, child_env, rows

# Model and process tests (marker model): the model's and DeepSpeed's work, the database incidental; CI's
# embedded pass runs them, its external-server pass skips them (.ci/run).
pytestmark = pytest.mark.model


def config_data(**learner) -> dict:
    return {
        "run": "learn-test",
        "model": "tiny",
        "max_staleness": 1,
        "collector": {"group_size": 4, "tasks_per_batch": 2, "sampling": {"max_new_tokens": 12},
                      "progress_every_s": 1, "poll_interval_s": 0.2},
        "learner": {"groups_per_step": 2, "micro_batch_size": 4, "lr": 1e-3, "publish_every": 1,
                    "poll_interval_s": 0.2, **learner},
    }


def write_config(tmp_path, data) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def tiny_group(rng, run: int, task: int, *, version: int = 0, G: int = 4, kind: str = "fresh",
               embedding: bool = False, rewards: list | None = None) -> GroupIn:
    """A group the tiny model can train on: mixed rewards (so GRPO has signal), token ids inside its vocab."""
    trajs = []
    for j in range(G):
        T = int(rng.integers(4, 10))
        trajs.append(TrajectoryIn(
            prompt_ids=rng.integers(0, 1000, 6), response_ids=rng.integers(0, 1000, T),
            logprobs=-rng.random(T).astype(np.float32) * 5,
            reward=float(j % 2) if rewards is None else rewards[j], correct=bool(j % 2),
            turns=[TurnIn("user", "q"), TurnIn("assistant", "a", 0, T)],
            embedding=rng.standard_normal(64).astype(np.float32) if embedding else None))
    return GroupIn(run_id=run, task_id=task, policy_version=version, trajectories=trajs, kind=kind)


def seed_groups(store, run_name: str, n_groups: int, G: int = 4, seed: int = 0, rewards: list | None = None) -> list[int]:
    """``n_groups`` groups of version 0, one task each (with embeddings); ``rewards``: each group's
    G rewards (None: NULL), instead of 0/1."""
    rng = np.random.default_rng(seed)
    run = store.create_run(run_name)
    tasks = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(n_groups)])
    return [store.write_group(tiny_group(rng, run, task, G=G, embedding=True, rewards=rewards)).group_id
            for task in tasks]


# ------------------------------------------------------------------ in-process (DeepSpeed in pytest)


def _learner(store, tmp_path, monkeypatch, *, algorithm: str | None = None, **learner):
    from reflexdb.trainer.learner import Learner

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    data = config_data(**learner)
    data["max_staleness"] = 100
    if algorithm is not None:
        data["algorithm"] = algorithm
    msgs = []
    lr = Learner(parse_config(data), store, echo=msgs.append)
    return lr, msgs


def test_no_groups_waits_and_says_so(store, tmp_path, monkeypatch, model_cache):
    lr, msgs = _learner(store, tmp_path, monkeypatch, wait_log_every_s=0.3)
    lr.setup()
    lr.run(max_seconds=2)
    assert lr.step_no == 0
    assert any("waiting for groups: 0 of 2 eligible" in m for m in msgs)


def test_max_seconds_starts_no_step_after_the_deadline_even_with_groups_ready(store, tmp_path, monkeypatch,
                                                                             model_cache):
    # Groups for 2 steps are waiting; the deadline has passed before the first one could start.
    # (The deadline was once checked only while waiting, so a learner fed by a collector working
    # ahead never stopped on time.)
    import re
    import time

    seed_groups(store, "learn-test", 4)
    lr, msgs = _learner(store, tmp_path, monkeypatch)
    t0 = time.perf_counter()
    lr.setup()
    # max_seconds=0: the deadline is the moment run() starts, so it has passed at the first check
    # (1e-6 was flaky: on a fast machine the check came within the microsecond, CI at d43e1cb)
    lr.run(max_steps=2, max_seconds=0.0)
    assert lr.step_no == 0
    lr.run(max_steps=2)
    assert lr.step_no == 2
    # Where the time went (issue 51), as logged (MLflow gets the same dict as the step's row): each
    # phase since the previous step's metrics, none negative, all together within the wall time
    wall = time.perf_counter() - t0
    phases = ["wait", "read", "forward_backward", "optimizer", "publish"]
    logged = [m for (m,) in rows(store, "SELECT metrics FROM learner_steps ORDER BY step")]
    for m in logged:
        assert min(m[f"perf/seconds_{p}"] for p in phases) >= 0
        assert m["perf/seconds_read"] > 0 and m["perf/seconds_forward_backward"] > 0 and m["perf/seconds_optimizer"] > 0
        assert m["perf/seconds_publish"] > 0  # version 0 (setup) at step 1, step 1's version at step 2
    assert sum(m[f"perf/seconds_{p}"] for m in logged for p in phases) <= wall
    lines = [m for m in msgs if m.startswith("step ")]
    assert len(lines) == 2 and all(re.search(r" \| (wait \d+% )?read \d+% fwd\+bwd \d+% opt \d+% pub \d+%$", line)
                                   for line in lines), lines


def test_the_learner_logs_where_the_collectors_time_went(store, tmp_path, monkeypatch, model_cache):
    """Collectors log nothing to MLflow; their heartbeats store their phase totals (0026) and the
    learner logs the run's sums with each step (issue 51)."""
    from reflexdb import work

    seed_groups(store, "learn-test", 2)
    run = store.run_id("learn-test")
    for name, gen in (("a", 3.0), ("b", 1.0)):
        cid = work.register_collector(store, run, name, engine="fast", model="tiny", policy_version=0)
        work.report_progress(store, cid, policy_version=0, phase_seconds={
            "generate": gen, "score": 0.0, "reward": 0.5, "write": 0.25, "wall": 5.0, "tokens": 800})
    lr, _ = _learner(store, tmp_path, monkeypatch)
    lr.setup()
    lr.run(max_steps=1)
    (m,) = rows(store, "SELECT metrics FROM learner_steps")[0]
    assert (m["collector/seconds_generate"], m["collector/seconds_reward"], m["collector/seconds_write"],
            m["collector/wall_seconds"]) == (4.0, 1.0, 0.5, 10.0)
    assert m["collector/generated_tokens_per_s"] == 1600 / 4.0


def test_nan_loss_skips_and_stops(store, tmp_path, monkeypatch, model_cache):
    import torch
    from reflexdb.trainer.learner import LearnerStopped

    seed_groups(store, "learn-test", 8)
    lr, msgs = _learner(store, tmp_path, monkeypatch, max_bad_steps=2)
    lr.setup()
    before = [p.detach().clone() for p in lr.engine.ds.module.parameters()]
    real = lr.update.specs

    class NanLoss:  # the registered loss, with a NaN loss
        def __init__(self, spec):
            self.spec = spec

        def __getattr__(self, name):
            return getattr(self.spec, name)

        def call(self, *args, **kwargs):
            out = self.spec.call(*args, **kwargs)
            return out._replace(loss=out.loss * float("nan"))

    lr.update.specs = [NanLoss(s) for s in real]
    with pytest.raises(LearnerStopped, match="2 learner steps in a row had a non-finite loss"):
        lr.run(max_steps=5)
    after = list(lr.engine.ds.module.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # the weights never moved
    assert rows(store, "SELECT step, loss FROM learner_steps ORDER BY 1") == [(1, None), (2, None)]
    assert sum("non-finite loss, step skipped" in m for m in msgs) == 2
    lr.update.specs = real
    lr.stopping = False
    lr.bad_in_row = 0
    lr.run(max_steps=3)  # a finite step afterwards trains normally
    assert not all(torch.equal(a, b) for a, b in zip(before, lr.engine.ds.module.parameters()))


@pytest.mark.parametrize("micro_batch_size", [3, 8])
def test_pi_old_from_the_training_forward_equals_a_second_forward(store, tmp_path, monkeypatch, model_cache,
                                                                   micro_batch_size):
    """``pi_old: recompute`` takes π_old from the training forward (detached): the step's weights
    and loss equal those of a separate no-grad forward under the step's starting weights, with
    micro-batches smaller than the batch (3: uneven) and equal to it, non-binary and NULL rewards."""
    import torch

    def one_step(tag: str, explicit: bool):
        ids = seed_groups(store, tag, 2, seed=0, rewards=[0.25, None, 1.0, 0.6])  # the same groups in each run
        monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / tag))
        data = {**config_data(micro_batch_size=micro_batch_size), "run": tag, "max_staleness": 100}
        lr = Learner(parse_config(data), store, echo=lambda m: None)
        lr.setup()
        if explicit:  # the former path: a second forward over the batch, no gradient
            def old_logprobs(batch):
                lp, _ = lr.engine.token_logprobs(batch.input_ids, batch.attention_mask, batch.prompt_lengths,
                                                 batch.response_lengths, grad=False)
                old = batch.behaviour_logprobs.clone()
                old[:, :lp.shape[1]] = lp.float()
                return old, torch.zeros(batch.size, dtype=torch.bool)
            lr.update.old_logprobs = old_logprobs
        else:
            batch = pack(store.read_groups(ids, turns=False), lr.engine.pad_id, origins=store.origins())
            _, fresh = lr.update.old_logprobs(batch)
            assert fresh.all()  # fresh rollouts: π_old comes from the training forward
        result = lr.step(ids)
        return result, [p.detach().clone() for p in lr.engine.ds.module.parameters()]

    from reflexdb.trainer.batch import pack
    from reflexdb.trainer.learner import Learner

    shared, w_shared = one_step("shared", explicit=False)
    second, w_second = one_step("second", explicit=True)
    # ratio 1 on every token either way: loss = -mean(A) over tokens, and the same gradient
    assert shared.metrics["reward/missing"] == 2.0  # one NULL reward per group: no loss on those rows
    assert shared.metrics["loss/ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert shared.loss == pytest.approx(second.loss, abs=1e-6)
    assert shared.metrics["policy/grad_norm"] == pytest.approx(second.metrics["policy/grad_norm"], rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(w_shared, w_second))


def test_micro_batches_by_length_change_no_result(store, tmp_path, monkeypatch, model_cache):
    """The learner orders a step's rows by length before cutting micro-batches (less padding): the
    rows stay whole (ids, lengths, rewards move together) and the step's loss, gradient norm and
    weights equal those of the unordered batch."""
    import torch
    from reflexdb.trainer.batch import Batch, pack
    from reflexdb.trainer.learner import Learner

    def one_step(tag: str, ordered: bool):
        ids = seed_groups(store, tag, 2, seed=1)
        monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / tag))
        if not ordered:
            monkeypatch.setattr(Batch, "by_length", lambda self, ranks=1: self)
        lr = Learner(parse_config({**config_data(micro_batch_size=3), "run": tag, "max_staleness": 100}), store,
                     echo=lambda m: None)
        lr.setup()
        batch = pack(store.read_groups(ids, turns=False), lr.engine.pad_id, origins=store.origins())
        result = lr.step(ids)
        monkeypatch.undo()
        return batch, result, [p.detach().clone() for p in lr.engine.ds.module.parameters()]

    batch, ordered, w_ordered = one_step("ordered", True)
    _, plain, w_plain = one_step("plain", False)
    by = batch.by_length()
    lengths = by.prompt_lengths + by.response_lengths
    assert (lengths[1:] >= lengths[:-1]).all() and sorted(by.trajectory_ids) == sorted(batch.trajectory_ids)
    assert by.trajectory_ids != batch.trajectory_ids  # these lengths do reorder
    where = {t: i for i, t in enumerate(batch.trajectory_ids)}
    for j, t in enumerate(by.trajectory_ids):  # every row moved whole
        i = where[t]
        assert by.rewards[j] == batch.rewards[i] and by.group_index[j] == batch.group_index[i]
        assert torch.equal(by.input_ids[j], batch.input_ids[i])
    assert ordered.loss == pytest.approx(plain.loss, abs=1e-6)
    assert ordered.metrics["policy/grad_norm"] == pytest.approx(plain.metrics["policy/grad_norm"], rel=1e-5)
    # equal up to float summation order (Adam's first step at lr 1e-3 makes that ~5e-7 here)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(w_ordered, w_plain))


def test_learner_packing_on_makes_the_padded_step(store, tmp_path, monkeypatch, model_cache):
    """``learner.packing: on`` (auto is off on CPU) through the whole learner: the step's loss and
    gradient norm are the padded step's; ``auto`` precision is float32 on CPU, and the learner says
    what it chose (tests/unit/test_packing.py checks the gradients themselves)."""
    from reflexdb.trainer.learner import Learner

    steps, said = {}, {}
    for packing in ("auto", "on"):
        ids = seed_groups(store, f"pack-{packing}", 2, seed=1)
        monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / packing))
        msgs: list[str] = []
        lr = Learner(parse_config({**config_data(micro_batch_size=3, packing=packing), "run": f"pack-{packing}",
                                   "max_staleness": 100}), store, echo=msgs.append)
        lr.setup()
        assert lr.engine.settings.dtype == "float32" and lr.engine.packed == (packing == "on")
        steps[packing] = lr.step(ids)
        said[packing] = next(m for m in msgs if m.startswith("learner for run"))
    assert said["auto"].endswith("float32, padded rows") and said["on"].endswith("float32, packed rows")
    assert steps["on"].loss == pytest.approx(steps["auto"].loss, abs=1e-6)
    assert steps["on"].metrics["policy/grad_norm"] == pytest.approx(steps["auto"].metrics["policy/grad_norm"], rel=1e-5)


def test_state_every_publishes_weights_and_resumes_from_the_newest_state(store, tmp_path, monkeypatch,
                                                                          model_cache):
    """``learner.state_every: 3``: versions 0 and 3 carry the learner state, 1, 2 and 4 only weights.
    A learner that dies after v4 resumes from v3's state, rolls back step 4 (its groups trainable
    again) and publishes v3's weights again as v5; a clean stop writes the state it lacks."""
    from reflexdb.trainer.learner import Learner

    seed_groups(store, "learn-test", 12)
    lr, _ = _learner(store, tmp_path, monkeypatch, state_every=3, max_reuse=1)
    lr.setup()
    lr.run(max_steps=4)  # no finish(): as if killed after publishing v4
    versions = rows(store, "SELECT version, step, meta ? 'learner_state', sha256 FROM policy_versions ORDER BY 1")
    assert [v[:3] for v in versions] == [(0, 0, True), (1, 1, False), (2, 2, False), (3, 3, True), (4, 4, False)]
    states = tmp_path / "home" / "checkpoints" / f"learn-test.r{lr.run_id}" / "states"
    assert sorted(p.name for p in states.iterdir()) == ["v0", "v3"]
    [(step4_groups,)] = rows(store, "SELECT array_agg(DISTINCT c.group_id ORDER BY c.group_id) FROM consumption c "
                                    "JOIN learner_steps s ON s.id = c.step_id WHERE s.step = 4")
    assert len(step4_groups) == 2

    msgs: list[str] = []
    again = Learner(lr.cfg, store, echo=msgs.append)
    again.setup()
    assert again.step_no == 3 and again.version == 5
    assert any("at step 3 (learner state of policy v3); rolled back 1" in m for m in msgs)
    assert any("policies v4..v4 have no learner state" in m for m in msgs)
    assert rows(store, "SELECT step FROM learner_steps ORDER BY 1") == [(1,), (2,), (3,)]
    assert rows(store, f"SELECT count(*) FROM trajectories WHERE group_id IN ({', '.join(map(str, step4_groups))}) "
                       "AND times_sampled > 0") == [(0,)]  # nothing of the rolled-back step counts as used
    v5 = rows(store, "SELECT step, meta ? 'learner_state', sha256 FROM policy_versions WHERE version = 5")
    assert v5 == [(3, False, versions[3][3])]  # v3's weights, byte for byte
    again.run(max_steps=4)  # trains step 4 again, on groups the rolled-back step had consumed
    assert rows(store, "SELECT max(step) FROM learner_steps") == [(4,)]
    assert again.version == 6 and not again.checkpoints.last_has_state  # v5 and v6: two publishes since v3's state
    again.finish()  # a clean stop: nothing new to publish, but v6 gets its learner state
    assert rows(store, "SELECT version, meta ? 'learner_state' FROM policy_versions WHERE version >= 5 "
                       "ORDER BY 1") == [(5, False), (6, True)]
    assert sorted(p.name for p in states.iterdir()) == ["v3", "v6"]  # keep_states 2
    third = Learner(lr.cfg, store, echo=msgs.append)
    third.setup()
    assert (third.step_no, third.version) == (4, 6)
    assert any("at step 4 (learner state of policy v6); rolled back 0" in m for m in msgs)


def test_missing_state_on_resume_is_a_clear_error(store, tmp_path, monkeypatch, model_cache):
    import shutil

    from reflexdb.errors import ReflexdbError

    seed_groups(store, "learn-test", 4)
    lr, _ = _learner(store, tmp_path, monkeypatch)
    lr.setup()
    lr.run(max_steps=1)  # publishes v1 (publish_every 1)
    [(states, tag)] = rows(store, "SELECT meta->>'learner_state', meta->>'state_tag' FROM policy_versions "
                                  "WHERE version = 1")
    shutil.rmtree(Path(states) / tag)
    before = rows(store, "SELECT version, step FROM policy_versions ORDER BY 1"), rows(store, "SELECT step FROM learner_steps")
    lr2, _ = _learner(store, tmp_path, monkeypatch)
    with pytest.raises(ReflexdbError, match="learner state of policy v1 .* is missing. Nothing was changed"):
        lr2.setup()
    after = rows(store, "SELECT version, step FROM policy_versions ORDER BY 1"), rows(store, "SELECT step FROM learner_steps")
    assert before == after


def _learn_once(tmp_path, name, db_url, model_cache, launcher):
    """Seed the same groups into a fresh run and take one learner step; return the v1 weights."""
    from safetensors.torch import load_file

    store = Store.open(db_url)
    seed_groups(store, name, 2, seed=7)
    data = config_data(publish_every=1, micro_batch_size=2)
    data.update(run=name, max_staleness=100)
    (tmp_path / name).mkdir()
    cfg = write_config(tmp_path / name, data)
    env = child_env(db_url, tmp_path / name, model_cache)
    proc = subprocess.run(launcher + ["learn", "-c", str(cfg), "--max-steps", "1"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [(uri,)] = rows(store, "SELECT p.checkpoint_uri FROM policy_versions p JOIN runs r ON r.id = p.run_id "
                           "WHERE r.name = :n AND p.version = 1", n=name)
    steps = rows(store, "SELECT count(*) FROM learner_steps s JOIN runs r ON r.id = s.run_id WHERE r.name = :n",
                 n=name)
    # what the step used at each token (learner.record_token_signals, on by default), in the rows' order
    signals = [tuple(bytes(x) if x is not None else None for x in r) for r in rows(
        store, "SELECT g.advantage, g.log_ratio, g.clipped, g.entropy FROM token_signals g JOIN runs r ON r.id = g.run_id "
               "WHERE r.name = :n ORDER BY g.trajectory_id", n=name)]
    store.close()
    return load_file(str(Path(uri.removeprefix("file://")) / "model.safetensors")), steps + [signals]


def test_rows_ordered_by_length_are_dealt_evenly_to_the_ranks():
    """With ranks, the rows shortest first are dealt to the ranks' contiguous shares in turn:
    lengths 1..7 (B = 7, 2 ranks: shares of 4 and 3) -> rank 0 gets 1, 3, 5, 7; rank 1 gets
    2, 4, 6; 3 ranks (shares of 3, 3, 1) -> 1, 4, 6 | 2, 5, 7 | 3."""
    import torch
    from reflexdb.trainer.batch import Batch

    lengths = torch.tensor([5, 1, 7, 3, 2, 6, 4])
    z = torch.zeros(7, dtype=torch.int64)
    b = Batch(group_ids=[], trajectory_ids=[int(x) for x in lengths], group_index=z, rewards=z.float(),
              correct=z.bool(), valid=~z.bool(), truncated=z.bool(), input_ids=z[:, None], attention_mask=z[:, None],
              prompt_lengths=z, response_lengths=lengths, response_mask=torch.ones(7, 1, dtype=torch.bool),
              behaviour_logprobs=torch.zeros(7, 1), policy_versions=z, confidence=z.float(),
              group_versions=[], group_kinds=[], origins=["base"] * 7)
    assert b.by_length().trajectory_ids == [1, 2, 3, 4, 5, 6, 7]
    assert b.by_length(2).trajectory_ids == [1, 3, 5, 7, 2, 4, 6]
    assert b.by_length(3).trajectory_ids == [1, 4, 6, 2, 5, 7, 3]
    assert b.by_length(2).response_lengths.tolist() == [1, 3, 5, 7, 2, 4, 6]  # tensors move with the ids


def test_world_size_2_matches_one_process(db_url, tmp_path, model_cache):
    """DeepSpeed data parallel on CPU (gloo): two ranks take the same step one process takes."""
    import torch
    from reflexdb.models import resolve_model
    from safetensors.torch import load_file

    one, steps1 = _learn_once(tmp_path, "ws1", db_url, model_cache, REFLEXDB)
    import socket

    for attempt in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]  # free now; a busy machine can take it before torchrun does
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(port), "-m", "reflexdb.cli.main"]
        try:
            two, steps2 = _learn_once(tmp_path, f"ws2-{attempt}", db_url, model_cache, torchrun)
            break
        except AssertionError as exc:
            if "EADDRINUSE" not in str(exc) or attempt == 2:
                raise
    *steps1, signals1 = steps1
    *steps2, signals2 = steps2
    assert steps1 == steps2 == [(1,)]  # rank 0 alone recorded the step
    # every rank's rows' token signals gathered to rank 0 and written once: the same rows as one process
    # wrote, the same advantages and clip flags, entropies and log-ratios within float16 and sum order
    assert len(signals1) == len(signals2) == 2 * 4  # 2 groups of 4, every row trained
    for a, b in zip(signals1, signals2):
        assert a[0] == b[0] and a[2] == b[2]
        for k in (1, 3):
            x, y = np.frombuffer(a[k], np.float16).astype(np.float32), np.frombuffer(b[k], np.float16).astype(np.float32)
            assert x.shape == y.shape and np.allclose(x, y, atol=2e-3, rtol=2e-3), k
    base = load_file(str(Path(resolve_model("tiny")) / "model.safetensors"))
    assert one.keys() == two.keys()
    moved = 0.0
    for k in one:
        # AdamW's first step moves a weight by lr·g/(|g| + eps) (lr = 1e-3): where a gradient is near eps
        # (1e-8), the order of float sums (one process, or two ranks and an all-reduce; the head's
        # chunks) shows as a few percent of lr; a wrong data-parallel step would differ by about lr
        assert torch.allclose(one[k], two[k], atol=5e-5, rtol=1e-4), (k, float((one[k] - two[k]).abs().max()))
        moved = max(moved, float((one[k] - base[k]).abs().max()))
    assert moved > 1e-5  # the step did change the weights


def test_grpo_lambda_trains_with_its_reference_model(store, tmp_path, monkeypatch, model_cache):
    seed_groups(store, "learn-test", 2)
    lr, _ = _learner(store, tmp_path, monkeypatch, loss="grpo_lambda")
    lr.setup()
    assert lr.ref is not None  # GRPO-λ's default β = 0.04 needs the frozen base model
    result = lr.step(eligible_ids(store, lr.run_id))
    assert not result.skipped and math.isfinite(result.loss)
    assert "loss/kl" in result.metrics and "loss/trace_mean" in result.metrics
    assert math.isfinite(result.metrics["policy/grad_norm"]) and result.metrics["policy/grad_norm"] > 0


def eligible_ids(store, run_id):
    from reflexdb.trainer.batch import eligible_group_ids

    return eligible_group_ids(store, run_id, 2).group_ids


@pytest.mark.parametrize("algorithm", ["dr_grpo", "dapo", "gspo", "opmd", "raft"])
def test_each_loss_only_baseline_takes_a_step_on_the_store(algorithm, store, tmp_path, monkeypatch, model_cache):
    """The baselines that are a loss and nothing else (the grpo workflow, fresh groups of base rows):
    one real DeepSpeed step each, chosen by ``algorithm`` as a user writes it, with the rows consumed
    and a finite loss. Their process plumbing is grpo's, which tests/e2e/test_methods.py runs as
    processes; their losses' arithmetic is in tests/unit/test_losses.py."""
    seed_groups(store, "learn-test", 2)
    lr, _ = _learner(store, tmp_path, monkeypatch, algorithm=algorithm)
    lr.setup()
    assert lr.method.name == algorithm
    result = lr.step(eligible_ids(store, lr.run_id))
    assert not result.skipped and math.isfinite(result.loss)
    assert rows(store, "SELECT count(*) FROM consumption") == [(8,)]
    assert math.isfinite(result.metrics["policy/grad_norm"])
    if algorithm == "raft":
        assert result.metrics["loss/nll"] > 0


def test_a_background_publish_writes_its_steps_weights_and_records_them_after_the_files(store, tmp_path, monkeypatch,
                                                                                       model_cache):
    """``learner.publish_in_background`` (the default): a weights-only publish copies the weights
    and returns while the writer thread writes them; the row comes after the files, the file holds
    the weights of the publish even if training changes them meanwhile, tied weights are written
    once (as a foreground publish writes them), and one write is in flight at a time."""
    import threading

    import torch
    from safetensors import safe_open

    lr, msgs = _learner(store, tmp_path, monkeypatch, state_every=100)
    lr.setup()  # v0, with the learner state: in the foreground
    ck = lr.checkpoints
    assert ck.background and ck._pending is None
    release, seen = threading.Event(), {}
    real = lr.engine.export_hf

    def held_export(out, state_dict=None):
        seen.update(thread=threading.current_thread().name, snapshot=state_dict is not None)
        assert release.wait(60)
        return real(out, state_dict=state_dict)

    monkeypatch.setattr(lr.engine, "export_hf", held_export)
    module = lr.engine.ds.module
    at_publish = {k: v.detach().clone() for k, v in module.state_dict().items()}
    assert ck.publish(1, state=False) == 1 and ck.version == 1  # returned with the write held
    assert rows(store, "SELECT version FROM policy_versions ORDER BY 1") == [(0,)]  # no row before the files
    with torch.no_grad():  # training goes on: the weights change under the write
        for p in module.parameters():
            p.add_(1.0)
    release.set()
    ck.wait()
    assert seen == {"thread": seen["thread"], "snapshot": True} and seen["thread"].startswith("publish")
    assert rows(store, "SELECT version, step FROM policy_versions ORDER BY 1") == [(0, 0), (1, 1)]
    assert any(m.startswith("published policy v1 at step 1") and m.endswith("in the background") for m in msgs)
    [v1] = (lr.ckpt_dir / "v1").glob("*.safetensors")
    [v0] = (lr.ckpt_dir / "v0").glob("*.safetensors")
    with safe_open(str(v1), "pt") as f1, safe_open(str(v0), "pt") as f0:
        assert sorted(f1.keys()) == sorted(f0.keys())  # tied weights once, as in the foreground
        for k in f1.keys():
            assert torch.equal(f1.get_tensor(k), at_publish[k].cpu())
    # the next publish waits for the one in flight before it starts
    release.clear()
    ck.publish(2, state=False)
    first = ck._pending
    threading.Timer(0.5, release.set).start()
    ck.publish(3, state=False)
    assert first.done()
    ck.close()
    assert rows(store, "SELECT version FROM policy_versions ORDER BY 1") == [(0,), (1,), (2,), (3,)]


def test_waiting_with_groups_that_are_not_eligible_blocks_instead_of_spinning(store, tmp_path, monkeypatch,
                                                                             model_cache):
    """Every group consumed (``max_reuse: 1``): the groups exist but none is eligible. The wait is
    for groups newer than the newest the choice saw, so it blocks until the poll interval; it once
    waited for groups newer than the newest *eligible* one (none: id 0), which every existing group
    is, and spun: 234 waits a second, each on a new connection, all the while the learner waited
    (a profile of `reflexdb learn`, 2026-11-28)."""
    seed_groups(store, "learn-test", 4)
    lr, msgs = _learner(store, tmp_path, monkeypatch, max_reuse=1, poll_interval_s=0.5)
    lr.setup()
    lr.run(max_steps=2)  # 2 groups a step: all 4 consumed
    waits = []
    real = lr.store.wait_for_groups
    monkeypatch.setattr(lr.store, "wait_for_groups", lambda *a, **k: waits.append(a) or real(*a, **k))
    lr.run(max_seconds=2.0)
    assert lr.step_no == 2
    assert 2 <= len(waits) <= 6, len(waits)  # about one per 0.5 s poll
    [(_, after)] = set(waits)
    assert after == store.newest_group_id(lr.run_id) > 0
