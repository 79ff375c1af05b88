"""CLEANER's similarity-aware adaptive rollback (SAAR; METHODS.md §5; CLEANER.md Sec. 4; docs/cleaner.md).

:class:`SaarRollout` runs ``tool_python`` episodes as :class:`~collector.episodes.Rollout` does
(one engine call per turn for every unfinished episode of the batch), with SAAR on a share ``p``
of them (curriculum mixing, CLEANER.md Sec. 4.3). In an episode under SAAR:

- a turn whose call **fails** is not committed. A failed execution is
  :attr:`ToolResult.failed <collector.sandbox.ToolResult.failed>`: a non-zero exit, an uncaught
  exception, death by a signal, the wall-clock timeout, a CPU, output or file limit. The
  lookahead context is ``h̃_t = h_t ⊕ (r_t, c_t, o_t⁻)``                                 (Eq. 7)
- the next engine call (beside the other episodes' turns) samples the correction
  ``(r'_aux, c'_t) ~ π(·|h̃_t)``; its block runs in the sandbox                           (Eq. 8)
- it runs: ``s = difflib.SequenceMatcher(None, c_t, c'_t).ratio()``; ``s ≥ γ``: shallow
  replacement ``(r_t, c'_t, o'_t)``, else deep ``(r'_aux, c'_t, o'_t)``, committed as turn t; the
  episode goes on from this purified history                                           (Eq. 9)
  (bounded for hostile sizes: past :data:`SIMILARITY_CHARS` characters ``s`` compares lines, and a
  turn whose block starts past :data:`MERGE_TOKENS` tokens or :data:`MERGE_CHARS` characters is
  replaced deep)
- it fails, or holds no block (shown :data:`~collector.tasks.tool_use.NO_CODE`): the lookahead
  context grows by the attempt and its error and the policy tries again, up to ``K`` corrections.
  After ``K`` failures the original failed call is committed with its error and the note
  :data:`~collector.tasks.tool_use.TRY_DIFFERENT`, and rollback stops for the episode (as the
  authors' code does).

Each episode yields two conversations: the **purified** one (``ep``: the committed history, what
the policy saw from then on) and the **raw** one (``raw``: every turn in the order sampled, failed
calls, their errors and the failed corrections included: Eq. 6's τ_noisy). Replacing turns leaves
tokens sampled under the error context in the purified one: the workflow rescores it
(collector/workflows/cleaner.py). The token ids of a shallow replacement are the original turn's
up to the token where its fenced block starts, then the correction's from the token where its
block starts (:func:`shallow_merge`): every token id is one the policy sampled, except where a
fence token straddles a block's start, whose seam is tokenized again so that the text before the
fence stays byte-identical.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reflexdb.collector.engines import Sample
from reflexdb.collector.environments import EnvTask, Step
from reflexdb.collector.environments.tool_python import run_calls
from reflexdb.collector.episodes import Episode, Rollout, environment_ids
from reflexdb.collector.sandbox import ToolResult
from reflexdb.collector.tasks import tool_use

from .rollbacks import Rollback

REPLACEMENTS = ("shallow", "deep")


#: Past this many characters on either side, :func:`similarity` compares lines
#: (:func:`line_similarity`, linear) instead of calling difflib, whose worst case is quadratic or
#: worse: a pair of 64,000 random characters took 40 s, two unrelated 32,000-character Python files
#: 0.7 s; the worst pair of 4,000 characters found took 0.14 s (issue 50).
SIMILARITY_CHARS = 4_000
#: :func:`fence_token` looks for a block's token among a turn's first this many tokens, spelling at
#: most MERGE_CHARS characters (:func:`searchable`): each probe of its search decodes a prefix, so
#: this bounds its cost (about 0.1 s) whatever the turn's length. A shallow replacement of a turn
#: whose block starts later is made deep (:meth:`SaarRollout._correction`).
MERGE_TOKENS = 16_384
MERGE_CHARS = 65_536


def similarity(failed_code: str, corrected_code: str) -> float:
    """``Sim(c_t, c'_t)`` (CLEANER.md Sec. 4.2): ``difflib.SequenceMatcher(None, c_t, c'_t).ratio()``
    as in the paper for code of up to :data:`SIMILARITY_CHARS` characters on each side; past that,
    :func:`line_similarity`, so that a model's megabyte of code costs milliseconds, not hours."""
    if max(len(failed_code), len(corrected_code)) <= SIMILARITY_CHARS:
        return difflib.SequenceMatcher(None, failed_code, corrected_code).ratio()
    return line_similarity(failed_code, corrected_code)


