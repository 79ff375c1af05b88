"""What a first start does for minutes is said (issue 60): converting SmolLM2 from its GGUF file,
and DeepSpeed building its op. Both ran silently (the conversion's line was a log record nobody
saw, DeepSpeed's own print was swallowed), so a first `reflexdb run` looked hung."""

from __future__ import annotations

import threading

import pytest

from reflexdb import models
from reflexdb.models import resolve_model


def _fake_builds(monkeypatch) -> None:
    """The tokenizer's extraction and the model's conversion, each a file written at once."""
    monkeypatch.setattr(models, "_save_tokenizer_from_gguf", lambda out: (out / "tokenizer.json").write_text("{}"))
    monkeypatch.setattr(models, "_convert_smollm2", lambda out, tok: (out / "model.safetensors").write_bytes(b""))


def test_the_gguf_conversion_is_said_once_before_it_runs(monkeypatch, tmp_path, capsys):
    _fake_builds(monkeypatch)
    gguf = models.smollm2_gguf()
    said: list[str] = []
    got = resolve_model("smollm2", tmp_path, say=said.append)
    assert said == [
        f"reading SmolLM2's tokenizer and chat template from its GGUF file {gguf} into {tmp_path / 'smollm2-tokenizer'} "
        "(once, a few seconds; later starts read the folder)",
        f"converting SmolLM2-135M-Instruct from its GGUF file {gguf} to safetensors in {got} (once, 20-60 s; later "
        "starts load it from there in seconds)"]
    assert (got / "model.safetensors").exists()
    said.clear()
    assert resolve_model("smollm2", tmp_path, say=said.append) == got and said == []  # built: nothing to say
    # without a say of the caller's (reflexdb eval, import, the explorer): on standard error
    resolve_model("smollm2", tmp_path / "other")
    err = capsys.readouterr().err
    assert f"converting SmolLM2-135M-Instruct from its GGUF file {gguf} to safetensors in " in err


def test_a_process_that_waits_for_anothers_conversion_says_so(monkeypatch, tmp_path):
    """Another process (here: this one, through its own open file) holds the entry's lock."""
    import fcntl

    _fake_builds(monkeypatch)
    models.smollm2_tokenizer_dir(tmp_path, say=lambda _: None)
    final = tmp_path / "smollm2-135m-instruct"
    said: list[str] = []
    told = threading.Event()
    with open(tmp_path / f".{final.name}.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: resolve_model("smollm2", tmp_path, say=lambda m: (said.append(m),
                                                                                                      told.set())))
        waiter.start()
        assert told.wait(30)
        final.mkdir()  # the other process finishes its build
        (final / "reflexdb-model.json").write_text("{}")
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(30)
    assert said == [f"waiting for another process that is building {final} (once; later starts load it from there)"]


def test_deepspeeds_first_build_of_its_op_is_said(monkeypatch, tmp_path):
    """The build lock's watch (trainer/buildlock.py), which the learner's start runs, names the
    folder the op is built in when it is not built there yet; once built, it says nothing."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    from reflexdb.trainer.buildlock import BuildLockWatch

    if get_accelerator().device_name() != "cpu":
        pytest.skip("DeepSpeed builds its shared-memory op on the CPU accelerator only")
    said: list[str] = []
    with BuildLockWatch(said.append, root=tmp_path):
        pass
    folder = tmp_path / "deepspeed_shm_comm"
    assert said == [f"building DeepSpeed's deepspeed_shm_comm extension in {folder} (once: a minute or so; later "
                    "starts reuse it)"]
    folder.mkdir()
    (folder / "deepspeed_shm_comm.so").write_bytes(b"")
    said.clear()
    with BuildLockWatch(said.append, root=tmp_path):
        pass
    assert said == []
