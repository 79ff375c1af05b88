"""docs/tutorial-method.md builds a method from an empty folder (issue 52): the bestofn plug-in in
examples/plugins/bestofn. Two checks keep the text and the code one thing:

- every file block of the tutorial (a ``**`examples/plugins/bestofn/…`**`` line, then a fenced
  block) is that file, verbatim, and every file of the example is shown;
- the package, installed as pip installs it (its dist-info with the entry point, its source on the
  path, for the child processes only), does what the tutorial says: ``reflexdb plugins`` lists it,
  ``reflexdb check`` accepts its YAML and refuses what its config refuses, ``reflexdb db upgrade``
  adds its branch, ``reflexdb run`` takes 2 learner steps with its SFT term, metrics and rows, the
  tutorial's SQL runs, and ``reflexdb db downgrade bestofn@base`` is refused while the run holds its
  picks, and removes its branch again once the run is archived.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.processes import REFLEXDB, child_env, rows

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial-method.md"
PLUGIN = ROOT / "examples" / "plugins" / "bestofn"
FILE_BLOCK = re.compile(r"^\*\*`(examples/plugins/bestofn/[^`]+)`\*\*\n\n```[\w-]*\n(.*?)^```$", re.M | re.S)
EXCERPT = re.compile(r"^\*\*excerpt of `([^`]+)`\*\*\n\n```[\w-]*\n(.*?)^```$", re.M | re.S)
SQL_QUERY = re.compile(r"^```sql\n(SELECT .*?)^```$", re.M | re.S)


def shown() -> dict[str, str]:
    """The tutorial's file blocks: path -> the block's text."""
    blocks: dict[str, str] = {}
    for path, text in FILE_BLOCK.findall(TUTORIAL.read_text()):
        assert path not in blocks, f"docs/tutorial-method.md shows {path} twice"
        blocks[path] = text
    return blocks


def test_the_tutorials_code_blocks_are_the_examples_files():
    blocks = shown()
    files = {p.relative_to(ROOT).as_posix() for p in PLUGIN.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in p.as_posix()}
    assert set(blocks) == files, ("the tutorial must show every file of examples/plugins/bestofn once, and "
                                  f"only those: not shown {sorted(files - set(blocks))}, "
                                  f"not files {sorted(set(blocks) - files)}")
    for path, text in blocks.items():
        assert text == (ROOT / path).read_text(), f"docs/tutorial-method.md's {path} differs from the file"
    excerpts = EXCERPT.findall(TUTORIAL.read_text())
    assert excerpts
    for path, text in excerpts:
        assert text in (ROOT / path).read_text(), f"docs/tutorial-method.md's excerpt of {path} is not in the file"


#: Alembic's comparison of the plug-in's declared table with the database, as reflexdb's migration test
#: compares its own: the differences, printed (``[]``: none).
COMPARE = """
import sys
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
import reflexdb_bestofn.tables
from reflexdb.db import make_engine
from reflexdb.schema import metadata
with make_engine(sys.argv[1]).connect() as conn:
    ctx = MigrationContext.configure(conn, opts={"include_name": lambda name, type_, parents:
                                                 type_ != "table" or name == "bestofn_picks"})
    print([d for d in compare_metadata(ctx, metadata) if "bestofn_picks" in str(d)])
