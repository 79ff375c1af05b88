"""`reflexdb collect` on a real store with the tiny random model (processes where it matters)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from reflexdb.config import parse_config
from tests.processes import rows

# Model and process tests (marker model): the model's and DeepSpeed's work, the database incidental; CI's
# embedded pass runs them, its external-server pass skips them (.ci/run).
pytestmark = pytest.mark.model


def write_config(tmp_path, **collector) -> Path:
    cfg = {
        "run": "collect-test",
        "model": "tiny",
        "collector": {"group_size": 4, "sampling": {"max_new_tokens": 12}, "progress_every_s": 0.5,
                      "poll_interval_s": 0.2, **collector},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def assert_only_complete_groups(store, size):
    bad = rows(store, "SELECT g.id, g.size, count(t.id) FROM groups g LEFT JOIN trajectories t ON t.group_id = g.id "
                      "LEFT JOIN token_payloads p ON p.trajectory_id = t.id "
                      "GROUP BY g.id HAVING count(t.id) <> g.size OR count(p.trajectory_id) <> g.size "
                      "OR g.size <> :s", s=size)
    assert bad == []


# ---------------------------------------------------------------- in-process (one tiny engine)


@pytest.fixture(scope="module")
def tiny_engine(model_cache):
    from reflexdb.collector.engines import make_engine
    from reflexdb.models import resolve_model

    return make_engine("hf", model=resolve_model("tiny"), device="cpu")


def _collector(cfg_data, store, engine):
    from reflexdb.collector.runner import Collector

    cfg = parse_config({"run": "inproc", "model": "tiny", **cfg_data})
    c = Collector(cfg, store, engine, echo=lambda msg: None)
    c.setup()
    return c


def test_the_fast_engine_collects_through_the_config(store):
    """`collector.engine: fast` (issue 51) builds the fast engine and every row it samples is stored
    as the hf engine's are: token ids with one behaviour log-prob each, an embedding of the model's
    hidden size, a finish reason; 3 tasks x 4 samples through one call, more rows than its slots."""
    from reflexdb.collector.engines.fast import FastEngine

    c = _collector({"collector": {"engine": "fast", "group_size": 4, "tasks_per_batch": 3,
                                  "sampling": {"max_new_tokens": 6}}}, store, None)
    c.engine.max_batch_size = 5  # continuous admission: 12 rows through 5 slots
    assert isinstance(c.engine, FastEngine)
    c.run(max_groups=3)
    assert rows(store, "SELECT count(*) FROM groups") == [(3,)]
    got = rows(store, "SELECT cardinality(response_ids), cardinality(logprobs) FROM token_payloads")
    assert len(got) == 12 and all(n == m and 0 < n <= 6 for n, m in got)
    assert rows(store, "SELECT count(*), min(dim), max(dim) FROM embeddings") == [(12, 64, 64)]
    assert {r for (r,) in rows(store, "SELECT finish_reason FROM trajectories")} <= {"stop", "length"}
    assert c.engine.steps > 0
    # where its time went, stored by the heartbeat (0026) for the learner to log
    (phases,) = rows(store, "SELECT phase_seconds FROM collectors")[0]
    assert set(phases) == {"generate", "score", "reward", "write", "wall", "tokens"}
    assert phases["generate"] > 0 and phases["tokens"] == c.stats.tokens and \
        sum(phases[p] for p in ("generate", "score", "reward", "write")) <= phases["wall"] + 0.01


def test_reward_function_errors_are_stored_not_raised(store, tiny_engine):
    from reflexdb.collector.rewards import register_reward

    def broken(response, task):
        raise ZeroDivisionError("reward blew up")

    register_reward("test_broken", broken, replace=True)
    c = _collector({"collector": {"group_size": 3, "reward": "test_broken", "sampling": {"max_new_tokens": 4}}},
                   store, tiny_engine)
    stats = c.run(max_groups=1)
    assert stats.groups == 1 and stats.reward_errors == 3
    got = rows(store, "SELECT reward, error FROM failures")
    assert got == [(None, "ZeroDivisionError: reward blew up")] * 3
    assert rows(store, "SELECT reward_errors FROM collectors") == [(3,)]


def test_a_reward_past_its_deadline_scores_0_is_recorded_and_the_collector_goes_on(store, tiny_engine, tmp_path):
    """Issue 50: a reward function that never returns (here a loop; in the wild sympy on a power
    tower, or a user's bug) is stopped at collector.reward_timeout_s, the answer scores 0 with
    ``RewardTimeout`` on its row, it is counted, and the next calls and groups go on."""
    import time

    from reflexdb.collector.rewards import RewardResult, register_reward

    marker = tmp_path / "hung"

    def hangs_once(response, truth):
        if not marker.exists():  # the first call (in whichever process) hangs
            marker.touch()
            while True:
                pass
        return RewardResult(0.5, False, "x")

    register_reward("test_hangs_once", hangs_once, replace=True)
    c = _collector({"collector": {"group_size": 2, "reward": "test_hangs_once", "reward_timeout_s": 1,
                                  "sampling": {"max_new_tokens": 4}}}, store, tiny_engine)
    t0 = time.monotonic()
    stats = c.run(max_groups=2)
    assert stats.groups == 2 and stats.unverified_rewards == 1 and stats.reward_errors == 1
    assert time.monotonic() - t0 < 60  # one deadline of 1 s, not a hang
    got = sorted(rows(store, "SELECT reward, correct, left(error, 15) FROM trajectories"), key=str)
    assert got == [(0.0, False, "RewardTimeout: ")] + [(0.5, False, None)] * 3
    assert rows(store, "SELECT unverified_rewards, reward_errors FROM collectors") == [(1, 1)]
    from tests.store.test_cookbook import QUERIES, substitute  # the cookbook's query finds it

    [(kind, reason, n, tasks, _)] = rows(store, substitute(QUERIES["Rewards scored 0 without a verdict"],
                                                           {"run": c.cfg.run}))
    assert (kind, n, tasks) == ("RewardTimeout", 1, 1) and "deadline of 1 s" in reason


def test_a_response_that_decodes_to_nul_is_stored(store, tiny_engine):
    # The tiny random model once sampled a token that decodes to NUL: the collector stopped with
    # "contains a NUL character" (CI). The group is stored, token ids exact, U+FFFD in the text
    # (Sample replaces it for every engine, so eval is covered too).
    import dataclasses

    import numpy as np
    from reflexdb.collector.engines.base import Sample

    e = np.zeros(0, np.float32)
    assert Sample(e, e, e, "stop", "x\x00y\x00", e).text == "x\ufffdy\ufffd"

    class NulEngine:
        def __getattr__(self, name):
            return getattr(tiny_engine, name)

        def generate(self, prompts, n=1, params=None):
            out = tiny_engine.generate(prompts, n, params)
            return [[dataclasses.replace(s, text="a\x00b") for s in ss] for ss in out]

    c = _collector({"collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}}}, store, NulEngine())
    stats = c.run(max_groups=1)
    assert stats.groups == 1
    got = rows(store, "SELECT t.text FROM turns t WHERE t.role = 'assistant'")
    assert got == [("a\ufffdb",)] * 2
    assert all(n > 0 for (n,) in rows(store, "SELECT cardinality(response_ids) FROM token_payloads"))


def test_skipped_dataset_rows_are_counted(store, tiny_engine, tmp_path, caplog):
    data = tmp_path / "mini.jsonl"
    data.write_text('{"question": "What is 1+1?", "answer": "#### 2"}\n'
                    '{"question": "no answer field"}\n'
                    'not json\n'
                    '{"question": "What is 2+2?", "answer": "#### 4"}\n')
    c = _collector({"tasks": {"source": "file", "path": str(data), "eval_size": 0},
                    "collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}}}, store, tiny_engine)
    assert c.stats.skipped_rows == 2
    assert f"{data}:2: skipped row" in caplog.text and f"{data}:3: skipped row" in caplog.text
    assert rows(store, "SELECT skipped_rows FROM collectors") == [(2,)]
    assert rows(store, "SELECT count(*) FROM tasks") == [(2,)]


def test_admission_control_waits_for_the_learner(store, tiny_engine):
    # eta 0, 2 groups per step, a version per step: version 0 may only make groups 0 and 1.
    c = _collector({"max_staleness": 0, "learner": {"groups_per_step": 2, "publish_every": 1},
                    "collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}, "progress_every_s": 0.3,
                                  "poll_interval_s": 0.1}}, store, tiny_engine)
    msgs = []
    c.echo = msgs.append
    c.run(max_seconds=10)  # generous: two groups take seconds on a loaded machine
    assert rows(store, "SELECT count(*) FROM groups") == [(2,)]
    assert any("waiting for policy v1" in m for m in msgs)


def test_admission_uses_the_max_staleness_the_learner_published_and_says_when_the_config_differs(
        store, tiny_engine):
    """Issue 60, item 3: the bound is the run's (``learner.max_staleness`` in run_settings, which the
    views and the learner enforce), like the three settings beside it; this collector's config only
    counts while nothing is published, and a config that disagrees is said in one line."""
    from reflexdb.collector.runner import Collector
    from tests.factories import make_group

    cfg = parse_config({"run": "inproc", "model": "tiny", "max_staleness": 0,
                        "learner": {"groups_per_step": 2, "publish_every": 1},
                        "collector": {"group_size": 2, "progress_every_s": 0.001, "poll_interval_s": 0.05}})
    msgs: list[str] = []
    c = Collector(cfg, store, tiny_engine, echo=msgs.append)
    c.setup()
    assert not any("max_staleness" in m for m in msgs)  # nothing published yet: the config's bound, silently
    [task] = rows(store, "SELECT id FROM tasks LIMIT 1")[0]
    rng = np.random.default_rng(0)
    for _ in range(2):
        store.write_group(make_group(rng, c.run_id, task, size=2))
    assert c._admitted(wait_s=0.05) == 0  # eta 0: group 2 (step 1, v1) waits for v1
    assert msgs[-1] == "waiting for policy v1: group 2 would be 1 versions stale when consumed (max_staleness 0)"

    store.set_settings(c.run_id, {"learner.max_staleness": 1})  # what the learner publishes at start
    assert c._admitted(wait_s=0.05) == 2  # groups 2 and 3 (step 1, v1) are within the run's bound
    said = [m for m in msgs if "differs" in m]
    assert said == ["max_staleness 0 in this collector's config differs from the run's learner.max_staleness 1, "
                    "which the learner published: admission control uses 1"]
    for _ in range(2):
        store.write_group(make_group(rng, c.run_id, task, size=2))
    assert c._admitted(wait_s=0.05) == 0
    assert msgs[-1] == "waiting for policy v1: group 4 would be 2 versions stale when consumed (max_staleness 1)"
    assert len([m for m in msgs if "differs" in m]) == 1  # said once

    msgs.clear()  # a collector started after the learner says it at its start
    again = Collector(cfg, store, tiny_engine, echo=msgs.append)
    again.setup()
    assert [m for m in msgs if "differs" in m] == said


def test_reload_picks_up_published_weights(store, tiny_engine, tmp_path, model_cache):
    import re
    import time

    import torch
    from reflexdb.models import resolve_model
    from transformers import AutoModelForCausalLM

    src = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    ckpt = tmp_path / "v1"
    model.save_pretrained(ckpt)
    t0 = time.perf_counter()
    c = _collector({"collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}}}, store, tiny_engine)
    c.run(max_groups=1)
    store.publish_policy(c.run_id, 1, f"file://{ckpt}", step=1)
    msgs = []
    c.echo = msgs.append
    c.run(max_groups=2)
    assert any("loaded policy v1" in m for m in msgs)
    assert rows(store, "SELECT policy_version, count(*) FROM groups GROUP BY 1 ORDER BY 1") == [(0, 1), (1, 1)]
    assert rows(store, "SELECT DISTINCT policy_version FROM collectors") == [(1,)]
    # Where the time went (issue 51): each phase's seconds, none negative, together within the wall
    # time (the reload is in no phase); every token sampled was written (no refusals here)
    m = c.metrics()
    phases = [m[f"collector/seconds_{p}"] for p in ("generate", "score", "reward", "write")]
    assert min(phases) >= 0 and m["collector/seconds_generate"] > 0 and m["collector/seconds_reward"] > 0 \
        and m["collector/seconds_write"] > 0 and m["collector/seconds_score"] == 0  # no scoring pass in GRPO
    assert sum(phases) <= m["collector/wall_seconds"] <= time.perf_counter() - t0
    assert m["collector/generated_tokens"] == c.stats.tokens > 0
    assert m["collector/generated_tokens_per_s"] == c.stats.tokens / m["collector/seconds_generate"]
    assert re.search(r" \| gen \d+% rew \d+% write \d+%$", msgs[-1]), msgs[-1]  # the stopped line
    tiny_engine.load_weights(src)  # leave the shared engine as it was


# ---------------------------------------------------------------- versions read in place (issue 62)


def _version(tmp_path, src, k: int, *, shards: bool = True) -> tuple:
    """Version ``k`` of the tiny model as the learner writes one: its weights moved by ``k``, in
    bfloat16 shards with their index and a manifest.json; ``(directory, sha256, manifest sha256)``."""
    import torch
    from reflexdb import storage
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * k)
    d = tmp_path / "ckpt" / f"v{k}"
    model.to(torch.bfloat16).save_pretrained(d, max_shard_size="60KB" if shards else "50GB")
    return d, *storage.write_manifest(d)


def test_a_torn_version_is_never_loaded_and_the_next_good_one_is(store, tiny_engine, tmp_path, model_cache):
    """A shard deleted, truncated or changed by a byte (a crash, a full disk, a bad sector): the
    collector refuses the version in one line naming it and the shard, keeps its weights (a
    parameter compared before and after), and loads the next good version; a copy in shared memory
    on this machine is loaded from there, and a torn one is said and read from disk instead."""
    import torch
    from reflexdb.models import resolve_model

    src = resolve_model("tiny")
    c = _collector({"collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}}}, store, tiny_engine)
    msgs = []
    c.echo = msgs.append
    def weight():
        return tiny_engine.model.model.layers[0].mlp.up_proj.weight.detach().clone()

    def publish(k: int, tear=None, meta=None):
        d, sha, man_sha = _version(tmp_path, src, k)
        shards = sorted(d.glob("model-*.safetensors"), key=lambda p: p.stat().st_size)
        assert len(shards) >= 3 and (d / "model.safetensors.index.json").is_file()
        name = shards[0].name  # a shard of the decoder layers
        if tear == "deleted":
            shards[0].unlink()
        elif tear == "truncated":
            shards[0].write_bytes(shards[0].read_bytes()[:-7])
        elif tear == "corrupted":
            data = bytearray(shards[0].read_bytes())
            data[-3] ^= 0x40
            shards[0].write_bytes(bytes(data))
        store.publish_policy(c.run_id, k, f"file://{d}", sha256=sha, step=k, manifest_sha256=man_sha, meta=meta or {})
        return d, name

    publish(1)
    c._maybe_reload()
    assert c.version == 1 and "loaded policy v1" in msgs[-1] and "manifest sha256" in msgs[-1]
    good = weight()
    for k, tear, why in [(2, "deleted", "missing (listed in manifest.json"), (3, "truncated", "holds"),
                         (4, "corrupted", "is not the manifest's")]:
        d, name = publish(k, tear)
        msgs.clear()
        c._maybe_reload()
        c._maybe_reload()  # said once; checked again only after a minute
        assert c.version == 1 and torch.equal(weight(), good), tear
        assert len(msgs) == 1 and msgs[0].startswith(f"not loading policy v{k} from file://{d}: {d}/{name}: ") \
            and why in msgs[0] and msgs[0].endswith("sampling with policy v1 meanwhile, checking again in 60 s"), msgs
    # the next good version loads
    publish(5)
    c._maybe_reload()
    assert c.version == 5 and not torch.equal(weight(), good)
    # a copy in shared memory on this machine: loaded from there; a torn one: said, and read from disk
    from reflexdb import shm

    for k, torn in [(6, False), (7, True)]:
        copy = tmp_path / "shm" / f"v{k}"
        durable, name = publish(k, meta={shm.META_KEY: {"path": str(copy), **shm.identity()}})
        shutil.copytree(durable, copy)
        if torn:
            (copy / name).unlink()
        msgs.clear()
        c._maybe_reload()
        assert c.version == k
        if torn:
            assert msgs[0] == (f"policy v{k}: its copy in shared memory is torn ({copy}/{name}: missing (listed in "
                               f"manifest.json, {(durable / name).stat().st_size:,} bytes)); reading it from "
                               f"file://{durable} instead") and f"from file://{durable} (manifest sha256" in msgs[1]
        else:
            assert len(msgs) == 1 and f"(in shared memory, {copy}: manifest sha256" in msgs[0], msgs
    tiny_engine.load_weights(src)  # leave the shared engine as it was
