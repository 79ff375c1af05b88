"""A learner rank killed mid-step under torchrun: every rank stops with one line, and the same
command resumes with nothing lost (issue 62). Opt-in (about a minute a case: a learner of one
process and two starts of two ranks, on the tiny model): ``REFLEXDB_RANK_DRILL=1``.

CI runs the same mechanism at the engine level, in seconds (tests/unit/test_ranks.py: two gloo
processes, one killed; rank 0's heartbeats while it waits for groups), and the learner's resume
after a kill in tests/e2e/test_learn.py (``test_resume_after_kill_9``) and the failure drill.
Here, the whole learner: two ranks on the CPU (gloo) train step 1 and publish v1; in step 2 one
rank is killed (rank 1 as it starts the step; or rank 0 as it records the step, rank 1 waiting for
it); the other stops at once with ``learner rank R of 2 lost another rank after step N (...)``
(exit 10); the same command resumes from v1 and trains step 2 again, and its v2 equals the v2 of
one process that was never interrupted.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import REFLEXDB, child_env, rows
from tests.store.test_learn import config_data, seed_groups, write_config

pytestmark = pytest.mark.skipif(not os.environ.get("REFLEXDB_RANK_DRILL"),
                                reason="opt-in, about a minute a case (REFLEXDB_RANK_DRILL=1)")


def _ranks(torchrun: int) -> dict[int, int]:
    """torchrun's workers, by RANK."""
    from reflexdb.cli.children import child_pids

    out = {}
    for pid in child_pids(torchrun):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
        if rank:  # (not yet: torchrun's fork before the exec)
            out[int(rank[0])] = pid
    return out


def _held(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


def _weights(store, name: str, version: int):
    from safetensors.torch import load_file

    [(uri,)] = rows(store, "SELECT p.checkpoint_uri FROM policy_versions p JOIN runs r ON r.id = p.run_id "
                           "WHERE r.name = :n AND p.version = :v", n=name, v=version)
    return load_file(str(Path(uri.removeprefix("file://")) / "model.safetensors"))


def _setup(store, tmp_path, db_url, model_cache, name):
    seed_groups(store, name, 4, seed=7)  # two steps of two groups
    data = config_data(publish_every=1, micro_batch_size=2)
    data.update(run=name, max_staleness=100)
    (tmp_path / name).mkdir()
    return write_config(tmp_path / name, data), child_env(db_url, tmp_path / name, model_cache)


def _torchrun(cfg) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
            "-m", "reflexdb.cli.main", "learn", "-c", str(cfg), "--max-steps", "2"]


@pytest.mark.parametrize("phase,victim", [("step", 1), ("record", 0)])
def test_a_rank_killed_mid_step_stops_every_rank_and_the_run_resumes_losslessly(store, db_url, tmp_path, model_cache,
                                                                                phase, victim):
    import torch

    cfg, env = _setup(store, tmp_path, db_url, model_cache, "one")
    one = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "2"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]

    cfg, env = _setup(store, tmp_path, db_url, model_cache, "two")
    drill = tmp_path / "drill"
    drill.mkdir()
    proc = subprocess.Popen(_torchrun(cfg), env=dict(env, REFLEXDB_DRILL_DIR=str(drill), REFLEXDB_DRILL_HOLD=phase),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        ranks: dict[int, int] = {}
        while True:  # each entry into `phase` holds the rank(s) that pass it: step 1 goes on, step 2 is hit
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            ranks = ranks if len(ranks) == 2 else _ranks(proc.pid)
            held = [r for r, pid in ranks.items() if _held(pid)]
            if held and (phase == "record" or len(held) == 2):
                if rows(store, "SELECT count(*) FROM learner_steps s JOIN runs r ON r.id = s.run_id "
                               "WHERE r.name = 'two'") == [(1,)]:
                    break
                for r in held:
                    os.kill(ranks[r], signal.SIGCONT)
            time.sleep(0.02)
        os.kill(ranks[victim], signal.SIGKILL)
        killed = time.monotonic()
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        proc.kill()
    survivor = 1 - victim
    assert proc.returncode != 0
    lost = [line for line in out.splitlines() if line.startswith("error: learner rank")]
    assert lost == [lost[0]] and lost[0].startswith(f"error: learner rank {survivor} of 2 lost another rank after "
                                                    f"step {1 if phase == 'step' else 2} ("), out[-3000:]
    assert re.search(r"Connection (closed|reset) by peer", lost[0]) and "Run the same command to resume" in lost[0]
    assert not any(line.startswith(f"[rank{survivor}]: Traceback") for line in out.splitlines())
    assert took < 60
    assert rows(store, "SELECT s.step FROM learner_steps s JOIN runs r ON r.id = s.run_id WHERE r.name = 'two'") == \
        [(1,)]  # step 2 never recorded

    again = subprocess.run(_torchrun(cfg), env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed run 'two' at step 1 (learner state of policy v1)" in again.stderr
    # nothing lost, nothing trained twice: steps 1 and 2 took the 4 groups once each, and v2 is the
    # v2 of one process that was never interrupted
    assert rows(store, "SELECT s.step, count(*) FROM learner_steps s JOIN runs r ON r.id = s.run_id "
                       "JOIN consumption c ON c.step_id = s.id WHERE r.name = 'two' GROUP BY 1 ORDER BY 1") == \
        [(1, 8), (2, 8)]
    assert rows(store, "SELECT count(*) FROM trajectories WHERE times_sampled <> "
                       "(SELECT count(*) FROM consumption c WHERE c.trajectory_id = trajectories.id)") == [(0,)]
    a, b = _weights(store, "one", 2), _weights(store, "two", 2)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-4, rtol=1e-4), (k, float((a[k] - b[k]).abs().max()))
