"""`reflexdb check CONFIG [--set ...]`: a config validated as run/learn/collect read it, with no
database and no model; misspelt keys suggest the nearest one; a bad --set value names --set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from reflexdb.cli.main import app
from typer.testing import CliRunner

from reflexdb.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CHECK = [sys.executable, "-m", "reflexdb.cli.main", "check"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_checks(example):
    result = CliRunner().invoke(app, ["check", str(example)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1].startswith(f"ok: {example}: method ")
    resolved = yaml.safe_load("\n".join(result.output.splitlines()[:-1]))
    assert resolved["run"] == yaml.safe_load(example.read_text())["run"]
    assert "learner" in resolved and "lr" in resolved["learner"]  # every default filled in


def _write(tmp_path, data) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _check(path, *args, env=None):
    env = dict(os.environ, **(env or {}))
    return subprocess.run(CHECK + [str(path), *args], capture_output=True, text=True, timeout=120, env=env)


def test_needs_no_database_and_says_what_it_resolved(tmp_path):
    path = _write(tmp_path, {"run": "r", "model": "tiny", "algorithm": "dapo", "database_url": "postgresql://u:pw@h/db"})
    # an unreachable server and an empty home: check never connects, never loads a model
    done = _check(path, "--set", "learner.lr=3e-6", env={"REFLEXDB_DATABASE_URL": "postgresql://alice:s3cret@127.0.0.1:1/x",
                                                         "REFLEXDB_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout.rsplit("\nok:", 1)[0])
    assert resolved["learner"]["lr"] == 3e-6 and resolved["database_url"] == "postgresql://u:***@h/db"
    assert done.stdout.splitlines()[-1] == (f"ok: {path}: method dapo (loss dapo, advantages group), environment single, "
                                            "80 train / 8 eval tasks")
    assert not (tmp_path / "home").exists()
    quiet = _check(path, "-q")
    assert quiet.stdout.count("\n") == 1 and quiet.stdout.startswith("ok:")


@pytest.mark.parametrize("data, message", [
    ({"learner": {"lrr": 1e-5}}, "learner.lrr: unknown key (did you mean learner.lr?)"),
    ({"lerner": {"lr": 1e-5}}, "lerner: unknown key (did you mean learner?)"),
    ({"collector": {"sampling": {"temprature": 0.5}}},
     "collector.sampling.temprature: unknown key (did you mean collector.sampling.temperature?)"),
    ({"algorithm": "cleaner", "environment": {"name": "tool_python"}, "cleaner": {"max_attempt": 2}},
     "cleaner.max_attempt: unknown key (did you mean cleaner.max_attempts?)"),
    ({"learner": {"zzz": 1}}, "learner.zzz: unknown key\n"),  # nothing close: no guess
])
def test_a_misspelt_key_suggests_the_nearest(tmp_path, data, message):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, {"run": "r", "model": "tiny", **data}))
    assert message in str(err.value) + "\n"


def test_a_bad_set_value_names_set_not_the_file(tmp_path):
    path = _write(tmp_path, {"run": "r", "model": "tiny", "learner": {"micro_batch_size": 0}})
    done = _check(path, "--set", "learner.lr=-1", "--set", "collector.group_size=abc")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert any(line.strip().startswith("--set learner.lr: Input should be greater than 0") for line in lines), lines
    assert any(line.strip().startswith("--set collector.group_size:") for line in lines), lines
    # the file's own mistake is the file's
    assert any(line.strip().startswith("learner.micro_batch_size:") for line in lines), lines


def test_tasks_template_and_reward_are_checked(tmp_path):
    path = _write(tmp_path, {"run": "r", "model": "tiny", "tasks": {"level": 1, "train_size": 500, "template": "nope"},
                             "collector": {"reward": "nope"}})
    done = _check(path)
    assert done.returncode == 2, done.stdout
    assert "tasks.template: unknown prompt template 'nope'" in done.stderr
    assert "collector.reward: unknown reward function 'nope'" in done.stderr
    assert "tasks (train_size 500, eval_size 8, level 1): found only" in done.stderr


def test_check_imports_neither_torch_nor_the_database_stack():
    """What keeps `reflexdb check` under a second (benchmarks/cli_latency.py measures it): torch, the
    store's SQLAlchemy and psycopg, and FAISS are imported only by commands that use them."""
    code = ("import sys; sys.argv = ['reflexdb', 'check', '-q', sys.argv[1]]\n"
            "from reflexdb.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'sqlalchemy', 'psycopg', 'faiss', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(EXAMPLES[0])], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