def line_similarity(a: str, b: str) -> float:
    """difflib's ``2M / T`` with whole lines for matching blocks, in one pass over each text: ``M``
    the characters of the lines both texts hold (as multisets; whitespace at either end of a line
    ignored, so re-indented code still matches), ``T`` those of all their lines. 1.0 for the same
    lines in any order, 0.0 for no line in common (and for texts of different whitespace only)."""
    lines_a, lines_b = _lines(a), _lines(b)
    total = sum(len(k) * n for k, n in lines_a.items()) + sum(len(k) * n for k, n in lines_b.items())
    if not total:
        return float(a == b)
    shared = sum(len(k) * min(n, lines_b[k]) for k, n in lines_a.items() if k in lines_b)
    return 2 * shared / total


def _lines(text: str) -> Counter[str]:
    return Counter(map(str.strip, text.splitlines()))


def replacement(sim: float, threshold: float) -> str:
    """``shallow`` when ``sim ≥ γ`` (Case A, implementation-level repair), else ``deep`` (Case B)."""
    return "shallow" if sim >= threshold else "deep"


def fence_token(tokenizer: Any, token_ids: Sequence[int], text: str) -> int | None:
    """Index of the token in which the turn's first fenced Python block begins (its first
    backtick); None when the turn has none, or when it begins past the first :data:`MERGE_TOKENS`
    tokens or :data:`MERGE_CHARS` characters. ``text`` is the turn decoded (special tokens skipped)."""
    pos = tool_use.block_start(text)
    return None if pos is None else _fence_token(tokenizer, token_ids, pos)


def _fence_token(tokenizer: Any, token_ids: Sequence[int], pos: int) -> int | None:
    """The smallest k whose first k + 1 tokens decode past character ``pos`` (``len(token_ids)``
    when none does), searched among the tokens :func:`searchable`; None when it is not among them.

    The search gallops (1, 2, 4, ... tokens) before it bisects, so a block early in a long turn
    costs little, and no probe decodes more than the searchable prefix."""
    ids = np.asarray(token_ids[:MERGE_TOKENS], dtype=np.int64)  # an array: decode converts it in C, a list in Python
    n = searchable(tokenizer, ids)

    def past(k: int) -> bool:
        return len(tokenizer.decode(ids[:k + 1], skip_special_tokens=True)) > pos

    lo, hi = 0, min(1, n)  # no k < lo is past; hi - 1 is, or hi = n
    while hi < n and not past(hi - 1):
        lo, hi = hi, min(2 * hi, n)
    if hi == n < len(token_ids) and not (n and past(n - 1)):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if past(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def searchable(tokenizer: Any, token_ids: Sequence[int]) -> int:
    """How many of a turn's first tokens :func:`fence_token` searches: at most :data:`MERGE_TOKENS`,
    spelling at most :data:`MERGE_CHARS` characters. A token's spelling (``convert_ids_to_tokens``:
    its bytes, or its piece) is never shorter than what it decodes to, so no probe of the search
    decodes more than MERGE_CHARS characters."""
    ids = np.asarray(token_ids[:MERGE_TOKENS], dtype=np.int64).tolist()
    spelled = np.cumsum([len(t or "") for t in tokenizer.convert_ids_to_tokens(ids)])
    return int(np.searchsorted(spelled, MERGE_CHARS, side="right"))


def shallow_merge(tokenizer: Any, failed: Sample, correction: Sample) -> Sample | None:
    """The shallow replacement's turn ``(r_t, c'_t)``: the failed turn's text before its block, kept
    byte for byte, then the correction's from its block on (its closing token included).

    The token ids are the failed turn's up to the token in which its block starts, then the
    correction's after the token in which its block starts. When a fence token straddles the
    block's start (``"  ```"``: characters of the reasoning and the fence in one token), those two
    tokens are not simply swapped, which would change the text before the fence (``ok.  ```` read
    ``ok. ````): the seam between them, the failed turn's characters before its fence and the
    correction's fence token from the fence on, is tokenized again (one to a few tokens). Every
    other token id is one the policy sampled. Log-probs are the sampled ones, 0 on the seam's
    (the workflow rescores the whole turn); the embedding is the correction's.

    None when a block starts past its turn's first :data:`MERGE_TOKENS` tokens or
    :data:`MERGE_CHARS` characters (too far to find its token in bounded time): the caller
    replaces the turn deep.

    Raises:
        ValueError: a turn has no fenced Python block."""
    start_f, start_c = tool_use.block_start(failed.text), tool_use.block_start(correction.text)
    if start_f is None or start_c is None:
        raise ValueError("a shallow replacement needs a fenced Python block in both turns")
    kf, kc = _fence_token(tokenizer, failed.token_ids, start_f), _fence_token(tokenizer, correction.token_ids, start_c)
    if kf is None or kc is None:
        return None
    prefix = failed.text[:start_f]  # r_t as written
    kept = tokenizer.decode(np.asarray(failed.token_ids[:kf], dtype=np.int64), skip_special_tokens=True)
    before_c = tokenizer.decode(np.asarray(correction.token_ids[:kc], dtype=np.int64), skip_special_tokens=True)
    through_c = tokenizer.decode(np.asarray(correction.token_ids[:kc + 1], dtype=np.int64), skip_special_tokens=True)
    if kept == prefix and before_c == correction.text[:start_c]:  # both fence tokens start at the fence
        seam_ids, tail = [], kc
    else:
        seam = prefix[len(kept):] + through_c[start_c:]
        seam_ids, tail = tokenizer.encode(seam, add_special_tokens=False), kc + 1
    ids = np.concatenate([np.asarray(failed.token_ids[:kf]), np.asarray(seam_ids, dtype=np.int64),
                          np.asarray(correction.token_ids[tail:])]).astype(np.int32)
    lps = np.concatenate([np.asarray(failed.logprobs[:kf]), np.zeros(len(seam_ids)),
                          np.asarray(correction.logprobs[tail:])]).astype(np.float32)
    return Sample(prompt_ids=failed.prompt_ids, token_ids=ids, logprobs=lps, finish_reason=correction.finish_reason,
                  text=tokenizer.decode(ids, skip_special_tokens=True), embedding=correction.embedding,
                  stop=correction.stop)


@dataclass
class _Lookahead:
    failed: Sample  # (r_t, c_t) as sampled
    code: str  # c_t
    result: ToolResult  # o_t⁻
    shown: str  # o_t⁻ as shown to the model
    ids: list[int]  # h̃: the prompt, the committed turns, the failed turn, its error, failed corrections
    messages: list[dict]
    attempts: int = 0
    last_code: str | None = None


@dataclass
class SaarEpisode:
    """An episode under :class:`SaarRollout`: the purified conversation ``ep`` (committed), the raw
    one ``raw`` (as sampled), whether SAAR applies (``saar``), the rollbacks made, every sandbox
    call (lookahead ones included: ``status``, ``seconds``, ``lookahead``)."""

    ep: Episode
    raw: Episode
    saar: bool
    stopped: bool = False  # K corrections failed: no more rollback in this episode
    look: _Lookahead | None = None
    rollbacks: list[Rollback] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)

    @property
    def env(self):
        return self.ep.env

    @property
    def done(self) -> bool:
        return self.look is None and self.ep.last is not None and self.ep.last.done

    def next_prompt(self) -> list[int]:
        if self.look is not None:
            return self.look.ids
        return [*np.asarray(self.ep.prompt_ids).tolist(), *self.ep.ids]


