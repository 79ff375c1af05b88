"""A method from outside the library: a toy workflow and a toy method in their own package,
registered the way a user's package is (a ``reflexdb.plugins`` entry point, i.e. what
``pip install my-method`` leaves in site-packages), run by ``reflexdb collect`` and
``reflexdb learn`` as processes for two steps. No library file knows them."""

from __future__ import annotations

import signal
import subprocess

import yaml

from tests.processes import REFLEXDB, child_env, rows

PLUGIN = '''
"""A toy method: collectors write "toy" groups (kind fresh, workflow toy, meta toy=true); the
learner trains OPMD on the correct rows and SFT (weight from its config section) on the best row."""
from pydantic import BaseModel, ConfigDict, Field

from reflexdb import GroupIn, work
from reflexdb.collector.workflows import register_workflow
from reflexdb.trainer.losses.registry import get_loss_spec
from reflexdb.trainer.method_api import LossTerm, Method, WorkflowUse, best_of_group, register_method


@register_workflow("toy")
class ToyWorkflow:
    def __init__(self, ctx, *, label):
        self.ctx, self.label = ctx, label

    def claim(self, want):
        c = self.ctx
        return c.db(lambda: work.claim_tasks(c.store, c.run_id, c.name, want))

    def collect(self, tasks):
        c = self.ctx
        prompts = [c.prompt(t.prompt) for t in tasks]
        return [GroupIn(run_id=c.run_id, task_id=t.id, policy_version=c.version,
                        trajectories=c.score(t.ground_truth, p, s), workflow="toy", kind="fresh",
                        collector=c.name, embedding_model=c.embedding_model, meta={"toy": self.label})
                for t, p, s in zip(tasks, prompts, c.sample(prompts, c.cfg.collector.group_size))]

    def release(self):
        work.release_claims(self.ctx.store, self.ctx.run_id, self.ctx.name)


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sft_weight: float = Field(0.5, ge=0)
    label: str = "toy"


class ToyHooks:
    def __init__(self, cfg, learner):
        self.learner = learner

    def metrics(self, batch, groups):
        return {"toy/groups": float(len(groups))}

    def after_step(self, metrics):
        if self.learner.main:
            self.learner.log_step_metrics({"toy/after_step": float(self.learner.step_no)})


def terms(cfg, params):
    sft = get_loss_spec("sft")
    return [LossTerm("policy", "opmd", params, rows=lambda b: b.valid & (b.rewards > 0)),
            LossTerm("sft", "sft", sft.parse({}), rows=best_of_group, weight=cfg.section("toy").sft_weight)]


register_method(Method(
    "toy", "a toy method from a plug-in", "opmd", config=ToyConfig,
    workflows=lambda cfg: [WorkflowUse("toy", {"label": cfg.section("toy").label})],
    terms=terms, settings=lambda cfg: {"toy.sft_weight": cfg.section("toy").sft_weight}, hooks=ToyHooks))
'''


def install_plugin(site):
    """What pip leaves behind for a package with a ``reflexdb.plugins`` entry point."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "toy_reflexdb_method.py").write_text(PLUGIN)
    info = site / "toy_reflexdb_method-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-reflexdb-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[reflexdb.plugins]\ntoy = toy_reflexdb_method\n")


def test_a_plugin_method_and_workflow_run_in_collector_and_learner(store, db_url, tmp_path, model_cache):
    site = tmp_path / "site"
    install_plugin(site)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "run": "plugin-test", "model": "tiny", "algorithm": "toy", "toy": {"sft_weight": 0.25, "label": "mine"},
        "collector": {"group_size": 4, "tasks_per_batch": 2, "sampling": {"max_new_tokens": 8},
                      "progress_every_s": 1, "poll_interval_s": 0.2},
        "learner": {"groups_per_step": 2, "micro_batch_size": 3, "lr": 1e-3, "poll_interval_s": 0.2},
    }))
    env = child_env(db_url, tmp_path, model_cache)
    env["PYTHONPATH"] = str(site)
    collector = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        learner = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "2"], env=env,
                                 capture_output=True, text=True, timeout=600)
        collector.send_signal(signal.SIGTERM)
        _, cerr = collector.communicate(timeout=120)
    finally:
        collector.kill()
    assert learner.returncode == 0, learner.stderr[-3000:]
    assert collector.returncode == 0, cerr[-3000:]
    assert "method toy (loss opmd)" in learner.stderr + learner.stdout
    # The toy workflow wrote every group; the learner trained two steps on them, with its terms,
    # its hooks' metrics, and the setting it publishes.
    assert rows(store, "SELECT DISTINCT workflow, meta->>'toy' FROM groups") == [("toy", "mine")]
    steps = rows(store, "SELECT step, metrics ? 'loss/sft/loss', (metrics->>'toy/groups')::float8, "
                        "(metrics->>'toy/after_step')::float8 FROM learner_steps ORDER BY step")
    assert steps == [(1, True, 2.0, 1.0), (2, True, 2.0, 2.0)]
    assert rows(store, "SELECT value FROM run_settings WHERE key = 'toy.sft_weight'") == [(0.25,)]


def test_an_unknown_algorithm_is_refused_with_the_list(tmp_path):
    cfg = tmp_path / "run.yaml"
    for algorithm, says in [("grpo2", "not a registered")]:
        cfg.write_text(yaml.safe_dump({"run": "x", "algorithm": algorithm}))
        out = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "1"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert says in out.stderr and "the methods built are: cleaner, dapo, dr_grpo, grpo, grpo_lambda, gspo, " \
            "lte, nexgrpo, opmd, r3l, raft" in out.stderr, out.stderr
