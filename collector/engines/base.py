"""The engine interface every generation backend implements.

An engine samples responses with the numbers the experience store keeps for each of them:
token ids, behaviour log-probs, finish reason and a hidden-state embedding; it re-scores given
token sequences without sampling; and it reloads weights from a published checkpoint in place.
See ``docs/collector-engines.md`` for the exact semantics, summarised here:

- ``Sample.logprobs[t]`` is ``log q(o_t | prompt, o_<t)`` where ``q`` is the distribution the
  token was drawn from: ``softmax(logits / temperature)`` restricted to the top-p nucleus and
  renormalised. With ``temperature == 0`` (greedy) it is the untempered model log-prob.
- ``ScoreResult.logprobs[t]`` is ``log_softmax(logits / temperature)[o_t]`` with no truncation;
  the default ``temperature=1`` gives the plain model log-probs. At temperature 1 and top-p 1
  both agree up to floating-point noise.
- ``embedding`` is the mean over ``t = 1..T`` of the last decoder layer's output **after the
  final norm** (the vector the LM head reads) at the position that predicts response token
  ``o_t``: the last prompt token and the response tokens except the last. These are the same
  ``T`` positions whose logits give ``logprobs``.

Shapes: ``P`` prompt tokens, ``T`` response tokens, ``D`` hidden size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol, Union, runtime_checkable

import numpy as np

FinishReason = Literal["stop", "length"]

#: A prompt: token ids (used as they are), chat messages (``[{"role": ..., "content": ...}]``,
#: rendered with the tokenizer's chat template and a generation prompt), or plain text
#: (tokenized without a template).
Prompt = Union[Sequence[int], Sequence[Mapping[str, str]], str]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Every field maps one-to-one onto SGLang's sampling parameters.

    Args:
        temperature: softmax temperature; ``0`` means greedy decoding.
        top_p: nucleus sampling mass in ``(0, 1]``; ``1`` disables truncation.
        max_new_tokens: stop with finish reason ``length`` after this many tokens.
        stop: strings that end generation (finish reason ``stop``) once the decoded response
            contains one of them; the token that completes the string is kept, nothing after it.
        stop_token_ids: extra token ids that end generation like EOS does (kept in the output).
        seed: the call's seed; ``None`` draws fresh randomness. (``hf`` and ``fast``: each row's
            draw at each step is a pure function of the seed, the row's index in the call and the
            step, so the samples do not depend on batch composition or on which of the two
            engines runs the call; ``counter_uniforms``. SGLang: passed as ``sampling_seed``,
            honoured only with deterministic inference enabled.)
        json_schema: a JSON schema, as a JSON string, that every response must satisfy
            (constrained decoding); ``None`` decodes freely. Passed as SGLang's ``json_schema``;
            the ``hf`` engine masks the logits with xgrammar, and ``logprobs`` are then those of
            the masked distribution. A response cut by ``max_new_tokens`` (or a stop string) is not complete
            JSON. A mapping (e.g. from YAML) is accepted and stored as its JSON text.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    json_schema: str | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        # Accept lists (e.g. from YAML) but store tuples so the object stays hashable.
        if isinstance(self.stop, str):
            raise TypeError("stop must be a sequence of strings, not one string")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if self.json_schema is not None:
            object.__setattr__(self, "json_schema", _check_json_schema(self.json_schema))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_json_schema(schema: str | Mapping[str, Any]) -> str:
    """The schema as JSON text, refused unless it is a JSON object (whether a JSON-schema engine
    supports all of it is only known when it compiles it)."""
    if isinstance(schema, Mapping):
        schema = json.dumps(schema)  # a string keeps SamplingParams hashable
    if not isinstance(schema, str):
        raise TypeError(f"json_schema must be a JSON string, got {type(schema).__name__}")
    try:
        parsed = json.loads(schema)
    except json.JSONDecodeError as exc:
        raise ValueError(f"json_schema is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(parsed), "a number")
        raise ValueError(f"json_schema must be a JSON object, got {kind}")
    return schema


@dataclass(frozen=True)
class EngineCall:
    """One engine call as the collector timed it: ``seconds`` of wall time for ``rows`` sampled rows."""

    seconds: float
    rows: int

    def record(self, attempt: int | None, tokens: int) -> dict[str, Any]:
        """What a trajectory keeps of the call that sampled its turn ``attempt`` of ``tokens`` tokens
        (``meta.generations``; the explorer's trace draws it)."""
        return {"attempt": attempt, "tokens": tokens, "wall_s": round(self.seconds, 6), "rows": self.rows}


def timed(out: list[list[Sample]], seconds: float) -> list[list[Sample]]:
    """``out`` of one engine call with the call's wall ``seconds`` and row count on every sample."""
    call = EngineCall(seconds, sum(len(batch) for batch in out))
    return [[replace(s, call=call) for s in batch] for batch in out]


@dataclass(frozen=True, eq=False)
class Sample:
    """One sampled response.

    Attributes:
        prompt_ids: `[P]` int32 prompt token ids (shared by the ``n`` samples of a prompt).
        token_ids: `[T]` int32 response token ids, including the EOS / stop token that ended it;
            never anything after it.
        logprobs: `[T]` float32 behaviour log-prob of each token under the distribution it was
            sampled from (temperature and top-p applied; see the module docstring).
        finish_reason: ``stop`` (EOS, a stop token or a stop string) or ``length``
            (``max_new_tokens`` or the model's context length reached).
        text: the response decoded with special tokens skipped (a matched stop string is kept).
            A decoded NUL character becomes U+FFFD: PostgreSQL text cannot hold NUL, and the
            token ids stay exact.
        embedding: `[D]` float32 mean-pooled last-layer hidden state over the response
            (NexGRPO's φ(o)).
        stop: the stop string that ended the response, or ``None``.
        call: the engine call that sampled it, as the collector timed it (:func:`timed`): its wall
            seconds and the rows it sampled together (every row of a call shares its time); ``None``
            from an engine itself.
    """

    prompt_ids: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: FinishReason
    text: str
    embedding: np.ndarray
    stop: str | None = None
    call: EngineCall | None = None

    def __post_init__(self) -> None:
        # Every engine's samples, in collect and in eval, reach the store through here.
        if "\x00" in self.text:
            object.__setattr__(self, "text", self.text.replace("\x00", "\ufffd"))

    @property
    def truncated(self) -> bool:
        """Whether it stopped at its length limit (``finish_reason == "length"``)."""
        return self.finish_reason == "length"

    @property
    def confidence(self) -> float:
        """``exp(mean_t logprobs)``: NexGRPO's ℓ(o)."""
        return float(np.exp(self.logprobs.mean())) if len(self.logprobs) else float("nan")


@dataclass(frozen=True, eq=False)
class ScoreResult:
    """Log-probs and embedding of a given response under the current weights.

    Attributes:
        logprobs: `[T]` float32 ``log_softmax(logits / temperature)`` of each response token.
        embedding: `[D]` float32, defined exactly as :attr:`Sample.embedding`.
    """

    logprobs: np.ndarray
    embedding: np.ndarray


@runtime_checkable
class Engine(Protocol):
    """What the collector needs from a generation backend."""

    #: registry name of the backend (``hf``, ``sglang``).
    kind: str

    @property
    def model_name(self) -> str:
        """Name of the loaded model, stored as the embeddings' ``model``."""
        ...

    @property
    def hidden_size(self) -> int:
        """``D``, the length of every embedding."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer matching the model."""
        ...

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, params: SamplingParams = SamplingParams()
    ) -> list[list[Sample]]:
        """Sample ``n`` responses for each prompt; ``result[i][j]`` is sample ``j`` of prompt ``i``."""
        ...

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[ScoreResult]:
        """Log-probs and embedding of ``response_ids[i]`` after ``prompt_ids[i]``, no sampling."""
        ...

    def load_weights(self, path: str | Path) -> None:
        """Replace the model's weights in place with those of a published checkpoint directory."""
        ...

    def close(self) -> None:
        """Release the model (and, for SGLang, its server processes)."""
        ...


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of a prompt (see :data:`Prompt`)."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    items = list(prompt)
    if not items:
        raise ValueError("empty prompt")
    if all(isinstance(x, Mapping) for x in items):
        from ..tasks.templates import apply_chat_template

        return apply_chat_template(tokenizer, items)
    if all(isinstance(x, (int, np.integer)) for x in items):
        return [int(x) for x in items]
    raise TypeError("a prompt is token ids, chat messages or a string")


def checkpoint_path(path: str | Path) -> Path:
    """A local checkpoint path from a path or a ``file://`` URI (policy_versions.checkpoint_uri)."""
    s = str(path)
    if s.startswith("file://"):
        s = s[len("file://"):]
    return Path(s).expanduser()
