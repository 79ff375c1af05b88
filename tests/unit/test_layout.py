"""``reflexdb run --gpus``: a node laid out by one command (issue 62), tested without a GPU.

The layout is a pure function (cli/layout.py): GPU ids and a split in, the learner's command
(under torchrun when it has several ranks) and one collector per other GPU out, each with the
``CUDA_VISIBLE_DEVICES`` it sees. Here: several layouts, the bad inputs it refuses, ``--print-layout``
through the command line, the launcher starting and stopping a laid-out run (its processes
stubbed), and torchrun taking the learner's command line as it is built (two tiny processes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from reflexdb.cli import launch
from reflexdb.cli.layout import CLI, GPU_OVERRIDES, LayoutError, parse_gpus, plan
from reflexdb.cli.main import app
from typer.testing import CliRunner

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "examples" / "arithmetic-grpo.yaml"
COMMON = ("-c", "run.yaml", "--set=learner.lr=1e-5")
SETS = tuple(f"--set={o}" for o in GPU_OVERRIDES)


def lay(gpus, **kw):
    kw.setdefault("run", "r")
    kw.setdefault("cores", 16)
    kw.setdefault("common", COMMON)
    return plan(gpus, **kw)


# ---------------------------------------------------------------------- GPU ids

@pytest.mark.parametrize("spec,visible,count,ids", [
    ("0-7", None, 8, [str(i) for i in range(8)]),
    ("0,1,2,3", None, 8, ["0", "1", "2", "3"]),
    ("0-3,6,7", None, 8, ["0", "1", "2", "3", "6", "7"]),
    (" 2 ", None, 4, ["2"]),
    ("all", None, 4, ["0", "1", "2", "3"]),
    # counted as torch counts them here: inside CUDA_VISIBLE_DEVICES (a Slurm job's GPUs), whose
    # entries the children get, UUIDs included
    ("0-1", "4,5,6,7", 4, ["4", "5"]),
    ("all", "GPU-aaa,GPU-bbb", 2, ["GPU-aaa", "GPU-bbb"]),
    # --print-layout on a machine without CUDA: the ids as given
    ("4-7", None, None, ["4", "5", "6", "7"]),
])
def test_gpu_ids(spec, visible, count, ids):
    assert parse_gpus(spec, visible=visible, count=count) == ids


@pytest.mark.parametrize("spec,visible,count,message", [
    ("0-", None, 8, "--gpus '0-': expected GPU ids and ranges such as 0-7, 0,1,2,3 or 0-3,6 (or all)"),
    ("gpu0", None, 8, "expected GPU ids and ranges"),
    ("", None, 8, "expected GPU ids and ranges"),
    ("-1", None, 8, "expected GPU ids and ranges"),
    ("3-1", None, 8, "--gpus '3-1': the range 3-1 runs backwards; write 1-3"),
    ("0-3,2", None, 8, "--gpus '0-3,2' names GPU 2 twice"),
    ("0-8", None, 8, "--gpus '0-8': GPU 8 is not on this machine: torch sees 8 GPUs (0-7)"),
    ("1", None, 1, "GPU 1 is not on this machine: torch sees 1 GPU (0)"),
    ("2", "4,5", 2, "GPU 2 is not on this machine: torch sees 2 GPUs (0-1) through CUDA_VISIBLE_DEVICES=4,5"),
    ("2", "4,5", None, "through CUDA_VISIBLE_DEVICES=4,5"),
    ("all", None, None, "--gpus all needs CUDA to count the GPUs"),
    ("all", None, 0, "--gpus all: torch sees no GPU on this machine"),
])
def test_gpu_ids_refused(spec, visible, count, message):
    with pytest.raises(LayoutError) as err:
        parse_gpus(spec, visible=visible, count=count)
    assert message in str(err.value)
    assert err.value.exit_code == 2


# ---------------------------------------------------------------------- layouts

def test_four_learner_ranks_under_torchrun_and_a_collector_on_each_other_gpu():
    """The issue's node: 8 GPUs, 4 + 4."""
    layout = lay([str(i) for i in range(8)], learner_gpus=4, learn_args=("--max-steps", "5"), torchrun=("torchrun",))
    assert layout.ranks == 4 and layout.learner.gpus == ("0", "1", "2", "3")
    assert layout.learner.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert layout.learner.argv == ("torchrun", "--standalone", "--nproc-per-node", "4", "--no-python", *CLI, "learn",
                                   "--max-steps", "5", *COMMON, *SETS)
    assert layout.learner.threads == 4  # 16 cores shared by the 4 ranks
    assert [c.env for c in layout.collectors] == [{"CUDA_VISIBLE_DEVICES": str(g)} for g in (4, 5, 6, 7)]
    assert [c.argv for c in layout.collectors] == [(*CLI, "collect", "--name", f"r-collector-{i}", *COMMON, *SETS)
                                                   for i in range(4)]
    assert layout.eval_gpus == ("0",)
    ev = layout.evaluation(["--checkpoint", "base"], CLI, COMMON)
    assert ev.argv == (*CLI, "eval", "--checkpoint", "base", *COMMON, *SETS) and ev.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert ev.threads is None  # an evaluation runs alone, on every core


