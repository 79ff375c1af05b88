"""A learner rank that dies stops every rank with one clear message (issue 62), and rank 0's long
waits for groups never time the others out (trainer/ranks.py).

At the engine level, cheaply: two processes, gloo on the CPU, no model, torch.distributed set up
by the learner's own ``init_distributed`` with ``learner.dist_timeout_s`` of 2 s. Rank 0 decides
only after 3 s (1.5 times the timeout; the learner's rank 0 waiting for groups): its heartbeats keep
rank 1 in the broadcast. Then both "train" (an all-reduce a step) until rank 1 is killed; rank 0
stops at once with one line, not a traceback and not a wait for the timeout. The whole learner
under torchrun, killed mid-step and resumed, is the opt-in test
``tests/e2e/test_rank_drill.py`` (about a minute: two learner starts of two ranks).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from reflexdb.trainer import ranks

TIMEOUT_S = 2.0

SCRIPT = r"""
import os, sys, time
import deepspeed, torch  # imported before the rendezvous: the two processes meet within its timeout
from reflexdb.errors import ReflexdbError
from reflexdb.trainer import ranks
from reflexdb.trainer.engine import init_distributed

timeout, rank = float(sys.argv[1]), int(os.environ["RANK"])
open(f"ready{rank}", "w").close()
while not os.path.exists(f"ready{1 - rank}"):
    time.sleep(0.01)
init_distributed("cpu", lambda m: None, timeout_s=timeout)
t0 = time.monotonic()
steps = 0


def decide(until):  # rank 0 has the step's groups only after 1.5 times the collective timeout
    if time.monotonic() - t0 < 1.5 * timeout:
        time.sleep(max(0.0, until - time.monotonic()))
        return ranks.WAITING
    return [7, 8]


try:
    with ranks.stop_if_a_rank_is_lost(lambda: steps, timeout):
        chosen = ranks.from_rank0(decide, rank=rank, world=2, beat_s=timeout / 4)
        print(f"chose {chosen} after {time.monotonic() - t0:.1f} s", flush=True)
        while True:  # a step: an all-reduce, until the other rank is gone
            t = torch.ones(8)
            torch.distributed.all_reduce(t)
            steps += 1
            if steps == 3:
                print("training", flush=True)
            time.sleep(0.02)
except ReflexdbError as exc:  # as the reflexdb command prints it
    print(f"error: {exc}", file=sys.stderr, flush=True)
    sys.exit(exc.exit_code)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_that_dies_stops_the_other_with_one_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", DS_ACCELERATOR="cpu",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-P", "-c", SCRIPT, str(TIMEOUT_S)], cwd=tmp_path, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for r in (0, 1)]
    try:
        lines = [[p.stdout.readline().strip() for _ in range(2)] for p in procs]
        # both chose what rank 0 decided after 1.5 x the timeout: rank 1 waited in the broadcast all along
        for (chose, training), p in zip(lines, procs):
            assert chose.startswith("chose [7, 8] after ") and training == "training", (chose, p.poll())
            assert float(chose.split()[-2]) >= 1.5 * TIMEOUT_S
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = procs[0].communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == ranks.RankLost.exit_code == 10, err[-3000:]
    [line] = [x for x in err.splitlines() if x.strip()]  # one line, no traceback
    assert line.startswith("error: learner rank 0 of 2 lost another rank after step "), line
    assert re.search(r"\(.*Connection (closed|reset) by peer", line), line  # gloo says either
    assert "every rank stops" in line and "Run the same command to resume" in line
    assert took < 30  # at once, not after a collective timeout (the learner's is 900 s)


@pytest.mark.parametrize("message,peer", [
    ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
     "[127.0.0.1]:6552. This is typically caused by a remote worker crashing. Check the logs ... GLHF!", True),
    ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms "
     "for recv operation to complete", True),
    ("Connection reset by peer", True),
    ("[enforce fail at ../third_party/gloo/gloo/allreduce.cc:39] inputs.size() == outputs.size()", False),  # a bug
    ("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)", False),
])
def test_what_counts_as_a_lost_rank(message, peer):
    assert ranks.peer_failure(RuntimeError(message)) is peer
    assert not ranks.peer_failure(ValueError("Connection closed by peer"))


def test_the_message_names_the_rank_the_step_and_what_torch_said():
    exc = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
                       "peer [127.0.0.1]:6552. This is typically caused by a remote worker crashing. GLHF! x")
    text = str(ranks.lost(exc, rank=3, world=8, steps=41, timeout_s=900))
    assert text.startswith("learner rank 3 of 8 lost another rank after step 41 (Connection closed by peer "
                           "[127.0.0.1]:6552): a rank died, or did not answer for 900 s (learner.dist_timeout_s); "
                           "every rank stops.")
    assert "before its first step" in str(ranks.lost(exc, rank=1, world=2, steps=0, timeout_s=900))
    with pytest.raises(ValueError):  # one process: every error passes unchanged
        with ranks.stop_if_a_rank_is_lost(lambda: 0, 900):
            raise ValueError("x")
    with pytest.raises(RuntimeError, match="Connection closed by peer"):  # not distributed: no rank to lose
        with ranks.stop_if_a_rank_is_lost(lambda: 0, 900):
            raise exc