"""


def install(site: Path) -> str:
    """What ``pip install -e examples/plugins/bestofn`` leaves for Python: the package's metadata with
    its entry point, and its source folder on the path. Returns the PYTHONPATH."""
    info = site / "reflexdb_bestofn-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reflexdb-bestofn\nVersion: 0.1.0\n")
    declared = '[project.entry-points."reflexdb.plugins"]\nbestofn = "reflexdb_bestofn:plugin"\n'
    assert declared in (PLUGIN / "pyproject.toml").read_text()
    (info / "entry_points.txt").write_text("[reflexdb.plugins]\nbestofn = reflexdb_bestofn:plugin\n")
    return f"{site}:{PLUGIN / 'src'}"


def reflexdb(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(REFLEXDB + list(args), env=env, capture_output=True, text=True, timeout=timeout)


def test_the_tutorial_method_loads_checks_runs_and_is_removed(store, db_url, tmp_path, model_cache):
    env = child_env(db_url, tmp_path, model_cache)
    env["PYTHONPATH"] = install(tmp_path / "site")
    yaml = str(PLUGIN / "bestofn.yaml")
    text = TUTORIAL.read_text()

    listed = reflexdb(env, "plugins")
    assert listed.returncode == 0, listed.stderr[-3000:]
    [line] = [x for x in listed.stdout.splitlines() if x.startswith("bestofn ")]
    assert "loaded" in line and "reflexdb_bestofn:plugin" in line and "methods: bestofn; migrations: bestofn" in line
    left_out = reflexdb(env, "-p", "no:bestofn", "plugins")
    assert [x for x in left_out.stdout.splitlines() if x.startswith("bestofn ")][0].split("|")[1].strip() == "left out"

    checked = reflexdb(env, "check", yaml)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert "method bestofn (loss grpo" in checked.stdout
    for bad, said in (("bestofn.sft_weight=20", "less than or equal to 10"),
                      ("collector.group_size=1", "bestofn needs at least 2")):
        refused = reflexdb(env, "check", yaml, "--set", bad)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert said in text, f"the tutorial shows what `reflexdb check --set {bad}` says"

    up = reflexdb(env, "db", "upgrade", timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    assert ("bestofn_0001",) in rows(store, "SELECT version_num FROM alembic_version")
    # tables.py declares the table as the migration made it (in a child: this process's metadata stays reflexdb's)
    compared = subprocess.run([sys.executable, "-c", COMPARE, db_url], env=env, capture_output=True, text=True,
                              timeout=120)
    assert compared.returncode == 0 and compared.stdout.strip() == "[]", compared.stdout + compared.stderr[-3000:]

    # the tutorial's run, small: min_reward 0, so the untrained tiny model's answers (reward 0) are picked too;
    # the collector's waits 1 s long, not 10 (when the learner stops it notices SIGTERM at the end of a wait)
    assert f"reflexdb run {PLUGIN.relative_to(ROOT)}/bestofn.yaml --max-steps 2" in text
    run = reflexdb(env, "run", yaml, "--max-steps", "2", "--no-eval", *[a for s in (
        "run=bestofn-e2e", "model=tiny", "collector.group_size=4", "collector.tasks_per_batch=2",
        "collector.sampling.max_new_tokens=8", "learner.groups_per_step=2", "learner.micro_batch_size=8",
        "learner.keep_states=1", "learner.keep_policies=2", "tasks.eval_size=2", "learner.eval_samples=2",
        "bestofn.min_reward=0", "collector.progress_every_s=1") for a in ("--set", s)], timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "run 'bestofn-e2e': 2 learner steps" in run.stdout, run.stdout

    # its loss term, metrics and setting reached the learner
    assert rows(store, "SELECT step, metrics ? 'loss/sft/loss', (metrics->>'bestofn/picked')::float FROM learner_steps "
                       "ORDER BY step") == [(1, True, 2.0), (2, True, 2.0)]  # a pick in each of the 2 groups
    assert rows(store, "SELECT value FROM run_settings WHERE key = 'bestofn.sft_weight'") == [(0.1,)]
    # its rows: each pick is its group's best answer (no valid answer of the group beats it)
    picks = rows(store, """
        SELECT p.step, p.group_id = t.group_id, NOT EXISTS (
                 SELECT 1 FROM trajectories o
                 WHERE o.group_id = t.group_id AND o.run_id = t.run_id AND o.reward IS NOT NULL
                   AND (o.reward > t.reward OR (o.reward = t.reward AND o.response_length < t.response_length)))
        FROM bestofn_picks p JOIN trajectories t ON t.id = p.trajectory_id AND t.run_id = p.run_id
        ORDER BY p.step""")
    assert picks == [(1, True, True), (1, True, True), (2, True, True), (2, True, True)]
    # the tutorial's queries run and answer
    queries = SQL_QUERY.findall(text)
    assert len(queries) == 2
    for query in queries:
        assert rows(store, query), query

    # removing it: refused while the run holds picks (issue 60: they were dropped with exit 0); the run
    # archived (its picks in the archive), the branch goes (its table with it), then the package can be uninstalled
    refused = reflexdb(env, "db", "downgrade", "bestofn@base", "--yes", timeout=300)
    assert refused.returncode == 1 and "it drops table bestofn_picks of method package bestofn, and runs hold rows " \
        "there: run 'bestofn-e2e' (bestofn_picks)" in refused.stderr, refused.stderr[-3000:]
    assert len(rows(store, "SELECT * FROM bestofn_picks")) == len(picks)
    assert "reflexdb db archive RUN -o DIR" in text and "reflexdb runs delete RUN --yes" in text
    archived = reflexdb(env, "db", "archive", "bestofn-e2e", "-o", str(tmp_path / "archive"), timeout=300)
    assert archived.returncode == 0, archived.stderr[-3000:]
    down = reflexdb(env, "db", "downgrade", "bestofn@base", "--yes", timeout=300)
    assert down.returncode == 0, down.stderr[-3000:]
    assert ("bestofn_0001",) not in rows(store, "SELECT version_num FROM alembic_version")
    assert rows(store, "SELECT to_regclass('bestofn_picks') IS NULL") == [(True,)]