@pytest.mark.parametrize("n,learner,collectors", [
    (8, ("0", "1", "2", "3"), ("4", "5", "6", "7")),  # default: half
    (2, ("0",), ("1",)),
    (3, ("0",), ("1", "2")),
    (1, ("0",), ("0",)),  # one GPU: the learner and the collector share it
])
def test_the_default_split(n, learner, collectors):
    layout = lay([str(i) for i in range(n)])
    assert layout.learner.gpus == learner and tuple(c.gpus[0] for c in layout.collectors) == collectors
    # one rank: the plain learner command, no torchrun
    assert (layout.learner.argv[:len(CLI) + 1] == (*CLI, "learn")) == (len(learner) == 1)


def test_more_collectors_than_gpus_are_dealt_to_them_in_turn():
    layout = lay(["0", "1", "2"], learner_gpus=1, collectors=5)
    assert [c.gpus for c in layout.collectors] == [("1",), ("2",), ("1",), ("2",), ("1",)]
    assert [c.threads for c in layout.collectors] == [3] * 5  # 16 cores // 5


def test_the_cpu_layout_is_the_one_of_before():
    layout = lay(None, collectors=3, learn_args=("--max-steps", "2"))
    assert layout.ranks == 1 and layout.learner.argv == (*CLI, "learn", "--max-steps", "2", *COMMON)
    assert layout.learner.env == {} and layout.learner.threads == 16
    assert [(c.argv, c.env, c.threads) for c in layout.collectors] == [
        ((*CLI, "collect", "--name", f"r-collector-{i}", *COMMON), {}, 5) for i in range(3)]
    assert len(lay(None).collectors) == 1 and lay(None).overrides == ()


@pytest.mark.parametrize("gpus,kw,message", [
    (["0", "1", "2", "3"], {"learner_gpus": 4}, "--learner-gpus 4 takes all 4 GPUs of --gpus 0-3: no GPU is left for a "
                                                "collector; give fewer (e.g. --learner-gpus 2) or more GPUs"),
    (["0", "1"], {"learner_gpus": 3}, "--learner-gpus 3 is more than the 2 GPUs of --gpus 0,1"),
    (["0"], {"learner_gpus": 2}, "--learner-gpus 2 is more than the 1 GPU of --gpus 0"),
    (["0", "1", "2", "3"], {"learner_gpus": 1, "collectors": 2},
     "--collectors 2 leaves GPU 3 without a collector: the learner takes 0, and each other GPU of --gpus 0-3 gets one "
     "(leave --collectors out for 3, or give fewer --gpus)"),
    (None, {"learner_gpus": 2}, "--learner-gpus 2 needs --gpus (the GPUs to lay out, e.g. --gpus 0-7)"),
    ([], {}, "--gpus names no GPU"),
])
def test_layouts_refused(gpus, kw, message):
    with pytest.raises(LayoutError) as err:
        lay(gpus, spec="0-3" if gpus == ["0", "1", "2", "3"] else None, **kw)
    assert message in str(err.value)


# ---------------------------------------------------------------------- the command line

