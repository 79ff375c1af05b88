"""Run config validation: every problem named by key, with the allowed range."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflexdb.config import ConfigError, load_config, markdown_reference, parse_config


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
    doc = Path(__file__).parent.parent / "docs" / "configuration.md"
    assert doc.read_text() == markdown_reference(), "run: python -m reflexdb.config > docs/configuration.md"
