"""`reflexdb import` as a command, and offline training on an imported file with the commands."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.processes import REFLEXDB, child_env, rows


def test_the_import_command(store, db_url, tmp_path, model_cache):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2+2?", "completion": "4", "reward": 1}) + "\n{bad\n")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"run": "imp", "model": "tiny"}))
    done = subprocess.run(REFLEXDB + ["import", str(path), "-c", str(cfg), "--url", db_url],
                          env=child_env(db_url, tmp_path, model_cache), capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr
    assert "imported 1 new of 2 rows as 1 groups into run 'imp'; 1 bad rows skipped" in done.stdout
    assert f"{path}:2: not JSON" in done.stderr


def test_the_import_command_on_bad_files_leaves_no_run(store, db_url, tmp_path, model_cache):
    """A missing file, a .csv, bytes that are not UTF-8: one line, no traceback, no empty run left
    behind; a re-run says how many rows it had already."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"run": "imp2", "model": "tiny"}))
    env = child_env(db_url, tmp_path, model_cache)

    def imp(path, *extra):
        return subprocess.run(REFLEXDB + ["import", str(path), "-c", str(cfg), "--url", db_url, *extra], env=env,
                              capture_output=True, text=True, timeout=180)

    (tmp_path / "x.csv").write_text("prompt,completion\nWhat is 2+2?,4\n")
    for path, message in ((tmp_path / "missing.jsonl", "does not exist"), (tmp_path / "x.csv", "use .jsonl or .parquet")):
        done = imp(path)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert rows(store, "SELECT count(*) FROM runs WHERE name = 'imp2'") == [(0,)]
    # Latin-1 bytes on line 2 only: that line is a bad row, named FILE:LINE; the others are imported
    path = tmp_path / "mixed.jsonl"
    good = json.dumps({"prompt": "What is 2+2?", "completion": "4", "reward": 1}).encode() + b"\n"
    path.write_bytes(good + b'{"prompt": "caf\xe9", "completion": "x"}\n' + good.replace(b"4", b"5"))
    done = imp(path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}:2: not UTF-8 (byte 0xe9 at column 16)" in done.stderr
    assert "imported 2 new of 3 rows as 1 groups into run 'imp2'; 1 bad rows skipped" in done.stdout
    again = imp(path, "--batch-size", "1")  # another batch size: nothing twice, and it says so
    assert "imported 0 new of 3 rows as 0 groups into run 'imp2'; 2 already imported" in again.stdout, again.stderr
    assert rows(store, "SELECT count(*) FROM trajectories t JOIN runs r ON r.id = t.run_id WHERE r.name = 'imp2'") == [(2,)]
    # A file of bad rows only creates no run
    (tmp_path / "bad.jsonl").write_bytes(b"\xff\xfe\n{bad\n")
    cfg.write_text(yaml.safe_dump({"run": "imp3", "model": "tiny"}))
    done = imp(tmp_path / "bad.jsonl")
    assert done.returncode == 1 and "(no run was created)" in done.stdout, done.stdout
    assert rows(store, "SELECT count(*) FROM runs WHERE name = 'imp3'") == [(0,)]
from tests.store.test_import_replay import _consumed  # noqa: F401


def test_offline_training_on_an_imported_file_with_the_commands(store, db_url, tmp_path, model_cache):
    """The user's path, no collector: `reflexdb import` a rollout file (2 prompts x 4 completions,
    non-binary rewards, one NULL), then `reflexdb learn` with imported_per_step = groups_per_step
    trains on it alone; with every imported group used once, it waits for more and stops at its
    time budget, having trained 1 step."""
    import json
    import subprocess

    import yaml

    from tests.processes import REFLEXDB, child_env
    from tests.store.test_learn import config_data

    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {a} + 1?", "completion": f"It is {a + d}.",
                                        "reward": None if (a, d) == (2, 3) else 1.0 - 0.25 * d}) + "\n"
                            for a in (1, 2) for d in range(4)))
    cfg = tmp_path / "run.yaml"
    # a time budget of 8 s (counted from the learner's first wait): step 1 takes the two imported
    # groups at once, then it waits seconds with nothing eligible and stops
    cfg.write_text(yaml.safe_dump({**config_data(imported_per_step=2, max_seconds=8), "run": "offline"}))
    env = child_env(db_url, tmp_path, model_cache)
    done = subprocess.run(REFLEXDB + ["import", str(path), "-c", str(cfg)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported 8 new of 8 rows as 2 groups" in done.stdout
    learned = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg)], env=env, capture_output=True, text=True,
                             timeout=600)
    assert learned.returncode == 0, learned.stderr[-3000:]
    # no row the policy sampled, so no pass@1; the progress line says how many imported groups
    assert re.search(r"step 1 \| .* pass@1 - \| .* \| imported 2 \| (wait \d+% )?read \d+% ", learned.stderr, re.M), learned.stderr
    (run,) = rows(store, "SELECT id FROM runs WHERE name = 'offline'")[0]
    assert [s for s, _ in _consumed(store, run)] == [1]
    (metrics,) = rows(store, "SELECT metrics FROM learner_steps WHERE run_id = :r", r=run)[0]
    assert metrics["imported/groups"] == 2.0 and metrics["reward/missing"] == 1.0
    # mean of the 7 known rewards: (1 + .75 + .5 + .25) + (1 + .75 + .5) = 4.75
    assert metrics["imported/reward_mean"] == pytest.approx(4.75 / 7)