def test_print_layout_shows_the_commands_and_starts_nothing(monkeypatch):
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: pytest.fail("--print-layout started a process"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for var in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("REFLEXDB_DATABASE_URL", "postgresql://alice:secret@db/x")
    result = CliRunner().invoke(app, ["run", str(CONFIG), "--gpus", "0-7", "--learner-gpus", "4", "--print-layout",
                                      "--max-steps", "3"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "the learner (4 ranks under torchrun) on GPUs 0,1,2,3, 4 collectors" in out
    [learner] = [line for line in out.splitlines() if "torch.distributed.run" in line]
    assert learner.strip().startswith("CUDA_VISIBLE_DEVICES=0,1,2,3 OMP_NUM_THREADS=")
    assert "--standalone --nproc-per-node 4 --no-python" in learner
    assert "reflexdb.cli.main learn --max-steps 3 -c" in learner and "--set=learner.device=cuda" in learner
    for gpu, i in zip(range(4, 8), range(4)):
        assert f"CUDA_VISIBLE_DEVICES={gpu} " in out and f"collect --name arithmetic-grpo-collector-{i}" in out
    assert "eval --checkpoint base --json" in out
    assert "secret" not in out  # the database URL travels in the environment, and is not printed


def test_gpus_on_a_machine_without_cuda_are_refused_unless_printing(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LayoutError) as err:
        launch.gpus_here("0-3")
    assert "reflexdb run --gpus 0-3: torch sees no CUDA GPU on this machine" in str(err.value)
    assert "leave --gpus out to run on the CPU, or add --print-layout" in str(err.value)
    assert launch.gpus_here("0-3", print_only=True) == ["0", "1", "2", "3"]
    assert launch.gpus_here(None) is None
    # with CUDA, the ids are checked against the machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,6,7")
    assert launch.gpus_here("all") == ["2", "3", "6", "7"]
    with pytest.raises(LayoutError, match="GPU 4 is not on this machine: torch sees 4 GPUs"):
        launch.gpus_here("0-4")


def test_the_launcher_starts_the_layout_and_stops_the_ranks_not_torchrun(monkeypatch):
    """Each child starts with its CUDA_VISIBLE_DEVICES; a Ctrl-C sends SIGTERM to the learner's ranks
    (torchrun's children) and not to torchrun, which would kill them 30 s later, publishing or not."""
    started: list[tuple[list[str], dict]] = []
    signalled: list[tuple[int, int]] = []

    class Proc:
        def __init__(self, pid):
            self.pid = pid

        def wait(self, timeout=None):
            if not launcher.interrupts:
                launcher._on_signal(signal.SIGINT, None)  # Ctrl-C while the learner trains
            return 0

        def poll(self):
            return None

        def send_signal(self, sig):
            signalled.append((self.pid, sig))

    def popen(cmd, env, **kw):
        started.append((cmd, env))
        return Proc(1000 + len(started))

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    monkeypatch.setattr(launch, "child_pids", lambda pid: [pid * 10, pid * 10 + 1])  # torchrun's two ranks
    monkeypatch.setattr(launch.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    launcher = launch.Launcher(CONFIG, max_steps=1, max_seconds=None, collectors=None, overrides=None, evaluate=False,
                               echo=lambda m: None, gpus=["0", "1", "2", "3"], learner_gpus=2)
    launcher.url = "postgresql://unused"
    assert launcher._train() == 0
    seen = {("learner" if "torch.distributed.run" in cmd else cmd[cmd.index("--name") + 1]): env["CUDA_VISIBLE_DEVICES"]
            for cmd, env in started}
    assert seen == {"learner": "0,1", "arithmetic-grpo-collector-0": "2", "arithmetic-grpo-collector-1": "3"}
    learner_pid = 1000 + len(started)  # started last
    # the ranks got SIGTERM, torchrun did not; the collectors got theirs (and again after the learner ended)
    assert (learner_pid * 10, signal.SIGTERM) in signalled and (learner_pid * 10 + 1, signal.SIGTERM) in signalled
    assert (learner_pid, signal.SIGTERM) not in signalled
    assert {pid for pid, _ in signalled} >= {1001, 1002}


def test_torchrun_takes_the_learners_command_line_as_built(tmp_path):
    """The learner's command line, with a script that prints what each rank sees in place of
    ``reflexdb learn``: torchrun (``--standalone --no-python``, this interpreter's ``-P``) starts two
    ranks, each with its RANK, LOCAL_RANK (the GPU DeepSpeed puts it on: ``cuda:LOCAL_RANK``) and
    the layout's CUDA_VISIBLE_DEVICES."""
    show = ("import os; open(f'rank{os.environ[\"RANK\"]}', 'w').write(' '.join(os.environ[k] for k in "
            "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'CUDA_VISIBLE_DEVICES')))")
    layout = plan(["5", "6", "7"], run="r", cores=2, learner_gpus=2, cli=(sys.executable, "-P", "-c", show))
    argv = list(layout.learner.argv)
    argv = argv[:argv.index("learn")]  # `python -P -c SHOW` instead of `... learn -c CONFIG`
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}}
    out = subprocess.run(argv, env={**env, **layout.learner.env}, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["0 0 2 5,6", "1 1 2 5,6"]


def test_the_documented_deepspeed_launcher_commands_pass_no_local_rank():
    """The DeepSpeed launcher puts ``--local_rank=N`` before the module's arguments unless told
    ``--no_local_rank``, and ``reflexdb --local_rank=0 learn`` is refused: every documented
    ``deepspeed ... --module reflexdb.cli.main`` line says ``--no_local_rank``."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = [(p.name, line) for p in pages for line in p.read_text().splitlines()
             if re.search(r"\bdeepspeed\b.*--module reflexdb", line)]
    assert lines  # the docs show the launcher
    assert [x for x in lines if "--no_local_rank" not in x[1]] == []
