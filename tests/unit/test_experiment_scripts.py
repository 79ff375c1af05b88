"""The experiment scripts of `benchmarks/experiments/` at their paths: each answers `--help`, a
stored result renders the table docs/experiments.md quotes, and what they share (`arms.py`) resumes,
parses and plots as they need. No experiment is run (they take tens of minutes)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "benchmarks" / "experiments"
SCRIPTS = sorted(p for p in EXPERIMENTS.glob("*.py") if "__main__" in p.read_text())


def _arms():
    spec = importlib.util.spec_from_file_location("experiments_arms", EXPERIMENTS / "arms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script(name: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(EXPERIMENTS / name), *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_method_against_baseline_scripts_live_in_experiments():
    names = {p.name for p in SCRIPTS}
    assert {"r3l_vs_grpo.py", "lte_vs_grpo.py", "nexgrpo_vs_grpo.py", "cleaner_vs_dapo.py",
            "multi_attempt_vs_single.py", "diagnostic_arms.py", "vs_trl.py"} <= names
    assert not any((ROOT / "benchmarks" / n).exists() for n in names)  # moved, not copied


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_answers_help_at_its_path(script):
    assert _script(script.name, "--help").startswith("usage:")
    assert f"python benchmarks/experiments/{script.name}" in script.read_text()  # the commands its docstring gives


def test_a_stored_result_renders_the_table_the_docs_quote():
    table = _script("r3l_vs_grpo.py", "--report", "benchmarks/results/r3l_vs_grpo.json").strip()
    assert table.count("\n") == 7  # header, rule, 3 arms x 2 seeds
    docs = (ROOT / "docs" / "experiments.md").read_text().replace("**", "")  # the docs bold the winners
    assert table in docs


def test_a_seeds_arms_run_in_turn_share_the_base_evaluation_and_resume(tmp_path, capsys):
    arms = _arms()
    calls = []

    def run_arm(arm, seed, base):
        calls.append((arm, seed, base))
        return {"arm": arm, "seed": seed, "base": base or {"seed": seed}}

    out = tmp_path / "res.json"
    first = arms.new_results(max_steps=3, seeds=[0, 1])
    arms.run_seeds(first, ["a", "b"], run_arm, out, resume=("max_steps",))
    assert calls == [("a", 0, None), ("b", 0, {"seed": 0}), ("a", 1, None), ("b", 1, {"seed": 1})]
    assert "== b seed 1" in capsys.readouterr().out
    # an interrupted file with the same settings is resumed: only what it lacks runs
    done = json.loads(out.read_text())
    done["arms"] = done["arms"][:3]
    out.write_text(json.dumps(done))
    calls.clear()
    arms.run_seeds(arms.new_results(max_steps=3, seeds=[0, 1]), ["a", "b"], run_arm, out, resume=("max_steps",))
    assert calls == [("b", 1, {"seed": 1})] and len(json.loads(out.read_text())["arms"]) == 4
    # other settings start over
    calls.clear()
    arms.run_seeds(arms.new_results(max_steps=5, seeds=[0]), ["a"], run_arm, out, resume=("max_steps",))
    assert calls == [("a", 0, None)]


def test_run_summary_reads_what_reflexdb_run_prints():
    from reflexdb.cli.launch import RunResult, summary

    arms = _arms()
    r = RunResult(exit_code=0, steps=20, version=20,
                  before={"label": "base", "pass_at_1": 0.25, "tasks": 8, "split": "eval", "samples_per_task": 16},
                  after={"label": "v20", "pass_at_1": 0.8125, "tasks": 8, "split": "eval", "samples_per_task": 16})
    got = arms.run_summary(summary("arithmetic-grpo", r), "run")
    assert got == {"tasks": 8, "samples": 16, "before_label": "base", "before": 0.25, "after_label": "v20",
                   "after": 0.812}
    with pytest.raises(SystemExit, match="no summary"):
        arms.run_summary("run 'x': 0 learner steps", "run")


def test_seed_curves_draw_one_line_per_run_solid_for_the_first_seed(tmp_path):
    arms = _arms()
    res = {"seeds": [0, 1], "arms": [
        {"arm": "a", "seed": s, "step_curve": [{"step": 1, "y": 2.0}, {"step": 2, "y": 4.0}]} for s in (0, 1)]}
    fig, axes = arms.subplots(1, (4, 3))
    arms.seed_curves(axes, res, {"a": "tab:red"}, "step_curve", "step", "y", div=2)
    lines = axes.get_lines()
    assert [ln.get_linestyle() for ln in lines] == ["-", ":"] and list(lines[0].get_ydata()) == [1.0, 2.0]
    arms.save(fig, tmp_path / "p.png", "title")
    assert (tmp_path / "p.png").stat().st_size > 0
