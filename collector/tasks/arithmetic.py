"""Built-in synthetic arithmetic: seeded, graded by difficulty, with disjoint train / eval splits.

Small arithmetic is a good CPU-scale RL task: SmolLM2-135M solves single-digit addition about a
third of the time at temperature 1 (ENVIRONMENT.md), a mixed success rate that gives GRPO signal.

Levels:

====== ===================================================== ===============
level  problems                                               example
====== ===================================================== ===============
1      single-digit addition                                  ``7 + 5``
2      two-digit plus one-digit addition                      ``43 + 8``
3      two-digit addition or subtraction (never negative)     ``71 - 36``
4      multiplication, 2..19 times 2..9                       ``14 * 6``
5      three small terms with precedence or parentheses       ``(4 + 9) * 3``
6      three-digit addition / subtraction, two-digit product  ``512 - 287``
7      a product of multi-digit numbers (3-4 by 2-4 digits)   ``4821 * 376``
8      a long sum: 5 to 7 terms of 3 to 5 digits              ``482 + 9171 + ...``
9      a call of Python's ``math`` module                     ``math.comb(23, 4)``
====== ===================================================== ===============

Levels 7 and 8 are beyond a small model's mental arithmetic: tasks where a tool (the
``tool_python`` environment's interpreter) matters. Level 9 names a library call (``comb``,
``factorial``, ``gcd``, ``lcm``, ``isqrt`` of ``math``): a tool task whose code fails in a
fixable way when the model forgets ``import math`` (CLEANER's regime, docs/cleaner.md); some of
its problems (a small ``gcd`` or ``lcm``) are within mental reach.

The split of a problem is a pure function of its text (a SHA-256 bucket), not of the seed: the
train and eval sets are disjoint for every seed, and the eval set is the same in every run.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence

from .base import Task

Draw = Callable[[random.Random], tuple[str, int]]


def _level1(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"{a} + {b}", a + b


def _level2(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(0, 9)
    return f"{a} + {b}", a + b


def _level3(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        return f"{a} + {b}", a + b
    a, b = max(a, b), min(a, b)
    return f"{a} - {b}", a - b


def _level4(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 19), rng.randint(2, 9)
    return f"{a} * {b}", a * b


def _level5(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(2, 9)
    form = rng.randrange(4)
    if form == 0:
        return f"{a} + {b} * {c}", a + b * c
    if form == 1:
        return f"({a} + {b}) * {c}", (a + b) * c
    if form == 2:
        return f"{a} * {c} - {b}", a * c - b
    return f"{c} * ({a} + {b})", c * (a + b)


def _level6(rng: random.Random) -> tuple[str, int]:
    form = rng.randrange(3)
    if form == 2:
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        return f"{a} * {b}", a * b
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    if form == 0:
        return f"{a} + {b}", a + b
    a, b = max(a, b), min(a, b)
    return f"{a} - {b}", a - b


def _level7(rng: random.Random) -> tuple[str, int]:
    a = rng.randint(100, 9999)
    b = rng.randint(10, 9999)
    return f"{a} * {b}", a * b


def _level8(rng: random.Random) -> tuple[str, int]:
    terms = [rng.randint(100, 99999) for _ in range(rng.randint(5, 7))]
    return " + ".join(map(str, terms)), sum(terms)


def _level9(rng: random.Random) -> tuple[str, int]:
    form = rng.randrange(5)
    if form == 0:
        n, k = rng.randint(10, 40), rng.randint(2, 6)
        return f"math.comb({n}, {k})", math.comb(n, k)
    if form == 1:
        n = rng.randint(7, 14)
        return f"math.factorial({n})", math.factorial(n)
    if form == 2:
        g, x, y = rng.randint(2, 50), rng.randint(2, 60), rng.randint(2, 60)
        return f"math.gcd({g * x}, {g * y})", math.gcd(g * x, g * y)
    if form == 3:
        a, b = rng.randint(4, 60), rng.randint(4, 60)
        return f"math.lcm({a}, {b})", math.lcm(a, b)
    n = rng.randint(1000, 999999)
    return f"math.isqrt({n})", math.isqrt(n)


#: level → problem drawer.
LEVELS: dict[int, Draw] = {1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5, 6: _level6, 7: _level7,
                           8: _level8, 9: _level9}


def split_of(level: int, expression: str, eval_fraction: float = 0.1) -> str:
    """``eval`` for a fixed ``eval_fraction`` of all problems (by hash of the problem), else ``train``."""
    digest = hashlib.sha256(f"arithmetic/{level}/{expression}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64
    return "eval" if bucket < eval_fraction else "train"


def prompt_of(expression: str) -> str:
    return f"What is {expression}?"


def arithmetic_tasks(
    n: int,
    *,
    level: int | Sequence[int] = 1,
    split: str = "train",
    seed: int = 0,
    eval_fraction: float = 0.1,
) -> list[Task]:
    """``n`` distinct arithmetic tasks of one split.

    Args:
        n: how many tasks.
        level: a difficulty level, or several to draw from uniformly.
        split: ``train`` or ``eval``.
        seed: the same seed (and arguments) gives the same tasks in the same order.
        eval_fraction: share of the problem space reserved for ``eval``.

    Raises:
        ValueError: for an unknown level or split, or when the levels hold fewer than ``n``
            distinct problems of the split (level 1 has only 100 problems in all).
    """
    levels = [level] if isinstance(level, int) else list(level)
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown or not levels:
        raise ValueError(f"unknown arithmetic level(s) {unknown or levels}; known: {sorted(LEVELS)}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(f"reflexdb-arithmetic/{seed}")
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * n + 2000:
            raise ValueError(
                f"found only {len(tasks)} distinct {split} problems at level(s) {levels}; ask for fewer"
            )
        lv = rng.choice(levels)
        expression, answer = LEVELS[lv](rng)
        key = f"L{lv}:{expression}"
        if key in seen or split_of(lv, expression, eval_fraction) != split:
            continue
        seen.add(key)
        tasks.append(
            Task(
                prompt=prompt_of(expression),
                ground_truth=str(answer),
                dataset="arithmetic",
                split=split,
                task_key=key,
                meta={"level": lv, "expression": expression},
            )
        )
    return tasks
