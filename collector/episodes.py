"""The rollout driver: many episodes of an environment at once, over any engine.

    episodes = Rollout(engine, make_env, params).run(tasks, n)    # n episodes per task

Turn 0: every task's first messages, ``n`` samples each, in one engine call (the ``n`` samples
of a prompt share its prefill). Turn k > 0: every unfinished episode of the batch continues in
one engine call, its prompt being the token ids of the conversation so far; the engine reuses
what it can of the shared prefix (the HF engine prefills a prefix shared by several rows once).
This repeats until every episode is done. Never one episode at a time.

An episode is one trajectory (docs/concepts.md, "Episodes, turns, spans and loss masks"):

- ``prompt_ids``: the first messages under the chat template, with the generation prompt;
- ``response_ids``: assistant turn 0, the environment's turn 0, assistant turn 1, ... where every
  assistant token is exactly the token the engine sampled, with its behaviour log-prob and the
  policy version that sampled it, and every environment token is what the chat template renders
  for the environment's message (log-prob 0, never trained on);
- ``turns``: one row per turn with its span in ``response_ids``, ``trainable`` on assistant turns
  only, the attempt index and the environment's verdict. The loss mask is the union of the
  trainable spans (reflexdb/validate.py builds it), so the learner never re-tokenises.

**Turn boundaries.** The assistant's sampled tokens end with the token that stopped it (EOS:
``<|im_end|>`` for ChatML templates), or with no closing token when it was truncated or stopped
by a stop string. The environment's span is the text the chat template puts between the end of
the assistant's content and the start of the next assistant's content, minus a closing token the
assistant already sampled: for SmolLM2 ``"\\n<|im_start|>user\\nIncorrect. ...<|im_end|>\\n<|im_start|>assistant\\n"``
(or ``"<|im_end|>\\n<|im_start|>user..."`` after a truncated turn). It is tokenised on its own;
special tokens in it are recognised as such. Decoding ``prompt_ids + response_ids`` therefore
reproduces the template's rendering of the whole conversation (tests/test_episodes.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reflexdb import TrajectoryIn, TurnIn
from reflexdb.timing import PhaseTimer

from .engines import Sample, SamplingParams, timed
from .environments import Environment, EnvTask, Step, make_environment
from .tasks.templates import get_template, render_chat

#: Stands in for an assistant message's content when locating turn boundaries in the rendered text.
_SENTINEL = "\u2063reflexdb\u2063turn\u2063"


def environment_ids(tokenizer: Any, history: Sequence[dict], feedback: Sequence[dict], sampled: Sequence[int],
                    finish_reason: str) -> list[int]:
    """Token ids of what the chat template puts between an assistant turn and the next one.

    Args:
        history: the conversation before the assistant turn (prompt messages, earlier turns).
        feedback: the environment's messages after it.
        sampled: the assistant turn's sampled token ids (their last may be a closing token).
    Raises:
        ValueError: the template renders earlier turns differently once more turns follow (then
            the stored conversation could not be one sequence).
    """
    closed = [*history, {"role": "assistant", "content": _SENTINEL}]
    a = render_chat(tokenizer, closed, add_generation_prompt=False)
    b = render_chat(tokenizer, [*closed, *feedback], add_generation_prompt=True)
    if not b.startswith(a) or _SENTINEL not in a:
        raise ValueError("the chat template renders a conversation differently once more turns follow; "
                         "multi-turn episodes need a template that only appends")
    closing = a[a.rindex(_SENTINEL) + len(_SENTINEL):]
    if finish_reason == "stop" and sampled:
        last = tokenizer.decode([int(sampled[-1])], skip_special_tokens=False)
        if int(sampled[-1]) in set(tokenizer.all_special_ids) and last and closing.startswith(last):
            closing = closing[len(last):]  # the model already sampled the closing token
    return list(tokenizer.encode(closing + b[len(a):], add_special_tokens=False))


@dataclass
class RolloutStats:
    """What one :meth:`Rollout.run` did (collector progress, benchmarks/episodes_bench.py). A
    collector shares one among all its drivers and counts its other engine calls
    (``Collector.sample``) in it too: ``sampled_tokens`` is then every token its engine sampled."""

    episodes: int = 0
    turns: int = 0  # assistant turns sampled
    engine_calls: int = 0
    sampled_tokens: int = 0
    environment_tokens: int = 0
    prompt_tokens: int = 0  # prompt tokens of every row of every call (what a cacheless engine prefills)
    seconds: float = 0.0


@dataclass
class Start:
    """An episode to run from a given point (:meth:`Rollout.resume`).

    Attributes:
        env: its environment, reset or restored (``env.restore(k)``) to where the episode starts.
        messages: the conversation the next assistant turn answers (the episode's prompt: stored
            as prompt turns, rendered with the chat template).
        attempt: the index of the next assistant turn (``k`` after ``restore(k)``; 0 when reset).
    """

    env: Environment
    messages: list[dict]
    attempt: int = 0


@dataclass
class Episode:
    """A finished (or running) episode: its environment and what was sampled; :meth:`trajectory`."""

    env: Environment
    messages: list[dict]  # the conversation so far, as chat messages
    prompt_turns: list[dict]
    attempt: int = 0  # the index of the next assistant turn
    prompt_ids: np.ndarray | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[TurnIn] = field(default_factory=list)
    generations: list[dict[str, Any]] = field(default_factory=list)  # each timed turn's engine call
    emb_sum: np.ndarray | None = None
    emb_tokens: int = 0
    finish_reason: str = "stop"
    last: Step | None = None
    error: str | None = None

    def take(self, s: Sample, step: Step, version: int) -> None:
        start = len(self.ids)
        self.ids += s.token_ids.tolist()
        self.logprobs += s.logprobs.tolist()
        self.versions += [version] * len(s.token_ids)
        self.turns.append(TurnIn("assistant", s.text, start, len(self.ids), True, attempt=self.attempt,
                                 answer=step.answer, correct=step.correct, reward=step.reward))
        if s.call is not None:
            self.generations.append(s.call.record(self.attempt, len(s.token_ids)))
        w = len(s.token_ids)
        self.emb_sum = s.embedding * w if self.emb_sum is None else self.emb_sum + s.embedding * w
        self.emb_tokens += w
        self.finish_reason, self.last = s.finish_reason, step
        self.error = self.error or step.error
        self.messages.append({"role": "assistant", "content": s.text})

    def feed(self, tokenizer: Any, s: Sample, step: Step, version: int) -> None:
        env_ids = environment_ids(tokenizer, self.messages[:-1], step.feedback, s.token_ids.tolist(), s.finish_reason)
        start = len(self.ids)
        self.ids += env_ids
        self.logprobs += [0.0] * len(env_ids)
        self.versions += [version] * len(env_ids)
        text = "\n\n".join(m["content"] for m in step.feedback)
        role = step.feedback_role or (step.feedback[0]["role"] if len(step.feedback) == 1 else "observation")
        self.turns.append(TurnIn(role if role in ("user", "tool", "observation") else "observation", text, start,
                                 len(self.ids), False, tool_error=step.tool_error, attempt=self.attempt,
                                 tool_call=step.tool_call))
        self.messages += step.feedback

    def trajectory(self) -> TrajectoryIn:
        step = self.last
        turns = [TurnIn(m["role"], m["content"], trainable=False) for m in self.prompt_turns] + self.turns
        emb = None if self.emb_sum is None else (self.emb_sum / max(self.emb_tokens, 1)).astype(np.float32)
        meta = dict(step.meta)
        if self.generations:
            meta["generations"] = list(self.generations)
        return TrajectoryIn(
            prompt_ids=self.prompt_ids, response_ids=np.asarray(self.ids, dtype=np.int32),
            logprobs=np.asarray(self.logprobs, dtype=np.float32), reward=step.episode_reward,
            correct=step.episode_correct, turns=turns, finish_reason=self.finish_reason,
            extracted_answer=step.answer, embedding=emb, error=self.error,
            token_policy_versions=np.asarray(self.versions, dtype=np.int32), meta=meta)


class Rollout:
    """Runs episodes of an environment in batches over an engine.

    Args:
        engine: any :class:`~reflexdb.collector.engines.Engine`.
        make_env: ``make_env(task) -> Environment``, a fresh episode.
        params: ``params() -> SamplingParams``, called once per engine call (a fresh seed each).
        version: the policy version the engine holds (stored on every token).
    """

    def __init__(self, engine: Any, make_env: Callable[[EnvTask], Environment], params: Callable[[], SamplingParams],
                 version: int = 0):
        self.engine, self.make_env, self.params, self.version = engine, make_env, params, version
        self.stats = RolloutStats()
        self.timer = PhaseTimer()  # phase "generate" (a collector gives its own: collector/runner.py)

    def run(self, tasks: Sequence[EnvTask], n: int) -> list[list[TrajectoryIn]]:
        """``n`` episodes of each task, as trajectories: ``result[i][j]`` is episode ``j`` of task ``i``."""
        return [[ep.trajectory() for ep in row] for row in self.episodes(tasks, n)]

    def episodes(self, tasks: Sequence[EnvTask], n: int) -> list[list[Episode]]:
        """``n`` episodes of each task, finished, with their environments (``result[i][j]``: episode
        ``j`` of task ``i``): a workflow may restore one (``env.restore(k)``) and :meth:`resume` it."""
        rows = []
        for task in tasks:
            row = []
            for _ in range(n):
                env = self.make_env(task)
                messages = env.reset()
                row.append(Episode(env, list(messages), list(messages)))
            rows.append(row)
        self._play(rows, n)
        return rows

    def resume(self, starts: Sequence[Start]) -> list[Episode]:
        """One episode from each start (a restored environment and its conversation, e.g. with a
        guidance message added), all of them batched as :meth:`episodes` does: ``result[i]`` is the
        episode of ``starts[i]``; its prompt is ``starts[i].messages`` and its turns are numbered
        from ``starts[i].attempt``."""
        rows = [[Episode(s.env, list(s.messages), list(s.messages), attempt=s.attempt)] for s in starts]
        if rows:
            self._play(rows, 1)
        return [row[0] for row in rows]

    def _play(self, rows: list[list[Episode]], n: int) -> None:
        t0 = time.monotonic()
        # An engine that can keep each row's cache (hf) keeps it while episodes may continue: turn
        # k + 1 then prefills only the environment's tokens.
        keep = hasattr(self.engine, "keep_kv") and any(getattr(ep.env, "multi_turn", True)
                                                      for row in rows for ep in row)
        if keep:
            self.engine.keep_kv = True
        try:
            self._turns(rows, n, self.engine.tokenizer)
        finally:
            if keep:
                self.engine.keep_kv = False
                self.engine.forget_kv()
        self.stats.episodes += sum(len(row) for row in rows)
        self.stats.seconds += time.monotonic() - t0

    def _turns(self, episodes: list[list[Episode]], n: int, tok: Any) -> None:
        # turn 0: n samples of each row's first messages, in one call
        samples = self._generate([row[0].messages for row in episodes], n)
        active: list[tuple[Episode, Sample]] = []
        for row, batch in zip(episodes, samples):
            for ep, s in zip(row, batch):
                ep.prompt_ids = s.prompt_ids
                active.append((ep, s))
        while active:
            going = []
            for (ep, s), step in zip(active, step_all(active)):
                ep.take(s, step, self.version)
                if not step.done:
                    before = len(ep.ids)
                    ep.feed(tok, s, step, self.version)
                    self.stats.environment_tokens += len(ep.ids) - before
                    going.append(ep)
                ep.attempt += 1
            if not going:
                break
            # turn k > 0: every unfinished episode continues, in one call
            prompts = [np.concatenate([ep.prompt_ids, np.asarray(ep.ids, dtype=np.int32)]).tolist() for ep in going]
            active = [(ep, batch[0]) for ep, batch in zip(going, self._generate(prompts, 1))]

    def _generate(self, prompts: list, n: int) -> list[list[Sample]]:
        t0 = time.perf_counter()
        with self.timer("generate"):
            out = self.engine.generate(prompts, n=n, params=self.params())
        out = timed(out, time.perf_counter() - t0)
        self.stats.engine_calls += 1
        for batch in out:
            for s in batch:
                self.stats.turns += 1
                self.stats.sampled_tokens += len(s.token_ids)
                self.stats.prompt_tokens += len(s.prompt_ids)
        return out


def step_all(active: Sequence[tuple[Episode, Sample]]) -> list[Step]:
    """Each episode's environment steps on its sampled turn; environments of a class with
    ``step_batch`` step together (their tool calls run concurrently), the others one by one."""
    steps: list[Step | None] = [None] * len(active)
    batched: dict[type, list[int]] = {}
    for i, (ep, s) in enumerate(active):
        if hasattr(type(ep.env), "step_batch"):
            batched.setdefault(type(ep.env), []).append(i)
        else:
            steps[i] = ep.env.step(s.text, s.finish_reason)
    for cls, idx in batched.items():
        out = cls.step_batch([active[i][0].env for i in idx], [active[i][1].text for i in idx],
                             [active[i][1].finish_reason for i in idx])
        for i, step in zip(idx, out):
            steps[i] = step
    return steps


def own_tokens(t: TrajectoryIn) -> np.ndarray:
    """``[T]`` bool: the tokens of a trajectory's assistant turns (the model's own)."""
    own = np.zeros(len(t.response_ids), dtype=bool)
    for u in t.turns:
        if u.role == "assistant" and u.token_start is not None:
            own[u.token_start:u.token_end] = True
    return own


def rescore(engine: Any, trajectories: Sequence[TrajectoryIn], temperature: float) -> None:
    """Recompute each trajectory's behaviour log-probs under its own stored context, in one scoring
    call (a stitched or purified trajectory holds tokens sampled in another context): the model's
    tokens get their log-prob, the environment's 0, as in a sampled episode; ``meta.logprobs_from``
    says ``rescored``."""
    if not trajectories:
        return
    scored = engine.score([t.prompt_ids for t in trajectories], [t.response_ids for t in trajectories],
                          temperature=temperature)
    for t, s in zip(trajectories, scored):
        t.logprobs = np.where(own_tokens(t), s.logprobs, 0.0).astype(np.float32)
        t.meta = {**t.meta, "logprobs_from": "rescored"}


def environment_factory(name: str, options: Any, reward_fn: Callable, template: str) -> Callable[[EnvTask], Environment]:
    """``make_env(task)`` for environment ``name`` with the run's reward function and prompt template."""
    tpl = get_template(template)
    return lambda task: make_environment(name, options, task, reward_fn=reward_fn, template=tpl)
