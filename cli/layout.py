"""Where ``reflexdb run`` puts its children: learner ranks on some GPUs, one collector on each other GPU.

``reflexdb run CONFIG --gpus 0-7 --learner-gpus 4`` starts the commands a user would type by hand
on a node of eight GPUs::

    CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun --standalone --nproc-per-node 4 --no-python \\
        python -P -m reflexdb.cli.main learn -c CONFIG --set=learner.device=cuda ...
    CUDA_VISIBLE_DEVICES=4 python -P -m reflexdb.cli.main collect --name RUN-collector-0 -c CONFIG ...
    ...                                                                 # one per GPU 4, 5, 6, 7

Each learner rank trains on ``cuda:LOCAL_RANK`` of the GPUs its ``CUDA_VISIBLE_DEVICES`` shows
(DeepSpeed's choice; torchrun sets ``LOCAL_RANK``), each collector on the one GPU it sees.
``--gpus`` counts the GPUs as torch does in this process: inside ``CUDA_VISIBLE_DEVICES`` (a Slurm
job's GPUs, say), so ``--gpus 0-1`` under ``CUDA_VISIBLE_DEVICES=4,5`` gives the children ``4`` and
``5``. Without ``--gpus`` the layout is the CPU one of before: one learner process and
``--collectors`` collectors, sharing the cores.

Everything here is pure (no CUDA, no process, no config file): a GPU list and a split in, command
lines and their environments out, so the layouts are tested on machines without a GPU and
``reflexdb run --print-layout`` shows them before anything starts.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from reflexdb.errors import ReflexdbError

from .children import python_module

#: how ``reflexdb run`` starts a child: ``python -m reflexdb.cli.main``, the working directory kept
#: off its path (cli/children.py)
CLI = tuple(python_module("reflexdb.cli.main"))
#: torchrun, as a module of this interpreter (no ``torchrun`` script needed on the PATH)
TORCHRUN = tuple(python_module("torch.distributed.run"))
#: what ``--gpus`` sets in every child, after the user's ``--set``: the learner and the collectors
#: (and ``reflexdb eval``, which builds the collector's engine) on the GPU(s) the child sees
GPU_OVERRIDES = ("learner.device=cuda", "collector.device=cuda")

_SPEC = re.compile(r"^\d+(-\d+)?$")


class LayoutError(ReflexdbError):
    """``reflexdb run`` was asked for a layout it cannot start: GPU ids that do not parse or are not
    on the machine, no GPU left for a collector, a GPU left without one. Nothing was started."""

    exit_code = 2


def parse_gpus(spec: str, *, visible: str | None = None, count: int | None = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the GPUs that ``--gpus SPEC`` names.

    Args:
        spec: ids and ranges as torch counts the GPUs here (``0-7``, ``0,1,2,3``, ``0-3,6``), or
            ``all``.
        visible: this process's ``CUDA_VISIBLE_DEVICES`` (None: unset). Id ``i`` is its ``i``-th
            entry, so the children see the same GPU that torch calls ``cuda:i`` here.
        count: ``torch.cuda.device_count()``; None where CUDA is missing (``--print-layout`` on a
            machine without GPUs: ids are then not checked against the machine).

    Raises:
        LayoutError: a malformed spec, an id named twice, an id not on the machine, ``all`` without CUDA.
    """
    text = spec.strip()
    entries = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
    if text == "all":
        if count is None:
            raise LayoutError("--gpus all needs CUDA to count the GPUs, and torch sees none here: name them "
                              "(--gpus 0-7) to print a layout for another machine")
        ids = list(range(count))
    else:
        ids = []
        for part in text.split(","):
            part = part.strip()
            if not _SPEC.match(part):
                raise LayoutError(f"--gpus {spec!r}: expected GPU ids and ranges such as 0-7, 0,1,2,3 or 0-3,6 "
                                  "(or all)")
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first:
                raise LayoutError(f"--gpus {spec!r}: the range {part} runs backwards; write {last}-{first}")
            ids += range(first, last + 1)
    seen = set()
    for i in ids:
        if i in seen:
            raise LayoutError(f"--gpus {spec!r} names GPU {i} twice")
        seen.add(i)
    if not ids:
        raise LayoutError("--gpus all: torch sees no GPU on this machine")
    limit = count if count is not None else (len(entries) if entries is not None else None)
    if limit is not None and entries is not None:
        limit = min(limit, len(entries))
    for i in ids:
        if limit is not None and i >= limit:
            where = f"torch sees {limit} GPU{'s' if limit != 1 else ''}" + (f" (0-{limit - 1})" if limit > 1 else
                                                                          " (0)" if limit == 1 else "")
            if entries is not None:
                where += f" through CUDA_VISIBLE_DEVICES={visible}"
            raise LayoutError(f"--gpus {spec!r}: GPU {i} is not on this machine: {where}")
    return [entries[i] for i in ids] if entries is not None else [str(i) for i in ids]


@dataclass(frozen=True)
class Child:
    """One process ``reflexdb run`` starts: what it is, its command line, and what the layout sets
    in its environment (the launcher adds the database URL and ``OMP_*``)."""

    role: str  # "learner", "collector 0", "evaluation"
    argv: tuple[str, ...]
    gpus: tuple[str, ...] = ()  # the CUDA_VISIBLE_DEVICES entries it sees; () on the CPU
    threads: int | None = None  # OpenMP threads, unless the user set OMP_NUM_THREADS; None: every core

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)} if self.gpus else {}

    def where(self) -> str:
        if not self.gpus:
            return "on the CPU"
        return f"on GPU{'s' if len(self.gpus) > 1 else ''} {','.join(self.gpus)}"

    def shell(self, env: dict[str, str] | None = None) -> str:
        """The command line as a shell would take it, with ``env`` (default: the layout's) in front."""
        env = self.env if env is None else env
        return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(self.argv)])