class SaarRollout(Rollout):
    """:class:`Rollout` with SAAR (module docstring).

    Args:
        share: ``p``, the probability that an episode gets SAAR (the rest stay raw).
        max_attempts: ``K``, corrections per failed call.
        threshold: ``γ``, the similarity at or above which a replacement is shallow.
        rng: draws which episodes get SAAR.
    """

    def __init__(self, engine: Any, make_env: Callable[[EnvTask], Any], params: Callable, version: int = 0, *,
                 share: float = 1.0, max_attempts: int = 3, threshold: float = 0.5,
                 rng: np.random.Generator | None = None):
        super().__init__(engine, make_env, params, version)
        self.share, self.max_attempts, self.threshold = share, max_attempts, threshold
        self.rng = rng or np.random.default_rng()

    def saar_episodes(self, tasks: Sequence[EnvTask], n: int) -> list[list[SaarEpisode]]:
        """``n`` episodes of each task (``result[i][j]``: episode ``j`` of task ``i``), finished."""
        rows = []
        for task in tasks:
            row = []
            for _ in range(n):
                env = self.make_env(task)
                if not hasattr(env, "tool_feedback"):
                    raise ValueError(f"SAAR needs a tool environment (tool_python); {type(env).__name__} has no tool calls")
                messages = env.reset()
                row.append(SaarEpisode(Episode(env, list(messages), list(messages)),
                                       Episode(env, list(messages), list(messages)),
                                       saar=bool(self.rng.random() < self.share)))
            rows.append(row)
        self._play(rows, n)
        return rows

    # ------------------------------------------------------------------ the turn loop

    def _turns(self, rows: list[list[SaarEpisode]], n: int, tok: Any) -> None:
        samples = self._generate([row[0].ep.messages for row in rows], n)
        active: list[tuple[SaarEpisode, Sample]] = []
        for row, batch in zip(rows, samples):
            for se, s in zip(row, batch):
                se.ep.prompt_ids = se.raw.prompt_ids = s.prompt_ids
                active.append((se, s))
        while active:
            going = self._advance(active, tok)
            if not going:
                break
            out = self._generate([se.next_prompt() for se in going], 1)
            active = [(se, batch[0]) for se, batch in zip(going, out)]

    def _advance(self, active: list[tuple[SaarEpisode, Sample]], tok: Any) -> list[SaarEpisode]:
        """One turn of every active episode: all calls run together, then each episode moves on."""
        codes = [tool_use.code_block(s.text) if se.look is not None else se.env.pending_code(s.text)
                 for se, s in active]
        results = run_calls([se.env for se, _ in active], codes)
        going = []
        for i, (se, s) in enumerate(active):
            code, res = codes[i], results.get(i)
            if res is not None:
                se.calls.append({"status": res.status, "seconds": round(res.seconds, 4), "lookahead": se.look is not None})
            if se.look is not None:
                self._correction(se, s, code, res, tok)
            elif res is not None and res.failed and se.saar and not se.stopped:
                self._open(se, s, code, res, tok)
            else:
                step = se.env.step(s.text, s.finish_reason, res)
                self._commit(se, s, step, tok)
                self._keep_raw(se, s, step, tok)
            if not se.done:
                going.append(se)
        return going

    def _commit(self, se: SaarEpisode, s: Sample, step: Step, tok: Any) -> None:
        se.ep.take(s, step, self.version)
        if not step.done:
            se.ep.feed(tok, s, step, self.version)
        se.ep.attempt += 1

    def _keep_raw(self, se: SaarEpisode, s: Sample, step: Step, tok: Any) -> None:
        se.raw.take(s, step, self.version)
        if not step.done:
            se.raw.feed(tok, s, step, self.version)
        se.raw.attempt += 1

    def _open(self, se: SaarEpisode, s: Sample, code: str, res: ToolResult, tok: Any) -> None:
        """A failed call under SAAR: not committed; the lookahead context h̃_t (Eq. 7)."""
        err = se.env.tool_feedback(res)
        self._keep_raw(se, s, err, tok)
        env_ids = environment_ids(tok, se.ep.messages, err.feedback, s.token_ids.tolist(), s.finish_reason)
        ids = [*np.asarray(se.ep.prompt_ids).tolist(), *se.ep.ids, *s.token_ids.tolist(), *env_ids]
        messages = [*se.ep.messages, {"role": "assistant", "content": s.text}, *err.feedback]
        se.look = _Lookahead(s, code, res, err.feedback[0]["content"], ids, messages)

    def _correction(self, se: SaarEpisode, s: Sample, code: str | None, res: ToolResult | None, tok: Any) -> None:
        """A correction sampled from h̃_t (Eq. 8): merged into the history when it ran (Eq. 9),
        else tried again, up to K times."""
        look = se.look
        look.attempts += 1
        look.last_code = code if code is not None else look.last_code
        turn = len(se.ep.turns)
        if res is not None and not res.failed:
            sim = similarity(look.code, code)
            kind = replacement(sim, self.threshold)
            merged = shallow_merge(tok, look.failed, s) if kind == "shallow" else s
            if merged is None:  # a block too far into its turn to find its token (fence_token): replaced deep
                kind, merged = "deep", s
            step = se.env.step(merged.text, merged.finish_reason, res)
            self._commit(se, merged, step, tok)
            self._keep_raw(se, s, step, tok)
            se.rollbacks.append(Rollback(turn, look.attempts, True, sim, kind, look.shown, look.result.status,
                                         look.code, code))
            se.look = None
            return
        err = se.env.tool_feedback(res)  # res None: no block to run (NO_CODE)
        self._keep_raw(se, s, err, tok)
        if look.attempts < self.max_attempts:
            look.ids += [*s.token_ids.tolist(),
                         *environment_ids(tok, look.messages, err.feedback, s.token_ids.tolist(), s.finish_reason)]
            look.messages += [{"role": "assistant", "content": s.text}, *err.feedback]
            return
        # K corrections failed: the error stays in the history, with a note; no more rollback
        step = se.env.step(look.failed.text, look.failed.finish_reason, look.result, note=tool_use.TRY_DIFFERENT)
        self._commit(se, look.failed, step, tok)
        se.rollbacks.append(Rollback(turn, look.attempts, False, None, None, look.shown, look.result.status,
                                     look.code, look.last_code))
        se.stopped, se.look = True, None


__all__ = ["MERGE_CHARS", "MERGE_TOKENS", "REPLACEMENTS", "Rollback", "SIMILARITY_CHARS", "SaarEpisode", "SaarRollout",
           "fence_token", "line_similarity", "replacement", "searchable", "shallow_merge", "similarity"]
