"""R3L's reflect-then-retry (METHODS.md §1; R3L.md Sec. 4.1, Eq. 7–9, App. D; docs/r3l.md).

    claim:   tasks, as the plain group does (SKIP LOCKED, ``collector.max_collections``)
    collect: for all the claimed tasks at once, one engine call per stage (never one episode at a time):
      1. base     N/2 episodes of each task in the run's environment                      Eq. 7
      2. reflect  the policy reflects on each (``temperature``, ``free`` or ``json_schema``
                  decoding; one call per distinct episode length under ``json_schema``)   Fig. 13
      3. parse    reflexdb.r3l.parse_reflection; every reflection is kept, valid or not
      4. retry    a valid reflection whose outcome is not ``success``: the episode restored to
                  its pivot k (``env.restore(k)``), the guidance added (Fig. 14), played to its
                  end with the environment's feedback as usual. The same call plays the filling
                  base episodes: one per base episode that got no twin (the group stays N)
      5. distill  the base episode's tokens before turn k, then the retry's from turn k: the same
                  token ids as sampled, under the plain prompt, no guidance; spans shifted, the
                  loss mask rebuilt by the store's rules, behaviour log-probs recomputed under
                  this plain context (one scoring call for all of them)                     Eq. 8
      6. groups   per task, written in one transaction: the exploration group (kind ``fresh``:
                  the N/2 reflected base episodes, their distilled twins, the filling base
                  episodes; the reflections rows as its attachment) and a group of kind ``retry``
                  (each reflection's own tokens, origin ``reflection``; each guided retry, origin
                  ``guided_retry``), both linked to the base episode and the reflection

Lineage: a distilled, guided-retry or reflection row has ``parent_trajectory_id`` = its base
episode (a :class:`~reflexdb.Sibling`, resolved in the transaction) and a row of R3L's table
``trajectory_reflections`` naming its reflection (:class:`~.reflections.ReflectionLinks`). A base episode with a twin, and the twin, carry ``meta.pivot`` (k) and
``meta.pivot_token`` (where turn k starts in ``response_ids``): the learner's pivotal mask (Eq. 10).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from reflexdb import GroupIn, Sibling, TrajectoryIn, TurnIn, drill
from reflexdb.collector.environments import EnvTask
from reflexdb.collector.episodes import Episode, Start, rescore
from reflexdb.collector.workflows.group import GroupWorkflow
from reflexdb.lazy import lazy

from . import reflections as r3l
from .prompts import guidance_message, reflection_messages
from .reflections import ParsedReflection, ReflectionIn

work = lazy("reflexdb.work")  # the store (SQLAlchemy) on first use: loading a plug-in stays cheap

DECODINGS = r3l.DECODINGS


@dataclass
class _Base:
    """A reflected base episode and what came of it."""

    task: int  # position of its task in the claim
    index: int  # its position in the exploration group
    episode: Episode
    trajectory: TrajectoryIn
    prompt: list = field(default_factory=list)  # the reflection prompt
    n_turns: int = 0
    reflection: object = None  # the engine's Sample
    parsed: ParsedReflection | None = None
    reflection_id: int = 0
    retry: Episode | None = None
    oracle: str | None = None  # under guidance 'oracle': the guidance built from the ground truth

    @property
    def pivot(self) -> int:
        """The turn the retry starts from: the reflection's, or 0 under the oracle."""
        return 0 if self.oracle is not None else self.parsed.pivot

    @property
    def retried(self) -> bool:
        return self.oracle is not None or self.parsed.retry