@dataclass(frozen=True)
class Layout:
    """The children of one ``reflexdb run``: the learner (one process, or ``ranks`` under torchrun),
    the collectors, and where the evaluations run (before and after training, alone)."""

    learner: Child
    ranks: int
    collectors: tuple[Child, ...]
    eval_gpus: tuple[str, ...] = ()
    overrides: tuple[str, ...] = field(default=())  # --set KEY=VALUE the layout adds to every child

    def evaluation(self, args: Sequence[str], cli: Sequence[str], common: Sequence[str]) -> Child:
        """``reflexdb eval ARGS`` on the evaluation's GPU (the learner's first), with every core."""
        return Child("evaluation", (*cli, "eval", *args, *common, *_sets(self.overrides)), self.eval_gpus)


def _sets(overrides: Sequence[str]) -> list[str]:
    return [f"--set={o}" for o in overrides]


def default_learner_gpus(n: int) -> int:
    """The learner's share of ``n`` GPUs when ``--learner-gpus`` is not given: half (4 of 8, 1 of 2
    or 3); the one GPU of a single-GPU machine, which the collectors share."""
    return max(1, n // 2)


def plan(gpus: Sequence[str] | None, *, run: str, cores: int, learner_gpus: int | None = None,
         collectors: int | None = None, common: Sequence[str] = (), learn_args: Sequence[str] = (),
         cli: Sequence[str] = CLI, torchrun: Sequence[str] = TORCHRUN, spec: str | None = None) -> Layout:
    """Lay ``reflexdb run``'s children out on ``gpus`` (or on the CPU).

    With GPUs, the first ``learner_gpus`` (default: :func:`default_learner_gpus`) are the learner's:
    one rank each, under torchrun (``--standalone``: a rendezvous of its own on a free port) when
    there are several; the others get one collector each (``collectors`` more are dealt to them in
    turn). A single GPU is shared: the learner and the collectors all see it. Every child gets
    ``--set learner.device=cuda --set collector.device=cuda`` after ``common``.

    Args:
        gpus: ``CUDA_VISIBLE_DEVICES`` entries (:func:`parse_gpus`); None: the CPU layout (one
            learner process on every core, ``collectors`` (default 1) with ``cores // n`` each).
        run: the run's name (collectors are named ``RUN-collector-i``).
        cores: this machine's cores (OpenMP threads are shared out).
        learner_gpus: GPUs (ranks) of the learner.
        collectors: collector processes (default: one per collector GPU; 1 on the CPU).
        common: what every child's command ends with (``-c CONFIG``, the user's ``--set``).
        learn_args: ``reflexdb learn``'s own options (``--max-steps N``).
        cli, torchrun: the command lines of ``reflexdb`` and torchrun.
        spec: ``--gpus`` as typed, for messages.

    Raises:
        LayoutError: a split the GPUs cannot hold.
    """
    spec = spec if spec is not None else ",".join(gpus or ())
    if gpus is None:
        if learner_gpus is not None:
            raise LayoutError(f"--learner-gpus {learner_gpus} needs --gpus (the GPUs to lay out, e.g. --gpus 0-7)")
        n = collectors if collectors is not None else 1
        learner = Child("learner", (*cli, "learn", *learn_args, *common), threads=cores)
        return Layout(learner, 1, tuple(
            Child(f"collector {i}", (*cli, "collect", "--name", f"{run}-collector-{i}", *common),
                  threads=max(1, cores // n)) for i in range(n)))
    gpus = tuple(gpus)
    n = len(gpus)
    if not n:
        raise LayoutError("--gpus names no GPU")
    k = learner_gpus if learner_gpus is not None else default_learner_gpus(n)
    if k < 1:
        raise LayoutError(f"--learner-gpus {k}: the learner needs at least one GPU")
    if k > n:
        raise LayoutError(f"--learner-gpus {k} is more than the {n} GPU{'s' if n > 1 else ''} of --gpus {spec}")
    if k == n and n > 1:
        raise LayoutError(f"--learner-gpus {k} takes all {n} GPUs of --gpus {spec}: no GPU is left for a collector; "
                          f"give fewer (e.g. --learner-gpus {default_learner_gpus(n)}) or more GPUs (a single GPU "
                          "is shared by the learner and the collectors)")
    mine, theirs = gpus[:k], (gpus[k:] if n > 1 else gpus)
    m = collectors if collectors is not None else len(theirs)
    if m < len(theirs):
        idle = ",".join(theirs[m:])
        raise LayoutError(f"--collectors {m} leaves GPU{'s' if len(theirs) - m > 1 else ''} {idle} without a "
                          f"collector: the learner takes {','.join(mine)}, and each other GPU of --gpus {spec} "
                          f"gets one (leave --collectors out for {len(theirs)}, or give fewer --gpus)")
    tail = (*common, *_sets(GPU_OVERRIDES))
    learn = (*cli, "learn", *learn_args, *tail)
    if k > 1:
        learn = (*torchrun, "--standalone", "--nproc-per-node", str(k), "--no-python", *learn)
    learner = Child("learner", learn, mine, threads=max(1, cores // k))
    out = tuple(Child(f"collector {i}", (*cli, "collect", "--name", f"{run}-collector-{i}", *tail),
                      (theirs[i % len(theirs)],), threads=max(1, cores // m)) for i in range(m))
    return Layout(learner, k, out, eval_gpus=(mine[0],), overrides=GPU_OVERRIDES)
