"""Run config validation: every problem named by key, with the allowed range."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reflexdb.config import ConfigError, load_config, parse_config


def test_defaults_are_valid():
    cfg = parse_config({"run": "r"})
    assert cfg.collector.group_size == 8 and cfg.max_staleness == 1 and cfg.tasks.source == "arithmetic"


@pytest.mark.parametrize("data,expected", [
    ({"run": "r", "colector": {}}, "colector: unknown key"),
    ({"run": "r", "collector": {"sampling": {"temprature": 1}}}, "collector.sampling.temprature: unknown key"),
    ({}, "run: required"),
    ({"run": "r", "collector": {"group_size": 0}}, "collector.group_size: Input should be greater than or equal to 1 (got 0; allowed: >= 1, <= 1024)"),
    ({"run": "r", "collector": {"sampling": {"top_p": 1.5}}}, "collector.sampling.top_p: Input should be less than or equal to 1 (got 1.5; allowed: > 0.0, <= 1.0)"),
    ({"run": "r", "max_staleness": "many"}, "max_staleness: Input should be a valid integer"),
    ({"run": "r", "tasks": {"source": "web"}}, "tasks.source: Input should be 'arithmetic' or 'file'"),
    ({"run": "r", "tasks": {"source": "file", "path": "/no/such.jsonl"}}, "dataset file /no/such.jsonl does not exist"),
    ({"run": "r", "learner": {"groups_per_step": 2, "imported_per_step": 3}},
     "learner.imported_per_step (3) is more than learner.groups_per_step (2)"),
    ({"run": "r", "learner": {"imported_per_step": -1}}, "learner.imported_per_step: Input should be greater than or equal to 0"),
])
def test_invalid_values_name_the_key(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert expected in str(err.value)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as err:
        parse_config({"run": "r", "a": 1, "collector": {"group_size": -1}})
    assert "a: unknown key" in str(err.value) and "collector.group_size" in str(err.value)


def test_load_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run: r\ncollector:\n  group_size: 4\n")
    cfg = load_config(p, {"collector.name": "c7"})
    assert (cfg.collector.group_size, cfg.collector.name) == (4, "c7")
    p.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_masked_hides_password():
    cfg = parse_config({"run": "r", "database_url": "postgresql://u:secret@h/db"})
    assert "secret" not in str(cfg.masked()) and "u:***@h/db" in cfg.masked()["database_url"]


def test_configuration_doc_is_generated_from_the_schema():
    """In a fresh process: a test in this worker may have registered a reward or an engine of its
    own (tests/store/test_collect.py's test_broken), which the page lists."""
    import subprocess
    import sys

    doc = Path(__file__).parents[2] / "docs" / "configuration.md"
    out = subprocess.run([sys.executable, "-c", "from reflexdb.config import markdown_reference as m; "
                          "import sys; sys.stdout.write(m())"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert doc.read_text() == out.stdout, "run: python -m reflexdb.config > docs/configuration.md"


@pytest.mark.parametrize("data,expected", [
    ({"run": "r", "nexgrpo": {"conf_low": 0.95}}, "nexgrpo.conf_low (0.95) must not exceed nexgrpo.conf_high (0.9)"),
    ({"run": "r", "algorithm": "nexgrpo", "collector": {"group_size": 2}},
     "collector.group_size is 2; nexgrpo needs at least 3"),
    ({"run": "r", "nexgrpo": {"replay_ratio": 1.5}}, "nexgrpo.replay_ratio: Input should be less than or equal to 1"),
    ({"run": "r", "nexgrpo": {"refresh_candidates": 0}}, "nexgrpo.refresh_candidates: Input should be greater than"),
])
def test_nexgrpo_section_is_validated(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert expected in str(err.value)
    assert "got {" not in str(err.value)  # a cross-key problem does not dump the whole config


def test_set_overrides_are_yaml_values(tmp_path):
    from reflexdb.config import parse_overrides

    got = parse_overrides(["learner.lr=1e-5", "collector.sampling.stop=['.', '!']", "tasks.dataset=x",
                           "learner.max_steps=3", "nexgrpo.refresh=false", "collector.name="])
    assert got == {"learner.lr": "1e-5", "collector.sampling.stop": [".", "!"], "tasks.dataset": "x",
                   "learner.max_steps": 3, "nexgrpo.refresh": False, "collector.name": None}
    p = tmp_path / "c.yaml"
    p.write_text("run: r\n")
    cfg = load_config(p, got)
    assert cfg.learner.lr == 1e-5 and cfg.collector.sampling.stop == [".", "!"] and cfg.nexgrpo.refresh is False
    for bad in ["learner.lr", "=3", "a..b=1", "x=[unclosed"]:
        with pytest.raises(ConfigError, match="--set"):
            parse_overrides([bad])
    with pytest.raises(ConfigError, match="learner.lrr: unknown key"):
        load_config(p, parse_overrides(["learner.lrr=1"]))
    p.write_text("run: r\nlearner: 3\n")
    with pytest.raises(ConfigError, match="cannot set learner.lr: learner is not a section"):
        load_config(p, {"learner.lr": 1})


def test_relative_dataset_path_is_found_next_to_the_config(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    p = tmp_path / "c.yaml"
    p.write_text("run: r\ntasks:\n  source: file\n  path: data/d.jsonl\n")
    monkeypatch.chdir("/")
    assert load_config(p).tasks.path == tmp_path / "data" / "d.jsonl"
    p.write_text("run: r\ntasks:\n  source: file\n  path: data/missing.jsonl\n")
    with pytest.raises(ConfigError, match="dataset file data/missing.jsonl does not exist"):
        load_config(p)


def test_example_configs_are_valid():
    examples = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
    names = {p.name for p in examples}
    assert {"arithmetic-grpo.yaml", "arithmetic-grpo-lambda.yaml", "arithmetic-nexgrpo.yaml",
            "gsm8k-grpo.yaml"} <= names
    algorithms = {}
    for p in examples:
        cfg = load_config(p)
        algorithms[p.name] = cfg.algorithm
        # the quickstart budget: a bounded number of steps on every example
        assert cfg.learner.max_steps is not None, p.name
    assert algorithms["arithmetic-grpo-lambda.yaml"] == "grpo_lambda"
    assert algorithms["arithmetic-nexgrpo.yaml"] == "nexgrpo"
    gsm = load_config(Path(__file__).parents[2] / "examples" / "gsm8k-grpo.yaml")
    assert gsm.tasks.source == "file" and gsm.tasks.path.exists()


def test_gsm8k_example_reads_the_real_gsm8k_file():
    from reflexdb.collector.sources import build_tasks

    real = Path(__file__).parents[3] / "shared" / "data" / "gsm8k" / "train.jsonl"
    if not real.exists():
        pytest.skip("../shared/data/gsm8k/train.jsonl is not beside the project")
    cfg = load_config(Path(__file__).parents[2] / "examples" / "gsm8k-grpo.yaml",
                      {"tasks.path": str(real), "tasks.train_size": 100})
    tasks, skipped = build_tasks(cfg.tasks)
    assert skipped == 0 and len(tasks) == 110
    assert {t.split for t in tasks} == {"train", "eval"}
    assert all(t.ground_truth and t.ground_truth.replace(",", "").lstrip("-").replace(".", "").isdigit() for t in tasks)


def test_tasks_level_takes_one_level_or_a_list_and_names_a_bad_one():
    assert parse_config({"run": "r", "tasks": {"level": [1, 2]}}).tasks.level == [1, 2]
    assert parse_config({"run": "r", "tasks": {"level": 3}}).tasks.level == 3
    for bad, says in [([1, 10], "[10]"), (0, "[0]"), ([], "none")]:
        with pytest.raises(ConfigError, match=rf"tasks.level: .*levels lie in 1..9, got {re.escape(says)}"):
            parse_config({"run": "r", "tasks": {"level": bad}})
