"""Model sources: built-in names, a local directory, a model-hub id (cached; offline it fails at once)."""

from __future__ import annotations

import shutil
import time

import pytest
from reflexdb.collector.errors import ModelUnavailable
from reflexdb.models import resolve_model


def test_an_uncached_hub_id_offline_fails_at_once_naming_the_way_out(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(ModelUnavailable) as err:
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert time.monotonic() - t0 < 10  # no network timeouts
    msg = str(err.value)
    assert "HF_HUB_OFFLINE" in msg and "model: smollm2" in msg and "local" in msg


@pytest.mark.parametrize("spec, says", [("no-such-name", "not a built-in name (smollm2, tiny)"),
                                        ("./missing/dir", "model directory ./missing/dir does not exist")])
def test_names_that_are_nothing_are_refused(spec, says):
    with pytest.raises(ModelUnavailable, match=says.replace("(", r"\(").replace(")", r"\)")):
        resolve_model(spec)


def test_a_cached_hub_id_resolves_to_its_snapshot_and_loads_offline(monkeypatch, tmp_path, model_cache):
    """The Hugging Face cache layout (models--owner--name/snapshots/REV, refs/main), filled with
    the tiny model: offline, the hub id resolves to that snapshot, which transformers loads."""
    import huggingface_hub.constants
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny = resolve_model("tiny")
    repo = tmp_path / "models--someone--tiny-model"
    snap = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snap.name)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    got = resolve_model("someone/tiny-model")
    assert got == snap
    AutoModelForCausalLM.from_pretrained(got)
    assert AutoTokenizer.from_pretrained(got).chat_template