class R3LWorkflow(GroupWorkflow):
    """Args:
        temperature: the reflections' sampling temperature (0.7 in the paper).
        max_tokens: most tokens of a reflection.
        decoding: ``free`` (the paper) or ``json_schema`` (constrained to the reflection's schema
            with a grammar engine: xgrammar on the HF engine, SGLang's own on SGLang).
        max_chars: under ``json_schema``, the longest text a reflection field may hold.
        guidance: ``reflection`` (the paper) or ``oracle`` (a diagnostic arm, docs/r3l.md: every
            base episode that is not correct is retried from turn 0 with a line built from its
            task's ground truth as the guidance (:func:`oracle_guidance`); its rows carry
            ``meta.guidance = 'oracle'``).
    """

    def __init__(self, ctx, *, temperature: float = 0.7, max_tokens: int = 384, decoding: str = "free",
                 max_chars: int = 400, guidance: str = "reflection"):
        if decoding not in DECODINGS:
            raise ValueError(f"r3l: decoding {decoding!r} is not one of {', '.join(DECODINGS)}")
        if guidance not in ("reflection", "oracle"):
            raise ValueError(f"r3l: guidance {guidance!r} is not one of reflection, oracle")
        super().__init__(ctx)
        self.temperature, self.max_tokens, self.decoding, self.max_chars = temperature, max_tokens, decoding, max_chars
        self.guidance = guidance

    def collect(self, claimed: list[work.ClaimedTask]) -> list[list[GroupIn]]:
        c = self.ctx
        N = c.cfg.collector.group_size
        tasks = [EnvTask(t.id, t.prompt, t.ground_truth) for t in claimed]
        episodes = c.episodes(tasks, N // 2)                                                  # 1. base (Eq. 7)
        bases = [_Base(i, j, ep, ep.trajectory()) for i, row in enumerate(episodes) for j, ep in enumerate(row)]
        drill.phase("reflect")
        self._reflect(bases)                                                                   # 2-3. reflect, parse
        ids = c.db(lambda: r3l.reserve_ids(c.store, len(bases)))
        for b, rid in zip(bases, ids):
            b.reflection_id = rid
        if self.guidance == "oracle":
            for b in bases:
                if not b.trajectory.correct:
                    b.oracle = oracle_guidance(claimed[b.task].ground_truth)
        drill.phase("retry")
        retried = [b for b in bases if b.retried]
        twins = [sum(b.task == i for b in retried) for i in range(len(tasks))]
        starts = [self._retry_start(b) for b in retried]
        fills = [(i, c.make_env(task)) for i, task in enumerate(tasks) for _ in range(N // 2 - twins[i])]
        played = c.resume(starts + [Start(env, env.reset()) for _, env in fills])              # 4. retry (+ fill)
        for b, ep in zip(retried, played):
            b.retry = ep
        distilled = self._distill(retried)                                                     # 5. distill (Eq. 8)
        filled: list[list[TrajectoryIn]] = [[] for _ in tasks]
        for (i, _), ep in zip(fills, played[len(retried):]):
            t = ep.trajectory()
            t.meta = {**t.meta, "reflected": False}
            filled[i].append(t)
        return [self._groups(t, [b for b in bases if b.task == i], distilled, filled[i])    # 6. groups
                for i, t in enumerate(claimed)]

    # ------------------------------------------------------------------ stages

    def _reflect(self, bases: list[_Base]) -> None:
        """One reflection per base episode, parsed; one engine call (per distinct episode length
        under ``json_schema``: the schema bounds the pivot by the episode's turns)."""
        c = self.ctx
        for b in bases:
            steps, b.n_turns = _steps(b.trajectory)
            question = next((m["content"] for m in reversed(b.episode.prompt_turns) if m["role"] == "user"), "")
            b.prompt = reflection_messages(question, steps, _final(b.trajectory))
        lengths = sorted({b.n_turns for b in bases}) if self.decoding == "json_schema" else [None]
        for n in lengths:
            todo = [b for b in bases if n is None or b.n_turns == n]
            schema = None if n is None else json.dumps(r3l.reflection_schema(n, self.max_chars))
            samples = c.sample([b.prompt for b in todo], 1, temperature=self.temperature,
                               max_new_tokens=self.max_tokens, stop=(), json_schema=schema)
            for b, [s] in zip(todo, samples):
                b.reflection = s
                b.parsed = r3l.parse_reflection(s.text, b.n_turns)

    def _retry_start(self, b: _Base) -> Start:
        """The base episode restored to its pivot k, with the guidance after the restored conversation."""
        k = b.pivot
        messages = b.episode.env.restore(k)
        if b.oracle is not None:
            return Start(b.episode.env, [*messages, {"role": "user", "content": b.oracle}], attempt=k)
        text = b.reflection.text
        report = text[text.find("{"): text.rfind("}") + 1]
        return Start(b.episode.env, [*messages, guidance_message(report)], attempt=k)

    def _distill(self, retried: list[_Base]) -> dict[int, TrajectoryIn]:
        """Each retry's distilled twin (by ``id(base)``): base tokens before turn k ⊕ the retry's,
        behaviour log-probs recomputed under the plain context in one scoring call."""
        c = self.ctx
        out: dict[int, TrajectoryIn] = {}
        if not retried:
            return out
        plain = [_stitch(b) for b in retried]
        with c.timer("score"):
            rescore(c.engine, plain, c.cfg.collector.sampling.temperature or 1.0)  # environment tokens: 0, as sampled
        for b, t in zip(retried, plain):
            out[id(b)] = t
        return out

    def _groups(self, task: work.ClaimedTask, bases: list[_Base], distilled: dict[int, TrajectoryIn],
                filled: list[TrajectoryIn]) -> list[GroupIn]:
        """The exploration group and the retry group of one task (written in one transaction)."""
        c = self.ctx
        explore, aux, rows = [], [], []
        explore_links, aux_links = [], []  # (position in the group, reflection id)
        for b in bases:
            t = b.trajectory
            t.meta = {**t.meta, "reflected": True}
            twin = distilled.get(id(b))
            if twin is not None:
                t.meta.update(pivot=twin.meta["pivot"], pivot_token=twin.meta["pivot_token"])
            explore.append(t)
            rows.append(ReflectionIn(b.reflection_id, len(explore) - 1, b.reflection.text, b.parsed, self.decoding,
                                     c.version))
        for b in bases:
            twin = distilled.get(id(b))
            if twin is not None:
                twin.parent_trajectory_id = Sibling(0, b.index)
                explore.append(twin)
                explore_links.append((len(explore) - 1, b.reflection_id))
        explore += filled
        for b in bases:
            aux.append(_reflection_row(b))
            aux_links.append((len(aux) - 1, b.reflection_id))
        for b in bases:
            if b.retry is not None:
                aux.append(_guided_row(b))
                aux_links.append((len(aux) - 1, b.reflection_id))
        meta = {"n_base": len(bases), "n_distilled": sum(id(b) in distilled for b in bases), "n_filled": len(filled),
                "decoding": self.decoding}
        if self.guidance == "oracle":
            meta["guidance"] = "oracle"
        group = GroupIn(run_id=c.run_id, task_id=task.id, policy_version=c.version, trajectories=explore,
                        workflow="r3l", kind="fresh", collector=c.name, embedding_model=c.embedding_model,
                        embedding_layer=-1, meta=meta, attachments=[
                            r3l.Reflections(tuple(rows)), r3l.ReflectionLinks(c.run_id, tuple(explore_links))])
        retries = GroupIn(run_id=c.run_id, task_id=task.id, policy_version=c.version, trajectories=aux,
                          workflow="r3l", kind="retry", collector=c.name, embedding_model=c.embedding_model,
                          embedding_layer=-1, meta={"decoding": self.decoding},
                          attachments=[r3l.ReflectionLinks(c.run_id, tuple(aux_links))])
        return [group, retries]


# ---------------------------------------------------------------------- pieces


def _steps(t: TrajectoryIn) -> tuple[list[tuple[str, str | None]], int]:
    """An episode's assistant turns with the environment's feedback on each, and their number."""
    steps: list[list] = []
    for u in t.turns:
        if u.token_start is None:
            continue
        if u.role == "assistant":
            steps.append([u.text, None])
        elif steps:
            steps[-1][1] = u.text
    return [tuple(s) for s in steps], len(steps)


def _final(t: TrajectoryIn) -> str:
    if t.reward is None:
        return "unknown (the reward could not be computed)"
    return f"{'solved' if t.correct else 'not solved'} (reward {t.reward:g})"


def _assistant_start(t: TrajectoryIn, k: int) -> int:
    """Where assistant turn ``k`` starts in ``response_ids``."""
    starts = [u.token_start for u in t.turns if u.role == "assistant" and u.token_start is not None]
    return int(starts[k])


def _stitch(b: _Base) -> TrajectoryIn:
    """The distilled trajectory of a retried base episode (log-probs still to be scored)."""
    base, retry = b.trajectory, b.retry.trajectory()
    k = b.pivot
    cut = _assistant_start(base, k)
    prompt_turns = [TurnIn(u.role, u.text, trainable=False) for u in base.turns if u.token_start is None]
    before = [u for u in base.turns if u.token_start is not None and u.token_end <= cut]
    after = [TurnIn(u.role, u.text, u.token_start + cut, u.token_end + cut, u.trainable, u.tool_error, u.attempt,
                    u.answer, u.correct, u.reward, u.tool_call) for u in retry.turns if u.token_start is not None]
    versions = np.concatenate([np.asarray(base.token_policy_versions[:cut]), np.asarray(retry.token_policy_versions)])
    return TrajectoryIn(
        prompt_ids=base.prompt_ids,
        response_ids=np.concatenate([np.asarray(base.response_ids[:cut]), np.asarray(retry.response_ids)]).astype(np.int32),
        logprobs=None, reward=retry.reward, correct=retry.correct, turns=prompt_turns + before + after,
        finish_reason=retry.finish_reason, extracted_answer=retry.extracted_answer, error=retry.error,
        origin="distilled", token_policy_versions=versions.astype(np.int32),
        meta={**retry.meta, "pivot": k, "pivot_token": cut, "logprobs_from": "rescored",
              **({"guidance": "oracle"} if b.oracle is not None else {})},
    )


def oracle_guidance(ground_truth: str) -> str:
    """The guidance of the oracle arm, a user message after the restored conversation, written
    from the task's ground truth (a diagnostic, never the method: docs/r3l.md).

    Short and direct on purpose: SmolLM2-135M followed the paper's guidance block around a
    reflection-shaped JSON report built from the ground truth in 4 of 32 samples (0.125), and this
    line in 15 of 32 (0.469; 8 sums × 4 samples at temperature 1, measured 2026-11-26,
    docs/experiments.md); the arm exists to make retries succeed."""
    answer = str(ground_truth).strip()
    return f"The answer is {answer}. Say: The answer is {answer}."


def _reflection_row(b: _Base) -> TrajectoryIn:
    """A reflection's own tokens: prompt the episode log, response the reflection as sampled; its
    reward is its retry's (NULL when no retry was made), ``correct`` NULL (not an answer)."""
    s, p = b.reflection, b.parsed
    retry = b.retry.trajectory() if b.retry is not None else None
    turns = [TurnIn(m["role"], m["content"], trainable=False) for m in b.prompt]
    turns.append(TurnIn("assistant", s.text, 0, len(s.token_ids), True))
    return TrajectoryIn(
        prompt_ids=s.prompt_ids, response_ids=s.token_ids, logprobs=s.logprobs,
        reward=None if retry is None else retry.reward, correct=None, turns=turns, finish_reason=s.finish_reason,
        origin="reflection", parent_trajectory_id=Sibling(0, b.index),
        meta={"valid": p.valid, "outcome": p.outcome, "pivot": p.pivot},
    )


def _guided_row(b: _Base) -> TrajectoryIn:
    """The guided retry as sampled: prompt the restored conversation and the guidance, response the
    suffix from turn k, its sampled log-probs (origin ``guided_retry``)."""
    t = b.retry.trajectory()
    t.origin = "guided_retry"
    t.parent_trajectory_id = Sibling(0, b.index)
    t.meta = {**t.meta, "pivot": b.pivot, "logprobs_from": "sampled",
              **({"guidance": "oracle"} if b.oracle is not None else {})}
    t.embedding = None
    return t
