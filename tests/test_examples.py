"""Every example config is valid."""

from pathlib import Path

import pytest

from reflexdb.config import load_config

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_is_valid(path):
    cfg = load_config(path)
    assert cfg.run
